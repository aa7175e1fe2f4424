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

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

pub use crate::mem::MemLimits;
use crate::wire::MacAddr;

pub const DEFAULT_CONTROL_SOCKET: &str = "/run/pvswitch/pvswitchd.sock";
/// Linux vhost-net's VHOST_NET_PKT_WEIGHT and VHOST_NET_WEIGHT.
pub const DEFAULT_WEIGHT_PACKETS: u32 = 256;
pub const DEFAULT_WEIGHT_BYTES: u32 = 512 * 1024;
pub const MAX_BURST: u32 = 32;
/// Frames wait this long for a full guest RX ring (backpressure to the sender), then drop.
pub const DEFAULT_RX_RETRY_US: u32 = 100;
/// Most queue pairs one port may have (Linux virtio-net's limit is 256; DPDK vhost's 128).
pub const MAX_QUEUE_PAIRS: u16 = 64;
/// Most ports one switch holds (per-thread counter arrays are sized by it).
pub const MAX_PORTS: usize = 1024;
/// Source MACs one port may have learned at a time (`mac_limit`).
pub const DEFAULT_MAC_LIMIT: u32 = 1024;
/// Guest memory one port's frontend may map into pvswitchd (`max_guest_memory_mib`): 64 GiB.
pub const DEFAULT_MAX_GUEST_MEMORY_MIB: u32 = 64 * 1024;
/// Guest memory address space all ports' frontends together may map into pvswitchd
/// (`max_total_guest_memory_mib`): 64 TiB, half of x86-64's user address space.
pub const DEFAULT_MAX_TOTAL_GUEST_MEMORY_MIB: u32 = (crate::mem::guest::DEFAULT_MAX_TOTAL_BYTES >> 20) as u32;
/// Most regions of one memory table (`max_memory_regions`): the most one SET_MEM_TABLE carries
/// (VHOST_MEMORY_BASELINE_NREGIONS; pvswitchd does not offer CONFIGURE_MEM_SLOTS).
pub const MAX_MEMORY_REGIONS: u32 = 8;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    switch: Option<RawSwitch>,
    #[serde(default)]
    port: Vec<RawPort>,
    #[serde(default)]
    flows: Vec<Spanned<String>>,
    dpdk: Option<RawDpdk>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDpdk {
    eal_args: Option<Vec<String>>,
    mbufs: Option<Spanned<u32>>,
    nic_poll_interval_us: Option<Spanned<u32>>,
}

