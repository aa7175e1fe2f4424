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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use dpdk_sys as sys;
pub use dpdk_sys::offload;
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
    #[inline]
    pub fn pkt_len(&self) -> usize {
        // SAFETY: we own a valid mbuf.
        unsafe { (*self.0.as_ptr()).pkt_len as usize }
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
        // SAFETY: we own a valid mbuf, exclusively (`&mut self`).
        let m = unsafe { &mut *self.0.as_ptr() };
        if m.nb_segs == 1 {
            // One segment (every mbuf we allocate to send): what rte_pktmbuf_append does, inline
            // (the C call was a measurable part of a guest-to-NIC frame).
            let tail = m.data_off as usize + m.data_len as usize;
            if tail + len as usize > m.buf_len as usize {
                return None;
            }
            m.data_len += len;
            m.pkt_len += len as u32;
            // SAFETY: tail + len <= buf_len: `len` bytes inside the buffer we own, now part of the
            // data; the buffer memory is initialized (see `data`).
            return Some(unsafe { std::slice::from_raw_parts_mut((m.buf_addr as *mut u8).add(tail), len as usize) });
        }
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

    /// Links `tail` (a chain itself) after this chain's last segment; gives it back if the
    /// chain would exceed DPDK's segment limit.
    pub fn chain(&mut self, tail: Mbuf) -> Result<(), Mbuf> {
        // SAFETY: both are owned mbufs; on success `tail` belongs to this chain (freed with
        // it), so its handle is forgotten without freeing.
        if unsafe { sys::pvs_pktmbuf_chain(self.0.as_ptr(), tail.0.as_ptr()) } != 0 {
            return Err(tail);
        }
        std::mem::forget(tail);
        Ok(())
    }

    /// Asks the device for offloads on this frame: `flags` (`RTE_MBUF_F_TX_*`) with the
    /// lengths of its L2, L3 and L4 headers, and the TSO segment size.
    pub fn set_tx_offload(&mut self, flags: u64, l2: u16, l3: u16, l4: u16, tso_segsz: u16) {
        // SAFETY: an owned mbuf; only its offload fields are written.
        unsafe { sys::pvs_mbuf_set_tx_offload(self.0.as_ptr(), flags, l2, l3, l4, tso_segsz) }
    }

    /// Whether the device verified this received frame's TCP or UDP checksum as good.
    #[inline]
    pub fn rx_l4_checksum_good(&self) -> bool {
        use sys::offload::{MBUF_F_RX_L4_CKSUM_GOOD as GOOD, MBUF_F_RX_L4_CKSUM_MASK as MASK};
        // SAFETY: an owned, valid mbuf; ol_flags is a plain field.
        unsafe { (*self.0.as_ptr()).ol_flags & MASK == GOOD }
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

    /// Takes mbuf `i` out, keeping the order of the others.
    pub fn remove(&mut self, i: usize) -> Mbuf {
        assert!(i < self.len, "MbufBurst::remove({i}) of {}", self.len);
        // SAFETY: slot i is initialized and read once; the initialized slots after it move
        // down by one bitwise (a transfer of ownership), and len shrinks so none is duplicated.
        unsafe {
            let m = self.pkts[i].assume_init_read();
            std::ptr::copy(self.pkts.as_ptr().add(i + 1), self.pkts.as_mut_ptr().add(i), self.len - i - 1);
            self.len -= 1;
            m
        }
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

/// Free hugepage memory on a mounted hugetlbfs, in KiB (0 when none is mounted): whether the
/// EAL can run with hugepages (`--in-memory`) or needs `--no-huge`.
pub fn hugepages_free_kb() -> u64 {
    let mounted = std::fs::read_to_string("/proc/mounts").is_ok_and(|m| m.lines().any(|l| l.contains(" hugetlbfs ")));
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| -> u64 {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    if mounted { field("HugePages_Free:") * field("Hugepagesize:") } else { 0 }
}

mod port;
pub use port::*;
