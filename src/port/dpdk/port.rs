//! Ethdev ports: opening a device (PCI address or vdev), its queues, bursts and counters. See
//! the header of `dpdk/mod.rs` for the ownership and thread rules.

use super::*;
use dpdk_sys::offload as off;

use crate::port::nic_info::{NicStats, RxInterrupt};

/// How to set up a port.
#[derive(Clone, Debug)]
pub struct PortSetup {
    pub rxqs: u16,
    pub txqs: u16,
    /// Rx/Tx descriptors per queue (adjusted to the driver's limits).
    pub rx_ring: u16,
    pub tx_ring: u16,
    /// MTU to set; None keeps the driver's default (1500).
    pub mtu: Option<u16>,
    /// Turn on the checksum and TSO offloads of `HwOffloads` the device has.
    pub offloads: bool,
}

impl Default for PortSetup {
    fn default() -> Self {
        PortSetup { rxqs: 1, txqs: 1, rx_ring: 1024, tx_ring: 1024, mtu: None, offloads: false }
    }
}

/// The offloads a port was started with (those asked for that the device has).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HwOffloads {
    /// TX: IPv4 header, TCP and UDP checksums.
    pub tx_csum: bool,
    /// TX: TCP segmentation of multi-segment frames (with the checksums).
    pub tx_tso: bool,
    /// RX: TCP and UDP checksums verified (`Mbuf::rx_l4_checksum_good`).
    pub rx_csum: bool,
    /// Most segments the driver takes in one frame (`tx_desc_lim.nb_seg_max`).
    pub max_segs: u16,
}

impl HwOffloads {
    /// TX offload bits these need.
    const TX_CSUM: u64 = off::ETH_TX_OFFLOAD_IPV4_CKSUM | off::ETH_TX_OFFLOAD_TCP_CKSUM | off::ETH_TX_OFFLOAD_UDP_CKSUM;
    const TX_TSO: u64 = Self::TX_CSUM | off::ETH_TX_OFFLOAD_TCP_TSO | off::ETH_TX_OFFLOAD_MULTI_SEGS;
    const RX_CSUM: u64 = off::ETH_RX_OFFLOAD_TCP_CKSUM | off::ETH_RX_OFFLOAD_UDP_CKSUM;

    /// What to turn on of a device with these capabilities, and the TX/RX offload bits for
    /// `rte_eth_conf`.
    fn choose(info: &sys::rte_eth_dev_info) -> (HwOffloads, u64, u64) {
        let (tx, rx) = (info.tx_offload_capa, info.rx_offload_capa);
        let has = |capa: u64, bits: u64| capa & bits == bits;
        let hw = HwOffloads {
            tx_csum: has(tx, Self::TX_CSUM),
            tx_tso: has(tx, Self::TX_TSO),
            rx_csum: has(rx, Self::RX_CSUM),
            max_segs: match info.tx_desc_lim.nb_seg_max {
                0 => u16::MAX,
                n => n,
            },
        };
        let txo = if hw.tx_tso {
            Self::TX_TSO
        } else if hw.tx_csum {
            Self::TX_CSUM
        } else {
            0
        };
        let rxo = if hw.rx_csum { Self::RX_CSUM } else { 0 };
        (hw, txo, rxo)
    }
}

/// What a probed device is, for `EthPort::open_with` to choose its setup and pool.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// NUMA node of the device, None when unknown.
    pub socket: Option<u32>,
    pub max_rx_queues: u16,
    pub max_tx_queues: u16,
    pub driver: String,
}

/// Ethdev port ids this process has open (EthPort is the only owner of a port).
static OPEN_PORTS: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// An open, started ethdev port. See the header for the thread rules.
#[derive(Debug)]
pub struct EthPort {
    port_id: u16,
    name: String,
    driver: String,
    socket: Option<u32>,
    rxqs: u16,
    txqs: u16,
    rx_ring: u16,
    tx_ring: u16,
    mtu: Option<u16>,
    offloads: HwOffloads,
    notes: Vec<String>,
    device: *mut sys::rte_device,
    probed: bool,
    started: bool,
    rx_claimed: Box<[AtomicBool]>,
    tx_claimed: Box<[AtomicBool]>,
    /// Each Rx queue's receive interrupt, where the driver has one.
    rx_intr: Box<[Option<RxInterrupt>]>,
    _pool: Mempool,
}

