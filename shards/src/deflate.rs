//! permessage-deflate (RFC 7692) without context takeover in either direction:
//! the handshake's negotiation, a server message compressed once for every
//! viewer that negotiated it, and the bounded inflation of client messages.
//! Payloads only: the framing (RSV1) is `ws_codec`'s. Nothing here is per
//! connection: the shard owns two [`Deflater`]s (a render's frame, a whole
//! board), each reset per message, and each client message is inflated by a
//! fresh inflater that is dropped after.

use crate::fixed_deflate::FixedDeflate;
use flate2::{Decompress, FlushDecompress, Status};

/// Payloads shorter than this go out uncompressed (RSV1 clear).
pub const MIN_COMPRESSED_PAYLOAD: usize = 256;

/// The tail a sync flush ends with, removed on send and put back on receive.
const SYNC_TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// The `Sec-WebSocket-Extensions` answer to a client's offers (the header's
/// value, several headers joined with `,`), or `None` when no offer can be
/// accepted as a whole (the connection then proceeds uncompressed).
///
/// The server always works without context takeover and with a 15-bit window,
/// so it accepts the first `permessage-deflate` offer whose parameters are all
/// valid and allow that: `server_max_window_bits` only if it is 15 (echoed),
/// `client_max_window_bits` with or without a value (never answered: the
/// inflater takes any window). Anything else (unknown or repeated parameters,
/// bad values) declines that offer.
pub fn negotiate(offers: &str) -> Option<&'static str> {
    offers.split(',').find_map(accept_offer)
}

/// The answer to an accepted offer.
const ANSWER: &str = "permessage-deflate; server_no_context_takeover; client_no_context_takeover";
/// The answer to an accepted offer that named `server_max_window_bits=15`.
const ANSWER_ECHOING_BITS: &str = "permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=15";

/// The parameters an offer may carry, each at most once (names in any case).
const PARAMS: [&str; 4] = [
    "server_no_context_takeover",
    "client_no_context_takeover",
    "client_max_window_bits",
    "server_max_window_bits",
];

fn accept_offer(offer: &str) -> Option<&'static str> {
    let mut parts = offer.split(';').map(str::trim);
    if !parts.next()?.eq_ignore_ascii_case("permessage-deflate") {
        return None;
    }
    let mut seen = [false; PARAMS.len()];
    let mut echo_server_bits = false;
    for param in parts {
        let (name, value) = match param.split_once('=') {
            Some((n, v)) => (n.trim(), Some(unquote(v.trim())?)),
            None => (param, None),
        };
        let i = PARAMS.iter().position(|p| p.eq_ignore_ascii_case(name))?;
        if std::mem::replace(&mut seen[i], true) {
            return None;
        }
        match (PARAMS[i], value) {
            ("server_no_context_takeover" | "client_no_context_takeover", None) => {}
            ("client_max_window_bits", None) => {}
            ("client_max_window_bits", Some(v)) => {
                window_bits(v)?;
            }
            ("server_max_window_bits", Some(v)) => {
                // A smaller window than the compressor's 15 bits cannot be honoured.
                if window_bits(v)? != 15 {
                    return None;
                }
                echo_server_bits = true;
            }
            _ => return None,
        }
    }
    Some(if echo_server_bits {
        ANSWER_ECHOING_BITS
    } else {
        ANSWER
    })
}

/// A parameter value: a token or a quoted string (RFC 7692 section 5.1).
fn unquote(v: &str) -> Option<&str> {
    match v.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"'),
        None => Some(v),
    }
}

/// A window-bits value: 8..=15 in decimal, no leading zero.
fn window_bits(v: &str) -> Option<u8> {
    if v.is_empty() || v.starts_with('0') || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse::<u8>().ok().filter(|b| (8..=15).contains(b))
}

/// The compressor's memory level: its symbol buffer holds 1,024 symbols
/// (`1 << (level + 6)`), where the default level 8 holds 16,384. The buffer is
/// cleared at every block start, twice a message here, so at the default a
/// small frame's compression was mostly that clearing; a longer message is
/// cut into more blocks, which costs its size next to nothing.
const MEM_LEVEL: i32 = 4;

/// A compressor of one message at a time (no context takeover): zlib's at
/// a level, or the fixed-code one of [`Deflater::quick`].
pub struct Deflater {
    engine: Engine,
}

