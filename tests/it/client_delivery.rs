//! The browser client over plain HTTP (contract §3, §5b): `/client.js` and
//! `/client.d.ts` with their content types, gzip, ETag + 304, `no-cache` and
//! CORS `*`, the module at most 12 KB gzipped; and its unit tests
//! (`node --test tests/client/`).

use crate::common;
use crate::page_delivery::{fetch, gunzip};
use common::*;
use std::path::Path;

/// The module's budget on the wire.
const GZIP_BUDGET: usize = 12 * 1024;

#[test]
fn client_module_and_declarations_are_served_for_any_origin() {
    let sb = Seatboard::start(&["demo", "--shards", "1"]);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (path, file, kind) in [
        ("/client.js", "src/web/client.js", "text/javascript"),
        (
            "/client.d.ts",
            "src/web/client.d.ts",
            "application/typescript",
        ),
    ] {
        let source = std::fs::read(root.join(file)).expect("source file");
        let origin = "Origin: http://university.example";
        let plain = fetch(sb.port, "GET", path, &[origin]);
        assert_eq!(plain.status, 200, "{path}");
        assert_eq!(plain.body, source, "{path} is the file as written");
        let ct = plain.header("Content-Type").unwrap_or_default();
        assert!(ct.starts_with(kind), "{path}: Content-Type {ct}");
        assert_eq!(plain.header("Access-Control-Allow-Origin"), Some("*"));
        assert_eq!(plain.header("Cache-Control"), Some("no-cache"));
        assert_eq!(plain.header("X-Content-Type-Options"), Some("nosniff"));
        assert_eq!(plain.header("Content-Encoding"), None);
        let etag = plain.header("ETag").expect("ETag").to_string();

        let gz = fetch(sb.port, "GET", path, &[origin, "Accept-Encoding: gzip"]);
        assert_eq!(gz.status, 200);
        assert_eq!(gz.header("Content-Encoding"), Some("gzip"), "{path}");
        assert_eq!(gz.header("Access-Control-Allow-Origin"), Some("*"));
        assert_eq!(gunzip(&gz.body), source);
        let gz_etag = gz.header("ETag").expect("ETag").to_string();
        assert_ne!(gz_etag, etag);
        if path == "/client.js" {
            assert!(
                gz.body.len() <= GZIP_BUDGET,
                "/client.js is {} B gzipped, budget {GZIP_BUDGET}",
                gz.body.len()
            );
            println!(
                "/client.js: {} B, {} B gzipped",
                source.len(),
                gz.body.len()
            );
        }

        let inm = format!("If-None-Match: {gz_etag}");
        let hit = fetch(sb.port, "GET", path, &["Accept-Encoding: gzip", &inm]);
        assert_eq!(hit.status, 304, "{path}");
        assert!(hit.body.is_empty());
        assert_eq!(hit.header("Access-Control-Allow-Origin"), Some("*"));
        let head = fetch(sb.port, "HEAD", path, &[]);
        assert_eq!(head.status, 200);
        assert!(head.body.is_empty());
        assert_eq!(
            fetch(sb.port, "POST", path, &["Content-Length: 0"]).status,
            405
        );
    }
    // The page that builds on it loads it from its own origin.
    let page = String::from_utf8(fetch(sb.port, "GET", "/", &[]).body).expect("utf-8");
    assert!(
        page.contains("import(\"/client.js\")"),
        "the board imports /client.js"
    );
}

/// The client's logic, in Node's own test runner (no framework).
#[test]
fn client_unit_tests_pass_in_node() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("node")
        .args(["--test", "tests/client/"])
        .current_dir(root)
        .output()
        .expect("node must be installed");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "node --test tests/client/ failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("# fail 0"), "{text}");
}
