//! The answer's head to a viewer's upgrade (or SSE request), read with
//! `httparse`: its status and a refusal's `Retry-After`.

/// Headers a head may carry (the server's answers carry a handful).
const MAX_HEADERS: usize = 64;

/// A whole response head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// Bytes it took, the blank line included.
    pub len: usize,
    /// The status code.
    pub status: u16,
    /// `Retry-After` in whole seconds, if given as such.
    pub retry_after_s: Option<u64>,
}

/// The response head at the start of `buf`; `Ok(None)` while it is partial.
pub fn read_head(buf: &[u8]) -> Result<Option<Head>, httparse::Error> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(len) = res.parse(buf)? else {
        return Ok(None);
    };
    let retry_after_s = res
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("retry-after"))
        .and_then(|h| std::str::from_utf8(h.value).ok())
        .and_then(|v| v.trim().parse().ok());
    Ok(Some(Head {
        len,
        status: res.code.unwrap_or(0),
        retry_after_s,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_read_whole_with_status_and_retry_after() {
        let ok = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x02hi";
        let head = read_head(ok).unwrap().unwrap();
        assert_eq!((head.status, head.retry_after_s), (101, None));
        assert_eq!(&ok[head.len..], b"\x81\x02hi");
        for cut in 0..head.len {
            assert_eq!(read_head(&ok[..cut]), Ok(None), "cut at {cut}");
        }
        let busy =
            b"HTTP/1.1 503 Service Unavailable\r\nretry-after:  7 \r\nContent-Length: 0\r\n\r\n";
        let head = read_head(busy).unwrap().unwrap();
        assert_eq!((head.status, head.retry_after_s), (503, Some(7)));
        let date = b"HTTP/1.1 429 Too Many\r\nRetry-After: Wed, 21 Oct 2015 07:28:00 GMT\r\n\r\n";
        assert_eq!(read_head(date).unwrap().unwrap().retry_after_s, None);
        assert!(read_head(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
    }
}
