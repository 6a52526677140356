//! The HTTP request head: bounded parsing, the WebSocket upgrade check and token lookup.

use std::borrow::Cow;

/// Largest request head accepted (431 past it), whatever its number of lines.
pub const MAX_HEAD: usize = 8 * 1024;
/// Header lines the usual head is parsed with room for (on the stack).
const USUAL_HEADERS: usize = 64;
/// Header lines a head within [`MAX_HEAD`] can hold at most: the shortest
/// line is three bytes (`a:` and a bare LF). A head of more lines than
/// [`USUAL_HEADERS`] is parsed again with room for this many.
const MAX_HEAD_LINES: usize = MAX_HEAD / 3;
/// Longest token looked at; anything longer is refused as malformed.
pub const MAX_TOKEN: usize = 4096;

/// What a request head needs for routing and the handshake checks, borrowed
/// from the bytes it was parsed from (a header repeated over several lines is
/// joined into one owned value).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestHead<'a> {
    /// Method, e.g. `GET`.
    pub method: &'a str,
    /// Path without the query (of an absolute-form target too: `/ws` of
    /// `http://host/ws`).
    pub path: &'a str,
    /// Raw query string (after `?`), empty if none.
    pub query: &'a str,
    /// HTTP minor version (1 for HTTP/1.1).
    pub minor_version: u8,
    /// `Upgrade` header.
    pub upgrade: Option<&'a str>,
    /// `Connection` header.
    pub connection: Option<&'a str>,
    /// `Sec-WebSocket-Key` header.
    pub ws_key: Option<&'a str>,
    /// `Sec-WebSocket-Version` header.
    pub ws_version: Option<&'a str>,
    /// True when `Sec-WebSocket-Key` or `Sec-WebSocket-Version` came on more
    /// than one line (RFC 6455 section 4.2.1: each once): not a valid upgrade.
    pub ws_repeated: bool,
    /// `Origin` header (the last, when there are several).
    pub origin: Option<&'a str>,
    /// How many `Origin` header lines the request had (more than one is a
    /// malformed request: which one would the origin rule judge?).
    pub origin_lines: u8,
    /// `Host` header, or the authority of an absolute-form target (compared
    /// with `Origin` for cookie tokens).
    pub host: Option<&'a str>,
    /// `Authorization` header.
    pub authorization: Option<&'a str>,
    /// `Cookie` header(s), joined with `; `.
    pub cookie: Option<Cow<'a, str>>,
    /// `Accept-Encoding` header(s), joined with `, `: picks a compressed page.
    pub accept_encoding: Option<Cow<'a, str>>,
    /// `If-None-Match` header(s), joined with `, `: a cached page's validator.
    pub if_none_match: Option<Cow<'a, str>>,
    /// `Sec-WebSocket-Extensions` header(s), joined with `, `.
    pub ws_extensions: Option<Cow<'a, str>>,
}

/// Why a head could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadError {
    /// Over [`MAX_HEAD`], in bytes or in header lines: 431.
    TooLarge,
    /// Not HTTP: 400.
    Malformed,
}

impl std::fmt::Display for HeadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HeadError::TooLarge => "request head too large",
            HeadError::Malformed => "malformed request head",
        })
    }
}

impl std::error::Error for HeadError {}

/// Parses a head from the start of `buf`: `Ok(Some((head, consumed)))` when complete,
/// `Ok(None)` when more bytes are needed.
pub fn parse(buf: &[u8]) -> Result<Option<(RequestHead<'_>, usize)>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; USUAL_HEADERS];
    let parsed = match parse_with(buf, &mut headers) {
        Err(Unparsed::MoreLines) => {
            // Rare: more lines than the usual array holds. Room for as many as
            // the limit allows, so any head within it is parsed.
            let mut headers = vec![httparse::EMPTY_HEADER; MAX_HEAD_LINES];
            parse_with(buf, &mut headers)
        }
        parsed => parsed,
    };
    parsed.map_err(|e| match e {
        // More lines than fit in the limit: a head past it.
        Unparsed::MoreLines => HeadError::TooLarge,
        Unparsed::Head(e) => e,
    })
}

/// Why [`parse_with`] gave no head.
enum Unparsed {
    /// The head has more header lines than the array it was given.
    MoreLines,
    /// Refused whatever the array.
    Head(HeadError),
}

impl From<HeadError> for Unparsed {
    fn from(e: HeadError) -> Self {
        Unparsed::Head(e)
    }
}

