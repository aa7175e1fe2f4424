//! Ports at run time, for orchestrators: `add-port`, `del-port` and `set-port`.
//!
//! A command's `KEY=VALUE` settings become the port's drop-in text (`config::dropin`),
//! checked by the same validator as a `[[port]]` of the file (same messages), written to the
//! drop-in directory, and applied by the path a reload takes (`Switch::apply_config`): other ports
//! never stop. The drop-in is written before the change is applied (and removed after a
//! port is), so what runs is at most one command ahead of what a restart will read.
//! Only ports of the drop-in directory are changed or removed this way; a port of the main
//! file is the operator's (edit the file and reload).

use std::path::{Component, Path};

use crate::config::dropin;
use crate::config::{PortConfig, PortDefaults};

use super::{Endpoints, Switch};

/// Why a port command was refused; nothing changed unless `Failed` says otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortCmdError {
    /// A port of that name exists (add-port without `--may-exist`).
    Exists(String),
    /// No port of that name (del-port without `--if-exists`, set-port, ports NAME).
    NotFound(String),
    /// A setting, or the request, is not valid; nothing changed.
    Invalid(String),
    /// It could not be done (or was applied only in part, as the message says).
    Failed(String),
}

impl std::fmt::Display for PortCmdError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            PortCmdError::Exists(m)
            | PortCmdError::NotFound(m)
            | PortCmdError::Invalid(m)
            | PortCmdError::Failed(m) => f.write_str(m),
        }
    }
}

use PortCmdError::{Exists, Failed, Invalid, NotFound};

impl Switch {
    /// `add-port NAME KEY=VALUE...`: a new port, kept in the drop-in directory.
    pub fn add_port_cmd(
        &mut self,
        ep: &mut dyn Endpoints,
        name: &str,
        settings: &[(String, String)],
        may_exist: bool,
    ) -> Result<String, PortCmdError> {
        let text = dropin::port_text(name, None, settings).map_err(|e| Invalid(format!("add-port {name}: {e}")))?;
        if let Some(i) = self.cfg.ports.iter().position(|p| p.name == name) {
            let p = &self.cfg.ports[i];
            let msg = format!("port \"{name}\" exists (in {})", self.origin_of(p));
            if !may_exist {
                return Err(Exists(msg));
            }
            // The same port only: an orchestrator's retry is answered "unchanged", but a port
            // of that name with another socket, mode, queues or MAC is someone else's.
            let mut others = self.cfg.clone();
            others.ports.remove(i);
            let asked =
                others.parse_port(&self.source_of(name, "add-port"), &text).map_err(|e| Invalid(e.to_string()))?;
            return match identity_differs(p, &asked) {
                None => Ok(format!("{msg}; unchanged")),
                Some(what) => Err(Exists(format!("{msg} with another {what}: not the port asked for"))),
            };
        }
        let source = self.source_of(name, "add-port");
        let mut port = self.cfg.parse_port(&source, &text).map_err(|e| Invalid(e.to_string()))?;
        runtime_socket(&self.cfg.defaults, &port).map_err(|e| Invalid(format!("add-port {name}: {e}")))?;
        port.origin = self.persist(name, &text)?;
        let kept = self.kept_note(&port);
        let mut new = self.cfg.clone();
        new.ports.push(port);
        self.apply_config(ep, new).map_err(|e| Failed(format!("add-port {name}: {e}")))?;
        Ok(format!("added port {name}{kept}"))
    }

    /// `del-port NAME`: removes a port added at run time and its drop-in.
    pub fn del_port_cmd(
        &mut self,
        ep: &mut dyn Endpoints,
        name: &str,
        if_exists: bool,
    ) -> Result<String, PortCmdError> {
        let Some(i) = self.cfg.ports.iter().position(|p| p.name == name) else {
            let msg = format!("no port \"{name}\"");
            return if if_exists { Ok(msg) } else { Err(NotFound(msg)) };
        };
        let origin = self.owned(&self.cfg.ports[i], "del-port")?;
        let mut new = self.cfg.clone();
        new.ports.remove(i);
        self.apply_config(ep, new).map_err(|e| Invalid(format!("del-port {name}: {e}")))?;
        if let (Some(_), Some(dir)) = (origin, &self.cfg.ports_dir) {
            dropin::remove(dir, name).map_err(|e| {
                Failed(format!("del-port {name}: removed, but its file stays (a restart brings it back): {e}"))
            })?;
        }
        Ok(format!("removed port {name}"))
    }

    /// `set-port NAME KEY=VALUE...`: changes settings of a port added at run time (`KEY=`
    /// returns one to its default), in place where a reload would, else by replacing it.
    pub fn set_port_cmd(
        &mut self,
        ep: &mut dyn Endpoints,
        name: &str,
        settings: &[(String, String)],
    ) -> Result<String, PortCmdError> {
        let Some(i) = self.cfg.ports.iter().position(|p| p.name == name) else {
            return Err(NotFound(format!("no port \"{name}\"")));
        };
        let base = match self.owned(&self.cfg.ports[i], "set-port")? {
            Some(path) => Some(std::fs::read_to_string(&path).map_err(|e| Failed(format!("set-port {name}: {e}")))?),
            None => None,
        };
        let text =
            dropin::port_text(name, base.as_deref(), settings).map_err(|e| Invalid(format!("set-port {name}: {e}")))?;
        let mut others = self.cfg.clone();
        others.ports.remove(i);
        let source = self.source_of(name, "set-port");
        let mut port = others.parse_port(&source, &text).map_err(|e| Invalid(e.to_string()))?;
        runtime_socket(&self.cfg.defaults, &port).map_err(|e| Invalid(format!("set-port {name}: {e}")))?;
        let replacing = self.cfg.ports[i].replacing_keys(&port);
        let changed = match replacing.is_empty() {
            true => self.cfg.ports[i].changed_settings(&port).join(", "),
            false => format!("replaced ({})", replacing.join(", ")),
        };
        port.origin = self.persist(name, &text)?;
        let mut new = self.cfg.clone();
        new.ports[i] = port;
        self.apply_config(ep, new).map_err(|e| Failed(format!("set-port {name}: {e}")))?;
        Ok(match changed.is_empty() {
            true => format!("port {name}: nothing changed"),
            false => format!("port {name}: {changed}"),
        })
    }

