//! Delivery of what routing decided (`datapath/route.rs`): a routed frame written to its
//! neighbour's port under the routed headers, and the switch's answers (ARP for a gateway, an
//! echo reply from it) written back to their sender. A run of routed frames to one port is
//! written under one opening of it (`tx::deliver_in_order` holds it), an answer alone.
#![forbid(unsafe_code)]

use super::delivery::Delivery;
use super::{Open, write_alone};
use crate::datapath::Env;
use crate::datapath::counters::DropReason;
use crate::datapath::frame::{FRONT_MAX, Frame};
use crate::datapath::route::{self, Answer, MAX_PREFIX};

/// Writes routed frame `f` to `o`, the open port of neighbour `n` of the plan's routes.
pub(super) fn routed(env: &Env, o: &mut Open, f: &Frame, n: u16, dv: &mut Delivery) -> Result<(), DropReason> {
    let routes = env.ports.routes.as_deref().ok_or(DropReason::RouteNoNeighbour)?;
    let (nb, net) = routes.neighbour(n).zip(routes.net_of(f.vlan)).ok_or(DropReason::RouteNoNeighbour)?;
    let tagged = o.policy.vlan.egress(net.vlan).ok_or(DropReason::VlanNotAllowed)?;
    let mut buf = [0u8; MAX_PREFIX];
    let shape = route::shape_routed(f, nb, net, tagged, &mut buf).ok_or(DropReason::RouteBadHeader)?;
    o.write(f, shape, dv)
}

/// Writes the switch's answer to frame `f` back to its sender, `in_port`.
pub(super) fn answer(env: &Env, f: &Frame, in_port: u16, dv: &mut Delivery) {
    let pc = &env.cx.stats.ports[in_port as usize];
    let Some(routes) = env.ports.routes.as_deref() else { return };
    let Some(net) = routes.net_of(f.vlan) else { return };
    let Some(tagged) = env.ports.policy[in_port as usize].vlan.egress(net.vlan) else {
        return pc.drop(DropReason::VlanNotAllowed, 1);
    };
    let mut buf = [0u8; FRONT_MAX];
    match route::shape_answer(routes, f, net, tagged, &mut buf) {
        Some((shape, Answer::Error(why))) => {
            // The frame itself went no further; the error only while the sender's budget lasts.
            pc.drop(why, 1);
            let budget = dv.icmp_errors.get_mut(in_port as usize);
            if budget.is_some_and(|b| b.take(env.now, crate::counter::cycles_per_sec())) {
                write_alone(env, in_port, f, shape, dv, true);
            }
        }
        // Not `send_one`: the sender's rules would judge the frame it sent, not this answer.
        Some((shape, _)) => write_alone(env, in_port, f, shape, dv, true),
        None => pc.drop(DropReason::RouteBadHeader, 1),
    }
}
