//! The WebSocket decoder fed arbitrary bytes in arbitrary chunks: it never
//! panics and never holds more than one incomplete frame of a bounded message.
#![no_main]
use libfuzzer_sys::fuzz_target;
use shards::ws_codec::{Decoder, WsEvent, MAX_MESSAGE};

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, rest)) = data.split_first() else {
        return;
    };
    let chunk = chunk as usize + 1;
    let mut d = Decoder::new();
    for piece in rest.chunks(chunk) {
        d.feed(piece);
        loop {
            match d.next_event() {
                Ok(Some(WsEvent::Text(t))) => assert!(t.len() <= MAX_MESSAGE),
                Ok(Some(WsEvent::Ping(p))) => assert!(p.len() <= 125),
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => return,
            }
        }
        assert!(d.buffered() <= MAX_MESSAGE + 2 * (14 + 125) + chunk);
    }
});
