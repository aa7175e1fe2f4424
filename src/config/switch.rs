//! The `[switch]` section: poll threads and their placement policy, the control socket, the
//! Prometheus endpoint, and the defaults every `[[port]]` inherits (`PortDefaults`).

use std::collections::HashMap;
use std::path::PathBuf;

use toml::Spanned;

use super::dpdk::DpdkConfig;
use super::error::{ConfigError, Ctx};
use super::perms::{self, SocketPerms};
use super::raw::{RawCores, RawSwitch};
use super::{Config, MAX_MEMORY_REGIONS, MAX_PORTS};

pub const DEFAULT_CONTROL_SOCKET: &str = "/run/pvswitch/pvswitchd.sock";
/// Linux vhost-net's VHOST_NET_PKT_WEIGHT and VHOST_NET_WEIGHT.
pub const DEFAULT_WEIGHT_PACKETS: u32 = 256;
pub const DEFAULT_WEIGHT_BYTES: u32 = 512 * 1024;
pub const MAX_BURST: u32 = 32;
/// Frames wait this long for a full guest RX ring (backpressure to the sender), then drop.
pub const DEFAULT_RX_RETRY_US: u32 = 100;
/// Source MACs one port may have learned at a time (`mac_limit`).
pub const DEFAULT_MAC_LIMIT: u32 = 1024;
/// Guest memory one port's frontend may map into pvswitchd (`max_guest_memory_mib`): 64 GiB.
pub const DEFAULT_MAX_GUEST_MEMORY_MIB: u32 = 64 * 1024;
/// Guest memory address space all ports' frontends together may map into pvswitchd
/// Connection tracking's table (security groups): connections of every port together (about
/// 128 bytes each, allocated when a port first has a security group), and of each port.
pub const DEFAULT_CT_MAX_CONNECTIONS: u32 = 262_144;
pub const MAX_CT_CONNECTIONS: u32 = 16 << 20;
pub const DEFAULT_CT_MAX_PER_PORT: u32 = 65_536;

/// (`max_total_guest_memory_mib`): 64 TiB, half of x86-64's user address space.
pub const DEFAULT_MAX_TOTAL_GUEST_MEMORY_MIB: u32 = (crate::mem::guest::DEFAULT_MAX_TOTAL_BYTES >> 20) as u32;
pub const DEFAULT_IDLE_BEFORE_SLEEP_US: u32 = 1000;
/// A guest queue empty this long is parked (`park_after_us`): 1 ms, as long as adaptive
/// polling waits before sleeping. A guest sending a frame every millisecond or more often is
/// never parked; an idle one (timers, ARP) is polled for a millisecond after each frame.
pub const DEFAULT_PARK_AFTER_US: u32 = 1000;
/// How often a poll thread looks at its parked queues' kicks (`park_check_us`): the most a
/// parked queue's first frame waits for that look.
pub const DEFAULT_PARK_CHECK_US: u32 = 50;

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

/// What a `[[port]]` takes from `[switch]` when it does not say: the same for every port of
/// the file, and for a port added at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortDefaults {
    /// `socket_dir`: the directory of relative socket paths (None: pvswitchd's working directory).
    pub socket_dir: Option<PathBuf>,
    /// `socket_mode`, `socket_group`: given to every server-mode socket.
    pub socket_perms: SocketPerms,
    pub weight_packets: u32,
    pub weight_bytes: u32,
    pub mac_limit: u32,
    pub max_guest_memory_mib: u32,
    pub max_memory_regions: u32,
}

impl Default for PortDefaults {
    /// The defaults of a file whose `[switch]` sets none of them.
    fn default() -> Self {
        PortDefaults {
            socket_dir: None,
            socket_perms: SocketPerms::default(),
            weight_packets: DEFAULT_WEIGHT_PACKETS,
            weight_bytes: DEFAULT_WEIGHT_BYTES,
            mac_limit: DEFAULT_MAC_LIMIT,
            max_guest_memory_mib: DEFAULT_MAX_GUEST_MEMORY_MIB,
            max_memory_regions: MAX_MEMORY_REGIONS,
        }
    }
}

impl PortDefaults {
    /// A socket path as given: under `socket_dir` if relative.
    pub fn resolve(&self, path: &str) -> PathBuf {
        let p = PathBuf::from(path);
        match (&self.socket_dir, p.is_relative()) {
            (Some(d), true) => d.join(p),
            _ => p,
        }
    }
}

