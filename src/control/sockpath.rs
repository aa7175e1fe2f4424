//! Socket paths, handled without following a symbolic link pvswitchd did not make. A socket
//! path is the operator's (its directories are resolved as usual: `/var/run` is a link to
//! `/run` on Debian), but its last component may be in a directory others can write, so:
//!
//! - **Binding** (server-mode ports, the control socket): the socket is bound in a private
//!   directory pvswitchd makes next to the path (mode 0700, a fresh name), given its mode and
//!   group there (nobody else can swap it for a link), its inode recorded, then renamed to the
//!   final name with `RENAME_NOREPLACE`. Something already at the name is replaced only if it is
//!   a socket nobody listens on (a crashed run's), unlinked after checking it is the inode just
//!   probed; a symbolic link, a file that is not a socket or a live socket makes the bind fail.
//! - **Removing** (shutdown, port removal): only if the name, looked at without following, is
//!   still the socket this process created (same device and inode); see [`OwnedSocket`].
//! - **Connecting** (client-mode ports, probes): the last component is opened `O_PATH |
//!   O_NOFOLLOW`, must be a socket, and the connect goes through `/proc/self/fd/N`, so the socket
//!   reached is exactly the inode checked.

use std::ffi::CString;
use std::io::{Error, ErrorKind, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use socket2::{Domain, SockAddr, Socket, Type};

/// The reason given when a socket path is a symbolic link.
pub const SYMLINK: &str = "is a symbolic link; not followed";
/// ... when it is something else that is not a socket.
pub const NOT_A_SOCKET: &str = "exists and is not a socket";
/// ... when a process accepts connections on it.
pub const LIVE: &str = "another process listens on it";

/// A socket file this process created: its directory (held open), its name there, and the
/// inode it got. The bound listener holds that inode, so while the listener is open its
/// number cannot be reused by another file: `remove` is called before the listener closes.
#[derive(Debug)]
pub struct OwnedSocket {
    dir: OwnedFd,
    name: CString,
    dev: u64,
    ino: u64,
    /// The mode and group it was made with, before `bind` set any (what `set_perms` restores
    /// when a setting is taken away).
    made: (u32, u32),
    path: PathBuf,
}

impl OwnedSocket {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the socket file if its name still holds the socket this process created:
    /// anything else there now (another process's socket, a link, a file) stays.
    pub fn remove(&self) {
        match lstat_at(self.dir.as_raw_fd(), &self.name) {
            Ok(st) if is_sock(&st) && (st.st_dev, st.st_ino) == (self.dev, self.ino) => {
                if let Err(e) = unlink_at(self.dir.as_raw_fd(), &self.name, 0) {
                    log::warn!("removing socket {}: {e}", self.path.display());
                }
            }
            Ok(_) => log::info!("{}: no longer pvswitchd's socket; left in place", self.path.display()),
            Err(_) => {}
        }
    }

    /// Gives the socket file `mode` and group `gid` (None: what it was made with), if its
    /// name still holds the socket this process made; a reload's changed `socket_mode` or
    /// `socket_group` on a listening port. Never through a link: the name is opened with
    /// `O_PATH | O_NOFOLLOW`, checked to be that inode, and changed through that fd.
    pub fn set_perms(&self, mode: Option<u32>, gid: Option<u32>) -> Result<()> {
        let f = open_at(self.dir.as_raw_fd(), &self.name, libc::O_PATH | libc::O_NOFOLLOW)?;
        let st = fstat(f.as_raw_fd())?;
        if !is_sock(&st) || (st.st_dev, st.st_ino) != (self.dev, self.ino) {
            return Err(Error::other("no longer pvswitchd's socket; left as it is"));
        }
        let (mode, gid) = (mode.unwrap_or(self.made.0), gid.unwrap_or(self.made.1));
        if st.st_gid != gid {
            // SAFETY: an empty NUL-terminated name with AT_EMPTY_PATH: the file `f` refers to.
            cvt(unsafe { libc::fchownat(f.as_raw_fd(), c"".as_ptr(), u32::MAX, gid, libc::AT_EMPTY_PATH) })
                .map_err(|e| chown_error(e, gid))?;
        }
        if st.st_mode & 0o7777 != mode {
            // An O_PATH fd takes no fchmod; its /proc link reaches the same inode, not a name.
            let p = cstr(format!("/proc/self/fd/{}", f.as_raw_fd()).as_bytes())?;
            // SAFETY: a NUL-terminated path.
            cvt(unsafe { libc::chmod(p.as_ptr(), mode as libc::mode_t) })?;
        }
        Ok(())
    }
}

/// The error of giving a file group `gid`, saying what it takes when it is EPERM.
fn chown_error(e: Error, gid: u32) -> Error {
    match e.raw_os_error() {
        // Giving a file a group one is not in takes CAP_CHOWN (the shipped unit has it).
        Some(libc::EPERM) => Error::new(
            e.kind(),
            format!("cannot give it socket_group {gid}: {e} (pvswitchd needs CAP_CHOWN, or to be in that group)"),
        ),
        _ => e,
    }
}

fn cstr(b: &[u8]) -> Result<CString> {
    CString::new(b).map_err(|_| Error::new(ErrorKind::InvalidInput, "a NUL byte in a socket path"))
}

fn cvt(r: libc::c_int) -> Result<libc::c_int> {
    if r < 0 { Err(Error::last_os_error()) } else { Ok(r) }
}

/// `openat(dir, name, flags)`, close-on-exec.
fn open_at(dir: RawFd, name: &CString, flags: libc::c_int) -> Result<OwnedFd> {
    // SAFETY: a NUL-terminated name; the fd returned (checked) is owned by the OwnedFd only.
    let fd = cvt(unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC) })?;
    // SAFETY: a fresh fd nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn zeroed_stat() -> libc::stat {
    // SAFETY: `stat` is plain data; all zeroes is a valid value.
    unsafe { std::mem::zeroed() }
}

