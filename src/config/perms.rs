//! Socket permissions, from `[switch]`: `control_socket_mode` for the control socket,
//! `socket_mode` and `socket_group` for every server-mode vhost-user socket.

use toml::Spanned;

use super::error::{ConfigError, Ctx};
use super::raw::RawSwitch;

/// The control socket's mode when the file does not say.
const DEFAULT_CONTROL_SOCKET_MODE: u32 = 0o660;

/// File mode and group of a server-mode socket (None: as created, by the umask, owned by root).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SocketPerms {
    pub mode: Option<u32>,
    pub gid: Option<u32>,
}

/// The control socket's mode, and the permissions of the ports' sockets.
pub(super) fn validate(sw: &RawSwitch, cx: &Ctx) -> Result<(u32, SocketPerms), ConfigError> {
    let control_socket_mode = match &sw.control_socket_mode {
        Some(m) => octal(m, "control_socket_mode", cx)?,
        None => DEFAULT_CONTROL_SOCKET_MODE,
    };
    let mode = sw.socket_mode.as_ref().map(|m| octal(m, "socket_mode", cx)).transpose()?;
    let gid = match &sw.socket_group {
        Some(g) => Some(group_id(g.get_ref()).ok_or_else(|| {
            cx.err(Some(g.span()), format!("socket_group: no group \"{}\" in /etc/group", g.get_ref()))
        })?),
        None => None,
    };
    Ok((control_socket_mode, SocketPerms { mode, gid }))
}

/// `"0660"` (or `"0o660"`, `"660"`): a file mode of at most 0777.
fn octal(m: &Spanned<String>, name: &str, cx: &Ctx) -> Result<u32, ConfigError> {
    u32::from_str_radix(m.get_ref().trim_start_matches("0o"), 8)
        .ok()
        .filter(|v| *v <= 0o777)
        .ok_or_else(|| cx.err(Some(m.span()), format!("{name}: expected an octal mode such as \"0660\"")))
}

/// A group's id from its name (or a number), as /etc/group lists it.
fn group_id(name: &str) -> Option<u32> {
    if let Ok(n) = name.parse() {
        return Some(n);
    }
    let groups = std::fs::read_to_string("/etc/group").ok()?;
    groups.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then(|| f.nth(1)?.parse().ok()).flatten()
    })
}
