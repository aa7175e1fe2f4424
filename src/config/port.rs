//! A `[[port]]` table: its name, its endpoint (`endpoint.rs`), its receive queues
//! (`queue.rs`), MTU, weights, port security and guest memory limits, with the defaults of
//! `[switch]`. The same validator reads a port of the file and a port's keys on their own
//! (`PortConfig::parse_one`, for a control request that adds one).

use std::ops::Range;

use super::endpoint::{self, DpdkPortConfig, Endpoint, VhostUserConfig};
use super::error::{ConfigError, Ctx};
use super::ips::IpPrefix;
use super::queue::{self, QueueConfig};
use super::raw::{self, RawPort};
use super::switch::PortDefaults;
use super::tenant::{self, RateCaps};
use crate::config::vlan::PortVlan;
use crate::mem::MemLimits;
use crate::wire::MacAddr;

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
    /// Port security: source addresses (IPv4, IPv6; ARP senders, neighbour advertisement
    /// targets) this port may send from (empty: any).
    pub allowed_ips: Vec<IpPrefix>,
    /// The `[[security_group]]`s that filter its connections (empty: none, every frame passes).
    pub security_groups: Vec<String>,
    /// Most source MACs the port may have learned at a time.
    pub mac_limit: u32,
    /// What a vhost-user frontend may map: total bytes and regions of one memory table.
    pub mem_limits: MemLimits,
    /// Per queue pair: (weight_packets, weight_bytes, pinned poll core).
    pub queue_cfg: Vec<QueueConfig>,
    /// Which VLANs it carries, tagged or not.
    pub vlan: PortVlan,
    /// Its rate caps, per direction.
    pub rates: RateCaps,
    /// The drop-in file it came from (`dropin.rs`), or None: the main file.
    pub origin: Option<std::path::PathBuf>,
}

impl PortConfig {
    /// One port's keys as TOML text, as a `[[port]]` table holds them but at the top level
    /// (`name = "vm3"\ntype = "vhost-user"\nsocket = "vm3.sock"`; per-queue overrides as
    /// `[[queue]]`), with `defaults` for what it does not say. Errors name `source` and a line
    /// and column of `text`. The checks against other ports are `Config::check_port`
    /// (`Config::parse_port` does both).
    pub fn parse_one(source: &str, text: &str, defaults: &PortDefaults) -> Result<PortConfig, ConfigError> {
        Ok(read_one(&Ctx { file: source, text }, defaults)?.config)
    }

    /// Whether `other` can be applied to a running port in place (only settings of
    /// `changed_settings` differ); otherwise a reload replaces the port (`replacing_keys`).
    pub fn same_endpoint(&self, other: &PortConfig) -> bool {
        self.replacing_keys(other).is_empty()
    }

