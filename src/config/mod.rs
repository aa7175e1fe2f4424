//! The configuration file: TOML, read with serde. Every error names file, line and column.
//!
//! ```toml
//! [switch]
//! poll_cores = [1]
//! control_socket = "/run/pvswitch/pvswitchd.sock"
//!
//! [[port]]
//! name = "vm1"
//! type = "vhost-user"
//! socket = "/run/pvswitch/vm1.sock"
//! mode = "server"
//! queues = 1
//! ```
//!
//! Read in two layers: serde reads the text into the raw structs (`raw.rs`: every value
//! spanned, unknown keys refused), then one validator per section turns its raw section into
//! the typed one, or a `ConfigError` at the offending key (`error.rs` has the position
//! context): `switch.rs` (`[switch]`, and the `PortDefaults` ports inherit from it), `perms.rs`
//! (socket permissions), `port.rs` (a `[[port]]`, with `endpoint.rs` for its type's keys and
//! `queue.rs` for its receive queues, `tenant.rs` for its VLANs and rate caps), `vtep.rs` (`[[vtep]]`: VXLAN
//! tunnel endpoints, each remote endpoint a port of type "vxlan"), `flows.rs` (the `flows`
//! array), `dpdk.rs` (`[dpdk]`), `secgroup.rs` (`[[security_group]]`), `mirror.rs`
//! (`[[mirror]]`), `vrf.rs` (`[[vrf]]`).
//! What involves more than one port or section (names, sockets and devices used once,
//! affinities among the poll cores) is `checks.rs`. A port added at run time goes through the
//! same port validator and checks (`Config::parse_port`).

#![forbid(unsafe_code)]

mod checks;
mod dpdk;
pub mod dropin;
mod endpoint;
mod error;
mod flows;
pub mod ipfix;
pub mod ips;
pub mod mirror;
mod perms;
mod port;
mod queue;
mod raw;
pub mod secgroup;
mod switch;
mod tenant;
pub mod vlan;
pub mod vrf;
mod vtep;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use checks::PortClash;
pub use dpdk::{DEFAULT_MBUFS, DEFAULT_NIC_POLL_INTERVAL_US, DEFAULT_NIC_POLL_MAX_US, DpdkConfig};
pub use endpoint::{DpdkPortConfig, Endpoint, MAX_QUEUE_PAIRS, SocketMode, VhostUserConfig, VxlanConfig};
pub use error::ConfigError;
use error::Ctx;
pub use flows::FlowSource;
pub use ipfix::IpfixConfig;
pub use mirror::MirrorConfig;
pub use perms::SocketPerms;
pub use port::PortConfig;
pub use queue::QueueConfig;
use raw::RawConfig;
pub use secgroup::SecurityGroup;
pub use switch::{
    DEFAULT_CONTROL_SOCKET, DEFAULT_IDLE_BEFORE_SLEEP_US, DEFAULT_MAC_LIMIT, DEFAULT_MAX_GUEST_MEMORY_MIB,
    DEFAULT_MAX_TOTAL_GUEST_MEMORY_MIB, DEFAULT_PARK_AFTER_US, DEFAULT_PARK_CHECK_US, DEFAULT_RX_RETRY_US,
    DEFAULT_WEIGHT_BYTES, DEFAULT_WEIGHT_PACKETS, MAX_BURST, PollMode, PortDefaults, RxqAssign,
};
pub use tenant::{DEFAULT_RATE_BURST_MS, RateCaps};
pub use vrf::{Gateway6, VrfConfig};
pub use vtep::{Remotes, VniConfig, VtepConfig};

pub use crate::mem::MemLimits;

/// Most ports one switch holds (per-thread counter arrays are sized by it).
pub const MAX_PORTS: usize = 1024;
/// Most regions of one memory table (`max_memory_regions`): the most one SET_MEM_TABLE carries
/// (VHOST_MEMORY_BASELINE_NREGIONS; pvswitchd does not offer CONFIGURE_MEM_SLOTS).
pub const MAX_MEMORY_REGIONS: u32 = 8;

