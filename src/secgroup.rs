//! Security groups compiled for one port: the `[[security_group]]`s it is in, as the data path
//! asks them (`datapath::firewall`): may a connection open in this direction? A rule's remote
//! group becomes the addresses (`allowed_ips`) of the ports in that group. Only a connection's
//! first frame asks; its later frames and its replies are connection tracking's (`conntrack`).
//! Pure.
#![forbid(unsafe_code)]

use crate::config::PortConfig;
use crate::config::ips::IpPrefix;
use crate::config::secgroup::{Direction, Remote, SecurityGroup};
use crate::conntrack::Tuple;

/// One port's rules, by direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRules {
    /// The connection-tracking zone of the port's connections (its own: the same addresses
    /// behind two ports are two connections).
    pub zone: u16,
    ingress: Vec<Rule>,
    egress: Vec<Rule>,
    /// Some group allows every egress connection.
    all_egress: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    v6: Option<bool>,
    protocol: Option<u8>,
    ports: (u16, u16),
    /// None: any address.
    remotes: Option<Vec<IpPrefix>>,
}

impl Rule {
    /// Whether a connection to or from `remote` (of family `v6`), of `protocol` to port
    /// `dport`, is this rule's.
    fn matches(&self, remote: &[u8; 16], v6: bool, protocol: u8, dport: u16) -> bool {
        self.v6.is_none_or(|r| r == v6)
            && self.protocol.is_none_or(|p| p == protocol)
            && (self.ports == (0, 65535) || (self.ports.0 <= dport && dport <= self.ports.1))
            && self.remotes.as_ref().is_none_or(|r| r.iter().any(|p| p.contains(remote, v6)))
    }
}

impl PortRules {
    /// Whether a connection whose first frame is `t` may open: toward the port (`Ingress`, `t`
    /// from the remote) or from it (`Egress`, `t` to the remote).
    pub fn allows(&self, dir: Direction, t: &Tuple) -> bool {
        match dir {
            Direction::Ingress => self.ingress.iter().any(|r| r.matches(&t.src, t.v6, t.proto, t.dport)),
            Direction::Egress => {
                self.all_egress || self.egress.iter().any(|r| r.matches(&t.dst, t.v6, t.proto, t.dport))
            }
        }
    }
}