/// Drivers known to have no receive interrupts (asking would only log DPDK errors).
const NO_RX_INTERRUPTS: &[&str] = &["net_af_packet", "net_null", "net_ring", "net_pcap"];

// SAFETY: control calls (stats, stop, close) are thread-safe in DPDK for a port that is not
// being reconfigured; the raw device pointer is only used in Drop. Queue access is exclusive
// through &mut self or the claimed per-queue handles.
unsafe impl Send for EthPort {}
// SAFETY: the &self methods are stats/info reads, which DPDK allows concurrently with bursts;
// burst access through &self goes through the atomic queue claims.
unsafe impl Sync for EthPort {}

impl EthPort {
    /// Opens `device` and starts it: a PCI address (`0000:03:00.0`, bound to vfio-pci or
    /// probed at EAL init) or a vdev with its arguments (`net_ring0`, `net_null0`,
    /// `net_af_packet0,iface=veth0`, `net_tap0,iface=x`, ...). A device EAL does not have yet
    /// is hot-plugged with `rte_dev_probe` and removed again on drop.
    pub fn open(device: &str, cfg: &PortSetup, pool: &Mempool) -> Result<EthPort, String> {
        if cfg.rxqs == 0 || cfg.txqs == 0 {
            let name = device.split(',').next().unwrap_or("").trim();
            return Err(format!("dpdk port {name}: needs at least one Rx and one Tx queue"));
        }
        Self::open_with(device, |_| Ok((cfg.clone(), *pool)))
    }

