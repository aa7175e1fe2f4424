//! `pvswitchctl capture`, as an operator runs it: pcapng that tcpdump and tshark read, what a
//! port sent and what it was given compared byte for byte with what the VMs sent and received,
//! a drop with its reason, a filter, a reader that stops (the switch does not), ten captures at
//! once, a port deleted under a capture, a VLAN tag pushed for the port it goes to, and the
//! command's bad input.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption;
use pcap_file::pcapng::{Block, PcapNgReader};
use pvsgen::frontend::Vm;

use crate::common;
use common::vms::*;
use common::*;

const NEEDS: &[Need] = &[Need::Root, Need::Hugepages(64)];

/// A record read back: its interface, way (1 in, 2 out), bytes and comment.
#[derive(Debug, Clone)]
struct Rec {
    iface: u32,
    way: u32,
    data: Vec<u8>,
    comment: Option<String>,
}

/// The records of a pcapng file, and its interfaces' names.
fn read_pcapng(path: &Path) -> (Vec<String>, Vec<Rec>) {
    let bytes = std::fs::read(path).unwrap();
    let mut rd = PcapNgReader::new(&bytes[..]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (mut names, mut recs) = (Vec::new(), Vec::new());
    while let Some(b) = rd.next_block() {
        match b.unwrap() {
            Block::InterfaceDescription(i) => names.push(
                i.options
                    .iter()
                    .find_map(|o| match o {
                        pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption::IfName(n) => {
                            Some(n.to_string())
                        }
                        _ => None,
                    })
                    .unwrap_or_default(),
            ),
            Block::EnhancedPacket(e) => recs.push(Rec {
                iface: e.interface_id,
                way: e
                    .options
                    .iter()
                    .find_map(|o| if let EnhancedPacketOption::Flags(f) = o { Some(*f & 3) } else { None })
                    .unwrap_or(0),
                data: e.data.to_vec(),
                comment: e
                    .options
                    .iter()
                    .find_map(|o| if let EnhancedPacketOption::Comment(c) = o { Some(c.to_string()) } else { None }),
            }),
            _ => {}
        }
    }
    (names, recs)
}

/// `pvswitchctl capture ARGS -w FILE`, started; returns once pvswitchd has hooked it (its
/// first line, on standard error).
fn start_capture(sw: &Switch, file: &Path, args: &[&str]) -> (Child, BufReader<std::process::ChildStderr>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pvswitchctl"))
        .arg("--control")
        .arg(&sw.ctl)
        .arg("capture")
        .args(args)
        .arg("-w")
        .arg(file)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    err.read_line(&mut first).unwrap();
    assert!(first.starts_with("capturing on "), "capture {args:?}: {first}\n{}", sw.log());
    (child, err)
}

/// Waits for a capture's command to end (it is killed, and the test fails, if it has not
/// after `DEADLINE`); returns its standard error after the first line.
fn end_of(mut child: Child, mut err: BufReader<std::process::ChildStderr>) -> String {
    let status = try_wait_for(|| child.try_wait().unwrap());
    let mut rest = String::new();
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        err.read_to_string(&mut rest).unwrap();
        panic!("the capture did not end within {DEADLINE:?}: {rest}");
    };
    err.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "capture failed: {rest}");
    rest
}

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

/// What tcpdump prints of a capture file (one line a frame), failing if it cannot read it.
fn tcpdump(file: &Path, filter: &[&str]) -> Vec<String> {
    let o = Command::new("tcpdump").arg("-nn").arg("-r").arg(file).args(filter).output().expect("tcpdump");
    assert!(o.status.success(), "tcpdump -r {}: {}", file.display(), String::from_utf8_lossy(&o.stderr));
    // One line a frame; an unknown ethertype's hex dump follows it, indented.
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.starts_with(char::is_whitespace))
        .map(String::from)
        .collect()
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
