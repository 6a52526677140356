//! The documentation holds together: every relative link in `README.md`,
//! `docs/`, `benches/` and `systemd/` resolves to a file inside the repository
//! (and a `#fragment` into a Markdown file to one of its headings), so does
//! every repository path written in backticks, the README stays short, and the
//! docs speak of the product, not of how it was made.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// The Markdown files the check covers, under `root`.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.join("README.md")];
    for dir in ["docs", "benches", "systemd"] {
        walk(&root.join(dir), &mut out);
    }
    out.retain(|p| p.is_file());
    out.sort();
    out
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            // Installed packages (docs/publishing's node-redis) are not our docs.
            if path.file_name().is_some_and(|n| n != "node_modules") {
                walk(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// The lines outside fenced code blocks, numbered from 1.
fn unfenced(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// The text outside fenced code blocks and inline code spans, line by line.
fn prose(text: &str) -> Vec<(usize, String)> {
    unfenced(text)
        .into_iter()
        .map(|(n, line)| (n, line.split('`').step_by(2).collect()))
        .collect()
}

/// Link targets in `line`: inline `[text](target)` and reference
/// definitions `[label]: target`.
fn targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        out.push(target.to_string());
        rest = &after[end..];
    }
    let t = line.trim_start();
    if t.starts_with('[') {
        if let Some((_, target)) = t.split_once("]: ") {
            out.push(target.split_whitespace().next().unwrap_or("").to_string());
        }
    }
    out
}

/// The repository's top-level folders and files: a backticked span that starts
/// with one of them names a path in the repository.
const TOP_LEVEL: [&str; 11] = [
    "src/",
    "shards/",
    "tests/",
    "benches/",
    "testkit/",
    "docs/",
    "systemd/",
    "packaging/",
    "loadgen/",
    "Cargo.toml",
    "CHANGELOG.md",
];

/// Repository paths in `line`'s inline code spans (outside fenced blocks):
/// `src/ingest/seed.rs`, `tests/it/relay.rs:40`, `docs/design.md#x`. Spans
/// with spaces, globs or placeholders are commands or patterns, not paths.
fn code_paths(line: &str) -> Vec<String> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| TOP_LEVEL.iter().any(|t| span.starts_with(t)))
        .filter(|span| !span.contains([' ', '*', '<', '{', '$', '…']))
        .map(|span| {
            let path = span.split(['#', ':']).next().unwrap_or(span);
            path.trim_end_matches(['.', ',']).to_string()
        })
        .collect()
}

/// Every backticked repository path of the documents under `root` that names
/// nothing, as `file:line: path (no such file)`.
fn missing_code_paths(root: &Path) -> Vec<String> {
    let mut missing = Vec::new();
    for doc in documents(root) {
        let text = std::fs::read_to_string(&doc).expect("read doc");
        let name = doc.strip_prefix(root).unwrap_or(&doc).display().to_string();
        for (n, line) in unfenced(&text) {
            for path in code_paths(line) {
                if !root.join(&path).exists() {
                    missing.push(format!("{name}:{n}: {path} (no such file)"));
                }
            }
        }
    }
    missing
}

/// The anchor GitHub gives a heading: lower case, punctuation dropped, spaces
/// to hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (repeats get `-1`, `-2`, …).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let base = slug(line.trim_start_matches('#').replace('`', "").as_str());
        let mut name = base.clone();
        let mut n = 0;
        while seen.contains(&name) {
            n += 1;
            name = format!("{base}-{n}");
        }
        seen.insert(name);
    }
    seen
}

