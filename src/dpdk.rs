// Safe wrapper over the system DPDK (crate `dpdk-sys`): EAL, mbuf pools, ethdev ports, mbufs.
//
// Ownership and thread rules
// --------------------------
// * EAL: `Eal::init` runs `rte_eal_init` once per process. The thread that calls it becomes
//   DPDK's main lcore and EAL pins it per `-l`/`--lcores`. The argv strings are leaked on
//   purpose: EAL may keep pointers into them for the life of the process. A second call with
//   the same arguments returns the first `&'static Eal`; with other arguments it is an error
//   (DPDK cannot be re-initialized). Nothing is ever torn down (`rte_eal_cleanup` is not called).
// * Other threads: any thread may open ports, read stats and move mbufs, but a plain Rust
//   thread that polls should call `thread_register()` first: it then gets an lcore id and
//   with it the per-lcore mempool cache (without one, every alloc/free goes to the shared
//   ring, which is correct but slower).
// * Mempools are created once and never freed (`Mempool` is a `Copy` handle). This keeps every
//   `Mbuf` and every port's Rx queue pointing at live memory without lifetimes. Size them at
//   start-up.
// * Ports: `EthPort` owns one ethdev port from `open` to `Drop` (stop, close, and remove the
//   device if `open` probed it). One queue is polled by one thread at a time: either call the
//   `&mut self` burst methods, or claim per-queue handles (`rx_queue(q)`, `tx_queue(q)`, each
//   queue claimable once at a time) and move them to poll threads; `stats()` works meanwhile.
// * Mbufs: `Mbuf` owns one mbuf (chain) and frees it on drop. `rx`/`rx_burst` hand ownership
//   of the received mbufs to the caller. `tx`/`tx_burst` take ownership only of the mbufs the
//   driver accepted, always a prefix of the array: on partial success the unsent mbufs stay
//   with the caller, who must retry or free them (`MbufBurst::tx` keeps them, moved to the
//   front of the burst; dropping or `clear()`ing the burst frees them).
// * The fast path does not allocate: bursts are fixed arrays (`MbufBurst`, 32 mbufs), and
//   every call is a plain FFI call into the C shim, which inlines DPDK's static-inline code.
// * Errors are `String`s that name the port/device and carry `rte_strerror` text.

use std::ffi::{CStr, CString, c_char, c_int};
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use dpdk_sys as sys;
pub use dpdk_sys::rte_mbuf;

/// Mbufs per `MbufBurst`.
pub const BURST: usize = 32;
/// Headroom DPDK reserves at the start of every mbuf's data room.
pub const PKTMBUF_HEADROOM: u16 = sys::RTE_PKTMBUF_HEADROOM as u16;
/// DPDK's default data room: 2048 bytes of frame plus the headroom.
pub const DEFAULT_DATA_ROOM: u16 = sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16;

/// The text of a DPDK (or libc) error number.
pub fn strerror(errnum: i32) -> String {
    // SAFETY: rte_strerror accepts any value and returns a NUL-terminated string (static, or a
    // per-thread buffer for unknown values) that we copy before doing anything else.
    unsafe { CStr::from_ptr(sys::rte_strerror(errnum)).to_string_lossy().into_owned() }
}

/// The calling thread's `rte_errno`.
pub fn errno() -> i32 {
    // SAFETY: reads a thread-local int; valid on any thread.
    unsafe { sys::pvs_errno() }
}

fn errno_text() -> String {
    let e = errno();
    format!("{} (errno {e})", strerror(e))
}

fn ret_text(ret: c_int) -> String {
    format!("{} (errno {})", strerror(-ret), -ret)
}

/// An initialized DPDK Environment Abstraction Layer. Exists at most once per process.
#[derive(Debug)]
pub struct Eal {
    args: Vec<String>,
    main_lcore: u32,
}

static EAL: Mutex<Option<&'static Eal>> = Mutex::new(None);

