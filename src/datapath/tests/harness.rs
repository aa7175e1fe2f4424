//! The harness: `Bench` holds test VMs on vhost-user ports and the poll threads that serve
//! them; `step` runs each thread's loop once.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use pvsgen::frontend::{Guest, HDR_LEN, Layout};

use crate::datapath::Ctx;
use crate::datapath::counters::{DropReason, PortTotals, RxqStats, ThreadStats};
use crate::datapath::mac_table::MacTable;
use crate::datapath::mailbox::Mailbox;
use crate::datapath::plan::{Plan, PortPolicy, PortTable, RxqSpec};
use crate::datapath::thread::PollThread;
use crate::flow::table::FlowTable;
use crate::mem::RegionDesc;
use crate::port::Port;
use crate::port::vhost::{
    OFFERED_FEATURES, OFFERED_PROTOCOL_FEATURES, OFFLOAD_FEATURES, PortBackend, VHOST_USER_F_PROTOCOL_FEATURES,
};
use crate::wire::VirtioNetHdr;
use crate::wire::virtio_net::feature;

/// What a test VM's driver acks by default: pvsgen's features.
pub const DRIVER_FEATURES: u64 = pvsgen::frontend::FEATURES;

/// The MAC of test VM `i`.
pub fn mac(i: usize) -> [u8; 6] {
    [0x02, 0, 0, 0, 0, 0x10 + i as u8]
}

/// A frame from `src` to `dst` of `len` bytes whose payload carries `seq`.
pub fn frame(dst: [u8; 6], src: [u8; 6], len: usize, seq: u32) -> Vec<u8> {
    let mut f = Vec::with_capacity(len);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&0x88b5u16.to_be_bytes());
    f.extend_from_slice(&seq.to_be_bytes());
    let mut x = seq.wrapping_mul(2654435761) | 1;
    while f.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        f.push(x as u8);
    }
    f
}

/// `f` with an 802.1Q tag (TPID `tpid`, TCI `tci`) after its addresses.
pub fn tagged(f: &[u8], tpid: u16, tci: u16) -> Vec<u8> {
    let mut t = f[..12].to_vec();
    t.extend_from_slice(&tpid.to_be_bytes());
    t.extend_from_slice(&tci.to_be_bytes());
    t.extend_from_slice(&f[12..]);
    t
}

/// One test VM: its port, the backend of its (imaginary) connection, its driver.
pub struct TestVm {
    pub port: Arc<Port>,
    /// The backend of its connection: what starts, stops and remaps its rings.
    #[allow(dead_code)]
    pub backend: PortBackend,
    pub guest: Guest,
    pub features: u64,
    /// Size of the receive buffers it posts.
    pub rx_buf: u32,
    /// The virtio-net header of each frame `recv` returned, in order (cleared by each `recv`).
    pub hdrs: Vec<VirtioNetHdr>,
}

impl TestVm {
    /// A VM on a one-queue-pair vhost-user port `id`, its memory and rings handed to the
    /// port's backend as a frontend's requests would; its driver acks `features`.
    pub fn new(id: u16, layout: Layout, features: u64) -> TestVm {
        let port = Arc::new(Port::vhost_user(id, &format!("vm{id}"), 9000, 1));
        let mut backend = PortBackend::new(port.clone());
        let guest = Guest::new(layout, layout.mem_size);
        attach(&mut backend, &guest, features);
        TestVm { port, backend, guest, features, rx_buf: layout.buf_slot as u32, hdrs: Vec::new() }
    }

    /// Frames received since the last call, header stripped, with MRG_RXBUF frames put back
    /// together from their buffers (`num_buffers`). Reposts as many buffers.
    pub fn recv(&mut self) -> Vec<Vec<u8>> {
        let l = *self.guest.layout();
        let used: Vec<(u32, u32)> = {
            let mut rx = self.guest.raw_rx();
            let idx = rx.used_idx();
            std::iter::from_fn(|| rx.next_used(idx)).collect()
        };
        let mut out: Vec<Vec<u8>> = Vec::new();
        self.hdrs.clear();
        let mut left = 0u16;
        for &(id, len) in &used {
            assert!(id < l.qsize as u32, "used id {id} out of range");
            let buf = self.guest.mem.read(l.rx_buf(id as u16), len as usize);
            if left > 0 {
                out.last_mut().unwrap().extend_from_slice(&buf);
                left -= 1;
                continue;
            }
            if len == 0 {
                continue; // a buffer given back unused (the frame did not fit)
            }
            assert!(len as usize >= HDR_LEN, "used length {len} shorter than the header");
            let nbufs = u16::from_le_bytes([buf[10], buf[11]]);
            assert!(nbufs >= 1, "num_buffers 0");
            assert!(nbufs == 1 || self.features & feature::MRG_RXBUF != 0, "num_buffers {nbufs} without MRG_RXBUF");
            left = nbufs - 1;
            self.hdrs.push(VirtioNetHdr::parse(&buf[..HDR_LEN]).unwrap());
            out.push(buf[HDR_LEN..].to_vec());
        }
        assert_eq!(left, 0, "a frame's buffers were published in part");
        self.guest.post_rx_buffers(used.len() as u16, self.rx_buf);
        out
    }
}

