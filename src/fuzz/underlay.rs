//! Targets for what arrives from the underlay and from a VTEP's control plane, and for what the
//! classifier reads of a frame:
//! - `underlay`: a frame from the underlay as a VTEP's poll thread sees it: `rx::vxlan::check_outer`
//!   with decapsulation in place (`datapath::rx::vxlan::decap`), or ARP (`ArpPacket`);
//! - `front`: a frame's flow key as the data path extracts it from the front it copies (64
//!   bytes, deepened to reach the L4 fields behind IPv4 options: `FlowKey::l4_end`) equals the
//!   key of the whole frame, so no rule on a field can be passed by moving the field out of
//!   the copy;
//! - `vtep_sync`: a control plane's `vtep-sync` state (JSON), parsed and checked
//!   (`switch::vtep::checked_state`);
//! - `dropin`: a port directory's file (`Config::parse_dropin`), under any file name.

use std::net::Ipv4Addr;
use std::sync::OnceLock;

use super::{Rng, Target, bit, fuzz, regressions, shape};
use crate::config::{Config, VniConfig, VtepConfig, dropin::DropIn};
use crate::flow::{Depth, FlowKey};
use crate::wire::arp::ArpPacket;
use crate::wire::vxlan::{self, OUTER_LEN};

const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const REMOTE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

/// A VXLAN frame from REMOTE to LOCAL, VNI 100 (or another), with an inner frame of `inner` bytes.
fn vxlan_frame(rng: &mut Rng) -> Vec<u8> {
    let inner = 14 + rng.below(120);
    let vni = *rng.pick(&[100u32, 200, 0, 0xff_ffff]);
    let mut f = vec![0u8; OUTER_LEN + inner];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((20 + 8 + 8 + inner) as u16).to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&REMOTE.octets());
    f[30..34].copy_from_slice(&LOCAL.octets());
    f[34..36].copy_from_slice(&49152u16.to_be_bytes());
    f[36..38].copy_from_slice(&vxlan::DEFAULT_PORT.to_be_bytes());
    f[38..40].copy_from_slice(&((8 + 8 + inner) as u16).to_be_bytes());
    f[42] = 0x08;
    f[46..49].copy_from_slice(&vni.to_be_bytes()[1..]);
    for b in &mut f[OUTER_LEN..] {
        *b = rng.next() as u8;
    }
    if rng.one_in(3) {
        f[OUTER_LEN + 12..OUTER_LEN + 14].copy_from_slice(&0x8100u16.to_be_bytes());
    }
    f
}

/// An ARP packet on the underlay (request or reply, about LOCAL or not).
fn arp_frame(rng: &mut Rng) -> Vec<u8> {
    let op = *rng.pick(&[1u16, 2, 3]);
    let tpa = *rng.pick(&[LOCAL, REMOTE, Ipv4Addr::new(10, 0, 0, 9)]);
    crate::wire::arp::arp_frame(
        crate::wire::MacAddr::BROADCAST,
        op,
        crate::wire::MacAddr([2, 0, 0, 0, 0, 1]),
        REMOTE,
        crate::wire::MacAddr([2, 0, 0, 0, 0, 2]),
        tpa,
    )
    .to_vec()
}

fn gen_underlay(rng: &mut Rng) -> Vec<u8> {
    if rng.one_in(4) { arp_frame(rng) } else { vxlan_frame(rng) }
}

fn run_underlay(input: &[u8]) -> u64 {
    let mut d = input.to_vec();
    let len = d.len();
    let sig = match crate::datapath::rx::vxlan::check_outer(&d, len, LOCAL, vxlan::DEFAULT_PORT) {
        Ok(r) => {
            assert!(OUTER_LEN + r.inner_len <= len, "the inner frame ({}) lies past the frame ({len})", r.inner_len);
            let inner = d[OUTER_LEN..OUTER_LEN + r.inner_len].to_vec();
            let under = crate::datapath::plan::Underlay {
                port: 0,
                local: LOCAL,
                udp_port: vxlan::DEFAULT_PORT,
                vlan_of: vec![(100, 10), (200, 20)],
                remotes: vec![(u32::from(REMOTE), 1)],
                swept: Default::default(),
            };
            let vxlan = crate::datapath::rx::vxlan::inner_vlan(&under, &d, r)
                .map(|vlan| crate::datapath::rx::vxlan::decap(&mut d, r, vlan));
            match vxlan {
                Ok((at, n)) => {
                    let (at, n) = (at as usize, n as usize);
                    assert!(at + n <= len, "decapsulated frame {at}+{n} past the frame ({len})");
                    let tagged = &d[at..at + n];
                    let vlan = under.vlan(r.vni).expect("a known VNI");
                    assert_eq!(tagged[..12], inner[..12], "the inner addresses");
                    assert_eq!(tagged[12..16], [0x81, 0x00, (vlan >> 8) as u8, vlan as u8], "the VNI's VLAN tag");
                    assert_eq!(tagged[16..], inner[12..], "the rest of the inner frame");
                    bit(&[1, r.vni.min(3) as u64])
                }
                Err(why) => bit(&[2, why as u64]),
            }
        }
        Err(r) => bit(&[3, r as u64]),
    };
    let arp = match d.get(14..).map(ArpPacket::new_checked) {
        Some(Ok(a)) => bit(&[4, a.operation().min(4) as u64, (a.target_ip() == LOCAL) as u64]),
        _ => 0,
    };
    sig | arp
}

