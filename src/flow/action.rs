//! Flow actions and their execution on an Ethernet header.
//!
//! The data path does not rewrite frames in place. It parses the Ethernet header (addresses and
//! up to two VLAN tags) into an [`EthernetRepr`], [`execute`] runs the action list on a copy of it
//! and hands every output, together with the header as it is at that point, to a callback. The
//! callback writes the header with [`EthernetRepr::emit`] and appends the original frame from the
//! offset [`EthernetRepr::parse`] returned (which starts with the innermost ethertype).

use super::key::{Field, FlowKey, VLAN_PRESENT};
use crate::wire::{EthernetRepr, MacAddr, VlanTag, ethertype};

/// One action of a flow, in ovs-ofctl terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `output:PORT`.
    Output(u16),
    /// `in_port`: send back out of the port the frame came from.
    InPort,
    /// `flood`: all ports except the input port (and, in OVS, ports with flooding disabled).
    Flood,
    /// `all`: all ports except the input port.
    All,
    /// `normal`: the switch's MAC-learning forwarding.
    Normal,
    /// `drop`. The parser never produces it (a dropping flow has an empty action list); if it
    /// appears, execution stops there.
    Drop,
    /// `mod_vlan_vid:VID`: rewrite the outer VID, or push a 0x8100 tag (PCP 0) if untagged.
    SetVlanVid(u16),
    /// `mod_vlan_pcp:PCP`: rewrite the outer PCP, or push a 0x8100 tag (VID 0) if untagged.
    SetVlanPcp(u8),
    /// `strip_vlan`: pop the outer tag (no-op if untagged).
    StripVlan,
    /// `push_vlan:TPID`: push a new outer tag with this TPID, copying the current outer TCI
    /// (0 if untagged).
    PushVlan(u16),
    /// `mod_dl_src:MAC`.
    SetDlSrc(MacAddr),
    /// `mod_dl_dst:MAC`.
    SetDlDst(MacAddr),
    /// `resubmit(,N)`: the flows of table N, then the rest of this list.
    Resubmit(u8),
    /// `goto_table:N` (always last, N later than the flow's own table).
    GotoTable(u8),
    /// `ct(...)`: the frame tracked in a zone, its connection stored (`commit`), and with its
    /// connection state on to a table.
    Ct(Ct),
    /// `ct_clear`: the connection state forgotten (`ct_state`, `ct_zone`, `ct_mark` 0).
    CtClear,
}

impl Action {
    /// Whether the action moves the frame between tables or to the tracker: a flow that has
    /// one runs through `datapath/pipeline.rs` before delivery, whose [`execute`] skips them.
    pub fn is_pipeline(&self) -> bool {
        matches!(self, Action::Resubmit(_) | Action::GotoTable(_) | Action::Ct(_) | Action::CtClear)
    }

    /// What the action does to a frame's flow key, for the tables a walk meets after it
    /// (header rewrites change the fields they rewrite; the key holds one VLAN tag, so a pop
    /// shows the frame untagged and a push keeps the TCI; `ct_clear` zeroes the tracker's
    /// fields). True if it rewrites the frame's header.
    pub fn apply_to_key(&self, k: &mut FlowKey) -> bool {
        match *self {
            Action::SetDlSrc(m) => k.set(Field::DlSrc, m.to_u64()),
            Action::SetDlDst(m) => k.set(Field::DlDst, m.to_u64()),
            Action::SetVlanVid(vid) => {
                let tci = k.vlan_tci() & !VlanTag::VID_MASK;
                k.set(Field::VlanTci, (tci | VLAN_PRESENT | (vid & VlanTag::VID_MASK)) as u64)
            }
            Action::SetVlanPcp(pcp) => {
                let tci = k.vlan_tci() & !VlanTag::PCP_MASK;
                k.set(Field::VlanTci, (tci | VLAN_PRESENT | ((pcp as u16 & 7) << VlanTag::PCP_SHIFT)) as u64)
            }
            Action::StripVlan => k.set(Field::VlanTci, 0),
            Action::PushVlan(_) => k.set(Field::VlanTci, (k.vlan_tci() | VLAN_PRESENT) as u64),
            Action::CtClear => {
                for f in [Field::CtState, Field::CtZone, Field::CtMark] {
                    k.set(f, 0);
                }
                return false;
            }
            _ => return false,
        }
        true
    }

    /// The table the action continues in, after which the list goes on (`resubmit`,
    /// `goto_table`, `ct(table=N)`).
    pub fn next_table(&self) -> Option<u8> {
        match *self {
            Action::Resubmit(t) | Action::GotoTable(t) => Some(t),
            Action::Ct(ct) => ct.table,
            _ => None,
        }
    }
}

