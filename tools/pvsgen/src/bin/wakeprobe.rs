//! wakeprobe: how long this machine takes to wake a thread blocked in epoll on an eventfd, the
//! same kernel path an adaptive poll thread sleeps on, with no switch involved.
//!
//! A sleeper thread pinned to one CPU blocks in `epoll_wait` on an eventfd (edge-triggered, as
//! pvswitchd's sleeper does); a kicker pinned to another CPU waits `--gap-us`, notes the time,
//! writes the eventfd and spins until the sleeper reports it is running again. Prints one JSON
//! line: wake-up latency percentiles (kick to running) and the cost of the `write` itself.
//!
//! Usage: wakeprobe [--kicker-cpu 0] [--sleeper-cpu 1] [--gap-us 5000] [--samples 400]

use pvsgen::engine::{now_ns, pin_to};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

fn main() {
    let (mut kicker_cpu, mut sleeper_cpu, mut gap_us, mut samples) = (0usize, 1usize, 5000u64, 400usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().and_then(|v| v.parse::<u64>().ok());
        match (a.as_str(), v) {
            ("--kicker-cpu", Some(v)) => kicker_cpu = v as usize,
            ("--sleeper-cpu", Some(v)) => sleeper_cpu = v as usize,
            ("--gap-us", Some(v)) => gap_us = v,
            ("--samples", Some(v)) if v > 0 => samples = v as usize,
            _ => {
                eprintln!("usage: wakeprobe [--kicker-cpu N] [--sleeper-cpu N] [--gap-us US] [--samples N]");
                std::process::exit(2);
            }
        }
    }
    // SAFETY: plain syscalls creating descriptors this process owns; results are checked.
    let (efd, ep) = unsafe { (libc::eventfd(0, libc::EFD_NONBLOCK), libc::epoll_create1(0)) };
    assert!(efd >= 0 && ep >= 0, "eventfd/epoll_create1: {}", std::io::Error::last_os_error());
    let mut ev = libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLET) as u32, u64: 0 };
    // SAFETY: both descriptors are open; `ev` is a valid epoll_event.
    let rc = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, efd, &mut ev) };
    assert_eq!(rc, 0, "epoll_ctl: {}", std::io::Error::last_os_error());

    // `kicked` is set before the write; the sleeper clears it and stores its wake time in `woke`.
    let (kicked, woke, stop) =
        (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let sleeper = {
        let (kicked, woke, stop) = (kicked.clone(), woke.clone(), stop.clone());
        std::thread::spawn(move || {
            pin_to(sleeper_cpu).expect("pin sleeper");
            let mut events = [libc::epoll_event { events: 0, u64: 0 }; 4];
            while !stop.load(Ordering::Acquire) {
                if !kicked.swap(false, Ordering::AcqRel) {
                    // SAFETY: `ep` is open for the whole run; `events` holds 4 entries.
                    unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), 4, 100) };
                    continue;
                }
                woke.store(now_ns(), Ordering::Release);
            }
        })
    };
    pin_to(kicker_cpu).expect("pin kicker");
    let (mut wake, mut write) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    for _ in 0..samples {
        let t = now_ns();
        while now_ns() - t < gap_us * 1000 {
            std::hint::spin_loop();
        }
        woke.store(0, Ordering::Release);
        let t0 = now_ns();
        kicked.store(true, Ordering::Release);
        let one = 1u64;
        // SAFETY: an 8-byte write from a local to the eventfd we own.
        unsafe { libc::write(efd, (&one as *const u64).cast(), 8) };
        let t1 = now_ns();
        let w = loop {
            match woke.load(Ordering::Acquire) {
                0 => std::hint::spin_loop(),
                w => break w,
            }
        };
        wake.push(w.saturating_sub(t0));
        write.push(t1 - t0);
    }
    stop.store(true, Ordering::Release);
    sleeper.join().unwrap();
    wake.sort_unstable();
    write.sort_unstable();
    let pct = |v: &[u64], p: f64| v[((v.len() - 1) as f64 * p) as usize];
    println!(
        "{{\"gap_us\":{gap_us},\"samples\":{samples},\"wake_p50_ns\":{},\"wake_p99_ns\":{},\"write_p50_ns\":{}}}",
        pct(&wake, 0.5),
        pct(&wake, 0.99),
        pct(&write, 0.5)
    );
}
