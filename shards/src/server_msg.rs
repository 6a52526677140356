//! Every message the server sends, encoded as whole WebSocket text frames
//! (contract §5): `hello`, `error`, `frame`, `presence`, `reconnect`, `roster`
//! and the admin aggregate. Every producer — the shard, the ingest thread, the
//! presence worker — builds its messages here, so the wire shape of each
//! message lives in exactly one place.

use crate::client_op::OpError;
use crate::conn::Role;
use crate::json_str::{json_str, push_json_str};
use crate::snapshot::Snapshot;
use crate::ws_codec::{text_frame, FrameBuf};
use bytes::Bytes;
use std::fmt::Write as _;
use std::sync::Arc;

/// `{"type":"hello",...}`: the first message on every connection, written
/// straight into its frame (one allocation per connection).
pub fn hello(user: &str, role: Role, tick_ms: u64, node: &str) -> Bytes {
    let mut f = FrameBuf::with_capacity(72 + user.len() + node.len());
    // Writing to a FrameBuf cannot fail.
    f.push_str("{\"type\":\"hello\",\"user\":");
    let _ = push_json_str(&mut f, user);
    f.push_str(",\"role\":\"");
    f.push_str(role.as_str());
    let _ = write!(f, "\",\"tick_ms\":{tick_ms},\"node\":");
    let _ = push_json_str(&mut f, node);
    f.push_str("}");
    f.finish_text()
}

/// `{"type":"error",...}`: a recoverable client mistake.
pub fn error(e: OpError) -> Bytes {
    error_with(e.code(), e.message())
}

/// `{"type":"error","code":"unavailable",...}`: a roster asked for while the
/// presence store cannot be reached.
pub fn presence_unreachable() -> Bytes {
    error_with("unavailable", "presence store unreachable")
}

fn error_with(code: &str, message: &str) -> Bytes {
    text_frame(&format!(
        "{{\"type\":\"error\",\"code\":{},\"message\":{}}}",
        json_str(code),
        json_str(message)
    ))
}

/// `{"type":"presence",...}`: distinct viewers of a course on all nodes
/// (built on every watch answer while the count moves: straight into its frame).
pub fn presence(course: &str, viewers: u64) -> Bytes {
    let mut f = FrameBuf::with_capacity(56 + course.len());
    // Writing to a FrameBuf cannot fail.
    f.push_str("{\"type\":\"presence\",\"course\":");
    let _ = push_json_str(&mut f, course);
    let _ = write!(f, ",\"viewers\":{viewers}}}");
    f.finish_text()
}

/// `{"type":"reconnect",...}`: the drain hint sent before close 1012.
pub fn reconnect(after_ms: u64) -> Bytes {
    text_frame(&format!(
        "{{\"type\":\"reconnect\",\"after_ms\":{after_ms}}}"
    ))
}

/// `{"type":"roster",...}`: an admin's roster reply.
pub fn roster(course: &str, total: u64, viewers: &[String]) -> Bytes {
    let mut s = format!(
        "{{\"type\":\"roster\",\"course\":{},\"total\":{total},\"viewers\":[",
        json_str(course)
    );
    for (i, v) in viewers.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&json_str(v));
    }
    s.push_str("]}");
    text_frame(&s)
}

/// `{"type":"frame",...}`: a course's sections, in the order given (callers
/// pass them sorted by section). The sections' JSON fragments were produced
/// once at ingest, so this is concatenation into one buffer.
pub fn frame<'a>(
    course: &str,
    full: bool,
    sections: impl Iterator<Item = &'a Arc<Snapshot>> + Clone,
) -> Bytes {
    let payload: usize = sections.clone().map(|s| s.json.len() + 1).sum();
    let mut f = FrameBuf::with_capacity(payload + course.len() + 64);
    f.push_str("{\"type\":\"frame\",\"course\":");
    let _ = push_json_str(&mut f, course);
    f.push_str(if full {
        ",\"full\":true,\"sections\":["
    } else {
        ",\"full\":false,\"sections\":["
    });
    for (i, s) in sections.enumerate() {
        if i > 0 {
            f.push_str(",");
        }
        f.push_str(&s.json);
    }
    f.push_str("]}");
    f.finish_text()
}

/// One course's row of the admin aggregate.
#[derive(Debug, Clone, PartialEq)]
pub struct AdminRow<'a> {
    /// Course code.
    pub course: &'a str,
    /// Known sections.
    pub sections: usize,
    /// Seats over all sections.
    pub total_seats: u64,
    /// Seats taken over all sections.
    pub seats_taken: u64,
    /// Sections with no seat left.
    pub full_sections: usize,
    /// Snapshots received during the last admin tick, per second (one decimal).
    pub updates_per_s: f64,
    /// Distinct viewers on all nodes.
    pub viewers: u64,
}

