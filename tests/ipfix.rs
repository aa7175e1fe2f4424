//! `[ipfix]` against a collector from Debian: tshark, listening on the loopback, decodes what
//! pvswitchd exports (its templates, then the records) with its own IPFIX dissector, and the
//! records it reads hold what pvsgen VMs sent: each direction of a UDP flow its own record,
//! with its ports, addresses, protocol, interfaces, packets and IP bytes.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::common;
use common::vms::*;
use common::*;

/// An Ethernet frame of an IPv4 UDP datagram from `src` (port `sport`) to `dst` (`dport`)
/// with `payload` bytes.
fn udp_frame(dst: [u8; 6], src: [u8; 6], ips: ([u8; 4], [u8; 4]), ports: (u16, u16), payload: usize) -> Vec<u8> {
    let mut f = [dst, src].concat();
    f.extend(0x0800u16.to_be_bytes());
    let total = (20 + 8 + payload) as u16;
    let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0];
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip.extend(ips.0);
    ip.extend(ips.1);
    let sum = ip.chunks(2).map(|w| u16::from_be_bytes([w[0], w[1]]) as u32).sum::<u32>();
    let sum = !(((sum & 0xffff) + (sum >> 16)) as u16);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend(ip);
    f.extend(ports.0.to_be_bytes());
    f.extend(ports.1.to_be_bytes());
    f.extend(((8 + payload) as u16).to_be_bytes());
    f.extend([0, 0]);
    f.extend(std::iter::repeat_n(0x5a, payload));
    f
}

#[test]
fn a_collector_reads_each_flows_record_as_sent() {
    let Some(_g) = run_alone(&[Need::Root, Need::Hugepages(64), Need::Cmd("tshark")]) else { return };
    let dir = test_dir("ipfix");
    let port = 4739 + (std::process::id() % 1000) as u16;
    // The collector first: tshark decoding IPFIX on the loopback, a line a message.
    let fields = ["cflow.srcport", "cflow.dstport", "cflow.protocol", "cflow.packets", "cflow.octets"];
    let more = ["cflow.inputint", "cflow.outputint", "cflow.srcaddr", "cflow.dstaddr", "cflow.layer2_segment_id"];
    let mut tshark = Command::new("tshark");
    tshark.args(["-i", "lo", "-l", "-f", &format!("udp port {port}"), "-d", &format!("udp.port=={port},cflow")]);
    tshark.args(["-T", "fields", "-E", "separator=;"]);
    for f in fields.iter().chain(&more) {
        tshark.args(["-e", f]);
    }
    // A process group of its own: tshark's capturing child (dumpcap) goes with it at the end.
    use std::os::unix::process::CommandExt;
    let mut collector = tshark.process_group(0).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("tshark");
    // Something listens on the port, as a collector would (tshark only watches it).
    let _listener = std::net::UdpSocket::bind(("127.0.0.1", port)).expect("the collector's port");
    let mut err = BufReader::new(collector.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("Capturing on") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "tshark did not start capturing");
    }
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let out = BufReader::new(collector.stdout.take().unwrap());
    std::thread::spawn(move || {
        for l in out.lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    // "Capturing on" is not yet capturing: a template pvswitchd sends before dumpcap's filter is
    // in place is lost, and tshark cannot read a record without its template (CI saw it). So
    // empty IPFIX messages (a header, no sets) go until tshark prints a line for one.
    let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let empty = [&10u16.to_be_bytes()[..], &16u16.to_be_bytes(), &[0; 8], &7u32.to_be_bytes()].concat();
    let deadline = std::time::Instant::now() + DEADLINE;
    loop {
        probe.send_to(&empty, ("127.0.0.1", port)).unwrap();
        if rx.recv_timeout(std::time::Duration::from_millis(100)).is_ok() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "tshark printed nothing for a probe in {DEADLINE:?}");
    }

    let ports = [PortSpec::server("good1"), PortSpec::server("good2"), PortSpec::server("evil")];
    let text = Switch::config_text(&dir, &[1], &ports, "")
        + &format!("[ipfix]\ncollector = \"127.0.0.1:{port}\"\nidle_timeout_s = 1\nobservation_domain_id = 42\n");
    let mut b = Bench::with_switch(Switch::start_config(dir, &text));
    let (id1, id2) = (b.sw.port("good1")["id"].as_u64().unwrap(), b.sw.port("good2")["id"].as_u64().unwrap());
    let (ip1, ip2) = ([10, 9, 0, 1], [10, 9, 0, 2]);
    let there: Vec<Vec<u8>> = (0..50).map(|i| udp_frame(MAC_B, MAC_A, (ip1, ip2), (1234, 5678), 100 + i)).collect();
    let back: Vec<Vec<u8>> = (0..20).map(|_| udp_frame(MAC_A, MAC_B, (ip2, ip1), (5678, 1234), 60)).collect();
    for f in &there {
        b.good1.send(f);
    }
    assert_delivered(&there, &recv_n(&mut b.good2, there.len()));
    for f in &back {
        b.good2.send(f);
    }
    assert_delivered(&back, &recv_n(&mut b.good1, back.len()));
    let ip_bytes = |fs: &[Vec<u8>]| fs.iter().map(|f| f.len() as u64 - 14).sum::<u64>();

    // The records, as the collector decoded them (after an idle second, within a few).
    let mut records: Vec<Vec<String>> = Vec::new();
    let mut lines = Vec::new();
    let deadline = std::time::Instant::now() + DEADLINE;
    while records.len() < 2 && std::time::Instant::now() < deadline {
        let Ok(l) = rx.recv_timeout(std::time::Duration::from_millis(200)) else { continue };
        lines.push(l.clone());
        // A message's fields, each a comma-separated list (a value per record).
        let cols: Vec<Vec<&str>> = l.split(';').map(|c| c.split(',').collect()).collect();
        let n = cols[0].iter().filter(|v| !v.is_empty()).count();
        for r in 0..n {
            records.push(cols.iter().map(|c| c.get(r).copied().unwrap_or("").to_string()).collect());
        }
    }
    // SAFETY: signalling the process group of our own child.
    unsafe { libc::kill(-(collector.id() as i32), libc::SIGKILL) };
    let _ = collector.wait();
    let find = |sport: &str| records.iter().find(|r| r[0] == sport).cloned();
    let a = find("1234")
        .unwrap_or_else(|| panic!("no record of good1's flow: {records:?}\ntshark: {lines:?}\n{}", b.sw.log()));
    let z = find("5678").unwrap_or_else(|| panic!("no record of good2's flow: {records:?}"));
    let (in1, in2) = ((id1 + 1).to_string(), (id2 + 1).to_string());
    let want = |sp: &str, dp: &str, n: usize, bytes: u64, i: &str, o: &str, s: &str, d: &str| {
        // No VTEP carries these VLANs: segment id 0.
        [sp, dp, "17", &n.to_string(), &bytes.to_string(), i, o, s, d, "0"].map(String::from).to_vec()
    };
    assert_eq!(a, want("1234", "5678", 50, ip_bytes(&there), &in1, &in2, "10.9.0.1", "10.9.0.2"));
    assert_eq!(z, want("5678", "1234", 20, ip_bytes(&back), &in2, &in1, "10.9.0.2", "10.9.0.1"));
}

