//! A switch port as the data path sees it: its id, its virtqueues, and what the control plane
//! negotiated for it. Shared (`Arc<Port>`) between the control thread and all poll threads.

#[cfg(feature = "dpdk")]
pub mod dpdk;
pub mod nic;
pub mod vhost;

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use crate::config::PortConfig;
use crate::port::nic::NicPort;
use crate::vring::VringLock;

pub struct Port {
    /// Index into every per-thread counter array and into the port table.
    pub id: u16,
    pub cfg: PortConfig,
    /// Virtqueues by vhost-user index: 2q is the guest's RX queue of pair q (the switch
    /// writes into it), 2q+1 its TX queue (the switch reads from it).
    pub vrings: Box<[VringLock]>,
    /// Largest frame accepted from this port: MTU plus Ethernet header and one VLAN tag.
    max_frame: AtomicU32,
    /// A dpdk port's device (then `vrings` is empty); None for a vhost-user port, or a dpdk
    /// port that failed to open.
    pub nic: Option<NicPort>,
}

impl Port {
    pub fn new(id: u16, cfg: PortConfig) -> Port {
        let nq = 2 * cfg.queue_pairs as usize;
        let max_frame = AtomicU32::new(cfg.mtu + 18);
        Port { id, cfg, vrings: (0..nq).map(|_| VringLock::default()).collect(), max_frame, nic: None }
    }

    /// A dpdk port: `nic` is its open device, None if it failed to open.
    pub fn with_nic(id: u16, cfg: PortConfig, nic: Option<NicPort>) -> Port {
        Port { nic, ..Port::new(id, cfg) }
    }

    /// Whether this is a dpdk port (open or failed).
    pub fn is_dpdk(&self) -> bool {
        self.cfg.dpdk.is_some()
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// Queue pairs of a vhost-user port; receive queues of a dpdk port.
    pub fn queue_pairs(&self) -> usize {
        match &self.nic {
            Some(n) => n.rx_queues(),
            None => self.vrings.len() / 2,
        }
    }

    /// Applies a new MTU (a reload); frames are checked against it from the next burst.
    pub fn set_mtu(&self, mtu: u32) {
        self.max_frame.store(mtu + 18, Relaxed);
    }

    #[inline]
    pub fn max_frame(&self) -> u32 {
        self.max_frame.load(Relaxed)
    }

    /// The guest RX queue that frames from source queue pair `src_q` are delivered into:
    /// pair `src_q` modulo this port's count (the next running one if that is not running).
    /// It depends on the source queue, not on the poll thread, so a queue moved between
    /// threads keeps its frames in one receive queue, in order. Two threads delivering into
    /// the same queue serialize on its ring lock.
    #[inline]
    pub fn rx_queue_for(&self, src_q: usize) -> Option<(usize, &VringLock)> {
        let n = self.vrings.len() / 2;
        if n == 0 {
            return None;
        }
        let first = src_q % n;
        (0..n).map(|i| 2 * ((first + i) % n)).map(|v| (v, &self.vrings[v])).find(|(_, v)| v.is_ready())
    }
}
