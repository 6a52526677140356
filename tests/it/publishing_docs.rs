//! docs/publishing.md's Python and Node examples: the page shows the files
//! byte for byte, and those files, run against a real redis-server and a real
//! cluster, write the state hash by the compare-and-set (an older version
//! after a newer one is kept out, also after `SCRIPT FLUSH`) and publish.

use crate::cluster_util::Cluster;
use crate::common::*;
use std::path::PathBuf;
use std::process::Command;

fn docs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs")
}

/// The script as `seatboard publish-script` prints it, in a file.
fn script_file() -> PathBuf {
    let out = seatboard_command()
        .arg("publish-script")
        .output()
        .expect("run");
    assert!(out.status.success());
    let path = std::env::temp_dir().join(format!("seatboard-cas-{}.lua", std::process::id()));
    std::fs::write(&path, out.stdout).expect("write script");
    path
}

fn example(file: &str, url: &str, mode: &str, taken: u32, version: u64) {
    let prog = if file.ends_with(".py") {
        "python3"
    } else {
        "node"
    };
    // The examples are fire-and-forget publishers with their own deadlines
    // (1 s to connect, 2 s a write): on a loaded machine a write may miss
    // them, which the example counts and reports as a failure. A publish is
    // idempotent, so it is run again, three times at most.
    for attempt in 1..=3 {
        let st = Command::new(prog)
            .arg(docs().join("publishing").join(file))
            .args([
                url,
                mode,
                "CS101",
                "1",
                "40",
                &taken.to_string(),
                &version.to_string(),
            ])
            .arg(script_file())
            .status()
            .expect(prog);
        if st.success() {
            return;
        }
        eprintln!("{file} {mode} v{version}: attempt {attempt} counted a failed write");
    }
    panic!("{file} {mode} v{version}: three runs, none published");
}

#[test]
fn the_page_shows_the_example_files_verbatim() {
    let page = std::fs::read_to_string(docs().join("publishing.md")).expect("page");
    for f in ["publish.py", "publish.mjs"] {
        let text = std::fs::read_to_string(docs().join("publishing").join(f)).expect("file");
        assert!(
            page.contains(&text),
            "docs/publishing.md does not show {f} verbatim"
        );
    }
}

fn version_in(json: &str) -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(json).ok()?["version"].as_u64()
}

#[test]
fn the_examples_publish_by_compare_and_set_on_redis() {
    let r = RedisServer::start();
    let uri = r.uri();
    for file in ["publish.py", "publish.mjs"] {
        r.cli(&["DEL", "seatstate:CS101"]);
        r.cli(&["SCRIPT", "FLUSH"]);
        example(file, &uri, "standalone", 40, 18);
        example(file, &uri, "standalone", 39, 17);
        assert_eq!(
            version_in(&r.cli(&["HGET", "seatstate:CS101", "1"])),
            Some(18),
            "{file}"
        );
        r.cli(&["SCRIPT", "FLUSH"]);
        example(file, &uri, "standalone", 40, 19);
        assert_eq!(
            version_in(&r.cli(&["HGET", "seatstate:CS101", "1"])),
            Some(19),
            "{file}"
        );
    }
}

#[test]
fn the_examples_publish_by_compare_and_set_on_a_cluster() {
    let c = Cluster::primaries_only();
    let owner = c.owner("seatstate:CS101").port;
    let seed = format!("redis://127.0.0.1:{owner}");
    for file in ["publish.py", "publish.mjs"] {
        c.cli(owner, &["DEL", "seatstate:CS101"]);
        example(file, &seed, "cluster", 40, 18);
        example(file, &seed, "cluster", 39, 17);
        let v = version_in(&c.cli(owner, &["HGET", "seatstate:CS101", "1"]));
        assert_eq!(v, Some(18), "{file}");
    }
}
