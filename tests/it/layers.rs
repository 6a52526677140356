//! The layers of `src/` hold: every top-level module of the crate stands in
//! one layer of the table in `docs/code-map.md` ("Layers of `src/`"), imports
//! only modules of its own layer or of a layer below, and no chain of imports
//! comes back to the module it started from. A module's imports are every
//! `crate::<module>` path in its files (in `use` lines and in code, test
//! modules included; comments, doc comments and string literals are not
//! code), every `super::` path that climbs out of it, and in `src/main.rs` every
//! `seatboard::<module>` path. Run with `--nocapture` to see the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One import of a top-level module by another, where it was first seen.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Arrow {
    from: String,
    to: String,
    file: String,
    line: usize,
}

/// `text` with comments, string and character literals blanked (their line
/// breaks kept, so line numbers still count).
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if c[i] == 'r'
            && (i == 0 || !ident(c[i - 1]) || (c[i - 1] == 'b' && (i < 2 || !ident(c[i - 2]))))
            && matches!(next, Some('"' | '#'))
            && c[i + 1..].iter().find(|&&x| x != '#') == Some(&'"')
        {
            // A raw string: r"…", r#"…"#, br"…".
            let hashes = c[i + 1..].iter().take_while(|&&x| x == '#').count();
            i += 2 + hashes;
            while i < c.len() {
                if c[i] == '"'
                    && c[i + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&x| x == '#')
                        .count()
                        == hashes
                {
                    i += 1 + hashes;
                    break;
                }
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                if let Some(&ch) = c.get(i) {
                    blank(&mut out, ch);
                }
                i += 1;
            }
            i += 1;
        } else if c[i] == '\'' {
            // A character literal ('x', '\n', '\u{7f}'); else a lifetime.
            if next == Some('\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// A token of code: a name, `::`, a brace, a comma, or any other character.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Name(String),
    PathSep,
    Open,
    Close,
    Comma,
    Other,
}

/// The tokens of `code` (from [`code_only`]), each with its line.
fn tokens(code: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push((Tok::Name(c[start..i].iter().collect()), line));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((Tok::PathSep, line));
            i += 2;
        } else {
            let tok = match ch {
                '{' => Tok::Open,
                '}' => Tok::Close,
                ',' => Tok::Comma,
                _ => Tok::Other,
            };
            out.push((tok, line));
            i += 1;
        }
    }
    out
}

/// The names a path continues with at `toks[at]`: one name, or the first
/// name of each item of a `{…}` group.
fn heads(toks: &[(Tok, usize)], at: usize) -> Vec<String> {
    match toks.get(at) {
        Some((Tok::Name(n), _)) => vec![n.clone()],
        Some((Tok::Open, _)) => {
            let (mut depth, mut expecting, mut out) = (0, true, Vec::new());
            for (t, _) in &toks[at..] {
                match t {
                    Tok::Open => {
                        depth += 1;
                        expecting = depth == 1;
                    }
                    Tok::Close => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    Tok::Comma if depth == 1 => expecting = true,
                    Tok::Name(n) if expecting && depth == 1 => {
                        out.push(n.clone());
                        expecting = false;
                    }
                    _ => {}
                }
            }
            out
        }
        _ => Vec::new(),
    }
}

/// The module path of the file `rel` (relative to `src/`): `ingest/reader.rs`
/// is `[ingest, reader]`, `ingest/mod.rs` and `ingest.rs` are `[ingest]`.
fn module_path(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel.split('/').map(str::to_owned).collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs");
        if stem != "mod" {
            parts.push(stem.to_owned());
        }
    }
    parts
}