/// The section's settings: a `Config` with no ports, no flows and the default `[dpdk]`.
pub(super) fn validate(sw: RawSwitch, cx: &Ctx) -> Result<Config, ConfigError> {
    let poll_cores = poll_cores(&sw, cx)?;
    let rxq_assign = match &sw.rxq_assign {
        None => RxqAssign::RoundRobin,
        Some(s) => s.get_ref().parse().map_err(|e: String| cx.err(Some(s.span()), format!("rxq_assign: {e}")))?,
    };
    let rebalance_interval_s = cx.range(&sw.rebalance_interval_s, "rebalance_interval_s", 1, 86400, 60)?;
    let rebalance_threshold_pct = cx.range(&sw.rebalance_threshold_pct, "rebalance_threshold_pct", 1, 100, 95)?;
    let rebalance_improvement_pct = cx.range(&sw.rebalance_improvement_pct, "rebalance_improvement_pct", 1, 100, 25)?;
    let (control_socket_mode, socket_perms) = perms::validate(&sw, cx)?;
    let defaults = port_defaults(&sw, socket_perms, cx)?;
    let max_total = DEFAULT_MAX_TOTAL_GUEST_MEMORY_MIB;
    let (poll_mode, core_poll_mode) = poll_modes(&sw, &poll_cores, cx)?;
    let ct_max_connections =
        cx.range(&sw.ct_max_connections, "ct_max_connections", 1024, MAX_CT_CONNECTIONS, DEFAULT_CT_MAX_CONNECTIONS)?;
    Ok(Config {
        control_socket: match &sw.control_socket {
            Some(s) => defaults.resolve(s),
            None => DEFAULT_CONTROL_SOCKET.into(),
        },
        control_socket_mode,
        burst: cx.range(&sw.burst, "burst", 1, MAX_BURST, MAX_BURST)?,
        max_total_guest_memory_mib: cx.range(
            &sw.max_total_guest_memory_mib,
            "max_total_guest_memory_mib",
            1,
            max_total,
            max_total,
        )?,
        rx_retry_us: cx.range(&sw.rx_retry_us, "rx_retry_us", 0, 60_000_000, DEFAULT_RX_RETRY_US)?,
        idle_before_sleep_us: cx.range(
            &sw.idle_before_sleep_us,
            "idle_before_sleep_us",
            1,
            10_000_000,
            DEFAULT_IDLE_BEFORE_SLEEP_US,
        )?,
        park_after_us: cx.range(&sw.park_after_us, "park_after_us", 0, 60_000_000, DEFAULT_PARK_AFTER_US)?,
        park_check_us: cx.range(&sw.park_check_us, "park_check_us", 1, 100_000, DEFAULT_PARK_CHECK_US)?,
        metrics_listen: metrics_listen(&sw.metrics_listen, cx)?,
        poll_cores,
        rxq_assign,
        rxq_isolate: sw.rxq_isolate.unwrap_or(true),
        auto_rebalance: sw.auto_rebalance.unwrap_or(false),
        rebalance_interval_s,
        rebalance_threshold_pct,
        rebalance_improvement_pct,
        poll_mode,
        core_poll_mode,
        defaults,
        ports: Vec::new(),
        ports_dir: sw.ports_dir.as_ref().map(PathBuf::from),
        max_ports: cx.range(&sw.max_ports, "max_ports", 1, MAX_PORTS as u32, MAX_PORTS as u32)? as usize,
        dropin_errors: Vec::new(),
        flows: Vec::new(),
        dpdk: DpdkConfig::default(),
        vteps: Vec::new(),
        security_groups: Vec::new(),
        mirrors: Vec::new(),
        vrfs: Vec::new(),
        ipfix: None,
        ct_max_connections,
        ct_max_per_port: cx.range(
            &sw.ct_max_per_port,
            "ct_max_per_port",
            1,
            ct_max_connections,
            DEFAULT_CT_MAX_PER_PORT.min(ct_max_connections),
        )?,
    })
}