impl Eal {
    /// Runs `rte_eal_init` with `args` (`args[0]` is the program name, as in argv).
    /// Once per process: a second call with identical `args` returns the first `Eal`; with
    /// different ones it fails. After a failed init DPDK usually refuses another try.
    pub fn init(args: &[String]) -> Result<&'static Eal, String> {
        let mut slot = EAL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(eal) = *slot {
            if eal.args == args {
                return Ok(eal);
            }
            return Err(format!(
                "DPDK EAL is already initialized with {:?}; cannot re-initialize with {args:?}",
                eal.args
            ));
        }
        if args.is_empty() {
            return Err("DPDK EAL: args must start with a program name".into());
        }
        let mut argv: Vec<*mut c_char> = Vec::with_capacity(args.len() + 1);
        for a in args {
            let c = CString::new(a.as_str()).map_err(|_| format!("DPDK EAL argument {a:?} contains a NUL byte"))?;
            argv.push(c.into_raw());
        }
        argv.push(std::ptr::null_mut());
        // EAL may keep (and getopt may permute) these pointers: leak the array and the strings.
        let argv: &'static mut [*mut c_char] = Box::leak(argv.into_boxed_slice());
        let argc = c_int::try_from(args.len()).map_err(|_| "DPDK EAL: too many arguments".to_string())?;
        // SAFETY: argv holds argc valid NUL-terminated strings plus a NULL terminator, all leaked
        // so they outlive the process's use of them; the mutex serializes concurrent callers.
        let ret = unsafe { sys::rte_eal_init(argc, argv.as_mut_ptr()) };
        if ret < 0 {
            return Err(format!("rte_eal_init({}) failed: {}", args[1..].join(" "), errno_text()));
        }
        // SAFETY: reads the calling thread's lcore id, which EAL has just set up.
        let main_lcore = unsafe { sys::pvs_lcore_id() };
        let eal: &'static Eal = Box::leak(Box::new(Eal { args: args.to_vec(), main_lcore }));
        *slot = Some(eal);
        Ok(eal)
    }

    /// The EAL, if `init` has succeeded.
    pub fn get() -> Option<&'static Eal> {
        *EAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The arguments `init` was given.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// The lcore id of the thread that ran `init`.
    pub fn main_lcore(&self) -> u32 {
        self.main_lcore
    }

    /// The NUMA socket of the calling thread (None when unknown, e.g. an unregistered thread).
    pub fn socket_id() -> Option<u32> {
        // SAFETY: reads per-lcore state; valid on any thread.
        let s = unsafe { sys::rte_socket_id() };
        if s == sys::SOCKET_ID_ANY as u32 { None } else { Some(s) }
    }
}

fn require_eal(what: &str) -> Result<(), String> {
    match Eal::get() {
        Some(_) => Ok(()),
        None => Err(format!("{what}: DPDK EAL is not initialized (call Eal::init first)")),
    }
}

/// Makes the calling (non-EAL) thread an lcore: it gets an lcore id, its socket and a mempool
/// cache. No-op for a thread that already is one. Needs an initialized EAL.
pub fn thread_register() -> Result<(), String> {
    require_eal("rte_thread_register")?;
    // SAFETY: EAL is initialized; the call only touches the calling thread's per-lcore state.
    let ret = unsafe { sys::rte_thread_register() };
    if ret < 0 { Err(format!("rte_thread_register failed: {}", errno_text())) } else { Ok(()) }
}

/// Gives the calling thread's lcore id back (see `thread_register`).
pub fn thread_unregister() {
    if Eal::get().is_some() {
        // SAFETY: EAL is initialized; a thread that is not registered is left alone by DPDK.
        unsafe { sys::rte_thread_unregister() }
    }
}

/// The calling thread's lcore id, None for an unregistered thread.
pub fn lcore_id() -> Option<u32> {
    // SAFETY: reads a thread-local value; valid on any thread.
    let id = unsafe { sys::pvs_lcore_id() };
    if id == sys::LCORE_ID_ANY { None } else { Some(id) }
}

