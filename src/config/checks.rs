//! The checks of a port against the rest of the configuration: its name, socket and device
//! unused by any other port, its queues' affinities among `poll_cores`, room for one more port.
//! `Config::parse` runs them on each port against those before it; a port added at run time
//! runs them against the running configuration.

use std::path::PathBuf;

use super::Config;
use super::error::{ConfigError, Ctx};
use super::port::{Located, PortConfig};

/// Why a port, valid on its own, cannot join a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortClash {
    /// Another port has this name.
    Name(String),
    /// Another vhost-user port has this socket path.
    Socket(PathBuf),
    /// Another dpdk port has this device (its name, up to the first comma).
    Device(String),
    /// A queue of the port is pinned to a CPU that is not a poll core.
    Affinity { port: String, core: usize, poll_cores: Vec<usize> },
    /// The configuration has `max_ports` ports already (the limit).
    Full(usize),
    /// The port names a security group the configuration does not have.
    SecurityGroup { port: String, group: String },
}

impl std::fmt::Display for PortClash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortClash::Name(name) => write!(f, "duplicate port name \"{name}\""),
            PortClash::Socket(path) => write!(f, "duplicate socket path {}", path.display()),
            PortClash::Device(name) => write!(f, "duplicate device \"{name}\""),
            PortClash::Affinity { port, core, poll_cores } => {
                write!(f, "port {port}: affinity {core} is not one of poll_cores {poll_cores:?}")
            }
            PortClash::Full(n) => write!(f, "at most {n} ports (max_ports)"),
            PortClash::SecurityGroup { port, group } => {
                write!(f, "port {port}: security_groups: no [[security_group]] named \"{group}\"")
            }
        }
    }
}

impl std::error::Error for PortClash {}

impl Config {
    /// Whether `port` can join this configuration's ports: no name, socket or device of
    /// theirs, every affinity one of `poll_cores`, fewer than `max_ports` ports.
    pub fn check_port(&self, port: &PortConfig) -> Result<(), PortClash> {
        if self.ports.len() >= self.max_ports {
            return Err(PortClash::Full(self.max_ports));
        }
        if self.ports.iter().any(|p| p.name == port.name) {
            return Err(PortClash::Name(port.name.clone()));
        }
        if let Some(v) = port.vhost_user()
            && self.ports.iter().filter_map(|p| p.vhost_user()).any(|o| o.socket == v.socket)
        {
            return Err(PortClash::Socket(v.socket.clone()));
        }
        if let Some(d) = port.dpdk()
            && self.ports.iter().filter_map(|p| p.dpdk()).any(|o| o.device_name() == d.device_name())
        {
            return Err(PortClash::Device(d.device_name().to_string()));
        }
        if let Some(core) = port.queue_cfg.iter().filter_map(|q| q.affinity).find(|a| !self.poll_cores.contains(a)) {
            let poll_cores = self.poll_cores.clone();
            return Err(PortClash::Affinity { port: port.name.clone(), core, poll_cores });
        }
        if let Some(g) = port.security_groups.iter().find(|g| !self.security_groups.iter().any(|s| &s.name == *g)) {
            return Err(PortClash::SecurityGroup { port: port.name.clone(), group: g.clone() });
        }
        Ok(())
    }

    /// One port's keys as TOML text (see `PortConfig::parse_one`) with this configuration's
    /// defaults, checked against its ports (`check_port`): what a control request adding a port
    /// needs. Errors name `source` and a line and column of `text`.
    pub fn parse_port(&self, source: &str, text: &str) -> Result<PortConfig, ConfigError> {
        let cx = Ctx { file: source, text };
        let port = super::port::read_one(&cx, &self.defaults)?;
        self.check_runtime(&port, &cx)?;
        self.check_port(&port.config).map_err(|c| clash_error(&c, &port, &cx))?;
        Ok(port.config)
    }

    /// What a port that is not the main file's (added at run time, or read from the port
    /// directory) may not do that the operator's own may: use a DPDK device the main file does
    /// not grant (`DpdkConfig::runtime_device`).
    fn check_runtime(&self, port: &Located, cx: &Ctx) -> Result<(), ConfigError> {
        match port.config.dpdk() {
            Some(d) => self.dpdk.runtime_device(&d.device).map_err(|m| cx.err(port.device.clone(), m)),
            None => Ok(()),
        }
    }

    /// A drop-in (`dropin.rs`): `parse_port`, and the file must be named after its port; a
    /// name the main file defines too is the main file's.
    pub(crate) fn parse_dropin(&self, d: &super::dropin::DropIn) -> Result<PortConfig, ConfigError> {
        let file = d.path.display().to_string();
        let cx = Ctx { file: &file, text: &d.text };
        let mut port = super::port::read_one(&cx, &self.defaults)?;
        let stem = d.path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if stem != port.config.name {
            let msg = format!(
                "port \"{}\" in a file named {stem}.toml: the file must be {}.toml",
                port.config.name, port.config.name
            );
            return Err(cx.err(Some(port.name.clone()), msg));
        }
        if let Some(other) = self.ports.iter().find(|p| p.name == port.config.name) {
            let there = other.origin.as_ref().map_or("the main file".to_string(), |o| o.display().to_string());
            let msg =
                format!("port \"{}\" is defined in {there} too, whose definition is used; remove one", other.name);
            return Err(cx.err(Some(port.name.clone()), msg));
        }
        self.check_runtime(&port, &cx)?;
        self.check_port(&port.config).map_err(|c| clash_error(&c, &port, &cx))?;
        port.config.origin = Some(d.path.clone());
        Ok(port.config)
    }
}

/// A clash positioned at the key it is about: the name, socket or device (the name for an
/// affinity, which may come from the port or one of its queues; the text's start when full).
pub(super) fn clash_error(clash: &PortClash, port: &Located, cx: &Ctx) -> ConfigError {
    let span = match clash {
        PortClash::Name(_) | PortClash::Affinity { .. } | PortClash::SecurityGroup { .. } => Some(port.name.clone()),
        PortClash::Socket(_) => port.socket.clone(),
        PortClash::Device(_) => port.device.clone(),
        PortClash::Full(_) => None,
    };
    cx.err(span, clash.to_string())
}