    /// Where a port is defined, for messages.
    fn origin_of(&self, p: &PortConfig) -> String {
        match (&p.origin, &self.config_path) {
            (Some(o), _) => o.display().to_string(),
            (None, Some(c)) => c.display().to_string(),
            (None, None) => "pvswitchd's configuration".into(),
        }
    }

    /// The name errors give the port's text: its drop-in's path, or the command.
    fn source_of(&self, name: &str, command: &str) -> String {
        match &self.cfg.ports_dir {
            Some(dir) => dropin::path_of(dir, name).display().to_string(),
            None => format!("{command} {name}"),
        }
    }

    fn kept_note(&self, p: &PortConfig) -> String {
        match &p.origin {
            Some(o) => format!(" (kept in {})", o.display()),
            None => " (not kept: pvswitchd runs without a configuration file)".into(),
        }
    }

    /// A port the commands may change: its drop-in (None: no directory, a port of a switch
    /// started without a file), or refused if the main file defines it.
    fn owned(&self, p: &PortConfig, command: &str) -> Result<Option<std::path::PathBuf>, PortCmdError> {
        match (&p.origin, &self.config_path) {
            (Some(o), _) => Ok(Some(o.clone())),
            (None, None) => Ok(None),
            (None, Some(c)) => Err(Invalid(format!(
                "{command} {}: the port is defined in {}, which is the operator's; change it there and reload",
                p.name,
                c.display()
            ))),
        }
    }

    /// Writes port `name`'s drop-in (if there is a directory): where it went.
    fn persist(&self, name: &str, text: &str) -> Result<Option<std::path::PathBuf>, PortCmdError> {
        match &self.cfg.ports_dir {
            Some(dir) => dropin::write(dir, name, text)
                .map(Some)
                .map_err(|e| Failed(format!("{name}: cannot write {}: {e}", dropin::path_of(dir, name).display()))),
            None => Ok(None),
        }
    }
}

/// What makes a port the one an orchestrator asked for (`add-port --may-exist`): its socket,
/// mode, queue count and allowed MACs and IPs; the first of them `b` changes, if any.
fn identity_differs(a: &PortConfig, b: &PortConfig) -> Option<&'static str> {
    match (a.vhost_user(), b.vhost_user()) {
        (Some(x), Some(y)) if x.socket != y.socket => Some("socket"),
        (Some(x), Some(y)) if x.mode != y.mode => Some("mode"),
        (Some(x), Some(y)) if x.queue_pairs != y.queue_pairs => Some("queue count"),
        (Some(_), Some(_)) if a.allowed_macs != b.allowed_macs => Some("allowed_macs"),
        (Some(_), Some(_)) => (a.allowed_ips != b.allowed_ips).then_some("allowed_ips"),
        _ => (a.endpoint != b.endpoint || a.allowed_macs != b.allowed_macs || a.allowed_ips != b.allowed_ips)
            .then_some("endpoint"),
    }
}

/// A socket a run-time port may use: with `socket_dir` set, inside it (no `..`) and through no
/// symbolic link below it (the socket's own name is checked when it is bound or connected).
fn runtime_socket(d: &PortDefaults, p: &PortConfig) -> Result<(), String> {
    let (Some(v), Some(dir)) = (p.vhost_user(), &d.socket_dir) else { return Ok(()) };
    let sock = &v.socket;
    if !sock.starts_with(dir) || sock.components().any(|c| c == Component::ParentDir) {
        return Err(format!("socket {} is outside socket_dir {}", sock.display(), dir.display()));
    }
    let mut at = dir.to_path_buf();
    let below = sock.strip_prefix(dir).unwrap_or(Path::new(""));
    let parts: Vec<_> = below.components().collect();
    for c in parts.iter().take(parts.len().saturating_sub(1)) {
        at.push(c);
        if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(format!(
                "socket {} passes through {}, a symbolic link; not followed",
                sock.display(),
                at.display()
            ));
        }
    }
    Ok(())
}

impl From<PortCmdError> for crate::proto::CtlError {
    fn from(e: PortCmdError) -> crate::proto::CtlError {
        use PortCmdError as E;
        let code = match &e {
            E::Exists(_) => Some(crate::proto::ErrorCode::Exists),
            E::NotFound(_) => Some(crate::proto::ErrorCode::NotFound),
            E::Invalid(_) => Some(crate::proto::ErrorCode::Invalid),
            E::Failed(_) => None,
        };
        crate::proto::CtlError { code, message: e.to_string() }
    }
}