/// `poll_cores = [1, 2]` or `poll_cores = "auto"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawCores {
    List(Vec<usize>),
    Word(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQueue {
    index: Spanned<u16>,
    weight_packets: Option<Spanned<u32>>,
    weight_bytes: Option<Spanned<u32>>,
    affinity: Option<Spanned<usize>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSwitch {
    poll_cores: Option<Spanned<RawCores>>,
    poll_cores_per_node: Option<Spanned<u32>>,
    rxq_assign: Option<Spanned<String>>,
    rxq_isolate: Option<bool>,
    auto_rebalance: Option<bool>,
    rebalance_interval_s: Option<Spanned<u32>>,
    rebalance_threshold_pct: Option<Spanned<u32>>,
    rebalance_improvement_pct: Option<Spanned<u32>>,
    control_socket: Option<String>,
    control_socket_mode: Option<Spanned<String>>,
    socket_mode: Option<Spanned<String>>,
    socket_group: Option<Spanned<String>>,
    socket_dir: Option<String>,
    weight_packets: Option<Spanned<u32>>,
    weight_bytes: Option<Spanned<u32>>,
    burst: Option<Spanned<u32>>,
    rx_retry_us: Option<Spanned<u32>>,
    metrics_listen: Option<Spanned<String>>,
    poll_mode: Option<Spanned<String>>,
    idle_before_sleep_us: Option<Spanned<u32>>,
    core_poll_mode: Option<Spanned<HashMap<String, String>>>,
    mac_limit: Option<Spanned<u32>>,
    max_guest_memory_mib: Option<Spanned<u32>>,
    max_memory_regions: Option<Spanned<u32>>,
    max_total_guest_memory_mib: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPort {
    name: Spanned<String>,
    #[serde(rename = "type")]
    kind: Spanned<String>,
    socket: Option<Spanned<String>>,
    device: Option<Spanned<String>>,
    rx_queues: Option<Spanned<u16>>,
    tx_queues: Option<Spanned<u16>>,
    rx_ring: Option<Spanned<u16>>,
    tx_ring: Option<Spanned<u16>>,
    #[serde(default)]
    mode: Option<Spanned<String>>,
    queues: Option<Spanned<u16>>,
    mtu: Option<Spanned<u32>>,
    weight_packets: Option<Spanned<u32>>,
    weight_bytes: Option<Spanned<u32>>,
    #[serde(default)]
    allowed_macs: Vec<Spanned<String>>,
    mac_limit: Option<Spanned<u32>>,
    max_guest_memory_mib: Option<Spanned<u32>>,
    max_memory_regions: Option<Spanned<u32>>,
    /// Checksum and segmentation offloads: offered to the guest (vhost-user), or used on the
    /// device where it has them (dpdk). Default on.
    offloads: Option<Spanned<bool>>,
    /// Pin every queue of the port to this poll core.
    affinity: Option<Spanned<usize>>,
    /// Per-queue overrides: `[[port.queue]] index = 0, weight_packets = 64, affinity = 2`.
    #[serde(default)]
    queue: Vec<RawQueue>,
}

/// How unpinned queues are spread over threads (`rxq_assign`); see `switch::placement`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RxqAssign {
    /// `"roundrobin"`: queues by id, dealt in turn; loads ignored.
    RoundRobin,
    /// `"cycles"`: queues by load descending, dealt ascending-then-descending (OVS's default).
    #[default]
    Cycles,
    /// `"group"`: queues by load descending, each to the least loaded thread.
    Group,
}

impl std::str::FromStr for RxqAssign {
    type Err = String;

    /// Parses the configuration spelling: `roundrobin`, `cycles` or `group`.
    fn from_str(s: &str) -> Result<RxqAssign, String> {
        match s {
            "roundrobin" => Ok(RxqAssign::RoundRobin),
            "cycles" => Ok(RxqAssign::Cycles),
            "group" => Ok(RxqAssign::Group),
            _ => Err(format!("rxq_assign: expected \"roundrobin\", \"cycles\" or \"group\", not {s:?}")),
        }
    }
}

impl std::fmt::Display for RxqAssign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RxqAssign::RoundRobin => "roundrobin",
            RxqAssign::Cycles => "cycles",
            RxqAssign::Group => "group",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    Busy,
    Adaptive,
}

pub const DEFAULT_IDLE_BEFORE_SLEEP_US: u32 = 1000;

impl Config {
    /// How long the poll thread on `core` polls without frames before it sleeps (None: never).
    pub fn sleep_after_us(&self, core: usize) -> Option<u32> {
        let mode = self.core_poll_mode.get(&core).copied().unwrap_or(self.poll_mode);
        (mode == PollMode::Adaptive).then_some(self.idle_before_sleep_us)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketMode {
    /// pvswitchd listens; the VMM connects (QEMU `-chardev socket,path=...`).
    Server,
    /// The VMM listens; pvswitchd connects and reconnects with backoff.
    Client,
}

/// A `type = "dpdk"` port: a NIC or DPDK vdev.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpdkPortConfig {
    /// PCI address or vdev string (`net_ring0`, `net_af_packet0,iface=veth0`, ...).
    pub device: String,
    pub rx_queues: u16,
    /// None: one per poll thread (as many as the driver allows).
    pub tx_queues: Option<u16>,
    pub rx_ring: u16,
    pub tx_ring: u16,
    /// Use the device's checksum and TSO offloads where it has them, for frames that ask for
    /// them (default on); off: pvswitchd completes checksums and segments in software.
    pub offloads: bool,
}

/// The `[dpdk]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpdkConfig {
    /// Extra EAL arguments; None: pvswitchd picks them (see `nic::eal_args`).
    pub eal_args: Option<Vec<String>>,
    /// Mbufs per pool (one pool per NUMA socket used).
    pub mbufs: u32,
    /// Adaptive polling: a thread with NIC queues sleeps at most this long.
    pub nic_poll_interval_us: u32,
}

pub const DEFAULT_MBUFS: u32 = 16383;
pub const DEFAULT_NIC_POLL_INTERVAL_US: u32 = 100;

impl Default for DpdkConfig {
    fn default() -> Self {
        DpdkConfig { eal_args: None, mbufs: DEFAULT_MBUFS, nic_poll_interval_us: DEFAULT_NIC_POLL_INTERVAL_US }
    }
}

/// A `type = "vhost-user"` port: a VM's virtio-net device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VhostUserConfig {
    pub socket: PathBuf,
    pub mode: SocketMode,
    pub queue_pairs: u16,
    /// Server mode: file mode and group given to the socket once bound (`[switch]
    /// socket_mode`, `socket_group`), so a VMM running as another user can connect.
    pub socket_perms: SocketPerms,
    /// Offer checksum and TCP segmentation offloads (CSUM, GUEST_CSUM, HOST/GUEST_TSO4/6,
    /// HOST/GUEST_ECN). Applies from the next connection.
    pub offloads: bool,
}

