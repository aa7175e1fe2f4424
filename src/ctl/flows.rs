//! Control commands about the flow table: `flows` (dump with counters, as `ovs-ofctl
//! dump-flows`) and `trace` (which flow a described frame hits and where it would go, as
//! `ofproto/trace`). Both read the table the poll threads use; neither touches the data path.

use super::proto::{FlowInfo, FlowsReply, TraceReply};
use crate::datapath::counters::DROP_REASONS;
use crate::datapath::vlan::{header_for, header_vlan};
use crate::flow::table::{NO_MATCH, Verdict};
use crate::flow::{Emit, Field, FlowKey, Match, execute, parse_flow};
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

/// `trace in_port=vm1,dl_dst=...,tcp,tp_dst=80`: the fields not given are zero.
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
    steps.push(format!("frame: {}", Match::exact(key).to_ovs_string(&name)));
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
        let i = t.lookup(&key);
        if i == NO_MATCH {
            steps.push("no flow matches: drop (no_match)".into());
        } else {
            let e = &t.entries()[i as usize];
            let text = e.flow.to_ovs_string(&name);
            steps.push(format!("flow: {text}"));
            flow_text = Some(text);
            match e.verdict {
                Verdict::Drop => steps.push("actions drop the frame".into()),
                _ => {
                    let orig = header_of(&key);
                    let others = |p: u16| c.ports.iter().flatten().map(|x| x.id()).filter(move |&x| x != p);
                    execute(&e.flow.actions, &orig, |emit, h| {
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