/// `stats` counts what the exporter did, and stopping pvswitchd sends the flows it holds (long
/// timeouts: nothing went before), each with its end reason "forced end", read back by the
/// netflow_parser crate from what a plain socket received.
#[test]
fn stats_count_what_went_and_a_stop_sends_the_flows_held() {
    use netflow_parser::variable_versions::ipfix::FlowSetBody;
    use netflow_parser::{NetflowPacket, NetflowParser};
    use pvswitch::proto::{Request, StatsReply};
    let Some(_g) = run_alone(&[Need::Root, Need::Hugepages(64)]) else { return };
    let dir = test_dir("ipfix-stop");
    let collector = std::net::UdpSocket::bind("127.0.0.1:0").expect("the collector's socket");
    collector.set_read_timeout(Some(std::time::Duration::from_millis(200))).unwrap();
    let port = collector.local_addr().unwrap().port();
    let ports = [PortSpec::server("good1"), PortSpec::server("good2"), PortSpec::server("evil")];
    let text = Switch::config_text(&dir, &[1], &ports, "")
        + &format!("[ipfix]\ncollector = \"127.0.0.1:{port}\"\nidle_timeout_s = 3600\nactive_timeout_s = 3600\n");
    let mut b = Bench::with_switch(Switch::start_config(dir, &text));
    let sent: Vec<Vec<u8>> =
        (0..30).map(|i| udp_frame(MAC_B, MAC_A, ([10, 9, 0, 1], [10, 9, 0, 2]), (4321, 8765), 64 + i)).collect();
    for f in &sent {
        b.good1.send(f);
    }
    assert_delivered(&sent, &recv_n(&mut b.good2, sent.len()));
    // Bench's own frames before these are no IP: not flows.
    let stats = wait_for("30 frames observed in one flow, its templates sent", || {
        let s: StatsReply = b.sw.ask(&Request::Stats { clear: false });
        let x = s.flow_export.clone().expect("stats has flow_export");
        (x.observed == 30 && x.flows == 1 && x.messages > 0).then_some(x)
    });
    assert_eq!((stats.records, stats.flows_not_recorded, stats.send_errors), (0, 0, 0), "{stats:?}");
    assert_eq!((stats.collector, stats.sampling), (format!("127.0.0.1:{port}"), 1));
    b.sw.restart(false);
    // What came: templates (at start and again from the new pvswitchd), then the held flow.
    let mut p = NetflowParser::default();
    let mut rows = Vec::new();
    let mut buf = [0u8; 65536];
    let deadline = std::time::Instant::now() + DEADLINE;
    while rows.is_empty() && std::time::Instant::now() < deadline {
        let Ok(n) = collector.recv(&mut buf) else { continue };
        let parsed = p.parse_bytes(&buf[..n]);
        assert!(parsed.error.is_none(), "{:?}", parsed.error);
        for m in &parsed.packets {
            let NetflowPacket::IPFix(msg) = m else { continue };
            for s in &msg.flowsets {
                if let FlowSetBody::Data(d) = &s.body {
                    rows.extend(d.fields.iter().map(|r| format!("{r:?}")));
                }
            }
        }
    }
    assert_eq!(rows.len(), 1, "the held flow's record, sent as pvswitchd stopped: {rows:?}\n{}", b.sw.log());
    for want in ["U16(4321)", "U16(8765)", "PacketDeltaCount), DataNumber(U64(30))", "FlowEndReason(ForcedEnd)"] {
        assert!(rows[0].contains(want), "{want} not in {}", rows[0]);
    }
}