/// `path` with `.` and `..` folded, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Every broken relative link of the documents under `root`, as
/// `file:line: target (why)`.
fn broken_links(root: &Path) -> Vec<String> {
    let mut broken = Vec::new();
    for doc in documents(root) {
        let text = std::fs::read_to_string(&doc).expect("read doc");
        let name = doc.strip_prefix(root).unwrap_or(&doc).display().to_string();
        for (n, line) in prose(&text) {
            for target in targets(&line) {
                let external = ["http://", "https://", "mailto:"]
                    .iter()
                    .any(|s| target.starts_with(s));
                if external || target.is_empty() {
                    continue;
                }
                let (file, fragment) = match target.split_once('#') {
                    Some((f, a)) => (f, Some(a)),
                    None => (target.as_str(), None),
                };
                let resolved = if file.is_empty() {
                    doc.clone()
                } else {
                    normalize(&doc.parent().expect("doc dir").join(file))
                };
                let why = if !resolved.starts_with(root) {
                    Some("outside the repository")
                } else if !resolved.exists() {
                    Some("no such file")
                } else {
                    match fragment {
                        Some(a) if resolved.extension().is_some_and(|e| e == "md") => {
                            let text = std::fs::read_to_string(&resolved).unwrap_or_default();
                            (!anchors(&text).contains(a)).then_some("no such heading")
                        }
                        _ => None,
                    }
                };
                if let Some(why) = why {
                    broken.push(format!("{name}:{n}: {target} ({why})"));
                }
            }
        }
    }
    broken
}

fn root() -> PathBuf {
    normalize(Path::new(env!("CARGO_MANIFEST_DIR")))
}