/// A packet mbuf pool. Never freed (see the header); a `Copy` handle.
#[derive(Clone, Copy, Debug)]
pub struct Mempool {
    ptr: NonNull<sys::rte_mempool>,
}

// SAFETY: the pool is created with DPDK's default ops (ring_mp_mc), which are safe for
// concurrent get/put from any thread, and it is never freed.
unsafe impl Send for Mempool {}
// SAFETY: as above; the handle has no Rust-side mutable state.
unsafe impl Sync for Mempool {}

impl Mempool {
    /// Creates a pool of `n_mbufs` mbufs (best `2^k - 1`) with a per-lcore cache of `cache`
    /// (<= 512, 0 for none) and `data_room` bytes per mbuf, headroom included
    /// (`DEFAULT_DATA_ROOM` holds 2048-byte frames), on NUMA `socket` (None: any).
    /// `name` must be unique in the process and short (< 26 bytes).
    pub fn new(name: &str, n_mbufs: u32, cache: u32, data_room: u16, socket: Option<u32>) -> Result<Mempool, String> {
        require_eal(&format!("dpdk mempool {name}"))?;
        let cname = CString::new(name).map_err(|_| format!("dpdk mempool {name:?}: name contains a NUL byte"))?;
        if data_room <= PKTMBUF_HEADROOM {
            return Err(format!(
                "dpdk mempool {name}: data room {data_room} must exceed the {PKTMBUF_HEADROOM}-byte headroom"
            ));
        }
        let socket = match socket {
            Some(s) => c_int::try_from(s).map_err(|_| format!("dpdk mempool {name}: bad socket {s}"))?,
            None => sys::SOCKET_ID_ANY,
        };
        // SAFETY: EAL is initialized; cname is a valid C string for the call's duration (DPDK
        // copies the name).
        let p = unsafe { sys::rte_pktmbuf_pool_create(cname.as_ptr(), n_mbufs, cache, 0, data_room, socket) };
        match NonNull::new(p) {
            Some(ptr) => Ok(Mempool { ptr }),
            None => {
                Err(format!("dpdk mempool {name}: rte_pktmbuf_pool_create({n_mbufs} mbufs) failed: {}", errno_text()))
            }
        }
    }

    /// Mbufs currently in the pool (approximate while other threads use it).
    pub fn available(&self) -> u32 {
        // SAFETY: the pool is alive forever; the count is a read-only walk of caches and ring.
        unsafe { sys::rte_mempool_avail_count(self.ptr.as_ptr()) }
    }

    /// Mbufs currently taken out of the pool.
    pub fn in_use(&self) -> u32 {
        // SAFETY: as in `available`.
        unsafe { sys::rte_mempool_in_use_count(self.ptr.as_ptr()) }
    }

    pub fn as_ptr(&self) -> *mut sys::rte_mempool {
        self.ptr.as_ptr()
    }
}

/// One owned mbuf (possibly the head of a chain). Freed on drop.
#[repr(transparent)]
#[derive(Debug)]
pub struct Mbuf(NonNull<rte_mbuf>);

// SAFETY: an mbuf is plain memory owned by whoever holds the pointer; freeing it from any
// thread is fine (the pool is multi-producer safe and lives forever).
unsafe impl Send for Mbuf {}

impl Mbuf {
    /// A fresh, empty mbuf from `pool`, None if the pool is empty.
    pub fn alloc(pool: &Mempool) -> Option<Mbuf> {
        // SAFETY: the pool is a live pktmbuf pool.
        NonNull::new(unsafe { sys::pvs_pktmbuf_alloc(pool.as_ptr()) }).map(Mbuf)
    }

