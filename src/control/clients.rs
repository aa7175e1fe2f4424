//! Clients of the control thread's request-reply sockets: the control socket (`pvswitchctl`:
//! one JSON request line, one reply line) and the Prometheus endpoint (one HTTP request, one
//! response). Both are served without ever waiting on a client: requests are gathered from
//! readiness events, replies go out as the socket takes them, a client idle for `IDLE_TIMEOUT`
//! (request unfinished, or reply unread) is dropped, and at most `MAX_CLIENTS` are served at
//! once: when that many are connected, a new one evicts the oldest if it has had `EVICT_AGE`
//! (a real client asks at once and is answered in far less), else new ones wait in the backlog
//! until one qualifies. So clients that connect and idle, however many, cannot lock out one
//! that asks. A listener that runs out of file descriptors (EMFILE) pauses for `ACCEPT_PAUSE`,
//! says so once, and resumes.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use log::warn;
use vmm_sys_util::epoll::Epoll;

use super::os::{Token, rewatch, unwatch, watch};

/// Most clients of one listener served at once.
pub const MAX_CLIENTS: usize = 256;
/// A client must finish its request, and read its reply, within this.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// With every slot taken, a client this old may be evicted for a new one.
pub const EVICT_AGE: Duration = Duration::from_millis(20);
/// How long a listener stops accepting after running out of file descriptors.
pub const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// A stream socket a server accepts clients on.
pub trait Listen: AsRawFd {
    type Stream: Read + Write + AsRawFd;
    fn accept_one(&self) -> std::io::Result<Self::Stream>;
}

impl Listen for std::os::unix::net::UnixListener {
    type Stream = std::os::unix::net::UnixStream;
    fn accept_one(&self) -> std::io::Result<Self::Stream> {
        let (s, _) = self.accept()?;
        s.set_nonblocking(true)?;
        Ok(s)
    }
}

impl Listen for std::net::TcpListener {
    type Stream = std::net::TcpStream;
    fn accept_one(&self) -> std::io::Result<Self::Stream> {
        let (s, _) = self.accept()?;
        s.set_nonblocking(true)?;
        Ok(s)
    }
}

/// What a protocol makes of the bytes a client sent so far.
pub enum Parsed {
    /// Not a whole request yet.
    Pending,
    /// A whole request: answer it.
    Request(Vec<u8>),
    /// Answer this (an error) without looking further.
    Refuse(String),
}

struct Client<S> {
    stream: S,
    buf: Vec<u8>,
    /// The reply not yet taken by the socket (Some once the request was answered).
    out: Option<(Vec<u8>, usize)>,
    since: Instant,
}

/// One listener and its clients, for a protocol given by `parse` (bytes so far -> request).
pub struct Server<L: Listen> {
    epoll: Rc<Epoll>,
    listener: L,
    listen_token: Token,
    client_token: fn(u32) -> Token,
    max_request: usize,
    clients: HashMap<u32, Client<L::Stream>>,
    next: u32,
    paused_until: Option<Instant>,
}

impl<L: Listen> Server<L> {
    pub fn new(
        epoll: Rc<Epoll>,
        listener: L,
        listen_token: Token,
        client_token: fn(u32) -> Token,
        max_request: usize,
    ) -> Server<L> {
        watch(&epoll, listener.as_raw_fd(), listen_token);
        Server {
            epoll,
            listener,
            listen_token,
            client_token,
            max_request,
            clients: HashMap::new(),
            next: 0,
            paused_until: None,
        }
    }