/// Sets up queue pair 0 of `backend` for `guest` as a frontend would: features, memory table,
/// each ring's size, base, addresses, kick and call eventfds, enable.
pub fn attach(backend: &mut PortBackend, guest: &Guest, features: u64) {
    let features = features | VHOST_USER_F_PROTOCOL_FEATURES;
    assert_eq!(features & !(OFFERED_FEATURES | OFFLOAD_FEATURES), 0, "the switch does not offer {features:#x}");
    let l = *guest.layout();
    let uva = |gpa: u64| guest.mem.uva() + gpa;
    backend.set_owner().unwrap();
    backend.set_features(features).unwrap();
    backend.set_protocol_features(OFFERED_PROTOCOL_FEATURES);
    let region = RegionDesc { guest_phys_addr: 0, size: l.mem_size, user_addr: guest.mem.uva(), mmap_offset: 0 };
    backend.set_mem_table(&[region], vec![guest.memfd().try_clone().unwrap()]).unwrap();
    for (q, at) in l.rings.iter().enumerate() {
        let dup = |fd: &vmm_sys_util::eventfd::EventFd| {
            // SAFETY: dup of an eventfd we own; the new fd is owned by the File.
            Some(unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(libc::dup(fd.as_raw_fd())) })
        };
        backend.set_vring_num(q as u32, l.qsize as u32).unwrap();
        backend.set_vring_base(q as u32, 0).unwrap();
        backend.set_vring_addr(q as u32, uva(at.desc), uva(at.used), uva(at.avail), None).unwrap();
        backend.set_vring_kick(q as u8, dup(guest.kick(q))).unwrap();
        backend.set_vring_call(q as u8, dup(guest.call(q))).unwrap();
        backend.set_vring_enable(q as u32, true).unwrap();
    }
}

/// Test VMs and the poll threads that serve them.
pub struct Bench {
    pub vms: Vec<TestVm>,
    pub threads: Vec<PollThread>,
    pub stats: Vec<Arc<ThreadStats>>,
    pub mailboxes: Vec<Arc<Mailbox>>,
    /// Each thread's receive queues, as indices into `vms` (queue pair 0 each).
    pub queues: Vec<Vec<usize>>,
    /// Which VMs' ports the plans hold.
    pub in_plan: Vec<bool>,
    pub rxq_stats: Vec<Arc<RxqStats>>,
    pub flows: Arc<FlowTable>,
    pub mac: Arc<MacTable>,
    /// Each VM's port policy (port security), as the plans give it.
    pub policies: Vec<PortPolicy>,
    /// Connection tracking, for policies with security-group rules.
    pub conntrack: Option<Arc<crate::conntrack::Conntrack>>,
    /// The flows' tracker (`ct` actions).
    pub flow_conntrack: Option<Arc<crate::conntrack::Conntrack>>,
    /// Mirrors, by the VMs' port names (`vmN`).
    pub mirrors: Vec<crate::config::MirrorConfig>,
    /// VRFs (routing), their neighbours from the policies.
    pub vrfs: Vec<crate::config::VrfConfig>,
}

/// How to build a bench.
#[derive(Clone, Copy)]
pub struct BenchCfg {
    pub vms: usize,
    pub threads: usize,
    pub layout: Layout,
    pub burst: u32,
    /// How long a frame waits for a full receiver, in TSC cycles (0: not at all).
    pub retry_cycles: u64,
    /// Size of the receive buffers VMs post (0: the layout's buffer slot).
    pub rx_buf: u32,
    /// Buckets of the MAC table. Its bucket hash is keyed at random per process, so with more
    /// than one bucket two MACs share a bucket in some runs and not in others; one bucket puts
    /// entries in learning order every run (the instruction counts of `insn` depend on it).
    pub mac_buckets: usize,
    /// Parking (0: off): a queue empty this long (microseconds) is parked.
    pub park_after_us: u32,
}

