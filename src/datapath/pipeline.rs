//! The tables after the first, and the connection tracker as flows use it: between classify
//! and the firewall, for the frames whose table-0 flow goes on (`resubmit(,N)`,
//! `goto_table:N`, `ct(...)`, `ct_clear`; classify left them `Out::Pipeline`).
//!
//! A frame's walk follows OVS's semantics: the flow's actions run in order; `resubmit` and
//! `goto_table` look the frame's key up in another table and run that flow's actions before the
//! rest of the list; `ct(zone=N)` tracks the frame in zone N (storing its connection with
//! `commit`, setting the connection's mark with `exec(set_field:V->ct_mark)`) and, with
//! `table=N`, continues in table N with the connection's state in the key (`ct_state`,
//! `ct_zone`, `ct_mark`); `ct_clear` forgets that state; header rewrites change the key the
//! next lookups see. The walk decides nothing about delivery by itself: it records the flows it
//! met (the frame's `Path`) and the outputs met on the way. A walk whose only effect is one
//! output (the usual `ct(table=1)` then `ct(commit),output:2`, or `actions=normal` after the
//! tracker) leaves with that output as any table-0 flow would; anything else (header rewrites,
//! several outputs) is run by tx from the path (`flow::execute_path`).
//!
//! Bounded: a walk meets at most `flow::MAX_PATH` flows (a resubmit loop is dropped,
//! `resubmit_limit`). Each flow the walk meets after the first is counted here; the first is
//! counted with the frame, as every flow is. Costs nothing to a table without such flows
//! (the stage is not entered: `FlowTable::has_pipeline`). The tracker is the flows' own table
//! (`PortTable::flow_conntrack`), apart from security groups': zones named in flows never
//! meet a port's connections.
#![forbid(unsafe_code)]

use super::Env;
use super::classify::{Recent, normal_frame};
use super::counters::DropReason;
use super::firewall::ct_packet;
use super::frame::{FRONT_MAX, Frame, Out, Path, ct_seen};
use super::plan::PortPolicy;
use crate::conntrack::{BURST, Commit, Conntrack, CtPacket, CtResult};
use crate::flow::table::NO_MATCH;
use crate::flow::{Action, Field, FlowKey, ct_state};

/// What a walk met that delivery will do.
#[derive(Default)]
struct Effect {
    /// Outputs met (`output`, `in_port`, `flood`, `all`, `normal`).
    outputs: u32,
    /// The first of them.
    first: Option<Action>,
    /// A header rewrite met (tx must then run the path: an output before it sends the frame
    /// as it was, one after it as rewritten).
    rewrites: bool,
    /// A table the walk entered had no flow for the frame.
    missed: bool,
}

/// A walk's state: the frame's key as the tables see it, the tracker's view of the frame
/// (parsed at the first `ct`) and its last answer, and what it met.
struct Walk<'a> {
    key: FlowKey,
    path: Path,
    effect: Effect,
    ct: Option<&'a Conntrack>,
    pkt: Option<CtPacket>,
    /// The zone the frame was last tracked in, and what the tracker said.
    tracked: Option<(u16, CtResult)>,
}

/// The stage: each frame of the burst left `Out::Pipeline` walks the tables and leaves with
/// where it goes.
pub(super) fn pipeline_burst(env: &Env, recent: &mut Recent, in_port: u16, policy: &PortPolicy, frames: &mut [Frame]) {
    let Some(ct) = env.ports.flow_conntrack.as_deref().filter(|ct| ct.worth_prefetching()) else {
        for f in frames.iter_mut() {
            if let Out::Pipeline(first) = f.out {
                f.out = walk(env, recent, in_port, policy, f, first, None);
            }
        }
        return;
    };
    for frames in frames.chunks_mut(BURST) {
        let mut parsed = [None; BURST];
        prefetch(env, ct, frames, &mut parsed);
        for (f, pkt) in frames.iter_mut().zip(parsed) {
            if let Out::Pipeline(first) = f.out {
                f.out = walk(env, recent, in_port, policy, f, first, pkt);
            }
        }
    }
}

/// A burst's lookups in the tracker, started together (`Conntrack::prefetch_tags`): each frame
/// whose table-0 flow tracks it is parsed as the tracker sees it (into `parsed`, for its
/// walk) and its connection's place, in the zone of that flow's first `ct`, starts loading;
/// then the slots there. The walks then find them in the cache, where frame after frame of
/// new tuples would each wait for two misses in turn.
fn prefetch(env: &Env, ct: &Conntrack, frames: &mut [Frame], parsed: &mut [Option<CtPacket>; BURST]) {
    let mut places = [None; BURST];
    for ((f, pkt), place) in frames.iter_mut().zip(parsed.iter_mut()).zip(places.iter_mut()) {
        let Out::Pipeline(first) = f.out else { continue };
        let zone = env.flows.actions(first).iter().find_map(|a| match a {
            Action::Ct(c) => Some(c.zone),
            _ => None,
        });
        let Some(zone) = zone else { continue };
        deepen(f);
        let p = ct_packet(f);
        *place = ct.prefetch_tags(&p, zone);
        *pkt = Some(p);
    }
    for place in places.iter().flatten() {
        ct.prefetch_slots(*place);
    }
}

