//! A switch port as the data path sees it: its id, its name, the largest frame it accepts, and
//! what kind of port it is. Shared (`Arc<Port>`) between the control thread and all poll
//! threads; the port's configuration and connection state belong to the switch model
//! (`switch`), not to this type.
//!
//! - [`vhost`]: the control-plane half of a vhost-user port: the backend of one connection,
//!   which starts, stops and remaps the port's virtqueues.
//! - [`nic`]: DPDK ports (NICs and vdevs): EAL start-up, mbuf pools, `NicPort`.
//! - [`rate`]: the port's rate caps, token buckets every poll thread shares.
//! - [`limit`]: what its frontend may make the control thread do (log lines, announcements).
//! - [`tunnel`]: a remote VXLAN tunnel endpoint as a port, and its underlay next hop.
//! - [`dpdk`] (cargo feature `dpdk`): the safe wrapper over DPDK's C API.
#[cfg(feature = "dpdk")]
pub mod dpdk;
pub mod limit;
pub mod nic;
pub mod nic_info;
pub mod rate;
pub mod tunnel;
pub mod vhost;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

use crate::vring::VringLock;
use crate::wire::MacAddr;
use nic::NicPort;
use rate::PortRates;

pub struct Port {
    /// Index into every per-thread counter array and into the port table.
    pub id: u16,
    name: String,
    /// Largest frame accepted from this port: MTU plus Ethernet header and one VLAN tag.
    max_frame: AtomicU32,
    pub kind: PortKind,
    /// Its rate caps (none until the switch applies its config).
    pub rates: PortRates,
    /// What its frontend may make the control thread do: log lines, announcements.
    pub limits: limit::FrontendLimits,
}

pub enum PortKind {
    /// A VM's virtio-net device over vhost-user: its virtqueues.
    VhostUser(VhostQueues),
    /// A NIC or DPDK vdev, open.
    Nic(NicPort),
    /// A dpdk port that did not open (the error is in the switch model); it has no queues.
    Failed,
    /// A remote VXLAN tunnel endpoint: frames to it are encapsulated onto its VTEP's
    /// underlay port, frames from it arrive there. It has no queues of its own.
    Tunnel(tunnel::Tunnel),
}

/// Bytes of Ethernet header (and one VLAN tag) a frame may carry beyond the MTU.
const L2_OVERHEAD: u32 = 18;

impl Port {
    /// A vhost-user port with `queue_pairs` pairs of (not yet started) virtqueues.
    pub fn vhost_user(id: u16, name: &str, mtu: u32, queue_pairs: u16) -> Port {
        Port::with_kind(id, name, mtu, PortKind::VhostUser(VhostQueues::new(queue_pairs)))
    }

    /// A dpdk port: `nic` is its open device, None if it failed to open.
    pub fn dpdk(id: u16, name: &str, mtu: u32, nic: Option<NicPort>) -> Port {
        Port::with_kind(id, name, mtu, nic.map_or(PortKind::Failed, PortKind::Nic))
    }

    /// A remote VXLAN tunnel endpoint.
    pub fn vxlan(id: u16, name: &str, mtu: u32, t: tunnel::Tunnel) -> Port {
        Port::with_kind(id, name, mtu, PortKind::Tunnel(t))
    }

