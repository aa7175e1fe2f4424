//! Control commands about the flow table: `flows` (dump with counters, as `ovs-ofctl
//! dump-flows`) and `trace` (which flow a described frame hits and where it would go, as
//! `ofproto/trace`). Both read the table the poll threads use; neither touches the data path.

use super::proto::{FlowInfo, FlowsReply, TraceReply};
use crate::datapath::counters::DROP_REASONS;
use crate::datapath::vlan::{header_for, header_vlan};
use crate::flow::table::{NO_MATCH, Verdict};
use crate::flow::{Action, Emit, Field, FlowKey, MAX_PATH, Match, ct_state, ct_state_string, execute_path, parse_flow};
use crate::switch::Switch;
use crate::wire::{EthernetRepr, VlanTag, ethertype};

pub fn flows(c: &Switch) -> FlowsReply {
    let name = |id: u16| c.port_name(id);
    let t = &c.flows;
    let age = t.age_secs();
    let flows = t
        .entries()
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let (n_packets, n_bytes) = t.totals(i);
            FlowInfo {
                table: e.flow.table,
                priority: e.flow.priority,
                matches: e.flow.m.to_ovs_string(&name),
                actions: e.flow.actions.iter().map(|a| a.to_ovs_string(&name)).collect(),
                flow: e.flow.to_ovs_string(&name),
                n_packets,
                n_bytes,
                duration_secs: age,
            }
        })
        .collect();
    let (missed_packets, missed_bytes) = t.missed();
    FlowsReply { normal_only: t.is_normal(), missed_packets, missed_bytes, flows }
}

/// Where a NORMAL action sends frame header `h` from `in_port`, by the learned MACs and, on a
/// switch with VLANs, by the frame's VLAN as the data path decides it: the steps that explain
/// it and the outputs, each with how the frame leaves that port.
fn normal_outputs(c: &Switch, in_port: u16, h: &EthernetRepr) -> (Vec<String>, Vec<String>) {
    let name = |id: u16| c.port_name(id);
    let vlans = c.ports.iter().flatten().any(|p| !p.cfg.vlan.is_default());
    let mut steps = Vec::new();
    let vid = if vlans {
        let Some(pc) = c.port(in_port as usize) else { return (steps, Vec::new()) };
        match header_vlan(&pc.cfg.vlan, h) {
            Ok(vid) => {
                steps.push(format!("vlan: VLAN {vid} (input port {}: {})", pc.name(), pc.cfg.vlan));
                vid
            }
            Err(why) => {
                let reason = DROP_REASONS[why as usize].0;
                steps.push(format!("vlan: {} ({}) may not send this frame: drop ({reason})", pc.name(), pc.cfg.vlan));
                return (steps, Vec::new());
            }
        }
    } else {
        0
    };
    // How the frame leaves port `p`: None if `p` does not carry the VLAN.
    let leaves = |p: u16| -> Option<String> {
        if !vlans {
            return Some(name(p));
        }
        let out = header_for(&c.port(p as usize)?.cfg.vlan, vid, h)?;
        Some(match out.tags[..out.ntags as usize].first() {
            Some(t) => format!("{} (tagged {})", name(p), t.vid()),
            None => format!("{} (untagged)", name(p)),
        })
    };
    let flood = || c.ports.iter().flatten().map(|p| p.id()).filter(|&p| p != in_port).filter_map(leaves).collect();
    let dst = &h.dst;
    let in_vlan = if vlans { format!(" in VLAN {vid}") } else { String::new() };
    let (why, outputs) = if dst.is_multicast() {
        (format!("broadcast/multicast: flood{in_vlan}"), flood())
    } else {
        match c.mac.lookup(dst, vid) {
            Some(p) if p == in_port => (format!("{dst} was learned on the input port: drop"), vec![]),
            Some(p) => (format!("{dst} learned on {}{in_vlan}", name(p)), leaves(p).into_iter().collect()),
            None => (format!("{dst} not learned{in_vlan}: flood"), flood()),
        }
    };
    steps.push(format!("normal: {why}"));
    (steps, outputs)
}

/// The frame header a key describes (addresses and VLAN tag), for running actions.
fn header_of(key: &FlowKey) -> EthernetRepr {
    let mut h = EthernetRepr { dst: key.dl_dst(), src: key.dl_src(), ..EthernetRepr::default() };
    if let Some(vid) = key.vlan_vid() {
        let tci = vid | (key.vlan_pcp().unwrap_or(0) as u16) << VlanTag::PCP_SHIFT;
        h.push_tag(VlanTag::new(ethertype::VLAN, tci));
    }
    h
}

fn describe_header(h: &EthernetRepr, orig: &EthernetRepr) -> String {
    if h == orig {
        return String::new();
    }
    let mut parts = Vec::new();
    if h.dst != orig.dst {
        parts.push(format!("dl_dst={}", h.dst));
    }
    if h.src != orig.src {
        parts.push(format!("dl_src={}", h.src));
    }
    let tags: Vec<String> = h.tags[..h.ntags as usize]
        .iter()
        .map(|t| format!("0x{:04x}:vid={},pcp={}", t.tpid, t.vid(), t.pcp()))
        .collect();
    parts.push(if tags.is_empty() { "untagged".into() } else { format!("vlan {}", tags.join(" ")) });
    format!(" ({})", parts.join(", "))
}

/// A described frame's walk through the tables, as the data path's (`datapath/pipeline.rs`):
/// the flows it meets (`path`, for `execute_path`) and a step for each table and `ct`.
struct TraceWalk<'a> {
    c: &'a Switch,
    /// What each `ct(table=N)` finds.
    ct_next: u8,
    key: FlowKey,
    path: Vec<u32>,
    steps: Vec<String>,
}