/// [`parse`] with room for `headers.len()` header lines.
fn parse_with<'a>(
    buf: &'a [u8],
    headers: &mut [httparse::Header<'a>],
) -> Result<Option<(RequestHead<'a>, usize)>, Unparsed> {
    let mut req = httparse::Request::new(headers);
    let status = match req.parse(buf) {
        Ok(s) => s,
        Err(httparse::Error::TooManyHeaders) => return Err(Unparsed::MoreLines),
        Err(_) => {
            return if buf.len() > MAX_HEAD {
                Err(HeadError::TooLarge.into())
            } else {
                Err(HeadError::Malformed.into())
            }
        }
    };
    let consumed = match status {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial if buf.len() >= MAX_HEAD => {
            return Err(HeadError::TooLarge.into())
        }
        httparse::Status::Partial => return Ok(None),
    };
    if consumed > MAX_HEAD {
        return Err(HeadError::TooLarge.into());
    }
    let target = req.path.unwrap_or("/");
    let (target, authority) = match absolute_form(target) {
        Some(("", _)) => return Err(HeadError::Malformed.into()),
        Some((authority, rest)) => (rest, Some(authority)),
        None => (target, None),
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    // An absolute URI's empty path is `/` (RFC 9110 section 4.2.3).
    let path = if path.is_empty() { "/" } else { path };
    let mut head = RequestHead {
        method: req.method.unwrap_or(""),
        path,
        query,
        minor_version: req.version.unwrap_or(0),
        ..RequestHead::default()
    };
    read_headers(&mut head, req.headers)?;
    if authority.is_some() {
        // The target's host, not the `Host` header (RFC 9112 section 3.2.2).
        head.host = authority;
    }
    Ok(Some((head, consumed)))
}

/// Takes the header lines the head needs into `head`: each once (the last
/// line wins), the lists joined, and the lines that must come once counted;
/// a second or malformed `Host` is malformed.
fn read_headers<'a>(
    head: &mut RequestHead<'a>,
    headers: &[httparse::Header<'a>],
) -> Result<(), HeadError> {
    // Each line of a header that must come once is counted, its value UTF-8 or not.
    let (mut key_lines, mut version_lines, mut host_lines) = (0u8, 0u8, 0u8);
    for h in headers.iter() {
        let Some(name) = Header::named(h.name) else {
            continue;
        };
        match name {
            Header::WsKey => key_lines = key_lines.saturating_add(1),
            Header::WsVersion => version_lines = version_lines.saturating_add(1),
            Header::Origin => head.origin_lines = head.origin_lines.saturating_add(1),
            Header::Host => host_lines = host_lines.saturating_add(1),
            _ => {}
        }
        let Ok(value) = std::str::from_utf8(h.value) else {
            match name {
                // Another cookie's stray byte does not hide the token's cookie.
                Header::Cookie => join_into(
                    &mut head.cookie,
                    "; ",
                    Cow::Owned(String::from_utf8_lossy(h.value).into_owned()),
                ),
                // An origin that cannot be read is no origin any rule allows.
                Header::Origin => head.origin = Some(UNREADABLE_ORIGIN),
                Header::Host => return Err(HeadError::Malformed),
                _ => {}
            }
            continue;
        };
        let value = value.trim();
        let slot = match name {
            Header::Upgrade => &mut head.upgrade,
            Header::Connection => &mut head.connection,
            Header::WsKey => &mut head.ws_key,
            Header::WsVersion => &mut head.ws_version,
            Header::Origin => &mut head.origin,
            Header::Host => &mut head.host,
            Header::Authorization => &mut head.authorization,
            Header::Cookie => {
                join_into(&mut head.cookie, "; ", Cow::Borrowed(value));
                continue;
            }
            Header::AcceptEncoding => {
                join_into(&mut head.accept_encoding, ", ", Cow::Borrowed(value));
                continue;
            }
            Header::IfNoneMatch => {
                join_into(&mut head.if_none_match, ", ", Cow::Borrowed(value));
                continue;
            }
            Header::WsExtensions => {
                join_into(&mut head.ws_extensions, ", ", Cow::Borrowed(value));
                continue;
            }
        };
        *slot = Some(value);
    }
    head.ws_repeated = key_lines > 1 || version_lines > 1;
    // RFC 9112 section 3.2: a second `Host` line, or one that is no
    // `host[:port]`, is a 400 (and the cookie's origin rule reads it).
    if host_lines > 1 || head.host.is_some_and(|h| !is_authority(h)) {
        return Err(HeadError::Malformed);
    }
    Ok(())
}

/// An `http` or `https` request target in absolute form (RFC 9112 section
/// 3.2.2, which a server must accept) as its authority and the rest (path and
/// query, either may be empty); `None` for any other form, at the cost of one
/// byte's look for the usual origin form (`/...`).
fn absolute_form(target: &str) -> Option<(&str, &str)> {
    if target.starts_with('/') {
        return None;
    }
    let (scheme, rest) = target.split_once("://")?;
    if !(scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")) {
        return None;
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    Some(rest.split_at(end))
}

/// The headers a [`RequestHead`] keeps.
#[derive(Clone, Copy)]
enum Header {
    Upgrade,
    Connection,
    WsKey,
    WsVersion,
    Origin,
    Host,
    Authorization,
    Cookie,
    AcceptEncoding,
    IfNoneMatch,
    WsExtensions,
}

impl Header {
    /// Each kept header with its name (compared without regard to case).
    const NAMES: [(&'static str, Header); 11] = [
        ("upgrade", Header::Upgrade),
        ("connection", Header::Connection),
        ("sec-websocket-key", Header::WsKey),
        ("sec-websocket-version", Header::WsVersion),
        ("origin", Header::Origin),
        ("host", Header::Host),
        ("authorization", Header::Authorization),
        ("cookie", Header::Cookie),
        ("accept-encoding", Header::AcceptEncoding),
        ("if-none-match", Header::IfNoneMatch),
        ("sec-websocket-extensions", Header::WsExtensions),
    ];

    /// The kept header named `name` in any case, with no copy of the name.
    fn named(name: &str) -> Option<Header> {
        Self::NAMES
            .iter()
            .find(|(n, _)| n.len() == name.len() && n.eq_ignore_ascii_case(name))
            .map(|&(_, h)| h)
    }
}

/// Appends a repeated header's value to what an earlier line gave (a
/// header on one line stays borrowed).
fn join_into<'a>(slot: &mut Option<Cow<'a, str>>, sep: &str, value: Cow<'a, str>) {
    match slot {
        Some(c) => {
            let c = c.to_mut();
            c.push_str(sep);
            c.push_str(&value);
        }
        None => *slot = Some(value),
    }
}

/// What [`RequestHead::origin`] holds for an `Origin` that is not UTF-8:
/// equal to no allowed origin and the host of no request.
pub const UNREADABLE_ORIGIN: &str = "\u{fffd}";

/// Whether a `Host` value can be an authority (`uri-host[:port]`, RFC 3986
/// section 3.2): visible ASCII with none of the delimiters that end one.
fn is_authority(host: &str) -> bool {
    host.bytes()
        .all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b'?' | b'#' | b'@' | b'\\'))
}

