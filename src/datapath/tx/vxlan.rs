//! VXLAN encapsulation (`encap`): delivery writes a frame to a tunnel port as it writes to a
//! NIC, into an mbuf of the underlay's transmit batch, with the tunnel's outer headers in front
//! (filled per frame: lengths, the IPv4 checksum, a UDP source port hashed from the inner
//! addresses, the next hop's MAC). A tunnel port sends its VLANs untagged (the VNI carries the
//! VLAN), so a tagged frame has its tag popped on the way, as for an access port. Offloads are
//! finished in software first (a tunnel port takes none), each segment encapsulated on its own.
//! A next hop not yet resolved is asked for by ARP (`ask`, which decapsulation's sweep uses too).
#![forbid(unsafe_code)]

use crate::capture::Tap;
use crate::datapath::counters::DropReason;
use crate::datapath::frame::{Frame, Shape};
use crate::datapath::tap;
use crate::datapath::tx::delivery::Delivery;
use crate::datapath::tx::nic::NicDest;
use crate::port::tunnel::Tunnel;
use crate::wire::MacAddr;
use crate::wire::arp::{self, arp_frame};
use crate::wire::vxlan::{self, OUTER_LEN};

/// Writes frame `f`, shaped by `e` (its inner frame, untagged), to tunnel `t` through the
/// underlay `to`: the outer headers for the frame's VLAN in front. A next hop not resolved yet
/// drops the frame and asks (ARP) at most once an interval; a resolved one is confirmed again
/// now and then while frames go. `taps`: the underlay's captures (empty but while it is
/// captured), offered the frame as it left, outer headers and all.
#[inline]
#[allow(clippy::too_many_arguments)]
pub(in crate::datapath) fn encap(
    env_now: u64,
    t: &Tunnel,
    to: &NicDest,
    max_frame: u32,
    f: &Frame,
    e: Shape,
    dv: &mut Delivery,
    taps: &[Tap],
) -> Result<u32, DropReason> {
    let outer = t.outer(f.vlan).ok_or(DropReason::VlanNotAllowed)?;
    let inner_len = e.prefix.len() as u32 + e.body_len(f);
    if inner_len > max_frame {
        return Err(DropReason::Mtu);
    }
    if t.should_ask(env_now, crate::counter::cycles_per_sec()) {
        ask(t, to, dv, taps);
    }
    let mac = t.neighbour().ok_or(DropReason::NoNeighbour)?;
    // The inner addresses (what the UDP source port hashes): the rewritten header's, else
    // the front's (a frame without one is read from the sender).
    let addrs = match e.prefix.get(..12) {
        Some(p) => p.try_into().unwrap_or([0; 12]),
        None => f.front_at::<12>(0).unwrap_or_else(|| {
            let mut a = [0u8; 12];
            f.read_at(0, &mut a);
            a
        }),
    };
    let (src_mac, sport) = (to.nic.mac(), vxlan::source_port(&addrs));
    let fill = |hdr: &mut [u8]| {
        outer.fill(hdr, inner_len as usize, 0, sport);
        hdr[0..6].copy_from_slice(&mac.0);
        hdr[6..12].copy_from_slice(&src_mac.0);
    };
    let len = dv.nic_tx.write_under(to, OUTER_LEN, fill, f, e)?;
    if !taps.is_empty() {
        // The outer headers again, as written (captures only: the write filled the mbuf's).
        let mut hdr = [0u8; OUTER_LEN];
        fill(&mut hdr);
        tap::underlay_sent(to.thread, taps, &hdr, Some((f, e)));
    }
    Ok(len)
}

/// Sends an ARP request for tunnel `t`'s next hop on its underlay `to` (offered to the
/// underlay's captures, `taps`).
#[cold]
pub(in crate::datapath) fn ask(t: &Tunnel, to: &NicDest, dv: &mut Delivery, taps: &[Tap]) {
    let req = arp_frame(MacAddr::BROADCAST, arp::OP_REQUEST, to.nic.mac(), t.cfg.local, MacAddr::ZERO, t.next_hop);
    match dv.nic_tx.write_bytes(to, &req) {
        Ok(()) if !taps.is_empty() => tap::underlay_sent(to.thread, taps, &req, None),
        Ok(()) => {}
        Err(why) => to.pc.drop(why, 1),
    }
}
