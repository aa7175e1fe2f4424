//! A poll thread's NIC receive burst (`NicRx`): the mbufs received from a NIC queue while its
//! frames are switched, their data the frames' sources (`Segs::set_host`), and the source that
//! hands them to a visit (`NicQueue`). Without the cargo feature `dpdk` `NicRx` is empty and no
//! NIC port exists.

use super::source::Source;
use crate::datapath::frame::Frame;
use crate::datapath::tx::delivery::Delivery;
use crate::port::nic::NicPort;
use crate::vring::RingError;

#[cfg(feature = "dpdk")]
pub use imp::*;
#[cfg(not(feature = "dpdk"))]
pub use stub::*;

#[cfg(feature = "dpdk")]
mod imp {
    use crate::mem::Segs;
    use crate::port::dpdk::MbufBurst;
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
        /// Returns whether the device verified the frame's TCP/UDP checksum as good.
        #[inline]
        pub fn source(&self, i: usize, segs: &mut Segs) -> bool {
            let m = &self.burst.as_slice()[i];
            let d: &[u8] = if m.nb_segs() == 1 { m.data() } else { &[] };
            // SAFETY: the mbuf is owned by `self.burst` and neither freed nor written until
            // `clear`, which the caller runs only after the frames pointing here are delivered
            // (they are only read: classify, copy into guest buffers or new mbufs).
            unsafe { segs.set_host(d.as_ptr(), d.len() as u32) };
            m.rx_l4_checksum_good()
        }

        /// Frees the burst's mbufs (their frames have been copied wherever they went).
        #[inline]
        pub fn clear(&mut self) {
            self.burst.clear();
        }

        /// Frame `i`'s bytes, to rewrite in place (decapsulation); empty for a chained mbuf.
        #[inline]
        pub fn frame_mut(&mut self, i: usize) -> &mut [u8] {
            let m = &mut self.burst.as_mut_slice()[i];
            if m.nb_segs() == 1 { m.data_mut() } else { &mut [] }
        }

        /// Points `segs` at `len` bytes of frame `i`'s data from byte `off` on (a
        /// decapsulated inner frame).
        #[inline]
        pub fn source_from(&self, i: usize, off: usize, len: usize, segs: &mut Segs) {
            let m = &self.burst.as_slice()[i];
            let d: &[u8] = if m.nb_segs() == 1 { m.data().get(off..off + len).unwrap_or(&[]) } else { &[] };
            // SAFETY: as in `source`: the mbuf stays owned, unfreed and unwritten until `clear`.
            unsafe { segs.set_host(d.as_ptr(), d.len() as u32) };
        }
    }
}

#[cfg(not(feature = "dpdk"))]
mod stub {
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
        pub fn source(&self, _: usize, _: &mut Segs) -> bool {
            false
        }
        pub fn clear(&mut self) {}
        pub fn frame_mut(&mut self, _: usize) -> &mut [u8] {
            &mut []
        }
        pub fn source_from(&self, _: usize, _: usize, _: usize, _: &mut Segs) {}
    }
}

/// A NIC receive queue: frames are the mbufs of one burst, freed once delivered.
pub(in crate::datapath) struct NicQueue<'a> {
    pub nic: &'a NicPort,
    pub queue: usize,
    pub rx: &'a mut NicRx,
}

impl<'a> Source<'a> for NicQueue<'a> {
    #[inline]
    fn ready(&mut self, max: usize) -> Result<usize, RingError> {
        Ok(self.rx.receive(self.nic, self.queue, max).unwrap_or(0))
    }

    #[inline]
    fn take<'s>(&mut self, frames: &mut [Frame<'s>]) -> (usize, Option<RingError>)
    where
        'a: 's,
    {
        for (i, f) in frames.iter_mut().enumerate() {
            f.valid = self.rx.source(i, f.source_mut());
            f.head = i as u16;
        }
        (frames.len(), None)
    }

    #[inline]
    fn complete(&mut self, _: &[Frame<'_>], _: usize, _: &mut Delivery) {
        self.rx.clear();
    }
}
