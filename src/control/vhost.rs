//! The OS side of vhost-user ports: listening sockets (server mode), non-blocking connects with
//! backoff (client mode), and each connection's framing. pvswitchd reads a connection's bytes
//! and file descriptors as epoll reports them, into that connection's buffer, until one whole
//! message (header, payload, its fds) is there; only then does the port's `PortBackend` see it.
//! Replies go out through a bounded buffer as the socket takes them. Nothing a frontend sends,
//! or fails to send or to read, can make the control thread wait: a message that does not
//! complete within `MSG_DEADLINE`, an impossible size, more fds than the request takes, or
//! replies that pile up unread close that connection only.
#![forbid(unsafe_code)]

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::time::{Duration, Instant};

use log::{info, warn};
use vmm_sys_util::epoll::Epoll;

use super::clients::ACCEPT_PAUSE;
use super::os::{Token, recv_with_fds, rewatch, unwatch, watch};
use super::sockpath::{self, OwnedSocket};
use crate::config::SocketMode;
use crate::port::vhost::PortBackend;
use crate::port::vhost::msg::{HEADER_LEN, Header, MAX_FDS};
use crate::switch::{Endpoints, PortState, Switch};

const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);
/// A message whose first byte arrived must be whole within this.
pub const MSG_DEADLINE: Duration = Duration::from_secs(1);
/// Replies waiting for the frontend to read them: at most this many bytes...
pub const OUT_MAX: usize = 64 * 1024;
/// ... and for at most this long.
pub const OUT_DEADLINE: Duration = Duration::from_secs(5);
/// Messages handled per readiness event of one connection before the others get their turn.
const MSGS_PER_EVENT: usize = 64;

/// The message being read from a connection.
#[derive(Default)]
struct Framer {
    hdr: [u8; HEADER_LEN],
    got: usize,
    header: Option<Header>,
    payload: Vec<u8>,
    fds: Vec<File>,
    /// When its first byte arrived.
    since: Option<Instant>,
}

/// One frontend connection.
struct Conn {
    sock: UnixStream,
    backend: PortBackend,
    rd: Framer,
    /// Reply bytes the socket has not taken yet.
    out: Vec<u8>,
    /// Since when `out` has been waiting.
    out_since: Option<Instant>,
}

/// What reading a connection came to.
enum Read {
    /// Everything available was handled (`changed`: some message was).
    Idle { changed: bool },
    /// The connection must close, for this reason.
    Close(String),
}

impl Conn {
    fn new(sock: UnixStream, backend: PortBackend) -> Conn {
        Conn { sock, backend, rd: Framer::default(), out: Vec::new(), out_since: None }
    }

    /// Reads what the socket has and handles every whole message, up to `MSGS_PER_EVENT`.
    /// Long because a message's life is one sequence (read with its fds, frame, check, apply,
    /// reply, account) whose early exits each close the connection differently.
    fn read(&mut self) -> Read {
        let mut handled = 0;
        while handled < MSGS_PER_EVENT {
            let rd = &mut self.rd;
            let buf: &mut [u8] = match rd.header {
                None => &mut rd.hdr[rd.got..],
                Some(h) => {
                    let at = rd.payload.len();
                    rd.payload.resize(h.size as usize, 0);
                    &mut rd.payload[at..]
                }
            };
            let before = buf.len();
            // The fds of one message are counted across every read that assembles it: a
            // read may take only what the message has left of its MAX_FDS. More than that
            // is truncated control data (MSG_CTRUNC: the kernel closed those it could not
            // deliver, recv_with_fds closes the rest), which closes the connection.
            let room = MAX_FDS.saturating_sub(rd.fds.len());
            let mut fds = std::mem::take(&mut rd.fds);
            let r = recv_with_fds(&self.sock, buf, room, &mut fds);
            rd.fds = fds;
            let n = match r {
                Ok(0) if rd.since.is_some() => return Read::Close("frontend closed in the middle of a message".into()),
                Ok(0) => return Read::Close("frontend disconnected".into()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if let Some(h) = rd.header {
                        rd.payload.truncate(h.size as usize - before);
                    }
                    return Read::Idle { changed: handled > 0 };
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    return Read::Close(format!("a message carried more than {MAX_FDS} file descriptors"));
                }
                Err(e) => return Read::Close(format!("reading the socket: {e}")),
            };
            if rd.fds.len() > MAX_FDS {
                return Read::Close(format!("a message carried more than {MAX_FDS} file descriptors"));
            }
            rd.since.get_or_insert_with(Instant::now);
            match rd.header {
                None => {
                    rd.got += n;
                    if rd.got < HEADER_LEN {
                        continue;
                    }
                    let h = Header::parse(&rd.hdr);
                    if let Err(e) = h.check() {
                        return Read::Close(e.to_string());
                    }
                    rd.header = Some(h);
                    rd.payload.clear();
                    if h.size > 0 {
                        continue;
                    }
                }
                Some(h) => {
                    rd.payload.truncate(h.size as usize - before + n);
                    if rd.payload.len() < h.size as usize {
                        continue;
                    }
                }
            }
            // One whole message.
            let h = rd.header.take().expect("a header");
            let fds = std::mem::take(&mut rd.fds);
            let payload = std::mem::take(&mut rd.payload);
            *rd = Framer { payload: Vec::with_capacity(payload.capacity()), ..Framer::default() };
            handled += 1;
            match self.backend.handle(&h, &payload, fds) {
                Ok(None) => {}
                Ok(Some(reply)) => {
                    if let Err(e) = self.send(&reply) {
                        return Read::Close(e);
                    }
                }
                Err((why, reply)) => {
                    if let Some(r) = reply {
                        let _ = self.send(&r);
                    }
                    return Read::Close(format!("request refused, connection closed: {why}"));
                }
            }
        }
        Read::Idle { changed: true }
    }

