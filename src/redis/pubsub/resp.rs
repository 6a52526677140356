//! A bounded, resumable RESP2 reader for the pub/sub connection. It exists so the
//! ingest thread controls memory and time itself: a bulk string over the cap is
//! skipped as it streams in (never buffered), and a read timeout in the middle of
//! a message loses nothing, parsing resumes where it stopped.

use std::io::{self, Read};

/// Bytes asked of the socket per read.
const CHUNK: usize = 64 * 1024;
/// Longest header line (`*3`, `$65536`, `+OK`, an error text) accepted.
const LINE_MAX: usize = 1024;
/// Most elements in one pub/sub frame (`pmessage` has 4).
const ARRAY_MAX: i64 = 16;

/// One element of a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// A bulk string within the cap.
    Bulk(Vec<u8>),
    /// A bulk string over the cap, skipped; its length.
    Oversize(usize),
    /// A null bulk string or array.
    Nil,
    /// An integer.
    Int(i64),
    /// A simple string (`+OK`).
    Simple(Vec<u8>),
    /// An error reply.
    Error(Vec<u8>),
}

/// The reader's buffer and its position inside a partly received frame.
pub struct Reader {
    /// Received bytes in `buf[..end]`; the rest is room for the next read,
    /// zeroed once when the buffer grows rather than before every read.
    buf: Vec<u8>,
    end: usize,
    pos: usize,
    items: Vec<Item>,
    /// Elements still expected in the current array (0: not inside one).
    remaining: usize,
    /// Bytes of an oversized bulk string (and its CRLF) still to discard.
    skip: usize,
    cap: usize,
}

fn int(line: &[u8]) -> Result<i64, &'static str> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or("bad integer")
}

impl Reader {
    /// A reader that skips bulk strings longer than `cap` bytes.
    pub fn new(cap: usize) -> Reader {
        Reader {
            buf: Vec::new(),
            end: 0,
            pos: 0,
            items: Vec::new(),
            remaining: 0,
            skip: 0,
            cap,
        }
    }

    /// Bytes received but not parsed yet.
    pub fn buffered(&self) -> usize {
        self.end - self.pos
    }

    /// Reads one chunk from `r` (honouring its timeout); `Ok(0)` is end of stream.
    pub fn read_from(&mut self, r: &mut impl Read) -> io::Result<usize> {
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.pos = 0;
        }
        // What is kept is at most one unfinished header line plus one bulk string
        // within the cap: the buffer never grows past that and one chunk.
        if self.end > self.cap + LINE_MAX + 2 {
            return Err(io::Error::other("pub/sub frame over the cap"));
        }
        if self.buf.len() < self.end + CHUNK {
            self.buf.resize(self.end + CHUNK, 0);
        }
        let n = r.read(&mut self.buf[self.end..self.end + CHUNK]);
        self.end += *n.as_ref().unwrap_or(&0);
        n
    }

    fn push(&mut self, item: Item) -> Option<Vec<Item>> {
        self.items.push(item);
        if self.remaining > 0 {
            self.remaining -= 1;
            if self.remaining > 0 {
                return None;
            }
        }
        Some(std::mem::take(&mut self.items))
    }

    /// The next complete frame (an array's elements, or a single reply as one
    /// element) from what was read so far; `Ok(None)` when more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Vec<Item>>, &'static str> {
        loop {
            if self.skip > 0 {
                let n = self.buffered().min(self.skip);
                self.pos += n;
                self.skip -= n;
                if self.skip > 0 {
                    return Ok(None);
                }
                continue;
            }
            let data = &self.buf[self.pos..self.end];
            let Some(eol) = data
                .windows(2)
                .take(LINE_MAX + 1)
                .position(|w| w == b"\r\n")
            else {
                if data.len() > LINE_MAX {
                    return Err("header line too long");
                }
                return Ok(None);
            };
            if eol == 0 {
                return Err("empty header line");
            }
            let line = &data[1..eol];
            let after = eol + 2;
            let (item, used) = match data[0] {
                b'*' => {
                    let n = int(line)?;
                    if self.remaining > 0 {
                        return Err("nested array");
                    }
                    if n > ARRAY_MAX {
                        return Err("array too long");
                    }
                    self.pos += after;
                    if n <= 0 {
                        return Ok(Some(Vec::new()));
                    }
                    self.remaining = n as usize;
                    continue;
                }
                b'$' => {
                    let n = int(line)?;
                    if n < 0 {
                        (Item::Nil, after)
                    } else if n as usize > self.cap {
                        self.skip = n as usize + 2;
                        (Item::Oversize(n as usize), after)
                    } else {
                        let n = n as usize;
                        if data.len() < after + n + 2 {
                            return Ok(None);
                        }
                        if &data[after + n..after + n + 2] != b"\r\n" {
                            return Err("bulk string without CRLF");
                        }
                        (Item::Bulk(data[after..after + n].to_vec()), after + n + 2)
                    }
                }
                b':' => (Item::Int(int(line)?), after),
                b'+' => (Item::Simple(line.to_vec()), after),
                b'-' => (Item::Error(line.to_vec()), after),
                _ => return Err("unknown RESP type"),
            };
            self.pos += used;
            if let Some(frame) = self.push(item) {
                return Ok(Some(frame));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(r: &mut Reader, bytes: &[u8]) {
        let mut c = std::io::Cursor::new(bytes.to_vec());
        while r.read_from(&mut c).unwrap() > 0 {}
    }

    #[test]
    fn message_split_anywhere_resumes() {
        let msg = b"*3\r\n$7\r\nmessage\r\n$11\r\nseats:CS101\r\n$5\r\nhello\r\n:1\r\n";
        for cut in 0..msg.len() {
            let mut r = Reader::new(64);
            feed(&mut r, &msg[..cut]);
            let mut frames = Vec::new();
            while let Some(f) = r.next_frame().unwrap() {
                frames.push(f);
            }
            feed(&mut r, &msg[cut..]);
            while let Some(f) = r.next_frame().unwrap() {
                frames.push(f);
            }
            assert_eq!(frames.len(), 2, "cut at {cut}");
            assert_eq!(
                frames[0],
                vec![
                    Item::Bulk(b"message".to_vec()),
                    Item::Bulk(b"seats:CS101".to_vec()),
                    Item::Bulk(b"hello".to_vec())
                ]
            );
            assert_eq!(frames[1], vec![Item::Int(1)]);
        }
    }

    #[test]
    fn oversize_is_skipped_not_buffered() {
        let big = vec![b'x'; 10_000];
        let mut msg = b"*3\r\n$7\r\nmessage\r\n$3\r\nabc\r\n$10000\r\n".to_vec();
        msg.extend_from_slice(&big);
        msg.extend_from_slice(b"\r\n*3\r\n$7\r\nmessage\r\n$3\r\nabc\r\n$2\r\nok\r\n");
        let mut r = Reader::new(100);
        let mut frames = Vec::new();
        for chunk in msg.chunks(333) {
            feed(&mut r, chunk);
            assert!(r.buffered() < 1000);
            while let Some(f) = r.next_frame().unwrap() {
                frames.push(f);
            }
        }
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0][2], Item::Oversize(10_000));
        assert_eq!(frames[1][2], Item::Bulk(b"ok".to_vec()));
    }

    #[test]
    fn garbage_is_an_error() {
        let mut r = Reader::new(100);
        feed(&mut r, b"?what\r\n");
        assert!(r.next_frame().is_err());
    }
}