/// `poll_cores`: a list of distinct CPU ids, or `"auto"` (`poll_cores_per_node` on each NUMA
/// node, from hwloc); absent, the last CPU.
fn poll_cores(sw: &RawSwitch, cx: &Ctx) -> Result<Vec<usize>, ConfigError> {
    let per_node = cx.range(&sw.poll_cores_per_node, "poll_cores_per_node", 1, 1024, 1)?;
    let Some(pc) = &sw.poll_cores else {
        let ncpu = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        return Ok(vec![ncpu.saturating_sub(1)]);
    };
    let span = Some(pc.span());
    match pc.get_ref() {
        RawCores::Word(w) if w == "auto" => {
            let cores = crate::topology::Numa::discover().auto_cores(per_node as usize, &[]);
            if cores.is_empty() {
                return Err(cx.err(span, "poll_cores = \"auto\": hwloc found no usable CPU"));
            }
            Ok(cores)
        }
        RawCores::Word(w) => {
            Err(cx.err(span, format!("poll_cores: expected a list of CPU ids or \"auto\", found \"{w}\"")))
        }
        RawCores::List(l) if l.is_empty() => Err(cx.err(span, "poll_cores: expected at least one CPU id")),
        RawCores::List(l) => {
            if let Some(c) = l.iter().enumerate().find_map(|(i, c)| l[..i].contains(c).then_some(c)) {
                return Err(cx.err(span, format!("poll_cores: CPU {c} listed twice")));
            }
            Ok(l.clone())
        }
    }
}

/// What [[port]] inherits: socket directory and permissions, weights, MAC and memory limits.
fn port_defaults(sw: &RawSwitch, socket_perms: SocketPerms, cx: &Ctx) -> Result<PortDefaults, ConfigError> {
    let regions = MAX_MEMORY_REGIONS;
    Ok(PortDefaults {
        socket_dir: sw.socket_dir.as_ref().map(PathBuf::from),
        socket_perms,
        weight_packets: cx.range(&sw.weight_packets, "weight_packets", 1, 1 << 20, DEFAULT_WEIGHT_PACKETS)?,
        weight_bytes: cx.range(&sw.weight_bytes, "weight_bytes", 64, 1 << 30, DEFAULT_WEIGHT_BYTES)?,
        mac_limit: cx.range(&sw.mac_limit, "mac_limit", 1, 1 << 20, DEFAULT_MAC_LIMIT)?,
        max_guest_memory_mib: cx.range(
            &sw.max_guest_memory_mib,
            "max_guest_memory_mib",
            1,
            1 << 24,
            DEFAULT_MAX_GUEST_MEMORY_MIB,
        )?,
        max_memory_regions: cx.range(&sw.max_memory_regions, "max_memory_regions", 1, regions, regions)?,
    })
}

fn poll_mode(word: &str) -> Option<PollMode> {
    match word {
        "busy" => Some(PollMode::Busy),
        "adaptive" => Some(PollMode::Adaptive),
        _ => None,
    }
}

/// `poll_mode`, and `core_poll_mode`'s exceptions to it, each for a core of `poll_cores`.
fn poll_modes(
    sw: &RawSwitch,
    poll_cores: &[usize],
    cx: &Ctx,
) -> Result<(PollMode, HashMap<usize, PollMode>), ConfigError> {
    let global = match &sw.poll_mode {
        None => PollMode::Busy,
        Some(s) => poll_mode(s.get_ref()).ok_or_else(|| {
            let found = s.get_ref();
            cx.err(Some(s.span()), format!("poll_mode: expected \"busy\" or \"adaptive\", found \"{found}\""))
        })?,
    };
    let mut per_core = HashMap::new();
    let Some(m) = &sw.core_poll_mode else {
        return Ok((global, per_core));
    };
    for (k, v) in m.get_ref() {
        let bad = || {
            let what = format!("core_poll_mode: \"{k}\" = \"{v}\": expected a poll core id = \"busy\" or \"adaptive\"");
            cx.err(Some(m.span()), what)
        };
        let core: usize = k.parse().map_err(|_| bad())?;
        if !poll_cores.contains(&core) {
            return Err(cx.err(Some(m.span()), format!("core_poll_mode: CPU {core} is not in poll_cores")));
        }
        per_core.insert(core, poll_mode(v).ok_or_else(bad)?);
    }
    Ok((global, per_core))
}

/// `metrics_listen = "ADDRESS:PORT"`.
fn metrics_listen(m: &Option<Spanned<String>>, cx: &Ctx) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    let Some(m) = m else {
        return Ok(None);
    };
    m.get_ref().parse().map(Some).map_err(|_| {
        let found = m.get_ref();
        cx.err(
            Some(m.span()),
            format!("metrics_listen: expected ADDRESS:PORT such as \"127.0.0.1:9464\", found \"{found}\""),
        )
    })
}
