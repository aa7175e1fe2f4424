//! pvs-evpn: EVPN for pvswitch's VTEPs through an unmodified FRR (bgpd + zebra,
//! `advertise-all-vni`), by mirroring each VTEP into the kernel of the network namespace it
//! runs in (FRR's) and back. No BGP here: see `pvswitch::evpn` for what it mirrors and why.
//!
//! ```text
//! pvs-evpn --ctl /run/pvswitch/pvswitchd.sock [--vtep NAME] [--interval-ms 200] [--once]
//! ```
//!
//! Each tick (every `--interval-ms`, and at once when the kernel's FDB changes: zebra installed
//! or removed a remote MAC) it reads `vteps` from pvswitchd, makes the shadow bridge, VXLAN device and local
//! port of any VNI that lacks them (with `ip` and `bridge`: done once per VNI), reads the
//! namespace's bridge FDB over rtnetlink, adds and deletes the static entries of local MACs,
//! and sends `vtep-sync` when what zebra installed differs from what pvswitchd holds.
//! pvswitchd or FRR restarting is only a tick where things differ.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use pvswitch::ctl::proto::{Reply, Request, VtepInfo};
use pvswitch::evpn::{self, FdbEntry};
use pvswitch::wire::MacAddr;

struct Args {
    ctl: String,
    vtep: Option<String>,
    interval: Duration,
    once: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        ctl: "/run/pvswitch/pvswitchd.sock".into(),
        vtep: None,
        interval: Duration::from_millis(200),
        once: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().ok_or(format!("{k}: expected a value"));
        match k.as_str() {
            "--ctl" => a.ctl = val()?,
            "--vtep" => a.vtep = Some(val()?),
            "--interval-ms" => {
                a.interval = Duration::from_millis(val()?.parse().map_err(|e| format!("--interval-ms: {e}"))?)
            }
            "--once" => a.once = true,
            "-h" | "--help" => {
                println!("usage: pvs-evpn [--ctl SOCKET] [--vtep NAME] [--interval-ms N] [--once]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let a = args().unwrap_or_else(|e| {
        eprintln!("pvs-evpn: {e}");
        std::process::exit(2)
    });
    let mut nl = Netlink::open().unwrap_or_else(|e| {
        eprintln!("pvs-evpn: netlink: {e}");
        std::process::exit(1)
    });
    let mut st = State::default();
    // What zebra installs or removes wakes the loop at once; pvswitchd's side (MACs learned
    // and lost) is read every tick.
    let fdb_changed = watch_fdb().unwrap_or_else(|e| {
        eprintln!("pvs-evpn: netlink: {e}");
        std::process::exit(1)
    });
    loop {
        if let Err(e) = tick(&a, &mut nl, &mut st) {
            log::warn!("{e}");
        }
        if a.once {
            break;
        }
        match fdb_changed.recv_timeout(a.interval) {
            Ok(()) => {
                // A burst of changes (a peer's MACs arriving together) lands in one sync.
                std::thread::sleep(FDB_SETTLE);
                while fdb_changed.try_recv().is_ok() {}
            }
            Err(RecvTimeoutError::Timeout) => {}
            // The watcher failed (logged): ticks alone, as before it.
            Err(RecvTimeoutError::Disconnected) => std::thread::sleep(a.interval),
        }
    }
}

/// How long a change to the kernel's FDB waits for the rest of its burst before the tick.
const FDB_SETTLE: Duration = Duration::from_millis(10);

/// A thread that reads the namespace's neighbour notifications (the bridge FDB among them) and
/// says so on the returned channel, one message a datagram. Our own FDB changes wake the loop
/// too: one tick that finds nothing to do.
fn watch_fdb() -> std::io::Result<std::sync::mpsc::Receiver<()>> {
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    sock.add_membership(libc::RTNLGRP_NEIGH)?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new().name("fdb-events".into()).spawn(move || {
        loop {
            match sock.recv_from_full() {
                Ok(_) => {}
                // Notifications were lost (the socket overflowed): a tick reads the whole FDB anyway.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
                Err(e) => {
                    log::warn!("FDB notifications: {e}; ticks only from now on");
                    return;
                }
            }
            if tx.send(()).is_err() {
                return;
            }
        }
    })?;
    Ok(rx)
}

/// What a tick leaves behind for the next: the shadow VNIs made (their address and port), and
/// each VTEP's exported MACs.
#[derive(Default)]
struct State {
    made: BTreeMap<u32, (Ipv4Addr, u16)>,
    exported: BTreeMap<String, std::collections::BTreeSet<(u32, pvswitch::wire::MacAddr)>>,
}

fn tick(a: &Args, nl: &mut Netlink, st: &mut State) -> Result<(), String> {
    let made = &mut st.made;
    let vteps: Vec<VtepInfo> = serde_json::from_str(&ask(&a.ctl, &Request::Vteps)?).map_err(|e| e.to_string())?;
    for v in vteps.iter().filter(|v| a.vtep.as_ref().is_none_or(|n| *n == v.name)) {
        let local: Ipv4Addr = v.local.parse().map_err(|e| format!("vtep {}: {e}", v.name))?;
        for n in &v.vnis {
            if made.get(&n.vni) != Some(&(local, v.udp_port)) {
                shadow(n.vni, local, v.udp_port)?;
                made.insert(n.vni, (local, v.udp_port));
                log::info!("vtep {}: VNI {1} mirrored (pvsb{1}, pvsx{1}, pvsl{1})", v.name, n.vni);
            }
        }
        let fdb = nl.dump_fdb()?;
        let exported = st.exported.entry(v.name.clone()).or_default();
        let t = evpn::tick(v, &fdb, exported);
        for (vni, mac) in &t.export {
            nl.fdb(true, &format!("pvsl{vni}"), *mac)?;
            log::info!("vtep {}: local {mac} on VNI {vni} exported", v.name);
        }
        for (vni, mac) in &t.withdraw {
            nl.fdb(false, &format!("pvsl{vni}"), *mac)?;
            log::info!("vtep {}: {mac} on VNI {vni} withdrawn", v.name);
        }
        if let Some(state) = t.sync {
            let json = serde_json::to_string(&state).map_err(|e| e.to_string())?;
            let reply = ask(&a.ctl, &Request::VtepSync { vtep: v.name.clone(), state: json })?;
            log::info!("vtep {}: synced: {reply}", v.name);
        }
        *exported = t.exported;
    }
    Ok(())
}

/// Sends `req` to pvswitchd; its result's JSON text.
fn ask(path: &str, req: &Request) -> Result<String, String> {
    let mut s = UnixStream::connect(path).map_err(|e| format!("pvswitchd at {path}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    s.write_all(format!("{}\n", req.to_line()).as_bytes()).map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).map_err(|e| e.to_string())?;
    let reply: Reply<Box<serde_json::value::RawValue>> = serde_json::from_str(&line).map_err(|e| e.to_string())?;
    reply.into_outcome().map(|r| r.get().to_string()).map_err(|e| e.message)
}

/// Makes VNI `vni`'s shadow objects (again, if they were there with other settings): a bridge,
/// a VXLAN device on the VTEP's address and port without learning, and a veth as the local port,
/// all without IPv6 (a kernel with it would learn MACs from its own solicitations).
fn shadow(vni: u32, local: Ipv4Addr, port: u16) -> Result<(), String> {
    let [br, vx, lp, peer] = evpn::shadow_names(vni);
    for dev in [&br, &vx, &lp] {
        let _ = Command::new("ip").args(["link", "del", dev]).stderr(std::process::Stdio::null()).status();
    }
    let run = |args: &[&str]| -> Result<(), String> {
        let o = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{}: {e}", args[0]))?;
        if !o.status.success() {
            return Err(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim()));
        }
        Ok(())
    };
    let (id, local, port) = (vni.to_string(), local.to_string(), port.to_string());
    run(&["ip", "link", "add", &br, "type", "bridge"])?;
    run(&["ip", "link", "add", &vx, "type", "vxlan", "id", &id, "local", &local, "dstport", &port, "nolearning"])?;
    run(&["ip", "link", "add", &lp, "type", "veth", "peer", "name", &peer])?;
    for dev in [&br, &vx, &lp, &peer] {
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6"), "1");
    }
    run(&["ip", "link", "set", &vx, "master", &br])?;
    run(&["ip", "link", "set", &lp, "master", &br])?;
    run(&["bridge", "link", "set", "dev", &vx, "learning", "off", "neigh_suppress", "on"])?;
    run(&["bridge", "link", "set", "dev", &lp, "learning", "off"])?;
    for dev in [&br, &vx, &lp, &peer] {
        run(&["ip", "link", "set", dev, "up"])?;
    }
    Ok(())
}

/// An rtnetlink socket for the bridge FDB.
struct Netlink {
    sock: Socket,
    seq: u32,
}

impl Netlink {
    fn open() -> std::io::Result<Netlink> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        Ok(Netlink { sock, seq: 0 })
    }

    fn send(&mut self, flags: u16, msg: RouteNetlinkMessage) -> Result<u32, String> {
        self.seq += 1;
        let mut h = NetlinkHeader::default();
        h.flags = flags;
        h.sequence_number = self.seq;
        let mut m = NetlinkMessage::new(h, NetlinkPayload::from(msg));
        m.finalize();
        let mut buf = vec![0u8; m.buffer_len()];
        m.serialize(&mut buf);
        self.sock.send(&buf, 0).map_err(|e| format!("netlink send: {e}"))?;
        Ok(self.seq)
    }

    /// Reads replies to `seq` until the dump's end (or the ACK), handing each message to `f`.
    fn replies(&mut self, seq: u32, mut f: impl FnMut(RouteNetlinkMessage)) -> Result<(), String> {
        loop {
            let (buf, _) = self.sock.recv_from_full().map_err(|e| format!("netlink recv: {e}"))?;
            let mut off = 0;
            while off < buf.len() {
                let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[off..])
                    .map_err(|e| format!("netlink: {e}"))?;
                let len = m.header.length as usize;
                if len == 0 {
                    return Ok(());
                }
                off += (len + 3) & !3;
                if m.header.sequence_number != seq {
                    continue;
                }
                match m.payload {
                    NetlinkPayload::Done(_) => return Ok(()),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(()),
                            Some(c) => Err(format!("netlink: {}", std::io::Error::from_raw_os_error(-c.get()))),
                        };
                    }
                    NetlinkPayload::InnerMessage(msg) => f(msg),
                    _ => {}
                }
            }
        }
    }

    /// Every bridge FDB entry of the namespace.
    fn dump_fdb(&mut self) -> Result<Vec<FdbEntry>, String> {
        let mut q = NeighbourMessage::default();
        q.header.family = AddressFamily::Bridge;
        let seq = self.send(NLM_F_REQUEST | NLM_F_DUMP, RouteNetlinkMessage::GetNeighbour(q))?;
        let mut out = Vec::new();
        self.replies(seq, |msg| {
            let RouteNetlinkMessage::NewNeighbour(n) = msg else { return };
            let mut e = FdbEntry {
                dev: ifname(n.header.ifindex),
                mac: MacAddr::ZERO,
                dst: None,
                ext_learned: n.header.flags.contains(NeighbourFlags::ExtLearned),
                own: n.header.flags.contains(NeighbourFlags::Own),
                is_static: n.header.state == NeighbourState::Noarp,
            };
            for a in &n.attributes {
                match a {
                    NeighbourAttribute::LinkLayerAddress(l) if l.len() == 6 => e.mac = MacAddr::from_bytes(l),
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => e.dst = Some(*ip),
                    NeighbourAttribute::Destination(NeighbourAddress::Other(b)) if b.len() == 4 => {
                        e.dst = Some(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
                    }
                    _ => {}
                }
            }
            out.push(e);
        })?;
        Ok(out)
    }

    /// Adds (replacing) or deletes the static bridge entry of `mac` on port `dev`.
    fn fdb(&mut self, add: bool, dev: &str, mac: MacAddr) -> Result<(), String> {
        let ifindex = ifindex(dev).ok_or(format!("no interface {dev}"))?;
        let mut m = NeighbourMessage::default();
        m.header.family = AddressFamily::Bridge;
        m.header.ifindex = ifindex;
        m.header.state = NeighbourState::Noarp;
        m.header.flags = NeighbourFlags::Controller;
        m.attributes.push(NeighbourAttribute::LinkLayerAddress(mac.0.to_vec()));
        let seq = if add {
            self.send(NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE, RouteNetlinkMessage::NewNeighbour(m))?
        } else {
            self.send(NLM_F_REQUEST | NLM_F_ACK, RouteNetlinkMessage::DelNeighbour(m))?
        };
        self.replies(seq, |_| {}).map_err(|e| format!("{} {mac} on {dev}: {e}", if add { "add" } else { "del" }))
    }
}

/// An interface's index, from sysfs (`ip netns exec` mounts the namespace's own).
fn ifindex(name: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex")).ok()?.trim().parse().ok()
}

/// The name of the interface with index `index` (its number if there is none).
fn ifname(index: u32) -> String {
    let found = std::fs::read_dir("/sys/class/net").ok().and_then(|d| {
        d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).find(|n| ifindex(n) == Some(index))
    });
    found.unwrap_or_else(|| index.to_string())
}