impl Default for BenchCfg {
    fn default() -> BenchCfg {
        BenchCfg {
            vms: 2,
            threads: 1,
            layout: Layout::packed(256, 2048),
            burst: 32,
            retry_cycles: u64::MAX,
            rx_buf: 0,
            mac_buckets: 64,
            park_after_us: 0,
        }
    }
}

impl Bench {
    /// `cfg.vms` VMs with the default driver features, every receive queue on thread 0.
    pub fn new(cfg: BenchCfg) -> Bench {
        Bench::with_features(cfg, &vec![DRIVER_FEATURES; cfg.vms])
    }

    /// Like `new`, VM `i`'s driver acking `features[i]`.
    pub fn with_features(cfg: BenchCfg, features: &[u64]) -> Bench {
        let vms: Vec<TestVm> = (0..cfg.vms).map(|i| TestVm::new(i as u16, cfg.layout, features[i])).collect();
        let stats: Vec<Arc<ThreadStats>> =
            (0..cfg.threads).map(|t| Arc::new(ThreadStats::new(t, None, crate::config::MAX_PORTS))).collect();
        let mailboxes: Vec<Arc<Mailbox>> = (0..cfg.threads).map(|_| Arc::new(Mailbox::default())).collect();
        let mut queues = vec![Vec::new(); cfg.threads];
        queues[0] = (0..cfg.vms).collect();
        let mac = Arc::new(MacTable::new(cfg.mac_buckets, crate::config::MAX_PORTS, crate::config::DEFAULT_MAC_LIMIT));
        let mut b = Bench {
            rxq_stats: (0..cfg.vms).map(|_| Arc::default()).collect(),
            vms,
            threads: Vec::new(),
            stats,
            mailboxes,
            queues,
            in_plan: vec![true; cfg.vms],
            flows: Arc::new(FlowTable::default()),
            mac,
            policies: vec![PortPolicy::default(); cfg.vms],
            conntrack: None,
            flow_conntrack: None,
            mirrors: Vec::new(),
            vrfs: Vec::new(),
        };
        for t in 0..cfg.threads {
            let cx = Ctx {
                index: t,
                mac: b.mac.clone(),
                stats: b.stats[t].clone(),
                burst: cfg.burst,
                retry_cycles: cfg.retry_cycles,
                shutdown: Arc::new(AtomicBool::new(false)),
                mailbox: b.mailboxes[t].clone(),
                sleep_after_us: None,
                nic_poll_interval_us: 100,
                nic_poll_max_us: 2000,
                park_after_us: cfg.park_after_us,
                park_check_us: 1,
            };
            let plan = b.plan(t);
            b.threads.push(PollThread::new(cx, plan));
        }
        for vm in &mut b.vms {
            if cfg.rx_buf > 0 {
                vm.rx_buf = cfg.rx_buf;
            }
            vm.guest.post_rx_buffers(cfg.layout.qsize, vm.rx_buf);
        }
        b
    }

    /// Thread `t`'s plan as `queues` and `flows` stand.
    pub fn plan(&self, t: usize) -> Plan {
        let entries: Vec<(Arc<Port>, PortPolicy)> = (self.vms.iter().zip(&self.in_plan).zip(&self.policies))
            .filter(|((_, p), _)| **p)
            .map(|((v, _), pol)| (v.port.clone(), pol.clone()))
            .collect();
        Plan {
            ports: Arc::new(
                PortTable::new(&entries, &[])
                    .with_conntrack(self.conntrack.clone())
                    .with_flow_conntrack(self.flow_conntrack.clone())
                    .with_mirrors(&self.mirrors)
                    .with_routes(&self.vrfs, &[]),
            ),
            flows: self.flows.clone(),
            tuning: None,
            rxqs: self.queues[t]
                .iter()
                .map(|&i| RxqSpec {
                    port: self.vms[i].port.clone(),
                    qpair: 0,
                    weight_packets: 256,
                    weight_bytes: 512 * 1024,
                    stats: self.rxq_stats[i].clone(),
                })
                .collect(),
        }
    }

    /// Posts thread `t` its plan as things stand; it adopts it at its next step.
    pub fn post(&self, t: usize) {
        self.mailboxes[t].post(self.plan(t));
    }

    /// Takes VM `i`'s port out of every thread's plan (adopted at the next step).
    pub fn leave(&mut self, i: usize) {
        self.in_plan[i] = false;
        for q in &mut self.queues {
            q.retain(|&v| v != i);
        }
        for t in 0..self.threads.len() {
            self.post(t);
        }
    }

