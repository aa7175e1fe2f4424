//! The control commands as functions over the switch model: a request line parsed into a
//! [`proto::Request`] is answered with the reply types of [`proto`] (`handle`); pvswitchctl
//! reads them back and prints them (`human`).

#![forbid(unsafe_code)]

mod conntrack;
pub mod flows;
pub mod human;
pub mod live;
pub mod stats;

use serde::Serialize;

use crate::config::RateCaps;
use crate::config::vlan::{PortVlan, VlanMode};
use crate::port::PortKind;
use crate::port::rate::PortRates;
use crate::port::vhost::{Status, VringStatus, feature_names};
use crate::proto;
use crate::proto::{
    Cleared, CtlError, ErrorCode, FdbEntry, MigrationInfo, PortInfo, PortOffloads, PortReply, PortVlanInfo, QueueInfo,
    QueueKind, RateCapsInfo, RateTokens, ReloadReply, Reply, Request, VersionReply, VxlanInfo,
};
use crate::switch::{Endpoints, PortState, Switch};
use crate::wire::virtio_net::Negotiated;

/// The reply line for an error.
pub fn error_reply(msg: &str) -> String {
    Reply::<()>::new(Err(msg.to_string())).to_line()
}

/// Whether a request line asks for a reload (the service manager is told around it).
pub fn is_reload(req: &[u8]) -> bool {
    Request::parse(req) == Ok(Request::Reload)
}

/// Whether a request line asks for a capture (a stream: the control loop serves it).
pub fn is_capture(req: &[u8]) -> bool {
    matches!(Request::parse(req), Ok(Request::Capture { .. } | Request::TraceLive { .. }))
}