/// File mode and group of a server-mode socket (None: as created, by the umask, owned by root).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SocketPerms {
    pub mode: Option<u32>,
    pub gid: Option<u32>,
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

/// What a port connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    VhostUser(VhostUserConfig),
    Dpdk(DpdkPortConfig),
}

#[derive(Debug, Clone)]
pub struct PortConfig {
    pub name: String,
    pub endpoint: Endpoint,
    pub mtu: u32,
    /// Visit budget of each of this port's receive queues (deficit round robin quanta).
    pub weight_packets: u32,
    pub weight_bytes: u32,
    /// Port security: source MACs this port may send from (empty: any).
    pub allowed_macs: Vec<MacAddr>,
    /// Most source MACs the port may have learned at a time.
    pub mac_limit: u32,
    /// What a vhost-user frontend may map: total bytes and regions of one memory table.
    pub mem_limits: MemLimits,
    /// Per queue pair: (weight_packets, weight_bytes, pinned poll core).
    pub queue_cfg: Vec<QueueConfig>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    pub weight_packets: u32,
    pub weight_bytes: u32,
    pub affinity: Option<usize>,
}

impl PortConfig {
    /// Whether `other` can be applied to a running port in place (only MTU, weights and port
    /// security differ); otherwise a reload replaces the port.
    pub fn same_endpoint(&self, other: &PortConfig) -> bool {
        self.endpoint == other.endpoint
    }

    pub fn vhost_user(&self) -> Option<&VhostUserConfig> {
        match &self.endpoint {
            Endpoint::VhostUser(v) => Some(v),
            Endpoint::Dpdk(_) => None,
        }
    }

    pub fn dpdk(&self) -> Option<&DpdkPortConfig> {
        match &self.endpoint {
            Endpoint::Dpdk(d) => Some(d),
            Endpoint::VhostUser(_) => None,
        }
    }

    /// The port's `type` as the configuration file names it.
    pub fn type_name(&self) -> &'static str {
        match self.endpoint {
            Endpoint::VhostUser(_) => "vhost-user",
            Endpoint::Dpdk(_) => "dpdk",
        }
    }
}

