//! Printing flows back in `ovs-ofctl dump-flows` syntax.
//!
//! The order is OVS's: `priority`, the protocol shorthand (`ip`, `arp`, `tcp`, ...), `in_port`,
//! `dl_vlan`/`dl_vlan_pcp`, `dl_src`, `dl_dst`, `dl_type` (when no shorthand applies),
//! `nw_src`, `nw_dst`, `nw_proto` (when not in the shorthand), `nw_tos`, `tp_src`, `tp_dst`,
//! then ` actions=`. Masks are printed only when not all-ones; IPv4 masks as a prefix length
//! when they are one. Every flow [`parse_flow`](super::parse_flow) returns prints to a string
//! that parses back to the same flow (given port names that round-trip). A hand-built
//! [`Match`](super::Match) with a partial mask on a field the syntax has no mask for
//! (`in_port`, `dl_type`, `nw_proto`, `nw_tos`) prints the masked value only.

use std::fmt::Write;
use std::net::Ipv4Addr;

use super::action::Action;
use super::key::{Field, VLAN_PRESENT};
use super::{Flow, Match};
use crate::wire::{MacAddr, ethertype};

/// `aa:bb:cc:dd:ee:ff` for a MAC in [`FlowKey`](super::FlowKey) form.
fn mac(v: u64) -> String {
    MacAddr::from_u64(v).to_string()
}

impl Action {
    /// The action in ovs-ofctl syntax; `name` names ports.
    pub fn to_ovs_string(&self, name: &dyn Fn(u16) -> String) -> String {
        match *self {
            Action::Output(p) => format!("output:{}", name(p)),
            Action::InPort => "IN_PORT".into(),
            Action::Flood => "FLOOD".into(),
            Action::All => "ALL".into(),
            Action::Normal => "NORMAL".into(),
            Action::Drop => "drop".into(),
            Action::SetVlanVid(v) => format!("mod_vlan_vid:{v}"),
            Action::SetVlanPcp(p) => format!("mod_vlan_pcp:{p}"),
            Action::StripVlan => "strip_vlan".into(),
            Action::PushVlan(t) => format!("push_vlan:0x{t:04x}"),
            Action::SetDlSrc(m) => format!("mod_dl_src:{}", m),
            Action::SetDlDst(m) => format!("mod_dl_dst:{}", m),
            Action::Resubmit(t) => format!("resubmit(,{t})"),
            Action::GotoTable(t) => format!("goto_table:{t}"),
            Action::CtClear => "ct_clear".into(),
            Action::Ct(ct) => {
                let mut args = Vec::new();
                if ct.commit {
                    args.push("commit".to_string());
                }
                if ct.zone != 0 {
                    args.push(format!("zone={}", ct.zone));
                }
                if let Some(t) = ct.table {
                    args.push(format!("table={t}"));
                }
                if let Some((v, m)) = ct.mark {
                    let m = if m == u32::MAX { String::new() } else { format!("/0x{m:x}") };
                    args.push(format!("exec(set_field:0x{v:x}{m}->ct_mark)"));
                }
                format!("ct({})", args.join(","))
            }
        }
    }
}

