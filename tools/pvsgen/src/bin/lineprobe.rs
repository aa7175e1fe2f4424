//! lineprobe: how long one cache line takes to travel between two CPUs right now.
//!
//! Two threads, pinned to `--cpus A,B`, bounce a counter in one cache line: each waits for the
//! other's increment and answers with its own. Prints one JSON line with the one-way transfer
//! time. On this project's development machine (a VM) the answer is bimodal, about 20 ns or
//! about 180 ns, depending on where the host runs the two vCPUs; the VM-to-VM benchmark
//! records it beside every measurement.
//!
//! Usage: lineprobe [--cpus 0,1] [--rounds 200000]

use pvsgen::engine::{now_ns, pin_to};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[repr(align(128))]
struct Line(AtomicU64);

fn main() {
    let (mut cpus, mut rounds) = ((0usize, 1usize), 200_000u64);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_default();
        match a.as_str() {
            "--cpus" => {
                let p: Vec<usize> = v.split(',').filter_map(|c| c.parse().ok()).collect();
                if p.len() != 2 {
                    usage();
                }
                cpus = (p[0], p[1]);
            }
            "--rounds" => rounds = v.parse().ok().filter(|&r| r > 0).unwrap_or_else(|| usage()),
            _ => usage(),
        }
    }
    let line = Arc::new(Line(AtomicU64::new(0)));
    let peer = {
        let line = line.clone();
        std::thread::spawn(move || {
            pin_to(cpus.1).expect("pin peer");
            for i in 0..rounds {
                while line.0.load(Ordering::Acquire) != 2 * i + 1 {
                    std::hint::spin_loop();
                }
                line.0.store(2 * i + 2, Ordering::Release);
            }
        })
    };
    pin_to(cpus.0).expect("pin");
    let t0 = now_ns();
    for i in 0..rounds {
        line.0.store(2 * i + 1, Ordering::Release);
        while line.0.load(Ordering::Acquire) != 2 * i + 2 {
            std::hint::spin_loop();
        }
    }
    let ns = (now_ns() - t0) as f64 / rounds as f64 / 2.0;
    peer.join().unwrap();
    println!("{{\"cpus\":[{},{}],\"rounds\":{rounds},\"one_way_ns\":{ns:.1}}}", cpus.0, cpus.1);
}

fn usage() -> ! {
    eprintln!("usage: lineprobe [--cpus A,B] [--rounds N]");
    std::process::exit(2);
}