    /// As `open`, but the setup and the pool are chosen once the device is probed, from what
    /// it is (its NUMA socket and queue limits): `choose(&info)` returns them.
    ///
    /// Long because it is DPDK's bring-up sequence in the order ethdev requires (probe, info,
    /// then `bring_up`: configure, descriptors, MTU, queues, start), each step one FFI call with
    /// its SAFETY note and its error, and the `Drop` that undoes a half-done port.
    pub fn open_with(
        device: &str,
        choose: impl FnOnce(&DeviceInfo) -> Result<(PortSetup, Mempool), String>,
    ) -> Result<EthPort, String> {
        let name = device.split(',').next().unwrap_or("").trim().to_string();
        let fail = |what: String| format!("dpdk port {name}: {what}");
        require_eal(&format!("dpdk port {name}"))?;
        if name.is_empty() || name.len() >= sys::RTE_ETH_NAME_MAX_LEN as usize {
            return Err(format!("dpdk port {device:?}: bad device name"));
        }
        let cname = CString::new(name.as_str()).map_err(|_| fail("name contains a NUL byte".into()))?;
        let cdev = CString::new(device).map_err(|_| fail("device string contains a NUL byte".into()))?;

        let mut open_ports = OPEN_PORTS.lock().unwrap_or_else(|e| e.into_inner());
        let mut port_id = 0u16;
        // SAFETY: cname is a valid C string; port_id is a valid out pointer.
        let mut found = unsafe { sys::rte_eth_dev_get_port_by_name(cname.as_ptr(), &mut port_id) } == 0;
        let mut probed = false;
        if found && open_ports.contains(&port_id) {
            return Err(fail(format!("already open (port {port_id})")));
        }
        if !found {
            // SAFETY: EAL is initialized; cdev is a valid C string that DPDK copies.
            let ret = unsafe { sys::rte_dev_probe(cdev.as_ptr()) };
            if ret < 0 {
                // EAL answers EFAULT when no bus recognizes the name, ENODEV when the bus has
                // no such device.
                let what = match -ret {
                    libc::EFAULT => "device not found (no bus or driver recognizes the name)",
                    libc::ENODEV | libc::ENOENT => "device not found",
                    _ => "probe failed",
                };
                return Err(fail(format!("{what}: rte_dev_probe({device:?}): {}", ret_text(ret))));
            }
            probed = true;
            // SAFETY: as above.
            found = unsafe { sys::rte_eth_dev_get_port_by_name(cname.as_ptr(), &mut port_id) } == 0;
            if !found {
                return Err(fail("device probed but no ethdev port has that name (not a NIC? for PCI use the full 0000:bb:dd.f form)".into()));
            }
        }
        open_ports.push(port_id);
        drop(open_ports);

        let mut info = sys::rte_eth_dev_info::default();
        // SAFETY: port_id is a valid port; info is a valid out struct.
        let ret = unsafe { sys::rte_eth_dev_info_get(port_id, &mut info) };
        // SAFETY: port_id is valid.
        let s = unsafe { sys::rte_eth_dev_socket_id(port_id) };
        let dev = DeviceInfo {
            socket: u32::try_from(s).ok(),
            max_rx_queues: info.max_rx_queues,
            max_tx_queues: info.max_tx_queues,
            driver: driver_name(&info),
        };
        let chosen = if ret < 0 {
            Err(fail(format!("rte_eth_dev_info_get: {}", ret_text(ret))))
        } else {
            choose(&dev).map_err(fail)
        };
        let (cfg, pool) = match chosen {
            Ok(c) => c,
            Err(e) => {
                OPEN_PORTS.lock().unwrap_or_else(|e| e.into_inner()).retain(|&p| p != port_id);
                if probed && !info.device.is_null() {
                    // SAFETY: we hot-plugged this device just now and nothing uses it.
                    unsafe { sys::rte_dev_remove(info.device) };
                }
                return Err(e);
            }
        };
        let (cfg, pool) = (&cfg, &pool);

        // From here on, Drop undoes whatever was done.
        let mut port = EthPort {
            port_id,
            name: name.clone(),
            driver: dev.driver.clone(),
            socket: None,
            rxqs: cfg.rxqs,
            txqs: cfg.txqs,
            rx_ring: cfg.rx_ring,
            tx_ring: cfg.tx_ring,
            mtu: None,
            offloads: HwOffloads::default(),
            notes: Vec::new(),
            device: info.device,
            probed,
            started: false,
            rx_claimed: (0..cfg.rxqs).map(|_| AtomicBool::new(false)).collect(),
            tx_claimed: (0..cfg.txqs).map(|_| AtomicBool::new(false)).collect(),
            rx_intr: Box::new([]),
            _pool: *pool,
        };
        if cfg.rxqs == 0 || cfg.txqs == 0 {
            return Err(fail("needs at least one Rx and one Tx queue".into()));
        }
        if cfg.rxqs > info.max_rx_queues || cfg.txqs > info.max_tx_queues {
            return Err(fail(format!(
                "asked for {} Rx / {} Tx queues, the driver allows {} / {}",
                cfg.rxqs, cfg.txqs, info.max_rx_queues, info.max_tx_queues
            )));
        }
        // SAFETY: port_id is valid.
        let s = unsafe { sys::rte_eth_dev_socket_id(port_id) };
        port.socket = u32::try_from(s).ok();

        // Receive interrupts where the driver has them (the poll thread sleeps on them when
        // idle); a driver that refuses them at configure or start is brought up without.
        let want_intr = !NO_RX_INTERRUPTS.contains(&dev.driver.as_str());
        if let Err(e) = port.bring_up(cfg, pool, &info, want_intr) {
            if !want_intr {
                return Err(fail(e));
            }
            // Refused for another reason, it fails again: that error is the port's. The notes
            // of the first attempt (an MTU the driver cannot set) are made again.
            port.notes.clear();
            port.bring_up(cfg, pool, &info, false).map_err(fail)?;
            port.note(format!("no receive interrupts ({e}): idle, its queues are polled on a timer"));
        }
        if want_intr {
            port.rx_intr = port.find_rx_interrupts();
        }
        // SAFETY: port_id is valid and started.
        let ret = unsafe { sys::rte_eth_promiscuous_enable(port_id) };
        if ret == -libc::ENOTSUP {
            port.note(format!("driver {} has no promiscuous mode", driver_name(&info)));
        } else if ret < 0 {
            return Err(fail(format!("promiscuous mode: {}", ret_text(ret))));
        }
        Ok(port)
    }