/// Where a request's token was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenSource {
    /// `Authorization: Bearer`.
    Bearer,
    /// `?token=`.
    Query,
    /// The `seatboard_token` cookie, which a browser sends whatever page asked.
    Cookie,
}

/// Why an upgrade request is refused before any auth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpgradeError {
    /// Not a valid WebSocket upgrade: 400.
    Malformed,
    /// Another WebSocket version: 426 with `Sec-WebSocket-Version: 13`.
    WrongVersion,
}

impl std::fmt::Display for UpgradeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            UpgradeError::Malformed => "not a valid WebSocket upgrade",
            UpgradeError::WrongVersion => "WebSocket version other than 13",
        })
    }
}

impl std::error::Error for UpgradeError {}

fn has_token(list: Option<&str>, token: &str) -> bool {
    list.is_some_and(|l| l.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// True when `key` is base64 of exactly 16 bytes.
fn valid_ws_key(key: &str) -> bool {
    let b = key.as_bytes();
    b.len() == 24
        && b[22] == b'='
        && b[23] == b'='
        && b[..22]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/')
        // The last character before padding carries only 2 bits: its low 4 bits are zero.
        && b"AQgw".contains(&b[21])
}

impl<'a> RequestHead<'a> {
    /// True when the request carries more than one `Origin` header: refused
    /// with 400 before the accept bucket, like a malformed upgrade.
    pub fn repeated_origin(&self) -> bool {
        self.origin_lines > 1
    }

    /// Whether the request asks for a WebSocket upgrade (`Upgrade:
    /// websocket`), valid or not: a non-`GET` one is a malformed upgrade.
    pub fn asks_for_upgrade(&self) -> bool {
        has_token(self.upgrade, "websocket")
    }

    /// Checks the WebSocket upgrade rules of RFC 6455 section 4.2.1 (a
    /// repeated key or version is malformed).
    pub fn check_upgrade(&self) -> Result<&'a str, UpgradeError> {
        if self.method != "GET"
            || self.minor_version != 1
            || self.ws_repeated
            || !has_token(self.upgrade, "websocket")
            || !has_token(self.connection, "upgrade")
        {
            return Err(UpgradeError::Malformed);
        }
        let key = match self.ws_key {
            Some(k) if valid_ws_key(k) => k,
            _ => return Err(UpgradeError::Malformed),
        };
        match self.ws_version {
            Some("13") => Ok(key),
            Some(_) => Err(UpgradeError::WrongVersion),
            None => Err(UpgradeError::Malformed),
        }
    }

    /// The first query parameter `name`, percent-decoded.
    pub fn query_param(&self, name: &str) -> Option<Cow<'a, str>> {
        self.query_params(name).next()
    }

    /// Every query parameter `name`, percent-decoded, in order.
    pub fn query_params<'n>(&self, name: &'n str) -> impl Iterator<Item = Cow<'a, str>> + 'n
    where
        'a: 'n,
    {
        self.query.split('&').filter_map(move |pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (k == name).then(|| percent_decode(v))
        })
    }

    /// The courses named in the query (`?course=C&course=D…`, as `/sse` and
    /// `/ws` take them), percent-decoded, in order, each as often as it is
    /// named (a `/ws` upgrade takes each as a `watch`); unchecked (the caller
    /// refuses a malformed code or too many its own way).
    pub fn query_courses(&self) -> Vec<String> {
        self.query_params("course").map(Cow::into_owned).collect()
    }

    /// The cookie `name`'s value.
    pub fn cookie_value(&self, name: &str) -> Option<&str> {
        self.cookie.as_deref()?.split(';').find_map(|c| {
            let (k, v) = c.trim().split_once('=')?;
            (k == name).then_some(v)
        })
    }

    /// True when `Accept-Encoding` allows `coding` (named or `*`, with a q-value above 0).
    pub fn accepts_encoding(&self, coding: &str) -> bool {
        let Some(list) = self.accept_encoding.as_deref() else {
            return false;
        };
        let mut named = None;
        let mut star = None;
        for item in list.split(',') {
            let mut parts = item.split(';');
            let name = parts.next().unwrap_or("").trim();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q=").or(p.trim().strip_prefix("Q=")))
                .map(|v| v.trim().parse::<f32>().unwrap_or(0.0))
                .next()
                .unwrap_or(1.0);
            if name.eq_ignore_ascii_case(coding) {
                named = Some(q > 0.0);
            } else if name == "*" {
                star = Some(q > 0.0);
            }
        }
        named.or(star).unwrap_or(false)
    }

    /// True when `If-None-Match` names `etag`, the tag of the representation
    /// that would be sent (weak comparison), or is `*`.
    pub fn none_match_hits(&self, etag: &str) -> bool {
        let Some(list) = self.if_none_match.as_deref() else {
            return false;
        };
        let etag = etag.strip_prefix("W/").unwrap_or(etag);
        list.split(',').map(str::trim).any(|tag| {
            let tag = tag.strip_prefix("W/").unwrap_or(tag);
            tag == "*" || tag == etag
        })
    }

    /// The bearer token, in the contract's order: `Authorization: Bearer`, `?token=`,
    /// cookie `seatboard_token` (borrowed from the head unless percent-decoded).
    pub fn token(&self) -> Option<Cow<'_, str>> {
        self.token_and_source().map(|(_, t)| t)
    }

    /// Where [`Self::token`] finds the token (the origin rule differs for the cookie).
    pub fn token_source(&self) -> Option<TokenSource> {
        self.token_and_source().map(|(s, _)| s)
    }

    /// Each place is looked at in turn; an empty value there (`Bearer `,
    /// `?token=`, `seatboard_token=`) counts as absent.
    fn token_and_source(&self) -> Option<(TokenSource, Cow<'_, str>)> {
        let bearer = self.authorization.and_then(|a| {
            let (scheme, rest) = a.split_once(' ')?;
            let rest = rest.trim();
            (scheme.eq_ignore_ascii_case("bearer") && !rest.is_empty())
                .then_some((TokenSource::Bearer, Cow::Borrowed(rest)))
        });
        bearer
            .or_else(|| {
                self.query_params("token")
                    .find(|t| !t.is_empty())
                    .map(|t| (TokenSource::Query, t))
            })
            .or_else(|| {
                self.cookie_value("seatboard_token")
                    .filter(|t| !t.is_empty())
                    .map(|t| (TokenSource::Cookie, Cow::Borrowed(t)))
            })
    }
}

