//! Security groups in the data path (`datapath::firewall`): three VMs, vm1 in a group that
//! lets TCP 5201-5202 in and ICMP from 10.0.0.0/24; every connection tracked in the port's zone.
//! What opens, what replies, what is invalid, floods and action lists per destination, a rule
//! change that cuts, limits, and a switch whose ports have no groups untouched.

use std::sync::Arc;

use super::*;
use crate::config::Config;
use crate::conntrack::packet::build;
use crate::conntrack::{Conntrack, Limits, Timeouts};
use crate::datapath::counters::DropReason;
use crate::datapath::firewall::rules_changed;
use crate::secgroup::{PortRules, compile};
use crate::wire::protocol;

const GROUPS: &str = r#"
[[security_group]]
name = "web"
[[security_group.rule]]
direction = "ingress"
protocol = "tcp"
ports = "5201-5202"
[[security_group.rule]]
direction = "ingress"
protocol = "icmp"
remote = "10.0.0.0/24"
"#;

const NARROWER: &str = r#"
[[security_group]]
name = "web"
[[security_group.rule]]
direction = "ingress"
protocol = "tcp"
ports = 5201
"#;

/// vm1's rules under `groups` (the group "web"), in zone 2.
fn rules(groups: &str) -> Arc<PortRules> {
    rules_in(groups, 2)
}

/// A port's rules under `groups` (the group "web"), in `zone`.
fn rules_in(groups: &str, zone: u16) -> Arc<PortRules> {
    let text = format!(
        "{groups}\n[[port]]\nname = \"vm1\"\ntype = \"vhost-user\"\nsocket = \"/tmp/x/vm1.sock\"\nsecurity_groups = [\"web\"]\n"
    );
    let c = Config::parse("t.toml", &text).unwrap();
    let all: Vec<_> = c.ports.iter().collect();
    Arc::new(compile(&c.ports[0], &c.security_groups, &all, zone).unwrap())
}

pub(super) fn ip(i: usize) -> [u8; 4] {
    [10, 0, 0, 1 + i as u8]
}

/// An IPv4 frame from VM `from` to VM `to` carrying `l4` of protocol `proto`.
pub(super) fn v4(from: usize, to: usize, proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = mac(to).to_vec();
    f.extend_from_slice(&mac(from));
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    f.extend_from_slice(&build::ipv4(proto, ip(from), ip(to), l4));
    f
}

pub(super) fn tcp(from: usize, to: usize, sport: u16, dport: u16, flags: u16, seq: u32, ack: u32) -> Vec<u8> {
    v4(from, to, protocol::TCP, &build::tcp(sport, dport, flags, seq, ack, 64000, None, 10))
}

pub(super) const SYN: u16 = 0x02;
pub(super) const ACK: u16 = 0x10;
pub(super) const SYN_ACK: u16 = 0x12;

/// Three VMs on one thread, vm1 with `rules`, every MAC learned.
fn bench(rules: Arc<PortRules>, limits: Limits) -> Bench {
    let mut b = Bench::new(BenchCfg { vms: 3, ..BenchCfg::default() });
    b.policies[1].rules = Some(rules);
    b.conntrack = Some(Arc::new(Conntrack::new(limits, Timeouts::default())));
    b.post(0);
    for i in 0..3 {
        b.announce(i);
    }
    b
}

fn limits() -> Limits {
    Limits { total: 4096, per_zone: 1024 }
}

/// `f` sent by VM `from`: whether VM `to` got it (and nobody else anything).
pub(super) fn passes(b: &mut Bench, from: usize, to: usize, f: &[u8]) -> bool {
    b.vms[from].guest.send(f);
    b.settle(10);
    let got = b.vms[to].recv();
    for i in (0..b.vms.len()).filter(|&i| i != to) {
        assert!(b.vms[i].recv().is_empty(), "vm{i} got a frame meant for vm{to}");
    }
    match got.as_slice() {
        [] => false,
        [g] => {
            assert_eq!(g, f, "vm{to} got another frame");
            true
        }
        _ => panic!("vm{to} got {} frames", got.len()),
    }
}

