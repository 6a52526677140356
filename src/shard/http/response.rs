//! An HTTP/1.1 response and its bytes on the wire, shared by every answer the shells write.

use std::fmt::Write as _;

/// A response ready to write.
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Extra headers, `Name: value` each.
    pub headers: Vec<String>,
    /// Content type of the body.
    pub content_type: &'static str,
    /// `Cache-Control` value: `no-store` but for the pages.
    pub cache_control: &'static str,
    /// Body.
    pub body: Vec<u8>,
}

fn reason(status: u16) -> &'static str {
    match status {
        101 => "Switching Protocols",
        200 => "OK",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

impl Response {
    /// A plain-text response.
    pub fn text(status: u16, body: &str) -> Self {
        Response {
            status,
            headers: Vec::new(),
            content_type: "text/plain; charset=utf-8",
            cache_control: "no-store",
            body: format!("{body}\n").into_bytes(),
        }
    }

    /// A JSON response.
    pub fn json(status: u16, body: String) -> Self {
        Response {
            status,
            headers: Vec::new(),
            content_type: "application/json",
            cache_control: "no-store",
            body: body.into_bytes(),
        }
    }

    /// An HTML page.
    pub fn html(body: Vec<u8>) -> Self {
        Response {
            status: 200,
            headers: Vec::new(),
            content_type: "text/html; charset=utf-8",
            cache_control: "no-store",
            body,
        }
    }

    /// 304: the client's cached copy is current (no body, no content headers).
    pub fn not_modified() -> Self {
        Response {
            status: 304,
            headers: Vec::new(),
            content_type: "",
            cache_control: "no-store",
            body: Vec::new(),
        }
    }

    /// Adds a header.
    pub fn header(mut self, h: String) -> Self {
        self.headers.push(h);
        self
    }

    /// The bytes on the wire (`head_only` for HEAD requests).
    pub fn encode(&self, head_only: bool) -> Vec<u8> {
        let mut s = String::with_capacity(160);
        let _ = write!(s, "HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        if self.status != 304 {
            let _ = write!(
                s,
                "Content-Type: {}\r\nContent-Length: {}\r\n",
                self.content_type,
                self.body.len()
            );
        }
        // nosniff on every answer: a browser never reads a JSON or text body as a script or page.
        let _ = write!(
            s,
            "Cache-Control: {}\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n",
            self.cache_control
        );
        for h in &self.headers {
            s.push_str(h);
            s.push_str("\r\n");
        }
        s.push_str("\r\n");
        let mut out = s.into_bytes();
        if !head_only {
            out.extend_from_slice(&self.body);
        }
        out
    }
}