fn fstat(fd: RawFd) -> Result<libc::stat> {
    let mut st = zeroed_stat();
    // SAFETY: fstat writes one `stat` into our local.
    cvt(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: the entry itself, never what a link points at.
fn lstat_at(dir: RawFd, name: &CString) -> Result<libc::stat> {
    let mut st = zeroed_stat();
    // SAFETY: a NUL-terminated name; fstatat writes one `stat` into our local.
    cvt(unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

fn unlink_at(dir: RawFd, name: &CString, flags: libc::c_int) -> Result<()> {
    // SAFETY: a NUL-terminated name; unlinkat never follows a link in the last component.
    cvt(unsafe { libc::unlinkat(dir, name.as_ptr(), flags) }).map(drop)
}

fn is_sock(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFSOCK
}

fn is_link(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

/// A path's directory (created if missing, resolved as usual) and last component.
fn split(path: &Path) -> Result<(PathBuf, CString)> {
    let name = path
        .file_name()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "a socket path must end in a file name"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((dir, cstr(name.as_bytes())?))
}

fn open_dir(dir: &Path) -> Result<OwnedFd> {
    std::fs::create_dir_all(dir)?;
    let c = cstr(dir.as_os_str().as_bytes())?;
    open_at(libc::AT_FDCWD, &c, libc::O_PATH | libc::O_DIRECTORY)
}

/// The address that reaches the file `fd` (an `O_PATH` fd) refers to, or `name` inside it.
fn proc_addr(fd: RawFd, name: Option<&str>) -> Result<SockAddr> {
    let p = match name {
        Some(n) => format!("/proc/self/fd/{fd}/{n}"),
        None => format!("/proc/self/fd/{fd}"),
    };
    SockAddr::unix(p)
}

/// Starts a non-blocking connect to the socket that `dir`/`name` is, never through a link.
/// Errors: a link (`SYMLINK`), not a socket (`NOT_A_SOCKET`), or the connect's own.
fn connect_at(dir: RawFd, name: &CString) -> Result<(Socket, libc::stat)> {
    let f = open_at(dir, name, libc::O_PATH | libc::O_NOFOLLOW)?;
    let st = fstat(f.as_raw_fd())?;
    if is_link(&st) {
        return Err(Error::other(SYMLINK));
    }
    if !is_sock(&st) {
        return Err(Error::other(NOT_A_SOCKET));
    }
    let s = Socket::new(Domain::UNIX, Type::STREAM.nonblocking().cloexec(), None)?;
    match s.connect(&proc_addr(f.as_raw_fd(), None)?) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok((s, st))
}

/// Starts connecting to the Unix socket at `path` without waiting, never following a link
/// in its last component ("is a symbolic link; not followed"). A full backlog is an error
/// (EAGAIN), as is a socket nobody listens on.
pub fn connect(path: &Path) -> Result<UnixStream> {
    let (dir, name) = split(path)?;
    let c = cstr(dir.as_os_str().as_bytes())?;
    let d = open_at(libc::AT_FDCWD, &c, libc::O_PATH | libc::O_DIRECTORY)?;
    let (s, _) = connect_at(d.as_raw_fd(), &name)?;
    Ok(UnixStream::from(OwnedFd::from(s)))
}

/// Makes room at `dir`/`name`: nothing there is fine; a socket nobody listens on (a crashed
/// run's) is unlinked, if the name still holds the inode probed; anything else is an error.
fn clear_stale(dir: RawFd, name: &CString) -> Result<()> {
    let st = match lstat_at(dir, name) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(st) => st,
    };
    if is_link(&st) {
        return Err(Error::other(SYMLINK));
    }
    if !is_sock(&st) {
        return Err(Error::other(NOT_A_SOCKET));
    }
    match connect_at(dir, name) {
        Ok(_) => Err(Error::new(ErrorKind::AddrInUse, LIVE)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN)) => Err(Error::new(ErrorKind::AddrInUse, LIVE)),
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
            let now = lstat_at(dir, name)?;
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) || !is_sock(&now) {
                return Err(Error::other("changed while it was checked"));
            }
            unlink_at(dir, name, 0)
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(e),
    }
}

/// A private directory next to the socket's name, removed (with what is left in it) on drop.
struct TempDir<'a> {
    parent: RawFd,
    name: CString,
    fd: OwnedFd,
    sock: CString,
    _dir: std::marker::PhantomData<&'a OwnedFd>,
}

impl<'a> TempDir<'a> {
    fn new(parent: &'a OwnedFd) -> Result<TempDir<'a>> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let mut last = None;
        for _ in 0..16 {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            let n = format!(
                ".pvswitchd-{}-{}-{:x}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed),
                nanos as u64 & 0xffff_ffff
            );
            let name = cstr(n.as_bytes())?;
            // SAFETY: a NUL-terminated name.
            match cvt(unsafe { libc::mkdirat(parent.as_raw_fd(), name.as_ptr(), 0o700) }) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    last = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            }
            let opened = open_at(parent.as_raw_fd(), &name, libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW)
                .and_then(|fd| Ok((fstat(fd.as_raw_fd())?, fd)));
            let fd = match opened {
                // SAFETY: geteuid has no preconditions.
                Ok((st, fd)) if st.st_uid == unsafe { libc::geteuid() } && st.st_mode & 0o077 == 0 => fd,
                r => {
                    let _ = unlink_at(parent.as_raw_fd(), &name, libc::AT_REMOVEDIR);
                    return Err(r.err().unwrap_or_else(|| Error::other("the private directory is not ours alone")));
                }
            };
            return Ok(TempDir {
                parent: parent.as_raw_fd(),
                name,
                fd,
                sock: cstr(b"sock")?,
                _dir: std::marker::PhantomData,
            });
        }
        Err(last.unwrap_or_else(|| Error::other("no free name for a private directory")))
    }
}