/// Answers one request line. `ep` is the control loop's side of the ports (for reload).
///
/// The result is serialized straight from its type into the line, its keys in their declared
/// order (a reply with a thousand ports is megabytes: building a `serde_json::Value` of it
/// first, to sort its keys, took most of the time `ports` took). The envelope reads as before.
pub fn handle(c: &mut Switch, ep: &mut dyn Endpoints, req: &[u8]) -> String {
    let parsed = Request::parse(req).map_err(|message| CtlError { code: Some(ErrorCode::Invalid), message });
    match parsed.and_then(|r| answer(c, ep, r)) {
        Ok(result) => format!(r#"{{"ok":true,"result":{result}}}"#),
        Err(e) => Reply::<()>::coded(Err(e)).to_line(),
    }
}

/// The reply to one request (each command's own type), as JSON text.
pub fn answer(c: &mut Switch, ep: &mut dyn Endpoints, req: Request) -> Result<String, CtlError> {
    let done = |summary: String| json(PortReply { summary });
    Ok(match req {
        Request::Ports => json(ports(c)),
        Request::Stats { clear: true } => {
            c.clear_stats();
            json(Cleared { cleared: true })
        }
        Request::Stats { clear: false } => json(stats::stats(c)),
        Request::Rxq => json(stats::rxq(c)),
        Request::Fdb => json(fdb(c)),
        Request::Conntrack { port } => json(conntrack::conntrack(c, port.as_deref())?),
        Request::ConntrackFlush { port } => done(conntrack::flush(c, &port)?),
        Request::Flows => json(flows::flows(c)),
        Request::Trace { fields } => json(flows::trace(c, &fields)?),
        Request::Port { name } if proto::is_glob(&name) => json(
            c.ports
                .iter()
                .flatten()
                .filter(|ps| proto::glob_match(&name, ps.name()))
                .map(|ps| port(c, ps))
                .collect::<Vec<_>>(),
        ),
        Request::Port { name } => match c.ports.iter().flatten().find(|ps| ps.name() == name) {
            Some(ps) => json(port(c, ps)),
            None => return Err(CtlError { code: Some(ErrorCode::NotFound), message: format!("no port \"{name}\"") }),
        },
        Request::AddPort { name, settings, may_exist } => done(c.add_port_cmd(ep, &name, &settings, may_exist)?),
        Request::DelPort { name, if_exists } => done(c.del_port_cmd(ep, &name, if_exists)?),
        Request::SetPort { name, settings } => done(c.set_port_cmd(ep, &name, &settings)?),
        Request::Rebalance { mode } => json(c.rebalance(mode)),
        Request::Move { port, queue, thread } => json(c.move_queue(&port, queue, thread)?),
        Request::Reload => match c.reload(ep) {
            Ok(summary) => json(ReloadReply { summary }),
            Err(e) => Err(format!("reload rejected, running configuration unchanged: {e}")),
        },
        Request::Version => json(VersionReply::current()),
        Request::Vteps => json(c.vteps()),
        Request::Mirrors => json(c.mirrors()),
        Request::AddMirror { name, settings } => done(c.add_mirror_cmd(&name, &settings)?),
        Request::DelMirror { name, if_exists } => done(c.del_mirror_cmd(&name, if_exists)?),
        Request::Vrfs => json(c.vrfs()),
        Request::VtepSync { vtep, state } => done(c.vtep_sync(ep, &vtep, &state)?),
        // A stream, not a reply: the control loop serves it (`control::capture`).
        Request::Capture { .. } | Request::TraceLive { .. } => {
            return Err(CtlError {
                code: Some(ErrorCode::Invalid),
                message: format!("{}: not a one-reply command", req.command()),
            });
        }
    }?)
}

fn json(reply: impl Serialize) -> Result<String, String> {
    serde_json::to_string(&reply).map_err(|e| format!("cannot serialize the reply: {e}"))
}

fn ports(c: &Switch) -> Vec<PortInfo> {
    c.ports.iter().flatten().map(|ps| port(c, ps)).collect()
}

fn port(c: &Switch, ps: &PortState) -> PortInfo {
    let p = &ps.port;
    let status = ps.link.as_ref().map(|l| &l.status);
    let vhost = ps.cfg.vhost_user();
    let features = status.map_or(0, |s| s.features);
    PortInfo {
        name: p.name().to_string(),
        id: p.id,
        kind: ps.cfg.type_name().to_string(),
        device: ps.cfg.dpdk().map(|d| d.device.clone()),
        dpdk: p.nic().map(|n| n.info()),
        vxlan: p.tunnel().map(|t| VxlanInfo {
            vtep: t.cfg.vtep.clone(),
            underlay: t.cfg.underlay.clone(),
            local: t.cfg.local.to_string(),
            remote: t.cfg.remote.to_string(),
            udp_port: t.cfg.udp_port,
            next_hop: t.next_hop.to_string(),
            next_hop_mac: t.neighbour().map(|m| m.to_string()),
            learning: t.cfg.learning,
            vnis: t
                .cfg
                .vnis
                .iter()
                .filter(|(_, vlan)| ps.cfg.vlan.carries(*vlan))
                .map(|(vni, vlan)| format!("{vni}:{vlan}"))
                .collect(),
        }),
        socket: vhost.map_or(String::new(), |v| v.socket.display().to_string()),
        mode: match vhost.map(|v| v.mode) {
            Some(crate::config::SocketMode::Client) => "client",
            _ => "server",
        }
        .to_string(),
        state: ps.state().to_string(),
        connects: ps.connects,
        connected_secs: ps.link.as_ref().map(|l| l.since.elapsed().as_secs()),
        last_error: ps.last_error.clone(),
        log_lines_suppressed: p.limits.log.refused(),
        features: feature_names(features),
        offloads: vhost.map(|v| offloads(v.offloads, features)),
        memory_regions: status.map_or(0, |s| s.memory_regions),
        memory_bytes: status.map_or(0, |s| s.memory_bytes),
        max_memory_regions: ps.cfg.mem_limits.max_regions,
        max_guest_memory_mib: ps.cfg.mem_limits.max_bytes >> 20,
        macs_learned: c.mac.learned(p.id),
        mac_limit: ps.cfg.mac_limit,
        allowed_macs: ps.cfg.allowed_macs.iter().map(|m| m.to_string()).collect(),
        allowed_ips: ps.cfg.allowed_ips.iter().map(|p| p.to_string()).collect(),
        security_groups: ps.cfg.security_groups.clone(),
        connections: (!ps.cfg.security_groups.is_empty())
            .then(|| c.conntrack.get().map_or(0, |ct| ct.zone_len(crate::switch::secgroups::zone_of(p.id)))),
        numa_node: ps.numa_node(),
        queue_pairs: p.rx_queues(),
        mtu: ps.cfg.mtu,
        weight_packets: ps.cfg.weight_packets,
        weight_bytes: ps.cfg.weight_bytes,
        vlan: vlan_info(&ps.cfg.vlan),
        rate_caps: rate_caps(&ps.cfg.rates, &p.rates),
        migration: MigrationInfo {
            logging: status.is_some_and(|s| s.logging.is_some()),
            log_bytes: status.and_then(|s| s.logging),
            rarp_requests: status.map_or(0, |s| s.rarp_requests),
            announcements: p.queues().map_or(0, |q| q.announcer.sent()),
            announcements_refused: p.limits.announce.refused(),
        },
        queues: queues(c, ps, status),
        counters: c.port_totals(p.id),
    }
}

fn vlan_info(v: &PortVlan) -> PortVlanInfo {
    let trunks = match v.mode {
        VlanMode::Access => Vec::new(),
        _ => v.trunks.ranges().iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect(),
    };
    PortVlanInfo {
        mode: v.mode.name().to_string(),
        tag: (!matches!(v.mode, VlanMode::Trunk | VlanMode::Tunnel)).then_some(v.tag),
        trunks,
    }
}

fn rate_caps(caps: &RateCaps, rates: &PortRates) -> RateCapsInfo {
    let [ingress_pps, ingress_bps, egress_pps, egress_bps] = rates.tokens();
    RateCapsInfo {
        ingress_pps: caps.ingress_pps,
        ingress_bps: caps.ingress_bps,
        egress_pps: caps.egress_pps,
        egress_bps: caps.egress_bps,
        burst_ms: caps.burst_ms,
        tokens: RateTokens { ingress_pps, ingress_bps, egress_pps, egress_bps },
    }
}

/// What each direction negotiated: the guest may send (host features) and can take (guest's).
fn offloads(offered: bool, features: u64) -> PortOffloads {
    let names = |n: Negotiated| {
        [("csum", n.csum), ("tso4", n.tso4), ("tso6", n.tso6), ("ecn", n.ecn)]
            .into_iter()
            .filter(|(_, on)| *on)
            .map(|(k, _)| k.to_string())
            .collect()
    };
    PortOffloads {
        offered,
        guest_sends: names(Negotiated::host(features)),
        guest_takes: names(Negotiated::guest(features)),
    }
}

/// A vhost-user port's virtqueues (by vhost-user index: even guest_rx, odd guest_tx), or a
/// NIC's receive queues.
fn queues(c: &Switch, ps: &PortState, status: Option<&Status>) -> Vec<QueueInfo> {
    let p = &ps.port;
    let rx = |q: usize| c.rxq_stats.get(&(p.id, q)).map(|s| s.read());
    let polled = |q: usize| QueueInfo {
        poll_thread: c.owner((p.id, q)),
        rx_packets: rx(q).map(|s| s.packets),
        rx_bytes: rx(q).map(|s| s.bytes),
        ..QueueInfo::default()
    };
    match &p.kind {
        PortKind::VhostUser(vq) => vq
            .all()
            .iter()
            .enumerate()
            .map(|(i, lock)| {
                let vs = status.and_then(|s| s.vrings.get(i)).copied().unwrap_or(VringStatus::default());
                let tx = i % 2 == 1;
                QueueInfo {
                    index: i,
                    kind: if tx { QueueKind::GuestTx } else { QueueKind::GuestRx },
                    size: Some(vs.size),
                    enabled: Some(vs.enabled),
                    running: Some(vs.running),
                    error: lock.broken().map(|e| e.as_str().to_string()),
                    ..if tx { polled(i / 2) } else { QueueInfo::default() }
                }
            })
            .collect(),
        PortKind::Tunnel(_) => Vec::new(),
        PortKind::Nic(_) | PortKind::Failed => {
            (0..p.rx_queues()).map(|q| QueueInfo { index: q, kind: QueueKind::NicRx, ..polled(q) }).collect()
        }
    }
}

fn fdb(c: &Switch) -> Vec<FdbEntry> {
    let mut v: Vec<FdbEntry> = c
        .mac
        .entries()
        .into_iter()
        .map(|(m, vlan, p)| FdbEntry {
            mac: m.to_string(),
            vlan,
            port: c.port(p as usize).map(|ps| ps.name().to_string()),
        })
        .collect();
    v.sort_by(|a, b| (a.vlan, &a.mac).cmp(&(b.vlan, &b.mac)));
    v
}