    /// Accepts waiting clients while there is room (evicting the oldest if it is old enough);
    /// when there is none, stops watching the listener until the oldest is. Returns the new
    /// clients, to read at once: a real client's request is usually there already.
    pub fn accept(&mut self) -> Vec<u32> {
        let mut new = Vec::new();
        loop {
            if self.clients.len() >= MAX_CLIENTS {
                let (&oldest, c) = self.clients.iter().min_by_key(|(_, c)| c.since).expect("clients");
                let at = c.since + EVICT_AGE;
                if at > Instant::now() {
                    unwatch(&self.epoll, self.listener.as_raw_fd());
                    self.paused_until = Some(at);
                    return new;
                }
                self.drop_client(oldest);
            }
            match self.listener.accept_one() {
                Ok(s) => {
                    let id = self.next;
                    self.next = self.next.wrapping_add(1);
                    watch(&self.epoll, s.as_raw_fd(), (self.client_token)(id));
                    self.clients.insert(id, Client { stream: s, buf: Vec::new(), out: None, since: Instant::now() });
                    new.push(id);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return new,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    warn!("{:?}: out of file descriptors ({e}); not accepting for {ACCEPT_PAUSE:?}", self.listen_token);
                    unwatch(&self.epoll, self.listener.as_raw_fd());
                    self.paused_until = Some(Instant::now() + ACCEPT_PAUSE);
                    return new;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    warn!("{:?}: accept: {e}", self.listen_token);
                    return new;
                }
            }
        }
    }

    /// Reads what client `id` sent; returns a whole request to answer (with `reply`).
    pub fn read(&mut self, id: u32, parse: impl Fn(&[u8]) -> Parsed) -> Option<Result<Vec<u8>, String>> {
        let max = self.max_request;
        let c = self.clients.get_mut(&id)?;
        if c.out.is_some() {
            self.flush(id);
            return None;
        }
        let mut chunk = [0u8; 4096];
        loop {
            match c.stream.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    c.buf.extend_from_slice(&chunk[..n]);
                    if c.buf.len() > max {
                        return Some(Err(format!("request larger than {max} bytes")));
                    }
                    match parse(&c.buf) {
                        Parsed::Pending => {}
                        Parsed::Request(r) => return Some(Ok(r)),
                        Parsed::Refuse(e) => return Some(Err(e)),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.drop_client(id);
        None
    }

    /// Sends `reply` to client `id` (as the socket takes it) and closes the connection once it
    /// is all sent.
    pub fn reply(&mut self, id: u32, reply: Vec<u8>) {
        let Some(c) = self.clients.get_mut(&id) else { return };
        c.out = Some((reply, 0));
        c.since = Instant::now();
        let fd = c.stream.as_raw_fd();
        if self.flush(id) {
            rewatch(&self.epoll, fd, (self.client_token)(id), true);
        }
    }

    /// Writes what the socket takes of client `id`'s reply; true if some is left.
    fn flush(&mut self, id: u32) -> bool {
        let Some(c) = self.clients.get_mut(&id) else { return false };
        let Some((out, at)) = c.out.as_mut() else { return false };
        while *at < out.len() {
            match c.stream.write(&out[*at..]) {
                Ok(0) => break,
                Ok(n) => *at += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.drop_client(id);
        false
    }

    /// Takes client `id`'s connection out of the server (a capture's stream, served by a
    /// thread of its own from here on), blocking again.
    pub fn detach(&mut self, id: u32) -> Option<L::Stream> {
        let c = self.clients.remove(&id)?;
        unwatch(&self.epoll, c.stream.as_raw_fd());
        Some(c.stream)
    }

    fn drop_client(&mut self, id: u32) {
        if let Some(c) = self.clients.remove(&id) {
            unwatch(&self.epoll, c.stream.as_raw_fd());
        }
    }

    /// The next moment something is due: a client's idle timeout, the end of a pause.
    pub fn next_due(&self) -> Option<Instant> {
        self.clients.values().map(|c| c.since + IDLE_TIMEOUT).chain(self.paused_until).min()
    }

    /// Drops clients idle too long; resumes accepting after a pause.
    pub fn expire(&mut self) {
        let now = Instant::now();
        let idle: Vec<u32> =
            self.clients.iter().filter(|(_, c)| c.since + IDLE_TIMEOUT <= now).map(|(&id, _)| id).collect();
        for id in idle {
            self.drop_client(id);
        }
        if self.paused_until.is_some_and(|t| t <= now) {
            self.paused_until = None;
            watch(&self.epoll, self.listener.as_raw_fd(), self.listen_token);
        }
    }

    pub fn clients(&self) -> usize {
        self.clients.len()
    }
}
