//! The control thread: one epoll loop serves every vhost-user socket (listening and connected,
//! server and client mode), the control socket, and signals. Its cost does not grow in
//! threads with the number of ports.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use log::{info, warn};
use vhost::vhost_user::{BackendReqHandler, Listener};

use crate::config::{Config, PortConfig, SocketMode};
use crate::ctl;
use crate::datapath::counters::RxqStats;
use crate::datapath::counters::ThreadStats;
use crate::datapath::mac_table::MacTable;
use crate::datapath::plan::Mailbox;
use crate::flow::table::FlowTable;
use crate::port::Port;
use crate::port::vhost::PortBackend;

pub(crate) const TOK_PORT_LISTEN: u64 = 1;
const TOK_PORT_CONN: u64 = 2;
const TOK_CTL_LISTEN: u64 = 3;
const TOK_CTL_CLIENT: u64 = 4;
const TOK_SIGNAL: u64 = 5;
const TOK_MEM_FAULT: u64 = 6;
const TOK_METRICS_LISTEN: u64 = 7;
const TOK_METRICS_CLIENT: u64 = 8;

/// Largest control request accepted.
pub const MAX_CTL_REQUEST: usize = 64 * 1024;
pub(crate) const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);
/// A frontend that starts a message and stalls is cut off after this.
const VHOST_MSG_TIMEOUT: Duration = Duration::from_secs(2);

pub struct Conn {
    handler: BackendReqHandler<Mutex<PortBackend>>,
    pub backend: Arc<Mutex<PortBackend>>,
    pub since: Instant,
}

/// Everything the control plane knows about one port.
pub struct PortCtl {
    pub port: Arc<Port>,
    /// The port's configuration as last applied (MTU, weights and port security change in place).
    pub cfg: PortConfig,
    pub(crate) listener: Option<Listener>,
    pub conn: Option<Conn>,
    pub(crate) retry_at: Option<Instant>,
    pub(crate) backoff: Duration,
    pub connects: u64,
    pub last_error: Option<String>,
}

impl PortCtl {
    /// The NUMA node of the guest memory holding the port's rings (None until connected).
    pub fn numa_node(&self) -> Option<usize> {
        if let Some(n) = &self.port.nic {
            return n.socket_id().map(|s| s as usize);
        }
        self.conn.as_ref().and_then(|c| c.backend.lock().unwrap().numa_node())
    }

    pub fn state(&self) -> &'static str {
        match (&self.conn, self.port.cfg.mode) {
            _ if self.port.is_dpdk() => {
                if self.port.nic.is_some() {
                    "running"
                } else {
                    "failed"
                }
            }
            (Some(_), _) => "connected",
            (None, SocketMode::Server) => "listening",
            (None, SocketMode::Client) => "connecting",
        }
    }
}

struct CtlClient {
    stream: UnixStream,
    buf: Vec<u8>,
}

pub struct Control {
    pub(crate) epoll: RawFd,
    pub cfg: Config,
    /// Where `cfg` came from, re-read by reload.
    pub config_path: Option<PathBuf>,
    /// Ports by id; a removed port's slot is empty until a new port reuses it.
    pub ports: Vec<Option<PortCtl>>,
    /// Poll thread slots, by index (a retired thread's slot stays, so indices never shift).
    pub threads: Vec<Arc<ThreadStats>>,
    pub mailboxes: Vec<Arc<Mailbox>>,
    /// Whether slot i's thread runs (false once a reload removed its core).
    pub live: Vec<bool>,
    pub handles: Vec<Option<std::thread::JoinHandle<()>>>,
    /// Starts a poll thread (set by pvswitchd's main).
    pub spawner: Option<crate::datapath::plan::Spawner>,
    /// Each poll thread's receive queues as (port id, queue pair).
    pub thread_queues: Vec<Vec<(u16, usize)>>,
    pub flows: Arc<FlowTable>,
    /// Counters of every receive queue, by (port id, queue pair); they follow the queue.
    pub rxq_stats: HashMap<(u16, usize), Arc<RxqStats>>,
    /// Once-a-second samples for rates, and the baseline `stats --clear` set.
    pub samples: crate::ctl_stats::Samples,
    /// When queues were last rebalanced automatically (or the switch started).
    pub last_rebalance: Instant,
    pub mac: Arc<MacTable>,
    ctl_listener: UnixListener,
    clients: HashMap<u64, CtlClient>,
    next_client: u64,
    signal_fd: RawFd,
    metrics: Option<crate::metrics_http::MetricsServer>,
    /// Written by the SIGBUS handler when a guest's memory file shrank under us.
    fault_fd: RawFd,
    pub started: Instant,
}