#[test]
fn ingress_needs_a_rule_and_replies_and_egress_need_none() {
    let mut b = bench(rules(GROUPS), limits());
    // TCP to 5201: the handshake and data, both ways.
    assert!(passes(&mut b, 0, 1, &tcp(0, 1, 40000, 5201, SYN, 1000, 0)), "a SYN a rule allows");
    assert!(passes(&mut b, 1, 0, &tcp(1, 0, 5201, 40000, SYN_ACK, 9000, 1001)), "its SYN+ACK");
    assert!(passes(&mut b, 0, 1, &tcp(0, 1, 40000, 5201, ACK, 1001, 9001)), "its data");
    assert!(passes(&mut b, 1, 0, &tcp(1, 0, 5201, 40000, ACK, 9001, 1011)), "its data back");
    // No rule: SSH, UDP, ICMP from outside the prefix.
    assert!(!passes(&mut b, 0, 1, &tcp(0, 1, 40001, 22, SYN, 1, 0)), "SSH");
    assert!(!passes(&mut b, 0, 1, &v4(0, 1, protocol::UDP, &build::udp(1234, 53, 8))), "UDP");
    assert_eq!(b.drops(1, DropReason::SecurityGroup), 2, "counted on the port whose rules refused");
    assert_eq!(b.drops(0, DropReason::SecurityGroup), 0);
    let echo = build::icmp(8, 0, [0, 7, 0, 1], &[0; 8]);
    assert!(passes(&mut b, 0, 1, &v4(0, 1, protocol::ICMP, &echo)), "ping from 10.0.0.0/24");
    assert!(passes(&mut b, 1, 0, &v4(1, 0, protocol::ICMP, &build::icmp(0, 0, [0, 7, 0, 1], &[0; 8]))), "its reply");
    // Egress: anything (the group's default), and its replies come back in.
    assert!(passes(&mut b, 1, 2, &v4(1, 2, protocol::UDP, &build::udp(5353, 53, 8))), "a DNS query out");
    assert!(passes(&mut b, 2, 1, &v4(2, 1, protocol::UDP, &build::udp(53, 5353, 8))), "its answer");
    assert!(passes(&mut b, 1, 0, &tcp(1, 0, 50000, 22, SYN, 5, 0)), "vm1's own SSH out");
    assert!(passes(&mut b, 0, 1, &tcp(0, 1, 22, 50000, SYN_ACK, 77, 6)), "its SYN+ACK in");
    // Invalid: an echo reply nobody asked for, a segment far outside the window.
    assert!(!passes(&mut b, 0, 1, &v4(0, 1, protocol::ICMP, &build::icmp(0, 0, [0, 9, 0, 1], &[0; 8]))));
    assert!(!passes(&mut b, 0, 1, &tcp(0, 1, 40000, 5201, ACK, 1001 + (1 << 30), 9001)), "outside the window");
    assert_eq!(b.drops(1, DropReason::CtInvalid), 2);
    // Between vm0 and vm2 (no groups) nothing is tracked or refused.
    assert!(passes(&mut b, 0, 2, &v4(0, 2, protocol::UDP, &build::udp(1, 9, 8))));
    assert_eq!(b.conntrack.as_ref().unwrap().zone_len(2), 4, "5201, ping, DNS, SSH out");
}

#[test]
fn a_flood_reaches_a_port_with_rules_only_where_they_allow() {
    let mut b = bench(rules(GROUPS), limits());
    let bcast = |l4: &[u8], proto| {
        let mut f = v4(0, 1, proto, l4);
        f[..6].copy_from_slice(&[0xff; 6]);
        f
    };
    // Broadcast UDP: vm2 takes it, vm1's rules do not allow it.
    let f = bcast(&build::udp(1, 9, 8), protocol::UDP);
    b.vms[0].guest.send(&f);
    b.settle(10);
    assert_eq!(b.vms[2].recv(), vec![f.clone()]);
    assert!(b.vms[1].recv().is_empty());
    assert_eq!(b.drops(1, DropReason::SecurityGroup), 1);
    // A DHCP offer (server to client) is let in before any rule; ARP is not IP.
    let f = bcast(&build::udp(67, 68, 8), protocol::UDP);
    b.vms[0].guest.send(&f);
    b.settle(10);
    assert_eq!(b.vms[1].recv(), vec![f.clone()]);
    assert_eq!(b.vms[2].recv(), vec![f]);
    // Unknown unicast (an unlearned MAC) floods: checked as vm1's ingress, a rule allows it.
    let mut f = tcp(0, 1, 40000, 5202, SYN, 1, 0);
    f[..6].copy_from_slice(&[0x02, 9, 9, 9, 9, 9]);
    b.vms[0].guest.send(&f);
    b.settle(10);
    assert_eq!(b.vms[1].recv(), vec![f.clone()]);
    assert_eq!(b.vms[2].recv(), vec![f]);
}

#[test]
fn a_guest_may_not_serve_dhcp_or_advertise_a_router() {
    let mut b = bench(rules(GROUPS), limits());
    assert!(!passes(&mut b, 1, 0, &v4(1, 0, protocol::UDP, &build::udp(67, 68, 8))), "a DHCP offer from vm1");
    assert!(passes(&mut b, 1, 0, &v4(1, 0, protocol::UDP, &build::udp(68, 67, 8))), "its DHCP request");
    assert_eq!(b.drops(1, DropReason::SecurityGroup), 1, "counted on the sender for its egress");
}