/// The frame's front made deep enough for every table's fields and the tracker's headers.
#[inline]
fn deepen(f: &mut Frame) {
    f.deepen_front(FRONT_MAX);
    let need = FlowKey::l4_end(f.front());
    if need > f.front().len() {
        f.deepen_front(need);
    }
}

/// One frame's walk from flow `first` (table 0's), and where it goes; `pkt` is the frame as
/// the tracker sees it, if the burst's prefetch parsed it.
fn walk(
    env: &Env,
    recent: &mut Recent,
    in_port: u16,
    policy: &PortPolicy,
    f: &mut Frame,
    first: u32,
    pkt: Option<CtPacket>,
) -> Out {
    deepen(f);
    let mut w = Walk {
        key: FlowKey::extract_to(in_port, f.front(), env.flows.all_depth()),
        path: Path::default(),
        effect: Effect::default(),
        ct: env.ports.flow_conntrack.as_deref(),
        pkt,
        tracked: None,
    };
    w.path.push(first);
    let walked = visit(env, f, &mut w, first);
    if let Some((zone, r)) = w.tracked {
        f.ct = ct_seen(zone, r.state);
    }
    if let Err(why) = walked {
        return Out::Drop(why);
    }
    let e = &w.effect;
    if e.outputs == 1 && !e.rewrites {
        return match e.first {
            Some(Action::Output(p)) if p == in_port => Out::Nowhere,
            Some(Action::Output(p)) => Out::Port(p),
            Some(Action::InPort) => Out::Port(in_port),
            Some(Action::Flood | Action::All) => Out::Flood,
            Some(Action::Normal) => match f.front_at::<12>(0) {
                Some(addrs) => normal_frame(env, recent, in_port, policy, f, &addrs),
                None => Out::Drop(DropReason::Runt),
            },
            _ => Out::Drop(DropReason::FlowDrop),
        };
    }
    if e.outputs == 0 {
        // As in OVS, a table that has no flow for a frame drops it.
        return Out::Drop(if e.missed { DropReason::NoMatch } else { DropReason::FlowDrop });
    }
    f.path = w.path;
    Out::Path(first)
}

/// Runs flow `i`'s actions for the walk, following each into its table.
fn visit(env: &Env, f: &Frame, w: &mut Walk, i: u32) -> Result<(), DropReason> {
    for a in env.flows.actions(i) {
        match *a {
            Action::Resubmit(t) | Action::GotoTable(t) => enter(env, f, w, t)?,
            Action::Ct(ct) => {
                let (state, mark) = track(f, w, ct.zone, ct.commit.then_some(Commit { mark: ct.mark }))?;
                if let Some(t) = ct.table {
                    w.key.set(Field::CtState, state as u64);
                    w.key.set(Field::CtZone, ct.zone as u64);
                    w.key.set(Field::CtMark, mark as u64);
                    enter(env, f, w, t)?;
                }
            }
            Action::Output(_) | Action::InPort | Action::Flood | Action::All | Action::Normal => {
                w.effect.outputs += 1;
                w.effect.first.get_or_insert(*a);
            }
            Action::Drop => return Ok(()),
            // Header rewrites (and `ct_clear`): the key changes for later tables, and a
            // rewrite makes delivery run the path.
            _ => w.effect.rewrites |= a.apply_to_key(&mut w.key),
        }
    }
    Ok(())
}

/// Continues in table `t` with the walk's key: its flow (counted) joins the path and runs.
fn enter(env: &Env, f: &Frame, w: &mut Walk, t: u8) -> Result<(), DropReason> {
    let j = env.flows.lookup_in(t, &w.key);
    if !w.path.push(j) {
        return Err(DropReason::ResubmitLimit);
    }
    env.flows.count(env.cx.index, j, 1, f.len as u64);
    if j == NO_MATCH {
        w.effect.missed = true;
        return Ok(());
    }
    visit(env, f, w, j)
}

/// The frame tracked in `zone` (stored with `commit`): its `ct_state` and the connection's
/// mark. A commit the tracker has no room for drops the frame (`ct_limit`), as OVS's ct_limit
/// does. Tracked again in the zone it was just tracked in (`ct(table=1)`, then `ct(commit)`),
/// the frame is not shown to the tracker twice (a TCP segment would move its connection's
/// state twice) unless it has something to store: a new connection, or a mark.
fn track(f: &Frame, w: &mut Walk, zone: u16, commit: Option<Commit>) -> Result<(u8, u32), DropReason> {
    let Some(ct) = w.ct else { return Ok((ct_state::TRK | ct_state::INV, 0)) };
    if let Some((z, r)) = w.tracked
        && z == zone
        && commit.is_none_or(|c| r.stored && c.mark.is_none())
    {
        return Ok((r.state, r.mark));
    }
    let pkt = *w.pkt.get_or_insert_with(|| ct_packet(f));
    let r = ct.track(&pkt, zone, commit, ct.clock());
    w.tracked = Some((zone, r));
    match r.refused {
        Some(_) => Err(DropReason::CtLimit),
        None => Ok((r.state, r.mark)),
    }
}
