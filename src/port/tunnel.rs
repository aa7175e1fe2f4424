//! A remote VXLAN tunnel endpoint as a port (`PortKind::Tunnel`): what the data path needs to
//! send a frame to it (its VNI per VLAN as outer-header templates, the underlay next hop's MAC)
//! and the next hop's address resolution, shared by every poll thread through atomics.
//!
//! The next hop's MAC is learned from ARP on the underlay, from a reply to our own request
//! only (sent to our address and MAC within `REPLY_WINDOW_S` of asking): a gratuitous ARP or
//! an unasked reply from any host on the underlay would otherwise make it the next hop of
//! every frame to that tunnel. A frame toward a tunnel whose next hop is unknown is
//! dropped (`no_neighbour`) and asks again, at most every `ASK_UNKNOWN_MS`; a known MAC is
//! confirmed again every `REFRESH_S` while it is used (the old one serves meanwhile).

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::config::VxlanConfig;
use crate::wire::MacAddr;
use crate::wire::vxlan::Outer;

/// How often a frame toward an unresolved next hop may ask for it.
const ASK_UNKNOWN_MS: u64 = 100;
/// How long a resolved next hop serves before it is asked for again (while used).
const REFRESH_S: u64 = 30;
/// How long after asking a reply is taken.
const REPLY_WINDOW_S: u64 = 2;
/// Time to live of the outer IPv4 header.
const TTL: u8 = 64;

pub struct Tunnel {
    pub cfg: VxlanConfig,
    /// The address whose MAC the outer headers go to (the remote, or the gateway).
    pub next_hop: Ipv4Addr,
    /// By VLAN: the outer headers for its VNI, their MACs written per frame.
    outers: Vec<(u16, Outer)>,
    /// The next hop's MAC (`MacAddr::to_u64`, bit 63 set when known).
    neighbour: AtomicU64,
    /// When it was last learned or confirmed, and last asked for (TSC).
    confirmed: AtomicU64,
    asked: AtomicU64,
}

const KNOWN: u64 = 1 << 63;

impl Tunnel {
    pub fn new(cfg: VxlanConfig) -> Tunnel {
        let mut outers: Vec<(u16, Outer)> = cfg
            .vnis
            .iter()
            .map(|&(vni, vlan)| {
                (vlan, Outer::new(MacAddr::ZERO, MacAddr::ZERO, cfg.local, cfg.remote, cfg.udp_port, vni, TTL))
            })
            .collect();
        outers.sort_by_key(|o| o.0);
        let fixed = cfg.next_hop_mac.map_or(0, |m| m.to_u64() | KNOWN);
        Tunnel {
            next_hop: cfg.next_hop(),
            cfg,
            outers,
            neighbour: AtomicU64::new(fixed),
            confirmed: AtomicU64::new(0),
            asked: AtomicU64::new(0),
        }
    }

    /// The outer headers for frames of VLAN `vlan` (None: the VLAN has no VNI here).
    #[inline]
    pub fn outer(&self, vlan: u16) -> Option<&Outer> {
        self.outers.binary_search_by_key(&vlan, |o| o.0).ok().map(|i| &self.outers[i].1)
    }

    /// The next hop's MAC, if known.
    #[inline]
    pub fn neighbour(&self) -> Option<MacAddr> {
        let v = self.neighbour.load(Relaxed);
        (v & KNOWN != 0).then(|| MacAddr::from_u64(v & !KNOWN))
    }

    /// The next hop said it is at `mac` (at TSC `now`), answering our request: the request
    /// is answered, and a second reply to it counts for nothing.
    pub fn learned(&self, mac: MacAddr, now: u64) {
        if self.cfg.next_hop_mac.is_some() {
            return;
        }
        if self.neighbour.load(Relaxed) != mac.to_u64() | KNOWN {
            self.neighbour.store(mac.to_u64() | KNOWN, Relaxed);
        }
        self.confirmed.store(now, Relaxed);
        self.asked.store(0, Relaxed);
    }

