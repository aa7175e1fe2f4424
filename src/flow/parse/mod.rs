//! Parsing flows in `ovs-ofctl add-flow` syntax (see ovs-fields(7) and ovs-ofctl(8)): the
//! match here, the actions in `actions.rs`.
//!
//! `[field[=value]]... actions=action[,action]...`: match fields are separated by commas
//! and/or white space; `actions=` comes last and takes the rest of the string. A field's value
//! may also follow a `:` (`in_port:vm1`), as OVS accepts. Field names are case-sensitive;
//! action keywords and reserved ports (`NORMAL`, `FLOOD`, `ALL`, `IN_PORT`, `drop`) are not.
//!
//! Match fields: `table`, `priority`, `in_port`, `dl_src`, `dl_dst`, `dl_type`, `dl_vlan`,
//! `dl_vlan_pcp`, `vlan_tci`, `nw_src`, `nw_dst`, `nw_proto`, `nw_tos`, `tp_src`, `tp_dst`,
//! the connection tracker's `ct_state` (`+trk+est-new`, or `VALUE/MASK`), `ct_zone`,
//! `ct_mark` and the shorthands `ip`, `ipv6`, `arp`, `icmp`, `tcp`, `udp`, `sctp`. A field may
//! be given twice only with agreeing values. OVS's prerequisites are enforced once the whole
//! match is read, so their order does not matter (`tp_dst=80,tcp` is fine).
//!
//! Actions: `output:PORT`, `PORT`, `in_port`, `flood`, `all`, `normal`, `drop` (alone),
//! `mod_vlan_vid:VID`, `mod_vlan_pcp:PCP`, `strip_vlan`, `push_vlan:TPID`, `mod_dl_src:MAC`,
//! `mod_dl_dst:MAC`, and for tables and connection tracking `resubmit(,TABLE)`,
//! `goto_table:TABLE` (last, to a later table), `ct(commit,zone=N,table=N,
//! exec(set_field:V[/M]->ct_mark))` (any of its arguments; the match must say `ip` or `ipv6`)
//! and `ct_clear`. Commas inside parentheses belong to the action. An empty list, like
//! `drop`, parses to no actions. A keyword wins over a port of the same name.

use self::actions::parse_actions;
pub use self::lex::FlowError;
use self::lex::{err, masked, parse_uint, tokens};
use super::ct_state;
use super::key::{Field, VLAN_PRESENT};
use super::{DEFAULT_PRIORITY, Flow, MAX_TABLE, Match};
use crate::wire::{MacAddr, ethertype, protocol};

mod actions;
mod lex;

/// Dotted-quad IPv4 address.
fn parse_ipv4(v: &str) -> Option<u32> {
    let mut a = 0u32;
    let mut parts = v.split('.');
    for _ in 0..4 {
        let p = parts.next()?;
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        a = a << 8 | p.parse::<u8>().ok()? as u32;
    }
    parts.next().is_none().then_some(a)
}

/// `ct_state`'s value: `+flag-flag...` (OVS's names, `trk`, `new`, `est`, `rel`, `rpl`,
/// `inv`) or `VALUE[/MASK]`; (value, mask), or what is wrong.
fn parse_ct_state(v: &str) -> Result<(u64, u64), String> {
    if !v.starts_with(['+', '-']) {
        return masked(v, 0xff, |x| parse_uint(x, 0xff))
            .ok_or_else(|| "+FLAG-FLAG... (trk, new, est, rel, rpl, inv) or VALUE/MASK".to_string());
    }
    let (mut value, mut mask) = (0u64, 0u64);
    let mut rest = v;
    while let Some(sign) = rest.chars().next() {
        let body = &rest[1..];
        let end = body.find(['+', '-']).unwrap_or(body.len());
        let name = &body[..end];
        let Some(&(_, bit)) = ct_state::NAMES.iter().find(|(n, _)| *n == name) else {
            return Err(match name {
                "snat" | "dnat" => format!("\"{name}\": NAT is not supported"),
                _ => format!("unknown flag \"{name}\" (flags: trk, new, est, rel, rpl, inv)"),
            });
        };
        if sign != '+' && sign != '-' {
            return Err(format!("expected + or - before \"{name}\""));
        }
        if mask & bit as u64 != 0 && (value & bit as u64 != 0) != (sign == '+') {
            return Err(format!("\"{name}\" given both + and -"));
        }
        mask |= bit as u64;
        if sign == '+' {
            value |= bit as u64;
        }
        rest = &body[end..];
    }
    Ok((value, mask))
}

