//! The flow table with real frontends: frames steered, rewritten and dropped by flows exactly as
//! configured, per-flow counters exact, `flows` and `trace` through the control socket.

use crate::common;

use common::*;
use pvswitch::proto::{FlowInfo, FlowsReply, TraceReply};

const MAC_C: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0c];

/// An IPv4/UDP frame to `tp_dst`, stream 2, sequence `seq` in the payload.
fn udp_frame(dst: [u8; 6], src: [u8; 6], tp_dst: u16, seq: u32) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let payload = 8 + 18;
    let total = (20 + payload) as u16;
    f.extend_from_slice(&[0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
    f.extend_from_slice(&4000u16.to_be_bytes());
    f.extend_from_slice(&tp_dst.to_be_bytes());
    f.extend_from_slice(&(payload as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0, 2]);
    f.extend_from_slice(&seq.to_be_bytes());
    f.resize(14 + total as usize, 0xab);
    f
}

fn with_vlan(f: &[u8], vid: u16) -> Vec<u8> {
    let mut out = f[..12].to_vec();
    out.extend_from_slice(&[0x81, 0x00, (vid >> 8) as u8, vid as u8]);
    out.extend_from_slice(&f[12..]);
    out
}

fn flows_config(dir: &std::path::Path, flows: &[&str]) -> String {
    let list: String = flows.iter().map(|f| format!("  \"{f}\",\n")).collect();
    format!(
        "flows = [\n{list}]\n{}",
        Switch::config_text(
            dir,
            &[1],
            &[PortSpec::server("a"), PortSpec::server("b"), PortSpec::server("c")],
            "rx_retry_us = 60000000"
        )
    )
}

fn flow_named<'a>(dump: &'a FlowsReply, text: &str) -> &'a FlowInfo {
    dump.flows.iter().find(|f| f.flow.contains(text)).unwrap()
}

#[test]
fn flows_steer_rewrite_drop_and_count_exactly() {
    let Some(_g) = run_alone(TESTPMD) else { return };
    let dir = test_dir("flows");
    let sw = Switch::start_config(
        dir.clone(),
        &flows_config(
            &dir,
            &[
                "priority=300,in_port=a,udp,tp_dst=53,actions=output:b",
                "priority=200,in_port=a,dl_dst=02:00:00:00:00:0c,actions=drop",
                "priority=100,in_port=a,actions=mod_vlan_vid:42,output:b",
            ],
        ),
    );
    let n = 3000u32;
    let mut sent = Vec::new();
    let mut expect = Vec::new();
    for i in 0..n {
        let f = match i % 3 {
            0 => frame(MAC_B, MAC_A, 64, 0, i),
            1 => frame(MAC_C, MAC_A, 64, 1, i),
            _ => udp_frame(MAC_B, MAC_A, 53, i),
        };
        match i % 3 {
            0 => expect.push(with_vlan(&f, 42)),
            1 => {}
            _ => expect.push(f.clone()),
        }
        sent.push(f);
    }
    write_pcap(&dir.join("in0.pcap"), &sent);
    let PcapVms { a: mut vm_a, b: vm_b } = pcap_vms_opts(&dir, &sw, 1, false, false);
    vm_a.cmd("set fwd io retry");
    vm_a.cmd("set burst tx delay 100 retry 100000");
    vm_a.cmd("start");
    let want = expect.len() as u64;
    let done = try_wait_for(|| (sw.counters("b").tx_packets == want).then_some(()));
    assert!(
        done.is_some(),
        "a {}\nb {}\nflows {}",
        sw.port_info("a").json(),
        sw.port_info("b").json(),
        sw.flows().json()
    );
    vm_a.quit();
    vm_b.quit();
    let got = read_pcap(&dir.join("out0.pcap"));
    assert_eq!(got.len(), expect.len());
    for (i, (g, e)) in got.iter().zip(&expect).enumerate() {
        assert!(g == e, "frame {i} differs: got {:02x?}, expected {:02x?}", &g[..20], &e[..20]);
    }

    let dump = sw.flows();
    let per = |t: &str| flow_named(&dump, t).n_packets;
    assert_eq!(per("tp_dst=53"), n as u64 / 3, "{}", dump.json());
    assert_eq!(per("actions=drop"), n as u64 / 3, "{}", dump.json());
    assert_eq!(per("mod_vlan_vid:42"), n as u64 / 3, "{}", dump.json());
    assert_eq!(flow_named(&dump, "mod_vlan_vid:42").n_bytes, 64 * n as u64 / 3);
    let a = sw.port_info("a");
    assert_eq!(a.counters.rx_packets, n as u64, "{}", a.json());
    assert_eq!(a.counters.drops.get(DropReason::FlowDrop), n as u64 / 3, "{}", a.json());
    let b = sw.port_info("b");
    // B's hello matched no flow.
    assert_eq!(b.counters.drops.get(DropReason::NoMatch), 1, "{}", b.json());
    let expect_bytes: u64 = expect.iter().map(|f| f.len() as u64).sum();
    assert_eq!(b.counters.tx_bytes, expect_bytes, "{}", b.json());
    assert_eq!(dump.missed_packets, 1);
}

