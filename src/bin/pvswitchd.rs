//! pvswitchd: the switch daemon.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use log::{error, info};
use pvswitch::config::Config;
use pvswitch::control::{Control, block_signals};
use pvswitch::mac_table::MacTable;
use pvswitch::pmd::{Ctx, PollThread, Rxq};
use pvswitch::port::Port;
use pvswitch::stats::{ThreadStats, cycles_per_sec};
use pvswitch::topology::Numa;

const USAGE: &str = "usage: pvswitchd [--config FILE] | --check FILE | --version";

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut config = PathBuf::from("conf/pvswitch.toml");
    let mut check_only = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--config" | "-c" | "--check" => {
                check_only |= a == "--check";
                match it.next() {
                    Some(p) => config = PathBuf::from(p),
                    None => {
                        eprintln!("{USAGE}");
                        return ExitCode::from(2);
                    }
                }
            }
            "--version" => {
                println!("pvswitchd {}", env!("CARGO_PKG_VERSION"));
                return ExitCode::SUCCESS;
            }
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let cfg = match Config::load(&config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pvswitchd: {e}");
            return ExitCode::from(2);
        }
    };
    if check_only {
        println!("{}: ok ({} ports)", config.display(), cfg.ports.len());
        return ExitCode::SUCCESS;
    }
    match run(cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cfg: Config) -> std::io::Result<()> {
    // Block signals before spawning threads so only the control thread's signalfd sees them.
    let signal_fd = block_signals()?;
    let numa = Numa::discover();
    let online = core_affinity::get_core_ids().unwrap_or_default();
    let ports: Vec<Arc<Port>> =
        cfg.ports.iter().enumerate().map(|(i, p)| Arc::new(Port::new(i as u16, p.clone()))).collect();
    let port_table: Arc<[Arc<Port>]> = ports.clone().into();
    let mac = Arc::new(MacTable::new(4096));
    let shutdown = Arc::new(AtomicBool::new(false));

    // Initial placement: receive queues round robin over the poll threads.
    let nthreads = cfg.poll_cores.len();
    let mut assignment: Vec<Vec<Rxq>> = (0..nthreads).map(|_| Vec::new()).collect();
    let mut n = 0;
    for p in &ports {
        for q in 0..p.queue_pairs() {
            assignment[n % nthreads].push(Rxq::new(p.clone(), q));
            n += 1;
        }
    }
    let thread_queues = assignment.iter().map(|a| a.iter().map(|r| (r.port.id, r.qpair)).collect()).collect();

    let mut stats = Vec::new();
    let mut handles = Vec::new();
    for (i, (&core, rxqs)) in cfg.poll_cores.iter().zip(assignment).enumerate() {
        let node = numa.node_of_cpu(core);
        let st = Arc::new(ThreadStats::new(core, node, ports.len()));
        stats.push(st.clone());
        let cx = Ctx {
            index: i,
            ports: port_table.clone(),
            mac: mac.clone(),
            stats: st,
            weight_packets: cfg.weight_packets,
            weight_bytes: cfg.weight_bytes,
            burst: cfg.burst,
            retry_cycles: cfg.rx_retry_us as u64 * cycles_per_sec() / 1_000_000,
            shutdown: shutdown.clone(),
        };
        let pinned = online.iter().find(|c| c.id == core).copied();
        if pinned.is_none() {
            log::warn!("poll core {core} is not in this process's CPU set; thread {i} runs unpinned");
        }
        info!("poll thread {i}: core {core}, NUMA node {node:?}, {} queues", rxqs.len());
        let h = std::thread::Builder::new().name(format!("pmd{i}")).spawn(move || {
            if let Some(c) = pinned {
                core_affinity::set_for_current(c);
            }
            PollThread::new(cx, rxqs).run();
        })?;
        handles.push(h);
    }

    let result = Control::new(cfg, &ports, stats, thread_queues, mac, signal_fd).map(|mut c| c.run());
    shutdown.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    result
}
