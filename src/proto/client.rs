//! The control protocol's one client: a request (`Request`) over the control socket, its reply
//! read back as the request's type. pvswitchctl, pvs-evpn and the tests all ask through it.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use super::{CtlError, Reply, Request};

/// pvswitchd's control socket, asked one request per connection.
#[derive(Debug, Clone)]
pub struct Client {
    path: PathBuf,
    timeout: Duration,
}

impl Client {
    /// A client of the control socket at `path`; a reply is awaited 10 s at most.
    pub fn new(path: impl Into<PathBuf>) -> Client {
        Client { path: path.into(), timeout: Duration::from_secs(10) }
    }

    /// Sends `req` and returns its reply's result as JSON text (for a caller that passes it on
    /// or reads it as a type of its own).
    pub fn ask_raw(&self, req: &Request) -> Result<Box<RawValue>, CtlError> {
        self.open(req).map(|(result, _)| result)
    }

    /// Sends `req` (a stream: `capture`) and returns its first reply's result and the
    /// connection, to read the rest from (no timeout: a stream may be quiet for long).
    pub fn stream(&self, req: &Request) -> Result<(Box<RawValue>, BufReader<UnixStream>), CtlError> {
        let (result, conn) = self.open(req)?;
        conn.get_ref().set_read_timeout(None).map_err(|e| format!("reading reply: {e}"))?;
        Ok((result, conn))
    }

    /// Sends `req`; its first reply line's result, and the connection after it.
    fn open(&self, req: &Request) -> Result<(Box<RawValue>, BufReader<UnixStream>), CtlError> {
        let path = self.path.display();
        let mut s = UnixStream::connect(&self.path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                format!("pvswitchd is not running (no control socket at {path}: {e})")
            }
            _ => format!("cannot reach pvswitchd at {path}: {e}"),
        })?;
        s.set_read_timeout(Some(self.timeout)).ok();
        let line = req.to_line();
        s.write_all(line.as_bytes()).and_then(|_| s.write_all(b"\n")).map_err(|e| format!("sending request: {e}"))?;
        let mut line = String::new();
        let mut conn = BufReader::new(s);
        conn.read_line(&mut line).map_err(|e| format!("reading reply: {e}"))?;
        let reply: Reply<Box<RawValue>> = serde_json::from_str(&line).map_err(|e| format!("malformed reply: {e}"))?;
        reply.into_outcome().map(|r| (r, conn))
    }

    /// Sends `req` and returns its reply's result as `T` (the request's reply type, or
    /// `serde_json::Value` for a caller that looks at fields by name).
    pub fn ask<T: DeserializeOwned>(&self, req: &Request) -> Result<T, CtlError> {
        let raw = self.ask_raw(req)?;
        serde_json::from_str(raw.get()).map_err(|e| CtlError::from(format!("malformed reply: {e}")))
    }
}
