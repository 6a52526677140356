//! The `/sse` front door (contract section 4c): the courses from the query,
//! the same checks as a WebSocket upgrade, and the `200` that starts a
//! close-delimited `text/event-stream`.

use super::handshake::{self, Accepted};
use super::response::Response;
use crate::metrics::Refusal;
use crate::shard::conn::Upgrade;
use crate::shard::ctx::ShardCtx;
use shards::http_head::RequestHead;
use shards::shard::MAX_COURSES_PER_CONN;
use shards::snapshot::valid_course;

/// The courses of `?course=C&course=D…` (duplicates once), or `None` when one
/// is malformed, none is given, or more than [`MAX_COURSES_PER_CONN`] are.
fn courses(head: &RequestHead<'_>) -> Option<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for c in head.query_courses() {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    let valid = out.iter().all(|c| valid_course(c));
    (valid && !out.is_empty() && out.len() <= MAX_COURSES_PER_CONN).then_some(out)
}

/// The CORS headers for a request whose `Origin` passed the origin rule: a
/// page of the university's own site may read the stream (with credentials).
fn cors(head: &RequestHead<'_>) -> Vec<String> {
    match head.origin {
        Some(origin) if origin != shards::http_head::UNREADABLE_ORIGIN => vec![
            format!("Access-Control-Allow-Origin: {origin}"),
            "Access-Control-Allow-Credentials: true".into(),
            "Vary: Origin".into(),
        ],
        _ => Vec::new(),
    }
}

/// Runs the `/sse` checks in the contract's order (a malformed course list
/// takes the place of the upgrade check), and builds the stream's `200`.
pub fn check(ctx: &ShardCtx, head: &RequestHead<'_>) -> Result<Accepted, Response> {
    let Some(courses) = courses(head) else {
        ctx.node.metrics.refuse(Refusal::BadRequest);
        return Err(Response::text(400, "course: 1 to 32 valid course codes"));
    };
    handshake::repeated_origin(ctx, head)?;
    let allowed = ctx.node.origin_allowed(head);
    let (slot, role) = handshake::admit(ctx, head, false).map_err(|mut resp| {
        if allowed {
            for h in cors(head) {
                resp = resp.header(h);
            }
        }
        resp
    })?;
    let mut response = String::from(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\nX-Accel-Buffering: no\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n",
    );
    for h in cors(head) {
        response.push_str(&h);
        response.push_str("\r\n");
    }
    response.push_str("\r\n");
    Ok(Accepted {
        upgrade: Upgrade {
            slot,
            role,
            admin_feed: false,
            deflate: false,
            sse: true,
            courses,
        },
        response: response.into_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head for `query` (its bytes live for the test).
    fn head(query: &str) -> RequestHead<'static> {
        let raw = format!("GET /sse?{query} HTTP/1.1\r\nHost: x\r\n\r\n");
        match shards::http_head::parse(raw.leak().as_bytes()) {
            Ok(Some((h, _))) => h,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn courses_come_from_the_query_once_each_and_at_most_32() {
        assert_eq!(
            courses(&head("course=CS101&token=t&course=MATH%2D1&course=CS101")),
            Some(vec!["CS101".to_string(), "MATH-1".to_string()])
        );
        assert_eq!(courses(&head("token=t")), None, "no course");
        assert_eq!(courses(&head("course=a%20b")), None, "malformed");
        let q32: Vec<String> = (0..32).map(|i| format!("course=C{i}")).collect();
        assert_eq!(courses(&head(&q32.join("&"))).map(|c| c.len()), Some(32));
        let q33: Vec<String> = (0..33).map(|i| format!("course=C{i}")).collect();
        assert_eq!(courses(&head(&q33.join("&"))), None, "33 courses");
    }
}