impl Match {
    /// The match part of a flow in ovs-ofctl syntax (comma-separated, empty for "any").
    /// Long because it is one line per field, in ovs-ofctl's order: the inverse of the parser.
    pub fn to_ovs_string(&self, name: &dyn Fn(u16) -> String) -> String {
        let mut parts: Vec<String> = Vec::new();
        let k = &self.key;
        let m = &self.mask;
        let full = |f: Field| m.get(f) == f.max();
        let set = |f: Field| m.get(f) != 0;

        // Protocol shorthand.
        let mut proto_named = false;
        let mut type_named = false;
        if full(Field::DlType) {
            match k.dl_type() {
                ethertype::IPV4 => {
                    type_named = true;
                    let short = match k.nw_proto() {
                        1 => "icmp",
                        6 => "tcp",
                        17 => "udp",
                        132 => "sctp",
                        _ => "ip",
                    };
                    proto_named = short != "ip" && full(Field::NwProto);
                    parts.push(if proto_named { short } else { "ip" }.into());
                }
                ethertype::ARP => {
                    type_named = true;
                    parts.push("arp".into());
                }
                ethertype::IPV6 => {
                    type_named = true;
                    parts.push("ipv6".into());
                }
                _ => {}
            }
        }
        if set(Field::InPort) {
            parts.push(format!("in_port={}", name(k.in_port())));
        }
        let (tci, tmask) = (k.vlan_tci(), m.vlan_tci());
        let present = tci & VLAN_PRESENT != 0;
        match tmask {
            0 => {}
            0xffff if tci == 0 => parts.push("dl_vlan=0xffff".into()),
            0x1fff if present => parts.push(format!("dl_vlan={}", tci & 0xfff)),
            0xf000 if present => parts.push(format!("dl_vlan_pcp={}", tci >> 13)),
            0xffff if present => {
                parts.push(format!("dl_vlan={}", tci & 0xfff));
                parts.push(format!("dl_vlan_pcp={}", tci >> 13));
            }
            _ => parts.push(format!("vlan_tci=0x{tci:04x}/0x{tmask:04x}")),
        }
        for f in [Field::DlSrc, Field::DlDst] {
            if set(f) {
                let mask = if full(f) { String::new() } else { format!("/{}", mac(m.get(f))) };
                parts.push(format!("{}={}{mask}", f.name(), mac(k.get(f))));
            }
        }
        if set(Field::DlType) && !type_named {
            parts.push(format!("dl_type=0x{:04x}", k.dl_type()));
        }
        for f in [Field::NwSrc, Field::NwDst] {
            if set(f) {
                let mask = m.get(f) as u32;
                let a = Ipv4Addr::from(k.get(f) as u32);
                parts.push(match mask.leading_ones() {
                    32 => format!("{}={a}", f.name()),
                    n if mask.count_ones() == n => format!("{}={a}/{n}", f.name()),
                    _ => format!("{}={a}/{}", f.name(), Ipv4Addr::from(mask)),
                });
            }
        }
        if set(Field::NwProto) && !proto_named {
            parts.push(format!("nw_proto={}", k.nw_proto()));
        }
        if set(Field::NwTos) {
            parts.push(format!("nw_tos={}", k.nw_tos()));
        }
        for f in [Field::TpSrc, Field::TpDst] {
            if full(f) {
                parts.push(format!("{}={}", f.name(), k.get(f)));
            } else if set(f) {
                parts.push(format!("{}=0x{:x}/0x{:x}", f.name(), k.get(f), m.get(f)));
            }
        }
        if set(Field::CtState) {
            parts.push(format!("ct_state={}", ct_state_string(k.ct_state(), m.ct_state())));
        }
        if set(Field::CtZone) {
            parts.push(format!("ct_zone={}", k.ct_zone()));
        }
        if full(Field::CtMark) {
            parts.push(format!("ct_mark=0x{:x}", k.ct_mark()));
        } else if set(Field::CtMark) {
            parts.push(format!("ct_mark=0x{:x}/0x{:x}", k.ct_mark(), m.ct_mark()));
        }
        parts.join(",")
    }
}

/// A `ct_state` match as OVS prints it: `+trk+est-new` (flags in OVS's order), or
/// `0xV/0xM` where a bit has no name.
pub fn ct_state_string(value: u8, mask: u8) -> String {
    let named = super::ct_state::NAMES.iter().fold(0, |a, (_, b)| a | b);
    if mask & !named != 0 {
        return format!("0x{value:x}/0x{mask:x}");
    }
    let mut s = String::new();
    for (name, bit) in super::ct_state::NAMES {
        if mask & bit != 0 {
            s.push(if value & bit != 0 { '+' } else { '-' });
            s.push_str(name);
        }
    }
    s
}

