//! Parking idle queues (`datapath::thread::park`): an idle guest queue leaves the polled set, is not
//! visited while parked, and its first frame brings it back: by its kick, by the check after a
//! frame that beat the parking, or by the sweep for a driver that never kicks. No frame is
//! lost at any moment of it.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::*;

/// A bench whose queues park after 1 us empty, checked every iteration that is due.
fn parking_bench(vms: usize) -> Bench {
    Bench::new(BenchCfg { vms, park_after_us: 1, ..Default::default() })
}

/// Steps the bench until `done` holds (bounded by 10 s of wall time).
fn step_until(b: &mut Bench, what: &str, mut done: impl FnMut(&mut Bench) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(b) {
        assert!(Instant::now() < deadline, "never: {what}");
        b.step();
        std::thread::sleep(Duration::from_micros(5));
    }
}

fn parked(b: &Bench) -> u64 {
    b.stats[0].parked.load(Relaxed)
}

fn visits(b: &Bench, i: usize) -> u64 {
    b.rxq_stats[i].visits.load(Relaxed)
}

#[test]
fn an_idle_queue_is_parked_and_its_kick_brings_it_back() {
    let mut b = parking_bench(2);
    step_until(&mut b, "both queues parked", |b| parked(b) == 2);
    // Parked: the thread goes on iterating, but visits neither queue.
    let before = (visits(&b, 0), visits(&b, 1));
    for _ in 0..200 {
        b.step();
    }
    assert_eq!((visits(&b, 0), visits(&b, 1)), before, "a parked queue was visited");
    assert_eq!(b.rxq_stats[0].parks.load(Relaxed), 1);
    // A frame from vm0: its driver sees kicks asked for and kicks; the next check polls the
    // queue again and the frame arrives.
    b.vms[0].guest.send(&frame(mac(1), mac(0), 64, 7));
    let mut got = Vec::new();
    step_until(&mut b, "vm1 receives vm0's frame", |b| {
        got.extend(b.vms[1].recv());
        !got.is_empty()
    });
    assert_eq!(got, vec![frame(mac(1), mac(0), 64, 7)]);
    let l = &b.stats[0].loops;
    assert!(l.unparks_kick.load(Relaxed) >= 1, "brought back by its kick");
    assert_eq!(l.unparks_sweep.load(Relaxed), 0, "not by the sweep: it kicked");
    assert_eq!(b.rxq_stats[0].unparks.load(Relaxed), 1);
    // Idle again, parked again.
    step_until(&mut b, "vm0 parked again", |b| parked(b) == 2);
}

/// The race parking must not lose: a frame made available while the queue was polled with
/// kicks suppressed (its driver did not kick), not yet seen when the queue is parked. Parking
/// asks for kicks, then reads the avail index again: the frame is found and the queue stays
/// polled, its kicks suppressed again. Without the frame, it parks.
#[test]
fn a_frame_that_beats_the_parking_is_found() {
    let mut b = parking_bench(2);
    b.vms[0].guest.never_kick_tx();
    b.vms[0].guest.send(&frame(mac(1), mac(0), 64, 1));
    let t = &mut b.threads[0];
    let kicks = t.kicks.as_mut().unwrap();
    let i = t.rxqs.iter().position(|r| r.spec.port.id == 0).unwrap();
    assert!(!crate::datapath::thread::park_queue(&mut t.rxqs[i], kicks, &t.cx.stats), "parked over a frame");
    assert!(t.rxqs[i].state.parked.is_none());
    // The frame goes out on the next visit; then the empty queue parks.
    let mut got = Vec::new();
    step_until(&mut b, "the frame is delivered", |b| {
        got.extend(b.vms[1].recv());
        !got.is_empty()
    });
    let t = &mut b.threads[0];
    let kicks = t.kicks.as_mut().unwrap();
    let i = t.rxqs.iter().position(|r| r.spec.port.id == 0).unwrap();
    if t.rxqs[i].state.parked.is_none() {
        assert!(crate::datapath::thread::park_queue(&mut t.rxqs[i], kicks, &t.cx.stats), "an empty queue did not park");
    }
}