    /// One loop iteration of every thread; returns the frames they took.
    pub fn step(&mut self) -> u32 {
        self.threads.iter_mut().map(|t| t.run_once()).sum()
    }

    /// Steps until no thread takes a frame (at most `max` times); returns the steps taken.
    pub fn settle(&mut self, max: usize) -> usize {
        for i in 0..max {
            if self.step() == 0 {
                return i;
            }
        }
        max
    }

    /// Port `i`'s counters summed over the threads.
    pub fn totals(&self, i: usize) -> PortTotals {
        use crate::datapath::counters::Total;
        let mut t = PortTotals::default();
        for s in &self.stats {
            t.add(&s.ports[i].read());
        }
        t
    }

    pub fn drops(&self, i: usize, why: DropReason) -> u64 {
        self.totals(i).drops.get(why)
    }

    /// Makes floods skip a port found full or down for `cycles` TSC cycles (`FLOOD_RETRY_US`
    /// otherwise), until the next plan.
    pub fn set_flood_retry(&mut self, cycles: u64) {
        for t in &mut self.threads {
            t.work.delivery.flood_retry = cycles;
        }
    }

    /// Counts now what the threads count lazily (the frames floods skipped), as they do within
    /// a millisecond.
    pub fn flush_counts(&mut self) {
        for t in &mut self.threads {
            t.work.delivery.flush_flood_missed(&t.cx.stats);
        }
    }

    /// VM `i` sends a broadcast from its MAC, so the others learn where it is; everyone takes it.
    pub fn announce(&mut self, i: usize) {
        let f = frame([0xff; 6], mac(i), 60, u32::MAX);
        self.vms[i].guest.send(&f);
        self.settle(10);
        for j in (0..self.vms.len()).filter(|&j| j != i) {
            assert_eq!(self.vms[j].recv(), vec![f.clone()], "vm{j} did not get vm{i}'s broadcast");
        }
    }
}

// Dirty logging, as QEMU sets it up when a migration starts.

pub fn memfd(len: u64) -> std::fs::File {
    // SAFETY: memfd_create with a valid C string; the new fd is owned by the std::fs::File.
    let f = unsafe {
        <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(libc::memfd_create(
            c"pvs-log".as_ptr(),
            libc::MFD_CLOEXEC,
        ))
    };
    f.set_len(len).unwrap();
    f
}

/// Bytes of bitmap a guest of `mem` bytes needs.
pub fn log_bytes(mem: u64) -> u64 {
    mem.div_ceil(4096).div_ceil(8)
}

/// What QEMU does for VM `i` when a migration starts: SET_LOG_BASE, LOG_ALL in the features,
/// each ring's addresses again with its used ring's guest address to log. Returns the log.
pub fn start_logging(b: &mut Bench, i: usize) -> std::fs::File {
    let vm = &mut b.vms[i];
    let l = *vm.guest.layout();
    let log = memfd(log_bytes(l.mem_size));
    vm.backend.set_log_base(log_bytes(l.mem_size), 0, Some(log.try_clone().unwrap())).unwrap();
    vm.backend
        .set_features(
            vm.features | crate::port::vhost::VHOST_USER_F_PROTOCOL_FEATURES | crate::port::vhost::VHOST_F_LOG_ALL,
        )
        .unwrap();
    let uva = vm.guest.mem.uva();
    for (q, at) in l.rings.iter().enumerate() {
        vm.backend.set_vring_addr(q as u32, uva + at.desc, uva + at.used, uva + at.avail, Some(at.used)).unwrap();
    }
    log
}

/// The pages marked in `log` (and clears it, as the frontend does when it syncs).
pub fn take_marked(log: &std::fs::File) -> Vec<u64> {
    let len = log.metadata().unwrap().len();
    let mut bytes = vec![0u8; len as usize];
    use std::os::unix::fs::FileExt;
    log.read_exact_at(&mut bytes, 0).unwrap();
    log.write_all_at(&vec![0u8; len as usize], 0).unwrap();
    let mut pages = Vec::new();
    for (i, b) in bytes.iter().enumerate() {
        for bit in 0..8 {
            if b & (1 << bit) != 0 {
                pages.push(i as u64 * 8 + bit);
            }
        }
    }
    pages
}

/// The pages of `[gpa, gpa + len)`.
pub fn pages(gpa: u64, len: u64) -> impl Iterator<Item = u64> {
    (gpa >> 12)..=((gpa + len - 1) >> 12)
}
