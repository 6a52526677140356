//! A JSON string literal written straight into a message being built, byte
//! for byte as serde_json writes it (so a message's bytes do not depend on
//! which of the two built it), without serde_json's machinery per message.

use std::fmt::{self, Write};

/// Lowercase hex digits, as serde_json writes `\u00XX`.
const HEX: &[u8; 16] = b"0123456789abcdef";

/// The short escape of byte `b` (`"`, `\`, and the control characters JSON
/// names); any other control character below 0x20 is written `\u00XX`.
fn short_escape(b: u8) -> Option<&'static str> {
    match b {
        b'"' => Some("\\\""),
        b'\\' => Some("\\\\"),
        b'\n' => Some("\\n"),
        b'\r' => Some("\\r"),
        b'\t' => Some("\\t"),
        0x08 => Some("\\b"),
        0x0c => Some("\\f"),
        _ => None,
    }
}

/// Appends `s` to `out` as a JSON string literal, quotes included.
pub fn push_json_str<W: Write>(out: &mut W, s: &str) -> fmt::Result {
    out.write_char('"')?;
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        // Only `"`, `\` and the control characters are escaped; the rest,
        // non-ASCII included, goes as it is, like serde_json.
        if b >= 0x20 && b != b'"' && b != b'\\' {
            continue;
        }
        // `i` is at an ASCII byte, so both slices end on character boundaries.
        out.write_str(&s[start..i])?;
        match short_escape(b) {
            Some(e) => out.write_str(e)?,
            None => {
                let u = [
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(b >> 4)],
                    HEX[usize::from(b & 0xf)],
                ];
                out.write_str(std::str::from_utf8(&u).map_err(|_| fmt::Error)?)?;
            }
        }
        start = i + 1;
    }
    out.write_str(&s[start..])?;
    out.write_char('"')
}

/// `s` as a JSON string literal, quotes included.
pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    // Writing to a String cannot fail.
    let _ = push_json_str(&mut out, s);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn serde(s: &str) -> String {
        serde_json::to_string(s).expect("a str serializes")
    }

    #[test]
    fn hostile_strings_match_serde_json() {
        let all_controls: String = (0u8..0x20).map(char::from).collect();
        for s in [
            "",
            "plain",
            "\"",
            "\\",
            "a\"b\\c\"",
            "\\\"\\\"",
            "\u{7f}\u{80}",
            "line\nbreak\r\ttab\u{8}\u{c}",
            &all_controls,
            "é日本\u{1F600}\u{2028}\u{2029}",
            "</script><!--",
            "\u{0}\u{1}\u{1f}x",
        ] {
            assert_eq!(json_str(s), serde(s), "{s:?}");
        }
    }

    proptest! {
        #[test]
        fn any_string_matches_serde_json(s in any::<String>()) {
            prop_assert_eq!(json_str(&s), serde(&s));
        }

        #[test]
        fn ascii_with_escapes_matches_serde_json(s in "[\\x00-\\x7f]{0,40}") {
            prop_assert_eq!(json_str(&s), serde(&s));
        }
    }
}