#[test]
fn trace_shows_the_flow_and_the_outputs() {
    let _g = serial();
    let dir = test_dir("trace");
    let sw = Switch::start_config(
        dir.clone(),
        &flows_config(
            &dir,
            &[
                "priority=300,in_port=a,tcp,tp_dst=80,actions=output:b,mod_vlan_vid:7,output:c",
                "priority=100,in_port=a,actions=normal",
                "priority=50,actions=drop",
            ],
        ),
    );
    let t = sw.trace("in_port=a,tcp,tp_dst=80");
    assert!(t.flow.as_deref().unwrap().contains("tp_dst=80"), "{}", t.json());
    let outs = &t.outputs;
    assert_eq!(outs.len(), 2, "{}", t.json());
    assert_eq!(outs[0], "b");
    assert!(outs[1].starts_with("c (") && outs[1].contains("vid=7"), "{}", t.json());

    // NORMAL with nothing learned floods to the other ports.
    let t = sw.trace("in_port=a,dl_dst=02:00:00:00:00:99");
    assert_eq!(t.outputs, ["b", "c"], "{}", t.json());
    let t = sw.trace("in_port=b,ip");
    assert!(t.flow.as_deref().unwrap().contains("priority=50"), "{}", t.json());
    assert_eq!(t.outputs.len(), 0);

    for bad in ["", "in_port=zz", "tcp,tp_dst=80", "in_port=a,bogus=1"] {
        let e = sw.try_ctl_args("trace", &[bad]).unwrap_err();
        assert!(e.contains("trace"), "{bad}: {e}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvswitchctl"))
        .args(["--control", sw.ctl.to_str().unwrap(), "flows"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("n_packets=0, n_bytes=0, priority=300,tcp,in_port=a,tp_dst=80 actions="), "{text}");
}

#[test]
fn trace_walks_the_tables_and_the_connection_state_and_flows_show_them() {
    let _g = serial();
    let dir = test_dir("trace-ct");
    let sw = Switch::start_config(
        dir.clone(),
        &flows_config(
            &dir,
            &[
                "priority=10,arp,actions=normal",
                "priority=100,ip,ct_state=-trk,actions=ct(zone=3,table=1)",
                "table=1,priority=100,tcp,in_port=a,tp_dst=80,ct_state=+trk+new,actions=ct(commit,zone=3),output:b",
                "table=1,priority=100,ip,ct_state=+trk+est,actions=resubmit(,2),output:c",
                "table=1,priority=1,actions=drop",
                "table=2,ip,actions=mod_vlan_vid:9,output:b",
            ],
        ),
    );
    let steps = |t: &TraceReply| t.steps.clone();
    // A new connection to 80 from a: tracked in zone 3, committed, to b.
    let t = sw.trace("in_port=a,tcp,tp_dst=80");
    let s = steps(&t);
    assert!(s.iter().any(|l| l.contains("ct(zone=3): +new+trk")), "{:#}", t.json());
    assert!(s.iter().any(|l| l.starts_with("  table 1: table=1,priority=100,tcp,in_port=a")), "{:#}", t.json());
    assert_eq!(t.outputs, ["b"], "{:#}", t.json());
    // The same from b: no flow of table 1 but the catch-all, dropped.
    let t = sw.trace("in_port=b,tcp,tp_dst=80");
    assert!(steps(&t).iter().any(|l| l.contains("table 1: table=1,priority=1 actions=drop")), "{:#}", t.json());
    assert_eq!(t.outputs, Vec::<String>::new(), "{:#}", t.json());
    // Established (as the description says): table 2's tagged output, then table 1's rest.
    let t = sw.trace("in_port=a,tcp,tp_dst=80,ct_state=+est");
    assert!(steps(&t).iter().any(|l| l.contains("ct(zone=3): +est+trk")), "{:#}", t.json());
    assert!(
        steps(&t).iter().any(|l| l.starts_with("    table 2: table=2,priority=32768,ip actions=mod_vlan_vid:9")),
        "{:#}",
        t.json()
    );
    let outs = &t.outputs;
    assert_eq!(outs.len(), 2, "{:#}", t.json());
    assert!(outs[0].starts_with("b (") && outs[0].contains("vid=9"), "{:#}", t.json());
    assert!(outs[1].starts_with("c (") && outs[1].contains("vid=9"), "{:#}", t.json());
    // `flows` prints each flow's table as ovs-ofctl does, and a flow refused says where.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvswitchctl"))
        .args(["--control", sw.ctl.to_str().unwrap(), "flows"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("table=1,priority=100,ip,ct_state=+est+trk actions=resubmit(,2),output:c"), "{text}");
    assert!(text.contains("actions=ct(zone=3,table=1)"), "{text}");
    sw.write_config(&flows_config(&dir, &["ip,actions=ct(commit,nat),normal"]));
    let e = sw.try_reload().unwrap_err();
    assert!(e.contains("ct: nat is not supported"), "{e}");
    // The flows' table answers `conntrack zone=N` (nothing tracked: trace touches nothing).
    let ct = sw.conntrack(Some("zone=3"));
    assert_eq!((ct.flow_total, ct.connections.len()), (0, 0), "{}", ct.json());
    assert!(sw.try_ctl_args("conntrack", &["zone=x"]).unwrap_err().contains("zone=0..65535"));
}