#[derive(Debug, Clone)]
pub struct Config {
    pub poll_cores: Vec<usize>,
    pub control_socket: PathBuf,
    pub control_socket_mode: u32,
    pub burst: u32,
    /// How long frames may wait for room in a full guest RX ring before being dropped.
    pub rx_retry_us: u32,
    /// Where the Prometheus endpoint listens, if anywhere.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// How `rebalance` assigns receive queues to poll threads.
    pub rxq_assign: RxqAssign,
    /// A poll thread with pinned queues (affinity) polls nothing else.
    pub rxq_isolate: bool,
    /// Rebalance on its own every `rebalance_interval_s` when a poll thread was busier than
    /// `rebalance_threshold_pct` and the new placement improves the spread of load between
    /// threads by at least `rebalance_improvement_pct`.
    pub auto_rebalance: bool,
    pub rebalance_interval_s: u32,
    pub rebalance_threshold_pct: u32,
    pub rebalance_improvement_pct: u32,
    /// Busy polling, or adaptive (sleep on guest kicks when idle), globally...
    pub poll_mode: PollMode,
    /// ... and per poll core.
    pub core_poll_mode: HashMap<usize, PollMode>,
    /// Adaptive mode: a thread sleeps after this long without frames on any of its queues.
    pub idle_before_sleep_us: u32,
    /// A guest queue empty this long is parked: no longer polled, its kicks watched (0: never)...
    pub park_after_us: u32,
    /// ... and the parked queues' kicks are looked at this often.
    pub park_check_us: u32,
    /// Address space every guest memory mapping of the process together may take, in MiB.
    pub max_total_guest_memory_mib: u32,
    /// What every port takes from `[switch]` when it does not say.
    pub defaults: PortDefaults,
    pub ports: Vec<PortConfig>,
    /// Where ports added at run time are kept (`dropin.rs`; None: not kept).
    pub ports_dir: Option<PathBuf>,
    /// At most this many ports, the file's and the drop-ins' together (at most `MAX_PORTS`).
    pub max_ports: usize,
    /// The drop-ins that failed, each alone (the other ports load).
    pub dropin_errors: Vec<ConfigError>,
    pub flows: Vec<FlowSource>,
    pub dpdk: DpdkConfig,
    /// VXLAN tunnel endpoints (`[[vtep]]`); their tunnel ports are among `ports`.
    pub vteps: Vec<VtepConfig>,
    /// `[[security_group]]`s, by name; ports attach them (`PortConfig::security_groups`).
    pub security_groups: Vec<SecurityGroup>,
    /// Connection tracking's limits: every port's connections, and each port's.
    pub ct_max_connections: u32,
    pub ct_max_per_port: u32,
    /// `[[mirror]]`s: copies of chosen frames to a port that receives nothing else.
    pub mirrors: Vec<MirrorConfig>,
    /// `[ipfix]`: flow export to a collector (None: none).
    pub ipfix: Option<IpfixConfig>,
    /// `[[vrf]]`s: tenants' networks routed between on this host, through anycast gateways.
    pub vrfs: Vec<VrfConfig>,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: 0,
            col: 0,
            message: format!("cannot read: {e}"),
            snippet: String::new(),
        })?;
        let mut config = Config::parse_main(&file, &text)?;
        let base = path.parent().unwrap_or(Path::new("."));
        let dir = base.join(config.ports_dir.take().unwrap_or_else(|| "ports.d".into()));
        let (dropins, errors) = dropin::read_dir(&dir);
        config.dropin_errors = errors;
        config.ports_dir = Some(dir);
        for d in &dropins {
            match config.parse_dropin(d) {
                Ok(p) => config.ports.push(p),
                Err(e) => config.dropin_errors.push(e),
            }
        }
        config.finish(&file, &text)
    }

    /// The sections in order: `[switch]` first (ports inherit from it), `[dpdk]`, each
    /// port checked against those before it, then VTEPs and flows against the ports.
    pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
        Config::parse_main(file, text)?.finish(file, text)
    }

    /// `[switch]` and the file's ports.
    fn parse_main(file: &str, text: &str) -> Result<Config, ConfigError> {
        let cx = Ctx { file, text };
        let raw: RawConfig = raw::read(&cx)?;
        let mut config = switch::validate(raw.switch.unwrap_or_default(), &cx)?;
        // Before the ports: which devices the port directory's may use is the main file's say.
        config.dpdk = dpdk::validate(raw.dpdk, &cx)?;
        // Before the ports too: each names the groups it is in.
        config.security_groups = secgroup::validate(raw.security_group, &cx)?;
        config.ipfix = ipfix::validate(raw.ipfix, &cx)?;
        if raw.port.len() > config.max_ports {
            return Err(cx.err(None, format!("{} ports: at most {} (max_ports)", raw.port.len(), config.max_ports)));
        }
        for p in raw.port {
            let port = port::validate(p, &config.defaults, &cx)?;
            config.check_port(&port.config).map_err(|c| checks::clash_error(&c, &port, &cx))?;
            config.ports.push(port.config);
        }
        Ok(config)
    }

    /// The file's VTEPs and flows (against every port, the drop-ins' too).
    fn finish(mut self, file: &str, text: &str) -> Result<Config, ConfigError> {
        let cx = Ctx { file, text };
        let raw: RawConfig = raw::read(&cx)?;
        self.vteps = vtep::validate(raw.vtep, &self.ports, &cx)?;
        self.set_remotes(&Remotes::new());
        self.mirrors = mirror::validate(&raw.mirror, &cx)?;
        self.vrfs = vrf::validate(&raw.vrf, &cx)?;
        for (m, r) in self.mirrors.iter().zip(&raw.mirror) {
            let out = &m.output_port;
            let tunnel = self.ports.iter().any(|p| &p.name == out && p.vxlan().is_some());
            if tunnel || self.vteps.iter().any(|v| &v.underlay == out) {
                let what = if tunnel { "a tunnel port" } else { "a VTEP's underlay" };
                let msg = format!("output_port: \"{out}\" is {what}: a mirror's output is a vhost-user or dpdk port");
                return Err(cx.err(Some(r.output_port.span()), msg));
            }
        }
        // Ports no flow may name: the VTEPs' underlays, the mirrors' outputs.
        let underlays = self.vteps.iter().map(|v| {
            let why = format!(
                "vtep \"{0}\"'s underlay: it carries only the VTEP's encapsulated frames (name a tunnel port, \
                 {0}-ADDRESS)",
                v.name
            );
            (v.underlay.as_str(), why)
        });
        let outputs = self.mirrors.iter().map(|m| {
            (m.output_port.as_str(), format!("mirror \"{}\"'s output: it receives the mirror's copies only", m.name))
        });
        let reserved: Vec<(&str, String)> = underlays.chain(outputs).collect();
        self.flows = flows::validate(raw.flows, &self.ports, &reserved, &cx)?;
        Ok(self)
    }

    /// Makes the tunnel ports again: the file's remotes and `learned` (EVPN's), each a port.
    pub fn set_remotes(&mut self, learned: &Remotes) {
        self.ports.retain(|p| p.vxlan().is_none());
        let mut tunnels = Vec::new();
        for v in &self.vteps {
            let taken = |n: &str| self.ports.iter().any(|p| p.name == n);
            tunnels.extend(v.tunnel_ports(learned.get(&v.name), &self.defaults, &taken));
        }
        self.ports.extend(tunnels);
    }

    /// How long the poll thread on `core` polls without frames before it sleeps (None: never).
    pub fn sleep_after_us(&self, core: usize) -> Option<u32> {
        let mode = self.core_poll_mode.get(&core).copied().unwrap_or(self.poll_mode);
        (mode == PollMode::Adaptive).then_some(self.idle_before_sleep_us)
    }
}

#[cfg(test)]
mod tests;
