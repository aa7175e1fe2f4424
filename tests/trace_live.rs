//! `pvswitchctl trace --live`, as an operator runs it: the next frames a port sends, each with
//! what the data path did with it. Each test sends frames whose fate it knows (delivered to a
//! learned port, flooded, dropped as runts, steered and rewritten by a flow, dropped by a flow,
//! pushed into a VLAN) and checks the trace says so, and that the frames went where it says.

use std::process::Command;

use pvsgen::frontend::Vm;
use pvswitch::proto::LiveTrace;

use crate::common;
use common::vms::*;
use common::*;

const NEEDS: &[Need] = &[Need::Root, Need::Hugepages(64)];
const MAC_D: [u8; 6] = [0x02, 0, 0, 0, 0, 0xdd];

fn has_step(t: &LiveTrace, text: &str) -> bool {
    t.steps.iter().any(|s| s.contains(text))
}

#[test]
fn each_frame_says_where_it_went_or_why_it_was_dropped() {
    let Some(_g) = run_alone(NEEDS) else { return };
    let mut b = Bench::start("trace-live");
    let (child, err) = start_trace(&b.sw, &["-c", "3", "good1"]);
    let unicast = frame(MAC_B, MAC_A, 100, 9, 1);
    let bcast = frame(BCAST, MAC_A, 120, 9, 2);
    b.good1.send(&unicast);
    b.good1.send(&bcast);
    b.good1.send(&[0u8; 10]);
    let got = recv_n(&mut b.good2, 2);
    assert_delivered(&[unicast, bcast], &got);
    let (t, end) = traces(child, err);
    assert!(end.contains("3 frames traced") && end.contains("count reached"), "{end}");
    assert_eq!(t.len(), 3, "{t:#?}");
    for x in &t {
        eprint!("{}", pvswitch::ctl::human::live_trace(x));
    }
    // Learned: to good2, the MAC table's answer said.
    assert_eq!((t[0].port.as_str(), t[0].len, t[0].dropped.as_deref()), ("good1", 100, None));
    assert_eq!(t[0].outputs, ["good2"], "{:#?}", t[0]);
    assert!(has_step(&t[0], "dl_dst=02:00:00:00:00:0b") && has_step(&t[0], "learned on good2"), "{:#?}", t[0]);
    // A broadcast: every other port (evil too, connected or not).
    assert_eq!(t[1].outputs, ["good2", "evil"], "{:#?}", t[1]);
    assert!(has_step(&t[1], "broadcast/multicast: flood"), "{:#?}", t[1]);
    // A runt: dropped, with the counter's reason.
    assert_eq!((t[2].dropped.as_deref(), t[2].outputs.len()), (Some("runt"), 0), "{:#?}", t[2]);
    b.check_forwarding(10);
}

/// A frame the data path sent to a port that could not take it (its guest posts no receive
/// buffers) is told as not delivered there, with the reason, and not as an output.
#[test]
fn a_frame_its_destination_could_not_take_is_told_as_not_delivered() {
    let Some(_g) = run_alone(NEEDS) else { return };
    let mut b = Bench::start("trace-full");
    // evil is learned (its broadcast) but never posts a receive buffer: its ring is full.
    let mut evil = b.connect_evil();
    b.evil_broadcasts(&mut evil);
    let (child, err) = start_trace(&b.sw, &["-c", "2", "good1", "ether", "dst", "02:00:00:00:00:0c"]);
    b.good1.send(&frame(MAC_C, MAC_A, 100, 9, 1));
    b.good1.send(&frame(MAC_C, MAC_A, 100, 9, 2));
    let (t, _) = traces(child, err);
    assert_eq!(t.len(), 2, "{t:#?}");
    for x in &t {
        eprint!("{}", pvswitch::ctl::human::live_trace(x));
        assert!(has_step(x, "learned on evil"), "{x:#?}");
        assert!(has_step(x, "not delivered to evil: rx_ring_full"), "{x:#?}");
        assert_eq!((x.dropped.as_deref(), x.outputs.len()), (Some("rx_ring_full"), 0), "{x:#?}");
    }
    assert_eq!(b.sw.counters("evil").drops.get(DropReason::RxRingFull), 2);
    b.check_forwarding(10);
}

