//! DPDK ports (physical NICs and DPDK vdevs) as switch ports.
//!
//! A NIC receive queue is another kind of receive queue in a poll thread's plan (the data
//! path visits it with the same deficit round robin budget as a guest's TX queue); a NIC is
//! another destination in delivery. This module holds the port side of that, on top of the
//! safe DPDK wrapper (`port::dpdk`); the poll thread's own NIC state is `datapath::rx::nic` and `datapath::tx::nic`:
//!
//! - EAL start-up from the configuration (`init`), once, only if a dpdk port is configured;
//! - one mbuf pool per NUMA socket used (`pool_for`);
//! - `NicPort`: one open ethdev port with its pool.
//!
//! Without the cargo feature `dpdk` the same names exist but no `NicPort` can be built (the
//! type is empty), so the data path compiles unchanged and the NIC arms are unreachable.
#![forbid(unsafe_code)]

use crate::config::Config;

pub use super::nic_info::{NicInfo, NicOffloads, NicStats, RxInterrupt};
#[cfg(feature = "dpdk")]
pub use imp::*;
#[cfg(not(feature = "dpdk"))]
pub use stub::*;

/// Whether the configuration has a dpdk port.
pub fn wanted(cfg: &Config) -> bool {
    cfg.ports.iter().any(|p| p.dpdk().is_some())
}

#[cfg(feature = "dpdk")]
mod imp {
    use std::sync::Mutex;

    use super::{NicInfo, NicOffloads, RxInterrupt};
    use crate::config::{Config, DpdkConfig, DpdkPortConfig};
    use crate::port::dpdk::{self, DEFAULT_DATA_ROOM, Eal, EthPort, MbufBurst, Mempool, PKTMBUF_HEADROOM, PortSetup};
    use crate::wire::virtio_net::Negotiated;

    /// Why the EAL did not start, if it did not (every dpdk port then fails with it).
    static EAL_ERROR: Mutex<Option<String>> = Mutex::new(None);
    /// Pools by NUMA socket (None: unknown), and the data room and size they are made with.
    static POOLS: Mutex<Vec<(Option<u32>, Mempool)>> = Mutex::new(Vec::new());
    static POOL_SHAPE: Mutex<(u16, u32)> = Mutex::new((DEFAULT_DATA_ROOM, crate::config::DEFAULT_MBUFS));

    fn hugepages_usable() -> bool {
        crate::port::dpdk::hugepages_free_kb() >= 256 * 1024
    }

    fn is_pci(device: &str) -> bool {
        let name = device.split(',').next().unwrap_or("");
        !name.starts_with("net_") && name.contains(':') && name.contains('.')
    }

    /// The EAL arguments for `cfg`: `[dpdk] eal_args` or the defaults (`--in-memory` with
    /// hugepages, else `--no-huge -m 512`), plus `--no-pci` unless a PCI device is configured,
    /// `--file-prefix=pvswitch-<pid>`, and `--lcores=0@(control_cpus)` so that EAL pins the
    /// main (control) thread off the poll cores, unless the arguments choose lcores themselves.
    pub fn eal_args(cfg: &Config, control_cpus: &[usize]) -> Vec<String> {
        let mut a = vec!["pvswitchd".to_string()];
        let user = cfg.dpdk.eal_args.clone();
        let has = |flag: &str| user.iter().flatten().any(|x| x == flag || x.starts_with(&format!("{flag}=")));
        match &user {
            Some(u) => a.extend(u.iter().cloned()),
            None if hugepages_usable() => a.push("--in-memory".into()),
            None => a.extend(["--no-huge", "-m", "512", "--no-shconf"].map(String::from)),
        }
        if !cfg.ports.iter().filter_map(|p| p.dpdk()).any(|d| is_pci(&d.device))
            && !has("--no-pci")
            && !has("-a")
            && !has("--allow")
        {
            a.push("--no-pci".into());
        }
        if !has("--file-prefix") {
            a.push(format!("--file-prefix=pvswitch-{}", std::process::id()));
        }
        if !has("-l") && !has("--lcores") && !has("-c") && !control_cpus.is_empty() {
            let cpus: Vec<String> = control_cpus.iter().map(|c| c.to_string()).collect();
            a.push(format!("--lcores=0@({})", cpus.join(",")));
        }
        if !has("--log-level") {
            a.push("--log-level=*:notice".into());
        }
        a
    }