    /// Configures and starts the port (ethdev's order: configure, descriptors, MTU, queues,
    /// start), with receive interrupts if `intr`. Errors without the port's name.
    fn bring_up(
        &mut self,
        cfg: &PortSetup,
        pool: &Mempool,
        info: &sys::rte_eth_dev_info,
        intr: bool,
    ) -> Result<(), String> {
        let port_id = self.port_id;
        let mut conf = sys::rte_eth_conf::default();
        conf.intr_conf.set_rxq(intr as u32);
        if cfg.offloads {
            let (hw, txo, rxo) = HwOffloads::choose(info);
            self.offloads = hw;
            conf.txmode.offloads = txo;
            conf.rxmode.offloads = rxo;
        }
        // SAFETY: port_id is valid and stopped; conf is a valid configuration whose offloads
        // are ones the device reported.
        let ret = unsafe { sys::rte_eth_dev_configure(port_id, cfg.rxqs, cfg.txqs, &conf) };
        if ret < 0 {
            return Err(format!("rte_eth_dev_configure({} rxq, {} txq): {}", cfg.rxqs, cfg.txqs, ret_text(ret)));
        }
        let (mut nb_rxd, mut nb_txd) = (cfg.rx_ring, cfg.tx_ring);
        // SAFETY: port_id is valid; both are valid in/out pointers.
        let ret = unsafe { sys::rte_eth_dev_adjust_nb_rx_tx_desc(port_id, &mut nb_rxd, &mut nb_txd) };
        if ret < 0 {
            return Err(format!("rte_eth_dev_adjust_nb_rx_tx_desc: {}", ret_text(ret)));
        }
        self.rx_ring = nb_rxd;
        self.tx_ring = nb_txd;

        if let Some(mtu) = cfg.mtu {
            // SAFETY: port_id is valid and configured.
            let ret = unsafe { sys::rte_eth_dev_set_mtu(port_id, mtu) };
            if ret == -libc::ENOTSUP {
                self.note(format!("driver {} cannot set the MTU ({mtu}): left at its default", driver_name(info)));
            } else if ret < 0 {
                return Err(format!("set MTU {mtu}: {}", ret_text(ret)));
            } else {
                self.mtu = Some(mtu);
            }
        }

        let qsocket = self.socket.unwrap_or(sys::SOCKET_ID_ANY as u32);
        for q in 0..cfg.rxqs {
            // SAFETY: port_id is configured with rxqs queues; a NULL rxconf means the driver's
            // defaults; the pool lives forever.
            let ret =
                unsafe { sys::rte_eth_rx_queue_setup(port_id, q, nb_rxd, qsocket, std::ptr::null(), pool.as_ptr()) };
            if ret < 0 {
                return Err(format!("Rx queue {q} setup ({nb_rxd} descriptors): {}", ret_text(ret)));
            }
        }
        for q in 0..cfg.txqs {
            // SAFETY: port_id is configured with txqs queues; a NULL txconf means defaults.
            let ret = unsafe { sys::rte_eth_tx_queue_setup(port_id, q, nb_txd, qsocket, std::ptr::null()) };
            if ret < 0 {
                return Err(format!("Tx queue {q} setup ({nb_txd} descriptors): {}", ret_text(ret)));
            }
        }
        // SAFETY: port_id is configured with all its queues set up.
        let ret = unsafe { sys::rte_eth_dev_start(port_id) };
        if ret < 0 {
            return Err(format!("rte_eth_dev_start: {}", ret_text(ret)));
        }
        self.started = true;
        Ok(())
    }