#[test]
fn a_rule_change_cuts_the_connections_it_no_longer_allows_and_keeps_the_rest() {
    let mut b = bench(rules(GROUPS), limits());
    for port in [5201, 5202] {
        assert!(passes(&mut b, 0, 1, &tcp(0, 1, 40000, port, SYN, 1000, 0)));
        assert!(passes(&mut b, 1, 0, &tcp(1, 0, port, 40000, SYN_ACK, 9000, 1001)));
    }
    // The group loses 5202 (and ICMP): as the switch does after the threads take the new rules.
    let narrower = rules(NARROWER);
    b.policies[1].rules = Some(narrower.clone());
    b.post(0);
    b.settle(2);
    let ct = b.conntrack.clone().unwrap();
    assert_eq!(rules_changed(&ct, 2, Some(&narrower)), 1, "5202's connection cut");
    assert!(passes(&mut b, 0, 1, &tcp(0, 1, 40000, 5201, ACK, 1001, 9001)), "5201 carries on");
    assert!(passes(&mut b, 1, 0, &tcp(1, 0, 5201, 40000, ACK, 9001, 1011)));
    assert!(!passes(&mut b, 0, 1, &tcp(0, 1, 40000, 5202, ACK, 1001, 9001)), "5202 in: cut");
    assert!(!passes(&mut b, 1, 0, &tcp(1, 0, 5202, 40000, ACK, 9001, 1011)), "5202 out: cut too");
    assert!(!passes(&mut b, 0, 1, &tcp(0, 1, 40001, 5202, SYN, 1, 0)), "and no new one");
    // Allowed again: the connection carries on.
    let wider = rules(GROUPS);
    b.policies[1].rules = Some(wider.clone());
    b.post(0);
    b.settle(2);
    assert_eq!(rules_changed(&ct, 2, Some(&wider)), 1);
    assert!(passes(&mut b, 0, 1, &tcp(0, 1, 40000, 5202, ACK, 1001, 9001)));
    // No rules at all: the zone is forgotten.
    let n = ct.zone_len(2) as usize;
    assert_eq!(rules_changed(&ct, 2, None), n);
    assert_eq!(ct.zone_len(2), 0);
}

#[test]
fn a_port_fills_its_own_connection_limit_only() {
    let mut b = bench(rules(GROUPS), Limits { total: 4096, per_zone: 8 });
    for i in 0..8u16 {
        assert!(passes(&mut b, 0, 1, &tcp(0, 1, 30000 + i, 5201, SYN, 1, 0)));
    }
    assert!(!passes(&mut b, 0, 1, &tcp(0, 1, 31000, 5201, SYN, 1, 0)), "the ninth");
    assert_eq!(b.drops(1, DropReason::CtLimit), 1);
    assert!(passes(&mut b, 1, 0, &tcp(1, 0, 5201, 30000, SYN_ACK, 9, 2)), "an existing one still replies");
    assert!(passes(&mut b, 0, 2, &tcp(0, 2, 31000, 5201, SYN, 1, 0)), "vm2, without groups, unaffected");
}

/// A hostile guest (vm0, in a group) floods SYNs with made-up tuples: it fills its own port's
/// quota and no more; vm1, in a group too, still opens connections to vm2 and they carry data,
/// and the table holds room for every other port.
#[test]
fn a_syn_flood_fills_its_own_ports_quota_and_others_still_open_connections() {
    let mut b = Bench::new(BenchCfg { vms: 4, ..BenchCfg::default() });
    b.policies[0].rules = Some(rules_in(GROUPS, 1));
    b.policies[1].rules = Some(rules_in(GROUPS, 2));
    let ct = Arc::new(Conntrack::new(Limits { total: 4096, per_zone: 64 }, Timeouts::default()));
    b.conntrack = Some(ct.clone());
    b.post(0);
    for i in 0..4 {
        b.announce(i);
    }
    const FLOOD: u32 = 1000;
    let mut reached = 0;
    for k in 0..FLOOD {
        b.vms[0].guest.send(&tcp(0, 3, 1024 + k as u16, 80 + (k % 7) as u16, SYN, k, 0));
        if k % 32 == 31 || k == FLOOD - 1 {
            b.settle(10);
            reached += b.vms[3].recv().len();
        }
    }
    assert_eq!(reached, 64, "the flood's connections that fit vm0's quota");
    assert_eq!(ct.zone_len(1), 64);
    assert_eq!(b.drops(0, DropReason::CtLimit), (FLOOD - 64) as u64, "counted on the flooding port");
    for i in 0..8u16 {
        assert!(passes(&mut b, 1, 2, &tcp(1, 2, 40000 + i, 22, SYN, 100, 0)), "vm1's connection {i}");
        assert!(passes(&mut b, 2, 1, &tcp(2, 1, 22, 40000 + i, SYN_ACK, 500, 101)));
        assert!(passes(&mut b, 1, 2, &tcp(1, 2, 40000 + i, 22, ACK, 101, 501)));
    }
    assert_eq!(b.drops(1, DropReason::CtLimit), 0);
    assert_eq!(ct.len(), 64 + 8);
}