/// `port`'s rules, if it is in any group, with `zone` as its zone; `ports` are every port
/// (the members of remote groups).
pub fn compile(port: &PortConfig, groups: &[SecurityGroup], ports: &[&PortConfig], zone: u16) -> Option<PortRules> {
    if port.security_groups.is_empty() {
        return None;
    }
    let mut rules = PortRules { zone, ingress: Vec::new(), egress: Vec::new(), all_egress: false };
    for g in groups.iter().filter(|g| port.security_groups.contains(&g.name)) {
        rules.all_egress |= g.allow_all_egress;
        for r in &g.rules {
            let remotes = match &r.remote {
                Remote::Any => None,
                Remote::Prefix(p) => Some(vec![*p]),
                Remote::Group(name) => Some(
                    ports
                        .iter()
                        .filter(|q| q.security_groups.contains(name))
                        .flat_map(|q| q.allowed_ips.iter().copied())
                        .collect(),
                ),
            };
            let rule = Rule { v6: r.v6, protocol: r.protocol, ports: r.ports, remotes };
            match r.direction {
                Direction::Ingress => rules.ingress.push(rule),
                Direction::Egress => rules.egress.push(rule),
            }
        }
    }
    Some(rules)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn conf() -> Config {
        Config::parse(
            "t.toml",
            r#"
[[security_group]]
name = "web"
[[security_group.rule]]
direction = "ingress"
protocol = "tcp"
ports = "5201-5202"
[[security_group.rule]]
direction = "ingress"
protocol = "icmp"
remote = "10.0.0.0/24"
[[security_group.rule]]
direction = "ingress"
protocol = "udp"
ports = 53
remote_group = "db"

[[security_group]]
name = "db"
allow_all_egress = false
[[security_group.rule]]
direction = "egress"
protocol = "tcp"
ports = 5432

[[port]]
name = "vm0"
type = "vhost-user"
socket = "/tmp/x/vm0.sock"
security_groups = ["web"]

[[port]]
name = "vm1"
type = "vhost-user"
socket = "/tmp/x/vm1.sock"
security_groups = ["db"]
allowed_ips = ["10.1.0.7", "fd00::7"]
"#,
        )
        .unwrap()
    }

    fn t(src: [u8; 4], dst: [u8; 4], proto: u8, dport: u16) -> Tuple {
        let (mut s, mut d) = ([0u8; 16], [0u8; 16]);
        s[..4].copy_from_slice(&src);
        d[..4].copy_from_slice(&dst);
        Tuple { src: s, dst: d, sport: 40000, dport, proto, v6: false }
    }

    #[test]
    fn rules_by_direction_protocol_ports_and_remote() {
        let c = conf();
        let ports: Vec<&PortConfig> = c.ports.iter().collect();
        let web = compile(&c.ports[0], &c.security_groups, &ports, 1).unwrap();
        let db = compile(&c.ports[1], &c.security_groups, &ports, 2).unwrap();
        let (me, other, near) = ([10, 2, 0, 5], [192, 0, 2, 1], [10, 0, 0, 9]);
        use Direction::*;
        assert!(web.allows(Ingress, &t(other, me, 6, 5201)));
        assert!(web.allows(Ingress, &t(other, me, 6, 5202)));
        assert!(!web.allows(Ingress, &t(other, me, 6, 5203)), "past the range");
        assert!(!web.allows(Ingress, &t(other, me, 17, 5201)), "another protocol");
        assert!(web.allows(Ingress, &t(near, me, 1, 0)), "ICMP from the prefix");
        assert!(!web.allows(Ingress, &t(other, me, 1, 0)), "ICMP from elsewhere");
        assert!(web.allows(Ingress, &t([10, 1, 0, 7], me, 17, 53)), "from a member of db");
        assert!(!web.allows(Ingress, &t([10, 1, 0, 8], me, 17, 53)), "from no member of db");
        assert!(web.allows(Egress, &t(me, other, 17, 9)), "egress: all allowed by default");
        assert!(db.allows(Egress, &t(me, other, 6, 5432)));
        assert!(!db.allows(Egress, &t(me, other, 6, 80)), "allow_all_egress = false");
        assert!(!db.allows(Ingress, &t(other, me, 6, 5432)), "no ingress rule: ingress denied");
        let mut v6 = t(other, me, 6, 5201);
        v6.v6 = true;
        assert!(web.allows(Ingress, &v6), "a rule without ethertype or remote is both families'");
        assert!(
            compile(&PortConfig { security_groups: vec![], ..c.ports[0].clone() }, &c.security_groups, &ports, 1)
                .is_none()
        );
    }

    #[test]
    fn bad_groups_and_rules_are_refused_with_their_place() {
        let port = "[[port]]\nname = \"vm0\"\ntype = \"vhost-user\"\nsocket = \"/tmp/x/vm0.sock\"\n";
        let cases: [(&str, &str); 9] = [
            ("[[security_group]]\nname = \"a\"\n[[security_group]]\nname = \"a\"\n", "duplicate security group"),
            ("[[security_group]]\nname = \"a\"\n[[security_group.rule]]\ndirection = \"in\"\n", "direction"),
            (
                "[[security_group]]\nname = \"a\"\n[[security_group.rule]]\ndirection = \"ingress\"\nports = 22\n",
                "only for protocol",
            ),
            (
                "[[security_group]]\nname = \"a\"\n[[security_group.rule]]\ndirection = \"ingress\"\nprotocol = \"tcp\"\nports = \"9-1\"\n",
                "ports",
            ),
            (
                "[[security_group]]\nname = \"a\"\n[[security_group.rule]]\ndirection = \"ingress\"\nprotocol = \"gre\"\n",
                "protocol",
            ),
            (
                "[[security_group]]\nname = \"a\"\n[[security_group.rule]]\ndirection = \"ingress\"\nremote_group = \"b\"\n",
                "remote_group",
            ),
            (
                "[[security_group]]\nname = \"a\"\n[[security_group.rule]]\ndirection = \"ingress\"\nremote = \"10.0.0.1/8\"\n",
                "remote",
            ),
            (
                "[[security_group]]\nname = \"a\"\n[[security_group.rule]]\ndirection = \"ingress\"\nethertype = \"ipv6\"\nprotocol = \"icmp\"\n",
                "ethertype",
            ),
            ("", "no [[security_group]] named \"web\""),
        ];
        for (text, want) in cases {
            let text = format!("{text}{port}security_groups = [\"web\"]\n");
            let e = Config::parse("t.toml", &text).unwrap_err().to_string();
            assert!(e.contains(want) && e.starts_with("t.toml:"), "{text}\n -> {e}");
        }
    }
}