impl Flow {
    /// The flow in ovs-ofctl syntax, e.g.
    /// `priority=100,ip,in_port=vm1,nw_dst=10.0.0.0/24 actions=output:vm2`. The priority is
    /// always printed, the table when it is not 0; no actions print as `drop`. `name` names
    /// ports.
    pub fn to_ovs_string(&self, name: &dyn Fn(u16) -> String) -> String {
        let mut s = if self.table == 0 { String::new() } else { format!("table={},", self.table) };
        let _ = write!(s, "priority={}", self.priority);
        let m = self.m.to_ovs_string(name);
        if !m.is_empty() {
            s.push(',');
            s.push_str(&m);
        }
        s.push_str(" actions=");
        if self.actions.is_empty() {
            s.push_str("drop");
        }
        for (i, a) in self.actions.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let _ = write!(s, "{}", a.to_ovs_string(name));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_flow;

    const PORTS: [&str; 4] = ["uplink", "vm1", "vm2", "vm3"];

    fn port(s: &str) -> Option<u16> {
        PORTS.iter().position(|p| *p == s).map(|i| i as u16).or_else(|| s.parse().ok())
    }

    fn name(p: u16) -> String {
        PORTS.get(p as usize).map(|s| s.to_string()).unwrap_or_else(|| p.to_string())
    }

    fn print(s: &str) -> String {
        parse_flow(s, &port).unwrap().to_ovs_string(&name)
    }

    #[test]
    fn canonical_form() {
        let cases = [
            (
                "in_port=vm1 ip nw_dst=10.0.0.0/24 priority=100 actions=output:vm2",
                "priority=100,ip,in_port=vm1,nw_dst=10.0.0.0/24 actions=output:vm2",
            ),
            ("actions=", "priority=32768 actions=drop"),
            ("priority=0,actions=NORMAL", "priority=0 actions=NORMAL"),
            (
                "dl_type=0x0800,nw_proto=6,tp_dst=80,actions=vm1,vm2",
                "priority=32768,tcp,tp_dst=80 actions=output:vm1,output:vm2",
            ),
            ("dl_type=0x0806,nw_proto=1,actions=flood", "priority=32768,arp,nw_proto=1 actions=FLOOD"),
            ("ip,nw_proto=47,actions=all", "priority=32768,ip,nw_proto=47 actions=ALL"),
            ("dl_type=0x86dd,dl_vlan=0xffff,actions=in_port", "priority=32768,ipv6,dl_vlan=0xffff actions=IN_PORT"),
            (
                "dl_vlan_pcp=5,dl_vlan=10,actions=strip_vlan,output:uplink",
                "priority=32768,dl_vlan=10,dl_vlan_pcp=5 actions=strip_vlan,output:uplink",
            ),
            ("dl_vlan_pcp=5,actions=drop", "priority=32768,dl_vlan_pcp=5 actions=drop"),
            (
                "table=1,ip,ct_state=-new+trk+est,ct_zone=3,ct_mark=5,actions=ct(commit,zone=3,exec(set_field:7->ct_mark)),normal",
                "table=1,priority=32768,ip,ct_state=-new+est+trk,ct_zone=3,ct_mark=0x5 actions=ct(commit,zone=3,exec(set_field:0x7->ct_mark)),NORMAL",
            ),
            (
                "ct_state=0x40/0x40,ct_mark=1/3,actions=ct_clear,resubmit(,2),goto_table:4",
                "priority=32768,ct_state=0x40/0x40,ct_mark=0x1/0x3 actions=ct_clear,resubmit(,2),goto_table:4",
            ),
            ("ipv6,actions=ct(table=1)", "priority=32768,ipv6 actions=ct(table=1)"),
            ("vlan_tci=0/0x1000,actions=drop", "priority=32768,vlan_tci=0x0000/0x1000 actions=drop"),
            (
                "dl_src=02:00:00:00:00:01/ff:ff:ff:00:00:00,dl_dst=1:2:3:4:5:6 actions=drop",
                "priority=32768,dl_src=02:00:00:00:00:00/ff:ff:ff:00:00:00,dl_dst=01:02:03:04:05:06 actions=drop",
            ),
            (
                "udp,nw_src=10.1.2.3/255.0.255.0,nw_tos=0xbb,tp_src=0x1000/0xf000 actions=drop",
                "priority=32768,udp,nw_src=10.0.2.0/255.0.255.0,nw_tos=184,tp_src=0x1000/0xf000 actions=drop",
            ),
            (
                "icmp,tp_src=8,tp_dst=0,nw_dst=0.0.0.0/0 actions=drop",
                "priority=32768,icmp,tp_src=8,tp_dst=0 actions=drop",
            ),
            (
                "actions=mod_vlan_vid:7,mod_vlan_pcp:3,push_vlan:0x88a8,mod_dl_src:2:0:0:0:0:AA,mod_dl_dst:ff:ff:ff:ff:ff:ff",
                "priority=32768 actions=mod_vlan_vid:7,mod_vlan_pcp:3,push_vlan:0x88a8,mod_dl_src:02:00:00:00:00:aa,\
              mod_dl_dst:ff:ff:ff:ff:ff:ff",
            ),
            ("in_port=17 actions=output:42", "priority=32768,in_port=17 actions=output:42"),
        ];
        for (input, want) in cases {
            assert_eq!(print(input), want, "{input}");
        }
    }

    #[test]
    fn round_trip() {
        let flows = [
            "priority=100,ip,in_port=vm1,nw_dst=10.0.0.0/24 actions=output:vm2",
            "priority=65535,tcp,nw_src=192.168.0.1,tp_src=22,tp_dst=0x1000/0xf000 actions=vm3,uplink",
            "sctp tp_dst=9 actions=drop",
            "arp nw_src=10.0.0.1 nw_dst=10.0.0.0/8 nw_proto=2 actions=normal",
            "dl_vlan=0 dl_vlan_pcp=7 dl_src=aa:bb:cc:dd:ee:ff actions=strip_vlan,flood",
            "dl_vlan=4095,dl_dst=01:00:00:00:00:00/01:00:00:00:00:00,actions=all",
            "vlan_tci=0x1005/0x1fff actions=push_vlan:0x8100,output:vm1,mod_vlan_vid:9,in_port",
            "vlan_tci=0xa000/0xe000 actions=mod_dl_dst:02:00:00:00:00:02,output:2",
            "dl_type=0x88cc actions=",
            "udp,nw_tos=252,nw_dst=10.0.0.0/255.255.0.255,tp_src=0/0xff00 actions=normal",
            "priority=0 actions=drop",
            "tp_dst=80,tcp,in_port=uplink,priority=7,actions=output:vm1",
            "icmp tp_src=3 tp_dst=4 actions=NORMAL",
            "ip nw_proto=0 actions=flood",
            "dl_type=0x0800 nw_proto=6 actions=drop",
            "dl_vlan=0xffff, dl_type=2048, nw_src=1.2.3.4/0 actions=drop",
        ];
        for s in flows {
            let f = parse_flow(s, &port).unwrap();
            let printed = f.to_ovs_string(&name);
            let again = parse_flow(&printed, &port).unwrap_or_else(|e| panic!("{printed}: {e}"));
            assert_eq!(again, f, "{s} -> {printed}");
            assert_eq!(again.to_ovs_string(&name), printed);
        }
    }

    #[test]
    fn random_round_trip() {
        use super::super::key::testutil::Rng;
        let mut rng = Rng(7);
        let pieces: &[&[&str]] = &[
            &["", "priority=1", "priority=40000"],
            &["", "ip", "arp", "tcp", "udp", "sctp", "icmp"],
            &["", "in_port=vm2", "in_port=3"],
            &["", "dl_vlan=5", "dl_vlan=0xffff", "dl_vlan_pcp=2", "vlan_tci=0x1000/0x1000"],
            &["", "dl_src=02:00:00:00:00:01", "dl_dst=00:00:00:00:00:00/01:00:00:00:00:00"],
            &["", "nw_src=10.0.0.0/8", "nw_dst=10.1.1.1", "nw_dst=10.1.1.1/255.255.0.255"],
            &["", "nw_tos=16"],
            &["", "tp_dst=443", "tp_src=0x8000/0x8000"],
        ];
        let acts = ["output:vm1", "vm2", "normal", "flood", "strip_vlan", "mod_vlan_vid:3", "push_vlan:0x88a8"];
        let mut parsed = 0;
        for _ in 0..3000 {
            let mut s: Vec<&str> = pieces.iter().map(|p| rng.pick(p)).filter(|p| !p.is_empty()).collect();
            let n = rng.below(4) as usize;
            let a: Vec<&str> = (0..n).map(|_| rng.pick(&acts)).collect();
            let line = format!("{} actions={}", s.join(","), a.join(","));
            s.clear();
            // Some combinations violate prerequisites; those must fail, the rest round-trip.
            let Ok(f) = parse_flow(&line, &port) else { continue };
            parsed += 1;
            let printed = f.to_ovs_string(&name);
            assert_eq!(parse_flow(&printed, &port).as_ref(), Ok(&f), "{line} -> {printed}");
        }
        assert!(parsed > 500, "{parsed}");
    }
}