    /// Queues a reply and sends what the socket takes. Err if replies pile up unread.
    fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.out.extend_from_slice(bytes);
        self.flush()?;
        if self.out.len() > OUT_MAX {
            return Err(format!("frontend leaves its replies unread ({} bytes waiting)", self.out.len()));
        }
        Ok(())
    }

    /// Writes waiting replies as far as the socket takes them.
    fn flush(&mut self) -> Result<(), String> {
        while !self.out.is_empty() {
            match self.sock.write(&self.out) {
                Ok(0) => return Err("frontend disconnected".into()),
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("writing the socket: {e}")),
            }
        }
        self.out_since = if self.out.is_empty() { None } else { Some(self.out_since.unwrap_or_else(Instant::now)) };
        Ok(())
    }

    /// When this connection must have made progress, or be closed.
    fn deadline(&self) -> Option<Instant> {
        let msg = self.rd.since.map(|t| t + MSG_DEADLINE);
        let out = self.out_since.map(|t| t + OUT_DEADLINE);
        msg.into_iter().chain(out).min()
    }
}

/// One vhost-user port's socket side.
struct PortIo {
    /// Server mode: the listening socket, and its file (removed when the port closes, if the
    /// path still holds it).
    listener: Option<(std::os::unix::net::UnixListener, OwnedSocket)>,
    conn: Option<Conn>,
    /// Client mode: when to connect next.
    retry_at: Option<Instant>,
    backoff: Duration,
    /// Server mode: accepting paused until then (the process ran out of file descriptors).
    paused_until: Option<Instant>,
}

impl Drop for PortIo {
    fn drop(&mut self) {
        if let Some((_, sock)) = &self.listener {
            sock.remove();
        }
    }
}

/// Every vhost-user port's sockets, by port id.
pub struct VhostIo {
    epoll: Rc<Epoll>,
    ports: Vec<Option<PortIo>>,
}

impl Endpoints for VhostIo {
    fn open(&mut self, ps: &PortState) -> std::io::Result<()> {
        let Some(v) = ps.cfg.vhost_user() else { return Ok(()) };
        let id = ps.id();
        let mut io = PortIo { listener: None, conn: None, retry_at: None, backoff: RECONNECT_MIN, paused_until: None };
        match v.mode {
            SocketMode::Server => {
                let (l, sock) = sockpath::bind(&v.socket, v.socket_perms.mode, v.socket_perms.gid).map_err(|e| {
                    std::io::Error::other(format!("port {}: socket {}: {e}", ps.name(), v.socket.display()))
                })?;
                watch(&self.epoll, l.as_raw_fd(), Token::PortListen(id as u32));
                info!("port {}: listening on {}", ps.name(), v.socket.display());
                io.listener = Some((l, sock));
            }
            SocketMode::Client => io.retry_at = Some(Instant::now()),
        }
        let i = id as usize;
        if self.ports.len() <= i {
            self.ports.resize_with(i + 1, || None);
        }
        self.ports[i] = Some(io);
        Ok(())
    }

    fn update(&mut self, ps: &PortState) -> std::io::Result<()> {
        let (Some(v), Some(io)) = (ps.cfg.vhost_user(), self.ports.get(ps.id() as usize).and_then(|p| p.as_ref()))
        else {
            return Ok(());
        };
        match &io.listener {
            Some((_, sock)) => sock
                .set_perms(v.socket_perms.mode, v.socket_perms.gid)
                .map_err(|e| std::io::Error::other(format!("port {}: socket {}: {e}", ps.name(), v.socket.display()))),
            None => Ok(()),
        }
    }