enum Engine {
    /// zlib-rs, reset before every message.
    Zlib(zlib_rs::Deflate),
    /// Fixed Huffman codes and a table that is never cleared.
    Fixed(FixedDeflate),
}

impl std::fmt::Debug for Deflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deflater")
    }
}

impl Default for Deflater {
    /// Level 6, for a render's frame: it goes to every viewer of its course,
    /// so the bytes saved count once per viewer.
    fn default() -> Self {
        Deflater::at_level(6)
    }
}

impl Deflater {
    /// Fixed codes and no table to clear ([`FixedDeflate`]), for a course's
    /// whole board: it is compressed again after every change of the course
    /// and goes only to the viewers arriving (or healing) until then, often
    /// one, so its time counts for more than its bytes (figures:
    /// `cargo bench -p shards --bench board_deflate`).
    pub fn quick() -> Self {
        Deflater {
            engine: Engine::Fixed(FixedDeflate::default()),
        }
    }

    fn at_level(level: i32) -> Self {
        Deflater {
            engine: Engine::Zlib(zlib_rs::Deflate::new_with_config(zlib_rs::DeflateConfig {
                level,
                method: zlib_rs::Method::Deflated,
                // Raw deflate (no zlib header), a 15-bit window.
                window_bits: -15,
                mem_level: MEM_LEVEL,
                strategy: zlib_rs::Strategy::Default,
            })),
        }
    }
}

impl Deflater {
    /// The compressed form of the server message `payload`, or `None` when it
    /// is under [`MIN_COMPRESSED_PAYLOAD`] or would not shrink (it then goes
    /// out as it is).
    pub fn compress_message(&mut self, payload: &[u8]) -> Option<Vec<u8>> {
        if payload.len() < MIN_COMPRESSED_PAYLOAD {
            return None;
        }
        self.compress(payload).filter(|c| c.len() < payload.len())
    }

    /// Raw deflate of one whole message, sync-flushed, its empty-block tail removed.
    fn compress(&mut self, payload: &[u8]) -> Option<Vec<u8>> {
        match &mut self.engine {
            Engine::Zlib(z) => zlib_compress(z, payload),
            Engine::Fixed(f) => Some(f.compress(payload)),
        }
    }
}

/// [`Deflater::compress`] by zlib-rs.
fn zlib_compress(z: &mut zlib_rs::Deflate, payload: &[u8]) -> Option<Vec<u8>> {
    z.reset();
    let mut out = vec![0; payload.len() / 2 + 64];
    // The reset zeroed the totals: they count this message alone.
    let mut written = 0;
    loop {
        let done = z.total_in() as usize;
        let input = payload.get(done..)?;
        z.compress(
            input,
            out.get_mut(written..)?,
            zlib_rs::DeflateFlush::SyncFlush,
        )
        .ok()?;
        written = z.total_out() as usize;
        let all_in = z.total_in() as usize == payload.len();
        // The flush is complete once a call leaves room in the output.
        if all_in && written < out.len() {
            break;
        }
        out.resize(out.len() * 2, 0);
    }
    out.truncate(written);
    if !out.ends_with(&SYNC_TAIL) {
        return None;
    }
    out.truncate(out.len() - SYNC_TAIL.len());
    Some(out)
}

/// Why a client message could not be inflated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InflateError {
    /// More than the limit came out (the decoder closes with 1009).
    TooBig,
    /// Not a deflate stream that ends (the decoder closes with 1007).
    Corrupt,
}

impl std::fmt::Display for InflateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            InflateError::TooBig => "inflated message over the limit",
            InflateError::Corrupt => "not a deflate stream that ends",
        })
    }
}

impl std::error::Error for InflateError {}