/// One entry of the top-level `flows` array: the text and where it starts in the file.
#[derive(Debug, Clone)]
pub struct FlowSource {
    pub text: String,
    /// Byte offset of the text's first character in the file (inside the quotes).
    pub offset: usize,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub poll_cores: Vec<usize>,
    pub control_socket: PathBuf,
    pub control_socket_mode: u32,
    pub weight_packets: u32,
    pub weight_bytes: u32,
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
    /// Address space every guest memory mapping of the process together may take, in MiB.
    pub max_total_guest_memory_mib: u32,
    pub ports: Vec<PortConfig>,
    pub flows: Vec<FlowSource>,
    pub dpdk: DpdkConfig,
}

/// A config error with its position, printed as `file:line:col: message` plus the line.
#[derive(Debug)]
pub struct ConfigError {
    pub file: String,
    pub line: usize,
    pub col: usize,
    pub message: String,
    pub snippet: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file, self.line, self.col, self.message)?;
        if !self.snippet.is_empty() {
            write!(f, "\n  | {}\n  | {}^", self.snippet, " ".repeat(self.col.saturating_sub(1)))?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

struct Ctx<'a> {
    file: &'a str,
    text: &'a str,
}

impl Ctx<'_> {
    fn err(&self, span: Option<Range<usize>>, message: impl Into<String>) -> ConfigError {
        let off = span.map(|s| s.start).unwrap_or(0).min(self.text.len());
        let before = &self.text[..off];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
        let col = self.text[line_start..off].chars().count() + 1;
        let snippet = self.text[line_start..].lines().next().unwrap_or("").to_string();
        ConfigError { file: self.file.to_string(), line, col, message: message.into(), snippet }
    }
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
        Config::parse(&file, &text)
    }

    pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
        let cx = Ctx { file, text };
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let mut msg = e.message().trim().to_string();
            if msg.starts_with("unknown field `flows`") {
                msg.push_str(" (in TOML, top-level keys such as `flows` must come before the first [table])");
            }
            cx.err(e.span(), msg)
        })?;
        let sw = raw.switch.unwrap_or_default();
        let ncpu = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let range = |v: Option<Spanned<u32>>, name: &str, lo: u32, hi: u32, dflt: u32| -> Result<u32, ConfigError> {
            match v {
                None => Ok(dflt),
                Some(s) if (lo..=hi).contains(s.get_ref()) => Ok(*s.get_ref()),
                Some(s) => Err(cx.err(Some(s.span()), format!("{name}: expected a value from {lo} to {hi}"))),
            }
        };
        let per_node = range(sw.poll_cores_per_node, "poll_cores_per_node", 1, 1024, 1)?;
        let poll_cores = match sw.poll_cores {
            Some(pc) => {
                let span = pc.span();
                match pc.into_inner() {
                    RawCores::Word(w) if w == "auto" => {
                        let cores = crate::topology::Numa::discover().auto_cores(per_node as usize, &[]);
                        if cores.is_empty() {
                            return Err(cx.err(Some(span), "poll_cores = \"auto\": hwloc found no usable CPU"));
                        }
                        cores
                    }
                    RawCores::Word(w) => {
                        return Err(cx.err(
                            Some(span),
                            format!("poll_cores: expected a list of CPU ids or \"auto\", found \"{w}\""),
                        ));
                    }
                    RawCores::List(l) => {
                        if l.is_empty() {
                            return Err(cx.err(Some(span), "poll_cores: expected at least one CPU id"));
                        }
                        let mut seen = Vec::new();
                        for &c in &l {
                            if seen.contains(&c) {
                                return Err(cx.err(Some(span), format!("poll_cores: CPU {c} listed twice")));
                            }
                            seen.push(c);
                        }
                        l
                    }
                }
            }
            None => vec![ncpu.saturating_sub(1)],
        };
        let rxq_assign = match &sw.rxq_assign {
            None => RxqAssign::RoundRobin,
            Some(s) => s.get_ref().parse().map_err(|e: String| cx.err(Some(s.span()), format!("rxq_assign: {e}")))?,
        };
        let rebalance_interval_s = range(sw.rebalance_interval_s, "rebalance_interval_s", 1, 86400, 60)?;
        let rebalance_threshold_pct = range(sw.rebalance_threshold_pct, "rebalance_threshold_pct", 1, 100, 95)?;
        let rebalance_improvement_pct = range(sw.rebalance_improvement_pct, "rebalance_improvement_pct", 1, 100, 25)?;
        let socket_dir = sw.socket_dir.map(PathBuf::from);
        let resolve = |s: &str| -> PathBuf {
            let p = PathBuf::from(s);
            match (&socket_dir, p.is_relative()) {
                (Some(d), true) => d.join(p),
                _ => p,
            }
        };
        let octal = |m: &Spanned<String>, name: &str| {
            u32::from_str_radix(m.get_ref().trim_start_matches("0o"), 8)
                .ok()
                .filter(|v| *v <= 0o777)
                .ok_or_else(|| cx.err(Some(m.span()), format!("{name}: expected an octal mode such as \"0660\"")))
        };
        let control_socket_mode = match &sw.control_socket_mode {
            Some(m) => octal(m, "control_socket_mode")?,
            None => 0o660,
        };
        let socket_perms = SocketPerms {
            mode: sw.socket_mode.as_ref().map(|m| octal(m, "socket_mode")).transpose()?,
            gid: match &sw.socket_group {
                Some(g) => Some(group_id(g.get_ref()).ok_or_else(|| {
                    cx.err(Some(g.span()), format!("socket_group: no group \"{}\" in /etc/group", g.get_ref()))
                })?),
                None => None,
            },
        };
        let weight_packets = range(sw.weight_packets, "weight_packets", 1, 1 << 20, DEFAULT_WEIGHT_PACKETS)?;
        let weight_bytes = range(sw.weight_bytes, "weight_bytes", 64, 1 << 30, DEFAULT_WEIGHT_BYTES)?;
        let burst = range(sw.burst, "burst", 1, MAX_BURST, MAX_BURST)?;
        let max_regions = MAX_MEMORY_REGIONS;
        let mac_limit = range(sw.mac_limit, "mac_limit", 1, 1 << 20, DEFAULT_MAC_LIMIT)?;
        let max_guest_memory_mib =
            range(sw.max_guest_memory_mib, "max_guest_memory_mib", 1, 1 << 24, DEFAULT_MAX_GUEST_MEMORY_MIB)?;
        let max_memory_regions = range(sw.max_memory_regions, "max_memory_regions", 1, max_regions, max_regions)?;
        let max_total_guest_memory_mib = range(
            sw.max_total_guest_memory_mib,
            "max_total_guest_memory_mib",
            1,
            DEFAULT_MAX_TOTAL_GUEST_MEMORY_MIB,
            DEFAULT_MAX_TOTAL_GUEST_MEMORY_MIB,
        )?;
        let rx_retry_us = range(sw.rx_retry_us, "rx_retry_us", 0, 60_000_000, DEFAULT_RX_RETRY_US)?;
        let mode = |s: &Spanned<String>| match s.get_ref().as_str() {
            "busy" => Ok(PollMode::Busy),
            "adaptive" => Ok(PollMode::Adaptive),
            other => {
                Err(cx.err(Some(s.span()), format!("poll_mode: expected \"busy\" or \"adaptive\", found \"{other}\"")))
            }
        };
        let poll_mode = match &sw.poll_mode {
            Some(m) => mode(m)?,
            None => PollMode::Busy,
        };
        let mut core_poll_mode = HashMap::new();
        if let Some(m) = &sw.core_poll_mode {
            for (k, v) in m.get_ref() {
                let bad = || {
                    cx.err(
                        Some(m.span()),
                        format!(
                            "core_poll_mode: \"{k}\" = \"{v}\": expected a poll core id = \"busy\" or \"adaptive\""
                        ),
                    )
                };
                let core: usize = k.parse().map_err(|_| bad())?;
                if !poll_cores.contains(&core) {
                    return Err(cx.err(Some(m.span()), format!("core_poll_mode: CPU {core} is not in poll_cores")));
                }
                let pm = match v.as_str() {
                    "busy" => PollMode::Busy,
                    "adaptive" => PollMode::Adaptive,
                    _ => return Err(bad()),
                };
                core_poll_mode.insert(core, pm);
            }
        }
        let idle_before_sleep_us =
            range(sw.idle_before_sleep_us, "idle_before_sleep_us", 1, 10_000_000, DEFAULT_IDLE_BEFORE_SLEEP_US)?;
        let metrics_listen = match sw.metrics_listen {
            None => None,
            Some(m) => Some(m.get_ref().parse().map_err(|_| {
                cx.err(
                    Some(m.span()),
                    format!(
                        "metrics_listen: expected ADDRESS:PORT such as \"127.0.0.1:9464\", found \"{}\"",
                        m.get_ref()
                    ),
                )
            })?),
        };

        if raw.port.len() > MAX_PORTS {
            return Err(cx.err(None, format!("{} ports: at most {MAX_PORTS}", raw.port.len())));
        }
        let mut ports = Vec::new();
        let mut names: HashMap<String, ()> = HashMap::new();
        let mut sockets: HashMap<PathBuf, ()> = HashMap::new();
        for p in raw.port {
            let name = p.name.get_ref();
            if name.is_empty()
                || name.len() > 32
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return Err(cx.err(Some(p.name.span()), "name: expected 1-32 characters of A-Z a-z 0-9 - _ ."));
            }
            if names.insert(name.clone(), ()).is_some() {
                return Err(cx.err(Some(p.name.span()), format!("duplicate port name \"{name}\"")));
            }
            let is_dpdk = match p.kind.get_ref().as_str() {
                "vhost-user" => false,
                "dpdk" if cfg!(feature = "dpdk") => true,
                "dpdk" => {
                    return Err(cx.err(
                        Some(p.kind.span()),
                        "type \"dpdk\": this pvswitchd was built without DPDK support (cargo feature `dpdk`)",
                    ));
                }
                other => {
                    return Err(cx.err(
                        Some(p.kind.span()),
                        format!("type: expected \"vhost-user\" or \"dpdk\", found \"{other}\""),
                    ));
                }
            };
            let endpoint = if is_dpdk {
                if let Some(s) = &p.socket {
                    return Err(cx.err(Some(s.span()), "socket: only for vhost-user ports (a dpdk port has `device`)"));
                }
                if let Some(m) = &p.mode {
                    return Err(cx.err(Some(m.span()), "mode: only for vhost-user ports"));
                }
                if let Some(q) = &p.queues {
                    return Err(cx.err(Some(q.span()), "queues: only for vhost-user ports (use rx_queues, tx_queues)"));
                }
                let device = match &p.device {
                    Some(d) if !d.get_ref().trim().is_empty() => d.get_ref().trim().to_string(),
                    Some(d) => return Err(cx.err(Some(d.span()), "device: expected a PCI address or vdev string")),
                    None => {
                        return Err(cx.err(
                            Some(p.kind.span()),
                            "a dpdk port needs `device` (a PCI address such as \"0000:03:00.0\" or a vdev such as \"net_af_packet0,iface=eth1\")",
                        ));
                    }
                };
                let q16 =
                    |v: &Option<Spanned<u16>>, name: &str, lo: u16, hi: u16| -> Result<Option<u16>, ConfigError> {
                        match v {
                            None => Ok(None),
                            Some(s) if (lo..=hi).contains(s.get_ref()) => Ok(Some(*s.get_ref())),
                            Some(s) => {
                                Err(cx.err(Some(s.span()), format!("{name}: expected a value from {lo} to {hi}")))
                            }
                        }
                    };
                let d = DpdkPortConfig {
                    device,
                    rx_queues: q16(&p.rx_queues, "rx_queues", 1, MAX_QUEUE_PAIRS)?.unwrap_or(1),
                    tx_queues: q16(&p.tx_queues, "tx_queues", 1, 1024)?,
                    rx_ring: q16(&p.rx_ring, "rx_ring", 32, 32768)?.unwrap_or(1024),
                    tx_ring: q16(&p.tx_ring, "tx_ring", 32, 32768)?.unwrap_or(1024),
                    offloads: p.offloads.as_ref().is_none_or(|o| *o.get_ref()),
                };
                Endpoint::Dpdk(d)
            } else {
                if let Some(d) = &p.device {
                    return Err(cx.err(Some(d.span()), "device: only for dpdk ports"));
                }
                if let Some(v) = [&p.rx_queues, &p.tx_queues, &p.rx_ring, &p.tx_ring].into_iter().flatten().next() {
                    return Err(cx.err(Some(v.span()), "rx_queues, tx_queues, rx_ring, tx_ring: only for dpdk ports"));
                }
                let Some(sock) = &p.socket else {
                    return Err(cx.err(Some(p.kind.span()), "a vhost-user port needs `socket`"));
                };
                let socket = resolve(sock.get_ref());
                if sock.get_ref().is_empty() {
                    return Err(cx.err(Some(sock.span()), "socket: expected a path"));
                }
                if sockets.insert(socket.clone(), ()).is_some() {
                    return Err(cx.err(Some(sock.span()), format!("duplicate socket path {}", socket.display())));
                }
                let mode = match p.mode.as_ref().map(|m| m.get_ref().as_str()) {
                    None | Some("server") => SocketMode::Server,
                    Some("client") => SocketMode::Client,
                    Some(other) => {
                        return Err(cx.err(
                            p.mode.as_ref().map(|m| m.span()),
                            format!("mode: expected \"server\" or \"client\", found \"{other}\""),
                        ));
                    }
                };
                let queue_pairs = match &p.queues {
                    None => 1,
                    Some(q) if (1..=MAX_QUEUE_PAIRS).contains(q.get_ref()) => *q.get_ref(),
                    Some(q) => {
                        return Err(
                            cx.err(Some(q.span()), format!("queues: expected 1 to {MAX_QUEUE_PAIRS} queue pairs"))
                        );
                    }
                };
                let offloads = p.offloads.as_ref().is_none_or(|o| *o.get_ref());
                Endpoint::VhostUser(VhostUserConfig { socket, mode, queue_pairs, offloads, socket_perms })
            };
            let mtu = range(p.mtu, "mtu", 68, 9216, 1500)?;
            let weight_packets = range(p.weight_packets, "weight_packets", 1, 1 << 20, weight_packets)?;
            let weight_bytes = range(p.weight_bytes, "weight_bytes", 64, 1 << 30, weight_bytes)?;
            let mut allowed_macs = Vec::new();
            for m in &p.allowed_macs {
                let mac = m.get_ref().parse::<MacAddr>().map_err(|_| {
                    cx.err(
                        Some(m.span()),
                        format!(
                            "allowed_macs: expected a MAC such as \"52:54:00:12:34:56\", found \"{}\"",
                            m.get_ref()
                        ),
                    )
                })?;
                allowed_macs.push(mac);
            }
            let mac_limit = range(p.mac_limit, "mac_limit", 1, 1 << 20, mac_limit)?;
            let mem_mib = range(p.max_guest_memory_mib, "max_guest_memory_mib", 1, 1 << 24, max_guest_memory_mib)?;
            let mem_regions = range(p.max_memory_regions, "max_memory_regions", 1, max_regions, max_memory_regions)?;
            let mem_limits = MemLimits { max_bytes: (mem_mib as u64) << 20, max_regions: mem_regions as usize };
            let affinity = p.affinity.as_ref().map(|a| *a.get_ref());
            // Receive queues: a vhost-user port's queue pairs, a dpdk port's rx queues.
            let nrxq = match &endpoint {
                Endpoint::VhostUser(v) => v.queue_pairs,
                Endpoint::Dpdk(d) => d.rx_queues,
            };
            let mut queue_cfg = vec![QueueConfig { weight_packets, weight_bytes, affinity }; nrxq as usize];
            for q in &p.queue {
                let i = *q.index.get_ref();
                let Some(slot) = queue_cfg.get_mut(i as usize) else {
                    return Err(cx.err(
                        Some(q.index.span()),
                        format!("queue index {i}: the port has {nrxq} receive queues (0 to {})", nrxq - 1),
                    ));
                };
                slot.weight_packets =
                    range(q.weight_packets.clone(), "weight_packets", 1, 1 << 20, slot.weight_packets)?;
                slot.weight_bytes = range(q.weight_bytes.clone(), "weight_bytes", 64, 1 << 30, slot.weight_bytes)?;
                if let Some(a) = &q.affinity {
                    slot.affinity = Some(*a.get_ref());
                }
            }
            for (a, span) in queue_cfg.iter().filter_map(|q| q.affinity).zip(std::iter::repeat(p.name.span())) {
                if !poll_cores.contains(&a) {
                    return Err(cx.err(
                        Some(span),
                        format!("port {name}: affinity {a} is not one of poll_cores {poll_cores:?}"),
                    ));
                }
            }
            ports.push(PortConfig {
                name: name.clone(),
                endpoint,
                mtu,
                weight_packets,
                weight_bytes,
                allowed_macs,
                mac_limit,
                mem_limits,
                queue_cfg,
            });
        }
        // Flows name ports; check each against the port names, at its place in the file.
        let mut flows = Vec::new();
        for f in raw.flows {
            // The span covers the quotes (one, or three for a multi-line string).
            let span = f.span();
            let quote =
                if text[span.start..].starts_with("\"\"\"") || text[span.start..].starts_with("'''") { 3 } else { 1 };
            let offset = span.start + quote;
            let text = f.into_inner();
            let id = |name: &str| ports.iter().position(|p: &PortConfig| p.name == name).map(|i| i as u16);
            if let Err(e) = crate::flow::parse_flow(&text, &id) {
                return Err(cx.err(Some(offset + e.offset..offset + e.offset), format!("flow: {}", e.message)));
            }
            flows.push(FlowSource { text, offset });
        }
        let dpdk = match raw.dpdk {
            None => DpdkConfig::default(),
            Some(d) => DpdkConfig {
                eal_args: d.eal_args,
                mbufs: range(d.mbufs, "mbufs", 1023, 1 << 24, DEFAULT_MBUFS)?,
                nic_poll_interval_us: range(
                    d.nic_poll_interval_us,
                    "nic_poll_interval_us",
                    1,
                    1_000_000,
                    DEFAULT_NIC_POLL_INTERVAL_US,
                )?,
            },
        };
        Ok(Config {
            dpdk,
            poll_cores,
            control_socket: sw.control_socket.map(|s| resolve(&s)).unwrap_or_else(|| DEFAULT_CONTROL_SOCKET.into()),
            control_socket_mode,
            weight_packets,
            weight_bytes,
            burst,
            rx_retry_us,
            metrics_listen,
            rxq_assign,
            rxq_isolate: sw.rxq_isolate.unwrap_or(true),
            auto_rebalance: sw.auto_rebalance.unwrap_or(false),
            rebalance_interval_s,
            rebalance_threshold_pct,
            rebalance_improvement_pct,
            poll_mode,
            core_poll_mode,
            idle_before_sleep_us,
            max_total_guest_memory_mib,
            ports,
            flows,
        })
    }
}

#[cfg(test)]
mod tests;