    /// The endpoint keys `other` changes that only a new endpoint can take (its socket, its
    /// mode, its queues; a device, its queues, rings, offloads and MTU, all set on the device
    /// when it opens), by their config names: a reload
    /// replaces the port and says why. A vhost-user port's `offloads` (read at each connection)
    /// and its socket's permissions (changed on the bound socket) change in place.
    pub fn replacing_keys(&self, other: &PortConfig) -> Vec<&'static str> {
        let mut v = Vec::new();
        let mut note = |differs: bool, name| {
            if differs {
                v.push(name)
            }
        };
        match (&self.endpoint, &other.endpoint) {
            (Endpoint::VhostUser(a), Endpoint::VhostUser(b)) => {
                note(a.socket != b.socket, "socket");
                note(a.mode != b.mode, "mode");
                note(a.queue_pairs != b.queue_pairs, "queues");
            }
            (Endpoint::Dpdk(a), Endpoint::Dpdk(b)) => {
                note(a.device != b.device, "device");
                note((a.rx_queues, a.tx_queues) != (b.rx_queues, b.tx_queues), "rx_queues/tx_queues");
                note((a.rx_ring, a.tx_ring) != (b.rx_ring, b.tx_ring), "rx_ring/tx_ring");
                note(a.offloads != b.offloads, "offloads");
                note(self.mtu != other.mtu, "mtu");
            }
            (Endpoint::Vxlan(a), Endpoint::Vxlan(b)) => note(a != b, "vtep"),
            _ => note(true, "type"),
        }
        // Whatever else an endpoint gains is replaced too, never applied by halves.
        let in_place_aside = |e: &Endpoint| match e {
            Endpoint::VhostUser(u) => {
                Endpoint::VhostUser(VhostUserConfig { socket_perms: Default::default(), offloads: true, ..u.clone() })
            }
            d => d.clone(),
        };
        if v.is_empty() && in_place_aside(&self.endpoint) != in_place_aside(&other.endpoint) {
            v.push("endpoint");
        }
        v
    }

    /// The settings `other` changes on a port with the same endpoint, by their config names
    /// (what a reload applies in place, and says it did).
    pub fn changed_settings(&self, other: &PortConfig) -> Vec<&'static str> {
        let mut v = Vec::new();
        let mut note = |differs: bool, name| {
            if differs {
                v.push(name)
            }
        };
        note(self.mtu != other.mtu, "mtu");
        note((self.weight_packets, self.weight_bytes) != (other.weight_packets, other.weight_bytes), "weights");
        note(self.queue_cfg != other.queue_cfg, "queues");
        note(self.allowed_macs != other.allowed_macs, "allowed_macs");
        note(self.allowed_ips != other.allowed_ips, "allowed_ips");
        note(self.security_groups != other.security_groups, "security_groups");
        note(self.mac_limit != other.mac_limit, "mac_limit");
        note(self.mem_limits != other.mem_limits, "memory limits");
        note(self.vlan != other.vlan, "vlan");
        note(self.rates != other.rates, "rate caps");
        if let (Some(a), Some(b)) = (self.vhost_user(), other.vhost_user()) {
            note(a.socket_perms != b.socket_perms, "socket_mode/socket_group");
            note(a.offloads != b.offloads, "offloads (from the guest's next connection)");
        }
        v
    }

    pub fn vhost_user(&self) -> Option<&VhostUserConfig> {
        match &self.endpoint {
            Endpoint::VhostUser(v) => Some(v),
            _ => None,
        }
    }

    pub fn dpdk(&self) -> Option<&DpdkPortConfig> {
        match &self.endpoint {
            Endpoint::Dpdk(d) => Some(d),
            _ => None,
        }
    }

    /// A remote tunnel endpoint's port (made by a `[[vtep]]`).
    pub fn vxlan(&self) -> Option<&super::endpoint::VxlanConfig> {
        match &self.endpoint {
            Endpoint::Vxlan(v) => Some(v),
            _ => None,
        }
    }

    /// The port's `type` as the configuration file names it.
    pub fn type_name(&self) -> &'static str {
        match self.endpoint {
            Endpoint::VhostUser(_) => "vhost-user",
            Endpoint::Dpdk(_) => "dpdk",
            Endpoint::Vxlan(_) => "vxlan",
        }
    }
}

/// A validated port and where the keys that may clash with other ports are in the text.
pub(super) struct Located {
    pub config: PortConfig,
    pub name: Range<usize>,
    pub socket: Option<Range<usize>>,
    pub device: Option<Range<usize>>,
}

/// One port's keys, the whole of `cx.text`.
pub(super) fn read_one(cx: &Ctx, defaults: &PortDefaults) -> Result<Located, ConfigError> {
    validate(raw::read(cx)?, defaults, cx)
}

/// What a port's name may be, for messages.
pub(super) const PORT_NAME: &str = "1-32 characters of A-Z a-z 0-9 - _ . beginning with a letter, a digit or _";

/// Whether `name` may name a port: not beginning with `.` (a drop-in of a hidden name is never
/// read back: the port directory skips hidden files) nor `-` (a command line would read it as
/// an option).
pub(super) fn is_port_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && !name.starts_with(['.', '-'])
}

