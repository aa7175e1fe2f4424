//! The vhost-user backend of one port: the control-plane half. It answers the frontend's
//! requests (through the `vhost` crate's `BackendReqHandler`, driven by the control thread's
//! event loop) and starts, stops and remaps the port's rings, which the poll threads then serve.
//!
//! One `PortBackend` lives for one connection; a reconnect gets a fresh one, so no state from
//! an earlier VM survives into the next.

use std::fs::File;
use std::sync::Arc;

use log::{info, warn};
use vhost::VhostUserMemoryRegionBase;
use vhost::vhost_user::message::*;
use vhost::vhost_user::{Backend, Error, GpuBackend, Result, VhostUserBackendReqHandlerMut};

use crate::mem::{GuestMem, RegionDesc};
use crate::port::Port;
use crate::vring::{MAX_QUEUE_SIZE, ring_addrs};
use crate::wire::virtio_net::{self, feature};

/// The vhost-user transport's own feature bit: the protocol-features handshake is offered.
pub const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;

/// What pvswitchd offers every frontend. IN_ORDER: chains are popped, and completed, strictly
/// in ring order on both queues. CTRL_VQ is offered because MQ requires it; the frontend
/// (QEMU) serves the control queue itself and never hands it to a backend.
pub const OFFERED_FEATURES: u64 = feature::VERSION_1
    | feature::IN_ORDER
    | feature::MRG_RXBUF
    | feature::CTRL_VQ
    | feature::MQ
    | feature::RING_INDIRECT_DESC
    | feature::RING_EVENT_IDX
    | VHOST_USER_F_PROTOCOL_FEATURES;

/// Names of negotiated feature bits, for `pvswitchctl ports`.
pub fn feature_names(f: u64) -> Vec<String> {
    let mut v = virtio_net::feature_names(f & !VHOST_USER_F_PROTOCOL_FEATURES);
    if f & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
        v.push("PROTOCOL_FEATURES".into());
    }
    v
}

/// One virtqueue as the frontend set it up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VringStatus {
    pub size: u16,
    pub enabled: bool,
    /// Whether the data path serves it now.
    pub running: bool,
}

/// What one connection's frontend has negotiated and set up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    pub features: u64,
    pub memory_regions: usize,
    pub memory_bytes: u64,
    /// The NUMA node of the memory holding the first ring (None until known).
    pub numa_node: Option<usize>,
    /// By vhost-user queue index.
    pub vrings: Vec<VringStatus>,
}

#[derive(Default)]
struct VringConf {
    size: u16,
    addrs: Option<(u64, u64, u64)>,
    base: u16,
    kicked: bool,
    kick: Option<File>,
    enabled: bool,
    call: Option<File>,
    /// Whether the data path is serving this ring now.
    running: bool,
}

pub struct PortBackend {
    port: Arc<Port>,
    owner: bool,
    features: u64,
    protocol: u64,
    mem: Option<Arc<GuestMem>>,
    vrings: Vec<VringConf>,
}

/// The port's virtqueues (a backend only exists for a vhost-user port).
fn rings(port: &Port) -> &[crate::vring::VringLock] {
    port.queues().map_or(&[], |q| q.all())
}

/// A refused request: the connection closes, and `what` becomes the port's last error.
fn invalid(what: &str) -> Error {
    warn!("vhost-user: {what}");
    Error::ReqHandlerError(std::io::Error::new(std::io::ErrorKind::InvalidInput, what))
}

impl PortBackend {
    pub fn new(port: Arc<Port>) -> PortBackend {
        let n = port.queues().map_or(0, |q| q.all().len());
        PortBackend {
            port,
            owner: false,
            features: 0,
            protocol: 0,
            mem: None,
            vrings: (0..n).map(|_| VringConf::default()).collect(),
        }
    }

    pub fn features(&self) -> u64 {
        self.features
    }

    /// Whether `addr` lies in this connection's guest memory mappings.
    pub fn mem_contains(&self, addr: usize) -> bool {
        self.mem.as_ref().is_some_and(|m| m.contains_host(addr))
    }

    /// The NUMA node of the memory holding the port's first configured ring.
    fn numa_node(&self) -> Option<usize> {
        let mem = self.mem.as_ref()?;
        let (desc, _, _) = self.vrings.iter().find_map(|v| v.addrs)?;
        mem.numa_node_of(desc)
    }

    /// What the frontend has set up so far, for the switch model (`pvswitchctl ports`).
    pub fn status(&self) -> Status {
        Status {
            features: self.features,
            memory_regions: self.mem.as_ref().map_or(0, |m| m.region_count()),
            memory_bytes: self.mem.as_ref().map_or(0, |m| m.total_size()),
            numa_node: self.numa_node(),
            vrings: self
                .vrings
                .iter()
                .map(|v| VringStatus { size: v.size, enabled: v.enabled, running: v.running })
                .collect(),
        }
    }

    fn vring(&mut self, index: u32) -> Result<&mut VringConf> {
        let n = self.vrings.len();
        self.vrings
            .get_mut(index as usize)
            .ok_or_else(|| invalid(&format!("vring index {index} out of range (port has {n})")))
    }

