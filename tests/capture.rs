//! `pvswitchctl capture`, as an operator runs it: pcapng that tcpdump and tshark read, what a
//! port sent and what it was given compared byte for byte with what the VMs sent and received,
//! a drop with its reason, a filter, a reader that stops (the switch does not), ten captures at
//! once, a port deleted under a capture, a VLAN tag pushed for the port it goes to, the
//! command's bad input, and two QEMU guests' pings and iperf3 picked out by filters.

use std::io::Read;
use std::process::Command;

use pvsgen::frontend::Vm;

use crate::common;
use common::vms::*;
use common::*;

const NEEDS: &[Need] = &[Need::Root, Need::Hugepages(64)];

/// `a` and `b` are the same frames, or the first difference is shown.
fn same(a: &[Vec<u8>], b: &[Vec<u8>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: {} frames captured, {} expected", a.len(), b.len());
    if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
        panic!(
            "{what}: frame {i} differs: {} bytes {:02x?}... expected {} bytes {:02x?}...",
            a[i].len(),
            &a[i][..a[i].len().min(32)],
            b[i].len(),
            &b[i][..b[i].len().min(32)]
        );
    }
}

#[test]
fn what_each_port_sent_and_was_given_byte_for_byte_as_tcpdump_and_tshark_read_it() {
    let Some(_g) = run_alone(&[Need::Root, Need::Hugepages(64), Need::Cmd("tcpdump"), Need::Cmd("tshark")]) else {
        return;
    };
    let mut b = Bench::start("capture-bytes");
    let file = b.sw.dir.join("both.pcapng");
    let n = 40usize;
    // good1's frames in, good2's out: 2n records.
    let count = (2 * n).to_string();
    let (child, err) = start_capture(&b.sw, &file, &["good1", "good2", "-c", &count]);
    let sent: Vec<Vec<u8>> = (0..n).map(|i| frame(MAC_B, MAC_A, 60 + (i * 331) % 1455, 1, 1000 + i as u32)).collect();
    for f in &sent {
        b.good1.send(f);
    }
    let got = recv_n(&mut b.good2, n);
    assert_delivered(&sent, &got);
    let end = end_of(child, err);
    assert!(end.contains(&format!("{} packets captured", 2 * n)) && end.contains("count reached"), "{end}");
    let (names, recs) = read_pcapng(&file);
    assert_eq!(names, ["good1", "good2"]);
    let ins: Vec<Vec<u8>> = recs.iter().filter(|r| r.iface == 0 && r.way == 1).map(|r| r.data.clone()).collect();
    let outs: Vec<Vec<u8>> = recs.iter().filter(|r| r.iface == 1 && r.way == 2).map(|r| r.data.clone()).collect();
    same(&ins, &sent, "good1's frames as it sent them");
    same(&outs, &got, "good2's frames as it was given them");
    assert_eq!(recs.len(), 2 * n);
    // Other readers agree: tcpdump and tshark read every frame.
    assert_eq!(tcpdump(&file, &[]).len(), 2 * n);
    let o = Command::new("tshark").arg("-r").arg(&file).output().expect("tshark");
    assert!(o.status.success(), "tshark: {}", String::from_utf8_lossy(&o.stderr));
    let frames = String::from_utf8_lossy(&o.stdout).lines().filter(|l| l.contains(" → ")).count();
    assert_eq!(frames, 2 * n);
}