    /// An mbuf holding a copy of `bytes` (which must fit in one mbuf).
    pub fn from_bytes(pool: &Mempool, bytes: &[u8]) -> Result<Mbuf, String> {
        let mut m = Mbuf::alloc(pool).ok_or("dpdk: mempool is empty")?;
        let len = u16::try_from(bytes.len()).map_err(|_| format!("dpdk: {} bytes do not fit an mbuf", bytes.len()))?;
        let room = m.append(len).ok_or_else(|| format!("dpdk: {len} bytes do not fit an mbuf"))?;
        room.copy_from_slice(bytes);
        Ok(m)
    }

    /// Takes ownership of a raw mbuf.
    ///
    /// # Safety
    /// `ptr` must be a valid mbuf that nobody else owns or will free (e.g. one just returned by
    /// `EthPort::rx_burst`).
    pub unsafe fn from_raw(ptr: NonNull<rte_mbuf>) -> Mbuf {
        Mbuf(ptr)
    }

    /// Gives up ownership: the caller must free the mbuf or hand it to DPDK.
    pub fn into_raw(self) -> NonNull<rte_mbuf> {
        let p = self.0;
        std::mem::forget(self);
        p
    }

    pub fn as_ptr(&self) -> *mut rte_mbuf {
        self.0.as_ptr()
    }

    /// Bytes of data in the first segment.
    #[inline]
    pub fn len(&self) -> usize {
        // SAFETY: we own a valid mbuf; a plain field read (what rte_pktmbuf_data_len does).
        unsafe { (*self.0.as_ptr()).data_len as usize }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of data in the whole chain.
    pub fn pkt_len(&self) -> usize {
        // SAFETY: we own a valid mbuf.
        unsafe { sys::pvs_pktmbuf_pkt_len(self.0.as_ptr()) as usize }
    }

    /// Segments in the chain (1 unless the port does scattered Rx).
    #[inline]
    pub fn nb_segs(&self) -> u16 {
        // SAFETY: we own a valid mbuf; a plain field read.
        unsafe { (*self.0.as_ptr()).nb_segs }
    }

    /// Free bytes after the data of the last segment.
    pub fn tailroom(&self) -> usize {
        // SAFETY: we own a valid mbuf; for a single segment the last one is this one. For a
        // chain, report the head's: `append` checks the real last segment.
        unsafe { sys::pvs_pktmbuf_tailroom(self.0.as_ptr()) as usize }
    }

    /// Free bytes before the data.
    pub fn headroom(&self) -> usize {
        // SAFETY: we own a valid mbuf.
        unsafe { sys::pvs_pktmbuf_headroom(self.0.as_ptr()) as usize }
    }

    /// The first segment's data.
    #[inline]
    pub fn data(&self) -> &[u8] {
        // SAFETY: buf_addr + data_off (rte_pktmbuf_mtod) points at data_len bytes inside the
        // mbuf's buffer, which we own and which stays valid while `self` is borrowed. Pool
        // memory comes from zero-filled mappings, so every byte is initialized.
        unsafe {
            let m = &*self.0.as_ptr();
            std::slice::from_raw_parts((m.buf_addr as *const u8).add(m.data_off as usize), m.data_len as usize)
        }
    }

    /// The first segment's data, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        let len = self.len();
        // SAFETY: as in `data`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(sys::pvs_pktmbuf_mtod(self.0.as_ptr()) as *mut u8, len) }
    }

