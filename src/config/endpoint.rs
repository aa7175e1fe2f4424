//! What a `[[port]]` connects to, by its `type`: a vhost-user socket (`socket`, `mode`,
//! `queues`) or a DPDK device (`device`, `rx_queues`, `tx_queues`, `rx_ring`, `tx_ring`).
//! Each type refuses the other's keys. The third kind, a remote VXLAN endpoint
//! (`VxlanConfig`), is made by a `[[vtep]]` (`vtep.rs`), never by a `[[port]]`.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use toml::Spanned;

use super::error::{ConfigError, Ctx};
use super::perms::SocketPerms;
use super::raw::RawPort;
use super::switch::PortDefaults;
use crate::wire::MacAddr;

/// Most queue pairs one port may have (Linux virtio-net's limit is 256; DPDK vhost's 128).
pub const MAX_QUEUE_PAIRS: u16 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketMode {
    /// pvswitchd listens; the VMM connects (QEMU `-chardev socket,path=...`).
    Server,
    /// The VMM listens; pvswitchd connects and reconnects with backoff.
    Client,
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

impl DpdkPortConfig {
    /// The device's name, what DPDK knows it by: the device string up to its first comma.
    pub fn device_name(&self) -> &str {
        self.device.split(',').next().unwrap_or("").trim()
    }
}

/// A remote tunnel endpoint's port: where it is, and the VTEP it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanConfig {
    /// The `[[vtep]]` it belongs to.
    pub vtep: String,
    /// The dpdk port its frames leave and arrive through.
    pub underlay: String,
    pub local: Ipv4Addr,
    pub prefix_len: u8,
    /// The underlay router, for remotes outside the local subnet.
    pub gateway: Option<Ipv4Addr>,
    /// The next hop's MAC when it is fixed (no ARP): a static underlay, or a benchmark.
    pub next_hop_mac: Option<MacAddr>,
    pub udp_port: u16,
    pub remote: Ipv4Addr,
    /// Every (VNI, VLAN) of the VTEP.
    pub vnis: Vec<(u32, u16)>,
    /// Whether the tunnel learns the inner source MACs of what it receives (flood and learn,
    /// RFC 7348); off where a control plane (EVPN) says where every remote MAC is.
    pub learning: bool,
}

impl VxlanConfig {
    /// The address whose MAC the outer headers go to: the remote itself, or the gateway when
    /// the remote is outside the local subnet.
    pub fn next_hop(&self) -> Ipv4Addr {
        let mask = if self.prefix_len == 0 { 0 } else { u32::MAX << (32 - self.prefix_len as u32) };
        let on_link = (u32::from(self.local) ^ u32::from(self.remote)) & mask == 0;
        match self.gateway {
            Some(g) if !on_link => g,
            _ => self.remote,
        }
    }
}

/// What a port connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    VhostUser(VhostUserConfig),
    Dpdk(DpdkPortConfig),
    /// A remote VXLAN tunnel endpoint, made by a `[[vtep]]` (never by a `[[port]]`).
    Vxlan(VxlanConfig),
}

impl Endpoint {
    /// Receive queues: a vhost-user port's queue pairs, a dpdk port's rx queues.
    pub fn rx_queues(&self) -> u16 {
        match self {
            Endpoint::VhostUser(v) => v.queue_pairs,
            Endpoint::Dpdk(d) => d.rx_queues,
            // A tunnel's frames arrive on its underlay's queues.
            Endpoint::Vxlan(_) => 0,
        }
    }
}

/// The endpoint `type` names, with its keys.
pub(super) fn validate(p: &RawPort, defaults: &PortDefaults, cx: &Ctx) -> Result<Endpoint, ConfigError> {
    match p.kind.get_ref().as_str() {
        "vhost-user" => vhost_user(p, defaults, cx).map(Endpoint::VhostUser),
        "dpdk" if cfg!(feature = "dpdk") => dpdk(p, cx).map(Endpoint::Dpdk),
        "dpdk" => Err(cx.err(
            Some(p.kind.span()),
            "type \"dpdk\": this pvswitchd was built without DPDK support (cargo feature `dpdk`)",
        )),
        other => {
            Err(cx.err(Some(p.kind.span()), format!("type: expected \"vhost-user\" or \"dpdk\", found \"{other}\"")))
        }
    }
}

fn vhost_user(p: &RawPort, defaults: &PortDefaults, cx: &Ctx) -> Result<VhostUserConfig, ConfigError> {
    if let Some(d) = &p.device {
        return Err(cx.err(Some(d.span()), "device: only for dpdk ports"));
    }
    if let Some(v) = [&p.rx_queues, &p.tx_queues, &p.rx_ring, &p.tx_ring].into_iter().flatten().next() {
        return Err(cx.err(Some(v.span()), "rx_queues, tx_queues, rx_ring, tx_ring: only for dpdk ports"));
    }
    let Some(sock) = &p.socket else {
        return Err(cx.err(Some(p.kind.span()), "a vhost-user port needs `socket`"));
    };
    if sock.get_ref().is_empty() {
        return Err(cx.err(Some(sock.span()), "socket: expected a path"));
    }
    let mode = match &p.mode {
        None => SocketMode::Server,
        Some(m) if m.get_ref() == "server" => SocketMode::Server,
        Some(m) if m.get_ref() == "client" => SocketMode::Client,
        Some(m) => {
            let found = m.get_ref();
            return Err(cx.err(Some(m.span()), format!("mode: expected \"server\" or \"client\", found \"{found}\"")));
        }
    };
    let queue_pairs = match &p.queues {
        None => 1,
        Some(q) if (1..=MAX_QUEUE_PAIRS).contains(q.get_ref()) => *q.get_ref(),
        Some(q) => {
            return Err(cx.err(Some(q.span()), format!("queues: expected 1 to {MAX_QUEUE_PAIRS} queue pairs")));
        }
    };
    Ok(VhostUserConfig {
        socket: defaults.resolve(sock.get_ref()),
        mode,
        queue_pairs,
        offloads: p.offloads.as_ref().is_none_or(|o| *o.get_ref()),
        socket_perms: defaults.socket_perms,
    })
}

fn dpdk(p: &RawPort, cx: &Ctx) -> Result<DpdkPortConfig, ConfigError> {
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
    let q16 = |v: &Option<Spanned<u16>>, name: &str, lo: u16, hi: u16| -> Result<Option<u16>, ConfigError> {
        match v {
            None => Ok(None),
            Some(s) if (lo..=hi).contains(s.get_ref()) => Ok(Some(*s.get_ref())),
            Some(s) => Err(cx.err(Some(s.span()), format!("{name}: expected a value from {lo} to {hi}"))),
        }
    };
    Ok(DpdkPortConfig {
        device,
        rx_queues: q16(&p.rx_queues, "rx_queues", 1, MAX_QUEUE_PAIRS)?.unwrap_or(1),
        tx_queues: q16(&p.tx_queues, "tx_queues", 1, 1024)?,
        rx_ring: q16(&p.rx_ring, "rx_ring", 32, 32768)?.unwrap_or(1024),
        tx_ring: q16(&p.tx_ring, "tx_ring", 32, 32768)?.unwrap_or(1024),
        offloads: p.offloads.as_ref().is_none_or(|o| *o.get_ref()),
    })
}
