//! The origin check of the WebSocket handshake (contract §1 `--allowed-origins`,
//! §4): which web pages may open a WebSocket carrying which kind of token.
//!
//! A browser attaches the `seatboard_token` cookie to an upgrade whatever page
//! opened it, so a cookie alone does not show that the student's or admin's own
//! page asked. With no allowlist, a cookie token is honoured only from the
//! page's own origin (the `Origin`'s host[:port] equals the `Host` the browser
//! sent); a token in `Authorization` or `?token=` is one a foreign page cannot
//! know, so any origin may present it. A request without `Origin` (not a
//! browser page) is accepted.

/// The `--allowed-origins` rule: an exact allowlist, or (empty) the page's own
/// origin for cookie tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OriginRule {
    /// The allowed origins, lowercased (scheme and host are case-insensitive).
    allowed: Vec<String>,
}

impl OriginRule {
    /// The rule for a comma-separated `--allowed-origins` value (entries trimmed,
    /// one trailing `/` dropped, empty entries ignored); an entry that is not
    /// `http(s)://host[:port]` is refused, named in the error.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut allowed = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let origin = entry.strip_suffix('/').unwrap_or(entry);
            if !valid_origin(origin) {
                return Err(format!(
                    "{entry:?} is not an origin: each entry is scheme://host[:port] with http or https, no path, query or user"
                ));
            }
            allowed.push(origin.to_ascii_lowercase());
        }
        Ok(OriginRule { allowed })
    }

    /// Whether an upgrade from `origin` may go on to the token check; `host` is
    /// the request's `Host`, `cookie_token` whether its token comes from the cookie.
    pub fn allows(&self, origin: Option<&str>, host: Option<&str>, cookie_token: bool) -> bool {
        let Some(origin) = origin else {
            return true;
        };
        if !self.allowed.is_empty() {
            // The list is lowercase: no copy of the request's origin.
            return self.allowed.iter().any(|a| a.eq_ignore_ascii_case(origin));
        }
        !cookie_token || host.is_some_and(|h| same_host(origin, h))
    }
}

/// A host and its port as written (`None`: no port given).
struct HostPort<'a> {
    host: &'a str,
    port: Option<u16>,
}

/// Splits `host[:port]` (IPv6 literals in brackets); `None` when malformed.
fn host_port(authority: &str) -> Option<HostPort<'_>> {
    if authority.is_empty()
        || authority
            .bytes()
            .any(|b| matches!(b, b'/' | b'@' | b'?' | b'#' | b'\\') || b.is_ascii_whitespace())
    {
        return None;
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (inside, rest) = v6.split_once(']')?;
        let host = &authority[..inside.len() + 2];
        match rest {
            "" => (host, None),
            _ => (host, Some(rest.strip_prefix(':')?)),
        }
    } else {
        match authority.split_once(':') {
            None => (authority, None),
            Some((h, p)) => (h, Some(p)),
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = match port {
        None => None,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => Some(p.parse().ok()?),
        Some(_) => return None,
    };
    Some(HostPort { host, port })
}

/// True for an origin as a browser sends it with http or https:
/// `scheme://host[:port]`, the host a name (letters, digits, `-`, `.`, `_`)
/// or an IP literal in brackets, in any case.
fn valid_origin(origin: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    if !(scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")) {
        return false;
    }
    let Some(HostPort { host, .. }) = host_port(authority) else {
        return false;
    };
    match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(ip) => {
            !ip.is_empty()
                && ip
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        }
        None => host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_')),
    }
}

/// The port a scheme implies when none is written.
fn default_port(scheme: &str) -> Option<u16> {
    match scheme.to_ascii_lowercase().as_str() {
        "http" | "ws" => Some(80),
        "https" | "wss" => Some(443),
        _ => None,
    }
}