#[test]
fn a_filter_runs_where_the_frame_is_and_drops_come_with_their_reason() {
    let Some(_g) = run_alone(&[Need::Root, Need::Hugepages(64), Need::Cmd("tcpdump")]) else { return };
    let b = Bench::start("capture-drops");
    let sw = &b.sw;
    // A run-time port whose only allowed source is MAC_C: a frame from MAC_A is a drop.
    sw.try_ctl_args(
        "add-port",
        &["fenced", "type=vhost-user", "socket=fenced.sock", r#"allowed_macs=["02:00:00:00:00:0c"]"#],
    )
    .unwrap();
    let mut vm = Vm::connect(&sw.sock("fenced"));
    sw.wait_running("fenced", 1);
    let file = sw.dir.join("drops.pcapng");
    // The filter takes the experimental ethertype's frames of stream 7 only (the byte after it).
    let (child, err) = start_capture(
        sw,
        &file,
        &["fenced", "--drops", "-c", "2", "ether", "proto", "0x88b5", "and", "ether[14]", "=", "7"],
    );
    vm.send(&frame(BCAST, MAC_C, 80, 6, 1)); // allowed, but not stream 7: filtered out
    vm.send(&frame(BCAST, MAC_A, 90, 7, 2)); // stream 7, a spoofed source: dropped
    vm.send(&frame(BCAST, MAC_C, 100, 7, 3)); // stream 7, allowed
    let end = end_of(child, err);
    assert!(end.contains("2 packets captured") && end.contains("of 3 seen"), "{end}");
    let (_, recs) = read_pcapng(&file);
    assert_eq!(recs.len(), 2, "{recs:?}");
    assert_eq!((recs[0].data.len(), recs[0].comment.as_deref()), (90, Some("dropped: port_security")));
    assert_eq!((recs[1].data.len(), recs[1].comment.as_deref()), (100, None));
    assert_eq!(tcpdump(&file, &["ether", "src", "02:00:00:00:00:0a"]).len(), 1);
}

/// `--drops` on the way out: a frame delivery could not write to the port (here its receive
/// buffers are too small for it) is a record with its reason, as it would have been written;
/// one that fits is an ordinary record.
#[test]
fn drops_on_the_way_out_come_with_their_reason() {
    let Some(_g) = run_alone(NEEDS) else { return };
    let mut b = Bench::start("capture-drops-out");
    let sw = &b.sw;
    sw.try_ctl_args("add-port", &["small", "type=vhost-user", "socket=small.sock"]).unwrap();
    let mut vm = Vm::connect(&sw.sock("small"));
    sw.wait_running("small", 1);
    vm.post_rx_buffers(64, 256);
    // Its MAC learned, so good1's frames to it are unicast to "small" alone.
    vm.send(&frame(BCAST, MAC_C, 60, 1, 0));
    recv_n(&mut b.good1, 1);
    let file = sw.dir.join("drops-out.pcapng");
    let (child, err) = start_capture(sw, &file, &["small", "--direction", "out", "--drops", "-c", "2"]);
    let (big, fits) = (frame(MAC_C, MAC_A, 1000, 2, 1), frame(MAC_C, MAC_A, 200, 2, 2));
    b.good1.send(&big);
    b.good1.send(&fits);
    assert_eq!(recv_n(&mut vm, 1), vec![fits.clone()]);
    let end = end_of(child, err);
    assert!(end.contains("2 packets captured"), "{end}");
    let (_, recs) = read_pcapng(&file);
    let got: Vec<(usize, Option<&str>)> = recs.iter().map(|r| (r.data.len(), r.comment.as_deref())).collect();
    assert_eq!(got, [(1000, Some("dropped: rx_buffer_too_small")), (200, None)]);
    assert_eq!((&recs[0].data, &recs[1].data), (&big, &fits));
    assert_eq!(sw.counters("small").drops.get(DropReason::RxBufferTooSmall), 1);
}

#[test]
fn a_reader_that_stops_slows_nothing_and_learns_what_it_lost() {
    let Some(_g) = run_alone(NEEDS) else { return };
    let mut b = Bench::start("capture-stopped");
    // 5,000 records: fewer than a poll thread's ring holds of these frames (4 MiB, about 800
    // bytes a record), so the capture can end once its reader reads.
    let req = pvswitch::proto::Request::from_parts("capture", &["good1".into(), "-c".into(), "5000".into()]).unwrap();
    let (_, mut conn) = pvswitch::proto::Client::new(&b.sw.ctl).stream(&req).unwrap();
    // Nobody reads the stream while good1 sends far more than a ring and the socket hold
    // (7,680 frames, 6 MB): every frame still arrives (check_forwarding).
    for _ in 0..60 {
        b.check_forwarding(128);
    }
    // Then the reader reads: the first 5,000 records, and the count of the records lost.
    let mut end = None;
    let mut bytes = 0;
    while end.is_none() {
        let mut hdr = [0u8; 5];
        conn.read_exact(&mut hdr).unwrap();
        let mut buf = vec![0; u32::from_le_bytes(hdr[1..].try_into().unwrap()) as usize];
        conn.read_exact(&mut buf).unwrap();
        match hdr[0] {
            0 => bytes += buf.len(),
            1 => end = Some(serde_json::from_slice::<pvswitch::proto::CaptureEnd>(&buf).unwrap()),
            k => panic!("chunk kind {k}"),
        }
    }
    let end = end.unwrap();
    assert_eq!(end.packets, 5000, "{end:?}");
    assert!(end.lost > 0 && end.seen >= 60 * 128, "{end:?}");
    assert!(bytes > 5000 * 60, "{bytes} bytes of pcapng");
    b.check_forwarding(20);
}

#[test]
fn ten_captures_at_once_each_get_every_frame() {
    let Some(_g) = run_alone(NEEDS) else { return };
    let mut b = Bench::start("capture-ten");
    let n = 25;
    let caps: Vec<_> = (0..10)
        .map(|i| {
            let file = b.sw.dir.join(format!("c{i}.pcapng"));
            let (child, err) = start_capture(&b.sw, &file, &["good1", "--direction", "in", "-c", &n.to_string()]);
            (file, child, err)
        })
        .collect();
    b.check_forwarding(n as u32);
    for (file, child, err) in caps {
        let end = end_of(child, err);
        assert!(end.contains(&format!("{n} packets captured")), "{end}");
        let (_, recs) = read_pcapng(&file);
        assert_eq!(recs.len(), n);
        assert!(recs.iter().all(|r| r.way == 1 && r.iface == 0));
    }
    // Every capture is unhooked: a capture of the same port starts and ends as the first did.
    let _ = b.sw.ports();
}

#[test]
fn a_port_deleted_under_a_capture_ends_it_with_a_message() {
    let Some(_g) = run_alone(NEEDS) else { return };
    let b = Bench::start("capture-deleted");
    let sw = &b.sw;
    sw.try_ctl_args("add-port", &["brief", "type=vhost-user", "socket=brief.sock"]).unwrap();
    let file = sw.dir.join("deleted.pcapng");
    let (child, err) = start_capture(sw, &file, &["brief", "good1"]);
    sw.try_ctl_args("del-port", &["brief"]).unwrap();
    let end = end_of(child, err);
    assert!(end.contains("capture ended: port brief was deleted"), "{end}");
}

#[test]
fn bad_captures_are_refused_with_a_clear_error() {
    let Some(_g) = run_alone(NEEDS) else { return };
    let b = Bench::start("capture-bad");
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_pvswitchctl"))
            .arg("--control")
            .arg(&b.sw.ctl)
            .arg("capture")
            .args(args)
            .args(["-w", "/dev/null"])
            .output()
            .unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stderr).to_string())
    };
    let (code, err) = run(&["nosuch"]);
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("no port named \"nosuch\""), "{err}");
    let (code, err) = run(&["good1", "tcp", "port"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("filter \"tcp port\""), "{err}");
    let (code, err) = run(&["good1", "-c", "0"]);
    assert_eq!(code, Some(2), "{err}");
    let (code, err) = run(&["good1", "--direction", "sideways"]);
    assert_eq!(code, Some(2), "{err}");
    // A garbage request on the wire: refused, and the switch goes on.
    let req = pvswitch::proto::Request::Capture {
        words: vec!["good1".into(), "\0".into()],
        direction: Default::default(),
        drops: false,
        count: None,
        snaplen: 0,
    };
    let e = pvswitch::proto::Client::new(&b.sw.ctl).ask_raw(&req).unwrap_err();
    assert!(e.message.contains("NUL"), "{}", e.message);
    let mut b = b;
    b.check_forwarding(10);
}

