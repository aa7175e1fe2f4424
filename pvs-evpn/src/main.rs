//! pvs-evpn: EVPN for pvswitch's VTEPs through an unmodified FRR (bgpd + zebra,
//! `advertise-all-vni`), by mirroring each VTEP into the kernel of the network namespace it
//! runs in (FRR's) and back. No BGP here: see `tick` for what it mirrors and why.
//!
//! ```text
//! pvs-evpn --ctl /run/pvswitch/pvswitchd.sock [--vtep NAME] [--interval-ms 200] [--once]
//! ```
//!
//! Each tick (every `--interval-ms`, and at once when the kernel's neighbours change: zebra
//! installed or removed a remote MAC or address) it reads `vteps` from pvswitchd, makes the
//! shadow bridge, VXLAN device and local port of any VNI that lacks them (with `ip` and
//! `bridge`: done once per VNI), reads the namespace's bridge FDB and IPv4 and IPv6 neighbours over
//! rtnetlink, adds and deletes the static entries of local MACs and their addresses, and sends
//! `vtep-sync` when what zebra installed differs from what pvswitchd holds.
//! pvswitchd or FRR restarting is only a tick where things differ.

mod netlink;
mod shadow;
mod tick;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use netlink::Netlink;
use netlink_sys::{Socket, protocols::NETLINK_ROUTE};
use pvswitch::proto::{Client, Request, VtepInfo};
use shadow::shadow;

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

/// What a tick leaves behind for the next: the shadow VNIs made (their address and port), each
/// VTEP's exported MACs, and the addresses the kernel refused (told once).
#[derive(Default)]
struct State {
    made: BTreeMap<u32, (Ipv4Addr, u16)>,
    exported: BTreeMap<String, std::collections::BTreeSet<(u32, pvswitch::wire::MacAddr)>>,
    refused: std::collections::BTreeSet<(u32, std::net::IpAddr)>,
}

fn tick(a: &Args, nl: &mut Netlink, st: &mut State) -> Result<(), String> {
    let made = &mut st.made;
    let client = Client::new(&a.ctl);
    let vteps: Vec<VtepInfo> = client.ask(&Request::Vteps).map_err(|e| e.message)?;
    for v in vteps.iter().filter(|v| a.vtep.as_ref().is_none_or(|n| *n == v.name)) {
        let local: Ipv4Addr = v.local.parse().map_err(|e| format!("vtep {}: {e}", v.name))?;
        for n in &v.vnis {
            if made.get(&n.vni) != Some(&(local, v.udp_port)) {
                shadow(n.vni, local, v.udp_port)?;
                made.insert(n.vni, (local, v.udp_port));
                log::info!("vtep {}: VNI {1} mirrored (pvsb{1}, pvsx{1}, pvsl{1})", v.name, n.vni);
            }
        }
        let (fdb, neigh) = (nl.dump_fdb()?, nl.dump_neigh()?);
        let exported = st.exported.entry(v.name.clone()).or_default();
        let t = tick::tick(v, &fdb, &neigh, exported);
        for (vni, mac) in &t.export {
            nl.fdb(true, &format!("pvsl{vni}"), *mac)?;
            log::info!("vtep {}: local {mac} on VNI {vni} exported", v.name);
        }
        // An address the kernel refuses (IPv6 off in a namespace whose /proc/sys is read-only)
        // is told once and retried each tick; the MACs and the sync go on without it.
        for (vni, ip, mac) in &t.export_neigh {
            match nl.neigh(true, &format!("pvsb{vni}"), *ip, *mac) {
                Ok(()) => {
                    st.refused.remove(&(*vni, *ip));
                    log::info!("vtep {}: local {ip} at {mac} on VNI {vni} exported", v.name);
                }
                Err(e) if st.refused.insert((*vni, *ip)) => log::warn!("vtep {}: {e}; not exported", v.name),
                Err(_) => {}
            }
        }
        for (vni, ip, mac) in &t.withdraw_neigh {
            nl.neigh(false, &format!("pvsb{vni}"), *ip, *mac)?;
            log::info!("vtep {}: {ip} at {mac} on VNI {vni} withdrawn", v.name);
        }
        for (vni, mac) in &t.withdraw {
            nl.fdb(false, &format!("pvsl{vni}"), *mac)?;
            log::info!("vtep {}: {mac} on VNI {vni} withdrawn", v.name);
        }
        if let Some(state) = t.sync {
            let json = serde_json::to_string(&state).map_err(|e| e.to_string())?;
            let reply: serde_json::Value =
                client.ask(&Request::VtepSync { vtep: v.name.clone(), state: json }).map_err(|e| e.message)?;
            log::info!("vtep {}: synced: {}", v.name, reply["summary"].as_str().unwrap_or_default());
        }
        *exported = t.exported;
    }
    Ok(())
}