    /// The receive interrupt of each queue, where the driver made one (after start).
    fn find_rx_interrupts(&self) -> Box<[Option<RxInterrupt>]> {
        (0..self.rxqs)
            .map(|q| {
                // SAFETY: the port is started with `q` a configured Rx queue.
                let fd = unsafe { sys::rte_eth_dev_rx_intr_ctl_q_get_fd(self.port_id, q) };
                if fd < 0 {
                    return None;
                }
                // SAFETY: DPDK keeps `fd` open while the port is (until close, in Drop, after
                // which nothing borrows it); it is only borrowed to be duplicated.
                let own = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }.try_clone_to_owned().ok()?;
                // Disabled while the queue is polled; a driver without the call
                // (`-ENOTSUP`, e.g. net_tap, whose fd is the queue itself) signals by itself.
                // SAFETY: as above.
                let ret = unsafe { sys::rte_eth_dev_rx_intr_disable(self.port_id, q) };
                let needs_arming = match ret {
                    0 => true,
                    r if r == -libc::ENOTSUP => false,
                    _ => return None,
                };
                Some(RxInterrupt { fd: Arc::new(std::fs::File::from(own)), needs_arming })
            })
            .collect()
    }

    fn note(&mut self, text: String) {
        log::warn!("dpdk port {}: {text}", self.name);
        self.notes.push(text);
    }

    pub fn port_id(&self) -> u16 {
        self.port_id
    }

    /// The ethdev name (the device string up to its first comma).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The driver's name (`net_ring`, `net_af_packet`, `net_ixgbe`, ...).
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// NUMA node of the device, None when unknown.
    pub fn socket_id(&self) -> Option<u32> {
        self.socket
    }

    pub fn rx_queues(&self) -> u16 {
        self.rxqs
    }

    /// Rx queue `q`'s receive interrupt, if the driver has one.
    pub fn rx_interrupt(&self, q: u16) -> Option<&RxInterrupt> {
        self.rx_intr.get(q as usize)?.as_ref()
    }

    /// Turns Rx queue `q`'s interrupt on (before its poller sleeps) or off (once it polls
    /// again), for a driver whose interrupt `needs_arming`. Call only from the queue's poller.
    pub fn arm_rx_interrupt(&self, q: u16, on: bool) {
        if self.rx_interrupt(q).is_some_and(|i| i.needs_arming) {
            // SAFETY: the port is started and `q` is one of its Rx queues with an interrupt;
            // only its poller arms it, so the calls for one queue never race.
            let _ = unsafe {
                match on {
                    true => sys::rte_eth_dev_rx_intr_enable(self.port_id, q),
                    false => sys::rte_eth_dev_rx_intr_disable(self.port_id, q),
                }
            };
        }
    }

    pub fn tx_queues(&self) -> u16 {
        self.txqs
    }

    /// Descriptors per Rx and Tx queue after the driver's adjustment.
    pub fn ring_sizes(&self) -> (u16, u16) {
        (self.rx_ring, self.tx_ring)
    }

    /// The MTU set by `open`, None if none was asked for or the driver cannot set it.
    pub fn mtu(&self) -> Option<u16> {
        self.mtu
    }

    /// The checksum and TSO offloads the port runs with.
    pub fn offloads(&self) -> HwOffloads {
        self.offloads
    }

    /// Things `open` could not do but tolerated (MTU, promiscuous mode not supported).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    pub fn mac_addr(&self) -> Result<crate::wire::MacAddr, String> {
        let mut a = sys::rte_ether_addr::default();
        // SAFETY: port_id is valid; a is a valid out pointer.
        let ret = unsafe { sys::rte_eth_macaddr_get(self.port_id, &mut a) };
        if ret < 0 {
            Err(format!("dpdk port {}: MAC address: {}", self.name, ret_text(ret)))
        } else {
            Ok(crate::wire::MacAddr(a.addr_bytes))
        }
    }

    pub fn stats(&self) -> Result<NicStats, String> {
        let mut s = sys::rte_eth_stats::default();
        // SAFETY: port_id is valid; s is a valid out struct.
        let ret = unsafe { sys::rte_eth_stats_get(self.port_id, &mut s) };
        if ret < 0 {
            return Err(format!("dpdk port {}: stats: {}", self.name, ret_text(ret)));
        }
        Ok(NicStats {
            ipackets: s.ipackets,
            opackets: s.opackets,
            ibytes: s.ibytes,
            obytes: s.obytes,
            imissed: s.imissed,
            ierrors: s.ierrors,
            oerrors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
        })
    }

    pub fn reset_stats(&self) -> Result<(), String> {
        // SAFETY: port_id is valid.
        let ret = unsafe { sys::rte_eth_stats_reset(self.port_id) };
        if ret < 0 { Err(format!("dpdk port {}: reset stats: {}", self.name, ret_text(ret))) } else { Ok(()) }
    }

    /// Receives into `pkts`, returns how many were written (they belong to the caller: wrap
    /// them with `Mbuf::from_raw` or free them). Panics if `q` is not an Rx queue.
    pub fn rx_burst(&mut self, q: u16, pkts: &mut [*mut rte_mbuf]) -> usize {
        assert!(q < self.rxqs, "dpdk port {}: no Rx queue {q}", self.name);
        let n = pkts.len().min(u16::MAX as usize) as u16;
        // SAFETY: the port is started, q is one of its Rx queues and &mut self makes this the
        // only poller; pkts has room for n pointers.
        unsafe { sys::pvs_rx_burst(self.port_id, q, pkts.as_mut_ptr(), n) as usize }
    }

    /// Sends the first mbufs of `pkts`, returns how many the driver took (a prefix). The rest
    /// still belong to the caller. Panics if `q` is not a Tx queue.
    ///
    /// # Safety
    /// Every pointer in `pkts` must be a valid mbuf owned by the caller; ownership of the
    /// first `returned` ones passes to DPDK.
    pub unsafe fn tx_burst(&mut self, q: u16, pkts: &mut [*mut rte_mbuf]) -> usize {
        assert!(q < self.txqs, "dpdk port {}: no Tx queue {q}", self.name);
        let n = pkts.len().min(u16::MAX as usize) as u16;
        // SAFETY: the port is started, q is one of its Tx queues, &mut self makes this the only
        // sender; the caller vouches for the mbufs.
        unsafe { sys::pvs_tx_burst(self.port_id, q, pkts.as_mut_ptr(), n) as usize }
    }

    /// Receives into the free slots of `burst`; returns how many arrived.
    pub fn rx(&mut self, q: u16, burst: &mut MbufBurst) -> usize {
        assert!(q < self.rxqs, "dpdk port {}: no Rx queue {q}", self.name);
        // SAFETY: exclusive access to queue q through &mut self.
        unsafe { rx_into(self.port_id, q, burst, BURST) }
    }

    /// Sends from the front of `burst`; returns how many were sent. Unsent mbufs stay in
    /// `burst` (moved to its front) for a retry or `clear()`.
    pub fn tx(&mut self, q: u16, burst: &mut MbufBurst) -> usize {
        assert!(q < self.txqs, "dpdk port {}: no Tx queue {q}", self.name);
        // SAFETY: exclusive access to queue q through &mut self.
        unsafe { tx_from(self.port_id, q, burst) }
    }

    /// Claims Rx queue `q` for one poller (e.g. a thread): fails if it is already claimed.
    pub fn rx_queue(&self, q: u16) -> Result<RxQueue<'_>, String> {
        self.claim(&self.rx_claimed, q, "Rx")?;
        Ok(RxQueue { port: self, q })
    }

    /// Claims Tx queue `q` for one sender: fails if it is already claimed.
    pub fn tx_queue(&self, q: u16) -> Result<TxQueue<'_>, String> {
        self.claim(&self.tx_claimed, q, "Tx")?;
        Ok(TxQueue { port: self, q })
    }

    /// As `rx_queue`, for the fast path: None (no allocation) if `q` is claimed or absent.
    #[inline]
    pub fn try_rx_queue(&self, q: u16) -> Option<RxQueue<'_>> {
        let c = self.rx_claimed.get(q as usize)?;
        (!c.swap(true, Ordering::Acquire)).then_some(RxQueue { port: self, q })
    }

    /// As `tx_queue`, for the fast path: None (no allocation) if `q` is claimed or absent.
    #[inline]
    pub fn try_tx_queue(&self, q: u16) -> Option<TxQueue<'_>> {
        let c = self.tx_claimed.get(q as usize)?;
        (!c.swap(true, Ordering::Acquire)).then_some(TxQueue { port: self, q })
    }

    fn claim(&self, claims: &[AtomicBool], q: u16, kind: &str) -> Result<(), String> {
        let c = claims.get(q as usize).ok_or_else(|| format!("dpdk port {}: no {kind} queue {q}", self.name))?;
        if c.swap(true, Ordering::Acquire) {
            return Err(format!("dpdk port {}: {kind} queue {q} is already claimed", self.name));
        }
        Ok(())
    }
}