/// Inflates one client message (its frames' payloads joined) with a fresh
/// inflater: more than `limit` bytes out is `TooBig` (the work stops there, so
/// a zip bomb costs `limit` bytes), data that does not inflate is `Corrupt`.
///
/// The message must end a deflate stream with its own bytes, or, with the
/// tail of RFC 7692 (`00 00 ff ff`) put back, stop at a block boundary: data
/// cut inside a block (never reaching the end of it, or reaching it only by
/// the tail's bits) is `Corrupt`, not inflated as far as it goes.
pub fn inflate_message(compressed: &[u8], limit: usize) -> Result<Vec<u8>, InflateError> {
    let mut inflater = Decompress::new(false);
    // One byte of room past the limit tells "exactly the limit" from "more".
    let mut out = Vec::with_capacity(limit + 1);
    let mut ended = false;
    for (tail, input) in [(false, compressed), (true, &SYNC_TAIL[..])] {
        let mut pos = 0;
        loop {
            let (in0, out0) = (inflater.total_in(), out.len());
            let status = inflater
                .decompress_vec(&input[pos..], &mut out, FlushDecompress::Sync)
                .map_err(|_| InflateError::Corrupt)?;
            pos += (inflater.total_in() - in0) as usize;
            if out.len() > limit {
                return Err(InflateError::TooBig);
            }
            if status == Status::StreamEnd {
                if tail && !ended {
                    // The final block ended only with the tail's zero bits
                    // (they read as its end-of-block code): it was cut, and
                    // what came out is a part of the message.
                    return Err(InflateError::Corrupt);
                }
                ended = true;
                break;
            }
            if pos == input.len() {
                break;
            }
            if inflater.total_in() == in0 && out.len() == out0 {
                // No progress with input left: not a deflate stream we can finish.
                return Err(InflateError::Corrupt);
            }
        }
    }
    if !ended {
        at_block_boundary(&mut inflater, &mut out)?;
    }
    Ok(out)
}

/// An empty final block (fixed codes, just the end-of-block code): what a
/// deflater writes to finish a stream with nothing more in it.
const FINAL_BLOCK: [u8; 2] = [0x03, 0x00];

