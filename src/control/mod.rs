//! The control thread: one epoll loop over every vhost-user socket (listening and connected,
//! server and client mode), the control socket and its clients, the metrics endpoint, the
//! SIGBUS notifications of `mem::fault`, and signals. Its cost does not grow in threads with the
//! number of ports. It owns every file descriptor of the control plane and the switch model
//! (`switch`), which it changes as events arrive.
//!
//! - [`vhost`]: vhost-user listeners, connections and reconnect timers.
//! - [`clients`]: request-reply clients: the control socket (`pvswitchctl`) and the Prometheus
//!   endpoint, served without waiting on them.
//! - [`metrics`]: the Prometheus endpoint's HTTP.
//! - [`os`]: the signalfd, epoll tokens, receiving fds.
//! - [`sockpath`]: socket files bound, connected to and removed without following links.
//! - [`service`]: the service manager's notify protocol (READY, STATUS, RELOADING, WATCHDOG).
pub mod capture;
pub mod clients;
pub mod metrics;
pub mod os;
pub mod service;
pub mod sockpath;
pub mod vhost;

use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::rc::Rc;
use std::time::Instant;

use log::{error, info, warn};
use vmm_sys_util::epoll::{Epoll, EpollEvent};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::ctl;
use crate::switch::{Endpoints, Switch};
use clients::{Parsed, Server};
use os::{SignalFd, Token, watch};
use service::Service;
use sockpath::OwnedSocket;
use vhost::VhostIo;

/// Largest control request accepted.
pub const MAX_CTL_REQUEST: usize = 64 * 1024;

pub struct Control {
    pub sw: Switch,
    epoll: Rc<Epoll>,
    vhost: VhostIo,
    ctl: Server<UnixListener>,
    /// The control socket's file, removed at exit.
    ctl_socket: OwnedSocket,
    metrics: Option<Server<TcpListener>>,
    signals: SignalFd,
    /// Written by the SIGBUS handler when a guest's memory file shrank under us.
    fault: EventFd,
    service: Service,
    /// Written by a capture's thread when it is done (`capture`): unhook it.
    capture_done: std::sync::Arc<EventFd>,
}

impl Control {
    /// Serves the control socket `ctl` (bound first, by `bind_control`), opens the metrics
    /// endpoint and every port's endpoint. A port whose endpoint cannot be made (its socket
    /// path is a file, or another process listens there) is logged and shows the error; the
    /// others run. Poll threads are started by the caller (`sw.start_threads()`), which then
    /// calls `ready`.
    pub fn new(mut sw: Switch, ctl: (UnixListener, OwnedSocket), signals: SignalFd) -> std::io::Result<Control> {
        let (ctl, ctl_socket) = ctl;
        let epoll = Rc::new(Epoll::new()?);
        let ctl = Server::new(epoll.clone(), ctl, Token::CtlListen, Token::CtlClient, MAX_CTL_REQUEST);
        watch(&epoll, signals.as_raw_fd(), Token::Signal);
        let fault = EventFd::new(EFD_NONBLOCK)?;
        crate::mem::fault::install(fault.as_raw_fd())?;
        watch(&epoll, fault.as_raw_fd(), Token::MemFault);
        let metrics = match sw.cfg.metrics_listen {
            Some(addr) => {
                let l = TcpListener::bind(addr)
                    .map_err(|e| std::io::Error::new(e.kind(), format!("metrics_listen {addr}: {e}")))?;
                l.set_nonblocking(true)?;
                info!("metrics: http://{addr}/metrics");
                Some(Server::new(epoll.clone(), l, Token::MetricsListen, Token::MetricsClient, metrics::MAX_REQUEST))
            }
            None => None,
        };
        let mut vhost = VhostIo::new(epoll.clone());
        let mut failed = Vec::new();
        for ps in sw.ports.iter().flatten() {
            if let Err(e) = vhost.open(ps) {
                error!("{e}");
                failed.push((ps.id(), e.to_string()));
            }
        }
        for (id, e) in failed {
            sw.endpoint_failed(id, e);
        }
        let capture_done = std::sync::Arc::new(EventFd::new(EFD_NONBLOCK)?);
        watch(&epoll, capture_done.as_raw_fd(), Token::CaptureDone);
        Ok(Control {
            sw,
            epoll,
            vhost,
            ctl,
            ctl_socket,
            metrics,
            signals,
            fault,
            service: Service::from_env(),
            capture_done,
        })
    }