/// # Safety
/// `port` is started, `q` is one of its Rx queues and the caller is its only poller.
unsafe fn rx_into(port: u16, q: u16, burst: &mut MbufBurst, max: usize) -> usize {
    let (tail, room) = burst.tail_ptr();
    let room = room.min(max.min(BURST) as u16);
    // SAFETY: per the contract; `tail` has room for `room` pointers, and DPDK writes exactly
    // the returned number of valid mbufs, which then become initialized slots.
    let n = unsafe { sys::pvs_rx_burst(port, q, tail, room) } as usize;
    burst.len += n;
    n
}

/// # Safety
/// `port` is started, `q` is one of its Tx queues and the caller is its only sender.
unsafe fn tx_from(port: u16, q: u16, burst: &mut MbufBurst) -> usize {
    if burst.is_empty() {
        return 0;
    }
    let (head, len) = burst.head_ptr();
    // SAFETY: per the contract; the first len slots are owned mbufs. DPDK takes the first n.
    let n = unsafe { sys::pvs_tx_burst(port, q, head, len) } as usize;
    burst.consume_front(n);
    n
}

fn driver_name(info: &sys::rte_eth_dev_info) -> String {
    if info.driver_name.is_null() {
        return "?".into();
    }
    // SAFETY: a non-NULL driver_name is a static NUL-terminated string of the driver.
    unsafe { CStr::from_ptr(info.driver_name) }.to_string_lossy().into_owned()
}

