//! The optional Prometheus endpoint (`[switch] metrics_listen`): a tiny HTTP/1.0 responder
//! served by the control loop like the control socket (`clients::Server`). `GET /metrics`
//! returns `ctl::stats::metrics`; anything else gets 404, a malformed or oversized request 400.
//! One request per connection.

use super::clients::Parsed;

/// Largest request accepted.
pub const MAX_REQUEST: usize = 8192;

/// What a request's bytes so far come to: `Request` (carrying nothing) once a whole
/// `GET /metrics` arrived, `Refuse` with the response for anything else.
pub fn parse(buf: &[u8]) -> Parsed {
    if !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        return Parsed::Pending;
    }
    let line = buf.split(|&b| b == b'\n').next().unwrap_or(b"");
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some("GET"), Some("/metrics")) => Parsed::Request(Vec::new()),
        (Some("GET"), Some(_)) => Parsed::Refuse("404 Not Found".into()),
        _ => Parsed::Refuse("400 Bad Request".into()),
    }
}

/// An HTTP/1.0 response.
pub fn response(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The response to a refused request (`status` from `parse`, or "request larger than ...").
pub fn refusal(status: &str) -> Vec<u8> {
    match status {
        s if s.starts_with("404") => response(s, "try /metrics\n"),
        s if s.starts_with("400") => response(s, "expected GET /metrics\n"),
        _ => response("400 Bad Request", "request too large\n"),
    }
}
