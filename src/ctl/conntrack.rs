//! `conntrack [PORT|zone=N]` and `conntrack-flush PORT|zone=N`: security groups' connections,
//! from the switch's table (`Switch::conntrack`), by port; flows' (`ct` actions), from theirs
//! (`Switch::flow_conntrack`), by zone.

use std::collections::HashMap;

use crate::conntrack::{Conntrack, Entry};
use crate::datapath::firewall::{CUT, OPENED_EGRESS, OPENED_INGRESS};
use crate::proto::{ConnInfo, ConntrackReply, CtlError, ErrorCode, FlowZone, MAX_LISTED, ZoneInfo};
use crate::switch::secgroups::zone_of;
use crate::switch::{PortState, Switch};
use crate::wire::protocol;

fn find<'a>(c: &'a Switch, name: &str) -> Result<&'a PortState, CtlError> {
    c.ports
        .iter()
        .flatten()
        .find(|ps| ps.name() == name)
        .ok_or_else(|| CtlError { code: Some(ErrorCode::NotFound), message: format!("no port \"{name}\"") })
}

/// What `conntrack` and `conntrack-flush` were asked about.
enum Which<'a> {
    All,
    Port(&'a PortState),
    /// A zone of the flows' table.
    Zone(u16),
}

fn which<'a>(c: &'a Switch, arg: Option<&str>) -> Result<Which<'a>, CtlError> {
    let Some(arg) = arg else { return Ok(Which::All) };
    match arg.strip_prefix("zone=") {
        Some(z) => z.parse().map(Which::Zone).map_err(|_| CtlError {
            code: Some(ErrorCode::Invalid),
            message: format!("conntrack: expected zone=0..65535, found \"{arg}\""),
        }),
        None => find(c, arg).map(Which::Port),
    }
}

fn conn(e: Entry, port: String) -> ConnInfo {
    let flows = port.is_empty();
    ConnInfo {
        port,
        zone: e.zone,
        protocol: match e.orig.proto {
            protocol::TCP => "tcp".into(),
            protocol::UDP => "udp".into(),
            protocol::ICMP => "icmp".into(),
            protocol::ICMPV6 => "icmpv6".into(),
            n => n.to_string(),
        },
        src: e.orig.src_ip().to_string(),
        sport: e.orig.sport,
        dst: e.orig.dst_ip().to_string(),
        dport: e.orig.dport,
        state: e.state.into(),
        opened: match e.mark & !CUT {
            _ if flows => String::new(),
            OPENED_INGRESS => "ingress".into(),
            OPENED_EGRESS => "egress".into(),
            _ => String::new(),
        },
        cut: !flows && e.mark & CUT != 0,
        mark: e.mark,
        expires_in: e.expires_in,
    }
}

/// The flows' table's zones that hold connections.
fn flow_zones(ct: &Conntrack) -> Vec<FlowZone> {
    (0..=u16::MAX).map(|zone| FlowZone { zone, connections: ct.zone_len(zone) }).filter(|z| z.connections > 0).collect()
}

pub fn conntrack(c: &Switch, arg: Option<&str>) -> Result<ConntrackReply, CtlError> {
    let which = which(c, arg)?;
    let secured = c.ports.iter().flatten().filter(|ps| !ps.cfg.security_groups.is_empty());
    let mut r = ConntrackReply::default();
    if let Some(ct) = c.flow_conntrack.get() {
        r.flow_total = ct.len();
        r.bad_fragments = ct.bad_fragments.load(std::sync::atomic::Ordering::Relaxed);
        r.flow_zones = flow_zones(ct);
        if let Which::All | Which::Zone(_) = which {
            let zone = match which {
                Which::Zone(z) => Some(z),
                _ => None,
            };
            r.connections.extend(ct.entries(zone, MAX_LISTED).into_iter().map(|e| conn(e, String::new())));
        }
    }
    let Some(ct) = c.conntrack.get() else {
        let ports = secured.map(|ps| ZoneInfo { port: ps.name().into(), zone: zone_of(ps.id()), connections: 0 });
        r.ports = ports.collect();
        return Ok(r);
    };
    let names: HashMap<u16, &str> = c.ports.iter().flatten().map(|ps| (zone_of(ps.id()), ps.name())).collect();
    r.ports = secured
        .map(|ps| {
            let zone = zone_of(ps.id());
            ZoneInfo { port: ps.name().into(), zone, connections: ct.zone_len(zone) }
        })
        .collect();
    let want = match which {
        Which::All => Some(None),
        Which::Port(ps) => Some(Some(zone_of(ps.id()))),
        Which::Zone(_) => None,
    };
    if let Some(want) = want {
        let listed = ct.entries(want, MAX_LISTED).into_iter().map(|e| {
            let port = names.get(&e.zone).map_or(String::new(), |n| n.to_string());
            conn(e, port)
        });
        // The ports' first: a zone's come after.
        let flows = std::mem::take(&mut r.connections);
        r.connections = listed.chain(flows).take(MAX_LISTED).collect();
    }
    use std::sync::atomic::Ordering::Relaxed;
    r.total = ct.len();
    r.limit = c.cfg.ct_max_connections;
    r.limit_per_port = c.cfg.ct_max_per_port;
    r.refused_port_limit = ct.refused[0].load(Relaxed);
    r.refused_table_full = ct.refused[1].load(Relaxed);
    r.bad_fragments += ct.bad_fragments.load(Relaxed);
    Ok(r)
}

/// Forgets every connection of port `arg` (its next frames are new connections), or of the
/// flows' zone `zone=N`.
pub fn flush(c: &Switch, arg: &str) -> Result<String, CtlError> {
    match which(c, Some(arg))? {
        Which::Port(ps) => {
            let n = c.conntrack.get().map_or(0, |ct| ct.flush(Some(zone_of(ps.id()))));
            Ok(format!("{n} connections of {arg} forgotten"))
        }
        Which::Zone(z) => {
            let n = c.flow_conntrack.get().map_or(0, |ct| ct.flush(Some(z)));
            Ok(format!("{n} connections of zone {z} forgotten"))
        }
        Which::All => unreachable!("an argument was given"),
    }
}