#[test]
fn every_relative_link_resolves_inside_the_repository() {
    let root = root();
    let docs = documents(&root);
    assert!(
        docs.len() >= 8,
        "expected the README, docs/, benches/ and systemd/ guides: {docs:?}"
    );
    let broken = broken_links(&root);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_path_in_backticks_names_a_file_of_the_repository() {
    let missing = missing_code_paths(&root());
    assert!(
        missing.is_empty(),
        "paths that name nothing:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_check_catches_a_broken_link() {
    let dir = std::env::temp_dir().join(format!("seatboard-links-{}", std::process::id()));
    let root = normalize(&dir);
    std::fs::create_dir_all(root.join("docs")).expect("temp docs");
    std::fs::write(
        root.join("README.md"),
        "# Top\n\n[ok](docs/a.md#a-heading) [gone](docs/missing.md) \
         [out](../elsewhere/PROTOCOL.md) [anchor](#nowhere) [web](https://example.org)\n\
         `[code](not/checked.md)`\n\n```\n[fenced](not/checked.md)\n```\n\
         `docs/a.md` and `docs/a.md#a-heading` are there, `src/gone.rs:12` is not; \
         `src/*.rs` is a pattern, `src/x.rs <arg>` a command\n\n```\n`src/fenced.rs`\n```\n",
    )
    .expect("readme");
    std::fs::write(
        root.join("docs/a.md"),
        "# A heading\n\n[back](../README.md#top) [bad](../README.md#bottom)\n",
    )
    .expect("doc");
    let broken = broken_links(&root);
    let missing = missing_code_paths(&root);
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(missing, ["README.md:9: src/gone.rs (no such file)"]);
    assert_eq!(
        broken,
        [
            "README.md:3: docs/missing.md (no such file)",
            "README.md:3: ../elsewhere/PROTOCOL.md (outside the repository)",
            "README.md:3: #nowhere (no such heading)",
            "docs/a.md:3: ../README.md#bottom (no such heading)",
        ]
    );
}

#[test]
fn readme_is_read_in_five_minutes() {
    let text = std::fs::read_to_string(root().join("README.md")).expect("README");
    let lines = text.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines; keep it to 300");
}

/// A reference to a work item such as `#17` (a `#` and digits, not the start
/// of a heading anchor like `#2a-redis-cluster`).
fn issue_reference(line: &str) -> Option<String> {
    let bytes = line.as_bytes();
    for (i, _) in line.match_indices('#') {
        let digits = bytes[i + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let next = bytes.get(i + 1 + digits).copied().unwrap_or(b' ');
        if digits > 0 && !(next.is_ascii_alphanumeric() || next == b'-') {
            return Some(line[i..i + 1 + digits].to_string());
        }
    }
    None
}

#[test]
fn issue_references_are_told_from_anchors() {
    assert_eq!(issue_reference("(issues #13, #17)"), Some("#13".into()));
    assert_eq!(issue_reference("see #17."), Some("#17".into()));
    assert_eq!(issue_reference("[section 2a](#2a-redis-cluster)"), None);
    assert_eq!(issue_reference("[s](#5-websocket-messages) # 1"), None);
}

#[test]
fn docs_speak_of_the_product_not_of_how_it_was_made() {
    let root = root();
    let words = [
        "this session",
        "same session",
        "a session of",
        "helper",
        "issue #",
    ];
    let mut found = Vec::new();
    let mut docs = documents(&root);
    docs.push(root.join("CHANGELOG.md"));
    for doc in docs {
        let text = std::fs::read_to_string(&doc).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            for w in words.iter().filter(|w| lower.contains(*w)) {
                found.push(format!("{}:{}: {w}", doc.display(), n + 1));
            }
            if let Some(r) = issue_reference(line) {
                found.push(format!("{}:{}: {r}", doc.display(), n + 1));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// What on `line` puts a secret on a command line: `--jwt-secret` with a
/// value, or a Redis URI with a password given to `seatboard` or `--redis`
/// (tables of flags, which name the flag's value, are not examples).
fn secret_on_command_line(line: &str) -> Option<&'static str> {
    let t = line.trim_start();
    if t.starts_with('|') {
        return None;
    }
    let jwt = t.match_indices("--jwt-secret").any(|(i, m)| {
        let rest = &t[i + m.len()..];
        let value = rest
            .strip_prefix('=')
            .or_else(|| rest.strip_prefix(' '))
            .map(str::trim_start)
            .unwrap_or("");
        !value.is_empty() && !value.starts_with('-') && !value.starts_with('`')
    });
    if jwt {
        return Some("--jwt-secret with a value");
    }
    let command = t.contains("seatboard ") || t.contains("--redis");
    let password = ["redis://", "rediss://"].iter().any(|scheme| {
        t.match_indices(scheme).any(|(i, m)| {
            let rest = &t[i + m.len()..];
            let authority = rest.split([' ', '/', '`', '"', '\'']).next().unwrap_or("");
            authority
                .rsplit_once('@')
                .is_some_and(|(user, _)| user.split_once(':').is_some_and(|(_, p)| !p.is_empty()))
        })
    });
    (command && password).then_some("a Redis password on a command line")
}

#[test]
fn examples_take_secrets_from_the_environment_or_files() {
    let root = root();
    let mut found = Vec::new();
    for doc in documents(&root) {
        let text = std::fs::read_to_string(&doc).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            if let Some(why) = secret_on_command_line(line) {
                found.push(format!("{}:{}: {why}: {line}", doc.display(), n + 1));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_secret_check_catches_secrets_and_spares_flag_tables() {
    for bad in [
        "seatboard rehearse --target https://x --jwt-secret \"$SEATBOARD_JWT_SECRET\" \\",
        "seatboard token --user u1 --jwt-secret ...",
        "  --jwt-secret=abc",
        "seatboard serve --redis rediss://board:secret@redis.example.net:6380",
        "--redis redis://:hunter2@10.0.0.5:6379 \\",
    ] {
        assert!(secret_on_command_line(bad).is_some(), "{bad}");
    }
    for fine in [
        "| `--jwt-secret S` | `SEATBOARD_JWT_SECRET` | HS256 secret |",
        "seatboard serve --redis redis://10.0.0.5:6379 --redis-ca ca.pem",
        "(`rediss://user:password@host:port`): the same env file.",
        "REALTIME_REDIS_URI=rediss://board:secret@redis.example.net:6380",
        "`--jwt-secret` or `--token-file`",
    ] {
        assert_eq!(secret_on_command_line(fine), None, "{fine}");
    }
}
