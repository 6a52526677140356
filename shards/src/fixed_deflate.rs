//! A deflate encoder for one message at a time with the fixed Huffman codes
//! of RFC 1951 (section 3.2.6) and greedy matching over a small hash table:
//! what a course's whole board needs, compressed again after each change and
//! sent to the few viewers arriving until the next. A general compressor
//! clears its 128 KiB match table before every message without context
//! takeover; this one keeps 16 KiB that it never clears, each entry stamped
//! with the message it belongs to, so a small message costs its own bytes.
//!
//! Its output is one fixed-code block (`BFINAL` clear), then the header of an
//! empty stored block padded to a byte: a sync flush with its `00 00 ff ff`
//! already removed, as RFC 7692 section 7.2.1 sends a message.

/// Bits of the match table's index: 4,096 entries.
const HASH_BITS: u32 = 12;
/// The farthest back a match may reach (the deflate window).
const WINDOW: usize = 32_768;
/// The shortest match looked for (4 bytes are read and compared at once).
const MIN_MATCH: usize = 4;
/// The longest match deflate codes.
const MAX_MATCH: usize = 258;

/// The one-message encoder (see the module's doc).
pub struct FixedDeflate {
    /// Where the last 4 bytes of each hash were seen: `stamp + position`.
    table: Box<[u32; 1 << HASH_BITS]>,
    /// The current message's first stamp: an entry below it is an older
    /// message's and is never a match.
    stamp: u32,
}

impl Default for FixedDeflate {
    fn default() -> Self {
        FixedDeflate {
            table: Box::new([0; 1 << HASH_BITS]),
            stamp: 1,
        }
    }
}

impl std::fmt::Debug for FixedDeflate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FixedDeflate")
    }
}

impl FixedDeflate {
    /// `payload` compressed as one message, without the sync flush's tail.
    pub fn compress(&mut self, payload: &[u8]) -> Vec<u8> {
        let n = payload.len();
        if u32::MAX - self.stamp <= n as u32 || n >= u32::MAX as usize / 2 {
            // Stamps would wrap: start again from an empty table.
            self.table.fill(0);
            self.stamp = 1;
        }
        let stamp = self.stamp;
        let mut out = Bits::with_capacity(n / 2 + 16);
        // BFINAL 0, BTYPE 01 (fixed codes).
        out.put(0b010, 3);
        let mut i = 0;
        while i + MIN_MATCH <= n {
            let word = read_u32(payload, i);
            let slot = hash(word);
            let seen = self.table[slot];
            self.table[slot] = stamp + i as u32;
            if seen >= stamp {
                let from = (seen - stamp) as usize;
                if from < i && i - from <= WINDOW && read_u32(payload, from) == word {
                    let limit = MAX_MATCH.min(n - i);
                    let mut len = MIN_MATCH;
                    while len < limit && payload[from + len] == payload[i + len] {
                        len += 1;
                    }
                    out.length(len);
                    out.distance(i - from);
                    i += len;
                    continue;
                }
            }
            out.literal(payload[i]);
            i += 1;
        }
        for &b in &payload[i..] {
            out.literal(b);
        }
        // End of block, then an empty stored block's header, padded: the
        // sync flush whose `00 00 ff ff` the receiver puts back.
        out.symbol(256);
        out.put(0, 3);
        self.stamp = stamp + n as u32 + 1;
        out.finish()
    }
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn hash(word: u32) -> usize {
    (word.wrapping_mul(2_654_435_761) >> (32 - HASH_BITS)) as usize
}

/// `code`'s `len` bits in the order deflate sends a Huffman code: from its
/// most significant bit, so reversed for a writer that fills from the least.
const fn reversed(code: u32, len: u32) -> u32 {
    code.reverse_bits() >> (32 - len)
}

/// Each literal/length symbol's fixed code (reversed) and its length.
const LITERAL_CODES: [(u16, u8); 286] = {
    let mut t = [(0u16, 0u8); 286];
    let mut sym = 0u32;
    while sym < 286 {
        let (code, len) = match sym {
            0..=143 => (0x30 + sym, 8),
            144..=255 => (0x190 + sym - 144, 9),
            256..=279 => (sym - 256, 7),
            _ => (0xc0 + sym - 280, 8),
        };
        t[sym as usize] = (reversed(code, len) as u16, len as u8);
        sym += 1;
    }
    t
};

/// Each match length's symbol and extra bits as sent, and how many bits
/// that is (indexed by length, 3 to 258).
const LENGTH_CODES: [(u32, u8); MAX_MATCH + 1] = {
    let mut t = [(0u32, 0u8); MAX_MATCH + 1];
    let mut len = 3;
    while len <= MAX_MATCH {
        let l = (len - 3) as u32;
        let (sym, extra, extra_bits) = if l < 8 {
            (257 + l, 0, 0)
        } else if l == 255 {
            (285, 0, 0)
        } else {
            let top = 31 - l.leading_zeros();
            let n = top - 2;
            (257 + 4 * (top - 1) + ((l >> n) & 3), l & ((1 << n) - 1), n)
        };
        let (code, code_len) = LITERAL_CODES[sym as usize];
        t[len] = (code as u32 | extra << code_len, code_len + extra_bits as u8);
        len += 1;
    }
    t
};

/// The 30 distance codes, 5 bits each (reversed).
const DISTANCE_CODES: [u8; 30] = {
    let mut t = [0u8; 30];
    let mut c = 0;
    while c < 30 {
        t[c] = reversed(c as u32, 5) as u8;
        c += 1;
    }
    t
};

/// Bits written least significant first, as deflate packs them.
struct Bits {
    out: Vec<u8>,
    acc: u64,
    held: u32,
}

impl Bits {
    fn with_capacity(n: usize) -> Self {
        Bits {
            out: Vec::with_capacity(n),
            acc: 0,
            held: 0,
        }
    }