impl Drop for TempDir<'_> {
    fn drop(&mut self) {
        let _ = unlink_at(self.fd.as_raw_fd(), &self.sock, 0);
        let _ = unlink_at(self.parent, &self.name, libc::AT_REMOVEDIR);
    }
}

/// Binds a listening, non-blocking Unix socket at `path` with file `mode` and group `gid`
/// (None: as created), never following a link there, and replacing only a stale socket (see
/// the module's text). Errors say why: `SYMLINK`, `NOT_A_SOCKET`, `LIVE` (kind `AddrInUse`).
pub fn bind(path: &Path, mode: Option<u32>, gid: Option<u32>) -> Result<(UnixListener, OwnedSocket)> {
    let (dir_path, name) = split(path)?;
    let dir = open_dir(&dir_path)?;
    // Fail early, before making anything, if the name is taken by what we never replace.
    clear_stale(dir.as_raw_fd(), &name)?;
    let tmp = TempDir::new(&dir)?;
    let s = Socket::new(Domain::UNIX, Type::STREAM.nonblocking().cloexec(), None)?;
    s.bind(&proc_addr(tmp.fd.as_raw_fd(), Some("sock"))?)?;
    s.listen(128)?;
    // Inside the private directory: the name is the socket just bound, nobody can swap it.
    let made = lstat_at(tmp.fd.as_raw_fd(), &tmp.sock)?;
    if let Some(gid) = gid {
        // SAFETY: a NUL-terminated name; uid -1 leaves the owner.
        cvt(unsafe { libc::fchownat(tmp.fd.as_raw_fd(), tmp.sock.as_ptr(), u32::MAX, gid, libc::AT_SYMLINK_NOFOLLOW) })
            .map_err(|e| chown_error(e, gid))?;
    }
    if let Some(mode) = mode {
        // SAFETY: a NUL-terminated name.
        cvt(unsafe { libc::fchmodat(tmp.fd.as_raw_fd(), tmp.sock.as_ptr(), mode as libc::mode_t, 0) })?;
    }
    let st = lstat_at(tmp.fd.as_raw_fd(), &tmp.sock)?;
    if !is_sock(&st) {
        return Err(Error::other("the socket just bound is not there"));
    }
    let mut tries = 0;
    loop {
        // SAFETY: NUL-terminated names relative to two directory fds we hold.
        let r = unsafe {
            libc::renameat2(
                tmp.fd.as_raw_fd(),
                tmp.sock.as_ptr(),
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if r == 0 {
            break;
        }
        let mut e = Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINVAL) {
            // A file system without RENAME_NOREPLACE: a hard link never replaces either (the
            // private directory's name goes with it when the directory is removed).
            // SAFETY: as above; no flags, so no link in the old name is followed.
            let r = unsafe { libc::linkat(tmp.fd.as_raw_fd(), tmp.sock.as_ptr(), dir.as_raw_fd(), name.as_ptr(), 0) };
            if r == 0 {
                break;
            }
            e = Error::last_os_error();
        }
        tries += 1;
        if e.raw_os_error() != Some(libc::EEXIST) || tries > 3 {
            return Err(e);
        }
        // Taken since we looked: the same rules again.
        clear_stale(dir.as_raw_fd(), &name)?;
    }
    drop(tmp);
    let made = (made.st_mode & 0o7777, made.st_gid);
    let owned = OwnedSocket { dir, name, dev: st.st_dev, ino: st.st_ino, made, path: path.to_path_buf() };
    Ok((UnixListener::from(OwnedFd::from(s)), owned))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("pvs-sockpath-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn leftovers(d: &Path) -> Vec<String> {
        std::fs::read_dir(d)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(".pvswitchd-"))
            .collect()
    }

    #[test]
    fn binds_with_its_mode_and_removes_only_its_own() {
        let d = dir("own");
        let p = d.join("a.sock");
        let (l, owned) = bind(&p, Some(0o640), None).unwrap();
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.permissions().mode() & 0o777, 0o640);
        assert!(connect(&p).is_ok());
        // A stale socket of ours is replaced; a live one is refused.
        let e = bind(&p, None, None).unwrap_err();
        assert_eq!((e.kind(), e.to_string()), (ErrorKind::AddrInUse, LIVE.to_string()));
        // Someone else's socket now at the name: never removed. (Our listener is still open,
        // as pvswitchd's is when it removes its socket, so the inode number is not reused.)
        std::fs::remove_file(&p).unwrap();
        let other = UnixListener::bind(&p).unwrap();
        owned.remove();
        assert!(p.exists());
        drop((l, other));
        let (_l, owned) = bind(&p, None, None).unwrap();
        owned.remove();
        assert!(!p.exists());
        assert!(leftovers(&d).is_empty(), "{:?}", leftovers(&d));
    }

    /// A reload's new socket_mode reaches the bound socket, None restores what it was made
    /// with, and a link put in its place is never followed.
    #[test]
    fn perms_change_in_place_and_never_through_a_link() {
        let d = dir("perms");
        let p = d.join("a.sock");
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
        let (_l, owned) = bind(&p, None, None).unwrap();
        let made = mode(&p);
        owned.set_perms(Some(0o660), None).unwrap();
        assert_eq!(mode(&p), 0o660);
        owned.set_perms(None, None).unwrap();
        assert_eq!(mode(&p), made);
        let target = d.join("target");
        std::fs::write(&target, "x").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink(&target, &p).unwrap();
        let e = owned.set_perms(Some(0o666), None).unwrap_err();
        assert!(e.to_string().contains("no longer pvswitchd's socket"), "{e}");
        assert_eq!(mode(&target), 0o600);
    }

    #[test]
    fn never_follows_a_link() {
        let d = dir("link");
        let target = d.join("target");
        std::fs::write(&target, "x").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        let p = d.join("a.sock");
        std::os::unix::fs::symlink(&target, &p).unwrap();
        assert_eq!(bind(&p, Some(0o666), None).unwrap_err().to_string(), SYMLINK);
        assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o600);
        // A link to a live socket is not connected through.
        let live = d.join("live.sock");
        let _l = UnixListener::bind(&live).unwrap();
        let via = d.join("via.sock");
        std::os::unix::fs::symlink(&live, &via).unwrap();
        assert_eq!(connect(&via).unwrap_err().to_string(), SYMLINK);
        assert_eq!(connect(&target).unwrap_err().to_string(), NOT_A_SOCKET);
        assert!(leftovers(&d).is_empty());
    }
}
