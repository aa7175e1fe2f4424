//! The control thread's OS handles that vmm-sys-util does not provide: a signalfd, and the
//! epoll tokens the event loop dispatches on. Epoll itself is vmm-sys-util's `Epoll`.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// What an epoll event is about: the kind in the high 32 bits, an id (port, client) in the low.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    PortListen(u32),
    PortConn(u32),
    CtlListen,
    CtlClient(u32),
    Signal,
    MemFault,
    MetricsListen,
    MetricsClient(u32),
    /// A capture's thread is done (`capture`).
    CaptureDone,
}

impl Token {
    pub fn to_u64(self) -> u64 {
        let (kind, id) = match self {
            Token::PortListen(i) => (1, i),
            Token::PortConn(i) => (2, i),
            Token::CtlListen => (3, 0),
            Token::CtlClient(i) => (4, i),
            Token::Signal => (5, 0),
            Token::MemFault => (6, 0),
            Token::MetricsListen => (7, 0),
            Token::MetricsClient(i) => (8, i),
            Token::CaptureDone => (9, 0),
        };
        (kind << 32) | id as u64
    }

    pub fn from_u64(v: u64) -> Option<Token> {
        let id = v as u32;
        Some(match v >> 32 {
            1 => Token::PortListen(id),
            2 => Token::PortConn(id),
            3 => Token::CtlListen,
            4 => Token::CtlClient(id),
            5 => Token::Signal,
            6 => Token::MemFault,
            7 => Token::MetricsListen,
            8 => Token::MetricsClient(id),
            9 => Token::CaptureDone,
            _ => return None,
        })
    }
}

/// Adds `fd` to `epoll` for input, reported with `token`. A failure is logged: the fd is then
/// never served, which only its own client notices.
pub fn watch(epoll: &Epoll, fd: RawFd, token: Token) {
    let ev = EpollEvent::new(EventSet::IN, token.to_u64());
    if let Err(e) = epoll.ctl(ControlOperation::Add, fd, ev) {
        log::warn!("epoll add fd {fd}: {e}");
    }
}

/// Changes what `fd` is watched for: input, and output too if `writable`.
pub fn rewatch(epoll: &Epoll, fd: RawFd, token: Token, writable: bool) {
    let events = if writable { EventSet::IN | EventSet::OUT } else { EventSet::IN };
    let _ = epoll.ctl(ControlOperation::Modify, fd, EpollEvent::new(events, token.to_u64()));
}

/// Receives up to `buf.len()` bytes from `sock` (non-blocking) and the file descriptors that
/// came with them, at most `max_fds` (0: none); more than that is an error (`ENOBUFS`, the extra fds
/// closed), as is a socket with nothing to read (`WouldBlock`). Ok(0) is end of stream.
pub fn recv_with_fds(sock: &UnixStream, buf: &mut [u8], max_fds: usize, fds: &mut Vec<File>) -> std::io::Result<usize> {
    let mut raw = [-1 as RawFd; 16];
    let max_fds = max_fds.min(raw.len());
    let mut iov = [libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() }];
    // SAFETY: the iovec points at `buf`, ours and writable for its length.
    let (n, nfds) = unsafe { sock.recv_with_fds(&mut iov, &mut raw[..max_fds]) }.map_err(std::io::Error::from)?;
    for &fd in &raw[..nfds] {
        // SAFETY: fds the kernel just installed for us; nothing else owns them.
        fds.push(unsafe { File::from_raw_fd(fd) });
    }
    Ok(n)
}

/// Whether the peer of `sock` has closed its end (with or without data left unread).
pub fn peer_closed(sock: &UnixStream) -> bool {
    let mut p = libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLRDHUP, revents: 0 };
    // SAFETY: one pollfd of ours, no waiting.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// Removes `fd` from `epoll` (already gone is fine).
pub fn unwatch(epoll: &Epoll, fd: RawFd) {
    let _ = epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default());
}

/// SIGINT, SIGTERM and SIGHUP as a file descriptor.
pub struct SignalFd {
    fd: OwnedFd,
}

impl SignalFd {
    /// Blocks SIGINT, SIGTERM and SIGHUP in this thread (and threads it spawns later) and
    /// returns a signalfd that reports them. Call before starting any thread.
    pub fn block_signals() -> std::io::Result<SignalFd> {
        // SAFETY: plain libc signal-set manipulation on a local sigset_t; signalfd returns a
        // fresh fd (checked) that the OwnedFd then owns.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGHUP);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(SignalFd { fd: OwnedFd::from_raw_fd(fd) })
        }
    }

    /// The next pending signal's number, if any.
    pub fn take(&self) -> Option<i32> {
        let mut info = [0u8; 128];
        // SAFETY: reading one signalfd_siginfo (128 bytes) into a local buffer.
        let r = unsafe { libc::read(self.fd.as_raw_fd(), info.as_mut_ptr() as *mut libc::c_void, 128) };
        (r == 128).then(|| u32::from_ne_bytes(info[0..4].try_into().unwrap()) as i32)
    }
}

impl AsRawFd for SignalFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::Token;

    #[test]
    fn tokens_round_trip() {
        for t in [
            Token::PortListen(7),
            Token::PortConn(u32::MAX),
            Token::CtlClient(3),
            Token::Signal,
            Token::MetricsClient(0),
        ] {
            assert_eq!(Token::from_u64(t.to_u64()), Some(t));
        }
        assert_eq!(Token::from_u64(99 << 32), None);
    }
}
