//! The courses a WebSocket names in its upgrade (`/ws?course=`): the same
//! answers, refusals and actions as `watch` messages right after the `hello`.

use crate::rig::{actions, cfg, interest, join_action, pop_all, snap, watch, Out};
use serde_json::json;
use shards::{Role, Shard, WsOptions};

/// Two shards, each with a seeded course `CS101` and one viewer of it; one
/// new viewer each: the first names `courses` in its upgrade, the second
/// sends them as `watch` messages. Returns both outputs and both shards'
/// actions after the connects.
fn named_and_sent(courses: &[String]) -> [(Vec<Out>, Vec<shards::Action>); 2] {
    let mut out = Vec::new();
    for named in [true, false] {
        let mut s = Shard::new(cfg());
        let other = s.connect("u0", Role::Student, WsOptions::VIEWER, 0);
        watch(&mut s, other, "CS101", 0);
        s.handle_seed("CS101", &[snap("CS101", 1, 5, Some(3))], 0);
        pop_all(&mut s, other);
        actions(&mut s);
        let id = s.connect("u1", Role::Student, WsOptions::VIEWER, 10);
        if named {
            s.watch_named(id, courses, 10);
        } else {
            for c in courses {
                let msg = json!({"op": "watch", "course": c}).to_string();
                s.handle_text(id, &msg, 10);
            }
        }
        out.push((pop_all(&mut s, id), actions(&mut s)));
    }
    let sent = out.pop().expect("two runs");
    let named = out.pop().expect("two runs");
    [named, sent]
}

#[test]
fn named_courses_are_answered_after_the_hello_as_watches_are() {
    let courses = vec!["CS101".to_string(), "MATH101".to_string()];
    let [(named, named_actions), (sent, sent_actions)] = named_and_sent(&courses);
    assert_eq!(named, sent);
    assert_eq!(named_actions, sent_actions);
    assert!(named[0].is_type("hello"));
    // The seeded course at once (full frame, presence); the other once seeded.
    assert_eq!(named.len(), 3, "{named:?}");
    assert_eq!(named[1].json()["course"], "CS101");
    assert_eq!(named[1].json()["full"], true);
    assert_eq!(
        named[2],
        Out::Json(json!({"type": "presence", "course": "CS101", "viewers": 2}))
    );
    assert_eq!(
        named_actions,
        vec![
            join_action("CS101", "u1"),
            interest("MATH101", true),
            join_action("MATH101", "u1"),
        ]
    );
}

#[test]
fn a_named_course_a_watch_would_refuse_gets_its_error_and_the_rest_are_watched() {
    let mut courses = vec!["a b".to_string(), "<script>".to_string(), String::new()];
    courses.push("x".repeat(65));
    courses.extend((0..33).map(|i| format!("C{i}")));
    let [(named, named_actions), (sent, sent_actions)] = named_and_sent(&courses);
    assert_eq!(named, sent);
    assert_eq!(named_actions, sent_actions);
    let errors: Vec<&str> = named
        .iter()
        .filter(|o| o.is_type("error"))
        .map(|o| o.json()["code"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        errors,
        [
            "bad_course",
            "bad_course",
            "bad_course",
            "bad_course",
            "too_many_courses"
        ]
    );
    let watched = named_actions
        .iter()
        .filter(|a| matches!(a, shards::Action::Interest { watching: true, .. }))
        .count();
    assert_eq!(watched, 32, "the cap of 32, as for watch messages");
}

#[test]
fn named_courses_do_not_use_the_message_window() {
    let mut s = Shard::new(cfg());
    let id = s.connect("u1", Role::Student, WsOptions::VIEWER, 0);
    let courses: Vec<String> = (0..32).map(|i| format!("C{i}")).collect();
    s.watch_named(id, &courses, 0);
    // 20 messages in the same second are still allowed after 32 named courses.
    for _ in 0..20 {
        watch(&mut s, id, "C0", 0);
    }
    let out = pop_all(&mut s, id);
    assert!(!out.iter().any(|o| matches!(o, Out::Close(_))), "{out:?}");
}