    fn close(&mut self, id: u16) {
        let Some(mut io) = self.ports.get_mut(id as usize).and_then(|p| p.take()) else { return };
        if let Some(mut conn) = io.conn.take() {
            unwatch(&self.epoll, conn.sock.as_raw_fd());
            conn.backend.stop_all();
        }
        if let Some((l, _)) = &io.listener {
            unwatch(&self.epoll, l.as_raw_fd());
        }
    }
}

impl VhostIo {
    pub fn new(epoll: Rc<Epoll>) -> VhostIo {
        VhostIo { epoll, ports: Vec::new() }
    }

    fn io(&mut self, i: usize) -> Option<&mut PortIo> {
        self.ports.get_mut(i).and_then(|p| p.as_mut())
    }

    /// Connects client-mode ports whose retry time has come.
    pub fn reconnect_due(&mut self, sw: &mut Switch) {
        let now = Instant::now();
        for i in 0..self.ports.len() {
            if self.io(i).and_then(|p| p.retry_at).is_some_and(|at| at <= now) {
                self.connect(i, sw);
            }
        }
    }

    /// The next moment something is due: a reconnect, or a connection's deadline.
    pub fn next_due(&self) -> Option<Instant> {
        self.ports
            .iter()
            .flatten()
            .flat_map(|p| {
                let conn = p.conn.as_ref().and_then(|c| c.deadline());
                p.retry_at.into_iter().chain(conn).chain(p.paused_until)
            })
            .min()
    }

    /// Closes connections that missed a deadline (a message left unfinished, replies unread);
    /// resumes accepting on listeners paused for lack of file descriptors.
    pub fn expire(&mut self, sw: &mut Switch) {
        let now = Instant::now();
        let epoll = self.epoll.clone();
        for (i, io) in self.ports.iter_mut().enumerate() {
            let Some(io) = io.as_mut() else { continue };
            if let (Some(t), Some((l, _))) = (io.paused_until, &io.listener)
                && t <= now
            {
                io.paused_until = None;
                watch(&epoll, l.as_raw_fd(), Token::PortListen(i as u32));
            }
        }
        for i in 0..self.ports.len() {
            let Some(c) = self.io(i).and_then(|p| p.conn.as_ref()) else { continue };
            if c.deadline().is_some_and(|d| d <= now) {
                let why = if c.rd.since.is_some_and(|t| t + MSG_DEADLINE <= now) {
                    format!("frontend left a message unfinished for {MSG_DEADLINE:?}; connection closed")
                } else {
                    format!("frontend left its replies unread for {OUT_DEADLINE:?}; connection closed")
                };
                port_log(sw, i, log::Level::Warn, &why);
                self.detach(i, sw, why);
            }
        }
    }

    fn connect(&mut self, i: usize, sw: &mut Switch) {
        let Some(ps) = sw.port_mut(i) else { return };
        let Some(v) = ps.cfg.vhost_user() else { return };
        let path = v.socket.clone();
        let Some(io) = self.io(i) else { return };
        match sockpath::connect(&path) {
            Ok(s) => {
                io.retry_at = None;
                io.backoff = RECONNECT_MIN;
                self.attach(i, s, sw);
            }
            Err(e) => {
                let msg = format!("connect {}: {e}", path.display());
                if ps.last_error.as_deref() != Some(&msg) {
                    info!("port {}: {msg}; retrying with backoff", ps.name());
                }
                ps.last_error = Some(msg);
                io.retry_at = Some(Instant::now() + io.backoff);
                io.backoff = (io.backoff * 2).min(RECONNECT_MAX);
            }
        }
    }