#[test]
fn out_is_what_the_port_was_given_its_vlan_tag_pushed() {
    let Some(_g) = run_alone(NEEDS) else { return };
    let b = Bench::start("capture-vlan");
    let sw = &b.sw;
    sw.try_ctl_args("add-port", &["acc", "type=vhost-user", "socket=acc.sock", "tag=10"]).unwrap();
    sw.try_ctl_args("add-port", &["trk", "type=vhost-user", "socket=trk.sock", "trunks=[10]"]).unwrap();
    let mut acc = Vm::connect(&sw.sock("acc"));
    let mut trk = Vm::connect(&sw.sock("trk"));
    sw.wait_running("acc", 1);
    sw.wait_running("trk", 1);
    trk.post_rx_buffers(64, RX_BUF);
    let file = sw.dir.join("vlan.pcapng");
    let (child, err) = start_capture(sw, &file, &["acc", "trk", "-c", "2"]);
    let f = frame(BCAST, MAC_A, 100, 9, 1);
    acc.send(&f);
    let got = recv_n(&mut trk, 1);
    // What trk was given: the frame with VLAN 10's tag pushed after the addresses.
    assert_eq!(got[0].len(), f.len() + 4);
    assert_eq!(&got[0][12..16], &[0x81, 0x00, 0x00, 0x0a]);
    end_of(child, err);
    let (names, recs) = read_pcapng(&file);
    assert_eq!(names, ["acc", "trk"]);
    let find = |iface, way| recs.iter().find(|r| r.iface == iface && r.way == way).map(|r| r.data.clone());
    assert_eq!(find(0, 1), Some(f), "acc's frame as it sent it (untagged)");
    assert_eq!(find(1, 2), Some(got[0].clone()), "trk's frame as it was given it (tagged)");
    assert_eq!(tcpdump(&file, &["vlan", "10"]).len(), 1, "tcpdump's own filter sees the tag");
}

