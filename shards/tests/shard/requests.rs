//! Client mistakes answered with an error frame, and the admin roster request.

use crate::rig::{
    actions, cfg, frames, interest, join, join_action, leave_action, pop_all, unwatch, watch, Out,
};
use serde_json::json;
use shards::{Action, Role, Shard, WsOptions};

fn error_code(out: &[Out]) -> String {
    assert_eq!(out.len(), 1, "{out:?}");
    let v = out[0].json();
    assert_eq!(v["type"], "error");
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
    v["code"].as_str().unwrap().to_string()
}

#[test]
fn recoverable_errors_keep_the_connection() {
    let mut s = Shard::new(cfg());
    let a = join(&mut s, "u1", 0);
    let cases = [
        ("not json", "bad_json"),
        ("[1,2]", "bad_json"),
        ("{\"op\":", "bad_json"),
        (r#"{"course":"CS101"}"#, "unknown_op"),
        (r#"{"op":"subscribe","course":"CS101"}"#, "unknown_op"),
        (r#"{"op":"watch"}"#, "bad_course"),
        (r#"{"op":"watch","course":"CS 101"}"#, "bad_course"),
        (r#"{"op":"watch","course":""}"#, "bad_course"),
        (r#"{"op":"roster","course":"CS101"}"#, "forbidden"),
    ];
    for (i, (text, code)) in cases.iter().enumerate() {
        s.handle_text(a, text, i as u64);
        assert_eq!(error_code(&pop_all(&mut s, a)), *code, "{text}");
        assert!(actions(&mut s).is_empty(), "{text}");
    }
    assert_eq!(s.stats().client_errors, cases.len() as u64);
    assert_eq!(s.connections(), 1);

    // 32 courses are fine, the 33rd is refused, re-watching one is not an error.
    for k in 0..32 {
        watch(&mut s, a, &format!("C{k}"), 100);
        s.handle_seed(&format!("C{k}"), &[], 100);
    }
    assert_eq!(s.courses(), 32);
    assert_eq!(actions(&mut s).len(), 64);
    pop_all(&mut s, a);
    watch(&mut s, a, "C32", 101);
    assert_eq!(error_code(&pop_all(&mut s, a)), "too_many_courses");
    assert!(actions(&mut s).is_empty());
    assert_eq!(s.courses(), 32);
    watch(&mut s, a, "C7", 102);
    let out = pop_all(&mut s, a);
    assert_eq!(frames(&out).len(), 1);
    // Still usable: unwatch one, then the 33rd fits.
    unwatch(&mut s, a, "C0", 103);
    watch(&mut s, a, "C32", 103);
    s.handle_seed("C32", &[], 103);
    assert_eq!(
        sorted(actions(&mut s)),
        sorted(vec![
            leave_action("C0", "u1"),
            interest("C0", false),
            interest("C32", true),
            join_action("C32", "u1"),
        ])
    );
    assert_eq!(frames(&pop_all(&mut s, a))[0]["course"], "C32");
    assert_eq!(s.courses(), 32);
}

fn sorted(mut v: Vec<Action>) -> Vec<Action> {
    v.sort_by_key(|a| format!("{a:?}"));
    v
}

#[test]
fn admin_roster_becomes_an_action_and_reply_is_delivered() {
    let mut s = Shard::new(cfg());
    let admin = s.connect("boss", Role::Admin, WsOptions::VIEWER, 0);
    pop_all(&mut s, admin);
    s.handle_text(admin, r#"{"op":"roster","course":"CS101"}"#, 1);
    assert_eq!(
        actions(&mut s),
        vec![Action::Roster {
            conn: admin,
            course: "CS101".into()
        }]
    );
    assert!(
        pop_all(&mut s, admin).is_empty(),
        "the reply is built outside"
    );
    let reply = shards::server_msg::roster("CS101", 3, &["u1".into(), "q\"uote".into()]);
    s.deliver(admin, reply);
    let out = pop_all(&mut s, admin);
    assert_eq!(
        out,
        vec![Out::Json(json!({
            "type": "roster", "course": "CS101", "total": 3, "viewers": ["u1", "q\"uote"]
        }))]
    );
    // Roster does not watch anything.
    assert_eq!(s.courses(), 0);
    assert_eq!(s.stats().client_errors, 0);
}
