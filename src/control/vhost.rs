//! The OS side of vhost-user ports: listening sockets (server mode), connections, and the
//! reconnect timers of client-mode ports. Each connection's requests are answered by its own
//! `PortBackend` (`port::vhost`); what they change is reported to the switch model.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use log::{info, warn};
use vhost::vhost_user::{BackendReqHandler, Listener};
use vmm_sys_util::epoll::Epoll;

use super::os::{Token, unwatch, watch};
use crate::config::SocketMode;
use crate::port::vhost::{PortBackend, VHOST_USER_F_PROTOCOL_FEATURES};
use crate::switch::{Endpoints, PortState, Switch};

const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);
/// A frontend that starts a message and stalls is cut off after this.
const VHOST_MSG_TIMEOUT: Duration = Duration::from_secs(2);

struct Conn {
    handler: BackendReqHandler<Mutex<PortBackend>>,
    backend: Arc<Mutex<PortBackend>>,
}

/// One vhost-user port's socket side.
struct PortIo {
    /// Server mode: the listening socket.
    listener: Option<Listener>,
    conn: Option<Conn>,
    /// Client mode: when to connect next.
    retry_at: Option<Instant>,
    backoff: Duration,
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
        let mut io = PortIo { listener: None, conn: None, retry_at: None, backoff: RECONNECT_MIN };
        match v.mode {
            SocketMode::Server => {
                if let Some(dir) = v.socket.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                let l = Listener::new(&v.socket, true).map_err(|e| {
                    std::io::Error::other(format!("port {}: socket {}: {e}", ps.name(), v.socket.display()))
                })?;
                l.set_nonblocking(true).map_err(|e| std::io::Error::other(e.to_string()))?;
                watch(&self.epoll, l.as_raw_fd(), Token::PortListen(id as u32));
                info!("port {}: listening on {}", ps.name(), v.socket.display());
                io.listener = Some(l);
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

    fn close(&mut self, id: u16) {
        let Some(io) = self.ports.get_mut(id as usize).and_then(|p| p.take()) else { return };
        if let Some(conn) = io.conn {
            unwatch(&self.epoll, conn.handler.as_raw_fd());
            conn.backend.lock().unwrap().stop_all();
        }
        if let Some(l) = &io.listener {
            unwatch(&self.epoll, l.as_raw_fd());
        }
    }
}

/// QEMU (10.0) and DPDK's virtio-user (on reconnect) send SET_VRING_ENABLE before
/// SET_FEATURES has acked VHOST_USER_F_PROTOCOL_FEATURES; the `vhost` crate rejects that and
/// drops the connection. We take that one message off the socket ourselves (it carries no
/// fds) and record the ring's enable state, as DPDK's and QEMU's own backends do.
fn early_vring_enable(conn: &mut Conn) -> Option<vhost::vhost_user::Result<()>> {
    const SET_VRING_ENABLE: u32 = 18;
    const NEED_REPLY: u32 = 0x8;
    let fd = conn.handler.as_raw_fd();
    let mut msg = [0u8; 20];
    // SAFETY: peeking into a local buffer of the given length.
    let n = unsafe { libc::recv(fd, msg.as_mut_ptr() as *mut libc::c_void, 20, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    fn word(m: &[u8; 20], i: usize) -> u32 {
        u32::from_le_bytes(m[i..i + 4].try_into().unwrap())
    }
    if n != 20 || word(&msg, 0) != SET_VRING_ENABLE || word(&msg, 8) != 8 {
        return None;
    }
    let mut backend = conn.backend.lock().unwrap();
    if backend.features() & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
        return None; // the crate handles it
    }
    // SAFETY: consuming the 20 bytes we just peeked, into the same local buffer.
    let n = unsafe { libc::recv(fd, msg.as_mut_ptr() as *mut libc::c_void, 20, libc::MSG_DONTWAIT) };
    if n != 20 {
        return Some(Err(vhost::vhost_user::Error::PartialMessage));
    }
    let (flags, index, num) = (word(&msg, 4), word(&msg, 12), word(&msg, 16));
    use vhost::vhost_user::VhostUserBackendReqHandlerMut;
    let res =
        if num > 1 { Err(vhost::vhost_user::Error::InvalidParam) } else { backend.set_vring_enable(index, num == 1) };
    if flags & NEED_REPLY != 0 {
        let mut reply = [0u8; 20];
        reply[0..4].copy_from_slice(&SET_VRING_ENABLE.to_le_bytes());
        reply[4..8].copy_from_slice(&(0x1u32 | 0x4).to_le_bytes()); // version 1, reply
        reply[8..12].copy_from_slice(&8u32.to_le_bytes());
        reply[12..20].copy_from_slice(&(res.is_err() as u64).to_le_bytes());
        // SAFETY: sending a local buffer on the connection's socket.
        unsafe { libc::send(fd, reply.as_ptr() as *const libc::c_void, 20, libc::MSG_NOSIGNAL) };
    }
    Some(res)
}

impl VhostIo {
    pub fn new(epoll: Rc<Epoll>) -> VhostIo {
        VhostIo { epoll, ports: Vec::new() }
    }

    fn io(&mut self, i: usize) -> Option<&mut PortIo> {
        self.ports.get_mut(i).and_then(|p| p.as_mut())
    }

    /// Connects client-mode ports whose retry time has come; returns the epoll timeout (ms,
    /// -1 for none).
    pub fn reconnect_due(&mut self, sw: &mut Switch) -> i32 {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for i in 0..self.ports.len() {
            let Some(at) = self.io(i).and_then(|p| p.retry_at) else { continue };
            if at <= now {
                self.connect(i, sw);
            }
            if let Some(at) = self.io(i).and_then(|p| p.retry_at) {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        match next {
            None => -1,
            Some(t) => t.saturating_duration_since(Instant::now()).as_millis().min(i32::MAX as u128) as i32,
        }
    }

    fn connect(&mut self, i: usize, sw: &mut Switch) {
        let Some(ps) = sw.port_mut(i) else { return };
        let Some(v) = ps.cfg.vhost_user() else { return };
        let path = v.socket.clone();
        let Some(io) = self.io(i) else { return };
        match UnixStream::connect(&path) {
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
        let Some(io) = self.io(i) else { return };
        let Some(l) = &io.listener else { return };
        loop {
            match l.accept() {
                Ok(Some(s)) => {
                    if io.conn.is_some() {
                        warn!("port {}: refusing a second frontend connection", sw.port_name(i as u16));
                        drop(s);
                        continue;
                    }
                    self.attach(i, s, sw);
                    return;
                }
                Ok(None) => return,
                Err(e) => {
                    warn!("port {}: accept: {e}", sw.port_name(i as u16));
                    return;
                }
            }
        }
    }

    fn attach(&mut self, i: usize, s: UnixStream, sw: &mut Switch) {
        let Some(ps) = sw.port(i) else { return };
        let _ = s.set_read_timeout(Some(VHOST_MSG_TIMEOUT));
        let _ = s.set_write_timeout(Some(VHOST_MSG_TIMEOUT));
        let backend = Arc::new(Mutex::new(PortBackend::new(ps.port.clone())));
        let handler = BackendReqHandler::from_stream(s, backend.clone());
        watch(&self.epoll, handler.as_raw_fd(), Token::PortConn(i as u32));
        info!("port {}: frontend connected", ps.name());
        let status = backend.lock().unwrap().status();
        if let Some(io) = self.io(i) {
            io.conn = Some(Conn { handler, backend });
        }
        sw.connected(i as u16, status);
    }

    /// Answers one request of port `i`'s frontend.
    pub fn serve(&mut self, i: usize, sw: &mut Switch) {
        let Some(conn) = self.io(i).and_then(|io| io.conn.as_mut()) else { return };
        let res = match early_vring_enable(conn) {
            Some(r) => r,
            None => conn.handler.handle_request(),
        };
        // A ring of this port may have started or stopped: the switch wakes the poll threads
        // that own its queues, in case they sleep and must watch a new kick fd.
        let status = conn.backend.lock().unwrap().status();
        sw.link_changed(i as u16, status);
        if let Err(e) = res {
            let msg = match e {
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage => {
                    "frontend disconnected".to_string()
                }
                vhost::vhost_user::Error::ReqHandlerError(e) => format!("request refused, connection closed: {e}"),
                e => format!("closing connection: {e}"),
            };
            info!("port {}: {msg}", sw.port_name(i as u16));
            self.detach(i, sw, msg);
        }
    }

    /// Drops port `i`'s connection: its rings stop (under their locks, so no poll thread
    /// touches the guest's memory afterwards), the switch forgets its MACs, a client-mode port
    /// reconnects.
    pub fn detach(&mut self, i: usize, sw: &mut Switch, why: String) {
        let epoll = self.epoll.clone();
        let Some(io) = self.io(i) else { return };
        if let Some(conn) = io.conn.take() {
            unwatch(&epoll, conn.handler.as_raw_fd());
            conn.backend.lock().unwrap().stop_all();
        }
        if io.listener.is_none() {
            io.retry_at = Some(Instant::now() + io.backoff);
        }
        sw.disconnected(i as u16, why);
    }

    /// A guest's memory faulted at `addr` (its file shrank): disconnects the port it belongs to.
    pub fn memory_fault(&mut self, addr: usize, faults: u64, sw: &mut Switch) {
        for i in 0..self.ports.len() {
            let hit = self
                .io(i)
                .and_then(|io| io.conn.as_ref())
                .is_some_and(|c| c.backend.lock().unwrap().mem_contains(addr));
            if hit {
                let msg = format!(
                    "guest memory fault at {addr:#x} (the frontend shrank the file behind its memory); disconnected"
                );
                log::error!("port {}: {msg} ({faults} faults so far)", sw.port_name(i as u16));
                self.detach(i, sw, msg);
            }
        }
    }

    /// Stops every connection's rings (shutdown).
    pub fn close_all(&mut self) {
        for i in 0..self.ports.len() {
            self.close(i as u16);
        }
    }
}