impl TraceWalk<'_> {
    /// Flow `i`'s actions, `depth` tables deep.
    fn flow(&mut self, i: u32, depth: usize) {
        let t = &self.c.flows;
        let name = |id: u16| self.c.port_name(id);
        let indent = "  ".repeat(depth);
        for a in t.actions(i) {
            let Some(next) = a.next_table() else {
                a.apply_to_key(&mut self.key);
                continue;
            };
            if let Action::Ct(ct) = a {
                let state = ct_state_string(self.ct_next, self.ct_next);
                let commit = if ct.commit { ", committed" } else { "" };
                self.steps.push(format!("{indent}ct(zone={}): {state}{commit}", ct.zone));
                self.key.set(Field::CtState, self.ct_next as u64);
                self.key.set(Field::CtZone, ct.zone as u64);
                self.key.set(Field::CtMark, ct.mark.map_or(0, |(v, m)| v & m) as u64);
            }
            if self.path.len() >= MAX_PATH {
                self.steps.push(format!("{indent}table {next}: more than {MAX_PATH} flows met: drop (resubmit_limit)"));
                self.path.clear();
                return;
            }
            let j = t.lookup_in(next, &self.key);
            self.path.push(j);
            if j == NO_MATCH {
                self.steps.push(format!("{indent}table {next}: no flow matches"));
                continue;
            }
            let text = t.entries()[j as usize].flow.to_ovs_string(&name);
            self.steps.push(format!("{indent}table {next}: {text}"));
            self.flow(j, depth + 1);
            if self.path.is_empty() {
                return;
            }
        }
    }
}

/// `trace in_port=vm1,dl_dst=...,tcp,tp_dst=80`: the fields not given are zero; a
/// `ct_state` in the description is what each `ct(table=N)` finds (default `+trk+new`).
pub fn trace(c: &Switch, spec: &str) -> Result<TraceReply, String> {
    let ids = |n: &str| c.port_by_name(n).map(|p| p.id());
    let f = parse_flow(&format!("{spec},actions=drop"), &ids).map_err(|e| format!("trace: {}", e.message))?;
    if f.m.mask.get(Field::InPort) == 0 {
        return Err("trace: expected in_port=PORT in the frame description".into());
    }
    let key = f.m.key;
    let in_port = key.in_port();
    let name = |id: u16| c.port_name(id);
    let mut steps = Vec::new();
    // The frame's headers (the tracker's fields are no header).
    let headers = [Field::CtState, Field::CtZone, Field::CtMark].iter().fold(FlowKey::EXACT, |m, &f| m.with(f, 0));
    steps.push(format!("frame: {}", Match::new(key, headers).to_ovs_string(&name)));
    let pc = c.port(in_port as usize).ok_or("trace: no such port")?;
    let src = key.dl_src();
    if !pc.cfg.allowed_macs.is_empty() && !pc.cfg.allowed_macs.contains(&src) {
        steps.push(format!("port security: {} may not send from {}: drop", pc.name(), src));
        return Ok(TraceReply { flow: None, outputs: Vec::new(), steps });
    }
    let t = &c.flows;
    let mut outputs: Vec<String> = Vec::new();
    let mut flow_text = None;
    let push_normal = |steps: &mut Vec<String>, outputs: &mut Vec<String>, h: &EthernetRepr| {
        let (why, outs) = normal_outputs(c, in_port, h);
        steps.extend(why);
        outputs.extend(outs);
    };
    if t.is_normal() {
        steps.push("no flows configured: actions=normal".into());
        push_normal(&mut steps, &mut outputs, &header_of(&key));
    } else {
        // The frame meets table 0 untracked; each ct(table=N) finds what the description's
        // ct_state says (as ofproto/trace's --ct-next), by default a new connection.
        let ct_next = match f.m.mask.ct_state() {
            0 => ct_state::TRK | ct_state::NEW,
            _ => key.ct_state() | ct_state::TRK,
        };
        let mut walk = TraceWalk { c, ct_next, key: key.with(Field::CtState, 0), path: Vec::new(), steps: Vec::new() };
        let i = t.lookup_in(0, &walk.key);
        if i == NO_MATCH {
            steps.push("no flow matches: drop (no_match)".into());
        } else {
            let e = &t.entries()[i as usize];
            let text = e.flow.to_ovs_string(&name);
            steps.push(format!("flow: {text}"));
            flow_text = Some(text);
            walk.path.push(i);
            walk.flow(i, 1);
            steps.append(&mut walk.steps);
            match e.verdict {
                Verdict::Drop => steps.push("actions drop the frame".into()),
                _ => {
                    let orig = header_of(&key);
                    let others = |p: u16| c.ports.iter().flatten().map(|x| x.id()).filter(move |&x| x != p);
                    execute_path(&walk.path, &|fi| t.actions(fi), &orig, |emit, h| {
                        let extra = describe_header(h, &orig);
                        match emit {
                            Emit::Port(p) if p == in_port => {
                                steps.push(format!("output:{} skipped: input port", name(p)))
                            }
                            Emit::Port(p) => outputs.push(format!("{}{extra}", name(p))),
                            Emit::InPort => outputs.push(format!("{}{extra}", name(in_port))),
                            Emit::Flood | Emit::All => {
                                outputs.extend(others(in_port).map(|p| format!("{}{extra}", name(p))))
                            }
                            Emit::Normal => push_normal(&mut steps, &mut outputs, h),
                        }
                    });
                }
            }
        }
    }
    steps.push(if outputs.is_empty() {
        "result: dropped".into()
    } else {
        format!("result: output to {}", outputs.join(", "))
    });
    Ok(TraceReply { flow: flow_text, outputs, steps })
}