    /// Whether a reply for the next hop is awaited at TSC `now` (`hz` ticks a second): we
    /// asked within `REPLY_WINDOW_S`.
    #[inline]
    pub fn awaits_reply(&self, now: u64, hz: u64) -> bool {
        let asked = self.asked.load(Relaxed);
        asked != 0 && now.wrapping_sub(asked) < REPLY_WINDOW_S * hz
    }

    /// Whether the caller (one poll thread among those sending to this tunnel, at TSC `now`,
    /// `hz` ticks a second) should send an ARP request for the next hop now: it is unknown and
    /// was not asked for lately, or known but not confirmed for a while. At most one caller
    /// wins each interval.
    #[inline]
    pub fn should_ask(&self, now: u64, hz: u64) -> bool {
        if self.cfg.next_hop_mac.is_some() {
            return false;
        }
        let known = self.neighbour.load(Relaxed) & KNOWN != 0;
        if known && now.wrapping_sub(self.confirmed.load(Relaxed)) < REFRESH_S * hz {
            return false;
        }
        let every = if known { hz } else { ASK_UNKNOWN_MS * hz / 1000 };
        let last = self.asked.load(Relaxed);
        now.wrapping_sub(last) >= every && self.asked.compare_exchange(last, now, Relaxed, Relaxed).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> VxlanConfig {
        VxlanConfig {
            vtep: "v".into(),
            underlay: "u".into(),
            local: Ipv4Addr::new(10, 0, 0, 1),
            prefix_len: 24,
            gateway: Some(Ipv4Addr::new(10, 0, 0, 254)),
            next_hop_mac: None,
            udp_port: 4789,
            remote: Ipv4Addr::new(10, 0, 0, 2),
            vnis: vec![(200, 20), (100, 10)],
            learning: true,
        }
    }

    #[test]
    fn vnis_by_vlan_and_next_hops() {
        let t = Tunnel::new(cfg());
        assert_eq!(
            (t.outer(10).map(|o| o.vni()), t.outer(20).map(|o| o.vni()), t.outer(30)),
            (Some(100), Some(200), None)
        );
        assert_eq!(t.next_hop, Ipv4Addr::new(10, 0, 0, 2), "on link: the remote itself");
        let far = Tunnel::new(VxlanConfig { remote: Ipv4Addr::new(10, 9, 0, 2), ..cfg() });
        assert_eq!(far.next_hop, Ipv4Addr::new(10, 0, 0, 254), "off link: the gateway");
    }

    #[test]
    fn asks_once_an_interval_until_known_then_refreshes() {
        let t = Tunnel::new(cfg());
        let hz = 1000;
        assert!(t.should_ask(1_000, hz));
        assert!(!t.should_ask(1_050, hz), "asked 50 ms ago");
        assert!(t.should_ask(1_100, hz));
        let mac = MacAddr([2, 0, 0, 0, 0, 9]);
        t.learned(mac, 1_200);
        assert_eq!(t.neighbour(), Some(mac));
        assert!(!t.should_ask(1_300, hz), "just confirmed");
        assert!(t.should_ask(1_200 + 30_000, hz), "stale: confirmed again");
        assert_eq!(t.neighbour(), Some(mac), "the old MAC serves meanwhile");
    }

    #[test]
    fn a_reply_counts_only_soon_after_asking() {
        let t = Tunnel::new(cfg());
        let hz = 1000;
        assert!(!t.awaits_reply(500, hz), "never asked");
        assert!(t.should_ask(1_000, hz));
        assert!(t.awaits_reply(1_000, hz) && t.awaits_reply(2_999, hz));
        assert!(!t.awaits_reply(3_000, hz), "asked too long ago");
        assert!(t.should_ask(4_000, hz));
        t.learned(MacAddr([2, 0, 0, 0, 0, 9]), 4_001);
        assert!(!t.awaits_reply(4_002, hz), "answered: a second reply counts for nothing");
    }
}
