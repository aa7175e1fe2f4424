//! Request parsing, reply round trips, and README's field lists against the reply types.

use std::collections::BTreeSet;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::*;
use crate::datapath::counters::DROP_REASONS;

fn req(command: &str, args: &[&str]) -> Result<Request, String> {
    let line = json!({ "command": command, "args": args }).to_string();
    Request::parse(line.as_bytes())
}

#[test]
fn every_command_parses_and_goes_back_to_the_same_line() {
    let cases = [
        (req("ports", &[]), Request::Ports),
        (req("stats", &[]), Request::Stats { clear: false }),
        (req("stats", &["--clear"]), Request::Stats { clear: true }),
        (req("rxq", &[]), Request::Rxq),
        (req("fdb", &[]), Request::Fdb),
        (req("flows", &[]), Request::Flows),
        (req("trace", &["in_port=vm1", "tcp"]), Request::Trace { fields: "in_port=vm1,tcp".into() }),
        (req("rebalance", &[]), Request::Rebalance { mode: None }),
        (req("rebalance", &["group"]), Request::Rebalance { mode: Some(RxqAssign::Group) }),
        (req("rebalance", &["roundrobin"]), Request::Rebalance { mode: Some(RxqAssign::RoundRobin) }),
        (req("move", &["vm1:1", "0"]), Request::Move { port: "vm1".into(), queue: 1, thread: 0 }),
        (req("move", &["a:b:3", "2"]), Request::Move { port: "a:b".into(), queue: 3, thread: 2 }),
        (req("reload", &[]), Request::Reload),
        (req("version", &[]), Request::Version),
        (req("conntrack", &[]), Request::Conntrack { port: None }),
        (req("conntrack", &["vm1"]), Request::Conntrack { port: Some("vm1".into()) }),
        (req("conntrack-flush", &["vm1"]), Request::ConntrackFlush { port: "vm1".into() }),
        (req("ports", &["vm1"]), Request::Port { name: "vm1".into() }),
        (
            req("add-port", &["vm7", "type=vhost-user", "socket=/run/a=b.sock", "mac_limit=4"]),
            Request::AddPort {
                name: "vm7".into(),
                settings: vec![
                    ("type".into(), "vhost-user".into()),
                    ("socket".into(), "/run/a=b.sock".into()),
                    ("mac_limit".into(), "4".into()),
                ],
                may_exist: false,
            },
        ),
        (
            req("add-port", &["vm7", "--may-exist", "mode=client"]),
            Request::AddPort { name: "vm7".into(), settings: vec![("mode".into(), "client".into())], may_exist: true },
        ),
        (req("del-port", &["vm7"]), Request::DelPort { name: "vm7".into(), if_exists: false }),
        (req("del-port", &["--if-exists", "vm7"]), Request::DelPort { name: "vm7".into(), if_exists: true }),
        (
            req("set-port", &["vm7", "mac_limit="]),
            Request::SetPort { name: "vm7".into(), settings: vec![("mac_limit".into(), "".into())] },
        ),
        (req("vteps", &[]), Request::Vteps),
        (req("mirrors", &[]), Request::Mirrors),
        (
            req("add-mirror", &["tap1", "output_port=mon", "select_src_port=vm1,vm2"]),
            Request::AddMirror {
                name: "tap1".into(),
                settings: vec![("output_port".into(), "mon".into()), ("select_src_port".into(), "vm1,vm2".into())],
            },
        ),
        (req("del-mirror", &["--if-exists", "tap1"]), Request::DelMirror { name: "tap1".into(), if_exists: true }),
        (req("vrfs", &[]), Request::Vrfs),
        (
            req("capture", &["vm1", "vm2", "tcp", "port", "80"]),
            Request::Capture {
                words: ["vm1", "vm2", "tcp", "port", "80"].map(String::from).to_vec(),
                direction: Direction::Both,
                drops: false,
                count: None,
                snaplen: 0,
            },
        ),
        (
            req("capture", &["--direction", "in", "vm1", "--drops", "-c", "5", "-s", "96", "--", "-x"]),
            Request::Capture {
                words: ["vm1", "--", "-x"].map(String::from).to_vec(),
                direction: Direction::In,
                drops: true,
                count: Some(5),
                snaplen: 96,
            },
        ),
        (
            req("trace", &["--live", "vm1", "-c", "3", "icmp", "or", "arp"]),
            Request::TraceLive {
                port: "vm1".into(),
                count: 3,
                filter: ["icmp", "or", "arp"].map(String::from).to_vec(),
            },
        ),
        (req("trace", &["--live", "--", "-odd"]), Request::TraceLive { port: "-odd".into(), count: 1, filter: vec![] }),
        (
            req("vtep-sync", &["vt", r#"{"remotes": []}"#]),
            Request::VtepSync { vtep: "vt".into(), state: r#"{"remotes": []}"#.into() },
        ),
    ];
    let line = Request::Move { port: "vm1".into(), queue: 1, thread: 0 }.to_line();
    assert_eq!(line, r#"{"args":["vm1:1","0"],"command":"move"}"#);
    for (parsed, want) in cases {
        assert_eq!(parsed.as_ref(), Ok(&want));
        assert_eq!(Request::parse(want.to_line().as_bytes()), Ok(want.clone()), "{}", want.to_line());
        assert_eq!(Request::from_parts(want.command(), &want.args()), Ok(want));
    }
}

#[test]
fn the_wire_stays_lenient_about_args() {
    assert_eq!(Request::parse(br#"{"command": "ports"}"#), Ok(Request::Ports));
    assert_eq!(Request::parse(br#"{"command": "stats", "args": "--clear"}"#), Ok(Request::Stats { clear: false }));
    assert_eq!(
        Request::parse(br#"{"command": "stats", "args": [1, "--clear", null]}"#),
        Ok(Request::Stats { clear: true })
    );
    assert_eq!(Request::parse(br#"{"command": "ports", "args": [1], "extra": 1}"#), Ok(Request::Ports));
    assert_eq!(
        Request::parse(br#"{"command": "move", "args": ["a:0", 7, "1"]}"#).ok(),
        req("move", &["a:0", "1"]).ok()
    );
}

#[test]
fn bad_arguments_say_what_was_expected() {
    let usage = "move: expected PORT:QUEUE THREAD, e.g. move vm1:0 1";
    for args in [&[][..], &["vm1:0"], &["vm1", "1"], &["vm1:x", "1"], &["vm1:0", "one"], &["vm1:0", "1", "2"]] {
        assert_eq!(req("move", args), Err(usage.into()), "{args:?}");
    }
    let e = req("rebalance", &["fastest"]).unwrap_err();
    assert!(e.starts_with("rebalance: rxq_assign: expected"), "{e}");
    for args in [&[][..], &[""]] {
        let e = req("trace", args).unwrap_err();
        assert!(e.starts_with("trace: expected a frame description"), "{e}");
    }
    for args in [&["--live"][..], &["--live", "-c", "3"], &["--live", "-x", "vm1"], &["--live", "-c", "0", "vm1"]] {
        let e = req("trace", args).unwrap_err();
        assert!(e.starts_with("trace --live: "), "{args:?}: {e}");
    }
    let e = req("trace", &["--live", "-c", "10001", "vm1"]).unwrap_err();
    assert!(e.contains("from 1 to 10000"), "{e}");
    assert_eq!(req("add-port", &[]), Err("add-port: expected NAME KEY=VALUE...".into()));
    assert_eq!(req("add-port", &["vm1", "socket"]), Err("add-port: expected KEY=VALUE, found \"socket\"".into()));
    assert_eq!(req("add-port", &["vm1", "=x"]), Err("add-port: expected KEY=VALUE, found \"=x\"".into()));
    assert_eq!(
        req("add-port", &["type=dpdk", "vm1"]),
        Err("add-port: expected NAME KEY=VALUE..., found \"type=dpdk\" first".into())
    );
    assert_eq!(req("del-port", &["a", "b"]), Err("del-port: expected [--if-exists] NAME".into()));
    assert_eq!(req("set-port", &["a"]), Err("set-port: expected NAME KEY=VALUE...".into()));
    assert_eq!(req("ports", &["a", "b"]), Err("ports: expected at most one port name".into()));
    assert!(req("vtep-sync", &["vt"]).unwrap_err().starts_with("vtep-sync: expected VTEP STATE"));
    for (args, want) in [
        (&[][..], "capture: expected [--direction"),
        (&["--"], "capture: expected [--direction"),
        (&["vm1", "-c"], "capture: -c needs a count"),
        (&["vm1", "-c", "0"], "capture: -c 0: expected a count above 0"),
        (&["vm1", "-s", "big"], "capture: -s big: expected a length"),
        (&["vm1", "--direction", "up"], "capture: direction \"up\": expected in, out or both"),
        (&["vm1", "-x"], "capture: unknown option -x"),
    ] {
        let e = req("capture", args).unwrap_err();
        assert!(e.starts_with(want), "{args:?}: {e}");
    }
}

#[test]
fn garbage_is_refused_with_the_same_errors_as_before() {
    let expected_command = "malformed request: expected {\"command\": \"...\"}";
    assert!(Request::parse(b"not json").unwrap_err().starts_with("malformed request: expected ident"));
    assert!(Request::parse(b"\xff\xfe").unwrap_err().starts_with("malformed request: "));
    assert_eq!(Request::parse(br#"{"command": 7}"#), Err(expected_command.into()));
    assert_eq!(Request::parse(br#"["ports"]"#), Err(expected_command.into()));
    assert_eq!(Request::parse(br#"{"args": []}"#), Err(expected_command.into()));
    assert_eq!(
        Request::parse(br#"{"command": "reboot"}"#),
        Err("unknown command \"reboot\" (try ports, stats, rxq, fdb, flows, trace, rebalance, move, reload, version, \
             add-port, del-port, set-port, vteps, vtep-sync, conntrack, conntrack-flush, capture, mirrors, vrfs)"
            .into())
    );
}

#[test]
fn the_envelope_is_the_same_json_as_before() {
    assert_eq!(Reply::<()>::new(Err("no".into())).to_line(), r#"{"error":"no","ok":false}"#);
    let ok = Reply::new(Ok(MoveReply { moved: true, from: 0, to: 1, took_us: 5 })).to_line();
    assert_eq!(ok, r#"{"ok":true,"result":{"from":0,"moved":true,"to":1,"took_us":5}}"#);
    let back: Reply<MoveReply> = serde_json::from_str(&ok).unwrap();
    assert_eq!(back.into_result(), Ok(MoveReply { moved: true, from: 0, to: 1, took_us: 5 }));
    let err: Reply<MoveReply> = serde_json::from_str(r#"{"error":"no","ok":false}"#).unwrap();
    assert_eq!(err.into_result(), Err("no".into()));
    let coded = Reply::<()>::coded(Err(CtlError { code: Some(ErrorCode::NotFound), message: "no".into() }));
    assert_eq!(coded.to_line(), r#"{"code":"not-found","error":"no","ok":false}"#);
    let back: Reply<()> = serde_json::from_str(&coded.to_line()).unwrap();
    assert_eq!(back.into_outcome().unwrap_err().code.map(ErrorCode::exit_status), Some(5));
    let empty: Reply<MoveReply> = serde_json::from_str(r#"{"ok":true}"#).unwrap();
    assert!(empty.into_result().is_err());
}

/// Populated replies (every optional field set), shared with `ctl::human`'s tests.
pub(crate) mod samples {
    use super::super::*;

    pub fn drops() -> Drops {
        let mut d = Drops::default();
        d.0[0] = 3;
        d.0[5] = 1;
        d
    }

    pub fn port() -> PortInfo {
        let rxq = QueueInfo {
            index: 0,
            kind: QueueKind::GuestRx,
            size: Some(256),
            enabled: Some(true),
            running: Some(true),
            ..QueueInfo::default()
        };
        let txq = QueueInfo {
            index: 1,
            kind: QueueKind::GuestTx,
            error: Some("descriptor loop".into()),
            poll_thread: Some(0),
            rx_packets: Some(10),
            rx_bytes: Some(640),
            ..rxq.clone()
        };
        let nicq = QueueInfo {
            index: 0,
            kind: QueueKind::NicRx,
            poll_thread: Some(1),
            rx_packets: Some(1),
            ..Default::default()
        };
        let nic = NicInfo {
            device: "net_null0".into(),
            stats: Some(NicStats::default()),
            mac: Some("x".into()),
            ..Default::default()
        };
        PortInfo {
            name: "vm1".into(),
            kind: "vhost-user".into(),
            socket: "/run/pvswitch/vm1.sock".into(),
            mode: "server".into(),
            device: Some("net_null0".into()),
            dpdk: Some(nic),
            vxlan: Some(VxlanInfo { next_hop_mac: Some("x".into()), ..Default::default() }),
            state: "connected".into(),
            connected_secs: Some(5),
            last_error: Some("frontend closed".into()),
            features: vec!["MRG_RXBUF".into(), "VERSION_1".into()],
            offloads: Some(PortOffloads { offered: true, guest_sends: vec!["csum".into()], guest_takes: vec![] }),
            numa_node: Some(0),
            vlan: PortVlanInfo { mode: "native-untagged".into(), tag: Some(10), trunks: vec!["20-29".into()] },
            rate_caps: RateCapsInfo {
                ingress_pps: 1000,
                ingress_bps: 8_000_000,
                egress_pps: 2000,
                egress_bps: 16_000_000,
                burst_ms: 10,
                tokens: RateTokens {
                    ingress_pps: Some(5),
                    ingress_bps: Some(64),
                    egress_pps: Some(0),
                    egress_bps: Some(-3),
                },
            },
            queues: vec![rxq, txq, nicq],
            counters: Counters { rx_packets: 10, drops: drops(), ..Counters::default() },
            ..PortInfo::default()
        }
    }

    pub fn stats() -> StatsReply {
        let thread = ThreadStats {
            queues: vec!["vm1:0".into()],
            numa_node: Some(0),
            busy_pct: 12.5,
            drops: drops(),
            poll_mode: PollMode::Adaptive,
            running: RunningInfo {
                burst: 32,
                rx_retry_us: 100,
                idle_before_sleep_us: Some(1000),
                nic_poll_interval_us: 100,
                nic_poll_max_us: 2000,
                nic_sleep_us: 100,
                park_after_us: 1000,
                park_check_us: 50,
            },
            wake_latency_us: vec![WakeBucket { below_us: Some(1), count: 2 }, WakeBucket { below_us: None, count: 0 }],
            last_interval: Some(ThreadInterval { seconds: 1.0, rx_pps: 100.0, ..Default::default() }),
            ..ThreadStats::default()
        };
        let flow_export = Some(FlowExportStats {
            collector: "192.0.2.10:4739".into(),
            sampling: 1000,
            records: 3,
            ..Default::default()
        });
        StatsReply {
            uptime_secs: 7,
            tsc_hz: 2_000_000_000,
            cleared_secs_ago: Some(1.5),
            threads: vec![thread],
            flow_export,
        }
    }

    pub fn rxq() -> RxqInfo {
        RxqInfo {
            port: "vm1".into(),
            numa_node: Some(0),
            busy_share_pct: 50.0,
            last_interval: Some(RxqInterval { seconds: 1.0, pps: 10.0, busy_share_pct: 25.0 }),
            counters: RxqTotals { packets: 10, ..Default::default() },
            ..RxqInfo::default()
        }
    }

    pub fn flows() -> FlowsReply {
        let flow = FlowInfo {
            table: 0,
            priority: 10,
            matches: "in_port=vm1".into(),
            actions: vec!["output:vm2".into()],
            flow: "priority=10,in_port=vm1 actions=output:vm2".into(),
            n_packets: 2,
            n_bytes: 128,
            duration_secs: 1.25,
        };
        FlowsReply { normal_only: false, missed_packets: 1, missed_bytes: 60, flows: vec![flow] }
    }

    pub fn trace() -> TraceReply {
        TraceReply {
            flow: Some("priority=10 actions=normal".into()),
            outputs: vec!["vm2".into()],
            steps: vec!["a".into()],
        }
    }

    pub fn rebalance() -> RebalanceReply {
        RebalanceReply {
            policy: "cycles".into(),
            moved: vec!["vm1:0 thread 0 -> 1".into()],
            took_us: 30,
            spread_before: 0.5,
            spread_after: 0.1,
            warnings: vec!["w".into()],
        }
    }

    pub fn fdb() -> FdbEntry {
        FdbEntry { mac: "02:00:00:00:00:01".into(), vlan: 10, port: Some("vm1".into()) }
    }
}

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(t: T) {
    let line = Reply::new(Ok(&t)).to_line();
    let back: Reply<T> = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
    assert_eq!(back.into_result().as_ref(), Ok(&t), "{line}");
}

#[test]
fn every_reply_type_reads_back_what_was_sent() {
    round_trip(vec![samples::port(), PortInfo::default()]);
    round_trip(samples::stats());
    round_trip(StatsReply::default());
    round_trip(vec![samples::rxq()]);
    round_trip(samples::flows());
    round_trip(samples::trace());
    round_trip(TraceReply::default());
    round_trip(samples::rebalance());
    round_trip(MoveReply { moved: true, from: 1, to: 0, took_us: 9 });
    round_trip(vec![samples::fdb(), FdbEntry { mac: "m".into(), vlan: 0, port: None }]);
    round_trip(Cleared { cleared: true });
    round_trip(ReloadReply { summary: "ports: 1 added".into() });
    round_trip(VersionReply::current());
}

#[test]
fn the_wire_keeps_its_shapes() {
    let v = serde_json::to_value(samples::port()).unwrap();
    assert_eq!(v["type"], "vhost-user");
    assert_eq!(v["rx_packets"], 10, "counters are inline");
    assert_eq!(v["drops"]["rx_ring_full"], 3);
    assert_eq!(v["drops"].as_object().unwrap().len(), DROP_REASONS.len());
    assert_eq!(v["queues"][1]["kind"], "guest_tx");
    assert_eq!(v["queues"][0]["poll_thread"], Value::Null, "present, null");
    assert_eq!(v["queues"][2]["size"], Value::Null, "a NIC queue's virtqueue fields: present, null");
    let v = serde_json::to_value(samples::stats()).unwrap();
    assert_eq!(v["threads"][0]["poll_mode"], "adaptive");
    assert_eq!(v["threads"][0]["wake_latency_us"][1]["below_us"], Value::Null);
    assert_eq!(serde_json::to_value(samples::flows()).unwrap()["flows"][0]["match"], "in_port=vm1");
    assert_eq!(serde_json::to_value(samples::rxq()).unwrap()["packets"], 10);
    // Drops read leniently: a reason missing is 0, an unknown one ignored.
    let d: Drops = serde_json::from_str(r#"{"runt": 4, "no_such_reason": 1}"#).unwrap();
    assert_eq!(d.get(crate::datapath::counters::DropReason::Runt), 4);
    assert_eq!(d.0.iter().sum::<u64>(), 4);
}

/// The field names README's "JSON" list gives for `command`: the backticked words of its
/// bullet, the bullet's own name left out.
fn documented(readme: &str, command: &str) -> BTreeSet<String> {
    let readme = &readme[readme.find("**JSON**").expect("README's JSON section")..];
    let start = readme.find(&format!("\n- `{command}`:")).unwrap_or_else(|| panic!("README documents no `{command}`"));
    let rest = &readme[start + 1..];
    let end = rest[1..].find("\n- ").map_or(rest.len(), |i| i + 1);
    let end = end.min(rest.find("\n\n").unwrap_or(rest.len()));
    rest[..end].split('`').skip(1).step_by(2).skip(1).map(|w| w.to_string()).collect()
}

/// Every key of every object in `v`, however deep, but not inside an object under a key in
/// `opaque` (maps keyed by data, such as drop reasons, and objects documented elsewhere).
fn keys(v: &Value, opaque: &[&str], out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                out.insert(k.clone());
                if !opaque.contains(&k.as_str()) {
                    keys(x, opaque, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| keys(x, opaque, out)),
        _ => {}
    }
}

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap()
}

/// README's field list for `command` and the keys of `reply` (a populated instance of its
/// type) are the same set.
fn check(readme: &str, command: &str, reply: impl Serialize, opaque: &[&str]) -> Result<(), String> {
    let mut have = BTreeSet::new();
    keys(&serde_json::to_value(reply).unwrap(), opaque, &mut have);
    let doc = documented(readme, command);
    let undocumented: Vec<_> = have.difference(&doc).collect();
    let missing: Vec<_> = doc.difference(&have).collect();
    if !undocumented.is_empty() {
        return Err(format!("`{command}` has fields README does not list: {undocumented:?}"));
    }
    if !missing.is_empty() {
        return Err(format!("README lists `{command}` fields the type lacks: {missing:?}"));
    }
    Ok(())
}

#[test]
fn readme_lists_exactly_the_fields_of_each_reply() {
    let readme = readme();
    let r = readme.as_str();
    // A dpdk port's `dpdk` object is what DPDK reports (README: "Configuration"); a tunnel
    // port's `vxlan` object is described with VTEPs (README: "Beyond one host").
    check(r, "ports", vec![samples::port()], &["drops", "dpdk", "vxlan"]).unwrap();
    check(r, "stats", samples::stats(), &["drops"]).unwrap();
    check(r, "stats --clear", Cleared { cleared: true }, &[]).unwrap();
    check(r, "rxq", vec![samples::rxq()], &[]).unwrap();
    check(r, "flows", samples::flows(), &[]).unwrap();
    check(r, "trace", samples::trace(), &[]).unwrap();
    check(r, "fdb", vec![samples::fdb()], &[]).unwrap();
    check(r, "rebalance", samples::rebalance(), &[]).unwrap();
    check(r, "move", MoveReply::default(), &[]).unwrap();
    check(r, "reload", ReloadReply { summary: String::new() }, &[]).unwrap();
    check(r, "version", VersionReply::current(), &[]).unwrap();
    let ct = ConntrackReply {
        ports: vec![ZoneInfo::default()],
        connections: vec![ConnInfo::default()],
        ..ConntrackReply::default()
    };
    check(r, "conntrack", ct, &[]).unwrap();
    let vtep = VtepInfo {
        vnis: vec![VniInfo::default()],
        local_macs: vec![LocalMac { ips: vec![String::new()], ..LocalMac::default() }],
        learned: VtepState {
            remotes: vec![RemoteVnis::default()],
            macs: vec![RemoteMac::default()],
            neighbours: vec![RemoteNeighbour::default()],
        },
        ..VtepInfo::default()
    };
    check(r, "vteps", vec![vtep], &[]).unwrap();
    check(r, "mirrors", vec![MirrorInfo::default()], &[]).unwrap();
    let vrf = VrfInfo {
        networks: vec![crate::proto::vrfs::NetworkInfo::default()],
        neighbours: vec![crate::proto::vrfs::NeighbourInfo::default()],
        ..VrfInfo::default()
    };
    check(r, "vrfs", vec![vrf], &[]).unwrap();
    check(r, "drops", samples::drops(), &[]).unwrap();
    check(r, "capture", CaptureStarted::default(), &[]).unwrap();
    check(r, "capture's end", CaptureEnd::default(), &[]).unwrap();
    let reasons: BTreeSet<String> = DROP_REASONS.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(documented(r, "drops"), reasons);
}

#[test]
fn the_readme_check_can_fail() {
    let readme = readme();
    let fewer = readme.replacen("`visits`, ", "", 1);
    let e = check(&fewer, "rxq", vec![samples::rxq()], &[]).unwrap_err();
    assert!(e.contains("README does not list: [\"visits\"]"), "{e}");
    let more = readme.replacen("`visits`, ", "`visits`, `visitors`, ", 1);
    let e = check(&more, "rxq", vec![samples::rxq()], &[]).unwrap_err();
    assert!(e.contains("the type lacks: [\"visitors\"]"), "{e}");
}

#[test]
fn port_globs_match_as_a_shell_does() {
    use super::{glob_match, is_glob};
    for (pat, name, want) in [
        ("vm1*", "vm1", true),
        ("vm1*", "vm17", true),
        ("vm1*", "vm2", false),
        ("vm?", "vm7", true),
        ("vm?", "vm77", false),
        ("*", "", true),
        ("*a*b*", "xxaYYbzz", true),
        ("*a*b", "xxaYYbzz", false),
        ("a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false),
        ("exact", "exact", true),
    ] {
        assert_eq!(glob_match(pat, name), want, "{pat} against {name}");
    }
    assert!(is_glob("vm*") && is_glob("vm?") && !is_glob("vm1"));
}