/// The top-level modules the file `rel` (relative to `src/`) refers to, each
/// with its line: `crate::x`, `crate::{x, y::z}`, `super::…` climbing to the
/// crate's root; in `main.rs` (the binary) `seatboard::x`. Fails on a
/// `super::` that climbs past the root.
fn references(rel: &str, text: &str) -> Vec<(String, usize)> {
    let binary = rel == "main.rs";
    let file = module_path(rel);
    let toks = tokens(&code_only(text));
    let mut inline: Vec<Option<String>> = Vec::new();
    let mut out = Vec::new();
    let name = |i: usize| match toks.get(i) {
        Some((Tok::Name(n), _)) => Some(n.as_str()),
        _ => None,
    };
    let sep = |i: usize| matches!(toks.get(i), Some((Tok::PathSep, _)));
    for i in 0..toks.len() {
        let (tok, line) = &toks[i];
        match tok {
            Tok::Open => {
                let module = (i >= 2 && name(i - 2) == Some("mod"))
                    .then(|| name(i - 1).map(str::to_owned))
                    .flatten();
                inline.push(module);
                continue;
            }
            Tok::Close => {
                inline.pop();
                continue;
            }
            _ => {}
        }
        if i > 0 && sep(i - 1) {
            continue; // the middle of a path, not its start
        }
        let root = if binary { "seatboard" } else { "crate" };
        if name(i) == Some(root) && sep(i + 1) {
            out.extend(heads(&toks, i + 2).into_iter().map(|h| (h, *line)));
        } else if name(i) == Some("super") && sep(i + 1) && !binary {
            let mut climbs = 0;
            let mut j = i;
            while name(j) == Some("super") && sep(j + 1) {
                climbs += 1;
                j += 2;
            }
            let mut here = file.clone();
            here.extend(inline.iter().flatten().cloned());
            assert!(
                climbs <= here.len(),
                "src/{rel}:{line}: super:: climbs past the crate's root"
            );
            match here.len() - climbs {
                0 => out.extend(heads(&toks, j).into_iter().map(|h| (h, *line))),
                _ => out.push((here[0].clone(), *line)),
            }
        }
    }
    out.retain(|(m, _)| m != "self" && m != "super" && m != "crate");
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).expect("read src/");
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module of the file `rel` (relative to `src/`); `None` for
/// `lib.rs`, the crate's root, which only declares the modules.
fn top_module(rel: &str) -> Option<String> {
    match rel {
        "lib.rs" => None,
        "main.rs" => Some("main".into()),
        _ => Some(module_path(rel)[0].clone()),
    }
}

/// Every top-level module of `src/` under `root`, and every arrow between
/// two of them (the first place each is seen, files in sorted order).
fn graph(root: &Path) -> (BTreeSet<String>, Vec<Arrow>) {
    let src = root.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut modules = BTreeSet::new();
    let mut arrows: Vec<Arrow> = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(&src)
            .expect("under src/")
            .to_string_lossy()
            .replace('\\', "/");
        let Some(from) = top_module(&rel) else {
            continue;
        };
        modules.insert(from.clone());
        let text = std::fs::read_to_string(&path).expect("read a source file");
        for (to, line) in references(&rel, &text) {
            if to != from && !arrows.iter().any(|a| a.from == from && a.to == to) {
                arrows.push(Arrow {
                    from: from.clone(),
                    to,
                    file: format!("src/{rel}"),
                    line,
                });
            }
        }
    }
    (modules, arrows)
}

/// The graph as text: `module -> imported, …`, one module a line.
fn render(modules: &BTreeSet<String>, arrows: &[Arrow]) -> String {
    let mut out = String::new();
    for m in modules {
        let to: BTreeSet<&str> = arrows
            .iter()
            .filter(|a| &a.from == m)
            .map(|a| a.to.as_str())
            .collect();
        let to: Vec<&str> = to.into_iter().collect();
        out.push_str(&format!("{m} -> {}\n", to.join(" ")));
    }
    out
}

/// The layer of each module, from the table under "Layers of `src/`" in
/// `doc`: a row's first cell is its layer, the names in backticks of its
/// second its modules.
fn layers(doc: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Layers of `src/`"))
        .expect("docs/code-map.md has a section \"Layers of `src/`\"");
    for row in section.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // `3: what is outside the process`: the layer's number, then its name.
        let number = cells.get(1).and_then(|c| c.split(':').next());
        let Some(Ok(layer)) = number.map(|n| n.trim().parse::<usize>()) else {
            continue; // the head and its rule
        };
        let names = cells.get(2).copied().unwrap_or("");
        for span in names.split('`').skip(1).step_by(2) {
            if span.chars().all(|ch| ch.is_ascii_lowercase() || ch == '_') {
                let before = out.insert(span.to_owned(), layer);
                assert!(before.is_none(), "{span} stands in two layers");
            }
        }
    }
    out
}

/// The arrows that point to a higher layer, as `file:line: a (layer n)
/// imports b (layer m)`, and the modules with no layer.
fn upward(
    layer: &BTreeMap<String, usize>,
    modules: &BTreeSet<String>,
    arrows: &[Arrow],
) -> Vec<String> {
    let mut found = Vec::new();
    for m in modules.iter().filter(|m| !layer.contains_key(*m)) {
        found.push(format!("{m}: no layer in docs/code-map.md"));
    }
    for m in layer.keys().filter(|m| !modules.contains(*m)) {
        found.push(format!("{m}: in the layer table but no module of src/"));
    }
    for a in arrows {
        let (Some(from), Some(to)) = (layer.get(&a.from), layer.get(&a.to)) else {
            continue;
        };
        if to > from {
            found.push(format!(
                "{}:{}: {} (layer {from}) imports {} (layer {to})",
                a.file, a.line, a.from, a.to
            ));
        }
    }
    found
}