    /// Tells the service manager that start-up is complete: every listener and the control
    /// socket exist and the poll threads run.
    pub fn ready(&mut self) {
        let status = self.sw.status_line();
        info!("ready: {status}");
        self.service.ready(status);
    }

    /// Runs until SIGINT or SIGTERM.
    pub fn run(&mut self) {
        let mut events = vec![EpollEvent::default(); 64];
        loop {
            self.vhost.reconnect_due(&mut self.sw);
            self.vhost.expire(&mut self.sw);
            self.ctl.expire();
            if let Some(m) = self.metrics.as_mut() {
                m.expire();
            }
            let mut due = self.sw.samples.due_in();
            let now = Instant::now();
            let next = [self.vhost.next_due(), self.ctl.next_due(), self.metrics.as_ref().and_then(|m| m.next_due())];
            for t in next.into_iter().flatten() {
                due = due.min(t.saturating_duration_since(now));
            }
            self.sw.watchdog();
            if self.sw.threads_awake() {
                due = due.min(crate::switch::WATCHDOG_EVERY);
            }
            self.service.ping_if_due();
            if let Some(t) = self.service.next_due() {
                due = due.min(t.saturating_duration_since(Instant::now()));
            }
            // Rounded up: waking a millisecond early would only spin.
            let timeout = due.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
            let n = match self.epoll.wait(timeout, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    warn!("epoll_wait: {e}");
                    return;
                }
            };
            if self.sw.samples.due_in().is_zero() {
                self.sw.sample();
                self.sw.maybe_auto_rebalance();
                self.service.status(self.sw.status_line());
            }
            for ev in &events[..n] {
                match Token::from_u64(ev.data()) {
                    Some(Token::PortListen(i)) => self.vhost.accept(i as usize, &mut self.sw),
                    Some(Token::PortConn(i)) => self.vhost.serve(i as usize, &mut self.sw),
                    Some(Token::CtlListen) => {
                        for id in self.ctl.accept() {
                            self.serve_ctl(id);
                        }
                    }
                    Some(Token::CtlClient(id)) => self.serve_ctl(id),
                    Some(Token::MetricsListen) => {
                        for id in self.metrics.as_mut().map_or(Vec::new(), |m| m.accept()) {
                            self.serve_metrics(id);
                        }
                    }
                    Some(Token::MetricsClient(id)) => self.serve_metrics(id),
                    Some(Token::MemFault) => self.memory_fault(),
                    Some(Token::CaptureDone) => {
                        let _ = self.capture_done.read();
                        self.sw.reap_captures();
                    }
                    Some(Token::Signal) if self.take_signal() => {
                        self.service.stopping();
                        // Flows held are sent before the switch goes (their end reason:
                        // forced), as a reload's replaced exporter sends its own.
                        if let Some(x) = &self.sw.export {
                            x.tick(crate::export::now_ms(), true);
                        }
                        return;
                    }
                    _ => {}
                }
            }
        }
    }

    /// A guest's memory faulted (its file shrank): disconnect the port it belongs to.
    fn memory_fault(&mut self) {
        let _ = self.fault.read();
        let (addr, total) = crate::mem::fault::last_fault();
        self.vhost.memory_fault(addr, total, &mut self.sw);
    }

    /// Returns true on SIGINT/SIGTERM.
    fn take_signal(&mut self) -> bool {
        let Some(signo) = self.signals.take() else { return false };
        if signo == libc::SIGHUP {
            self.service.reloading();
            match self.sw.reload(&mut self.vhost) {
                Ok(summary) => info!("SIGHUP: reloaded: {summary}"),
                Err(e) => warn!("SIGHUP: reload rejected, running configuration unchanged: {e}"),
            }
            self.service.reloaded(self.sw.status_line());
            return false;
        }
        info!("signal {signo}: shutting down");
        true
    }

    fn serve_ctl(&mut self, id: u32) {
        let line = |buf: &[u8]| match buf.iter().position(|&b| b == b'\n') {
            Some(pos) => Parsed::Request(buf[..pos].to_vec()),
            None => Parsed::Pending,
        };
        let mut reply = match self.ctl.read(id, line) {
            None => return,
            Some(Err(e)) => ctl::error_reply(&e),
            Some(Ok(req)) if ctl::is_capture(&req) => match self.start_capture(id, &req) {
                Ok(()) => return,
                Err(reply) => reply,
            },
            Some(Ok(req)) => {
                // The service manager sees a reload from pvswitchctl (ExecReload) as from SIGHUP.
                let reload = ctl::is_reload(&req);
                if reload {
                    self.service.reloading();
                }
                let reply = ctl::handle(&mut self.sw, &mut self.vhost, &req);
                if reload {
                    self.service.reloaded(self.sw.status_line());
                }
                reply
            }
        };
        reply.push('\n');
        self.ctl.reply(id, reply.into_bytes());
    }

    /// `capture` and `trace --live`: hooks the capture into the plans, then hands client `id`'s
    /// connection to the capture's own thread. Err: the reply line (the capture was refused).
    fn start_capture(&mut self, id: u32, req: &[u8]) -> Result<(), String> {
        use crate::proto::Request;
        let refuse = |e: crate::proto::CtlError| crate::proto::Reply::<()>::coded(Err(e)).to_line();
        let (capture, reader, started, count, explain) = match Request::parse(req) {
            Ok(Request::Capture { words, direction, drops, count, snaplen }) => {
                let ask = crate::switch::captures::CaptureAsk { words: &words, direction, drops, snaplen };
                let (capture, reader, started) = self.sw.start_capture(&ask).map_err(refuse)?;
                (capture, reader, started, count, None)
            }
            Ok(Request::TraceLive { port, count, filter }) => {
                let (capture, reader, started, id) = self.sw.start_trace(&port, &filter).map_err(refuse)?;
                (capture, reader, started, Some(count), Some(ctl::live::Explainer::new(&self.sw, id)))
            }
            _ => return Err(ctl::error_reply("capture: malformed request")),
        };
        let what = if explain.is_some() { "live trace" } else { "capture" };
        let Some(stream) = self.ctl.detach(id) else {
            // The client went away meanwhile: undo.
            capture.finished.store(true, std::sync::atomic::Ordering::Release);
            self.sw.reap_captures();
            return Ok(());
        };
        info!("{what} of {} started (filter \"{}\")", started.ports.join(","), started.filter);
        let done = self.capture_done.clone();
        let job = capture::Job { stream, started, capture: capture.clone(), reader, count, done, explain };
        if let Err(e) = capture::spawn(job) {
            warn!("{what}: cannot start its thread: {e}");
            capture.finished.store(true, std::sync::atomic::Ordering::Release);
            self.sw.reap_captures();
        }
        Ok(())
    }

    fn serve_metrics(&mut self, id: u32) {
        let Some(m) = self.metrics.as_mut() else { return };
        let response = match m.read(id, metrics::parse) {
            None => return,
            Some(Err(status)) => metrics::refusal(&status),
            Some(Ok(_)) => metrics::response("200 OK", &ctl::stats::metrics(&self.sw)),
        };
        self.metrics.as_mut().unwrap().reply(id, response);
    }
}

/// Binds the control socket at `path` with file mode `mode` (never through a symbolic link:
/// `sockpath`). A stale socket file (a crashed run's) is replaced; a live one means another
/// pvswitchd runs on this configuration, and start-up is refused before anything else is
/// touched.
pub fn bind_control(path: &Path, mode: u32) -> std::io::Result<(UnixListener, OwnedSocket)> {
    sockpath::bind(path, Some(mode), None).map_err(|e| {
        let why = if e.kind() == std::io::ErrorKind::AddrInUse {
            "another pvswitchd is running (a process accepts connections on it)".to_string()
        } else {
            e.to_string()
        };
        std::io::Error::new(e.kind(), format!("control socket {}: {why}; refusing to start", path.display()))
    })
}

impl Drop for Control {
    fn drop(&mut self) {
        // Each server port's socket file, then the control socket's, is removed if its path
        // still holds the socket this process created.
        self.vhost.close_all();
        self.ctl_socket.remove();
    }
}
