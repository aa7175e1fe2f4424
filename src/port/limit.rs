//! What one frontend can make the control thread do for it that it could multiply: log lines
//! (a VMM that reconnects or sends SEND_RARP a million times a second would otherwise write
//! the log at its rate) and announcements (each SEND_RARP a broadcast flooded to the port's
//! VLAN). Each is a token bucket per port, kept on the `Port` so that reconnecting does not
//! refill it; what it refuses is counted, and the next line that goes out says how many were
//! suppressed. Only the control thread takes these (a mutex it shares with nobody on a hot
//! path).
#![forbid(unsafe_code)]

use std::sync::Mutex;
use std::time::Instant;

/// A token bucket: `burst` at once, then `per_sec` a second.
pub struct Limiter {
    burst: f64,
    per_sec: f64,
    state: Mutex<State>,
}

struct State {
    tokens: f64,
    at: Option<Instant>,
    /// Refused since the last admitted, and in all.
    since: u64,
    total: u64,
}

impl Limiter {
    pub fn new(burst: u32, per_sec: f64) -> Limiter {
        let state = State { tokens: burst as f64, at: None, since: 0, total: 0 };
        Limiter { burst: burst as f64, per_sec, state: Mutex::new(state) }
    }

    /// Takes a token at `now`: Some(how many were refused since the last one admitted), or
    /// None (refused, and counted).
    pub fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = s.at {
            let refill = now.saturating_duration_since(at).as_secs_f64() * self.per_sec;
            s.tokens = (s.tokens + refill).min(self.burst);
        }
        s.at = Some(now);
        if s.tokens < 1.0 {
            s.since += 1;
            s.total += 1;
            return None;
        }
        s.tokens -= 1.0;
        Some(std::mem::take(&mut s.since))
    }

    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    /// How many it refused in all.
    pub fn refused(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).total
    }
}

/// A port's limits on what its frontend triggers.
pub struct FrontendLimits {
    /// Log lines about the port that its frontend causes: 20 at once, then one a second.
    pub log: Limiter,
    /// SEND_RARP announcements: 8 at once (QEMU announces 5 times after a migration), then 4
    /// a second; a request beyond is answered but announces nothing.
    pub announce: Limiter,
}

impl Default for FrontendLimits {
    fn default() -> FrontendLimits {
        FrontendLimits { log: Limiter::new(20, 1.0), announce: Limiter::new(8, 4.0) }
    }
}

/// The note a log line carries after lines were suppressed.
pub fn suppressed_note(n: u64) -> String {
    match n {
        0 => String::new(),
        n => format!(" ({n} earlier lines about this port suppressed)"),
    }
}

/// Logs at `level` a line about `port` (a `&Port`) that its frontend caused, within the port's
/// log budget (`FrontendLimits::log`).
#[macro_export]
macro_rules! frontend_log {
    ($port:expr, $level:ident, $($arg:tt)+) => {
        if let Some(n) = $port.limits.log.admit() {
            log::$level!("{}{}", format_args!($($arg)+), $crate::port::limit::suppressed_note(n));
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_then_the_rate_and_the_refused_are_counted() {
        let l = Limiter::new(3, 2.0);
        let t = Instant::now();
        assert_eq!((0..5).map(|_| l.admit_at(t)).collect::<Vec<_>>(), [Some(0), Some(0), Some(0), None, None]);
        // Half a second: one token back, and the line says two were refused.
        assert_eq!(l.admit_at(t + Duration::from_millis(500)), Some(2));
        assert_eq!(l.admit_at(t + Duration::from_millis(500)), None);
        assert_eq!(l.refused(), 3);
        // A long quiet refills to the burst, no more.
        let later = t + Duration::from_secs(60);
        assert_eq!((0..4).filter(|_| l.admit_at(later).is_some()).count(), 3);
    }
}
