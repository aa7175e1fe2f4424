//! A poll thread's own state for NIC queues: the burst of mbufs received from a NIC while its
//! frames are switched (`NicRx`), and one pending transmit burst per NIC port (`TxBatches`),
//! flushed with one `tx_burst` when full, at the end of each delivery and of each loop
//! iteration. Without the cargo feature `dpdk` both are empty and no NIC port exists.

#[cfg(feature = "dpdk")]
pub use imp::*;
#[cfg(not(feature = "dpdk"))]
pub use stub::*;

#[cfg(feature = "dpdk")]
mod imp {
    use super::super::counters::{Drop, PortCounters, ThreadStats, bump};
    use super::super::plan::PortTable;
    use crate::mem::Segs;
    use crate::port::dpdk::{self, MbufBurst};
    use crate::port::nic::NicPort;

    /// A poll thread's burst of mbufs received from a NIC queue, while it is switched.
    #[derive(Default)]
    pub struct NicRx {
        burst: MbufBurst,
    }

    impl NicRx {
        /// Receives up to `max` frames from queue `q` of `nic` (the burst must be empty).
        /// None if another thread holds the queue (a plan change in flight).
        #[inline]
        pub fn receive(&mut self, nic: &NicPort, q: usize, max: usize) -> Option<usize> {
            nic.rx(q, &mut self.burst, max)
        }

        /// Points `segs` at frame `i`'s data, as the frame's source. A chained mbuf (the
        /// driver scattered a frame over several) gets no data and is dropped as a runt.
        #[inline]
        pub fn source(&self, i: usize, segs: &mut Segs) {
            let m = &self.burst.as_slice()[i];
            let d: &[u8] = if m.nb_segs() == 1 { m.data() } else { &[] };
            // SAFETY: the mbuf is owned by `self.burst` and neither freed nor written until
            // `clear`, which the caller runs only after the frames pointing here are delivered
            // (they are only read: classify, copy into guest buffers or new mbufs).
            unsafe { segs.set_host(d.as_ptr(), d.len() as u32) };
        }

        /// Frees the burst's mbufs (their frames have been copied wherever they went).
        #[inline]
        pub fn clear(&mut self) {
            self.burst.clear();
        }
    }

    /// One NIC port's pending transmit burst, and fresh mbufs for it.
    #[derive(Default)]
    struct Batch {
        burst: MbufBurst,
        spare: MbufBurst,
    }

    /// A poll thread's pending transmit bursts, one per NIC port (by port id).
    #[derive(Default)]
    pub struct TxBatches {
        batches: Vec<Option<Box<Batch>>>,
        /// Ports with frames waiting.
        dirty: Vec<u16>,
    }

    impl TxBatches {
        /// Copies a frame (`prefix`, then `len` bytes of `src` from `off`, then `patch`'s value
        /// stored at its offset: a checksum completed) into a new mbuf and queues it for NIC
        /// port `id`; a full batch is sent at once.
        #[inline]
        #[allow(clippy::too_many_arguments)]
        pub fn write(
            &mut self,
            id: u16,
            nic: &NicPort,
            thread: usize,
            pc: &PortCounters,
            src: &Segs,
            off: u32,
            len: u32,
            prefix: &[u8],
            patch: Option<(u32, u16)>,
        ) -> Result<u32, Drop> {
            let total = prefix.len() + len as usize;
            let i = id as usize;
            if self.batches.len() <= i {
                self.batches.resize_with(i + 1, || None);
            }
            let Batch { burst: b, spare } = &mut **self.batches[i].get_or_insert_with(Default::default);
            // Mbufs come from the pool a burst at a time.
            if spare.is_empty() && spare.alloc(nic.pool(), dpdk::BURST).is_err() {
                return Err(Drop::NicTxFull);
            }
            let Some(mut m) = spare.pop() else { return Err(Drop::NicTxFull) };
            let Some(room) = u16::try_from(total).ok().and_then(|t| m.append(t)) else {
                let _ = spare.push(m);
                return Err(Drop::Mtu);
            };
            room[..prefix.len()].copy_from_slice(prefix);
            src.read_at(off, &mut room[prefix.len()..]);
            if let Some((at, v)) = patch
                && let Some(field) = room.get_mut(at as usize..at as usize + 2)
            {
                field.copy_from_slice(&v.to_be_bytes());
            }
            if b.is_empty() {
                self.dirty.push(id);
            }
            let _ = b.push(m);
            if b.is_full() {
                flush_one(b, nic, thread, pc);
                self.dirty.retain(|&d| d != id);
            }
            Ok(total as u32)
        }

        #[inline]
        pub fn is_empty(&self) -> bool {
            self.dirty.is_empty()
        }

        /// Sends every pending batch with one tx_burst each.
        #[inline]
        pub fn flush(&mut self, ports: &PortTable, thread: usize, st: &ThreadStats) {
            for id in self.dirty.drain(..) {
                let Some(b) = self.batches[id as usize].as_mut().map(|b| &mut b.burst) else { continue };
                let pc = &st.ports[id as usize];
                match ports.get(id).and_then(|p| p.nic()) {
                    Some(nic) => flush_one(b, nic, thread, pc),
                    None => {
                        pc.drop(Drop::PortDown, b.len() as u64);
                        b.clear();
                    }
                }
            }
        }
    }

    /// One tx_burst; what the driver did not take is freed and counted `nic_tx_full`.
    #[inline]
    fn flush_one(b: &mut MbufBurst, nic: &NicPort, thread: usize, pc: &PortCounters) {
        let n = b.len();
        let bytes: u64 = b.iter().map(|m| m.len() as u64).sum();
        let sent = nic.send(thread, b);
        let left: u64 = b.iter().map(|m| m.len() as u64).sum();
        b.clear();
        bump(&pc.tx_batches, (sent > 0) as u64);
        bump(&pc.tx_packets, sent as u64);
        bump(&pc.tx_bytes, bytes - left);
        if sent < n {
            pc.drop(Drop::NicTxFull, (n - sent) as u64);
        }
    }
}

#[cfg(not(feature = "dpdk"))]
mod stub {
    use super::super::counters::{Drop, PortCounters, ThreadStats};
    use super::super::plan::PortTable;
    use crate::mem::Segs;
    use crate::port::nic::NicPort;

    #[derive(Default)]
    pub struct NicRx {
        _none: (),
    }

    impl NicRx {
        pub fn receive(&mut self, nic: &NicPort, _: usize, _: usize) -> Option<usize> {
            match *nic {}
        }
        pub fn source(&self, _: usize, _: &mut Segs) {}
        pub fn clear(&mut self) {}
    }

    #[derive(Default)]
    pub struct TxBatches {
        _none: (),
    }

    impl TxBatches {
        #[allow(clippy::too_many_arguments)]
        pub fn write(
            &mut self,
            _: u16,
            nic: &NicPort,
            _: usize,
            _: &PortCounters,
            _: &Segs,
            _: u32,
            _: u32,
            _: &[u8],
            _: Option<(u32, u16)>,
        ) -> Result<u32, Drop> {
            match *nic {}
        }
        pub fn is_empty(&self) -> bool {
            true
        }
        pub fn flush(&mut self, _: &PortTable, _: usize, _: &ThreadStats) {}
    }
}
