//! The optional Prometheus endpoint (`[switch] metrics_listen`): a tiny HTTP/1.0 responder on
//! the control thread's epoll loop. `GET /metrics` returns `ctl::stats::metrics`; anything else
//! gets 404, a malformed or oversized request 400. One request per connection.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::time::Duration;

use vmm_sys_util::epoll::Epoll;

use super::os::{Token, unwatch, watch};

const MAX_REQUEST: usize = 8192;

pub struct MetricsServer {
    epoll: Rc<Epoll>,
    listener: TcpListener,
    clients: HashMap<u32, (TcpStream, Vec<u8>)>,
    next: u32,
}

pub enum Event {
    /// Nothing complete yet.
    Pending,
    /// The client asked for the metrics.
    Wants,
    /// Answered or gone; the connection is closed.
    Done,
}

impl MetricsServer {
    pub fn bind(epoll: Rc<Epoll>, addr: SocketAddr) -> std::io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| std::io::Error::new(e.kind(), format!("metrics_listen {addr}: {e}")))?;
        listener.set_nonblocking(true)?;
        watch(&epoll, listener.as_raw_fd(), Token::MetricsListen);
        Ok(MetricsServer { epoll, listener, clients: HashMap::new(), next: 0 })
    }

    /// Accepts waiting connections.
    pub fn accept(&mut self) {
        while let Ok((s, _)) = self.listener.accept() {
            let _ = s.set_nonblocking(true);
            let id = self.next;
            self.next = self.next.wrapping_add(1);
            watch(&self.epoll, s.as_raw_fd(), Token::MetricsClient(id));
            self.clients.insert(id, (s, Vec::new()));
        }
    }

    /// Reads what client `id` sent. Returns `Wants` once a full `GET /metrics` arrived.
    pub fn read(&mut self, id: u32) -> Event {
        let Some((s, buf)) = self.clients.get_mut(&id) else { return Event::Done };
        let mut chunk = [0u8; 2048];
        loop {
            match s.read(&mut chunk) {
                Ok(0) => return self.close(id, None),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => return self.close(id, None),
            }
            if buf.len() > MAX_REQUEST {
                return self.close(id, Some(("400 Bad Request", "request too large\n")));
            }
        }
        if !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
            return Event::Pending;
        }
        let line = buf.split(|&b| b == b'\n').next().unwrap_or(b"");
        let line = String::from_utf8_lossy(line);
        let mut parts = line.split_whitespace();
        match (parts.next(), parts.next()) {
            (Some("GET"), Some("/metrics")) => Event::Wants,
            (Some("GET"), Some(_)) => self.close(id, Some(("404 Not Found", "try /metrics\n"))),
            _ => self.close(id, Some(("400 Bad Request", "expected GET /metrics\n"))),
        }
    }

    /// Sends the metrics to client `id` and closes the connection.
    pub fn respond(&mut self, id: u32, body: &str) -> Event {
        self.close(id, Some(("200 OK", body)))
    }

    fn close(&mut self, id: u32, reply: Option<(&str, &str)>) -> Event {
        let Some((mut s, _)) = self.clients.remove(&id) else { return Event::Done };
        unwatch(&self.epoll, s.as_raw_fd());
        if let Some((status, body)) = reply {
            let _ = s.set_nonblocking(false);
            let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
            let head = format!(
                "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(head.as_bytes()).and_then(|_| s.write_all(body.as_bytes()));
        }
        Event::Done
    }
}
