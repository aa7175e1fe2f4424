//! `conntrack [PORT]` and `conntrack-flush PORT`: security groups' connections, from the
//! switch's table (`Switch::conntrack`).

use std::collections::HashMap;

use crate::datapath::firewall::{CUT, OPENED_EGRESS, OPENED_INGRESS};
use crate::proto::{ConnInfo, ConntrackReply, CtlError, ErrorCode, MAX_LISTED, ZoneInfo};
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

pub fn conntrack(c: &Switch, port: Option<&str>) -> Result<ConntrackReply, CtlError> {
    let want = port.map(|name| find(c, name)).transpose()?.map(|ps| zone_of(ps.id()));
    let secured = c.ports.iter().flatten().filter(|ps| !ps.cfg.security_groups.is_empty());
    let Some(ct) = c.conntrack.get() else {
        let ports = secured.map(|ps| ZoneInfo { port: ps.name().into(), zone: zone_of(ps.id()), connections: 0 });
        return Ok(ConntrackReply { ports: ports.collect(), ..Default::default() });
    };
    let names: HashMap<u16, &str> = c.ports.iter().flatten().map(|ps| (zone_of(ps.id()), ps.name())).collect();
    let ports = secured
        .map(|ps| {
            let zone = zone_of(ps.id());
            ZoneInfo { port: ps.name().into(), zone, connections: ct.zone_len(zone) }
        })
        .collect();
    let connections = ct
        .entries(want, MAX_LISTED)
        .into_iter()
        .map(|e| ConnInfo {
            port: names.get(&e.zone).map_or(String::new(), |n| n.to_string()),
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
                OPENED_INGRESS => "ingress".into(),
                OPENED_EGRESS => "egress".into(),
                _ => String::new(),
            },
            cut: e.mark & CUT != 0,
            expires_in: e.expires_in,
        })
        .collect();
    use std::sync::atomic::Ordering::Relaxed;
    Ok(ConntrackReply {
        total: ct.len(),
        limit: c.cfg.ct_max_connections,
        limit_per_port: c.cfg.ct_max_per_port,
        refused_port_limit: ct.refused[0].load(Relaxed),
        refused_table_full: ct.refused[1].load(Relaxed),
        ports,
        connections,
    })
}

/// Forgets every connection of port `name` (its next frames are new connections).
pub fn flush(c: &Switch, name: &str) -> Result<String, CtlError> {
    let ps = find(c, name)?;
    let n = c.conntrack.get().map_or(0, |ct| ct.flush(Some(zone_of(ps.id()))));
    Ok(format!("{n} connections of {name} forgotten"))
}
