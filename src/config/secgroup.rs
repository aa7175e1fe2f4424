//! `[[security_group]]`: named sets of rules, attached to ports by `security_groups`, as
//! OpenStack's security groups mean them. A rule allows connections in one direction
//! (`ingress`: toward the port, `egress`: from it) by family, protocol, destination port range
//! and remote address (a prefix, or the addresses of the ports in another group); what no rule
//! of a port's groups allows is dropped, and replies to an allowed connection pass without a
//! rule of their own (`secgroup` compiles the groups per port, `datapath::firewall` applies
//! them with connection tracking). A group allows every egress connection unless it says
//! `allow_all_egress = false` (OpenStack gives each new group those two rules).
#![forbid(unsafe_code)]

use super::error::{ConfigError, Ctx};
use super::ips::IpPrefix;
use super::raw::{RawSecurityGroup, RawSgRule};
use crate::wire::protocol;

/// The most groups, and rules in a group.
pub const MAX_GROUPS: usize = 1024;
pub const MAX_RULES: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecurityGroup {
    pub name: String,
    /// Every egress connection allowed (OpenStack's default egress rules).
    pub allow_all_egress: bool,
    pub rules: Vec<SgRule>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Connections opened toward the port.
    Ingress,
    /// Connections the port opens.
    Egress,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remote {
    Any,
    Prefix(IpPrefix),
    /// The addresses (`allowed_ips`) of the ports in this group.
    Group(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SgRule {
    pub direction: Direction,
    /// Some(false): IPv4 only; Some(true): IPv6 only; None: both.
    pub v6: Option<bool>,
    /// An IP protocol number; None: any.
    pub protocol: Option<u8>,
    /// TCP/UDP destination ports, inclusive; (0, 65535) for any.
    pub ports: (u16, u16),
    pub remote: Remote,
}

impl std::fmt::Display for SgRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dir = match self.direction {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        };
        write!(f, "{dir}")?;
        match self.v6 {
            Some(false) => write!(f, " ipv4")?,
            Some(true) => write!(f, " ipv6")?,
            None => {}
        }
        match self.protocol {
            Some(p) => write!(f, " {}", protocol_name(p))?,
            None => write!(f, " any")?,
        }
        match self.ports {
            (0, 65535) => {}
            (a, b) if a == b => write!(f, " port {a}")?,
            (a, b) => write!(f, " ports {a}-{b}")?,
        }
        match &self.remote {
            Remote::Any => Ok(()),
            Remote::Prefix(p) => write!(f, " remote {p}"),
            Remote::Group(g) => write!(f, " remote_group {g}"),
        }
    }
}

fn protocol_name(p: u8) -> String {
    match p {
        protocol::TCP => "tcp".into(),
        protocol::UDP => "udp".into(),
        protocol::ICMP => "icmp".into(),
        protocol::ICMPV6 => "icmpv6".into(),
        n => n.to_string(),
    }
}

/// The file's `[[security_group]]` tables: names unique, each rule's keys checked, every
/// `remote_group` a group of the file.
pub(super) fn validate(raw: Vec<RawSecurityGroup>, cx: &Ctx) -> Result<Vec<SecurityGroup>, ConfigError> {
    if raw.len() > MAX_GROUPS {
        return Err(cx.err(None, format!("{} security groups: at most {MAX_GROUPS}", raw.len())));
    }
    let mut groups: Vec<SecurityGroup> = Vec::new();
    for g in &raw {
        let name = &cx.name(&g.name, "security group", |n| groups.iter().any(|o| o.name == n))?;
        if g.rule.len() > MAX_RULES {
            return Err(cx.err(Some(g.name.span()), format!("{} rules: at most {MAX_RULES} a group", g.rule.len())));
        }
        let rules = g.rule.iter().map(|r| rule(r, cx)).collect::<Result<Vec<_>, _>>()?;
        groups.push(SecurityGroup { name: name.clone(), allow_all_egress: g.allow_all_egress.unwrap_or(true), rules });
    }
    for g in &raw {
        for r in &g.rule {
            if let Some(rg) = &r.remote_group
                && !groups.iter().any(|o| &o.name == rg.get_ref())
            {
                return Err(cx.err(Some(rg.span()), format!("remote_group: no security group \"{}\"", rg.get_ref())));
            }
        }
    }
    Ok(groups)
}

fn rule(r: &RawSgRule, cx: &Ctx) -> Result<SgRule, ConfigError> {
    let direction = match r.direction.get_ref().as_str() {
        "ingress" => Direction::Ingress,
        "egress" => Direction::Egress,
        other => {
            return Err(cx.err(
                Some(r.direction.span()),
                format!("direction: expected \"ingress\" or \"egress\", found \"{other}\""),
            ));
        }
    };
    let mut v6 = match r.ethertype.as_ref().map(|e| (e.get_ref().as_str(), e.span())) {
        None => None,
        Some(("ipv4" | "IPv4", _)) => Some(false),
        Some(("ipv6" | "IPv6", _)) => Some(true),
        Some((other, span)) => {
            return Err(cx.err(Some(span), format!("ethertype: expected \"ipv4\" or \"ipv6\", found \"{other}\"")));
        }
    };
    let protocol = match r.protocol.as_ref() {
        None => None,
        Some(p) => match p.get_ref().as_str() {
            "any" => None,
            "tcp" => Some(protocol::TCP),
            "udp" => Some(protocol::UDP),
            "icmp" => Some(protocol::ICMP),
            "icmpv6" | "ipv6-icmp" => Some(protocol::ICMPV6),
            n => Some(n.parse::<u8>().map_err(|_| {
                cx.err(
                    Some(p.span()),
                    format!("protocol: expected tcp, udp, icmp, icmpv6, any or a number 0-255, found \"{n}\""),
                )
            })?),
        },
    };
    let ports = match &r.ports {
        None => (0, 65535),
        Some(v) => {
            if !matches!(protocol, Some(protocol::TCP | protocol::UDP)) {
                return Err(cx.err(Some(v.span()), "ports: only for protocol \"tcp\" or \"udp\""));
            }
            port_range(v.get_ref())
                .ok_or_else(|| cx.err(Some(v.span()), "ports: expected a port (22) or a range (\"8000-8080\")"))?
        }
    };
    let remote = match (&r.remote, &r.remote_group) {
        (Some(a), Some(_)) => return Err(cx.err(Some(a.span()), "remote and remote_group: one or the other")),
        (Some(a), None) => {
            let p = IpPrefix::parse(a.get_ref()).ok_or_else(|| {
                cx.err(Some(a.span()), "remote: expected an address or prefix such as \"10.0.0.0/24\" or \"::/0\"")
            })?;
            if v6.is_some_and(|v| v != p.is_v6()) {
                return Err(cx.err(Some(a.span()), "remote: not of the rule's ethertype"));
            }
            v6 = Some(p.is_v6());
            Remote::Prefix(p)
        }
        (None, Some(g)) => Remote::Group(g.get_ref().clone()),
        (None, None) => Remote::Any,
    };
    match (protocol, v6) {
        (Some(protocol::ICMP), Some(true)) | (Some(protocol::ICMPV6), Some(false)) => {
            let span = r.protocol.as_ref().map(|p| p.span());
            return Err(cx.err(span, "protocol: not of the rule's ethertype (icmp is IPv4's, icmpv6 IPv6's)"));
        }
        (Some(protocol::ICMP), None) => v6 = Some(false),
        (Some(protocol::ICMPV6), None) => v6 = Some(true),
        _ => {}
    }
    Ok(SgRule { direction, v6, protocol, ports, remote })
}

/// `22`, `"22"` or `"8000-8080"`.
fn port_range(v: &toml::Value) -> Option<(u16, u16)> {
    match v {
        toml::Value::Integer(n) => {
            let p = u16::try_from(*n).ok()?;
            Some((p, p))
        }
        toml::Value::String(s) => {
            let num = |t: &str| t.trim().parse::<u16>().ok();
            let (a, b) = match s.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => (num(s)?, num(s)?),
            };
            (a <= b).then_some((a, b))
        }
        _ => None,
    }
}
