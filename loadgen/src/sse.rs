//! Server-Sent Events as the server writes them: `event: T\ndata: JSON\n\n`,
//! and comment lines (keepalives).

/// Calls `on_data` with the value of each `data: ` line of the whole
/// events in `buf`; returns the bytes those events took.
pub fn read_events(buf: &[u8], mut on_data: impl FnMut(&[u8])) -> usize {
    let mut pos = 0;
    while let Some(end) = buf[pos..].windows(2).position(|w| w == b"\n\n") {
        let block = &buf[pos..pos + end];
        pos += end + 2;
        for line in block.split(|&b| b == b'\n') {
            if let Some(json) = line.strip_prefix(b"data: ") {
                on_data(json);
            }
        }
    }
    pos
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datas(buf: &[u8]) -> (Vec<String>, usize) {
        let mut out = Vec::new();
        let used = read_events(buf, |d| out.push(String::from_utf8_lossy(d).into_owned()));
        (out, used)
    }

    #[test]
    fn whole_events_are_read_and_a_partial_one_left() {
        let buf = b": keepalive\n\nevent: frame\ndata: {\"a\":1}\n\nevent: hello\ndata: {\"b\"";
        let (got, used) = datas(buf);
        assert_eq!(got, vec![r#"{"a":1}"#.to_owned()]);
        assert_eq!(&buf[used..], b"event: hello\ndata: {\"b\"");
        assert_eq!(datas(b"event: x\n"), (vec![], 0));
        let (got, _) = datas(b"data: 1\ndata: 2\n\n");
        assert_eq!(got, vec!["1".to_owned(), "2".to_owned()]);
    }

    #[test]
    fn the_core_encoder_s_events_read_back() {
        let frame = shards::ws_codec::text_frame(r#"{"type":"presence","course":"C","viewers":2}"#);
        let event = shards::sse_event::event(&frame).expect("an event");
        let (got, used) = datas(&event);
        assert_eq!(used, event.len());
        assert_eq!(
            got,
            vec![r#"{"type":"presence","course":"C","viewers":2}"#.to_owned()]
        );
    }
}