/// Whether a chain of `arrows` leads from module `from` to module `to`.
fn reaches(from: &str, to: &str, arrows: &[Arrow]) -> bool {
    let mut seen = BTreeSet::from([from]);
    let mut todo = vec![from];
    while let Some(m) = todo.pop() {
        for a in arrows.iter().filter(|a| a.from == m) {
            if a.to == to {
                return true;
            }
            if seen.insert(&a.to) {
                todo.push(&a.to);
            }
        }
    }
    false
}

/// The arrows on a cycle: each `a -> b` from which a chain leads back to `a`.
fn on_cycles(arrows: &[Arrow]) -> Vec<&Arrow> {
    arrows
        .iter()
        .filter(|a| reaches(&a.to, &a.from, arrows))
        .collect()
}

fn code_map(root: &Path) -> String {
    std::fs::read_to_string(root.join("docs/code-map.md")).expect("read docs/code-map.md")
}

#[test]
fn every_module_has_a_layer_and_none_imports_a_higher_one() {
    let root = root();
    let (modules, arrows) = graph(&root);
    println!("{}", render(&modules, &arrows));
    let found = upward(&layers(&code_map(&root)), &modules, &arrows);
    assert!(found.is_empty(), "arrows back up:\n{}", found.join("\n"));
}

#[test]
fn no_module_imports_its_way_back_to_itself() {
    let (_, arrows) = graph(&root());
    let found: Vec<String> = on_cycles(&arrows)
        .iter()
        .map(|a| format!("{}:{}: {} imports {}", a.file, a.line, a.from, a.to))
        .collect();
    assert!(
        found.is_empty(),
        "arrows on a cycle (each leads back to the module it leaves):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_reader_finds_every_form_of_an_import_and_nothing_else() {
    let text = r##"
//! Mentions crate::docs_only and `crate::nor_this`.
use crate::a::b;
use crate::{c, d::{e, f}, self};
use super::sibling;
/* crate::block_comment /* nested crate::too */ */
fn f() {
    let s = "crate::in_a_string \" crate::escaped";
    let r = r#"crate::raw "quoted" crate::raw_too"#;
    let q = '"';
    let l: &'static str = "x";
    crate::g::call();
    x::crate_like::y();
}
#[cfg(test)]
mod tests {
    use super::*;
    use super::super::h;
    use crate::i;
}
"##;
    let found: Vec<(String, usize)> = references("m/n.rs", text);
    let names: Vec<&str> = found.iter().map(|(m, _)| m.as_str()).collect();
    // `super::sibling` and `super::*` stay in `m`; `super::super::h` from
    // `m::n::tests` is `m::h`, still `m`.
    assert_eq!(names, ["a", "c", "d", "m", "g", "m", "m", "i"]);
    assert_eq!(found[0].1, 3);
    assert_eq!(found[4].1, 12);
    // From a top-level module's own root, `super::` is the crate's root.
    let top = references(
        "m/mod.rs",
        "use super::{x, y::z};\nfn f() { super::w::g(); }",
    );
    assert_eq!(top, [("x".into(), 1), ("y".into(), 1), ("w".into(), 2)]);
    // The binary names the library by its crate name.
    let bin = references(
        "main.rs",
        "use seatboard::cli::Cli;\nfn main() { crate::own(); }",
    );
    assert_eq!(bin, [("cli".into(), 1)]);
}

#[test]
fn the_checks_catch_an_arrow_up_and_a_cycle() {
    let arrow = |from: &str, to: &str| Arrow {
        from: from.into(),
        to: to.into(),
        file: format!("src/{from}.rs"),
        line: 1,
    };
    let modules: BTreeSet<String> = ["low", "high", "other"].map(String::from).into();
    let layer: BTreeMap<String, usize> = [("low".to_string(), 1), ("high".to_string(), 2)].into();
    let arrows = [arrow("high", "low"), arrow("low", "high")];
    assert_eq!(
        upward(&layer, &modules, &arrows),
        [
            "other: no layer in docs/code-map.md",
            "src/low.rs:1: low (layer 1) imports high (layer 2)"
        ]
    );
    assert_eq!(on_cycles(&arrows).len(), 2);
    assert!(on_cycles(&arrows[..1]).is_empty());
    let chain = [
        arrow("a", "b"),
        arrow("b", "c"),
        arrow("c", "a"),
        arrow("c", "d"),
    ];
    let around: Vec<&str> = on_cycles(&chain).iter().map(|a| a.to.as_str()).collect();
    assert_eq!(around, ["b", "c", "a"], "c -> d is on no cycle");
    let table = "# x\n\n## Layers of `src/`\n\n| layer | modules | may import |\n|---|---|---|\n| 1: low | `low`, `src/low.rs` | — |\n| 2 | `high` | 1, 2 |\n\n## Next\n| 9 | `not_this` | |\n";
    assert_eq!(layers(table), layer);
}