    /// Grows the packet by `len` bytes at the end of its last segment and returns them, None
    /// (and no change) if the tailroom is too small. The new bytes hold stale data.
    pub fn append(&mut self, len: u16) -> Option<&mut [u8]> {
        // SAFETY: we own a valid mbuf; rte_pktmbuf_append checks the tailroom and returns NULL
        // without changing anything when it is too small.
        let p = unsafe { sys::pvs_pktmbuf_append(self.0.as_ptr(), len) };
        if p.is_null() {
            return None;
        }
        // SAFETY: p points at `len` bytes inside the buffer we own, now part of the data; the
        // buffer memory is initialized (see `data`).
        Some(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len as usize) })
    }

    /// Sets the length of a single-segment mbuf (data and packet length). Growing exposes
    /// stale bytes. Fails for a chain or if `len` exceeds the room after the headroom.
    pub fn set_len(&mut self, len: u16) -> Result<(), String> {
        // SAFETY: we own a valid mbuf; the shim checks the segment count and buffer size.
        let ret = unsafe { sys::pvs_pktmbuf_set_len(self.0.as_ptr(), len) };
        if ret < 0 {
            Err(format!(
                "dpdk mbuf: cannot set length {len} (room {}, {} segments)",
                self.len() + self.tailroom(),
                self.nb_segs()
            ))
        } else {
            Ok(())
        }
    }

    /// Removes `len` bytes from the end of the packet.
    pub fn trim(&mut self, len: u16) -> Result<(), String> {
        // SAFETY: we own a valid mbuf; rte_pktmbuf_trim checks the length.
        let ret = unsafe { sys::pvs_pktmbuf_trim(self.0.as_ptr(), len) };
        if ret < 0 { Err(format!("dpdk mbuf: cannot trim {len} of {} bytes", self.len())) } else { Ok(()) }
    }

    /// Returns the mbuf (and its chain) to its pool. Same as dropping it.
    pub fn free(self) {}
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // SAFETY: we own the mbuf and nobody uses it after this.
        unsafe { sys::pvs_pktmbuf_free(self.0.as_ptr()) }
    }
}

/// Up to `BURST` owned mbufs in a fixed array, the unit of Rx and Tx. Never allocates.
/// Mbufs are kept in order; dropping the burst frees what is left in it.
pub struct MbufBurst {
    pkts: [MaybeUninit<Mbuf>; BURST],
    len: usize,
}

// SAFETY: it only owns mbufs, which are Send.
unsafe impl Send for MbufBurst {}

impl Default for MbufBurst {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MbufBurst {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MbufBurst").field("len", &self.len).finish()
    }
}