#[test]
fn a_filter_picks_the_frames_and_the_count_ends_it() {
    let Some(_g) = run_alone(NEEDS) else { return };
    let mut b = Bench::start("trace-filter");
    let (child, err) =
        start_trace(&b.sw, &["good1", "-c", "1", "ether", "dst", "02:00:00:00:00:0b", "and", "ether[14]", "=", "7"]);
    b.good1.send(&frame(BCAST, MAC_A, 80, 7, 1)); // not to MAC_B
    b.good1.send(&frame(MAC_B, MAC_A, 90, 6, 2)); // not stream 7
    b.good1.send(&frame(MAC_B, MAC_A, 100, 7, 3)); // traced
    b.good1.send(&frame(MAC_B, MAC_A, 110, 7, 4)); // past the count
    recv_n(&mut b.good2, 4);
    let (t, end) = traces(child, err);
    assert_eq!(t.len(), 1, "{t:#?}");
    assert_eq!((t[0].len, t[0].outputs.clone()), (100, vec!["good2".to_string()]));
    assert!(end.contains("1 frames traced") && end.contains("count reached"), "{end}");
}

#[test]
fn flows_met_rewrites_and_a_flow_drop_are_told() {
    let Some(_g) = run_alone(NEEDS) else { return };
    let dir = test_dir("trace-flows");
    let ports = [PortSpec::server("good1"), PortSpec::server("good2"), PortSpec::server("evil")];
    let text = format!(
        "flows = [\n  \"priority=20,dl_dst=02:00:00:00:00:dd,actions=drop\",\n  \
         \"priority=10,in_port=good1,dl_dst=02:00:00:00:00:0c,actions=mod_dl_dst:02:00:00:00:00:0b,output:good2\",\n  \
         \"priority=0,actions=normal\",\n]\n{}",
        Switch::config_text(&dir, &[1], &ports, "")
    );
    let mut b = Bench::with_switch(Switch::start_config(dir, &text));
    let (child, err) =
        start_trace(&b.sw, &["good1", "-c", "2", "ether", "proto", "0x88b5", "and", "ether[14]", "=", "5"]);
    b.good1.send(&frame(MAC_C, MAC_A, 100, 5, 1));
    b.good1.send(&frame(MAC_D, MAC_A, 100, 5, 2));
    let got = recv_n(&mut b.good2, 1);
    assert_eq!(&got[0][..6], &MAC_B, "the flow rewrote the destination");
    let (t, _) = traces(child, err);
    assert_eq!(t.len(), 2, "{t:#?}");
    for x in &t {
        eprint!("{}", pvswitch::ctl::human::live_trace(x));
    }
    let steered = &t[0];
    assert!(steered.flow.as_deref().is_some_and(|f| f.contains("mod_dl_dst")), "{steered:#?}");
    assert_eq!((steered.outputs.clone(), steered.dropped.as_deref()), (vec!["good2".to_string()], None));
    let dropped = &t[1];
    assert!(dropped.flow.as_deref().is_some_and(|f| f.contains("actions=drop")), "{dropped:#?}");
    assert_eq!((dropped.dropped.as_deref(), dropped.outputs.len()), (Some("flow_drop"), 0), "{dropped:#?}");
    b.check_forwarding(10);
}

#[test]
fn a_vlan_decision_and_the_tag_each_output_gets_are_told() {
    let Some(_g) = run_alone(NEEDS) else { return };
    let mut b = Bench::start("trace-vlan");
    let sw = &b.sw;
    sw.try_ctl_args("add-port", &["acc", "type=vhost-user", "socket=acc.sock", "tag=10"]).unwrap();
    sw.try_ctl_args("add-port", &["trk", "type=vhost-user", "socket=trk.sock", "trunks=[20]"]).unwrap();
    let mut acc = Vm::connect(&sw.sock("acc"));
    let mut trk = Vm::connect(&sw.sock("trk"));
    sw.wait_running("acc", 1);
    sw.wait_running("trk", 1);
    trk.post_rx_buffers(64, RX_BUF);
    let (child, err) = start_trace(sw, &["acc", "-c", "1"]);
    acc.send(&frame(BCAST, MAC_A, 100, 9, 1));
    let (t, _) = traces(child, err);
    assert_eq!(t.len(), 1);
    assert!(has_step(&t[0], "vlan: VLAN 10 (it came untagged)"), "{:#?}", t[0]);
    // The ports that carry VLAN 10 (every trunk of all VLANs, tagged), not trk (VLAN 20 only).
    assert_eq!(t[0].outputs, ["good1 (tagged 10)", "good2 (tagged 10)", "evil (tagged 10)"], "{:#?}", t[0]);
    // As it went: good1 got it tagged 10.
    let got = recv_n(&mut b.good1, 1);
    assert_eq!(&got[0][12..16], &[0x81, 0x00, 0x00, 0x0a]);
}

