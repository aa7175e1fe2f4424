//! Flow export in process: frames counted per flow and direction, sampling, the table's limit,
//! timeouts, and the messages read back by a parser (tests/ipfix.rs reads them with tshark).

use super::*;
use crate::conntrack::packet::build;

const V4A: [u8; 4] = [10, 0, 0, 1];
const V4B: [u8; 4] = [10, 0, 0, 2];

fn eth(ty: u16, l3: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
    f.extend(ty.to_be_bytes());
    f.extend_from_slice(l3);
    f
}

fn udp(sport: u16) -> Vec<u8> {
    eth(0x0800, &build::ipv4(17, V4A, V4B, &build::udp(sport, 53, 20)))
}

fn cfg(sampling: u32, max_flows: u32) -> IpfixConfig {
    IpfixConfig {
        collector: "127.0.0.1:9".parse().unwrap(),
        sampling,
        active_timeout_s: 60,
        idle_timeout_s: 15,
        max_flows,
        observation_domain_id: 7,
    }
}

fn observe(x: &FlowExport, frames: &[Vec<u8>], egress: Option<u16>, now: u64) {
    x.observe(
        0,
        now,
        frames.iter().map(|f| Observed { front: f, len: f.len() as u32, ingress: 3, egress, vlan: None }),
    );
}

#[test]
fn frames_are_counted_per_flow_and_expire_when_idle_or_long_active() {
    let x = FlowExport::new(cfg(1, 1024), 1, 1);
    let a = udp(1000);
    let b = udp(2000);
    observe(&x, &[a.clone(), a.clone(), b.clone()], Some(4), 1_000);
    observe(&x, std::slice::from_ref(&a), Some(4), 5_000);
    // Not IP: not a flow.
    observe(&x, &[eth(0x0806, &[0; 28])], None, 5_000);
    assert_eq!(x.observed(), 4);
    assert!(x.expire(10_000, false).is_empty(), "nothing is due yet");
    // b idle since 1 s: due at 16 s; a (last frame at 5 s) at 20 s.
    let due = x.expire(16_000, false);
    assert_eq!(due.len(), 1);
    assert_eq!((due[0].key.tuple.sport, due[0].counts.packets, due[0].reason), (2000, 1, EndReason::Idle));
    assert_eq!((due[0].key.ingress, due[0].key.egress), (4, 5), "interfaces are port ids plus one");
    let a_rec = x.expire(61_000, false);
    assert_eq!(a_rec.len(), 1);
    let c = a_rec[0].counts;
    assert_eq!((c.packets, c.bytes, c.start_ms, c.end_ms), (3, 3 * (a.len() as u64 - 14), 1_000, 5_000), "IP bytes");
    assert_eq!(a_rec[0].reason, EndReason::Idle);
    // A flow busy past the active timeout goes though it is not idle.
    for t in (0..70).map(|s| 100_000 + s * 1000) {
        observe(&x, std::slice::from_ref(&a), Some(4), t);
    }
    let due = x.expire(169_000, false);
    assert_eq!((due.len(), due[0].reason, due[0].counts.packets), (1, EndReason::Active, 70));
}

#[test]
fn sampling_counts_one_frame_in_n_and_a_full_table_says_so() {
    let x = FlowExport::new(cfg(4, 16), 1, 1);
    let a = udp(1000);
    observe(&x, &vec![a.clone(); 40], Some(1), 0);
    let r = x.expire(0, true);
    assert_eq!((r.len(), r[0].counts.packets, r[0].reason), (1, 10, EndReason::Forced));
    let x = FlowExport::new(cfg(1, 16), 1, 1);
    let many: Vec<Vec<u8>> = (0..20).map(|p| udp(3000 + p)).collect();
    observe(&x, &many, None, 0);
    assert_eq!((x.expire(0, true).len(), x.full()), (16, 4));
}

#[test]
fn a_burst_that_finds_its_table_taken_is_not_counted_and_says_so() {
    let x = FlowExport::new(cfg(1, 16), 1, 1);
    let held = x.slots[0].lock().unwrap();
    observe(&x, &[udp(1)], None, 0);
    drop(held);
    assert_eq!((x.missed.load(Relaxed), x.observed()), (1, 0));
}

#[test]
fn messages_read_back_as_the_records_sent() {
    use netflow_parser::variable_versions::ipfix::FlowSetBody;
    use netflow_parser::{NetflowPacket, NetflowParser};
    let x = FlowExport::new(cfg(1, 64), 1, 1);
    let tcp = eth(0x0800, &build::ipv4(6, V4A, V4B, &build::tcp(40000, 5201, 0x02, 1, 0, 65535, None, 0)));
    let six = eth(0x86dd, &build::ipv6(17, [1; 16], [2; 16], &build::udp(7, 8, 10)));
    observe(&x, &[tcp.clone(), tcp.clone(), six.clone()], Some(9), 1_700_000_000_000);
    // VLAN 0 (these frames' own) carried as VNI 5000 by a VTEP, for the records' segment id.
    x.set_vnis([(0, 5000)].into_iter());
    let recs = x.expire(0, true);
    assert!(recs.iter().all(|r| r.vni == 5000));
    let mut p = NetflowParser::default();
    let t = ipfix::templates(1, 0, 7, 1).unwrap();
    let m = ipfix::records(1, 0, 7, &recs).unwrap();
    let parsed = p.parse_bytes(&t);
    assert!(parsed.error.is_none(), "{:?}", parsed.error);
    let parsed = p.parse_bytes(&m);
    assert!(parsed.error.is_none(), "{:?}", parsed.error);
    let NetflowPacket::IPFix(msg) = &parsed.packets[0] else { panic!("{:?}", parsed.packets) };
    assert_eq!((msg.header.version, msg.header.observation_domain_id, msg.header.length as usize), (10, 7, m.len()));
    let rows: Vec<_> = msg
        .flowsets
        .iter()
        .filter_map(|s| match &s.body {
            FlowSetBody::Data(d) => Some(d.fields.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    let text = format!("{rows:?}");
    // The VNI as a VXLAN layer2SegmentId: type 1 in the high byte (72057594037932936 is
    // 1 << 56 | 5000).
    let segment = format!("U64({})", 1u64 << 56 | 5000);
    for want in ["U16(5201)", "U16(40000)", "U64(2)", "Ip4Addr(10.0.0.2)", "Ip6Addr(202:202", "U32(10)", &segment] {
        assert!(text.contains(want), "{want} not in {text}");
    }
}
