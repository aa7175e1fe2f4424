//! The control socket: `pvswitchctl` connects, sends one JSON request line, reads one reply
//! line (see `ctl`).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use vmm_sys_util::epoll::Epoll;

use super::os::{Token, unwatch, watch};

/// Largest control request accepted.
pub const MAX_CTL_REQUEST: usize = 64 * 1024;

struct Client {
    stream: UnixStream,
    buf: Vec<u8>,
}

/// What a client's bytes came to.
pub enum Request {
    /// Not a whole line yet.
    Pending,
    /// A request line (the newline stripped).
    Line(Vec<u8>),
    /// More than `MAX_CTL_REQUEST` bytes without a newline.
    TooLarge,
}

pub struct CtlServer {
    epoll: Rc<Epoll>,
    listener: UnixListener,
    clients: HashMap<u32, Client>,
    next: u32,
}

impl CtlServer {
    /// Binds the control socket at `path` with file mode `mode`.
    pub fn bind(epoll: Rc<Epoll>, path: &Path, mode: u32) -> std::io::Result<CtlServer> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("control socket {}: {e}", path.display())))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        listener.set_nonblocking(true)?;
        watch(&epoll, listener.as_raw_fd(), Token::CtlListen);
        Ok(CtlServer { epoll, listener, clients: HashMap::new(), next: 0 })
    }

    pub fn accept(&mut self) {
        while let Ok((s, _)) = self.listener.accept() {
            let _ = s.set_nonblocking(true);
            let id = self.next;
            self.next = self.next.wrapping_add(1);
            watch(&self.epoll, s.as_raw_fd(), Token::CtlClient(id));
            self.clients.insert(id, Client { stream: s, buf: Vec::new() });
        }
    }

    /// Reads what client `id` sent. A closed or failed connection is dropped (Pending).
    pub fn read(&mut self, id: u32) -> Request {
        let Some(c) = self.clients.get_mut(&id) else { return Request::Pending };
        let mut chunk = [0u8; 4096];
        loop {
            match c.stream.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    c.buf.extend_from_slice(&chunk[..n]);
                    if let Some(pos) = c.buf.iter().position(|&b| b == b'\n') {
                        return Request::Line(c.buf[..pos].to_vec());
                    }
                    if c.buf.len() > MAX_CTL_REQUEST {
                        return Request::TooLarge;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Request::Pending,
                Err(_) => break,
            }
        }
        self.drop_client(id);
        Request::Pending
    }

    /// Sends the reply line to client `id` and closes the connection.
    pub fn reply(&mut self, id: u32, reply: &str) {
        if let Some(c) = self.clients.get_mut(&id) {
            let _ = c.stream.set_nonblocking(false);
            let _ = c.stream.set_write_timeout(Some(Duration::from_secs(2)));
            let _ = c.stream.write_all(reply.as_bytes());
            let _ = c.stream.write_all(b"\n");
        }
        self.drop_client(id);
    }

    fn drop_client(&mut self, id: u32) {
        if let Some(c) = self.clients.remove(&id) {
            unwatch(&self.epoll, c.stream.as_raw_fd());
        }
    }
}