/// The match under construction, and where each field was set.
struct Builder<'a> {
    m: Match,
    priority: Option<u16>,
    table: Option<u8>,
    /// For each field, the first token that constrained it: (offset, text).
    src: [Option<(usize, &'a str)>; Field::ALL.len()],
}

impl<'a> Builder<'a> {
    /// ANDs `(value, mask)` into field `f`, rejecting bits that disagree with earlier tokens.
    fn set(&mut self, f: Field, value: u64, mask: u64, at: usize, tok: &'a str) -> Result<(), FlowError> {
        let old_mask = self.m.mask.get(f);
        let old = self.m.key.get(f);
        let value = value & mask;
        if (old ^ value) & old_mask & mask != 0 {
            let (_, earlier) = self.src[f as usize].unwrap_or((0, "?"));
            return err(at, format!("\"{tok}\" conflicts with earlier \"{earlier}\": both set {}", f.name()));
        }
        self.m.key.set(f, old | value);
        self.m.mask.set(f, old_mask | mask);
        if mask != 0 && self.src[f as usize].is_none() {
            self.src[f as usize] = Some((at, tok));
        }
        Ok(())
    }

    /// One match token at byte `at`. Long because it is one arm per ovs-ofctl field name (a
    /// table of the language), each arm a line or two.
    fn field(&mut self, at: usize, tok: &'a str, port: &dyn Fn(&str) -> Option<u16>) -> Result<(), FlowError> {
        let (name, value) = match tok.find(['=', ':']) {
            Some(p) => (&tok[..p], Some((at + p + 1, &tok[p + 1..]))),
            None => (tok, None),
        };
        let proto = |name| match name {
            "ip" => Some((ethertype::IPV4, None)),
            "ipv6" => Some((ethertype::IPV6, None)),
            "arp" => Some((ethertype::ARP, None)),
            "icmp" => Some((ethertype::IPV4, Some(protocol::ICMP))),
            "tcp" => Some((ethertype::IPV4, Some(protocol::TCP))),
            "udp" => Some((ethertype::IPV4, Some(protocol::UDP))),
            "sctp" => Some((ethertype::IPV4, Some(protocol::SCTP))),
            _ => None,
        };
        if let Some((ty, nw_proto)) = proto(name) {
            if value.is_some() {
                return err(at, format!("{name}: takes no value (it is short for a dl_type/nw_proto match)"));
            }
            self.set(Field::DlType, ty as u64, 0xffff, at, tok)?;
            if let Some(p) = nw_proto {
                self.set(Field::NwProto, p as u64, 0xff, at, tok)?;
            }
            return Ok(());
        }
        const FIELDS: &str = "table, priority, in_port, dl_src, dl_dst, dl_type, dl_vlan, dl_vlan_pcp, vlan_tci, \
                              nw_src, nw_dst, nw_proto, nw_tos, tp_src, tp_dst, ct_state, ct_zone, ct_mark, ip, \
                              ipv6, arp, icmp, tcp, udp, sctp";
        if name == "actions" {
            return err(at, "expected actions=... (no space before the =)");
        }
        let known = FIELDS.split(", ").any(|f| f == name);
        if !known {
            return err(at, format!("unknown field \"{name}\" (valid: {FIELDS}, then actions=...)"));
        }
        let Some((vat, v)) = value else {
            return err(at, format!("{name}: expected {name}=VALUE"));
        };
        let bad = |what: &str| err(vat, format!("{name}: expected {what}, found \"{v}\""));
        match name {
            "table" => {
                let Some(t) = parse_uint(v, MAX_TABLE as u64) else {
                    return bad(&format!("a table number 0..{MAX_TABLE}"));
                };
                if let Some(old) = self.table.filter(|&old| old != t as u8) {
                    return err(at, format!("table: given twice ({old} and {t})"));
                }
                self.table = Some(t as u8);
            }
            "ct_state" => match parse_ct_state(v) {
                Ok((value, mask)) => self.set(Field::CtState, value, mask, at, tok)?,
                Err(what) => return err(vat, format!("ct_state: expected {what}, found \"{v}\"")),
            },
            "ct_zone" => {
                let Some(z) = parse_uint(v, 0xffff) else { return bad("a zone 0..65535") };
                self.set(Field::CtZone, z, 0xffff, at, tok)?;
            }
            "ct_mark" => {
                let Some((m, mask)) = masked(v, 0xffff_ffff, |x| parse_uint(x, 0xffff_ffff)) else {
                    return bad("a 32-bit mark, optionally with /mask (e.g. 0x1/0x1)");
                };
                self.set(Field::CtMark, m, mask, at, tok)?;
            }
            "priority" => {
                let Some(p) = parse_uint(v, 0xffff) else { return bad("a number 0..65535") };
                if let Some(old) = self.priority.filter(|&old| old != p as u16) {
                    return err(at, format!("priority: given twice ({old} and {p})"));
                }
                self.priority = Some(p as u16);
            }
            "in_port" => {
                if v.is_empty() {
                    return bad("a port name");
                }
                let Some(p) = port(v) else { return err(vat, format!("in_port: unknown port \"{v}\"")) };
                self.set(Field::InPort, p as u64, 0xffff, at, tok)?;
            }
            "dl_src" | "dl_dst" => {
                let Some((a, m)) = masked(v, MacAddr::BROADCAST, |s| s.parse().ok()) else {
                    return bad("an Ethernet address (aa:bb:cc:dd:ee:ff), optionally with /mask");
                };
                let f = if name == "dl_src" { Field::DlSrc } else { Field::DlDst };
                self.set(f, a.to_u64(), m.to_u64(), at, tok)?;
            }
            "dl_type" => {
                let Some(t) = parse_uint(v, 0xffff) else { return bad("an ethertype 0..0xffff (e.g. 0x0800)") };
                self.set(Field::DlType, t, 0xffff, at, tok)?;
            }
            "dl_vlan" => match parse_uint(v, 0xffff) {
                Some(0xffff) => self.set(Field::VlanTci, 0, 0xffff, at, tok)?,
                Some(vid) if vid <= 0xfff => self.set(Field::VlanTci, vid | VLAN_PRESENT as u64, 0x1fff, at, tok)?,
                _ => return bad("a VLAN id 0..4095, or 0xffff for frames without a VLAN tag"),
            },
            "dl_vlan_pcp" => {
                let Some(pcp) = parse_uint(v, 7) else { return bad("a VLAN priority 0..7") };
                self.set(Field::VlanTci, pcp << 13 | VLAN_PRESENT as u64, 0xf000, at, tok)?;
            }
            "vlan_tci" => {
                let Some((t, m)) = masked(v, 0xffff, |x| parse_uint(x, 0xffff)) else {
                    return bad("a 16-bit TCI, optionally with /mask (e.g. 0x1005/0x1fff)");
                };
                self.set(Field::VlanTci, t, m, at, tok)?;
            }
            "nw_src" | "nw_dst" => {
                let addr = |x: &str| {
                    let (a, m) = x.split_once('/').unwrap_or((x, "32"));
                    let mask = if m.contains('.') {
                        parse_ipv4(m)?
                    } else {
                        let len = m.parse::<u8>().ok().filter(|&l| l <= 32 && m.bytes().all(|c| c.is_ascii_digit()))?;
                        (!0u64 << (32 - len)) as u32
                    };
                    Some((parse_ipv4(a)?, mask))
                };
                let Some((a, m)) = addr(v) else {
                    return bad("an IPv4 address, CIDR (10.0.0.0/24) or address/mask");
                };
                let f = if name == "nw_src" { Field::NwSrc } else { Field::NwDst };
                self.set(f, a as u64, m as u64, at, tok)?;
            }
            "nw_proto" => {
                let Some(p) = parse_uint(v, 0xff) else { return bad("a protocol number 0..255") };
                self.set(Field::NwProto, p, 0xff, at, tok)?;
            }
            "nw_tos" => {
                let Some(t) = parse_uint(v, 0xff) else { return bad("a TOS value 0..255") };
                self.set(Field::NwTos, t, 0xfc, at, tok)?;
            }
            "tp_src" | "tp_dst" => {
                let Some((p, m)) = masked(v, 0xffff, |x| parse_uint(x, 0xffff)) else {
                    return bad("a port number 0..65535, optionally with /mask (e.g. 0x1000/0xf000)");
                };
                let f = if name == "tp_src" { Field::TpSrc } else { Field::TpDst };
                self.set(f, p, m, at, tok)?;
            }
            _ => unreachable!("{name} is in FIELDS"),
        }
        Ok(())
    }

    /// OVS's prerequisites; reports the earliest offending token.
    fn check_prerequisites(&self) -> Result<(), FlowError> {
        let exact = |f: Field| (self.m.mask.get(f) == f.max()).then(|| self.m.key.get(f));
        let dl_type = exact(Field::DlType).map(|t| t as u16);
        let nw_proto = exact(Field::NwProto).map(|p| p as u8);
        let ip = dl_type == Some(ethertype::IPV4);
        let arp = dl_type == Some(ethertype::ARP);
        let mut first: Option<(usize, String)> = None;
        for f in Field::ALL {
            let Some((at, _)) = self.src[f as usize] else { continue };
            let name = f.name();
            let need = match f {
                Field::NwSrc | Field::NwDst | Field::NwProto if !(ip || arp) => {
                    format!("{name}: requires ip or arp (dl_type=0x0800 or 0x0806), e.g. \"ip,{name}=...\"")
                }
                Field::NwTos if !ip => "nw_tos: requires ip (dl_type=0x0800), e.g. \"ip,nw_tos=...\"".into(),
                Field::TpSrc | Field::TpDst
                    if !ip
                        || !matches!(
                            nw_proto,
                            Some(protocol::TCP | protocol::UDP | protocol::SCTP | protocol::ICMP)
                        ) =>
                {
                    format!(
                        "{name}: requires ip with nw_proto tcp (6), udp (17), sctp (132) or icmp (1, where \
                         tp_src/tp_dst are the ICMP type/code), e.g. \"tcp,{name}=...\""
                    )
                }
                _ => continue,
            };
            if first.as_ref().is_none_or(|(o, _)| at < *o) {
                first = Some((at, need));
            }
        }
        match first {
            Some((at, msg)) => err(at, msg),
            None => Ok(()),
        }
    }
}

/// Parses one flow in ovs-ofctl syntax. `port` resolves port names (for `in_port=` and
/// outputs); an unknown name is an error naming it. See the module docs for the syntax.
pub fn parse_flow(s: &str, port: &dyn Fn(&str) -> Option<u16>) -> Result<Flow, FlowError> {
    let mut b = Builder { m: Match::default(), priority: None, table: None, src: [None; Field::ALL.len()] };
    for (at, tok) in tokens(s, 0) {
        if let Some(rest) = tok.strip_prefix("actions=") {
            b.check_prerequisites()?;
            let base = at + "actions=".len();
            debug_assert!(s[base..].starts_with(rest));
            let table = b.table.unwrap_or(0);
            let actions = parse_actions(&s[base..], base, table, &b.m, port)?;
            return Ok(Flow { table, priority: b.priority.unwrap_or(DEFAULT_PRIORITY), m: b.m, actions });
        }
        b.field(at, tok, port)?;
    }
    err(s.len(), "missing actions=... at the end of the flow (e.g. actions=normal or actions=drop)")
}

#[cfg(test)]
mod tests {
    use super::super::key::FlowKey;
    use super::*;
    use crate::flow::{Action, Ct};
    use crate::wire::{MacAddr, protocol};

    fn port(s: &str) -> Option<u16> {
        match s {
            "vm1" => Some(1),
            "vm2" => Some(2),
            "uplink" => Some(0),
            _ => None,
        }
    }

    fn parse(s: &str) -> Result<Flow, FlowError> {
        parse_flow(s, &port)
    }

    /// The error for `s`, checking that its offset points at `at` (a substring of `s`).
    fn error(s: &str, at: &str) -> String {
        let e = parse(s).expect_err(s);
        let want = if at.is_empty() { s.len() } else { s.find(at).unwrap_or_else(|| panic!("{at} not in {s}")) };
        assert_eq!(e.offset, want, "{s}: {e}");
        e.message
    }

    #[test]
    fn fields() {
        let f = parse("priority=100,tcp,in_port=vm1,nw_dst=10.0.0.0/24 tp_dst=80, actions=output:vm2").unwrap();
        assert_eq!(f.priority, 100);
        let (k, m) = (f.m.key, f.m.mask);
        assert_eq!((k.in_port(), k.dl_type(), k.nw_proto(), k.tp_dst()), (1, ethertype::IPV4, protocol::TCP, 80));
        assert_eq!((k.nw_dst(), m.nw_dst()), (0x0a00_0000, 0xffff_ff00));
        assert_eq!(m.nw_src(), 0);
        assert_eq!(f.actions, vec![Action::Output(2)]);

        let f = parse("dl_src=02:00:00:00:00:01,dl_dst=ff:ff:ff:ff:ff:ff/01:00:00:00:00:00,actions=drop").unwrap();
        assert_eq!(f.priority, DEFAULT_PRIORITY);
        assert_eq!(f.m.key.dl_dst(), MacAddr([1, 0, 0, 0, 0, 0]));
        assert_eq!(f.m.mask.dl_src(), MacAddr::BROADCAST);
        assert!(f.actions.is_empty());

        let f = parse("dl_vlan=10 actions=normal").unwrap();
        assert_eq!((f.m.key.vlan_tci(), f.m.mask.vlan_tci()), (0x100a, 0x1fff));
        let f = parse("dl_vlan=0xffff actions=normal").unwrap();
        assert_eq!((f.m.key.vlan_tci(), f.m.mask.vlan_tci()), (0, 0xffff));
        let f = parse("dl_vlan_pcp=3,dl_vlan=10 actions=normal").unwrap();
        assert_eq!((f.m.key.vlan_tci(), f.m.mask.vlan_tci()), (0x700a, 0xffff));
        let f = parse("ip,nw_tos=0xff,nw_src=1.2.3.4/255.255.0.0 actions=normal").unwrap();
        assert_eq!((f.m.key.nw_tos(), f.m.mask.nw_tos()), (0xfc, 0xfc));
        assert_eq!((f.m.key.nw_src(), f.m.mask.nw_src()), (0x0102_0000, 0xffff_0000));
        let f = parse("udp,tp_src=0x1234/0xf000 in_port:uplink actions=normal").unwrap();
        assert_eq!((f.m.key.tp_src(), f.m.mask.tp_src(), f.m.key.in_port()), (0x1000, 0xf000, 0));
        // Order of prerequisites does not matter; repeating an agreeing value is fine.
        let f = parse("tp_dst=80,nw_proto=6,ip,tcp,priority=5,priority=5 actions=drop").unwrap();
        assert_eq!(f.priority, 5);
        // dl_type in decimal; an empty match.
        assert_eq!(parse("dl_type=2054,nw_proto=1 actions=drop").unwrap().m.key.dl_type(), ethertype::ARP);
        assert_eq!(parse("actions=drop").unwrap().m, Match::default());
        assert_eq!(parse("  actions=drop").unwrap().m.mask, FlowKey::default());
    }

    #[test]
    fn actions() {
        let all = parse(
            "actions=output:vm1,vm2,IN_PORT,Flood,all,NORMAL,output:normal,mod_vlan_vid:4095,mod_vlan_pcp:7,\
             strip_vlan,push_vlan:0x88a8,mod_dl_src:02:00:00:00:00:01 mod_dl_dst:2:0:0:0:0:2",
        )
        .unwrap();
        assert_eq!(
            all.actions,
            vec![
                Action::Output(1),
                Action::Output(2),
                Action::InPort,
                Action::Flood,
                Action::All,
                Action::Normal,
                Action::Normal,
                Action::SetVlanVid(4095),
                Action::SetVlanPcp(7),
                Action::StripVlan,
                Action::PushVlan(0x88a8),
                Action::SetDlSrc(MacAddr([2, 0, 0, 0, 0, 1])),
                Action::SetDlDst(MacAddr([2, 0, 0, 0, 0, 2])),
            ]
        );
        assert!(parse("actions=").unwrap().actions.is_empty());
        assert!(parse("actions=DROP").unwrap().actions.is_empty());
        let f = parse("actions=MOD_DL_SRC:2:0:0:0:0:1,Mod_Dl_Dst:2:0:0:0:0:2,OUTPUT:uplink,output:IN_PORT").unwrap();
        assert_eq!(
            f.actions,
            vec![
                Action::SetDlSrc(MacAddr([2, 0, 0, 0, 0, 1])),
                Action::SetDlDst(MacAddr([2, 0, 0, 0, 0, 2])),
                Action::Output(0),
                Action::InPort
            ]
        );
    }

    #[test]
    fn value_errors() {
        let m = error("ip,nw_dst=10.0.0.300 actions=drop", "10.0.0.300");
        assert_eq!(m, r#"nw_dst: expected an IPv4 address, CIDR (10.0.0.0/24) or address/mask, found "10.0.0.300""#);
        for (s, at, frag) in [
            ("ip,nw_src=10.0.0.0/33 actions=drop", "10.0.0.0/33", "nw_src: expected an IPv4"),
            ("ip,nw_src=10.0.0 actions=drop", "10.0.0 ", "nw_src: expected an IPv4"),
            ("ip,nw_src=10.0.0.1/ actions=drop", "10.0.0.1/", "nw_src: expected an IPv4"),
            ("priority=65536 actions=drop", "65536", "priority: expected a number 0..65535"),
            ("priority=-1 actions=drop", "-1", "priority: expected"),
            ("in_port=vm9 actions=drop", "vm9", r#"in_port: unknown port "vm9""#),
            ("dl_src=02:00:00:00:00 actions=drop", "02:", "dl_src: expected an Ethernet address"),
            ("dl_dst=02:00:00:00:00:001 actions=drop", "02:", "dl_dst: expected an Ethernet address"),
            ("dl_dst=02:00:00:00:00:01/x actions=drop", "02:", "dl_dst: expected an Ethernet address"),
            ("dl_type=0x10000 actions=drop", "0x10000", "dl_type: expected an ethertype"),
            ("dl_type=ip actions=drop", "ip ", "dl_type: expected an ethertype"),
            ("dl_vlan=4096 actions=drop", "4096", "dl_vlan: expected a VLAN id 0..4095, or 0xffff"),
            ("dl_vlan_pcp=8 actions=drop", "8 ", "dl_vlan_pcp: expected a VLAN priority 0..7"),
            ("vlan_tci=0x1000/ actions=drop", "0x1000/", "vlan_tci: expected a 16-bit TCI"),
            ("ip,nw_proto=256 actions=drop", "256", "nw_proto: expected a protocol number 0..255"),
            ("ip,nw_tos=x actions=drop", "x ", "nw_tos: expected a TOS value 0..255"),
            ("tcp,tp_dst=0x1000/0x10000 actions=drop", "0x1000/", "tp_dst: expected a port number 0..65535"),
            ("tcp,tp_src= actions=drop", " actions", "tp_src: expected a port number"),
            ("tcp=1 actions=drop", "tcp", "tcp: takes no value"),
            ("nw_dst actions=drop", "nw_dst", "nw_dst: expected nw_dst=VALUE"),
            ("nw_dest=1.2.3.4 actions=drop", "nw_dest", r#"unknown field "nw_dest" (valid: table, priority, in_port,"#),
            ("priority=1,priority=2 actions=drop", "priority=2", "priority: given twice (1 and 2)"),
            ("in_port=vm1", "", "missing actions="),
            ("in_port=vm1 actions = drop", "actions", "expected actions=... (no space"),
            ("", "", "missing actions="),
        ] {
            let m = error(s, at);
            assert!(m.starts_with(frag), "{s}: {m}");
        }
    }

    #[test]
    fn conflicts() {
        let m = error("tcp,udp actions=drop", "udp");
        assert_eq!(m, r#""udp" conflicts with earlier "tcp": both set nw_proto"#);
        let m = error("ip,dl_type=0x0806 actions=drop", "dl_type");
        assert_eq!(m, r#""dl_type=0x0806" conflicts with earlier "ip": both set dl_type"#);
        error("dl_vlan=0xffff,dl_vlan_pcp=1 actions=drop", "dl_vlan_pcp");
        error("dl_vlan=1,dl_vlan=2 actions=drop", "dl_vlan=2");
        error("ip,nw_dst=10.0.0.0/8,nw_dst=11.0.0.1 actions=drop", "nw_dst=11");
        // Overlapping but compatible masks combine.
        let f = parse("ip,nw_dst=10.0.0.0/8,nw_dst=10.1.0.0/16 actions=drop").unwrap();
        assert_eq!((f.m.key.nw_dst(), f.m.mask.nw_dst()), (0x0a01_0000, 0xffff_0000));
    }

    #[test]
    fn prerequisites() {
        for (s, at, frag) in [
            ("nw_dst=10.0.0.1 actions=drop", "nw_dst", "nw_dst: requires ip or arp"),
            ("dl_type=0x86dd,nw_proto=6 actions=drop", "nw_proto", "nw_proto: requires ip or arp"),
            ("arp,nw_tos=4 actions=drop", "nw_tos", "nw_tos: requires ip (dl_type=0x0800)"),
            ("ip,tp_dst=80 actions=drop", "tp_dst", "tp_dst: requires ip with nw_proto tcp (6), udp (17)"),
            ("arp,nw_proto=6,tp_src=80 actions=drop", "tp_src", "tp_src: requires ip with nw_proto"),
            ("ip,nw_proto=47,tp_src=80 actions=drop", "tp_src", "tp_src: requires"),
            // The earliest offending field is reported.
            ("tp_dst=1,nw_src=1.1.1.1 actions=drop", "tp_dst", "tp_dst: requires"),
        ] {
            let m = error(s, at);
            assert!(m.starts_with(frag), "{s}: {m}");
        }
        for ok in [
            "arp,nw_src=10.0.0.1,nw_proto=1 actions=drop",
            "icmp,tp_src=8 actions=drop",
            "sctp,tp_dst=9 actions=drop",
            "udp,nw_tos=8 actions=drop",
            "ip,nw_dst=1.2.3.4/0,tp_dst=0/0 actions=drop",
            "nw_dst=0.0.0.0/0 actions=drop",
        ] {
            parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn action_errors() {
        for (s, at, frag) in [
            ("actions=output:vm9", "vm9", r#"output: unknown port "vm9""#),
            ("actions=vm9", "vm9", r#"unknown action or port "vm9" (actions: output:PORT,"#),
            ("actions=set_field:1->x", "set_field", r#"unknown action "set_field""#),
            ("actions=output", "output", "output: expected output:VALUE"),
            ("actions=normal:1", "normal", "normal: takes no argument"),
            ("actions=mod_vlan_vid:4096", "4096", "mod_vlan_vid: expected a VLAN id 0..4095"),
            ("actions=mod_vlan_pcp:8", "8", "mod_vlan_pcp: expected a VLAN priority 0..7"),
            ("actions=push_vlan:0x0800", "0x0800", "push_vlan: expected a VLAN TPID, 0x8100 or 0x88a8"),
            ("actions=mod_dl_src:1:2:3", "1:2:3", "mod_dl_src: expected an Ethernet address"),
            ("actions=output:vm1,drop", "drop", "drop: must be the only action"),
            ("actions=drop,vm1", "drop", "drop: must be the only action"),
            ("actions=Mod_Dl_Dst:1:2:3:4:5:6:7", "1:2", "Mod_Dl_Dst: expected an Ethernet address"),
            ("actions=strip_vlan:1", "strip_vlan", "strip_vlan: takes no argument"),
            ("actions=mod_dl_dst", "mod_dl_dst", "mod_dl_dst: expected mod_dl_dst:VALUE"),
        ] {
            let m = error(s, at);
            assert!(m.starts_with(frag), "{s}: {m}");
        }
    }

    #[test]
    fn tables_and_connection_tracking() {
        let f = parse("table=1,priority=5,ip,ct_state=+trk+est-new,ct_zone=7,ct_mark=0x3/0xf,actions=normal").unwrap();
        assert_eq!((f.table, f.priority), (1, 5));
        let (k, m) = (f.m.key, f.m.mask);
        use super::super::ct_state::*;
        assert_eq!((k.ct_state(), m.ct_state()), (TRK | EST, TRK | EST | NEW));
        assert_eq!((k.ct_zone(), m.ct_zone(), k.ct_mark(), m.ct_mark()), (7, 0xffff, 3, 0xf));
        assert_eq!(parse("ct_state=0x21/0x21,actions=drop").unwrap().m.key.ct_state(), TRK | NEW);
        assert_eq!(parse("ct_state=-trk,actions=drop").unwrap().m.mask.ct_state(), TRK);
        let f = parse(
            "ip,actions=ct(commit,zone=5,table=2,exec(set_field:0x1/0x3->ct_mark)),ct_clear,resubmit(,4),\
             ct(),ct,goto_table:9",
        )
        .unwrap();
        let ct = |commit, zone, table, mark| Action::Ct(Ct { commit, zone, table, mark });
        assert_eq!(
            f.actions,
            vec![
                ct(true, 5, Some(2), Some((1, 3))),
                Action::CtClear,
                Action::Resubmit(4),
                ct(false, 0, None, None),
                ct(false, 0, None, None),
                Action::GotoTable(9),
            ]
        );
        assert_eq!(parse("ipv6,actions=ct(table=1)").unwrap().m.key.dl_type(), ethertype::IPV6);
        assert_eq!(parse("table=254,actions=resubmit(,0)").unwrap().table, 254);
        for (s, at, frag) in [
            ("table=255,actions=drop", "255", "table: expected a table number 0..254"),
            ("table=1,table=2,actions=drop", "table=2", "table: given twice (1 and 2)"),
            ("ct_state=+trk+bogus,actions=drop", "+trk", r#"ct_state: expected unknown flag "bogus""#),
            ("ct_state=+snat,actions=drop", "+snat", r#"ct_state: expected "snat": NAT is not supported"#),
            ("ct_state=+trk-trk,actions=drop", "+trk", r#"ct_state: expected "trk" given both + and -"#),
            ("ct_state=+est,ct_state=-est,actions=drop", "ct_state=-est", "\"ct_state=-est\" conflicts"),
            ("ct_zone=65536,actions=drop", "65536", "ct_zone: expected a zone 0..65535"),
            ("ct_mark=0x100000000,actions=drop", "0x1", "ct_mark: expected a 32-bit mark"),
            ("actions=ct(table=1)", "ct(", "ct: the match must say ip or ipv6"),
            ("arp,actions=ct(commit)", "ct(", "ct: the match must say ip or ipv6"),
            ("ip,actions=ct(nat)", "nat", "ct: nat is not supported"),
            ("ip,actions=ct(zone=NXM_NX_REG0[0..15])", "zone=", "ct: zone: expected a zone 0..65535"),
            ("ip,actions=ct(table=300)", "table=", "ct: table: expected a table 0..254"),
            (
                "ip,actions=ct(exec(set_field:1->ct_mark))",
                "ct(",
                "ct: exec(...) sets the connection's mark and needs commit",
            ),
            (
                "ip,actions=ct(commit,exec(set_field:1->reg0))",
                "set_field",
                "ct: exec: only set_field:VALUE[/MASK]->ct_mark",
            ),
            ("ip,actions=ct(commit,force)", "force", "ct: force is not supported"),
            ("ip,actions=ct(commit", "ct(", "ct: missing the closing parenthesis"),
            ("actions=resubmit(vm1,2)", "vm1", "resubmit: only resubmit(,TABLE) is supported"),
            ("actions=resubmit(,x)", "x)", "resubmit: expected a table 0..254"),
            (
                "table=3,actions=goto_table:3",
                "goto_table",
                "goto_table:3: a flow in table 3 may only go to a later table",
            ),
            ("actions=goto_table:2,output:vm1", "goto_table", "goto_table: must be the last action"),
            ("actions=goto_table", "goto_table", "goto_table: expected goto_table:VALUE"),
            ("actions=learn(x)", "learn", r#"unknown action "learn(...)""#),
        ] {
            let m = error(s, at);
            assert!(m.starts_with(frag), "{s}: {m}");
        }
    }

    #[test]
    fn never_panics_on_garbage() {
        use super::super::key::testutil::Rng;
        let alphabet =
            ["ip", "tcp", ",", " ", "=", ":", "/", "actions=", "nw_dst", "tp_dst", "0x", "1", "é", "vm1", "."];
        let mut rng = Rng(3);
        for _ in 0..20_000 {
            let s: String = (0..rng.below(12)).map(|_| rng.pick(&alphabet)).collect();
            if let Err(e) = parse(&s) {
                assert!(e.offset <= s.len(), "{s:?}: {e:?}");
                assert!(s.is_char_boundary(e.offset));
            }
        }
    }
}