/// True when `origin` (`scheme://host[:port]`) names the same host[:port] as a
/// `Host` header: hosts compared case-insensitively, the scheme ignored except
/// for its default port (`https://a` matches `Host: a` and `Host: a:443`).
/// Anything malformed (including the opaque origin `null`) is not the same host.
pub fn same_host(origin: &str, host: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    let (Some(o), Some(h)) = (host_port(authority), host_port(host.trim())) else {
        return false;
    };
    if !o.host.eq_ignore_ascii_case(h.host) {
        return false;
    }
    let default = default_port(scheme);
    match h.port {
        Some(p) => o.port.or(default) == Some(p),
        None => o.port.is_none() || o.port == default,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_host_compares_host_and_port_not_scheme() {
        for (origin, host) in [
            ("http://127.0.0.1:8080", "127.0.0.1:8080"),
            ("https://seats.example.edu", "seats.example.edu"),
            ("http://seats.example.edu", "seats.example.edu"),
            ("https://Seats.Example.EDU", "seats.example.edu"),
            ("HTTPS://seats.example.edu", "SEATS.example.edu"),
            ("https://seats.example.edu", "seats.example.edu:443"),
            ("http://seats.example.edu", "seats.example.edu:80"),
            ("https://seats.example.edu:443", "seats.example.edu"),
            ("http://seats.example.edu:80", "seats.example.edu"),
            ("https://a.example:8443", "a.example:8443"),
            ("http://a.example:8443", "a.example:8443"),
            ("http://[::1]:8080", "[::1]:8080"),
            ("https://[::1]", "[::1]"),
            ("http://localhost:3000", " localhost:3000 "),
        ] {
            assert!(same_host(origin, host), "{origin} vs Host {host}");
        }
    }

    #[test]
    fn different_or_malformed_is_not_same_host() {
        for (origin, host) in [
            ("https://evil.example", "seats.example.edu"),
            (
                "https://seats.example.edu.evil.example",
                "seats.example.edu",
            ),
            ("https://evil-seats.example.edu", "seats.example.edu"),
            ("http://127.0.0.1:8081", "127.0.0.1:8080"),
            ("http://127.0.0.1", "127.0.0.1:8080"),
            ("http://127.0.0.1:8080", "127.0.0.1"),
            ("https://seats.example.edu", "seats.example.edu:80"),
            ("https://seats.example.edu:8443", "seats.example.edu"),
            ("null", "seats.example.edu"),
            ("seats.example.edu", "seats.example.edu"),
            ("https://", ""),
            ("https://seats.example.edu/", "seats.example.edu"),
            ("https://user@seats.example.edu", "seats.example.edu"),
            ("https://seats.example.edu:", "seats.example.edu"),
            ("https://seats.example.edu:99999", "seats.example.edu"),
            ("https://seats.example.edu:+1", "seats.example.edu:1"),
            ("https://seats.example.edu", ""),
            ("https://seats.example.edu", "seats.example.edu:x"),
            ("https://[::1]:8080", "[::2]:8080"),
            ("https://[::1", "[::1"),
            ("https://[::1]x", "[::1]x"),
            ("https://:8080", ":8080"),
        ] {
            assert!(!same_host(origin, host), "{origin} vs Host {host:?}");
        }
    }

    #[test]
    fn a_list_takes_http_origins_only() {
        for ok in [
            "",
            " , ",
            "https://a.example",
            "https://a.example/",
            "HTTP://A.Example:8080, https://b_c.example",
            "http://127.0.0.1:3000",
            "http://[::1]:8080",
        ] {
            assert!(OriginRule::parse(ok).is_ok(), "{ok:?}");
        }
        for bad in [
            "notanorigin",
            "a.example",
            "http://a.com/path",
            "https://a.example//",
            "https://good.example,http://a.com/path",
            "ftp://a.example",
            "ws://a.example",
            "null",
            "*",
            "https://",
            "https://*.example",
            "https://user@a.example",
            "https://a.example:",
            "https://a.example:99999",
            "https://a.example:x",
            "https://a.example?x=1",
            "https://a.example#f",
            "https:/a.example",
            "https://[::1",
            "https://[]",
            "https://[::g]",
            "https://a.exämple",
        ] {
            let err = OriginRule::parse(bad).expect_err(bad);
            assert!(err.contains("not an origin"), "{bad:?}: {err}");
        }
        let err = OriginRule::parse("https://ok.example, http://a.com/path").unwrap_err();
        assert!(err.starts_with("\"http://a.com/path\""), "{err}");
    }

    #[test]
    fn empty_list_cookie_tokens_need_the_own_origin() {
        let rule = OriginRule::parse("").unwrap();
        let host = Some("seats.example.edu");
        let evil = Some("https://evil.example");
        let own = Some("https://seats.example.edu");
        // Authorization / ?token=: any origin.
        assert!(rule.allows(evil, host, false));
        assert!(rule.allows(own, host, false));
        // Cookie: the page's own origin only.
        assert!(!rule.allows(evil, host, true));
        assert!(!rule.allows(Some("null"), host, true));
        assert!(rule.allows(own, host, true));
        // No Host to compare with: a cookie token with an Origin is refused.
        assert!(!rule.allows(own, None, true));
        // No Origin (not a browser page): accepted whatever the token.
        assert!(rule.allows(None, host, true));
        assert!(rule.allows(None, None, true));
        assert!(rule.allows(None, None, false));
    }

    #[test]
    fn a_list_is_exact_for_every_token() {
        let rule = OriginRule::parse(" https://good.example/ ,, http://localhost:8080").unwrap();
        let host = Some("good.example");
        for cookie in [false, true] {
            assert!(rule.allows(Some("https://good.example"), host, cookie));
            assert!(rule.allows(Some("http://localhost:8080"), host, cookie));
            assert!(rule.allows(None, host, cookie));
            for o in [
                "https://evil.example",
                "http://good.example",
                "https://good.example:443",
                "https://good.example.evil",
                "null",
            ] {
                assert!(!rule.allows(Some(o), host, cookie), "{o} cookie={cookie}");
            }
        }
        // Scheme and host in any case, on either side.
        let rule = OriginRule::parse("HTTPS://Other.example.edu,http://[::1]:8080/").unwrap();
        for o in [
            "https://other.example.edu",
            "HTTPS://OTHER.EXAMPLE.EDU",
            "http://[::1]:8080",
        ] {
            assert!(rule.allows(Some(o), host, true), "{o}");
        }
        for o in ["http://other.example.edu", "https://other.example.edu:443"] {
            assert!(!rule.allows(Some(o), host, true), "{o}");
        }
        // The list wins over the same-host rule: the own host is not enough.
        let rule = OriginRule::parse("https://good.example").unwrap();
        assert!(!rule.allows(
            Some("https://seats.example.edu"),
            Some("seats.example.edu"),
            true
        ));
    }
}