/// Real guests, as an operator watches them: while two QEMU Linux guests ping and run iperf3
/// (scripts/vm-pair.sh), a capture on vm1 with `icmp` gets ICMP only, one with
/// `tcp port 5201` gets iperf3's TCP only (TSO frames whole, as the guest handed them to the
/// switch), and `trace --live` says where vm1's pings went: to vm2, learned.
#[test]
fn real_guests_traffic_is_captured_by_filter_and_traced() {
    let Some(_g) = run_alone(&[QEMU, &[Need::Cmd("tcpdump")]].concat()) else { return };
    let sw = Switch::start("capture-qemu", &[1], &[PortSpec::server("vm1"), PortSpec::server("vm2")]);
    let (icmp, tcp) = (sw.dir.join("icmp.pcapng"), sw.dir.join("tcp.pcapng"));
    // vm-pair pings 5 times each way (and retries one ping until the peer answers): 20
    // ICMP frames at vm1, requests in and replies out, or the other way round.
    let pings = start_capture(&sw, &icmp, &["vm1", "-c", "20", "icmp"]);
    let iperf = start_capture(&sw, &tcp, &["vm1", "-c", "300", "tcp", "port", "5201"]);
    let trace = start_trace(&sw, &["-c", "2", "vm1", "icmp[icmptype]", "=", "icmp-echo"]);
    let logdir = sw.dir.join("vm-pair");
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/vm-pair.sh"))
        .arg(sw.sock("vm1"))
        .arg(sw.sock("vm2"))
        .args(["--logdir", logdir.to_str().unwrap(), "--pings", "5", "--iperf-time", "2"])
        .output()
        .expect("run scripts/vm-pair.sh");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "vm-pair failed:\n{text}\npvswitchd log:\n{}", sw.log());
    let end = end_of(pings.0, pings.1);
    assert!(end.contains("20 packets captured") && end.contains("count reached"), "{end}");
    let end = end_of(iperf.0, iperf.1);
    assert!(end.contains("300 packets captured") && end.contains("count reached"), "{end}");

    let lines = tcpdump(&icmp, &[]);
    assert_eq!(lines.len(), 20, "{lines:#?}");
    for l in &lines {
        assert!(
            l.contains("10.10.0.1 > 10.10.0.2: ICMP echo") || l.contains("10.10.0.2 > 10.10.0.1: ICMP echo"),
            "{l}"
        );
    }
    assert!(lines.iter().any(|l| l.contains("echo request")) && lines.iter().any(|l| l.contains("echo reply")));
    let lines = tcpdump(&tcp, &[]);
    assert_eq!(lines.len(), 300, "{lines:#?}");
    assert!(lines.iter().all(|l| l.contains(".5201") && l.contains("Flags")), "{lines:#?}");
    // The guests hand the switch TSO frames (offloads on by default): recorded whole.
    let (_, recs) = read_pcapng(&tcp);
    let longest = recs.iter().map(|r| r.data.len()).max().unwrap();
    assert!(longest > 1514, "no frame longer than the MTU among {} (longest {longest})", recs.len());

    // Long done (the guests pinged 10 times): a trace still waiting is a failure.
    let (traced, err) = traces(trace.0, trace.1);
    assert!(err.contains("2 frames traced"), "{err}");
    assert_eq!(traced.len(), 2, "{traced:#?}");
    for t in &traced {
        let words = pvswitch::ctl::human::live_trace(t);
        eprint!("{words}");
        assert_eq!((t.port.as_str(), &t.outputs[..], t.dropped.as_deref()), ("vm1", &["vm2".to_string()][..], None));
        let said = |what: &str| t.steps.iter().any(|s| s.contains(what));
        assert!(said("icmp") && said("nw_src=10.10.0.1") && said("nw_dst=10.10.0.2"), "{words}");
        assert!(said("learned on vm2"), "{words}");
    }
}