    pub fn accept(&mut self, i: usize, sw: &mut Switch) {
        loop {
            let Some((l, _)) = self.io(i).and_then(|io| io.listener.as_ref()) else { return };
            let s = match l.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    // Level-triggered: accepting again at once would spin. Pause this listener.
                    warn!(
                        "port {}: out of file descriptors ({e}); not accepting for {ACCEPT_PAUSE:?}",
                        sw.port_name(i as u16)
                    );
                    let fd = l.as_raw_fd();
                    unwatch(&self.epoll, fd);
                    if let Some(io) = self.io(i) {
                        io.paused_until = Some(Instant::now() + ACCEPT_PAUSE);
                    }
                    return;
                }
                Err(e) => {
                    warn!("port {}: accept: {e}", sw.port_name(i as u16));
                    return;
                }
            };
            // The frontend may have closed and connected again before we read its hangup:
            // the old connection is gone first, so the new one is not refused as a second.
            if self.io(i).and_then(|io| io.conn.as_ref()).is_some_and(|c| super::os::peer_closed(&c.sock)) {
                self.detach(i, sw, "frontend disconnected".into());
            }
            if self.io(i).is_some_and(|io| io.conn.is_some()) {
                port_log(sw, i, log::Level::Warn, "refusing a second frontend connection");
                continue;
            }
            self.attach(i, s, sw);
        }
    }

    fn attach(&mut self, i: usize, s: UnixStream, sw: &mut Switch) {
        let Some(ps) = sw.port(i) else { return };
        if let Err(e) = s.set_nonblocking(true) {
            warn!("port {}: {e}", ps.name());
            return;
        }
        let mut backend = PortBackend::new(ps.port.clone());
        backend.set_offloads(ps.cfg.vhost_user().is_some_and(|v| v.offloads));
        watch(&self.epoll, s.as_raw_fd(), Token::PortConn(i as u32));
        port_log(sw, i, log::Level::Info, "frontend connected");
        let status = backend.status();
        if let Some(io) = self.io(i) {
            io.conn = Some(Conn::new(s, backend));
        }
        sw.connected(i as u16, status);
    }

    /// Port `i`'s connection is readable or writable: reads and answers whole messages, sends
    /// waiting replies.
    pub fn serve(&mut self, i: usize, sw: &mut Switch) {
        let epoll = self.epoll.clone();
        let limits = sw.port(i).map(|ps| ps.cfg.mem_limits);
        let Some(conn) = self.io(i).and_then(|io| io.conn.as_mut()) else { return };
        // A reload's new limits apply from the next memory table on.
        if let Some(l) = limits {
            conn.backend.set_limits(l);
        }
        let was_waiting = !conn.out.is_empty();
        let mut close = conn.flush().err();
        if close.is_none() {
            match conn.read() {
                Read::Idle { changed } => {
                    if changed {
                        // A ring of this port may have started or stopped: the switch wakes the
                        // poll threads that own its queues, in case they sleep and must watch a
                        // new kick fd.
                        sw.link_changed(i as u16, conn.backend.status());
                    }
                }
                Read::Close(why) => close = Some(why),
            }
        }
        if let Some(why) = close {
            port_log(sw, i, log::Level::Info, &why);
            self.detach(i, sw, why);
            return;
        }
        let waiting = !conn.out.is_empty();
        if waiting != was_waiting {
            rewatch(&epoll, conn.sock.as_raw_fd(), Token::PortConn(i as u32), waiting);
        }
    }

    /// Drops port `i`'s connection: its rings stop (under their locks, so no poll thread
    /// touches the guest's memory afterwards), the switch forgets its MACs, a client-mode port
    /// reconnects.
    pub fn detach(&mut self, i: usize, sw: &mut Switch, why: String) {
        let epoll = self.epoll.clone();
        let Some(io) = self.io(i) else { return };
        let mut served = false;
        if let Some(mut conn) = io.conn.take() {
            unwatch(&epoll, conn.sock.as_raw_fd());
            // A frontend that set up its rings did real work: its VMM is likely restarting,
            // so a client-mode port reconnects at once; one that never got that far (a VMM
            // that accepts and drops us) waits out the backoff.
            served = conn.backend.status().vrings.iter().any(|v| v.running || v.size > 0);
            conn.backend.stop_all();
        }
        if io.listener.is_none() {
            if served {
                io.backoff = RECONNECT_MIN;
            }
            io.retry_at = Some(Instant::now() + if served { Duration::ZERO } else { io.backoff });
            if !served {
                io.backoff = (io.backoff * 2).min(RECONNECT_MAX);
            }
        }
        sw.disconnected(i as u16, why);
    }

    /// A guest's memory or dirty log faulted at `addr` (its file shrank): disconnects the port
    /// it belongs to.
    pub fn memory_fault(&mut self, addr: usize, faults: u64, sw: &mut Switch) {
        for i in 0..self.ports.len() {
            if self.io(i).and_then(|io| io.conn.as_ref()).is_some_and(|c| c.backend.mem_contains(addr)) {
                let msg = format!(
                    "guest memory fault at {addr:#x} (the frontend shrank the file behind its memory or its dirty log); disconnected"
                );
                port_log(sw, i, log::Level::Error, &format!("{msg} ({faults} faults so far)"));
                self.detach(i, sw, msg);
            }
        }
    }

    /// Stops every connection's rings and closes every socket (shutdown).
    pub fn close_all(&mut self) {
        for i in 0..self.ports.len() {
            self.close(i as u16);
        }
    }
}

/// Logs `msg` about port `i`, a line its frontend caused: within the port's log budget, so a
/// frontend that reconnects or fails in a loop cannot write the log at its own rate
/// (`port::limit`).
fn port_log(sw: &Switch, i: usize, level: log::Level, msg: &str) {
    if let Some(ps) = sw.port(i)
        && let Some(n) = ps.port.limits.log.admit()
    {
        log::log!(level, "port {}: {msg}{}", ps.name(), crate::port::limit::suppressed_note(n));
    }
}
