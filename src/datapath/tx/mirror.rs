//! Mirrors' copies (`[[mirror]]`): a frame a selected port sent, as it came (`as_src`, after
//! its burst was delivered), or a frame a selected port was given, as it was written to it
//! (`as_dst`, from the destination's slow path, as captures see it), copied to the mirror's
//! output port, cut to its `snaplen`. A copy never waits: one the output cannot take is
//! dropped and counted on the output (its `rx_ring_full`, ...), not on the mirrored ports, so a
//! slow or stopped mirror costs its sources nothing but the copies' attempts.
//!
//! Locks: a copy made by `as_dst` locks the output's ring while the destination's is held. An
//! output receives nothing but copies and is never selected (`config::mirror`), so its lock is
//! always the last taken, and no thread holding it waits for another.
#![forbid(unsafe_code)]

use super::Open;
use super::delivery::Delivery;
use crate::datapath::Env;
use crate::datapath::frame::{AS_IS, Frame, NO_VLAN, Out, Shape};
use crate::datapath::plan::MirrorTo;
use crate::wire::{VirtioNetHdr, ethernet};

/// Copies the frames a port sent (those consumed from its burst, but its drops) to the
/// outputs of `to`, its mirrors as a source: each output opened once for the burst.
#[cold]
#[inline(never)]
pub(in crate::datapath) fn as_src(env: &Env, dv: &mut Delivery, to: &[MirrorTo], frames: &[Frame]) {
    for m in to {
        let mut open: Option<Open> = None;
        for f in frames.iter().filter(|f| !matches!(f.out, Out::Drop(_)) && selects(m, f)) {
            let o = match open.as_mut() {
                Some(o) => o,
                None => match Open::new(env, m.port) {
                    Some(o) => open.insert(o),
                    None => break,
                },
            };
            copy(o, m, f, AS_IS, dv);
        }
        if let Some(o) = open {
            o.close(&env.cx.stats.ports[m.port as usize], dv);
        }
    }
    if !dv.nic_tx.is_empty() {
        dv.nic_tx.flush(env.ports, env.cx.index, &env.cx.stats);
    }
}

/// Copies frame `f`, as shape `e` wrote it to a port, to the outputs of `to`, that port's
/// mirrors as a destination; not to a mirror that copied it already as its source's.
#[cold]
#[inline(never)]
pub(in crate::datapath) fn as_dst<'a>(env: &'a Env<'a>, dv: &mut Delivery, to: &[MirrorTo], f: &Frame, e: Shape) {
    let src_of = env.ports.policy.get(dv.in_port as usize).map_or(0, |p| p.mirrors.src_of);
    for m in to.iter().filter(|m| src_of & (1 << m.bit) == 0 && selects(m, f)) {
        if let Some(mut o) = Open::new(env, m.port) {
            copy(&mut o, m, f, e, dv);
            o.close(&env.cx.stats.ports[m.port as usize], dv);
        }
    }
}

/// Whether mirror `m` selects frame `f` by its VLAN: the VLAN NORMAL switched it in, else
/// its outer tag's.
#[inline]
fn selects(m: &MirrorTo, f: &Frame) -> bool {
    let Some(vlans) = &m.vlans else { return true };
    let vid = match f.vlan {
        NO_VLAN => {
            let mut h = [0u8; 16];
            let n = f.read_at(0, &mut h);
            match u16::from_be_bytes([h[12], h[13]]) {
                ethernet::ethertype::VLAN | ethernet::ethertype::QINQ if n >= 16 => {
                    u16::from_be_bytes([h[14], h[15]]) & 0xfff
                }
                _ => return false,
            }
        }
        v => v,
    };
    vlans.contains(vid)
}

/// Writes one copy of `f`, shaped by `e`, to output `o`: whole (the offloads it asked for done
/// for the output as for any destination), or cut to the mirror's snaplen (a cut copy asks for
/// no offload: it is a record, not a frame to finish). Never waits: what the output cannot
/// take is dropped and counted on it.
fn copy(o: &mut Open, m: &MirrorTo, f: &Frame, e: Shape, dv: &mut Delivery) {
    let len = e.prefix.len() as u32 + e.body_len(f);
    let wrote = if len <= m.snaplen {
        o.write(f, e, dv)
    } else {
        let cut = Shape { take: m.snaplen.saturating_sub(e.prefix.len() as u32), patch: None, ..e };
        let r = match o.slow {
            true => o.write_one::<true>(f, cut, &VirtioNetHdr::PLAIN, dv),
            false => o.write_one::<false>(f, cut, &VirtioNetHdr::PLAIN, dv),
        };
        r.map(|_| ())
    };
    if let Err(why) = wrote {
        o.cx.stats.ports[m.port as usize].drop(why, 1);
    }
}
