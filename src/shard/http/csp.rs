//! The pages' Content-Security-Policy (contract §3): scripts, styles and
//! connections from the page's own origin only, the pages' inline `<script>` and
//! `<style>` blocks allowed by their SHA-256, computed from the embedded page at
//! startup, so an edited page is covered without touching this file.

use base64::Engine as _;
use sha2::{Digest, Sha256};

/// The CSP source expression of one inline block: `'sha256-<base64>'` of its
/// text as the browser sees it (UTF-8, line breaks normalized to `\n`).
pub fn hash_source(text: &str) -> String {
    let normalized = text.replace("\r\n", "\n").replace('\r', "\n");
    let digest = Sha256::digest(normalized.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// The text of every inline `<tag>` element of `html` (`script` or `style`,
/// tag names case-insensitive); a `<script src=…>` has no inline text and is skipped.
pub fn inline_blocks<'a>(html: &'a str, tag: &str) -> Vec<&'a str> {
    let lower = html.to_ascii_lowercase();
    let open = format!("<{tag}");
    let close = format!("</{tag}");
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(found) = lower[at..].find(&open) {
        let start = at + found;
        let after_name = start + open.len();
        // `<scripts>` or `<style-x>` is another element.
        let boundary = lower[after_name..].chars().next();
        if !matches!(boundary, Some(c) if c == '>' || c == '/' || c.is_ascii_whitespace()) {
            at = after_name;
            continue;
        }
        let Some(gt) = lower[after_name..].find('>') else {
            break;
        };
        let attrs = &lower[after_name..after_name + gt];
        let body_start = after_name + gt + 1;
        let Some(end) = lower[body_start..].find(&close) else {
            break;
        };
        let has_src = attrs
            .split(|c: char| c.is_ascii_whitespace())
            .any(|a| a == "src" || a.starts_with("src="));
        if !(tag == "script" && has_src) {
            out.push(&html[body_start..body_start + end]);
        }
        at = body_start + end + close.len();
    }
    out
}

/// The policy for one page: nothing by default; its own origin plus the hashes of
/// its inline scripts and styles; connections (`fetch`, same-origin `ws:`/`wss:`)
/// to its own origin; no framing, no `<base>`, forms only to itself.
pub fn policy_for(html: &str) -> String {
    let hashes = |tag: &str| -> String {
        inline_blocks(html, tag)
            .into_iter()
            .map(|b| format!(" {}", hash_source(b)))
            .collect()
    };
    format!(
        "default-src 'none'; script-src 'self'{}; style-src 'self'{}; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
        hashes("script"),
        hashes("style"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_matches_the_csp_spec_example() {
        // The example of the CSP Level 2/3 specifications and MDN.
        assert_eq!(
            hash_source("alert('Hello, world.');"),
            "'sha256-qznLcsROx4GACP2dm0UCKCzCG+HiZ1guq6ZZDob/Tng='"
        );
        // The browser's parser turns CRLF into LF before hashing.
        assert_eq!(hash_source("a\r\nb\rc"), hash_source("a\nb\nc"));
    }

    #[test]
    fn finds_inline_blocks_only() {
        let html = "<html><head><STYLE media=\"all\">b{}</STYLE><style>\n i{}\n</style>\
            <script src=\"/x.js\"></script><script>one()</script></head>\
            <body><scripts>no</scripts><Script type=\"module\">two(\"<b>\")</sCript></body>";
        assert_eq!(inline_blocks(html, "style"), ["b{}", "\n i{}\n"]);
        assert_eq!(inline_blocks(html, "script"), ["one()", "two(\"<b>\")"]);
        assert!(inline_blocks("<p>no code</p>", "script").is_empty());
        // An unterminated block is not hashed (the browser would not run it either).
        assert!(inline_blocks("<script>x()", "script").is_empty());
    }

    #[test]
    fn policy_lists_each_block_and_never_unsafe_inline() {
        let html = "<style>a{}</style><script>x()</script><script>y()</script>";
        let p = policy_for(html);
        assert!(p.starts_with("default-src 'none'; "), "{p}");
        assert!(p.contains(&format!(
            "script-src 'self' {} {};",
            hash_source("x()"),
            hash_source("y()")
        )));
        assert!(p.contains(&format!("style-src 'self' {};", hash_source("a{}"))));
        for d in [
            "connect-src 'self'",
            "frame-ancestors 'none'",
            "base-uri 'none'",
        ] {
            assert!(p.contains(d), "{d} in {p}");
        }
        assert!(!p.contains("unsafe"), "{p}");
    }

    #[test]
    fn the_embedded_pages_have_inline_code_to_hash() {
        for page in [
            include_str!("../../web/index.html"),
            include_str!("../../web/admin.html"),
        ] {
            assert!(!inline_blocks(page, "script").is_empty());
            assert_eq!(
                policy_for(page).matches("'sha256-").count(),
                inline_blocks(page, "script").len() + inline_blocks(page, "style").len()
            );
        }
    }
}