/// What `ct(...)` asks, as OVS's ct action: track in `zone`, store the connection
/// (`commit`, with `exec(set_field:V/M->ct_mark)`: `mark`), and continue in `table` with the
/// connection's state (without a table the frame's state stays as it was, as in OVS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ct {
    pub commit: bool,
    pub zone: u16,
    pub table: Option<u8>,
    pub mark: Option<(u32, u32)>,
}

/// Where [`execute`] sends a copy of the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Emit {
    Port(u16),
    InPort,
    Flood,
    All,
    Normal,
}

/// Runs `actions` in order on a working copy of `hdr`. Header actions change the copy; each
/// output action calls `emit` with the header as it is at that point (OVS semantics: in
/// `mod_vlan_vid:5,output:a,strip_vlan,output:b`, `a` gets the tag and `b` does not).
///
/// A push (by `push_vlan`, or `mod_vlan_vid`/`mod_vlan_pcp` on an untagged header) when two
/// tags are already present is ignored: the header would not fit the 20 bytes
/// [`EthernetRepr::emit`] produces, and stacking a third tag is not a use case. [`Action::Drop`]
/// stops execution. Actions between tables are skipped (see [`execute_path`]). Does not
/// allocate.
pub fn execute(actions: &[Action], hdr: &EthernetRepr, mut emit: impl FnMut(Emit, &EthernetRepr)) {
    let mut h = *hdr;
    for a in actions {
        if !step(a, &mut h, &mut emit) {
            return;
        }
    }
}

/// Runs the action lists of a frame's path through the tables, as [`execute`] runs one:
/// `path` holds the flows it met in the order the pipeline stage met them (`NO_MATCH` where a
/// table had none), `actions_of` gives a flow's actions. Each action that went on to a table
/// (`resubmit`, `goto_table`, `ct(table=N)`) runs the next flow of the path there, then the
/// rest of its own list, with the header as that flow left it (OVS's semantics).
pub fn execute_path<'a>(
    path: &[u32],
    actions_of: &dyn Fn(u32) -> &'a [Action],
    hdr: &EthernetRepr,
    mut emit: impl FnMut(Emit, &EthernetRepr),
) {
    let Some((&first, _)) = path.split_first() else { return };
    let mut h = *hdr;
    let mut next = 1;
    run(first, path, &mut next, actions_of, &mut h, &mut emit);
}

/// One flow of [`execute_path`]; false once an action stopped everything.
fn run<'a>(
    flow: u32,
    path: &[u32],
    next: &mut usize,
    actions_of: &dyn Fn(u32) -> &'a [Action],
    h: &mut EthernetRepr,
    emit: &mut impl FnMut(Emit, &EthernetRepr),
) -> bool {
    if flow == u32::MAX {
        return true;
    }
    for a in actions_of(flow) {
        if a.next_table().is_some() {
            let Some(&f) = path.get(*next) else { return false };
            *next += 1;
            if !run(f, path, next, actions_of, h, emit) {
                return false;
            }
        } else if !step(a, h, emit) {
            return false;
        }
    }
    true
}