    fn hdr_len(&self) -> u32 {
        virtio_net::hdr_len(self.features) as u32
    }

    /// Like `reconcile`, for requests that must be refused (and the connection closed) when the
    /// ring's addresses are not in guest memory.
    fn reconcile_or_refuse(&mut self, i: usize) -> Result<()> {
        self.reconcile(i).map_err(|e| invalid(&format!("{}: {e}", self.port.name())))
    }

    /// Starts ring `i` in the data path if everything it needs has arrived, or stops it if
    /// it should no longer run. Fails only when the ring's addresses are outside guest memory
    /// (or misaligned), or its call eventfd cannot be duplicated; the ring is stopped then.
    fn reconcile(&mut self, i: usize) -> std::result::Result<(), String> {
        let protocol_negotiated = self.features & VHOST_USER_F_PROTOCOL_FEATURES != 0;
        let hdr_len = self.hdr_len();
        let mrg = self.features & feature::MRG_RXBUF != 0;
        let event_idx = self.features & feature::RING_EVENT_IDX != 0;
        let v = &self.vrings[i];
        let want = v.kicked && (v.enabled || !protocol_negotiated) && v.addrs.is_some() && v.size > 0;
        let lock = &rings(&self.port)[i];
        let mut g = lock.lock();
        if let Some(base) = g.stop() {
            self.vrings[i].base = base;
        }
        self.vrings[i].running = false;
        if !want {
            return Ok(());
        }
        let Some(mem) = self.mem.clone() else { return Ok(()) };
        let v = &self.vrings[i];
        let (d, u, a) = v.addrs.unwrap();
        let Some(addrs) = ring_addrs(&mem, v.size, d, a, u) else {
            return Err(format!("vring {i} addresses outside guest memory or misaligned"));
        };
        let call = match &v.call {
            Some(f) => Some(f.try_clone().map_err(|e| format!("vring {i} call eventfd: {e}"))?),
            None => None,
        };
        let kick = match &v.kick {
            Some(f) => Some(f.try_clone().map_err(|e| format!("vring {i} kick eventfd: {e}"))?),
            None => None,
        };
        g.hdr_len = hdr_len;
        g.mrg_rxbuf = mrg;
        g.start(addrs, v.base, event_idx, (call, kick), mem);
        drop(g);
        self.vrings[i].running = true;
        Ok(())
    }

    fn reconcile_all(&mut self) -> Result<()> {
        for i in 0..self.vrings.len() {
            self.reconcile_or_refuse(i)?;
        }
        Ok(())
    }

    /// Stops every ring (the connection ended or the device was reset).
    pub fn stop_all(&mut self) {
        for (i, v) in self.vrings.iter_mut().enumerate() {
            let mut g = rings(&self.port)[i].lock();
            g.stop();
            g.broken = None;
            v.running = false;
        }
    }

    fn reset(&mut self) {
        self.stop_all();
        let port = self.port.clone();
        *self = PortBackend::new(port);
    }
}

impl VhostUserBackendReqHandlerMut for PortBackend {
    fn set_owner(&mut self) -> Result<()> {
        if self.owner {
            return Err(invalid("SET_OWNER twice"));
        }
        self.owner = true;
        Ok(())
    }

    fn reset_owner(&mut self) -> Result<()> {
        self.reset();
        Ok(())
    }

    fn reset_device(&mut self) -> Result<()> {
        self.reset();
        self.owner = true;
        Ok(())
    }

    fn get_features(&mut self) -> Result<u64> {
        Ok(OFFERED_FEATURES)
    }

