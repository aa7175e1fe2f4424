//! A flow's action list in `ovs-ofctl` syntax (the module docs of `parse` list the actions).

use super::lex::{FlowError, err, masked, parse_uint, tokens};
use crate::flow::action::{Action, Ct};
use crate::flow::key::Field;
use crate::flow::{MAX_TABLE, Match};
use crate::wire::{MacAddr, ethertype};

/// `in_port`, `flood`, `all`, `normal` in any case.
fn reserved_port(name: &str) -> Option<Action> {
    match name.to_ascii_lowercase().as_str() {
        "in_port" => Some(Action::InPort),
        "flood" => Some(Action::Flood),
        "all" => Some(Action::All),
        "normal" => Some(Action::Normal),
        _ => None,
    }
}

const ACTIONS: &str = "output:PORT, PORT, in_port, flood, all, normal, drop, mod_vlan_vid:VID, mod_vlan_pcp:PCP, \
                       strip_vlan, push_vlan:TPID, mod_dl_src:MAC, mod_dl_dst:MAC, resubmit(,TABLE), \
                       goto_table:TABLE, ct(...), ct_clear";

/// A table number in an action (`resubmit`, `goto_table`, `ct(table=)`).
fn table_arg(v: &str) -> Option<u8> {
    parse_uint(v, MAX_TABLE as u64).map(|t| t as u8)
}

/// `resubmit(,TABLE)`'s or `ct(...)`'s argument list `args`, at byte `at`.
fn parse_call(at: usize, name: &str, args: &str) -> Result<Action, FlowError> {
    let aat = at + name.len() + 1;
    match name {
        "resubmit" => match args.split_once(',') {
            Some(("", t)) => match table_arg(t) {
                Some(t) => Ok(Action::Resubmit(t)),
                None => err(aat + 1, format!("resubmit: expected a table 0..{MAX_TABLE}, found \"{t}\"")),
            },
            _ => err(aat, "resubmit: only resubmit(,TABLE) is supported (resubmitting as another in_port is not)"),
        },
        "ct" => {
            let mut ct = Ct::default();
            for (a, arg) in tokens(args, aat) {
                let (key, v) = arg.split_once('=').unwrap_or((arg, ""));
                let bad = |what: &str| err(a, format!("ct: {key}: expected {what}, found \"{v}\""));
                match key {
                    "commit" if v.is_empty() => ct.commit = true,
                    "zone" => match parse_uint(v, 0xffff) {
                        Some(z) => ct.zone = z as u16,
                        None => return bad("a zone 0..65535 (a field as the zone is not supported)"),
                    },
                    "table" => match table_arg(v) {
                        Some(t) => ct.table = Some(t),
                        None => return bad(&format!("a table 0..{MAX_TABLE}")),
                    },
                    _ if arg.starts_with("exec(") && arg.ends_with(')') => {
                        let inner = &arg[5..arg.len() - 1];
                        for (e, x) in tokens(inner, a + 5) {
                            let mark = x.strip_prefix("set_field:").and_then(|x| x.strip_suffix("->ct_mark"));
                            let Some(m) = mark.and_then(|m| masked(m, 0xffff_ffff, |y| parse_uint(y, 0xffff_ffff)))
                            else {
                                return err(
                                    e,
                                    format!(
                                        "ct: exec: only set_field:VALUE[/MASK]->ct_mark is supported, found \"{x}\""
                                    ),
                                );
                            };
                            ct.mark = Some((m.0 as u32, m.1 as u32));
                        }
                    }
                    "nat" | "alg" | "force" => return err(a, format!("ct: {key} is not supported")),
                    _ => {
                        return err(
                            a,
                            format!(
                                "ct: unknown argument \"{arg}\" (commit, zone=N, table=N, exec(set_field:V->ct_mark))"
                            ),
                        );
                    }
                }
            }
            if ct.mark.is_some() && !ct.commit {
                return err(at, "ct: exec(...) sets the connection's mark and needs commit, as in OVS");
            }
            Ok(Action::Ct(ct))
        }
        _ => err(at, format!("unknown action \"{name}(...)\" (actions: {ACTIONS})")),
    }
}