#[test]
fn a_switch_without_groups_tracks_nothing() {
    let mut b = Bench::new(BenchCfg { vms: 2, ..BenchCfg::default() });
    b.conntrack = Some(Arc::new(Conntrack::new(limits(), Timeouts::default())));
    b.post(0);
    b.announce(0);
    b.announce(1);
    assert!(passes(&mut b, 0, 1, &tcp(0, 1, 1, 22, ACK, 5, 5)));
    assert!(b.conntrack.as_ref().unwrap().is_empty());
    assert!(b.plan(0).ports.conntrack.is_none(), "the stage is not entered");
}

/// A fragment of an IPv4 datagram from VM `from` to VM `to` (`build::fragment4`).
fn frag(from: usize, to: usize, proto: u8, id: u16, offset: u16, more: bool, data: &[u8]) -> Vec<u8> {
    let mut f = mac(to).to_vec();
    f.extend_from_slice(&mac(from));
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    f.extend_from_slice(&build::fragment4(proto, ip(from), ip(to), id, offset, more, data));
    f
}

#[test]
fn a_fragment_passes_where_its_first_fragment_passed_and_nowhere_else() {
    let mut b = bench(rules(GROUPS), limits());
    // A ping of 2,000 bytes from vm0: ICMP is allowed in from 10.0.0.0/24, both fragments
    // pass, and so do the reply's.
    let echo = build::icmp(8, 0, [0, 7, 0, 1], &[0x5a; 2000]);
    assert!(passes(&mut b, 0, 1, &frag(0, 1, protocol::ICMP, 40, 0, true, &echo[..1480])), "the echo's first");
    assert!(passes(&mut b, 0, 1, &frag(0, 1, protocol::ICMP, 40, 1480, false, &echo[1480..])), "its second");
    let reply = build::icmp(0, 0, [0, 7, 0, 1], &[0x5a; 2000]);
    assert!(passes(&mut b, 1, 0, &frag(1, 0, protocol::ICMP, 90, 0, true, &reply[..1480])), "the reply's first");
    assert!(passes(&mut b, 1, 0, &frag(1, 0, protocol::ICMP, 90, 1480, false, &reply[1480..])), "its second");
    // UDP to vm1 is not allowed: its first fragment is refused by the rules, the rest follow.
    let dns = build::udp(5353, 53, 2000);
    assert!(!passes(&mut b, 0, 1, &frag(0, 1, protocol::UDP, 41, 0, true, &dns[..1480])));
    assert!(!passes(&mut b, 0, 1, &frag(0, 1, protocol::UDP, 41, 1480, false, &dns[1480..])));
    assert_eq!(b.drops(1, DropReason::SecurityGroup), 1);
    assert_eq!(b.drops(1, DropReason::CtInvalid), 1, "the later fragment: no first passed");
    // A later fragment alone, or one overlapping what passed, never passes.
    assert!(!passes(&mut b, 0, 1, &frag(0, 1, protocol::ICMP, 42, 1480, false, &[0; 100])), "no first");
    assert!(!passes(&mut b, 0, 1, &frag(0, 1, protocol::ICMP, 40, 1000, false, &echo[1000..1480])), "an overlap");
    assert_eq!(b.drops(1, DropReason::CtInvalid), 3);
    // vm1's own fragmented UDP out (egress is allowed) passes whole, and its answer comes in.
    assert!(passes(&mut b, 1, 2, &frag(1, 2, protocol::UDP, 43, 0, true, &dns[..1480])));
    assert!(passes(&mut b, 1, 2, &frag(1, 2, protocol::UDP, 43, 1480, false, &dns[1480..])));
    let answer = build::udp(53, 5353, 1600);
    assert!(passes(&mut b, 2, 1, &frag(2, 1, protocol::UDP, 44, 0, true, &answer[..1480])));
    assert!(passes(&mut b, 2, 1, &frag(2, 1, protocol::UDP, 44, 1480, false, &answer[1480..])));
    assert_eq!(b.conntrack.as_ref().unwrap().entries(Some(2), 10).len(), 2, "the ping and the DNS, no notes");
}
