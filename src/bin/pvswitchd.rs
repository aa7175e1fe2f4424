//! pvswitchd: the switch daemon.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use log::{error, info};
use pvswitch::config::Config;
use pvswitch::control::Control;
use pvswitch::control::os::SignalFd;
use pvswitch::datapath::Ctx;
use pvswitch::datapath::mac_table::MacTable;
use pvswitch::datapath::mailbox::ThreadStart;
use pvswitch::datapath::thread::PollThread;
use pvswitch::switch::Switch;

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
        Ok(c) => {
            for e in &c.dropin_errors {
                eprintln!("pvswitchd: {e}\npvswitchd: that port is not started; the others are");
            }
            c
        }
        Err(e) => {
            eprintln!("pvswitchd: {e}");
            return ExitCode::from(2);
        }
    };
    if check_only {
        println!("{}: ok ({} ports, {} flows)", config.display(), cfg.ports.len(), cfg.flows.len());
        return ExitCode::SUCCESS;
    }
    match run(cfg, config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// Raises the soft limit on open files to the hard limit: every vhost-user port costs several
/// (its socket, kick and call eventfds per ring, memory files until mapped), and a service
/// manager may start us with 1024.
fn raise_fd_limit() {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            let old = r.rlim_cur;
            r.rlim_cur = r.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) == 0 {
                info!("open files: limit raised from {old} to {}", r.rlim_max);
            }
        }
    }
}

/// The daemon's start-up in order: the control socket (a second daemon stops here), signals,
/// the EAL and ports, the switch model and its placement, poll threads pinned to their cores,
/// the control loop, and the orderly stop. Long because it is that sequence, read top to
/// bottom; each step is a call into the library.
fn run(cfg: Config, config_path: PathBuf) -> std::io::Result<()> {
    raise_fd_limit();
    // First: a second pvswitchd on the same configuration stops here, before it touches a
    // NIC or a socket of the running one.
    let ctl = pvswitch::control::bind_control(&cfg.control_socket, cfg.control_socket_mode)?;
    // The watchdog's signal for a poll thread stuck in a guest's call eventfd write.
    pvswitch::vring::call::install_interrupt_handler()?;
    // Block signals before spawning threads so only the control thread's signalfd sees them.
    let signals = SignalFd::block_signals()?;
    // The calling thread's CPU set, read before any thread is pinned.
    let online = core_affinity::get_core_ids().unwrap_or_default();
    // DPDK starts only if a dpdk port is configured, before the poll threads; EAL pins this
    // (control) thread to the CPUs that are not poll cores. A failure leaves the dpdk ports
    // "failed" and the switch runs on.
    let nic = pvswitch::port::nic::wanted(&cfg);
    if nic {
        let mut control_cpus: Vec<usize> =
            online.iter().map(|c| c.id).filter(|c| !cfg.poll_cores.contains(c)).collect();
        if control_cpus.is_empty() {
            control_cpus = online.iter().map(|c| c.id).collect();
        }
        if let Err(e) = pvswitch::port::nic::init(&cfg, &control_cpus) {
            error!("dpdk: {e}; dpdk ports will not start");
        }
    }
    // 16384 buckets of 8: 1 MiB, 131072 entries; each port learns at most its `mac_limit`.
    let mac = Arc::new(MacTable::new(16384, pvswitch::config::MAX_PORTS, pvswitch::config::DEFAULT_MAC_LIMIT));
    let shutdown = Arc::new(AtomicBool::new(false));
    // The control thread opens every port and decides the initial placement (round robin).
    let sw = Switch::new(cfg, Some(config_path), mac.clone()).map_err(std::io::Error::other)?;
    let mut control = Control::new(sw, ctl, signals)?;

    // How a poll thread starts: now, and when a reload adds a poll core.
    let spawner = {
        let shutdown = shutdown.clone();
        move |t: ThreadStart| -> std::io::Result<std::thread::JoinHandle<()>> {
            let mode = match t.sleep_after_us {
                Some(us) => format!("adaptive, sleeps after {us} us idle"),
                None => "busy polling".into(),
            };
            info!(
                "poll thread {}: core {}, NUMA node {:?}, {} queues, {mode}",
                t.index,
                t.core,
                t.stats.numa_node,
                t.plan.rxqs.len()
            );
            let tuning = t.plan.tuning.expect("the switch's plans say how to poll");
            let cx = Ctx {
                index: t.index,
                mac: mac.clone(),
                stats: t.stats,
                burst: tuning.burst,
                retry_cycles: tuning.retry_cycles,
                shutdown: shutdown.clone(),
                mailbox: t.mailbox,
                sleep_after_us: tuning.sleep_after_us,
                nic_poll_interval_us: tuning.nic_poll_interval_us,
                nic_poll_max_us: tuning.nic_poll_max_us,
                park_after_us: tuning.park_after_us,
                park_check_us: tuning.park_check_us,
            };
            let pinned = online.iter().find(|c| c.id == t.core).copied();
            if pinned.is_none() {
                log::warn!("poll core {} is not in this process's CPU set; thread {} runs unpinned", t.core, t.index);
            }
            let plan = t.plan;
            std::thread::Builder::new().name(format!("pmd{}", t.index)).spawn(move || {
                if let Some(c) = pinned {
                    core_affinity::set_for_current(c);
                }
                if nic {
                    pvswitch::port::nic::thread_register();
                }
                PollThread::new(cx, plan).run();
            })
        }
    };
    control.sw.spawner = Some(Box::new(spawner));
    control.sw.start_threads()?;
    control.ready();
    control.run();
    shutdown.store(true, std::sync::atomic::Ordering::Relaxed);
    control.sw.stop_threads();
    drop(control);
    Ok(())
}