/// One action token `tok` at byte `at`; `None` for `drop`.
fn parse_action(at: usize, tok: &str, port: &dyn Fn(&str) -> Option<u16>) -> Result<Option<Action>, FlowError> {
    if let Some(open) = tok.find('(').filter(|&o| !tok[..o].contains(':')) {
        let name = tok[..open].to_ascii_lowercase();
        let Some(args) = tok[open + 1..].strip_suffix(')') else {
            return err(at, format!("{}: missing the closing parenthesis", &tok[..open]));
        };
        return parse_call(at, &name, args).map(Some);
    }
    let Some((name, v)) = tok.split_once(':') else {
        let lower = tok.to_ascii_lowercase();
        return match lower.as_str() {
            "drop" => Ok(None),
            "strip_vlan" => Ok(Some(Action::StripVlan)),
            "ct_clear" => Ok(Some(Action::CtClear)),
            "ct" => Ok(Some(Action::Ct(Ct::default()))),
            "output" | "goto_table" | "mod_vlan_vid" | "mod_vlan_pcp" | "push_vlan" | "mod_dl_src" | "mod_dl_dst" => {
                err(at, format!("{tok}: expected {tok}:VALUE"))
            }
            _ => match reserved_port(tok).or_else(|| port(tok).map(Action::Output)) {
                Some(a) => Ok(Some(a)),
                None => err(at, format!("unknown action or port \"{tok}\" (actions: {ACTIONS})")),
            },
        };
    };
    let vat = at + name.len() + 1;
    let bad = |what: &str| err(vat, format!("{name}: expected {what}, found \"{v}\""));
    let a = match name.to_ascii_lowercase().as_str() {
        "output" => match reserved_port(v).or_else(|| port(v).map(Action::Output)) {
            Some(a) => a,
            None => return err(vat, format!("output: unknown port \"{v}\"")),
        },
        "mod_vlan_vid" => match parse_uint(v, 0xfff) {
            Some(vid) => Action::SetVlanVid(vid as u16),
            None => return bad("a VLAN id 0..4095"),
        },
        "mod_vlan_pcp" => match parse_uint(v, 7) {
            Some(pcp) => Action::SetVlanPcp(pcp as u8),
            None => return bad("a VLAN priority 0..7"),
        },
        "push_vlan" => match parse_uint(v, 0xffff).map(|t| t as u16) {
            Some(t @ (ethertype::VLAN | ethertype::QINQ)) => Action::PushVlan(t),
            _ => return bad("a VLAN TPID, 0x8100 or 0x88a8"),
        },
        "goto_table" => match table_arg(v) {
            Some(t) => Action::GotoTable(t),
            None => return bad(&format!("a table 0..{MAX_TABLE}")),
        },
        "mod_dl_src" | "mod_dl_dst" => match v.parse::<MacAddr>().ok() {
            Some(mac) if name.eq_ignore_ascii_case("mod_dl_src") => Action::SetDlSrc(mac),
            Some(mac) => Action::SetDlDst(mac),
            None => return bad("an Ethernet address (aa:bb:cc:dd:ee:ff)"),
        },
        "drop" | "strip_vlan" | "ct_clear" | "in_port" | "flood" | "all" | "normal" => {
            return err(at, format!("{name}: takes no argument"));
        }
        _ => return err(at, format!("unknown action \"{name}\" (actions: {ACTIONS})")),
    };
    Ok(Some(a))
}

/// The action list `s`, which starts at byte `base` of the flow string, of a flow in `table`
/// whose match is `m`.
pub(super) fn parse_actions(
    s: &str,
    base: usize,
    table: u8,
    m: &Match,
    port: &dyn Fn(&str) -> Option<u16>,
) -> Result<Vec<Action>, FlowError> {
    let mut actions = Vec::new();
    let mut drop_at = None;
    let mut goto_at = None;
    for (at, tok) in tokens(s, base) {
        if let Some(g) = goto_at {
            return err(g, "goto_table: must be the last action");
        }
        match parse_action(at, tok, port)? {
            Some(Action::GotoTable(t)) if t <= table => {
                return err(at, format!("goto_table:{t}: a flow in table {table} may only go to a later table"));
            }
            Some(Action::Ct(_)) if !matches!(m.mask.get(Field::DlType), 0xffff) || !is_ip(m.key.dl_type()) => {
                return err(at, "ct: the match must say ip or ipv6 (dl_type=0x0800 or 0x86dd), as in OVS");
            }
            Some(a) => {
                if matches!(a, Action::GotoTable(_)) {
                    goto_at = Some(at);
                }
                actions.push(a)
            }
            None => drop_at = drop_at.or(Some(at)),
        }
    }
    match drop_at {
        Some(at) if !actions.is_empty() => err(at, "drop: must be the only action"),
        _ => Ok(actions),
    }
}

fn is_ip(dl_type: u16) -> bool {
    matches!(dl_type, ethertype::IPV4 | ethertype::IPV6)
}