impl MbufBurst {
    pub const fn new() -> MbufBurst {
        MbufBurst { pkts: [const { MaybeUninit::uninit() }; BURST], len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn is_full(&self) -> bool {
        self.len == BURST
    }

    /// Free slots.
    pub fn room(&self) -> usize {
        BURST - self.len
    }

    /// Adds an mbuf at the end; gives it back if the burst is full.
    pub fn push(&mut self, m: Mbuf) -> Result<(), Mbuf> {
        if self.len == BURST {
            return Err(m);
        }
        self.pkts[self.len].write(m);
        self.len += 1;
        Ok(())
    }

    /// Takes the last mbuf out.
    pub fn pop(&mut self) -> Option<Mbuf> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        // SAFETY: slot `len` was initialized and is now outside the initialized prefix, so it
        // is read exactly once.
        Some(unsafe { self.pkts[self.len].assume_init_read() })
    }

    /// Appends `n` fresh empty mbufs from `pool` (all or none).
    pub fn alloc(&mut self, pool: &Mempool, n: usize) -> Result<(), String> {
        if n > self.room() {
            return Err(format!("dpdk: cannot allocate {n} mbufs into a burst with room for {}", self.room()));
        }
        let tail = self.pkts[self.len..].as_mut_ptr() as *mut *mut rte_mbuf;
        // SAFETY: `tail` has room for n pointers (MaybeUninit<Mbuf> has the layout of a
        // pointer); rte_pktmbuf_alloc_bulk writes n valid mbufs on success and nothing usable on
        // failure, in which case len is unchanged.
        let ret = unsafe { sys::pvs_pktmbuf_alloc_bulk(pool.as_ptr(), tail, n as u32) };
        if ret != 0 {
            return Err(format!("dpdk: cannot allocate {n} mbufs: pool has {} left", pool.available()));
        }
        self.len += n;
        Ok(())
    }

    /// The mbufs, in order.
    pub fn as_slice(&self) -> &[Mbuf] {
        // SAFETY: the first len slots are initialized, and MaybeUninit<Mbuf> has Mbuf's layout.
        unsafe { std::slice::from_raw_parts(self.pkts.as_ptr() as *const Mbuf, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [Mbuf] {
        // SAFETY: as in `as_slice`, with exclusive access through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.pkts.as_mut_ptr() as *mut Mbuf, self.len) }
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Mbuf> {
        self.as_slice().iter()
    }

    /// Each mbuf's (first segment's) data.
    pub fn frames(&self) -> impl Iterator<Item = &[u8]> {
        self.as_slice().iter().map(Mbuf::data)
    }

    /// Frees every mbuf in the burst.
    pub fn clear(&mut self) {
        let n = self.len;
        self.len = 0;
        let head = self.pkts.as_mut_ptr() as *mut *mut rte_mbuf;
        // SAFETY: the first n slots held owned mbufs; len is already 0 so they are not used
        // again. rte_pktmbuf_free_bulk frees each (and its chain).
        unsafe { sys::rte_pktmbuf_free_bulk(head, n as u32) }
    }

    /// Drops the first `n` entries without freeing them (the driver took them) and moves the
    /// rest to the front.
    fn consume_front(&mut self, n: usize) {
        debug_assert!(n <= self.len);
        let rest = self.len - n;
        // SAFETY: slots n..len are initialized; moving them bitwise to 0..rest transfers
        // ownership, and the first n were handed to DPDK, so nothing is duplicated.
        unsafe { std::ptr::copy(self.pkts.as_ptr().add(n), self.pkts.as_mut_ptr(), rest) };
        self.len = rest;
    }

    fn tail_ptr(&mut self) -> (*mut *mut rte_mbuf, u16) {
        (self.pkts[self.len..].as_mut_ptr() as *mut *mut rte_mbuf, self.room() as u16)
    }

    fn head_ptr(&mut self) -> (*mut *mut rte_mbuf, u16) {
        (self.pkts.as_mut_ptr() as *mut *mut rte_mbuf, self.len as u16)
    }
}

impl Drop for MbufBurst {
    fn drop(&mut self) {
        self.clear();
    }
}

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
}

impl Default for PortSetup {
    fn default() -> Self {
        PortSetup { rxqs: 1, txqs: 1, rx_ring: 1024, tx_ring: 1024, mtu: None }
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

/// Port counters (`rte_eth_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    pub ipackets: u64,
    pub opackets: u64,
    pub ibytes: u64,
    pub obytes: u64,
    /// Dropped by the NIC for lack of Rx descriptors (the switch is too slow).
    pub imissed: u64,
    pub ierrors: u64,
    pub oerrors: u64,
    /// Rx failures for lack of mbufs.
    pub rx_nombuf: u64,
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
    notes: Vec<String>,
    device: *mut sys::rte_device,
    probed: bool,
    started: bool,
    rx_claimed: Box<[AtomicBool]>,
    tx_claimed: Box<[AtomicBool]>,
    _pool: Mempool,
}

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
            notes: Vec::new(),
            device: info.device,
            probed,
            started: false,
            rx_claimed: (0..cfg.rxqs).map(|_| AtomicBool::new(false)).collect(),
            tx_claimed: (0..cfg.txqs).map(|_| AtomicBool::new(false)).collect(),
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

        let conf = sys::rte_eth_conf::default();
        // SAFETY: port_id is valid and stopped; conf is a valid, zeroed configuration.
        let ret = unsafe { sys::rte_eth_dev_configure(port_id, cfg.rxqs, cfg.txqs, &conf) };
        if ret < 0 {
            return Err(fail(format!("rte_eth_dev_configure({} rxq, {} txq): {}", cfg.rxqs, cfg.txqs, ret_text(ret))));
        }
        let (mut nb_rxd, mut nb_txd) = (cfg.rx_ring, cfg.tx_ring);
        // SAFETY: port_id is valid; both are valid in/out pointers.
        let ret = unsafe { sys::rte_eth_dev_adjust_nb_rx_tx_desc(port_id, &mut nb_rxd, &mut nb_txd) };
        if ret < 0 {
            return Err(fail(format!("rte_eth_dev_adjust_nb_rx_tx_desc: {}", ret_text(ret))));
        }
        port.rx_ring = nb_rxd;
        port.tx_ring = nb_txd;

        if let Some(mtu) = cfg.mtu {
            // SAFETY: port_id is valid and configured.
            let ret = unsafe { sys::rte_eth_dev_set_mtu(port_id, mtu) };
            if ret == -libc::ENOTSUP {
                port.note(format!("driver {} cannot set the MTU ({mtu}): left at its default", driver_name(&info)));
            } else if ret < 0 {
                return Err(fail(format!("set MTU {mtu}: {}", ret_text(ret))));
            } else {
                port.mtu = Some(mtu);
            }
        }

        let qsocket = port.socket.unwrap_or(sys::SOCKET_ID_ANY as u32);
        for q in 0..cfg.rxqs {
            // SAFETY: port_id is configured with rxqs queues; a NULL rxconf means the driver's
            // defaults; the pool lives forever.
            let ret =
                unsafe { sys::rte_eth_rx_queue_setup(port_id, q, nb_rxd, qsocket, std::ptr::null(), pool.as_ptr()) };
            if ret < 0 {
                return Err(fail(format!("Rx queue {q} setup ({nb_rxd} descriptors): {}", ret_text(ret))));
            }
        }
        for q in 0..cfg.txqs {
            // SAFETY: port_id is configured with txqs queues; a NULL txconf means defaults.
            let ret = unsafe { sys::rte_eth_tx_queue_setup(port_id, q, nb_txd, qsocket, std::ptr::null()) };
            if ret < 0 {
                return Err(fail(format!("Tx queue {q} setup ({nb_txd} descriptors): {}", ret_text(ret))));
            }
        }
        // SAFETY: port_id is configured with all its queues set up.
        let ret = unsafe { sys::rte_eth_dev_start(port_id) };
        if ret < 0 {
            return Err(fail(format!("rte_eth_dev_start: {}", ret_text(ret))));
        }
        port.started = true;
        // SAFETY: port_id is valid and started.
        let ret = unsafe { sys::rte_eth_promiscuous_enable(port_id) };
        if ret == -libc::ENOTSUP {
            port.note(format!("driver {} has no promiscuous mode", driver_name(&info)));
        } else if ret < 0 {
            return Err(fail(format!("promiscuous mode: {}", ret_text(ret))));
        }
        Ok(port)
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

    /// Things `open` could not do but tolerated (MTU, promiscuous mode not supported).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    pub fn mac_addr(&self) -> Result<[u8; 6], String> {
        let mut a = sys::rte_ether_addr::default();
        // SAFETY: port_id is valid; a is a valid out pointer.
        let ret = unsafe { sys::rte_eth_macaddr_get(self.port_id, &mut a) };
        if ret < 0 { Err(format!("dpdk port {}: MAC address: {}", self.name, ret_text(ret))) } else { Ok(a.addr_bytes) }
    }

    pub fn stats(&self) -> Result<PortStats, String> {
        let mut s = sys::rte_eth_stats::default();
        // SAFETY: port_id is valid; s is a valid out struct.
        let ret = unsafe { sys::rte_eth_stats_get(self.port_id, &mut s) };
        if ret < 0 {
            return Err(format!("dpdk port {}: stats: {}", self.name, ret_text(ret)));
        }
        Ok(PortStats {
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
}

impl Drop for TxQueue<'_> {
    fn drop(&mut self) {
        self.port.tx_claimed[self.q as usize].store(false, Ordering::Release);
    }
}