/// Frames sent at every moment around parking: each arrives, none twice.
#[test]
fn no_frame_is_lost_around_parking() {
    let mut b = parking_bench(2);
    let mut want = Vec::new();
    let mut got = Vec::new();
    for round in 0..200u32 {
        let f = frame(mac(1), mac(0), 64, round);
        b.vms[0].guest.send(&f);
        want.push(f);
        // A varying idle time: the next frame lands before, during or after parking.
        for _ in 0..round % 13 {
            b.step();
            std::thread::sleep(Duration::from_micros((round % 5) as u64));
        }
        got.extend(b.vms[1].recv());
    }
    step_until(&mut b, "every frame delivered", |b| {
        got.extend(b.vms[1].recv());
        got.len() >= want.len()
    });
    assert_eq!(got, want, "frames lost, repeated or reordered around parking");
    assert!(b.rxq_stats[0].parks.load(Relaxed) > 10, "the queue hardly parked: the test tests nothing");
}

#[test]
fn a_driver_that_never_kicks_is_served_by_the_sweep() {
    let mut b = parking_bench(2);
    b.vms[0].guest.never_kick_tx();
    step_until(&mut b, "both queues parked", |b| parked(b) == 2);
    b.vms[0].guest.send(&frame(mac(1), mac(0), 64, 1));
    let mut got = Vec::new();
    step_until(&mut b, "the sweep finds vm0's frame", |b| {
        got.extend(b.vms[1].recv());
        !got.is_empty()
    });
    assert_eq!(got.len(), 1);
    assert!(b.stats[0].loops.unparks_sweep.load(Relaxed) >= 1, "found by the sweep");
}

#[test]
fn a_ring_restarted_while_parked_is_polled_again_after_the_control_wake_up() {
    let mut b = parking_bench(2);
    step_until(&mut b, "both queues parked", |b| parked(b) == 2);
    // The frontend sets vm0's TX ring up again (a new kick fd, the ring restarted with kicks
    // suppressed): the control thread wakes the owner, which polls the queue again.
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: dup of an eventfd the guest owns; the new fd is owned by the File.
    let kick = unsafe { std::fs::File::from_raw_fd(libc::dup(b.vms[0].guest.kick(1).as_raw_fd())) };
    b.vms[0].backend.set_vring_kick(1, Some(kick)).unwrap();
    b.mailboxes[0].wake();
    step_until(&mut b, "vm0 polled again", |b| parked(b) < 2);
    assert!(b.stats[0].loops.unparks_control.load(Relaxed) >= 1);
    b.vms[0].guest.send(&frame(mac(1), mac(0), 64, 3));
    let mut got = Vec::new();
    step_until(&mut b, "vm1 receives", |b| {
        got.extend(b.vms[1].recv());
        !got.is_empty()
    });
}

#[test]
fn parking_off_polls_every_queue_every_iteration() {
    let mut b = Bench::new(BenchCfg { vms: 2, park_after_us: 0, ..Default::default() });
    for _ in 0..2000 {
        b.step();
    }
    assert_eq!(parked(&b), 0);
    assert!(visits(&b, 0) >= 2000 && visits(&b, 1) >= 2000);
}

/// A hostile guest that kicks without end while its queue is parked (and sends nothing) costs
/// its thread one event a check, not one a kick: two VMs beside it keep forwarding every frame.
#[test]
fn a_guest_kicking_without_end_costs_one_event_a_check() {
    use std::os::fd::AsRawFd;
    let mut b = parking_bench(3);
    step_until(&mut b, "every queue parked", |b| parked(b) == 3);
    let kick = b.vms[0].guest.kick(1).as_raw_fd();
    let one = 1u64.to_ne_bytes();
    let mut got = Vec::new();
    for round in 0..200u32 {
        for _ in 0..500 {
            // SAFETY: an 8-byte write from a local buffer to the test guest's own eventfd.
            unsafe { libc::write(kick, one.as_ptr() as *const libc::c_void, 8) };
        }
        b.vms[1].guest.send(&frame(mac(2), mac(1), 64, round));
        step_until(&mut b, "vm2 receives vm1's frame", |b| {
            got.extend(b.vms[2].recv());
            got.len() > round as usize
        });
    }
    assert_eq!(got.len(), 200, "the bystanders lost frames");
    let l = &b.stats[0].loops;
    let (kicks, checks) = (l.unparks_kick.load(Relaxed), l.park_checks.load(Relaxed));
    // 100,000 kicks: each brings vm0 back at most once a check (and vm1's own, once a frame).
    assert!(kicks <= checks + 200, "{kicks} unparks by kick over {checks} checks");
}
