//! The control thread: one epoll loop over every vhost-user socket (listening and connected,
//! server and client mode), the control socket and its clients, the metrics endpoint, the
//! SIGBUS notifications of `mem::fault`, and signals. Its cost does not grow in threads with the
//! number of ports. It owns every file descriptor of the control plane and the switch model
//! (`switch`), which it changes as events arrive.
//!
//! - [`vhost`]: vhost-user listeners, connections and reconnect timers.
//! - [`clients`]: the control socket (`pvswitchctl`).
//! - [`metrics`]: the Prometheus endpoint.
//! - [`os`]: the signalfd and epoll tokens.

pub mod clients;
pub mod metrics;
pub mod os;
pub mod vhost;

use std::os::fd::AsRawFd;
use std::rc::Rc;

use log::{info, warn};
use vmm_sys_util::epoll::{Epoll, EpollEvent};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::ctl;
use crate::switch::{Endpoints, Switch};
use clients::{CtlServer, MAX_CTL_REQUEST, Request};
use metrics::MetricsServer;
use os::{SignalFd, Token, watch};
use vhost::VhostIo;

pub struct Control {
    pub sw: Switch,
    epoll: Rc<Epoll>,
    vhost: VhostIo,
    ctl: CtlServer,
    metrics: Option<MetricsServer>,
    signals: SignalFd,
    /// Written by the SIGBUS handler when a guest's memory file shrank under us.
    fault: EventFd,
}

impl Control {
    /// Opens the control socket, the metrics endpoint and every port's endpoint. Poll threads
    /// are started by the caller (`sw.start_threads()`).
    pub fn new(sw: Switch, signals: SignalFd) -> std::io::Result<Control> {
        let epoll = Rc::new(Epoll::new()?);
        let ctl = CtlServer::bind(epoll.clone(), &sw.cfg.control_socket, sw.cfg.control_socket_mode)?;
        watch(&epoll, signals.as_raw_fd(), Token::Signal);
        let fault = EventFd::new(EFD_NONBLOCK)?;
        crate::mem::fault::install(fault.as_raw_fd())?;
        watch(&epoll, fault.as_raw_fd(), Token::MemFault);
        let metrics = match sw.cfg.metrics_listen {
            Some(addr) => {
                let m = MetricsServer::bind(epoll.clone(), addr)?;
                info!("metrics: http://{addr}/metrics");
                Some(m)
            }
            None => None,
        };
        let mut vhost = VhostIo::new(epoll.clone());
        for ps in sw.ports.iter().flatten() {
            vhost.open(ps)?;
        }
        Ok(Control { sw, epoll, vhost, ctl, metrics, signals, fault })
    }

    /// Runs until SIGINT or SIGTERM.
    pub fn run(&mut self) {
        let mut events = vec![EpollEvent::default(); 64];
        loop {
            let timeout = self.vhost.reconnect_due(&mut self.sw);
            let sample = self.sw.samples.due_in().as_millis().min(i32::MAX as u128) as i32;
            let timeout = if timeout < 0 { sample } else { timeout.min(sample) };
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
            }
            for ev in &events[..n] {
                match Token::from_u64(ev.data()) {
                    Some(Token::PortListen(i)) => self.vhost.accept(i as usize, &mut self.sw),
                    Some(Token::PortConn(i)) => self.vhost.serve(i as usize, &mut self.sw),
                    Some(Token::CtlListen) => self.ctl.accept(),
                    Some(Token::CtlClient(id)) => self.serve_ctl(id),
                    Some(Token::MetricsListen) => self.metrics.as_mut().map_or((), |m| m.accept()),
                    Some(Token::MetricsClient(id)) => self.serve_metrics(id),
                    Some(Token::MemFault) => self.memory_fault(),
                    Some(Token::Signal) if self.take_signal() => return,
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
            match self.sw.reload(&mut self.vhost) {
                Ok(summary) => info!("SIGHUP: reloaded: {summary}"),
                Err(e) => warn!("SIGHUP: reload rejected, running configuration unchanged: {e}"),
            }
            return false;
        }
        info!("signal {signo}: shutting down");
        true
    }

    fn serve_ctl(&mut self, id: u32) {
        let reply = match self.ctl.read(id) {
            Request::Pending => return,
            Request::TooLarge => ctl::error_reply(&format!("request larger than {MAX_CTL_REQUEST} bytes")),
            Request::Line(req) => ctl::handle(&mut self.sw, &mut self.vhost, &req),
        };
        self.ctl.reply(id, &reply);
    }

    fn serve_metrics(&mut self, id: u32) {
        let Some(m) = self.metrics.as_mut() else { return };
        if let metrics::Event::Wants = m.read(id) {
            let body = ctl::stats::metrics(&self.sw);
            self.metrics.as_mut().unwrap().respond(id, &body);
        }
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.vhost.close_all();
        for p in self.sw.owned_sockets() {
            let _ = std::fs::remove_file(p);
        }
    }
}
