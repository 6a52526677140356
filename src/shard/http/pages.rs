//! The embedded pages and the browser client as they are sent: compressed once
//! per process, each with a validator, so a phone gets a small body once and a
//! 304 afterwards.

use super::response::Response;
use flate2::write::GzEncoder;
use flate2::Compression;
use shards::http_head::RequestHead;
use std::io::Write as _;
use std::sync::LazyLock;

/// The student board (`/`).
pub static BOARD: LazyLock<EmbeddedPage> =
    LazyLock::new(|| EmbeddedPage::new(include_str!("../../web/index.html"), Kind::Page));
/// The admin dashboard (`/admin`).
pub static ADMIN: LazyLock<EmbeddedPage> =
    LazyLock::new(|| EmbeddedPage::new(include_str!("../../web/admin.html"), Kind::Page));
/// The browser client module and its elements (`/client.js`), for any origin.
pub static CLIENT_JS: LazyLock<EmbeddedPage> = LazyLock::new(|| {
    EmbeddedPage::new(
        include_str!("../../web/client.js"),
        Kind::Script("text/javascript; charset=utf-8"),
    )
});
/// The client's TypeScript declarations (`/client.d.ts`).
pub static CLIENT_DTS: LazyLock<EmbeddedPage> = LazyLock::new(|| {
    EmbeddedPage::new(
        include_str!("../../web/client.d.ts"),
        Kind::Script("application/typescript; charset=utf-8"),
    )
});

/// Compresses (and hashes) the pages and the client now, at start, rather than
/// on the first request.
pub fn prepare() {
    for asset in [&BOARD, &ADMIN, &CLIENT_JS, &CLIENT_DTS] {
        LazyLock::force(asset);
    }
}

/// What an embedded text is, which decides its headers.
#[derive(Clone, Copy)]
pub enum Kind {
    /// An HTML page of this origin: its CSP, no referrer.
    Page,
    /// A file that pages of other origins import (CORS `*`), with its content type.
    Script(&'static str),
}

/// Pages may be cached but must be revalidated: a new deploy shows at once,
/// an unchanged page costs a 304.
const CACHE_CONTROL: &str = "no-cache";

/// One page in both codings, with their entity tags.
pub struct EmbeddedPage {
    /// The page as written.
    pub html: &'static str,
    /// The same bytes gzipped (best compression: paid once).
    pub gzip: Vec<u8>,
    /// Strong validator of `html`.
    pub etag: String,
    /// Strong validator of `gzip` (a different representation, so a different tag).
    pub etag_gzip: String,
    /// Its Content-Security-Policy (inline code allowed by hash); pages only.
    pub csp: String,
    /// Page or script.
    pub kind: Kind,
}

impl EmbeddedPage {
    fn new(html: &'static str, kind: Kind) -> Self {
        let mut enc = GzEncoder::new(Vec::with_capacity(html.len() / 3), Compression::best());
        // Writing into a Vec cannot fail.
        let gzip = enc
            .write_all(html.as_bytes())
            .and_then(|()| enc.finish())
            .unwrap_or_default();
        let tag = format!("{:016x}", fnv1a64(html.as_bytes()));
        EmbeddedPage {
            html,
            gzip,
            etag: format!("\"{tag}\""),
            etag_gzip: format!("\"{tag}-gz\""),
            csp: match kind {
                Kind::Page => super::csp::policy_for(html),
                Kind::Script(_) => String::new(),
            },
            kind,
        }
    }

    /// The answer to a GET or HEAD of this page: 304 when the client's copy is
    /// current, else the gzip body when accepted (and non-empty), else the page.
    pub fn respond(&self, head: &RequestHead<'_>) -> Response {
        let gzip = !self.gzip.is_empty() && head.accepts_encoding("gzip");
        let etag = if gzip { &self.etag_gzip } else { &self.etag };
        let mut resp = if head.none_match_hits(etag) {
            Response::not_modified()
        } else if gzip {
            Response::html(self.gzip.clone()).header("Content-Encoding: gzip".into())
        } else {
            Response::html(self.html.as_bytes().to_vec())
        };
        resp.cache_control = CACHE_CONTROL;
        let resp = resp
            .header(format!("ETag: {etag}"))
            .header("Vary: Accept-Encoding".into());
        match self.kind {
            Kind::Page => resp
                .header(format!("Content-Security-Policy: {}", self.csp))
                .header("Referrer-Policy: no-referrer".into()),
            Kind::Script(content_type) => {
                let mut resp = resp.header("Access-Control-Allow-Origin: *".into());
                if resp.status == 200 {
                    resp.content_type = content_type;
                }
                resp
            }
        }
    }
}

/// 64-bit FNV-1a: a content fingerprint for the entity tag (not a security hash).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::read::GzDecoder;
    use std::io::Read as _;

    /// A head with `extra`'s headers (its bytes live for the test).
    fn head(extra: &str) -> RequestHead<'static> {
        let req = format!("GET / HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
        shards::http_head::parse(req.leak().as_bytes())
            .ok()
            .flatten()
            .map(|(h, _)| h)
            .unwrap_or_default()
    }

    #[test]
    fn gzip_body_inflates_to_the_page() {
        for page in [&*BOARD, &*ADMIN, &*CLIENT_JS, &*CLIENT_DTS] {
            let mut out = String::new();
            GzDecoder::new(&page.gzip[..])
                .read_to_string(&mut out)
                .unwrap();
            assert_eq!(out, page.html);
            assert!(page.gzip.len() < page.html.len() / 2);
        }
        assert_ne!(BOARD.etag, ADMIN.etag);
        assert_ne!(BOARD.etag, BOARD.etag_gzip);
    }

    #[test]
    fn the_client_is_a_script_for_every_origin() {
        for (asset, kind) in [
            (&*CLIENT_JS, "text/javascript; charset=utf-8"),
            (&*CLIENT_DTS, "application/typescript; charset=utf-8"),
        ] {
            for extra in ["", "Accept-Encoding: gzip\r\n"] {
                let r = asset.respond(&head(extra));
                assert_eq!(r.status, 200);
                assert_eq!(r.content_type, kind);
                assert_eq!(r.cache_control, "no-cache");
                assert!(r
                    .headers
                    .iter()
                    .any(|h| h == "Access-Control-Allow-Origin: *"));
                assert!(!r
                    .headers
                    .iter()
                    .any(|h| h.starts_with("Content-Security-Policy")));
            }
        }
        assert!(
            CLIENT_JS.gzip.len() <= 12 * 1024,
            "{} B gzipped",
            CLIENT_JS.gzip.len()
        );
    }

    #[test]
    fn codings_and_validators() {
        let plain = BOARD.respond(&head(""));
        assert_eq!(plain.status, 200);
        assert_eq!(plain.body, BOARD.html.as_bytes());
        assert!(plain.headers.contains(&format!("ETag: {}", BOARD.etag)));
        let gz = BOARD.respond(&head("Accept-Encoding: gzip, br\r\n"));
        assert_eq!(gz.body, BOARD.gzip);
        assert!(gz.headers.iter().any(|h| h == "Content-Encoding: gzip"));
        let hit = BOARD.respond(&head(&format!("If-None-Match: {}\r\n", BOARD.etag)));
        assert_eq!(hit.status, 304);
        assert!(hit.body.is_empty());
        let stale = BOARD.respond(&head("If-None-Match: \"0000\"\r\n"));
        assert_eq!(stale.status, 200);
    }
}