    /// Starts the EAL if a dpdk port is configured. Call from the main thread before the poll
    /// threads start (EAL pins the calling thread to `control_cpus`). A failure is returned
    /// and remembered: every dpdk port then fails to open with it, and the switch runs on.
    pub fn init(cfg: &Config, control_cpus: &[usize]) -> Result<(), String> {
        if !super::wanted(cfg) {
            return Ok(());
        }
        let max_mtu = cfg.ports.iter().filter(|p| p.dpdk().is_some()).map(|p| p.mtu).max().unwrap_or(1500);
        let room = (max_mtu + 18 + PKTMBUF_HEADROOM as u32).clamp(DEFAULT_DATA_ROOM as u32, u16::MAX as u32);
        *POOL_SHAPE.lock().unwrap() = (room as u16, cfg.dpdk.mbufs);
        let args = eal_args(cfg, control_cpus);
        log::info!("dpdk: starting EAL: {}", args[1..].join(" "));
        match Eal::init(&args) {
            Ok(_) => Ok(()),
            Err(e) => {
                *EAL_ERROR.lock().unwrap() = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Makes the calling poll thread a DPDK lcore (mempool cache), if the EAL runs.
    pub fn thread_register() {
        if Eal::get().is_some()
            && let Err(e) = dpdk::thread_register()
        {
            log::warn!("{e}; this thread's mbuf allocations bypass the per-lcore cache");
        }
    }

    /// The pool for NUMA `socket`, created on first use.
    fn pool_for(socket: Option<u32>) -> Result<Mempool, String> {
        let mut pools = POOLS.lock().unwrap();
        if let Some((_, p)) = pools.iter().find(|(s, _)| *s == socket) {
            return Ok(*p);
        }
        let (room, n) = *POOL_SHAPE.lock().unwrap();
        let name = match socket {
            Some(s) => format!("pvs_mbufs_s{s}"),
            None => "pvs_mbufs_any".to_string(),
        };
        let p = Mempool::new(&name, n, 256, room, socket)?;
        log::info!("dpdk: mempool {name}: {n} mbufs of {room} bytes");
        pools.push((socket, p));
        Ok(p)
    }

    /// An open, started DPDK port and the pool its mbufs come from.
    pub struct NicPort {
        pub device: String,
        eth: EthPort,
        pool: Mempool,
        takes: Negotiated,
        /// Longest segment (Ethernet header included) the device makes of a TSO frame.
        max_segment: u32,
        /// The device's MAC address (what a VTEP on it sends from).
        mac: crate::wire::MacAddr,
    }

    impl NicPort {
        /// Opens `cfg.device` with its queues on the device's NUMA socket. `threads` poll
        /// threads will send to it: by default it gets one TX queue each (as many as the
        /// driver allows), so that no two threads share one.
        pub fn open(cfg: &DpdkPortConfig, mtu: u32, threads: usize, _dc: &DpdkConfig) -> Result<NicPort, String> {
            if Eal::get().is_none() {
                let why = EAL_ERROR.lock().unwrap().clone().unwrap_or_else(|| {
                    "it starts only with pvswitchd, when a dpdk port is configured then: restart pvswitchd to add the first".into()
                });
                return Err(format!("dpdk port {}: DPDK did not start: {why}", cfg.device));
            }
            let mut pool = None;
            let eth = EthPort::open_with(&cfg.device, |dev| {
                let txqs = match cfg.tx_queues {
                    Some(n) => n,
                    // net_tap pairs each TX queue with an RX queue (its configure refuses
                    // other counts): threads beyond them share TX queues.
                    None if dev.driver == "net_tap" => cfg.rx_queues,
                    None => (threads.max(1) as u16).min(dev.max_tx_queues.max(1)),
                };
                let p = pool_for(dev.socket)?;
                pool = Some(p);
                let mtu = (mtu != 1500).then_some(mtu as u16);
                let setup = PortSetup {
                    rxqs: cfg.rx_queues,
                    txqs,
                    rx_ring: cfg.rx_ring,
                    tx_ring: cfg.tx_ring,
                    mtu,
                    offloads: cfg.offloads,
                };
                Ok((setup, p))
            })?;
            let pool = pool.expect("open_with chose a pool");
            log::info!(
                "dpdk port {}: driver {}, {} rx / {} tx queues, rings {:?}, NUMA socket {:?}",
                eth.name(),
                eth.driver(),
                eth.rx_queues(),
                eth.tx_queues(),
                eth.ring_sizes(),
                eth.socket_id()
            );
            let hw = eth.offloads();
            // net_tap segments with DPDK's GSO library, which cuts TCP over IPv4 only, and
            // refuses segments longer than its MTU counting the Ethernet header (DPDK 22.11).
            let tap = eth.driver() == "net_tap";
            let tso6 = hw.tx_tso && !tap;
            let takes = Negotiated { csum: hw.tx_csum, tso4: hw.tx_tso, tso6, ecn: false };
            let mtu = eth.mtu().map_or(1500, u32::from);
            let max_segment = if tap { mtu } else { mtu + 14 + 8 };
            if tap && hw.tx_tso {
                log::info!(
                    "dpdk port {}: net_tap counts the Ethernet header against its MTU ({mtu}) when it segments: \
                     TSO frames whose segments would be longer are segmented in software",
                    eth.name()
                );
            }
            let mac = eth.mac_addr().unwrap_or(crate::wire::MacAddr::ZERO);
            Ok(NicPort { device: cfg.device.clone(), eth, pool, takes, max_segment, mac })
        }

        /// The device's MAC address.
        #[inline]
        pub fn mac(&self) -> crate::wire::MacAddr {
            self.mac
        }

        /// Whether the device can cut TSO frame `o` (if it is one) into segments it sends.
        #[inline]
        pub fn segments_fit(&self, o: &crate::wire::gso::Offload) -> bool {
            o.tso.is_none_or(|t| t.hdr_len as u32 + t.mss as u32 <= self.max_segment)
        }

        /// The offloads the device does for frames sent to it (as a receiving guest's
        /// `Negotiated`): what it takes as it is, checksums and segmentation left to it.
        #[inline]
        pub fn takes(&self) -> Negotiated {
            self.takes
        }

        /// Whether the device verifies received TCP/UDP checksums.
        pub fn verifies_checksums(&self) -> bool {
            self.eth.offloads().rx_csum
        }

        /// Most segments one frame sent to the device may have.
        pub fn max_segs(&self) -> u16 {
            self.eth.offloads().max_segs
        }

        pub fn rx_queues(&self) -> usize {
            self.eth.rx_queues() as usize
        }

        pub fn socket_id(&self) -> Option<u32> {
            self.eth.socket_id()
        }

        /// Receive queue `q`'s interrupt, if the driver has one: an idle poll thread sleeps on it.
        #[inline]
        pub fn rx_interrupt(&self, q: usize) -> Option<&RxInterrupt> {
            self.eth.rx_interrupt(q as u16)
        }

        /// Arms (before its poller sleeps) or disarms queue `q`'s interrupt where it
        /// `needs_arming`; a no-op for the others.
        pub fn arm_rx_interrupt(&self, q: usize, on: bool) {
            self.eth.arm_rx_interrupt(q as u16, on)
        }

        /// Receives up to `max` frames from queue `q` into `burst` (which must be empty). None
        /// if another thread holds the queue (a plan change in flight).
        #[inline]
        pub fn rx(&self, q: usize, burst: &mut MbufBurst, max: usize) -> Option<usize> {
            let mut h = self.eth.try_rx_queue(q as u16)?;
            Some(h.rx_max(burst, max))
        }

        /// The pool transmit mbufs for this port come from.
        pub(crate) fn pool(&self) -> &Mempool {
            &self.pool
        }

        /// Sends `burst` on the TX queue of poll thread `thread` with one tx_burst; returns
        /// how many the driver took, and how many it refused in `tx_prepare` (run first when
        /// `offloaded`: some frame asks for device offloads), with their bytes. Unsent mbufs stay in `burst`.
        #[inline]
        pub(crate) fn send(&self, thread: usize, burst: &mut MbufBurst, offloaded: bool) -> (usize, (usize, u64)) {
            let q = (thread % self.eth.tx_queues() as usize) as u16;
            // With fewer TX queues than threads two threads may share one: the holder only
            // runs one tx_burst, so spin.
            loop {
                if let Some(mut h) = self.eth.try_tx_queue(q) {
                    let refused = if offloaded { h.prepare(burst) } else { (0, 0) };
                    return (h.tx(burst), refused);
                }
                std::hint::spin_loop();
            }
        }

        /// What `pvswitchctl ports` shows of the device: driver, queues, NUMA node, and
        /// DPDK's own counters.
        pub fn info(&self) -> NicInfo {
            let (rx_ring, tx_ring) = self.eth.ring_sizes();
            NicInfo {
                device: self.device.clone(),
                ethdev: self.eth.name().to_string(),
                port_id: self.eth.port_id(),
                driver: self.eth.driver().to_string(),
                rx_queues: self.eth.rx_queues(),
                tx_queues: self.eth.tx_queues(),
                rx_ring,
                tx_ring,
                socket_id: self.eth.socket_id(),
                mtu: self.eth.mtu(),
                offloads: NicOffloads {
                    tx_checksum: self.takes.csum,
                    tx_tso4: self.takes.tso4,
                    tx_tso6: self.takes.tso6,
                    rx_checksum: self.verifies_checksums(),
                },
                mac: self.eth.mac_addr().ok().map(|m| m.to_string()),
                notes: self.eth.notes().to_vec(),
                mbufs_free: self.pool.available(),
                stats: self.eth.stats().ok(),
            }
        }
    }
}

#[cfg(not(feature = "dpdk"))]
mod stub {
    use super::NicInfo;
    use crate::config::{Config, DpdkConfig, DpdkPortConfig};

    pub fn init(_cfg: &Config, _control_cpus: &[usize]) -> Result<(), String> {
        Ok(())
    }

    pub fn thread_register() {}

    /// No DPDK: no value of this type exists (config rejects dpdk ports).
    pub enum NicPort {}

    impl NicPort {
        pub fn open(cfg: &DpdkPortConfig, _: u32, _: usize, _: &DpdkConfig) -> Result<NicPort, String> {
            Err(format!("dpdk port {}: this pvswitchd was built without DPDK support", cfg.device))
        }
        pub fn rx_queues(&self) -> usize {
            match *self {}
        }
        pub fn socket_id(&self) -> Option<u32> {
            match *self {}
        }
        pub fn rx_interrupt(&self, _: usize) -> Option<&super::RxInterrupt> {
            match *self {}
        }
        pub fn arm_rx_interrupt(&self, _: usize, _: bool) {
            match *self {}
        }
        pub fn info(&self) -> NicInfo {
            match *self {}
        }
        pub fn takes(&self) -> crate::wire::virtio_net::Negotiated {
            match *self {}
        }
        pub fn segments_fit(&self, _: &crate::wire::gso::Offload) -> bool {
            match *self {}
        }
        pub fn mac(&self) -> crate::wire::MacAddr {
            match *self {}
        }
    }
}