    /// The low `len` bits of `value` (at most 32).
    fn put(&mut self, value: u32, len: u32) {
        self.acc |= u64::from(value) << self.held;
        self.held += len;
        if self.held >= 32 {
            self.out.extend_from_slice(&(self.acc as u32).to_le_bytes());
            self.acc >>= 32;
            self.held -= 32;
        }
    }

    /// A literal/length symbol under the fixed codes.
    fn symbol(&mut self, sym: usize) {
        let (code, len) = LITERAL_CODES[sym];
        self.put(u32::from(code), u32::from(len));
    }

    fn literal(&mut self, b: u8) {
        self.symbol(usize::from(b));
    }

    /// A match length, 3 to 258: its symbol and extra bits.
    fn length(&mut self, len: usize) {
        let (bits, n) = LENGTH_CODES[len];
        self.put(bits, u32::from(n));
    }

    /// A match distance, 1 to 32,768: its 5-bit code and extra bits.
    fn distance(&mut self, dist: usize) {
        let d = (dist - 1) as u32;
        if d < 4 {
            self.put(u32::from(DISTANCE_CODES[d as usize]), 5);
        } else {
            let top = 31 - d.leading_zeros();
            let extra = top - 1;
            let code = DISTANCE_CODES[(2 * top + ((d >> extra) & 1)) as usize];
            self.put(u32::from(code) | (d & ((1 << extra) - 1)) << 5, 5 + extra);
        }
    }

    /// The bytes, the last one padded with zero bits.
    fn finish(mut self) -> Vec<u8> {
        while self.held > 0 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.held = self.held.saturating_sub(8);
        }
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deflate::inflate_message;

    /// A deterministic generator for test inputs.
    fn xorshift(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    fn inflate(c: &[u8]) -> Vec<u8> {
        inflate_message(c, 1 << 22).expect("inflates")
    }

    #[test]
    fn every_length_and_distance_inflates_back() {
        let mut enc = FixedDeflate::default();
        // A run of one byte (distance 1, lengths up to 258 and the tail's).
        for n in [0usize, 1, 3, 4, 5, 8, 258, 259, 262, 1_000] {
            let data = vec![b'a'; n];
            assert_eq!(inflate(&enc.compress(&data)), data, "run of {n}");
        }
        // A block repeated at every distance a code starts or ends at, each
        // followed by every match length.
        let mut seed = 7;
        let block: Vec<u8> = (0..300).map(|_| xorshift(&mut seed) as u8).collect();
        for dist in [
            4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 24, 25, 300, 1_024, 1_025, 8_193, 24_577, 32_767,
            32_768, 32_769, 40_000,
        ] {
            for len in [
                4usize, 10, 11, 12, 18, 19, 34, 35, 130, 131, 226, 227, 257, 258,
            ] {
                let mut data: Vec<u8> = (0..dist).map(|_| xorshift(&mut seed) as u8).collect();
                data[..block.len().min(dist)].copy_from_slice(&block[..block.len().min(dist)]);
                let copy = data[..len.min(dist)].to_vec();
                data.extend_from_slice(&copy);
                assert_eq!(inflate(&enc.compress(&data)), data, "dist {dist} len {len}");
            }
        }
    }

    #[test]
    fn random_and_repetitive_messages_inflate_back_each_on_its_own() {
        let mut enc = FixedDeflate::default();
        let mut seed = 0x5eed;
        let mut made = Vec::new();
        for round in 0..400 {
            let n = (xorshift(&mut seed) % 5_000) as usize;
            // From noise (alphabet 256) to JSON-like text (alphabet 4).
            let alphabet = [256u64, 64, 16, 4][round % 4];
            let data: Vec<u8> = (0..n)
                .map(|_| b'{'.wrapping_add((xorshift(&mut seed) % alphabet) as u8))
                .collect();
            made.push((data.clone(), enc.compress(&data)));
        }
        // Each inflates alone, in any order: nothing is carried between them.
        for (data, c) in made.iter().rev() {
            assert_eq!(&inflate(c), data);
        }
    }

    #[test]
    fn the_table_starts_again_when_stamps_would_wrap() {
        let mut enc = FixedDeflate::default();
        let text =
            br#"{"section":1,"total_seats":50,"seats_taken":7},{"section":2,"total_seats":50}"#;
        let first = enc.compress(text);
        enc.stamp = u32::MAX - 10;
        assert_eq!(inflate(&enc.compress(text)), text);
        assert_eq!(enc.stamp, text.len() as u32 + 2, "started again from 1");
        assert_eq!(
            enc.compress(text),
            first,
            "the same bytes as from a new table"
        );
    }
}