pub const UNDERLAY: Target =
    Target { name: "underlay", max_len: 256, run: run_underlay, generate: Some(gen_underlay), mutate: None, dict: &[] };

/// A TCP, UDP or ICMP frame over IPv4 with options (any length), maybe tagged, maybe longer
/// than 64 bytes.
fn gen_front(rng: &mut Rng) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2];
    if rng.one_in(2) {
        f.extend_from_slice(&[0x81, 0, 0, 7]);
    }
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let ihl = 5 + rng.below(11);
    let proto = *rng.pick(&[6u8, 17, 1, 132, 47]);
    let payload = 4 + rng.below(200);
    let total = ihl * 4 + payload;
    f.extend_from_slice(&[0x40 | ihl as u8, 0]);
    f.extend_from_slice(&(total as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 0, 64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    f.extend(std::iter::repeat_n(1u8, ihl * 4 - 20));
    f.extend((0..payload).map(|_| rng.next() as u8));
    f
}

fn run_front(frame: &[u8]) -> u64 {
    // What classify copies: a frame of at most 64 bytes whole, else its first 64, deepened to
    // where the L4 fields end.
    let mut n = frame.len().min(64);
    if n < frame.len() {
        n = n.max(FlowKey::l4_end(&frame[..n]).min(frame.len()));
    }
    let front = FlowKey::extract_to(3, &frame[..n], Depth::L4);
    let whole = FlowKey::extract_to(3, frame, Depth::L4);
    assert_eq!(front, whole, "the key from the front ({n} bytes) differs from the whole frame's");
    bit(&[5, (n > 64) as u64, (whole.get(crate::flow::Field::TpDst) != 0) as u64])
}

pub const FRONT: Target =
    Target { name: "front", max_len: 320, run: run_front, generate: Some(gen_front), mutate: None, dict: &[] };

const SYNC_DICT: &[&[u8]] = &[
    b"{\"remotes\":[",
    b"{\"remote\":\"10.0.0.1\",\"vnis\":[100]}",
    b"\"macs\":[",
    b"{\"vni\":100,\"mac\":\"02:00:00:00:00:07\",\"remote\":\"10.0.0.1\"}",
    b"\"10.0.0.2\"",
    b"\"255.255.255.255\"",
    b"\"ff:ff:ff:ff:ff:ff\"",
    b"4294967296",
    b"-1",
    b"]",
    b"}",
    b",",
];

fn run_sync(input: &[u8]) -> u64 {
    // Built, not parsed: its underlay would be a dpdk port, which a build without DPDK refuses.
    static VTEP: OnceLock<VtepConfig> = OnceLock::new();
    let v = VTEP.get_or_init(|| VtepConfig {
        name: "vt".into(),
        underlay: "up".into(),
        local: Ipv4Addr::new(10, 0, 0, 2),
        prefix_len: 24,
        gateway: None,
        next_hop_mac: None,
        udp_port: 4789,
        mtu: 1450,
        learning: true,
        vnis: vec![
            VniConfig { vni: 100, vlan: 10, remotes: vec![] },
            VniConfig { vni: 200, vlan: 20, remotes: vec![] },
        ],
    });
    match crate::switch::vtep::checked_state(v, &String::from_utf8_lossy(input)) {
        Ok(crate::switch::vtep::Checked { remotes, macs, neighbours }) => {
            for (r, vnis) in &remotes {
                assert!(*r != v.local && !r.is_multicast() && !r.is_broadcast(), "{r} accepted as a remote");
                assert!(vnis.iter().all(|n| v.vlan_of(*n).is_some()), "an unknown VNI accepted");
            }
            for (vni, mac, r) in &macs {
                assert!(mac.is_unicast() && remotes.get(r).is_some_and(|s| s.contains(vni)), "{mac} behind {r}");
            }
            for (vni, ip, mac) in &neighbours {
                let broadcast = matches!(ip, std::net::IpAddr::V4(a) if a.is_broadcast());
                assert!(!ip.is_multicast() && !ip.is_unspecified() && !broadcast, "{ip} accepted");
                assert!(macs.iter().any(|m| m.0 == *vni && m.1 == *mac), "{ip} at {mac}, not a remote MAC");
            }
            bit(&[6, remotes.len().min(3) as u64, macs.len().min(3) as u64, neighbours.len().min(3) as u64])
        }
        Err(e) => shape(&e.to_string()),
    }
}

fn gen_sync(rng: &mut Rng) -> Vec<u8> {
    let remotes: Vec<String> = (0..rng.below(3))
        .map(|i| format!("{{\"remote\":\"10.0.0.{}\",\"vnis\":[{}]}}", 1 + i * 3, rng.pick(&[100, 200, 300])))
        .collect();
    let macs: Vec<String> = (0..rng.below(3))
        .map(|i| {
            format!(
                "{{\"vni\":{},\"mac\":\"0{}:00:00:00:00:0{i}\",\"remote\":\"10.0.0.{}\"}}",
                rng.pick(&[100, 200]),
                rng.pick(&[2, 1]),
                rng.pick(&[1, 2, 4])
            )
        })
        .collect();
    let neighbours: Vec<String> = (0..rng.below(3))
        .map(|i| {
            format!(
                "{{\"vni\":{},\"ip\":\"{}\",\"mac\":\"0{}:00:00:00:00:0{i}\"}}",
                rng.pick(&[100, 200]),
                rng.pick(&["10.1.0.5", "224.0.0.1", "255.255.255.255", "10.1.0.x", "fd00::5", "fe80::1", "ff02::1"]),
                rng.pick(&[2, 1]),
            )
        })
        .collect();
    format!(
        "{{\"remotes\":[{}],\"macs\":[{}],\"neighbours\":[{}]}}",
        remotes.join(","),
        macs.join(","),
        neighbours.join(",")
    )
    .into_bytes()
}

pub const VTEP_SYNC: Target =
    Target { name: "vtep_sync", max_len: 2048, run: run_sync, generate: Some(gen_sync), mutate: None, dict: SYNC_DICT };

/// The first line is the file's name, the rest its text.
fn run_dropin(input: &[u8]) -> u64 {
    static MAIN: OnceLock<Config> = OnceLock::new();
    let main = MAIN.get_or_init(|| {
        Config::parse("main.toml", "[switch]\npoll_cores = [0]\nsocket_dir = \"/run/x\"\n[[port]]\nname = \"vm1\"\ntype = \"vhost-user\"\nsocket = \"vm1.sock\"\n")
            .expect("valid")
    });
    let text = String::from_utf8_lossy(input);
    let (name, body) = text.split_once('\n').unwrap_or(("x.toml", &text));
    let d = DropIn { path: std::path::Path::new("/ports.d").join(name.replace('/', "_")), text: body.to_string() };
    match main.parse_dropin(&d) {
        Ok(p) => {
            // What loads is named after its file, takes no device the main file did not grant.
            assert_eq!(d.path.file_stem().and_then(|s| s.to_str()), Some(p.name.as_str()));
            assert!(!p.name.starts_with(['.', '-']), "{}", p.name);
            if let Some(dev) = p.dpdk() {
                assert!(main.dpdk.runtime_device(&dev.device).is_ok(), "{} loaded from a drop-in", dev.device);
            }
            bit(&[7, p.type_name().len() as u64])
        }
        Err(e) => {
            assert!(e.line <= body.split('\n').count().max(1), "{e}");
            shape(&e.message)
        }
    }
}

fn gen_dropin(rng: &mut Rng) -> Vec<u8> {
    let name = *rng.pick(&["vm2", ".vm2", "-vm2", "vm 2", "vm2.x"]);
    let kind = *rng.pick(&[
        "type = \"vhost-user\"\nsocket = \"vm2.sock\"\n",
        "type = \"dpdk\"\ndevice = \"net_pcap1,tx_pcap=/etc/x\"\n",
        "type = \"dpdk\"\ndevice = \"0000:03:00.0\"\n",
        "type = \"dpdk\"\ndevice = \"net_null1\"\n",
    ]);
    format!("{name}.toml\nname = \"{name}\"\n{kind}").into_bytes()
}

pub const DROPIN: Target = Target {
    name: "dropin",
    max_len: 1024,
    run: run_dropin,
    generate: Some(gen_dropin),
    mutate: None,
    dict: &[b"name = ", b"type = \"dpdk\"\n", b"device = \"", b",iface=", b"\n", b"\""],
};

#[test]
fn underlay() {
    fuzz(&UNDERLAY);
}

#[test]
fn underlay_regressions() {
    regressions(&UNDERLAY);
}

#[test]
fn front() {
    fuzz(&FRONT);
}

#[test]
fn front_regressions() {
    regressions(&FRONT);
}

#[test]
fn vtep_sync() {
    fuzz(&VTEP_SYNC);
}

#[test]
fn vtep_sync_regressions() {
    regressions(&VTEP_SYNC);
}

#[test]
fn dropin() {
    fuzz(&DROPIN);
}

#[test]
fn dropin_regressions() {
    regressions(&DROPIN);
}