    fn set_features(&mut self, features: u64) -> Result<()> {
        if features & !OFFERED_FEATURES != 0 {
            return Err(invalid(&format!("frontend acked features {features:#x} we did not offer")));
        }
        self.features = features;
        info!("{}: features {}", self.port.name(), feature_names(features).join(" "));
        // Header length and notification style depend on features: restart running rings.
        self.reconcile_all()
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy: Option<bool>,
    ) -> Result<Option<Vec<VhostUserMemoryRegionBase>>> {
        let descs: Vec<RegionDesc> = ctx
            .iter()
            .map(|r| RegionDesc {
                guest_phys_addr: r.guest_phys_addr,
                size: r.memory_size,
                user_addr: r.user_addr,
                mmap_offset: r.mmap_offset,
            })
            .collect();
        let mem = GuestMem::map(&descs, files).map_err(|e| invalid(&format!("{}: {e}", self.port.name())))?;
        info!("{}: memory table: {} regions, {} MiB", self.port.name(), mem.region_count(), mem.total_size() >> 20);
        // Each running ring is stopped and restarted on the new table under its lock, so no
        // poll thread ever uses the old mapping after this; the old one is unmapped when the
        // last ring lets go of it.
        self.mem = Some(Arc::new(mem));
        // A frontend that moved its memory to new addresses re-sends SET_VRING_ADDR next; until
        // then a ring whose old addresses are not in the new table stays stopped.
        for i in 0..self.vrings.len() {
            if let Err(e) = self.reconcile(i) {
                info!("{}: {e}; the ring waits for its addresses in the new memory table", self.port.name());
            }
        }
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> Result<()> {
        if num == 0 || num > MAX_QUEUE_SIZE as u32 || !num.is_power_of_two() {
            return Err(invalid(&format!("vring {index}: size {num} is not a power of two up to 32768")));
        }
        self.vring(index)?.size = num as u16;
        Ok(())
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        _flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        _log: u64,
    ) -> Result<()> {
        self.vring(index)?.addrs = Some((descriptor, used, available));
        // Restarts a running ring at the new addresses, or starts one that waited for them.
        self.reconcile_or_refuse(index as usize)
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> Result<()> {
        let v = self.vring(index)?;
        if base > u16::MAX as u32 {
            return Err(invalid("vring base out of range"));
        }
        v.base = base as u16;
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> Result<VhostUserVringState> {
        self.vring(index)?;
        let i = index as usize;
        if let Some(base) = rings(&self.port)[i].lock().stop() {
            self.vrings[i].base = base;
        }
        let v = &mut self.vrings[i];
        v.running = false;
        v.kicked = false;
        Ok(VhostUserVringState::new(index, v.base as u32))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        // Kicks are suppressed in the ring while it is polled; a poll thread that goes to
        // sleep (adaptive polling) re-enables them and waits on this fd.
        let v = self.vring(index as u32)?;
        v.kicked = true;
        v.kick = fd;
        self.reconcile_or_refuse(index as usize)
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        let call = match &fd {
            Some(f) => Some(f.try_clone().map_err(Error::ReqHandlerError)?),
            None => None,
        };
        self.vring(index as u32)?.call = fd;
        rings(&self.port)[index as usize].lock().set_call(call);
        Ok(())
    }

    fn set_vring_err(&mut self, index: u8, _fd: Option<File>) -> Result<()> {
        self.vring(index as u32).map(|_| ())
    }

    fn get_protocol_features(&mut self) -> Result<VhostUserProtocolFeatures> {
        Ok(VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK)
    }

    fn set_protocol_features(&mut self, features: u64) -> Result<()> {
        self.protocol = features;
        Ok(())
    }

    fn get_queue_num(&mut self) -> Result<u64> {
        Ok(self.port.rx_queues() as u64)
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> Result<()> {
        self.vring(index)?.enabled = enable;
        self.reconcile_or_refuse(index as usize)
    }

    fn get_config(&mut self, _offset: u32, _size: u32, _flags: VhostUserConfigFlags) -> Result<Vec<u8>> {
        Err(Error::InvalidOperation("get_config"))
    }

    fn set_config(&mut self, _offset: u32, _buf: &[u8], _flags: VhostUserConfigFlags) -> Result<()> {
        Err(Error::InvalidOperation("set_config"))
    }

    fn set_backend_req_fd(&mut self, _backend: Backend) {}

    fn set_gpu_socket(&mut self, _gpu_backend: GpuBackend) -> Result<()> {
        Err(Error::InvalidOperation("gpu"))
    }

    fn get_shared_object(&mut self, _uuid: VhostUserSharedMsg) -> Result<File> {
        Err(Error::InvalidOperation("shared object"))
    }

    fn get_inflight_fd(&mut self, _inflight: &VhostUserInflight) -> Result<(VhostUserInflight, File)> {
        Err(Error::InvalidOperation("inflight"))
    }

    fn set_inflight_fd(&mut self, _inflight: &VhostUserInflight, _file: File) -> Result<()> {
        Err(Error::InvalidOperation("inflight"))
    }

    fn get_max_mem_slots(&mut self) -> Result<u64> {
        Err(Error::InvalidOperation("mem slots"))
    }

    fn add_mem_region(
        &mut self,
        _region: &VhostUserSingleMemoryRegion,
        _fd: File,
        _postcopy: Option<bool>,
    ) -> Result<Option<VhostUserMemoryRegionBase>> {
        Err(Error::InvalidOperation("mem slots"))
    }

    fn remove_mem_region(&mut self, _region: &VhostUserSingleMemoryRegion) -> Result<()> {
        Err(Error::InvalidOperation("mem slots"))
    }

    fn set_device_state_fd(
        &mut self,
        _direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        _fd: File,
    ) -> Result<Option<File>> {
        Err(Error::InvalidOperation("device state"))
    }

    fn check_device_state(&mut self) -> Result<()> {
        Err(Error::InvalidOperation("device state"))
    }

    fn get_shmem_config(&mut self) -> Result<VhostUserShMemConfig> {
        Err(Error::InvalidOperation("shmem"))
    }

    fn set_log_base(&mut self, _log: &VhostUserLog, _file: File) -> Result<()> {
        Err(Error::InvalidOperation("dirty log"))
    }
}

impl Drop for PortBackend {
    fn drop(&mut self) {
        self.stop_all();
    }
}