/// One action on the working header `h`; false if it stops the list (`drop`).
#[inline(always)]
fn step(a: &Action, h: &mut EthernetRepr, emit: &mut impl FnMut(Emit, &EthernetRepr)) -> bool {
    match *a {
        Action::Output(p) => emit(Emit::Port(p), h),
        Action::InPort => emit(Emit::InPort, h),
        Action::Flood => emit(Emit::Flood, h),
        Action::All => emit(Emit::All, h),
        Action::Normal => emit(Emit::Normal, h),
        Action::Drop => return false,
        Action::SetVlanVid(vid) => {
            let vid = vid & VlanTag::VID_MASK;
            if h.ntags == 0 {
                h.push_tag(VlanTag::new(ethertype::VLAN, vid));
            } else {
                h.tags[0].tci = (h.tags[0].tci & !VlanTag::VID_MASK) | vid;
            }
        }
        Action::SetVlanPcp(pcp) => {
            let pcp = ((pcp & 7) as u16) << VlanTag::PCP_SHIFT;
            if h.ntags == 0 {
                h.push_tag(VlanTag::new(ethertype::VLAN, pcp));
            } else {
                h.tags[0].tci = (h.tags[0].tci & !VlanTag::PCP_MASK) | pcp;
            }
        }
        Action::StripVlan => h.pop_tag(),
        Action::PushVlan(tpid) => {
            let tci = h.outer().map_or(0, |t| t.tci);
            h.push_tag(VlanTag::new(tpid, tci));
        }
        Action::SetDlSrc(mac) => h.src = mac,
        Action::SetDlDst(mac) => h.dst = mac,
        // The pipeline stage followed them before delivery (`execute_path`).
        Action::Resubmit(_) | Action::GotoTable(_) | Action::Ct(_) | Action::CtClear => {}
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
    const fn tag(tpid: u16, tci: u16) -> VlanTag {
        VlanTag::new(tpid, tci)
    }

    fn frame(tags: &[(u16, u16)], ty: u16) -> Vec<u8> {
        let mut f = B.0.to_vec();
        f.extend_from_slice(&A.0);
        for &(p, t) in tags {
            f.extend_from_slice(&p.to_be_bytes());
            f.extend_from_slice(&t.to_be_bytes());
        }
        f.extend_from_slice(&ty.to_be_bytes());
        f.extend_from_slice(&[0xde, 0xad]);
        f
    }

    fn run(actions: &[Action], hdr: &EthernetRepr) -> Vec<(Emit, EthernetRepr)> {
        let mut v = Vec::new();
        execute(actions, hdr, |e, h| v.push((e, *h)));
        v
    }

    #[test]
    fn outputs_see_header_at_that_point() {
        let (h, _) = EthernetRepr::parse(&frame(&[], 0x0800)).unwrap();
        let out = run(
            &[
                Action::Output(1),
                Action::SetVlanVid(5),
                Action::Output(2),
                Action::SetDlSrc(B),
                Action::StripVlan,
                Action::Normal,
                Action::InPort,
                Action::Flood,
                Action::All,
            ],
            &h,
        );
        assert_eq!(out.len(), 6);
        assert_eq!(out[0], (Emit::Port(1), h));
        assert_eq!(out[1].1.ntags, 1);
        assert_eq!(out[1].1.tags[0], tag(0x8100, 5));
        assert_eq!(out[2].0, Emit::Normal);
        assert_eq!((out[2].1.ntags, out[2].1.src), (0, B));
        assert_eq!([out[3].0, out[4].0, out[5].0], [Emit::InPort, Emit::Flood, Emit::All]);
        // The input header is untouched.
        assert_eq!(h.ntags, 0);
    }

    #[test]
    fn vlan_rewrites() {
        let (tagged, _) = EthernetRepr::parse(&frame(&[(0x8100, 0xa00c)], 0x0800)).unwrap();
        let (untagged, _) = EthernetRepr::parse(&frame(&[], 0x0800)).unwrap();
        let last = |a: &[Action], h: &EthernetRepr| {
            let mut v = a.to_vec();
            v.push(Action::Output(0));
            run(&v, h).pop().unwrap().1
        };
        // mod_vlan_vid keeps the PCP; on untagged pushes 0x8100 with PCP 0.
        assert_eq!(last(&[Action::SetVlanVid(7)], &tagged).tags[0], tag(0x8100, 0xa007));
        assert_eq!(last(&[Action::SetVlanVid(0x1007)], &untagged).tags[0], tag(0x8100, 7));
        // mod_vlan_pcp keeps the VID; on untagged pushes VID 0.
        assert_eq!(last(&[Action::SetVlanPcp(1)], &tagged).tags[0], tag(0x8100, 0x200c));
        assert_eq!(last(&[Action::SetVlanPcp(7)], &untagged).tags[0], tag(0x8100, 0xe000));
        // push_vlan copies the outer TCI, or 0.
        let h = last(&[Action::PushVlan(0x88a8)], &tagged);
        assert_eq!((h.ntags, h.tags), (2, [tag(0x88a8, 0xa00c), tag(0x8100, 0xa00c)]));
        let h = last(&[Action::PushVlan(0x88a8)], &untagged);
        assert_eq!((h.ntags, h.tags[0]), (1, tag(0x88a8, 0)));
        // A third tag is ignored.
        let h = last(&[Action::PushVlan(0x88a8), Action::PushVlan(0x9100)], &tagged);
        assert_eq!((h.ntags, h.tags[0].tpid), (2, 0x88a8));
        // strip_vlan pops the outer, no-op when untagged.
        let h = last(&[Action::PushVlan(0x88a8), Action::StripVlan], &tagged);
        assert_eq!(h, tagged);
        assert_eq!(last(&[Action::StripVlan, Action::StripVlan], &tagged), untagged);
        assert_eq!(last(&[Action::SetDlDst(A)], &untagged).dst, A);
    }

    #[test]
    fn drop_and_empty_emit_nothing() {
        let (h, _) = EthernetRepr::parse(&frame(&[], 0x0800)).unwrap();
        assert!(run(&[], &h).is_empty());
        assert!(run(&[Action::Drop], &h).is_empty());
        assert!(run(&[Action::Drop, Action::Output(1)], &h).is_empty());
    }
}