/// Whether an inflater that took all of a message and the tail stopped at a
/// block boundary. flate2 does not tell (zlib's `data_type` is not exposed),
/// so it is asked to end the stream with an empty final block: at a
/// boundary (the tail's empty stored block leaves the bits byte-aligned)
/// those two bytes end it with no output; inside a block they are read as
/// more of that block (its codes, a stored block's bytes or length), which
/// does not end the stream cleanly.
fn at_block_boundary(inflater: &mut Decompress, out: &mut Vec<u8>) -> Result<(), InflateError> {
    let (in0, out0) = (inflater.total_in(), out.len());
    let status = inflater
        .decompress_vec(&FINAL_BLOCK, out, FlushDecompress::Finish)
        .map_err(|_| InflateError::Corrupt)?;
    let took = inflater.total_in() - in0;
    if status != Status::StreamEnd || out.len() != out0 || took != FINAL_BLOCK.len() as u64 {
        out.truncate(out0);
        return Err(InflateError::Corrupt);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::{Compress, Compression, FlushCompress};

    const ANSWER: &str =
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover";

    #[test]
    fn inflate_errors_are_errors() {
        let e: &dyn std::error::Error = &InflateError::Corrupt;
        assert!(e.to_string().contains("deflate"));
        assert_ne!(InflateError::TooBig.to_string(), e.to_string());
    }

    #[test]
    fn negotiation_accepts_whole_offers_only() {
        // Chromium's and Firefox's offers.
        assert_eq!(
            negotiate("permessage-deflate; client_max_window_bits"),
            Some(ANSWER)
        );
        assert_eq!(negotiate("permessage-deflate"), Some(ANSWER));
        assert_eq!(
            negotiate("permessage-deflate; server_no_context_takeover; client_no_context_takeover; client_max_window_bits=10"),
            Some(ANSWER)
        );
        assert_eq!(
            negotiate("permessage-deflate; server_max_window_bits=15"),
            Some("permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=15")
        );
        assert_eq!(
            negotiate("Permessage-Deflate; Client_Max_Window_Bits=\"12\""),
            Some(ANSWER)
        );
        // Offers that cannot be accepted as a whole are ignored.
        for bad in [
            "",
            "x-webkit-deflate-frame",
            "permessage-deflate; server_max_window_bits=10",
            "permessage-deflate; server_max_window_bits",
            "permessage-deflate; client_max_window_bits=16",
            "permessage-deflate; client_max_window_bits=7",
            "permessage-deflate; client_max_window_bits=010",
            "permessage-deflate; client_max_window_bits=abc",
            "permessage-deflate; server_no_context_takeover=1",
            "permessage-deflate; client_no_context_takeover; client_no_context_takeover",
            "permessage-deflate; client_no_context_takeover; CLIENT_NO_CONTEXT_TAKEOVER",
            "permessage-deflate; unknown_param",
            "permessage-deflate; client_max_window_bits=\"12",
        ] {
            assert_eq!(negotiate(bad), None, "{bad:?}");
        }
        // The first acceptable offer of a list wins.
        assert_eq!(
            negotiate("permessage-deflate; server_max_window_bits=9, permessage-deflate; client_max_window_bits"),
            Some(ANSWER)
        );
    }

    /// The reference inflater: flate2's raw inflate, a fresh context per message.
    fn reference_inflate(compressed: &[u8]) -> Vec<u8> {
        let mut d = Decompress::new(false);
        let mut input = compressed.to_vec();
        input.extend_from_slice(&SYNC_TAIL);
        let mut out = Vec::with_capacity(1 << 20);
        d.decompress_vec(&input, &mut out, FlushDecompress::Sync)
            .expect("inflates");
        assert_eq!(d.total_in() as usize, input.len());
        out
    }

    #[test]
    fn messages_compress_once_and_inflate_back_each_on_its_own() {
        for deflater in [Deflater::default(), Deflater::quick()] {
            messages_inflate_back_each_on_its_own(deflater);
        }
    }

    fn messages_inflate_back_each_on_its_own(mut deflater: Deflater) {
        let mut texts = Vec::new();
        for n in [0usize, 10, 255, 256, 300, 5_000, 70_000] {
            let sections: Vec<String> = (0..n / 60 + 1)
                .map(|i| {
                    format!(
                        r#"{{"section":{i},"total_seats":50,"seats_taken":{}}}"#,
                        i % 50
                    )
                })
                .collect();
            let mut text = format!(r#"{{"type":"frame","sections":[{}]}}"#, sections.join(","));
            text.truncate(n.max(2));
            texts.push(text);
        }
        // Each message inflates on its own, in any order: no context is carried.
        let compressed: Vec<(String, Option<Vec<u8>>)> = texts
            .iter()
            .map(|t| (t.clone(), deflater.compress_message(t.as_bytes())))
            .collect();
        for (text, c) in compressed.iter().rev() {
            assert_eq!(
                c.is_some(),
                text.len() >= MIN_COMPRESSED_PAYLOAD,
                "{}",
                text.len()
            );
            if let Some(c) = c {
                assert_eq!(reference_inflate(c), text.as_bytes());
                assert!(
                    c.len() * 2 < text.len() + 10,
                    "JSON shrinks: {} of {}",
                    c.len(),
                    text.len()
                );
            }
        }
        // Noise: compressed only if that shrinks it, and then still exact.
        let noise: String = (0..400u32)
            .map(|i| char::from(b'!' + ((i.wrapping_mul(2_654_435_761) >> 13) % 90) as u8))
            .collect();
        if let Some(c) = deflater.compress_message(noise.as_bytes()) {
            assert!(c.len() < noise.len());
            assert_eq!(reference_inflate(&c), noise.as_bytes());
        }
    }

    #[test]
    fn inflation_is_bounded() {
        let mut c = Compress::new(Compression::new(9), false);
        let deflate = |c: &mut Compress, data: &[u8]| {
            c.reset();
            let mut out = Vec::with_capacity(data.len() + 64);
            c.compress_vec(data, &mut out, FlushCompress::Sync).unwrap();
            out.truncate(out.len() - 4);
            out
        };
        let ok = deflate(&mut c, br#"{"op":"watch","course":"CS101"}"#);
        assert_eq!(
            inflate_message(&ok, 4096).unwrap(),
            br#"{"op":"watch","course":"CS101"}"#
        );
        // Exactly the limit is fine, one byte more is 1009.
        let at = deflate(&mut c, &[b'a'; 4096]);
        assert_eq!(inflate_message(&at, 4096).unwrap().len(), 4096);
        let over = deflate(&mut c, &[b'a'; 4097]);
        assert_eq!(inflate_message(&over, 4096), Err(InflateError::TooBig));
        // A zip bomb: 64 MiB of zeros in about 64 KiB; stops at the limit.
        let mut bomb = Vec::new();
        let mut z = Compress::new(Compression::new(9), false);
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..64 {
            z.compress_vec(&zeros, &mut bomb, FlushCompress::None)
                .unwrap();
            bomb.reserve(1 << 16);
        }
        z.compress_vec(&[], &mut bomb, FlushCompress::Sync).unwrap();
        assert!(bomb.len() < 128 << 10);
        let started = std::time::Instant::now();
        assert_eq!(inflate_message(&bomb, 4096), Err(InflateError::TooBig));
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        // Not deflate at all: 1007 (0xff starts a block of reserved type 3).
        assert_eq!(
            inflate_message(&[0xff, 0xff, 0xff], 4096),
            Err(InflateError::Corrupt)
        );
    }

    /// `text` as one final block (a deflater finishing the stream).
    fn finished(text: &[u8]) -> Vec<u8> {
        let mut c = Compress::new(Compression::new(6), false);
        let mut out = Vec::with_capacity(text.len() + 64);
        c.compress_vec(text, &mut out, FlushCompress::Finish)
            .unwrap();
        out
    }

    #[test]
    fn a_message_cut_inside_a_block_does_not_inflate() {
        let text = br#"{"op":"watch","course":"CS101"}                         "#;
        // Whole, ending in a final block: it inflates (the tail is not needed).
        let whole = finished(text);
        assert_eq!(inflate_message(&whole, 4096).unwrap(), text);
        // Cut anywhere: the block does not end with the message's bytes
        // (the tail's zero bits may read as its end-of-block code: that is
        // no end either).
        for keep in 1..whole.len() {
            assert_eq!(
                inflate_message(&whole[..keep], 4096),
                Err(InflateError::Corrupt),
                "{keep} bytes kept"
            );
        }
        // A sync-flushed message cut anywhere before its last block ended.
        let mut c = Compress::new(Compression::new(6), false);
        let mut synced = Vec::with_capacity(256);
        let long = br#"{"op":"watch","course":"ABCDEFGHIJABCDEFGHIJABCDEFGHIJABCDEFGHIJ"}"#;
        c.compress_vec(long, &mut synced, FlushCompress::Sync)
            .unwrap();
        assert!(synced.ends_with(&SYNC_TAIL));
        synced.truncate(synced.len() - SYNC_TAIL.len());
        assert_eq!(inflate_message(&synced, 4096).unwrap(), long);
        // Cut inside the data block: never a part of the message.
        for keep in 1..synced.len() {
            let r = inflate_message(&synced[..keep], 4096);
            assert!(r == Err(InflateError::Corrupt), "{keep} bytes kept: {r:?}");
        }
        assert_eq!(
            inflate_message(&synced[..synced.len() / 2], 4096),
            Err(InflateError::Corrupt)
        );
        // A final block sent as RFC 7692 has it (an empty stored block
        // appended, its last four bytes removed: one 0x00 after the block).
        let mut with_zero = whole.clone();
        with_zero.push(0x00);
        assert_eq!(inflate_message(&with_zero, 4096).unwrap(), text);
        // A stored block with its length but not all its bytes.
        let mut stored = vec![0x00, 5, 0, !5, 0xff];
        stored.extend_from_slice(b"ab");
        assert_eq!(inflate_message(&stored, 4096), Err(InflateError::Corrupt));
        // Empty: the tail alone is an empty stored block, at a boundary.
        assert_eq!(inflate_message(&[0x00], 4096).unwrap(), b"");
        // Whole sync-flushed messages inflate at every level (stored,
        // fixed and dynamic blocks), in one flush or several.
        let texts: [&[u8]; 3] = [b"x", long, &[b'q'; 3000]];
        for level in 0..=9 {
            for text in texts {
                let mut c = Compress::new(Compression::new(level), false);
                let mut m = Vec::with_capacity(text.len() + 128);
                let (a, b) = text.split_at(text.len() / 2);
                c.compress_vec(a, &mut m, FlushCompress::Sync).unwrap();
                c.compress_vec(b, &mut m, FlushCompress::Sync).unwrap();
                assert!(m.ends_with(&SYNC_TAIL));
                m.truncate(m.len() - SYNC_TAIL.len());
                assert_eq!(inflate_message(&m, 4096).unwrap(), text, "level {level}");
            }
        }
    }
}