/// Decodes `%XX` and `+` in a query value; invalid escapes stay as they
/// are. A value with neither is the value itself, not a copy.
pub fn percent_decode(s: &str) -> Cow<'_, str> {
    let b = s.as_bytes();
    if !b.iter().any(|&c| c == b'%' || c == b'+') {
        return Cow::Borrowed(s);
    }
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    // Valid UTF-8 (the usual case) is kept without a second copy.
    Cow::Owned(
        String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const UPGRADE: &str = "GET /ws?user=u%201&token=abc HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nOrigin: http://a.example\r\nCookie: a=1\r\nCookie: seatboard_token=ck\r\n\r\n";

    #[test]
    fn head_and_upgrade_errors_are_errors() {
        let e: &dyn std::error::Error = &HeadError::TooLarge;
        assert!(e.to_string().contains("too large"));
        let e: &dyn std::error::Error = &UpgradeError::WrongVersion;
        assert!(e.to_string().contains("13"));
    }

    #[test]
    fn parses_upgrade() {
        let (h, n) = parse(UPGRADE.as_bytes()).unwrap().unwrap();
        assert_eq!(n, UPGRADE.len());
        assert_eq!(h.path, "/ws");
        assert_eq!(h.query_param("user").as_deref(), Some("u 1"));
        assert_eq!(h.check_upgrade(), Ok("dGhlIHNhbXBsZSBub25jZQ=="));
        assert_eq!(h.origin, Some("http://a.example"));
        assert_eq!(h.host, Some("x"));
        assert_eq!(h.cookie_value("seatboard_token"), Some("ck"));
        assert_eq!(h.token().as_deref(), Some("abc"));
    }

    #[test]
    fn header_names_are_matched_in_any_case() {
        let h = head("UPGRADE: websocket\r\nsec-WEBSOCKET-key: k\r\nX-Upgrade: no\r\nCOOKIE: a=1\r\ncookie: b=2\r\nOrigiN: http://o\r\n");
        assert_eq!(h.upgrade, Some("websocket"));
        assert_eq!(h.ws_key, Some("k"));
        assert_eq!(h.cookie.as_deref(), Some("a=1; b=2"));
        assert!(matches!(h.cookie, Some(Cow::Owned(_))), "two lines joined");
        let one = head("Cookie: seatboard_token=ck\r\n");
        assert!(
            matches!(one.cookie, Some(Cow::Borrowed(_))),
            "one line, no copy"
        );
        assert!(matches!(one.token(), Some(Cow::Borrowed("ck"))));
        assert_eq!(h.origin, Some("http://o"));
        assert_eq!(h.host, Some("x"));
        assert_eq!(h.connection, None);
    }

    #[test]
    fn origin_lines_are_counted() {
        assert!(!head("").repeated_origin());
        assert!(!head("Origin: http://a.example\r\n").repeated_origin());
        let two = head("Origin: http://a.example\r\norigin: http://b.example\r\n");
        assert!(two.repeated_origin());
        assert_eq!(two.origin_lines, 2);
        let same = head("Origin: http://a.example\r\nOrigin: http://a.example\r\n");
        assert!(same.repeated_origin(), "even the same origin twice");
    }

    #[test]
    fn query_courses_are_decoded_in_order_as_named_unchecked() {
        let raw = b"GET /ws?token=t&course=CS101&course=MATH%2D1&coursex=Y&course=CS101&course=a+b HTTP/1.1\r\nHost: x\r\n\r\n";
        let Ok(Some((h, _))) = parse(raw) else {
            panic!("a valid head")
        };
        assert_eq!(h.query_courses(), ["CS101", "MATH-1", "CS101", "a b"]);
        assert_eq!(h.query_param("token").as_deref(), Some("t"));
        assert!(head("").query_courses().is_empty());
    }

    #[test]
    fn partial_and_limits() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\nHost: x\r\n"), Ok(None));
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n", "a".repeat(MAX_HEAD));
        assert_eq!(parse(big.as_bytes()), Err(HeadError::TooLarge));
        let many: String = (0..1000).map(|i| format!("X{i}: y\r\n")).collect();
        let req = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert!(req.len() > MAX_HEAD);
        assert_eq!(parse(req.as_bytes()), Err(HeadError::TooLarge));
        assert_eq!(
            parse(b"\x16\x03\x01garbage\r\n\r\n"),
            Err(HeadError::Malformed)
        );
    }

    #[test]
    fn a_head_under_the_limit_parses_whatever_its_number_of_lines() {
        for n in [64, 65, 100, 700] {
            let many: String = (0..n).map(|i| format!("X{i}: y\r\n")).collect();
            let req = format!("GET /ws?a=b HTTP/1.1\r\n{many}Upgrade: websocket\r\n\r\n");
            assert!(req.len() <= MAX_HEAD);
            let Ok(Some((h, used))) = parse(req.as_bytes()) else {
                panic!("{n} lines: {:?}", parse(req.as_bytes()))
            };
            assert_eq!((h.path, h.query, used), ("/ws", "a=b", req.len()));
            assert_eq!(h.upgrade, Some("websocket"), "{n} lines");
        }
        // The shortest lines there are, as many as fit in the limit.
        let start = "GET / HTTP/1.1\n";
        let lines = (MAX_HEAD - start.len() - 1) / 3;
        let req = format!("{start}{}\n", "a:\n".repeat(lines));
        assert!(req.len() <= MAX_HEAD);
        assert!(matches!(parse(req.as_bytes()), Ok(Some((_, n))) if n == req.len()));
        // Still partial: more to read, not refused.
        assert_eq!(parse(&req.as_bytes()[..req.len() - 1]), Ok(None));
        // One line more is past the limit.
        let req = format!("{start}{}\n", "a:\n".repeat(lines + 1));
        assert!(req.len() > MAX_HEAD);
        assert_eq!(parse(req.as_bytes()), Err(HeadError::TooLarge));
    }

    #[test]
    fn bytes_that_are_no_utf8_neither_hide_the_token_cookie_nor_an_origin() {
        let parsed = |extra: &[u8]| {
            let req = [
                b"GET /ws HTTP/1.1\r\nHost: x\r\n".as_slice(),
                extra,
                b"\r\n",
            ]
            .concat();
            let (h, _) = parse(req.leak()).unwrap().unwrap();
            (
                h.cookie_value("seatboard_token").map(str::to_owned),
                h.origin,
            )
        };
        for cookie in [
            b"Cookie: city=Z\xfcrich; seatboard_token=ck\r\n".as_slice(),
            b"Cookie: seatboard_token=ck; city=Z\xfcrich\r\n",
            b"Cookie: city=Z\xfcrich\r\nCookie: seatboard_token=ck\r\n",
            b"Cookie: seatboard_token=ck\r\nCookie: city=Z\xfcrich\r\n",
        ] {
            assert_eq!(parsed(cookie).0.as_deref(), Some("ck"), "{cookie:?}");
        }
        assert_eq!(
            parsed(b"Origin: https://evil.example\xff\r\n").1,
            Some(UNREADABLE_ORIGIN)
        );
    }

    #[test]
    fn a_second_host_or_one_that_is_no_authority_is_malformed() {
        let host = |lines: &str| {
            let req = format!("GET / HTTP/1.1\r\n{lines}\r\n");
            parse(req.leak().as_bytes()).map(|h| h.map(|(h, _)| h.host))
        };
        assert_eq!(
            host("Host: a.example:80\r\n"),
            Ok(Some(Some("a.example:80")))
        );
        assert_eq!(host("Host: [::1]:8080\r\n"), Ok(Some(Some("[::1]:8080"))));
        assert_eq!(host(""), Ok(Some(None)));
        for bad in [
            "Host: a\r\nHost: a\r\n",
            "Host: a\r\nhost: b\r\n",
            "Host: a b\r\n",
            "Host: a/b\r\n",
            "Host: u@a\r\n",
        ] {
            assert_eq!(host(bad), Err(HeadError::Malformed), "{bad:?}");
        }
        let req = b"GET / HTTP/1.1\r\nHost: a\xff\r\n\r\n";
        assert_eq!(parse(req), Err(HeadError::Malformed));
    }

    #[test]
    fn a_repeated_key_or_version_is_malformed() {
        let check = |s: &str| {
            parse(s.as_bytes())
                .unwrap()
                .unwrap()
                .0
                .check_upgrade()
                .map(|_| ())
        };
        let key = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
        for again in [
            key,
            "sec-websocket-key: AAAAAAAAAAAAAAAAAAAAAA==\r\n",
            "Sec-WebSocket-Version: 13\r\n",
            "SEC-WEBSOCKET-VERSION: 8\r\n",
        ] {
            let req = UPGRADE.replace("Origin:", &format!("{again}Origin:"));
            assert_eq!(check(&req), Err(UpgradeError::Malformed), "{again:?}");
        }
        assert_eq!(check(UPGRADE), Ok(()));
        // A second key that is not even UTF-8 is a second key all the same.
        let (before, after) = UPGRADE.split_once("Origin:").unwrap();
        let req = [
            before.as_bytes(),
            b"Sec-WebSocket-Key: \xff\r\nOrigin:",
            after.as_bytes(),
        ]
        .concat();
        let (h, _) = parse(&req).unwrap().unwrap();
        assert_eq!(h.check_upgrade(), Err(UpgradeError::Malformed));
        // So is a second Origin.
        let req = [
            before.as_bytes(),
            b"Origin: \xff\r\nOrigin:",
            after.as_bytes(),
        ]
        .concat();
        let (h, _) = parse(&req).unwrap().unwrap();
        assert!(h.repeated_origin());
        assert_eq!(h.origin, Some("http://a.example"));
    }

    #[test]
    fn an_absolute_form_target_is_routed_by_its_path() {
        let at = |target: &str| {
            let req = format!("GET {target} HTTP/1.1\r\nHost: other:1\r\n\r\n");
            match parse(req.leak().as_bytes()) {
                Ok(Some((h, _))) => Ok((h.path, h.query, h.host)),
                Ok(None) => panic!("partial"),
                Err(e) => Err(e),
            }
        };
        assert_eq!(at("/ws?x=1"), Ok(("/ws", "x=1", Some("other:1"))));
        assert_eq!(
            at("http://a.example:8080/ws?x=1&y"),
            Ok(("/ws", "x=1&y", Some("a.example:8080")))
        );
        assert_eq!(at("HTTPS://a.example/"), Ok(("/", "", Some("a.example"))));
        assert_eq!(at("http://a.example"), Ok(("/", "", Some("a.example"))));
        assert_eq!(
            at("http://[::1]:80?course=X"),
            Ok(("/", "course=X", Some("[::1]:80")))
        );
        assert_eq!(at("http://a/b/c"), Ok(("/b/c", "", Some("a"))));
        // No host: invalid (RFC 9110 section 4.2.1).
        assert_eq!(at("http:///ws"), Err(HeadError::Malformed));
        assert_eq!(at("http://?x"), Err(HeadError::Malformed));
        // Another scheme is no path of this server.
        assert_eq!(at("ftp://a/ws"), Ok(("ftp://a/ws", "", Some("other:1"))));
        assert_eq!(
            at("httpx://a/ws"),
            Ok(("httpx://a/ws", "", Some("other:1")))
        );
    }

    #[test]
    fn upgrade_checks() {
        let ok = |s: &str| {
            parse(s.as_bytes())
                .unwrap()
                .unwrap()
                .0
                .check_upgrade()
                .map(|_| ())
        };
        assert_eq!(ok(UPGRADE), Ok(()));
        assert_eq!(
            ok(&UPGRADE.replace("Version: 13", "Version: 8")),
            Err(UpgradeError::WrongVersion)
        );
        assert_eq!(
            ok(&UPGRADE.replace("GET", "POST")),
            Err(UpgradeError::Malformed)
        );
        assert_eq!(
            ok(&UPGRADE.replace("HTTP/1.1", "HTTP/1.0")),
            Err(UpgradeError::Malformed)
        );
        assert_eq!(
            ok(&UPGRADE.replace("Upgrade: websocket\r\n", "")),
            Err(UpgradeError::Malformed)
        );
        assert_eq!(
            ok(&UPGRADE.replace("keep-alive, Upgrade", "keep-alive")),
            Err(UpgradeError::Malformed)
        );
        // Key: 16 bytes of base64 only.
        assert_eq!(
            ok(&UPGRADE.replace("dGhlIHNhbXBsZSBub25jZQ==", "c2hvcnQ=")),
            Err(UpgradeError::Malformed)
        );
        assert_eq!(
            ok(&UPGRADE.replace("dGhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZSBub25jZR==")),
            Err(UpgradeError::Malformed)
        );
        assert_eq!(
            ok(&UPGRADE.replace("dGhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZSBub2!jZQ==")),
            Err(UpgradeError::Malformed)
        );
    }

    #[test]
    fn token_order() {
        let h = |extra: &str, q: &str| {
            let s = format!("GET /ws{q} HTTP/1.1\r\n{extra}\r\n");
            parse(s.as_bytes())
                .unwrap()
                .unwrap()
                .0
                .token()
                .map(Cow::into_owned)
        };
        assert_eq!(
            h(
                "Authorization: Bearer aa\r\nCookie: seatboard_token=cc\r\n",
                "?token=bb"
            )
            .as_deref(),
            Some("aa")
        );
        assert_eq!(
            h("Cookie: seatboard_token=cc\r\n", "?token=bb").as_deref(),
            Some("bb")
        );
        assert_eq!(
            h("Cookie: x=1; seatboard_token=cc\r\n", "").as_deref(),
            Some("cc")
        );
        assert_eq!(h("Authorization: Basic zz\r\n", "").as_deref(), None);
    }

    #[test]
    fn an_empty_place_is_skipped_like_an_absent_one() {
        let found = |extra: &str, q: &str| {
            let s = format!("GET /ws{q} HTTP/1.1\r\n{extra}\r\n");
            let head = parse(s.as_bytes()).unwrap().unwrap().0;
            head.token_and_source()
                .map(|(src, t)| (src, t.into_owned()))
        };
        let cookie = "Cookie: seatboard_token=cc\r\n";
        let from_cookie = Some((TokenSource::Cookie, "cc".to_owned()));
        assert_eq!(found(cookie, "?token="), from_cookie);
        assert_eq!(found(cookie, "?x=1&token=&y=2"), from_cookie);
        assert_eq!(
            found(&format!("Authorization: Bearer \r\n{cookie}"), "?token="),
            from_cookie
        );
        // The first `token` that is not empty.
        assert_eq!(
            found(cookie, "?token=&token=bb"),
            Some((TokenSource::Query, "bb".to_owned()))
        );
        assert_eq!(
            found("Authorization: Bearer \r\n", "?token=bb"),
            Some((TokenSource::Query, "bb".to_owned()))
        );
        // Empty everywhere: no token.
        assert_eq!(found("Cookie: seatboard_token=\r\n", "?token="), None);
    }

    #[test]
    fn token_source_follows_the_lookup_order() {
        let src = |extra: &str, q: &str| {
            let s = format!("GET /ws{q} HTTP/1.1\r\n{extra}\r\n");
            parse(s.as_bytes()).unwrap().unwrap().0.token_source()
        };
        let cookie = "Cookie: seatboard_token=cc\r\n";
        assert_eq!(
            src(
                &format!("Authorization: Bearer aa\r\n{cookie}"),
                "?token=bb"
            ),
            Some(TokenSource::Bearer)
        );
        assert_eq!(src(cookie, "?token=bb"), Some(TokenSource::Query));
        assert_eq!(src(cookie, ""), Some(TokenSource::Cookie));
        assert_eq!(src("Authorization: Basic zz\r\n", ""), None);
        // A non-bearer Authorization does fall through.
        assert_eq!(
            src(&format!("Authorization: Basic zz\r\n{cookie}"), ""),
            Some(TokenSource::Cookie)
        );
    }

    #[test]
    fn percent() {
        assert_eq!(percent_decode("a%20b+c%zz%4"), "a b c%zz%4");
        assert_eq!(percent_decode("%41"), "A");
        assert_eq!(percent_decode("plain-CS101"), "plain-CS101");
        assert_eq!(percent_decode("%C3%A9%FF+"), "é\u{FFFD} ");
    }

    /// A head parsed from `extra`'s headers (its bytes live for the test).
    fn head(extra: &str) -> RequestHead<'static> {
        let req = format!("GET / HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
        parse(req.leak().as_bytes()).unwrap().unwrap().0
    }

    #[test]
    fn accept_encoding_with_q_values() {
        assert!(!head("").accepts_encoding("gzip"));
        assert!(head("Accept-Encoding: gzip, deflate, br\r\n").accepts_encoding("gzip"));
        assert!(head("Accept-Encoding: GZIP;q=0.5\r\n").accepts_encoding("gzip"));
        assert!(!head("Accept-Encoding: gzip;q=0, br\r\n").accepts_encoding("gzip"));
        assert!(!head("Accept-Encoding: identity\r\n").accepts_encoding("gzip"));
        assert!(head("Accept-Encoding: *\r\n").accepts_encoding("gzip"));
        assert!(!head("Accept-Encoding: *, gzip;q=0\r\n").accepts_encoding("gzip"));
        assert!(!head("Accept-Encoding: gzip;q=zz\r\n").accepts_encoding("gzip"));
        // Repeated header lines are one list.
        assert!(head("Accept-Encoding: br\r\nAccept-Encoding: gzip\r\n").accepts_encoding("gzip"));
    }

    #[test]
    fn if_none_match_lists() {
        let tag = "\"abc\"";
        assert!(!head("").none_match_hits(tag));
        assert!(head("If-None-Match: \"abc\"\r\n").none_match_hits(tag));
        assert!(head("If-None-Match: \"x\", W/\"abc\"\r\n").none_match_hits(tag));
        assert!(head("If-None-Match: *\r\n").none_match_hits(tag));
        assert!(!head("If-None-Match: \"abcd\"\r\n").none_match_hits(tag));
        assert!(!head("If-None-Match: abc\r\n").none_match_hits(tag));
        // Another encoding's tag is another representation (RFC 9110 section 13.1.2).
        assert!(!head("If-None-Match: \"abc-gz\"\r\n").none_match_hits(tag));
        assert!(!head("If-None-Match: \"abc\"\r\n").none_match_hits("\"abc-gz\""));
    }
}