impl Drop for EthPort {
    fn drop(&mut self) {
        // SAFETY: we own the port; no queue handle can outlive &self, so no burst is running.
        unsafe {
            if self.started {
                let ret = sys::rte_eth_dev_stop(self.port_id);
                if ret < 0 {
                    log::warn!("dpdk port {}: stop: {}", self.name, ret_text(ret));
                }
            }
            let ret = sys::rte_eth_dev_close(self.port_id);
            if ret < 0 {
                log::warn!("dpdk port {}: close: {}", self.name, ret_text(ret));
            }
            // Remove a device we hot-plugged so that it can be probed again. Its rte_device
            // stays valid after the ethdev port is closed: the bus owns it.
            if self.probed && !self.device.is_null() {
                let ret = sys::rte_dev_remove(self.device);
                if ret < 0 {
                    log::warn!("dpdk port {}: remove device: {}", self.name, ret_text(ret));
                }
            }
        }
        OPEN_PORTS.lock().unwrap_or_else(|e| e.into_inner()).retain(|&p| p != self.port_id);
    }
}

/// An Rx queue claimed by one poller. Send: move it to the thread that polls it.
#[derive(Debug)]
pub struct RxQueue<'a> {
    port: &'a EthPort,
    q: u16,
}

impl RxQueue<'_> {
    pub fn queue_id(&self) -> u16 {
        self.q
    }

    /// Receives into the free slots of `burst`; returns how many arrived.
    pub fn rx(&mut self, burst: &mut MbufBurst) -> usize {
        // SAFETY: the queue exists and this handle holds its exclusive claim.
        unsafe { rx_into(self.port.port_id, self.q, burst, BURST) }
    }

    /// As `rx`, but at most `max` mbufs.
    pub fn rx_max(&mut self, burst: &mut MbufBurst, max: usize) -> usize {
        // SAFETY: the queue exists and this handle holds its exclusive claim.
        unsafe { rx_into(self.port.port_id, self.q, burst, max) }
    }
}

impl Drop for RxQueue<'_> {
    fn drop(&mut self) {
        self.port.rx_claimed[self.q as usize].store(false, Ordering::Release);
    }
}

/// A Tx queue claimed by one sender. Send: move it to the thread that sends on it.
#[derive(Debug)]
pub struct TxQueue<'a> {
    port: &'a EthPort,
    q: u16,
}

impl TxQueue<'_> {
    pub fn queue_id(&self) -> u16 {
        self.q
    }

    /// Sends from the front of `burst`; unsent mbufs stay in it (see `EthPort::tx`).
    pub fn tx(&mut self, burst: &mut MbufBurst) -> usize {
        // SAFETY: the queue exists and this handle holds its exclusive claim.
        unsafe { tx_from(self.port.port_id, self.q, burst) }
    }

    /// Has the driver check and prepare `burst`'s offload requests (`rte_eth_tx_prepare`)
    /// before `tx`: each mbuf it refuses is freed. Returns how many were refused, and their
    /// bytes.
    pub fn prepare(&mut self, burst: &mut MbufBurst) -> (usize, u64) {
        let mut from = 0;
        let (mut refused, mut bytes) = (0, 0);
        while from < burst.len() {
            let (head, len) = burst.head_ptr();
            // SAFETY: the queue exists and this handle holds its exclusive claim; the first
            // len slots are owned mbufs from `from` on, which the driver may rewrite in place.
            let ok = unsafe { sys::pvs_tx_prepare(self.port.port_id, self.q, head.add(from), len - from as u16) };
            from += ok as usize;
            if from < burst.len() {
                bytes += burst.remove(from).pkt_len() as u64;
                refused += 1;
            }
        }
        (refused, bytes)
    }
}

impl Drop for TxQueue<'_> {
    fn drop(&mut self) {
        self.port.tx_claimed[self.q as usize].store(false, Ordering::Release);
    }
}