    fn with_kind(id: u16, name: &str, mtu: u32, kind: PortKind) -> Port {
        Port {
            id,
            name: name.to_string(),
            max_frame: AtomicU32::new(mtu + L2_OVERHEAD),
            kind,
            rates: PortRates::default(),
            limits: limit::FrontendLimits::default(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The virtqueues of a vhost-user port.
    #[inline]
    pub fn queues(&self) -> Option<&VhostQueues> {
        match &self.kind {
            PortKind::VhostUser(q) => Some(q),
            _ => None,
        }
    }

    /// The device of an open dpdk port.
    #[inline]
    pub fn nic(&self) -> Option<&NicPort> {
        match &self.kind {
            PortKind::Nic(n) => Some(n),
            _ => None,
        }
    }

    /// The remote endpoint of a tunnel port.
    #[inline]
    pub fn tunnel(&self) -> Option<&tunnel::Tunnel> {
        match &self.kind {
            PortKind::Tunnel(t) => Some(t),
            _ => None,
        }
    }

    /// Receive queues: a vhost-user port's queue pairs (each pair's guest TX queue), a NIC's
    /// receive queues; none for a failed dpdk port.
    pub fn rx_queues(&self) -> usize {
        match &self.kind {
            PortKind::VhostUser(q) => q.pairs(),
            PortKind::Nic(n) => n.rx_queues(),
            PortKind::Failed | PortKind::Tunnel(_) => 0,
        }
    }

    /// Applies a new MTU (a reload); frames are checked against it from the next burst.
    pub fn set_mtu(&self, mtu: u32) {
        self.max_frame.store(mtu + L2_OVERHEAD, Relaxed);
    }

    #[inline]
    pub fn max_frame(&self) -> u32 {
        self.max_frame.load(Relaxed)
    }
}

/// A vhost-user port's virtqueues by vhost-user index: 2q is the guest's RX queue of pair q
/// (the switch writes into it), 2q+1 its TX queue (the switch reads from it).
pub struct VhostQueues {
    rings: Box<[VringLock]>,
    /// A migrated guest's MAC to announce (SEND_RARP).
    pub announcer: Announcer,
}

impl VhostQueues {
    fn new(pairs: u16) -> VhostQueues {
        VhostQueues {
            rings: (0..2 * pairs as usize).map(|_| VringLock::default()).collect(),
            announcer: Announcer::default(),
        }
    }

    /// Every virtqueue, by vhost-user index.
    pub fn all(&self) -> &[VringLock] {
        &self.rings
    }

    pub fn pairs(&self) -> usize {
        self.rings.len() / 2
    }

    /// The guest's TX queue of pair `q` (a receive queue of the switch).
    #[inline]
    pub fn guest_tx(&self, q: usize) -> &VringLock {
        &self.rings[2 * q + 1]
    }

    /// The guest RX queue that frames from source queue pair `src_q` are delivered into, with
    /// its vhost-user index: pair `src_q` modulo this port's count (the next running one if that
    /// is not running). It depends on the source queue, not on the poll thread, so a queue
    /// moved between threads keeps its frames in one receive queue, in order. Two threads
    /// delivering into the same queue serialize on its ring lock.
    #[inline]
    pub fn rx_queue_for(&self, src_q: usize) -> Option<(usize, &VringLock)> {
        let n = self.pairs();
        if n == 0 {
            return None;
        }
        let first = src_q % n;
        (0..n).map(|i| 2 * ((first + i) % n)).map(|v| (v, &self.rings[v])).find(|(_, v)| v.is_ready())
    }
}

/// A MAC the control thread asks the data path to announce from this port (SEND_RARP, after a
/// migration), and how many announcements went out. The poll thread that owns the port's
/// first receive queue takes it on its next visit, awake or woken, whether the guest's rings
/// run or not, and sends the RARP into the switch as if the port had sent it.
#[derive(Default)]
pub struct Announcer {
    /// `PENDING | mac` while an announcement waits; 0 otherwise.
    pending: AtomicU64,
    sent: AtomicU64,
}

const PENDING: u64 = 1 << 63;

impl Announcer {
    /// Asks for `mac` to be announced (a second request before the first went out replaces it).
    pub fn request(&self, mac: MacAddr) {
        let mut b = [0u8; 8];
        b[..6].copy_from_slice(&mac.0);
        self.pending.store(PENDING | u64::from_le_bytes(b), Release);
    }

    /// The MAC waiting to be announced, if one is; it is then no longer waiting. One relaxed
    /// load when none is.
    #[inline]
    pub fn take(&self) -> Option<MacAddr> {
        if self.pending.load(Relaxed) == 0 {
            return None;
        }
        let v = self.pending.swap(0, Acquire);
        (v & PENDING != 0).then(|| MacAddr::from_bytes(&v.to_le_bytes()[..6]))
    }

    /// Whether an announcement waits (a parked queue is polled again for it).
    #[inline]
    pub fn pending(&self) -> bool {
        self.pending.load(Relaxed) != 0
    }

    /// Counts an announcement that went out.
    pub fn sent_one(&self) {
        self.sent.fetch_add(1, Relaxed);
    }

    pub fn sent(&self) -> u64 {
        self.sent.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcer_hands_over_the_last_mac_once() {
        let a = Announcer::default();
        assert_eq!(a.take(), None);
        a.request(MacAddr([2, 0, 0, 0, 0, 1]));
        a.request(MacAddr([0x52, 0x54, 0, 0xab, 0xcd, 0xef]));
        assert_eq!(a.take(), Some(MacAddr([0x52, 0x54, 0, 0xab, 0xcd, 0xef])));
        assert_eq!(a.take(), None);
        a.request(MacAddr::ZERO);
        assert_eq!(a.take(), Some(MacAddr::ZERO), "a zero MAC is still a request");
    }
}