/// The port on its own: everything but what other ports and `poll_cores` decide.
pub(super) fn validate(p: RawPort, d: &PortDefaults, cx: &Ctx) -> Result<Located, ConfigError> {
    let name = p.name.get_ref();
    if !is_port_name(name) {
        return Err(cx.err(Some(p.name.span()), format!("name: expected {PORT_NAME}")));
    }
    let endpoint = endpoint::validate(&p, d, cx)?;
    let mtu = cx.range(&p.mtu, "mtu", 68, 9216, 1500)?;
    let weight_packets = cx.range(&p.weight_packets, "weight_packets", 1, 1 << 20, d.weight_packets)?;
    let weight_bytes = cx.range(&p.weight_bytes, "weight_bytes", 64, 1 << 30, d.weight_bytes)?;
    let allowed_macs = allowed_macs(&p, cx)?;
    let allowed_ips = allowed_ips(&p, cx)?;
    let mut security_groups: Vec<String> = Vec::new();
    for g in &p.security_groups {
        if security_groups.contains(g.get_ref()) {
            return Err(cx.err(Some(g.span()), format!("security_groups: \"{}\" twice", g.get_ref())));
        }
        security_groups.push(g.get_ref().clone());
    }
    let mac_limit = cx.range(&p.mac_limit, "mac_limit", 1, 1 << 20, d.mac_limit)?;
    let mem_mib = cx.range(&p.max_guest_memory_mib, "max_guest_memory_mib", 1, 1 << 24, d.max_guest_memory_mib)?;
    let regions = super::MAX_MEMORY_REGIONS;
    let mem_regions = cx.range(&p.max_memory_regions, "max_memory_regions", 1, regions, d.max_memory_regions)?;
    let mem_limits = MemLimits { max_bytes: (mem_mib as u64) << 20, max_regions: mem_regions as usize };
    let affinity = p.affinity.as_ref().map(|a| *a.get_ref());
    let each = QueueConfig { weight_packets, weight_bytes, affinity };
    let queue_cfg = queue::validate(&p, endpoint.rx_queues(), each, cx)?;
    let vlan = tenant::vlan(&p, cx)?;
    let rates = tenant::rates(&p, cx)?;
    Ok(Located {
        name: p.name.span(),
        socket: p.socket.as_ref().map(|s| s.span()),
        device: p.device.as_ref().map(|s| s.span()),
        config: PortConfig {
            name: name.clone(),
            endpoint,
            mtu,
            weight_packets,
            weight_bytes,
            allowed_macs,
            allowed_ips,
            security_groups,
            mac_limit,
            mem_limits,
            queue_cfg,
            vlan,
            rates,
            origin: None,
        },
    })
}

/// Port security: `allowed_ips`, each an address or a prefix.
fn allowed_ips(p: &RawPort, cx: &Ctx) -> Result<Vec<IpPrefix>, ConfigError> {
    let ip = |a: &toml::Spanned<String>| {
        IpPrefix::parse(a.get_ref()).ok_or_else(|| {
            let found = a.get_ref();
            cx.err(
                Some(a.span()),
                format!(
                    "allowed_ips: expected an IPv4 or IPv6 address or prefix such as \"10.0.0.5\", \"10.0.0.0/24\" \
                     or \"fd00::/64\" (host bits zero), found \"{found}\""
                ),
            )
        })
    };
    p.allowed_ips.iter().map(ip).collect()
}

/// Port security: `allowed_macs`, each a MAC address.
fn allowed_macs(p: &RawPort, cx: &Ctx) -> Result<Vec<MacAddr>, ConfigError> {
    let mac = |m: &toml::Spanned<String>| {
        m.get_ref().parse::<MacAddr>().map_err(|_| {
            let found = m.get_ref();
            cx.err(
                Some(m.span()),
                format!("allowed_macs: expected a MAC such as \"52:54:00:12:34:56\", found \"{found}\""),
            )
        })
    };
    p.allowed_macs.iter().map(mac).collect()
}