pub(crate) fn epoll_add(epoll: RawFd, fd: RawFd, token: u64) {
    let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: token };
    // SAFETY: valid epoll fd and event struct; a failure is reported below.
    let r = unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, fd, &mut ev) };
    if r != 0 {
        warn!("epoll_ctl add fd {fd}: {}", std::io::Error::last_os_error());
    }
}

pub(crate) fn epoll_del(epoll: RawFd, fd: RawFd) {
    // SAFETY: removing an fd from our epoll set; errors are harmless (already gone).
    unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
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
    if backend.features() & crate::port::vhost::VHOST_USER_F_PROTOCOL_FEATURES != 0 {
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

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread (and threads it spawns later) and returns
/// a signalfd that reports them.
pub fn block_signals() -> std::io::Result<RawFd> {
    // SAFETY: plain libc signal-set manipulation on a local sigset_t.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 { Err(std::io::Error::last_os_error()) } else { Ok(fd) }
    }
}

impl Control {
    /// Opens the control socket and every configured port. Poll threads are started by the
    /// caller with `plans()`.
    pub fn new(
        cfg: Config,
        config_path: Option<PathBuf>,
        threads: Vec<Arc<ThreadStats>>,
        mac: Arc<MacTable>,
        signal_fd: RawFd,
    ) -> std::io::Result<Control> {
        // SAFETY: creating an epoll instance; checked below.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if let Some(dir) = cfg.control_socket.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(&cfg.control_socket);
        let ctl_listener = UnixListener::bind(&cfg.control_socket).map_err(|e| {
            std::io::Error::new(e.kind(), format!("control socket {}: {e}", cfg.control_socket.display()))
        })?;
        std::fs::set_permissions(&cfg.control_socket, std::fs::Permissions::from_mode(cfg.control_socket_mode))?;
        ctl_listener.set_nonblocking(true)?;
        epoll_add(epoll, ctl_listener.as_raw_fd(), TOK_CTL_LISTEN << 32);
        epoll_add(epoll, signal_fd, TOK_SIGNAL << 32);
        // SAFETY: creating an eventfd; checked below.
        let fault_fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fault_fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        crate::mem::fault::install(fault_fd)?;
        epoll_add(epoll, fault_fd, TOK_MEM_FAULT << 32);
        let metrics = match cfg.metrics_listen {
            Some(addr) => {
                let m = crate::metrics_http::MetricsServer::bind(addr)?;
                epoll_add(epoll, m.listener.as_raw_fd(), TOK_METRICS_LISTEN << 32);
                info!("metrics: http://{addr}/metrics");
                Some(m)
            }
            None => None,
        };
        let nthreads = threads.len();
        let ids = |name: &str| cfg.ports.iter().position(|p| p.name == name).map(|i| i as u16);
        let flows = FlowTable::build(&cfg, &ids, nthreads, None).map_err(std::io::Error::other)?;
        let flows = Arc::new(flows);
        let mut c = Control {
            epoll,
            cfg,
            config_path,
            ports: Vec::new(),
            threads,
            mailboxes: (0..nthreads).map(|_| Arc::new(Mailbox::default())).collect(),
            live: vec![true; nthreads],
            handles: Vec::new(),
            spawner: None,
            thread_queues: vec![Vec::new(); nthreads],
            flows,
            rxq_stats: HashMap::new(),
            samples: Default::default(),
            last_rebalance: Instant::now(),
            mac,
            ctl_listener,
            clients: HashMap::new(),
            next_client: 0,
            signal_fd,
            metrics,
            fault_fd,
            started: Instant::now(),
        };
        for (id, p) in c.cfg.ports.clone().into_iter().enumerate() {
            c.open_port(id as u16, p)?;
        }
        Ok(c)
    }

    /// The port with id `i`, if there is one.
    pub fn port(&self, i: usize) -> Option<&PortCtl> {
        self.ports.get(i).and_then(|p| p.as_ref())
    }

    /// Runs until SIGINT or SIGTERM.
    pub fn run(&mut self) {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
        loop {
            let timeout = self.reconnect_due();
            let timeout = match self.samples.due_in() {
                Some(d) if timeout < 0 || (d.as_millis() as i32) < timeout => d.as_millis() as i32,
                _ => timeout,
            };
            // SAFETY: events buffer is valid for its length.
            let n = unsafe { libc::epoll_wait(self.epoll, events.as_mut_ptr(), events.len() as i32, timeout) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                warn!("epoll_wait: {e}");
                return;
            }
            if self.samples.due_in() == Some(Duration::ZERO) {
                crate::ctl_stats::sample(self);
                self.maybe_auto_rebalance();
            }
            for ev in &events[..n as usize] {
                let (kind, id) = (ev.u64 >> 32, ev.u64 & 0xffff_ffff);
                match kind {
                    TOK_PORT_LISTEN => self.accept_vhost(id as usize),
                    TOK_PORT_CONN => self.serve_vhost(id as usize),
                    TOK_CTL_LISTEN => self.accept_ctl(),
                    TOK_CTL_CLIENT => self.serve_ctl(id),
                    TOK_METRICS_LISTEN => self.accept_metrics(),
                    TOK_METRICS_CLIENT => self.serve_metrics(id),
                    TOK_MEM_FAULT => self.memory_fault(),
                    TOK_SIGNAL if self.take_signal() => return,
                    _ => {}
                }
            }
        }
    }

    /// A guest's memory faulted (its file shrank): disconnect the port it belongs to.
    fn memory_fault(&mut self) {
        let mut buf = [0u8; 8];
        // SAFETY: reading the eventfd counter into a local buffer.
        unsafe { libc::read(self.fault_fd, buf.as_mut_ptr() as *mut libc::c_void, 8) };
        let (addr, total) = crate::mem::fault::last_fault();
        for i in 0..self.ports.len() {
            let Some(pc) = self.ports[i].as_mut() else { continue };
            if pc.conn.as_ref().is_some_and(|c| c.backend.lock().unwrap().mem_contains(addr)) {
                let msg = format!(
                    "guest memory fault at {addr:#x} (the frontend shrank the file behind its memory); disconnected"
                );
                log::error!("port {}: {msg} ({total} faults so far)", pc.port.name());
                pc.last_error = Some(msg);
                self.detach(i);
            }
        }
    }

    /// Returns true on SIGINT/SIGTERM.
    fn take_signal(&mut self) -> bool {
        let mut info = [0u8; 128];
        // SAFETY: reading one signalfd_siginfo (128 bytes) into a local buffer.
        let r = unsafe { libc::read(self.signal_fd, info.as_mut_ptr() as *mut libc::c_void, 128) };
        if r != 128 {
            return false;
        }
        let signo = u32::from_ne_bytes(info[0..4].try_into().unwrap()) as i32;
        if signo == libc::SIGHUP {
            match self.reload() {
                Ok(summary) => info!("SIGHUP: reloaded: {summary}"),
                Err(e) => warn!("SIGHUP: reload rejected, running configuration unchanged: {e}"),
            }
            return false;
        }
        info!("signal {signo}: shutting down");
        true
    }

    /// Connects client-mode ports whose retry time has come; returns the epoll timeout (ms).
    fn reconnect_due(&mut self) -> i32 {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for i in 0..self.ports.len() {
            let Some(at) = self.ports[i].as_ref().and_then(|p| p.retry_at) else { continue };
            if at <= now {
                self.connect_vhost(i);
            }
            if let Some(at) = self.ports[i].as_ref().and_then(|p| p.retry_at) {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        match next {
            None => -1,
            Some(t) => t.saturating_duration_since(Instant::now()).as_millis().min(i32::MAX as u128) as i32,
        }
    }

    fn connect_vhost(&mut self, i: usize) {
        let Some(pc) = self.ports[i].as_mut() else { return };
        let path = pc.port.cfg.socket.clone();
        match UnixStream::connect(&path) {
            Ok(s) => {
                pc.retry_at = None;
                pc.backoff = RECONNECT_MIN;
                self.attach(i, s);
            }
            Err(e) => {
                let msg = format!("connect {}: {e}", path.display());
                if pc.last_error.as_deref() != Some(&msg) {
                    info!("port {}: {msg}; retrying with backoff", pc.port.name());
                }
                pc.last_error = Some(msg);
                pc.retry_at = Some(Instant::now() + pc.backoff);
                pc.backoff = (pc.backoff * 2).min(RECONNECT_MAX);
            }
        }
    }

    fn accept_vhost(&mut self, i: usize) {
        let Some(pc) = self.ports.get(i).and_then(|p| p.as_ref()) else { return };
        let Some(l) = &pc.listener else { return };
        loop {
            match l.accept() {
                Ok(Some(s)) => {
                    if pc.conn.is_some() {
                        warn!("port {}: refusing a second frontend connection", pc.port.name());
                        drop(s);
                        continue;
                    }
                    self.attach(i, s);
                    return;
                }
                Ok(None) => return,
                Err(e) => {
                    warn!("port {}: accept: {e}", pc.port.name());
                    return;
                }
            }
        }
    }

    fn attach(&mut self, i: usize, s: UnixStream) {
        let Some(pc) = self.ports[i].as_mut() else { return };
        let _ = s.set_read_timeout(Some(VHOST_MSG_TIMEOUT));
        let _ = s.set_write_timeout(Some(VHOST_MSG_TIMEOUT));
        let backend = Arc::new(Mutex::new(PortBackend::new(pc.port.clone())));
        let handler = BackendReqHandler::from_stream(s, backend.clone());
        epoll_add(self.epoll, handler.as_raw_fd(), (TOK_PORT_CONN << 32) | i as u64);
        info!("port {}: frontend connected", pc.port.name());
        pc.connects += 1;
        pc.conn = Some(Conn { handler, backend, since: Instant::now() });
    }

    fn serve_vhost(&mut self, i: usize) {
        let Some(pc) = self.ports.get_mut(i).and_then(|p| p.as_mut()) else { return };
        let Some(conn) = pc.conn.as_mut() else { return };
        let res = match early_vring_enable(conn) {
            Some(r) => r,
            None => conn.handler.handle_request(),
        };
        // A ring of this port may have started or stopped: wake the poll threads that own
        // its queues, in case they sleep (adaptive polling) and must watch a new kick fd.
        for (t, qs) in self.thread_queues.iter().enumerate() {
            if qs.iter().any(|&(p, _)| p as usize == i) {
                self.mailboxes[t].wake();
            }
        }
        let Some(pc) = self.ports.get_mut(i).and_then(|p| p.as_mut()) else { return };
        if let Err(e) = res {
            let msg = match e {
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage => {
                    "frontend disconnected".to_string()
                }
                e => format!("closing connection: {e}"),
            };
            info!("port {}: {msg}", pc.port.name());
            pc.last_error = Some(msg);
            self.detach(i);
        }
    }

    /// Drops a port's connection: its rings stop (under their locks, so no poll thread touches
    /// the guest's memory afterwards), its MACs are forgotten, client ports reconnect.
    pub(crate) fn detach(&mut self, i: usize) {
        let Some(pc) = self.ports[i].as_mut() else { return };
        if let Some(conn) = pc.conn.take() {
            epoll_del(self.epoll, conn.handler.as_raw_fd());
            conn.backend.lock().unwrap().stop_all();
        }
        self.mac.flush_port(pc.port.id);
        if pc.port.cfg.mode == SocketMode::Client {
            pc.retry_at = Some(Instant::now() + pc.backoff);
        }
    }

    fn accept_metrics(&mut self) {
        let Some(m) = self.metrics.as_mut() else { return };
        for (id, fd) in m.accept() {
            epoll_add(self.epoll, fd, (TOK_METRICS_CLIENT << 32) | id);
        }
    }

    fn serve_metrics(&mut self, id: u64) {
        let Some(fd) = self.metrics.as_ref().and_then(|m| m.fd(id)) else { return };
        let ev = self.metrics.as_mut().unwrap().read(id);
        let ev = match ev {
            crate::metrics_http::Event::Wants => {
                let body = crate::ctl_stats::metrics(self);
                self.metrics.as_mut().unwrap().respond(id, &body)
            }
            e => e,
        };
        if let crate::metrics_http::Event::Done = ev {
            epoll_del(self.epoll, fd);
        }
    }

    fn accept_ctl(&mut self) {
        while let Ok((s, _)) = self.ctl_listener.accept() {
            let _ = s.set_nonblocking(true);
            let id = self.next_client;
            self.next_client += 1;
            epoll_add(self.epoll, s.as_raw_fd(), (TOK_CTL_CLIENT << 32) | (id & 0xffff_ffff));
            self.clients.insert(id & 0xffff_ffff, CtlClient { stream: s, buf: Vec::new() });
        }
    }

    fn serve_ctl(&mut self, id: u64) {
        let Some(c) = self.clients.get_mut(&id) else { return };
        let mut chunk = [0u8; 4096];
        let mut close = false;
        let mut request = None;
        loop {
            match c.stream.read(&mut chunk) {
                Ok(0) => {
                    close = true;
                    break;
                }
                Ok(n) => {
                    c.buf.extend_from_slice(&chunk[..n]);
                    if let Some(pos) = c.buf.iter().position(|&b| b == b'\n') {
                        request = Some(c.buf[..pos].to_vec());
                        break;
                    }
                    if c.buf.len() > MAX_CTL_REQUEST {
                        request = Some(Vec::new());
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    close = true;
                    break;
                }
            }
        }
        if let Some(req) = request {
            let oversized = c.buf.len() > MAX_CTL_REQUEST && req.is_empty();
            let reply = if oversized {
                ctl::error_reply(&format!("request larger than {MAX_CTL_REQUEST} bytes"))
            } else {
                ctl::handle(self, &req)
            };
            let c = self.clients.get_mut(&id).unwrap();
            let _ = c.stream.set_nonblocking(false);
            let _ = c.stream.set_write_timeout(Some(Duration::from_secs(2)));
            let _ = c.stream.write_all(reply.as_bytes());
            let _ = c.stream.write_all(b"\n");
            close = true;
        }
        if close && let Some(c) = self.clients.remove(&id) {
            epoll_del(self.epoll, c.stream.as_raw_fd());
        }
    }

    /// Socket paths to remove at exit.
    pub fn owned_sockets(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self
            .ports
            .iter()
            .flatten()
            .filter(|p| p.port.cfg.mode == SocketMode::Server)
            .map(|p| p.port.cfg.socket.clone())
            .collect();
        v.push(self.cfg.control_socket.clone());
        v
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        for pc in self.ports.iter_mut().flatten() {
            if let Some(conn) = pc.conn.take() {
                conn.backend.lock().unwrap().stop_all();
            }
        }
        for p in self.owned_sockets() {
            let _ = std::fs::remove_file(p);
        }
        // SAFETY: closing fds this struct created and owns.
        unsafe {
            libc::close(self.epoll);
            libc::close(self.signal_fd);
            libc::close(self.fault_fd);
        }
    }
}