#[test]
fn bad_live_traces_are_refused_with_a_clear_error_and_the_described_trace_still_works() {
    let Some(_g) = run_alone(NEEDS) else { return };
    let mut b = Bench::start("trace-bad");
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_pvswitchctl"))
            .arg("--control")
            .arg(&b.sw.ctl)
            .arg("trace")
            .args(args)
            .output()
            .unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stderr).to_string())
    };
    let (code, e) = run(&["--live", "nosuch"]);
    assert_eq!(code, Some(5), "{e}");
    assert!(e.contains("no port named \"nosuch\""), "{e}");
    let (code, e) = run(&["--live", "good1", "tcp", "port"]);
    assert_eq!(code, Some(3), "{e}");
    assert!(e.contains("filter"), "{e}");
    let (code, e) = run(&["--live", "-c", "0", "good1"]);
    assert_eq!(code, Some(2), "{e}");
    let (code, e) = run(&["--live"]);
    assert_eq!(code, Some(2), "{e}");
    let (code, e) = run(&["--live", "good1", "-w", "x.pcapng"]);
    assert_eq!(code, Some(2), "{e}");
    let (code, e) = run(&["in_port=good1,dl_dst=02:00:00:00:00:0b"]);
    assert_eq!(code, Some(0), "{e}");
    b.check_forwarding(10);
}

/// An IPv4/UDP frame of 64 bytes from `src` (10.0.0.`a`, port `pa`) to `dst` (10.0.0.`b`, port
/// `pb`).
fn udp(dst: [u8; 6], src: [u8; 6], a: u8, b: u8, pa: u16, pb: u16) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 46, 0, 1, 0, 0, 64, 17, 0, 0, 10, 0, 0, a, 10, 0, 0, b]);
    let sum = pvswitch::wire::checksum::checksum(&f[14..34]);
    f[24..26].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&pa.to_be_bytes());
    f.extend_from_slice(&pb.to_be_bytes());
    f.extend_from_slice(&[0, 26, 0, 0]);
    f.resize(64, 0x5a);
    f
}

/// With OVS's `ct` flows (a stateful pipeline in zone 5), each traced frame says what the
/// connection tracker made of it: the first of a UDP flow is `+new+trk`, the same flow after
/// the peer answered is `+est+trk`; and a frame no `ct` action saw says nothing of it.
#[test]
fn the_connection_state_of_each_frame_is_told() {
    let Some(_g) = run_alone(NEEDS) else { return };
    let dir = test_dir("trace-ct");
    let ports = [PortSpec::server("good1"), PortSpec::server("good2"), PortSpec::server("evil")];
    let text = format!(
        "flows = [\n  \"table=0,priority=10,ip,actions=ct(table=1,zone=5)\",\n  \
         \"table=0,priority=0,actions=normal\",\n  \
         \"table=1,ct_state=+trk+new,ip,actions=ct(commit,zone=5),normal\",\n  \
         \"table=1,ct_state=+trk+est,ip,actions=normal\",\n]\n{}",
        Switch::config_text(&dir, &[1], &ports, "")
    );
    let mut b = Bench::with_switch(Switch::start_config(dir, &text));
    // The MACs learned first, by frames no flow tracks.
    b.good1.send(&frame(BCAST, MAC_A, 60, 1, 1));
    b.good2.send(&frame(BCAST, MAC_B, 60, 1, 2));
    recv_n(&mut b.good2, 1);
    recv_n(&mut b.good1, 1);
    let (child, err) = start_trace(&b.sw, &["good1", "-c", "3"]);
    b.good1.send(&udp(MAC_B, MAC_A, 1, 2, 4000, 53));
    recv_n(&mut b.good2, 1);
    b.good2.send(&udp(MAC_A, MAC_B, 2, 1, 53, 4000));
    recv_n(&mut b.good1, 1);
    b.good1.send(&udp(MAC_B, MAC_A, 1, 2, 4000, 53));
    b.good1.send(&frame(MAC_B, MAC_A, 60, 1, 3));
    recv_n(&mut b.good2, 2);
    let (t, _) = traces(child, err);
    assert_eq!(t.len(), 3, "{t:#?}");
    for x in &t {
        eprint!("{}", pvswitch::ctl::human::live_trace(x));
    }
    assert!(has_step(&t[0], "conntrack: zone 5, ct_state=+new+trk"), "{:#?}", t[0]);
    assert!(has_step(&t[1], "conntrack: zone 5, ct_state=+est+trk"), "{:#?}", t[1]);
    assert!(!t[2].steps.iter().any(|s| s.contains("conntrack")), "{:#?}", t[2]);
    assert_eq!(t.iter().map(|x| x.outputs.clone()).collect::<Vec<_>>(), vec![vec!["good2".to_string()]; 3]);
}