/// `{"type":"admin","full":...,"courses":[...]}`: the admin aggregate, built
/// once per node; `full`: every course the node knows, else only the changed ones.
pub fn admin<'a>(full: bool, rows: impl IntoIterator<Item = AdminRow<'a>>) -> Bytes {
    let mut s = String::with_capacity(128);
    s.push_str(if full {
        "{\"type\":\"admin\",\"full\":true,\"courses\":["
    } else {
        "{\"type\":\"admin\",\"full\":false,\"courses\":["
    });
    for (i, r) in rows.into_iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(
            s,
            "{{\"course\":{},\"sections\":{},\"total_seats\":{},\"seats_taken\":{},\"full_sections\":{},\"updates_per_s\":{},\"viewers\":{}}}",
            json_str(r.course),
            r.sections,
            r.total_seats,
            r.seats_taken,
            r.full_sections,
            r.updates_per_s,
            r.viewers
        );
    }
    s.push_str("]}");
    text_frame(&s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(frame: &Bytes) -> serde_json::Value {
        // Every message here is one unfragmented text frame with a short header.
        assert_eq!(frame[0], 0x81);
        let start = match frame[1] {
            126 => 4,
            127 => 10,
            _ => 2,
        };
        serde_json::from_slice(&frame[start..]).expect("valid JSON")
    }

    #[test]
    fn every_message_is_valid_json_of_its_type() {
        let v = text(&hello("u\"1", Role::Admin, 200, "n"));
        assert_eq!(v["type"], "hello");
        assert_eq!(v["user"], "u\"1");
        assert_eq!(v["role"], "admin");
        assert_eq!(v["tick_ms"], 200);
        let v = text(&error(OpError::BadCourse));
        assert_eq!(
            (v["type"].as_str(), v["code"].as_str()),
            (Some("error"), Some("bad_course"))
        );
        let v = text(&presence_unreachable());
        assert_eq!(v["code"], "unavailable");
        let v = text(&presence("CS101", 37));
        assert_eq!(
            (v["course"].as_str(), v["viewers"].as_u64()),
            (Some("CS101"), Some(37))
        );
        let v = text(&reconnect(1234));
        assert_eq!(
            (v["type"].as_str(), v["after_ms"].as_u64()),
            (Some("reconnect"), Some(1234))
        );
        let v = text(&roster("C", 2, &["a".into(), "b\\".into()]));
        assert_eq!(v["viewers"], serde_json::json!(["a", "b\\"]));
        assert_eq!(v["total"], 2);
    }

    /// The payload of a frame with a short header (`hello` is under 64 KiB).
    fn payload(frame: &Bytes) -> &[u8] {
        match frame[1] {
            126 => &frame[4..],
            127 => &frame[10..],
            _ => &frame[2..],
        }
    }

    #[test]
    fn hello_is_byte_for_byte_what_serde_json_writes() {
        #[derive(serde::Serialize)]
        struct Hello<'a> {
            #[serde(rename = "type")]
            kind: &'a str,
            user: &'a str,
            role: &'a str,
            tick_ms: u64,
            node: &'a str,
        }
        let controls: String = (0u8..0x20).map(char::from).collect();
        let long = "\"\\".repeat(40);
        let users = [
            "alice",
            "",
            "quote\"in",
            "back\\slash",
            "\\\"",
            controls.as_str(),
            "nl\ncr\rtab\tbs\u{8}ff\u{c}nul\u{0}del\u{7f}",
            "é日本\u{1F600}\u{2028}\u{2029}",
            "</script>",
            long.as_str(),
        ];
        for user in users {
            for (role, tick_ms, node) in [
                (Role::Student, 200, "node-1"),
                (Role::Admin, 0, "n\"\u{1}é"),
            ] {
                let want = serde_json::to_string(&Hello {
                    kind: "hello",
                    user,
                    role: role.as_str(),
                    tick_ms,
                    node,
                })
                .expect("serializes");
                let frame = hello(user, role, tick_ms, node);
                assert_eq!(frame[0], 0x81);
                assert_eq!(
                    std::str::from_utf8(payload(&frame)),
                    Ok(want.as_str()),
                    "user {user:?}"
                );
            }
        }
    }

    #[test]
    fn presence_is_byte_for_byte_what_serde_json_writes() {
        #[derive(serde::Serialize)]
        struct Presence<'a> {
            #[serde(rename = "type")]
            kind: &'a str,
            course: &'a str,
            viewers: u64,
        }
        for (course, viewers) in [("CS101", 0), ("C\"\\\u{1}é", u64::MAX), ("", 37)] {
            let want = serde_json::to_string(&Presence {
                kind: "presence",
                course,
                viewers,
            })
            .expect("serializes");
            let frame = presence(course, viewers);
            assert_eq!(std::str::from_utf8(payload(&frame)), Ok(want.as_str()));
        }
    }

    #[test]
    fn frame_concatenates_section_fragments() {
        let s = |n| Arc::new(Snapshot::build("C".into(), n, 5, 1, None, Some(3), None));
        let secs = [s(1), s(2)];
        let v = text(&frame("C", true, secs.iter()));
        assert_eq!(v["full"], true);
        assert_eq!(v["sections"][1]["section"], 2);
        let v = text(&frame("C", false, [].iter()));
        assert_eq!(v["sections"], serde_json::json!([]));
    }

    #[test]
    fn admin_rows_keep_their_fields() {
        let row = AdminRow {
            course: "CS101",
            sections: 12,
            total_seats: 480,
            seats_taken: 470,
            full_sections: 9,
            updates_per_s: 133.3,
            viewers: 37,
        };
        let v = text(&admin(true, [row.clone(), AdminRow { course: "X", ..row }]));
        assert_eq!(v["full"], true);
        assert_eq!(v["courses"][0]["updates_per_s"], 133.3);
        assert_eq!(v["courses"][1]["course"], "X");
        assert_eq!(v["courses"][0]["full_sections"], 9);
        let v = text(&admin(false, Vec::new()));
        assert_eq!(v["full"], false);
        assert_eq!(v["courses"], serde_json::json!([]));
    }
}
