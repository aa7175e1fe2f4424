//! The control thread's side of the service manager's notify protocol (sd_notify(3), through
//! the `sd-notify` crate): READY=1 once every listener and the control socket exist and the
//! poll threads run, STATUS= with the ports connected (sent when it changes), RELOADING=1 and
//! READY=1 around a reload, STOPPING=1 at shutdown, and WATCHDOG=1 every half watchdog period
//! from the control loop, so a control thread that hangs is restarted. Without NOTIFY_SOCKET
//! every call does nothing.

use std::time::{Duration, Instant};

use log::warn;
use sd_notify::NotifyState;

pub struct Service {
    /// Every how often to ping the watchdog (half of WATCHDOG_USEC), if systemd asked.
    ping_every: Option<Duration>,
    next_ping: Instant,
    /// The last STATUS= sent.
    status: String,
    /// NOTIFY_SOCKET is set.
    enabled: bool,
}

impl Service {
    pub fn from_env() -> Service {
        let mut usec = 0u64;
        let ping_every = sd_notify::watchdog_enabled(false, &mut usec).then(|| Duration::from_micros(usec / 2));
        Service {
            ping_every,
            next_ping: Instant::now(),
            status: String::new(),
            enabled: std::env::var_os("NOTIFY_SOCKET").is_some(),
        }
    }

    fn send(&self, states: &[NotifyState]) {
        if self.enabled
            && let Err(e) = sd_notify::notify(false, states)
        {
            warn!("service manager notification {states:?}: {e}");
        }
    }

    /// Start-up is complete.
    pub fn ready(&mut self, status: String) {
        self.send(&[NotifyState::Ready, NotifyState::Status(&status)]);
        self.status = status;
    }

    /// Reports `status` if it changed.
    pub fn status(&mut self, status: String) {
        if status != self.status {
            self.send(&[NotifyState::Status(&status)]);
            self.status = status;
        }
    }

    /// A reload begins (systemd 253 and newer want the monotonic time with it).
    pub fn reloading(&self) {
        self.send(&[
            NotifyState::Reloading,
            NotifyState::monotonic_usec_now().unwrap_or(NotifyState::MonotonicUsec(0)),
        ]);
    }

    /// A reload ended (applied or refused: either way the daemon runs on).
    pub fn reloaded(&mut self, status: String) {
        self.ready(status);
    }

    pub fn stopping(&self) {
        self.send(&[NotifyState::Stopping]);
    }

    /// When the watchdog must be pinged next, if it is on.
    pub fn next_due(&self) -> Option<Instant> {
        self.ping_every.map(|_| self.next_ping)
    }

    /// Pings the watchdog if it is due.
    pub fn ping_if_due(&mut self) {
        if let Some(every) = self.ping_every
            && Instant::now() >= self.next_ping
        {
            self.send(&[NotifyState::Watchdog]);
            self.next_ping = Instant::now() + every;
        }
    }
}
