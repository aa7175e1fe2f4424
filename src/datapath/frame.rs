//! One frame of a burst, from its source to its destinations: where the sender's bytes are, the
//! switch's own copy of its first bytes (its *front*), and what classify decided.
//!
//! **Classify what is delivered.** A guest's buffers are shared with a guest that may rewrite
//! them at any moment, from another vCPU. So the frame's front (its first [`FRONT`] bytes, or up
//! to [`FRONT_MAX`] for a frame whose offload headers must be checked) is copied out of the
//! sender's buffer once, when classify starts, and from then on every decision reads the copy
//! (port security, NORMAL's addresses, flow fields, VLAN tags, offload headers) and every
//! destination receives the copy followed by the rest of the sender's buffer. A byte a policy
//! read is the byte delivered; a sender that rewrites its buffer later changes only bytes no
//! decision read (its own payload). The sender's buffers are private to this module: no other
//! stage can read a frame's bytes except through [`Frame::read_at`], [`Frame::copy_to`] and
//! [`Frame::sum`], which take the front from the copy.

use super::counters::DropReason;
use crate::flow::{MAX_PATH, PacketKey};
use crate::mem::Segs;
use crate::mem::segs::copy_slice;
use crate::wire::checksum::Sum;
use crate::wire::gso::{self, Offload};

/// Bytes of a frame copied into the switch before classify reads any: one cache line, as deep
/// as flows read (`flow::Depth::L4` reads 64), and more than a rewritten Ethernet header takes.
pub const FRONT: usize = 64;
/// The front of a frame asking for offloads: its headers, up to TSO's longest.
pub const FRONT_MAX: usize = gso::MAX_HDR.next_multiple_of(16);

/// [`Frame::vlan`] of a frame that leaves every port as it came (no VLANs, or not NORMAL).
pub const NO_VLAN: u16 = u16::MAX;

/// [`Frame::ct`]'s bit for a tracked frame.
pub const CT_SEEN: u32 = 1 << 31;

/// [`Frame::ct`] of a frame tracked in `zone` with `state`.
#[inline]
pub fn ct_seen(zone: u16, state: u8) -> u32 {
    CT_SEEN | (zone as u32) << 8 | state as u32
}

/// One frame of a burst, from the source it was taken from to its destinations. Its sender's
/// buffers are borrowed for `'m` from what they came from (a guest's ring under its lock, a
/// NIC's burst): a frame cannot outlive them.
pub(super) struct Frame<'m> {
    /// Its descriptor chain's head (a guest's), or its index in the NIC burst.
    pub head: u16,
    /// The sender's buffers: only this module reads them (see the module's comment).
    segs: Segs<'m>,
    /// Offset of the Ethernet frame in `segs` (the sender's virtio-net header length).
    pub data_off: u32,
    /// Ethernet frame length.
    pub len: u32,
    /// How many of the frame's first bytes `front` holds.
    front_len: u32,
    /// What the sender's virtio-net header asked for (checksum, segmentation), checked.
    pub off: Offload,
    /// The NIC it came from verified its TCP/UDP checksum (guests that negotiated
    /// GUEST_CSUM get it marked DATA_VALID). Never set for a guest's frame.
    pub valid: bool,
    pub out: Out,
    /// Its VLAN, as NORMAL switched it on a switch with VLANs (each destination then gets it
    /// tagged or not as that port sends it); [`NO_VLAN`]: it leaves as it came.
    pub vlan: u16,
    /// Its outer 802.1Q tag's TCI as it arrived (None: untagged), recorded with `vlan`: how
    /// each destination's tagging compares with it.
    pub tag: Option<u16>,
    /// Where it stands with the flow table (the flow it hit is counted once it is consumed).
    pub flow: FlowState,
    /// From classify's first pass for its second: the frame's flow key under the table's
    /// scope, and the key's hash (set only for a `Pending` frame).
    pub key: PacketKey,
    pub hash: u64,
    /// For `Out::Path`: the flows its walk through the tables met (`pipeline.rs`).
    pub path: Path,
    /// What the connection tracker last said of it, for a live trace: 0 if it was not
    /// tracked, else [`CT_SEEN`] | zone << 8 | `ct_state` (a `ct` action's, or a security
    /// group's check).
    pub ct: u32,
    /// The switch's copy of the frame's first `front_len` bytes.
    front: Front,
}

/// The front's bytes, on cache lines of their own: the usual 64-byte copy is one line.
#[repr(C, align(64))]
struct Front([u8; FRONT_MAX]);

impl Default for Frame<'_> {
    fn default() -> Self {
        Frame {
            head: 0,
            segs: Segs::default(),
            data_off: 0,
            len: 0,
            front_len: 0,
            off: Offload::NONE,
            valid: false,
            out: Out::Nowhere,
            vlan: NO_VLAN,
            tag: None,
            flow: FlowState::Unmatched,
            key: PacketKey::default(),
            hash: 0,
            path: Path::default(),
            ct: 0,
            front: Front([0; FRONT_MAX]),
        }
    }
}

/// A poll thread's frames, reused from visit to visit: lent to each visit for as long as it
/// borrows its source, emptied first, and unreadable between loans.
#[derive(Default)]
pub(super) struct Frames(Vec<Frame<'static>>);

impl Frames {
    pub fn new(n: usize) -> Frames {
        Frames((0..n).map(|_| Frame::default()).collect())
    }

    /// How many frames one loan may hold.
    pub fn capacity(&self) -> usize {
        self.0.len()
    }

    /// Lends the first `n` frames (at most all) for `'m`, their sender's buffers forgotten.
    #[inline]
    pub fn lend<'m>(&'m mut self, n: usize) -> &'m mut [Frame<'m>] {
        let n = n.min(self.0.len());
        for f in &mut self.0[..n] {
            f.segs.clear();
        }
        let v: &'m mut [Frame<'static>] = &mut self.0[..n];
        // SAFETY: `Frame<'static>` and `Frame<'m>` differ only in the lifetime of their `Segs`'
        // PhantomData, so they have one layout. Every frame's segments were emptied above: no
        // pointer from an earlier loan survives into this one. The frames are reachable only
        // through `lend`, so what is stored during this loan (valid for `'m`) is never read
        // after it.
        // The cast changes only a lifetime, which clippy does not see.
        #[allow(clippy::unnecessary_cast)]
        unsafe {
            &mut *(v as *mut [Frame<'static>] as *mut [Frame<'m>])
        }
    }
}

impl<'m> Frame<'m> {
    /// Where port rx puts the sender's buffers (a popped chain, or a NIC's mbuf).
    #[inline(always)]
    pub fn source_mut(&mut self) -> &mut Segs<'m> {
        &mut self.segs
    }

    /// Makes the switch's own bytes `b` the frame's source (an announcement it sends on a
    /// port's behalf), as a NIC's mbuf is.
    #[inline]
    pub fn source_bytes(&mut self, b: &'m [u8]) {
        // SAFETY: `b` is borrowed, unwritten, for `'m`, as long as the frame may use its
        // segments. Nothing writes through a frame's source: this module, the only one that
        // reaches it, only reads it (`take_front`, `copy_to` as the copy's source, `read_at`,
        // `sum`, `prefetch`).
        unsafe { self.segs.set_host(b.as_ptr(), b.len() as u32) };
    }

    /// Places the Ethernet frame after the sender's `hdr_len`-byte virtio-net header, and
    /// forgets the previous front.
    #[inline(always)]
    pub fn place(&mut self, hdr_len: u32) {
        self.data_off = hdr_len;
        self.len = self.segs.len().saturating_sub(hdr_len);
        self.front_len = 0;
    }

    /// Starts loading the sender's line at `off` (where the front will be copied from).
    #[inline(always)]
    pub fn prefetch(&self, off: u32) {
        self.segs.prefetch(off);
    }

    /// The sender's virtio-net header's first `N` bytes (read once by classify into a local).
    #[inline]
    pub fn sender_header<const N: usize>(&self) -> Option<[u8; N]> {
        self.segs.read_array::<N>(0)
    }

    /// Copies the frame's first `min(len, want)` bytes (`want` at most [`FRONT_MAX`]) from the
    /// sender into the front: from here on, every decision reads them from the copy. Once a
    /// frame is placed (`place`), its front is taken once: classify copies the fronts of a
    /// burst before it reads any.
    #[inline(always)]
    pub fn take_front(&mut self, want: usize) {
        if self.front_len > 0 {
            return;
        }
        let n = (self.len as usize).min(want);
        self.front_len = self.segs.read_at(self.data_off, &mut self.front.0[..n]) as u32;
    }

    /// Makes the front at least `want` bytes long (at most [`FRONT_MAX`] and the frame's
    /// length), copying the bytes after what it holds: a decision that finds it must read
    /// deeper (an L4 field behind IPv4 options) reads them from the copy too.
    #[cold]
    pub fn deepen_front(&mut self, want: usize) {
        let (have, n) = (self.front_len as usize, (self.len as usize).min(want).min(FRONT_MAX));
        if n > have {
            let got = self.segs.read_at(self.data_off + have as u32, &mut self.front.0[have..n]);
            self.front_len = (have + got) as u32;
        }
    }

    /// The front: the frame's first bytes as the switch holds them.
    #[inline(always)]
    pub fn front(&self) -> &[u8] {
        &self.front.0[..self.front_len as usize]
    }

    /// The `N` bytes at `off` of the front, if it holds them.
    #[inline(always)]
    pub fn front_at<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        let end = off.checked_add(N)?;
        if end > self.front_len as usize {
            return None;
        }
        let mut a = [0u8; N];
        a.copy_from_slice(self.front.0.get(off..end)?);
        Some(a)
    }

    /// Copies `n` bytes of the frame from offset `off` into `dst` at `dst_off`: those in the
    /// front from the switch's copy, the rest from the sender's buffers. Returns bytes copied.
    ///
    /// A frame that lies within its front (64 bytes, the usual small frame) is copied from the
    /// front alone: no guest memory is read again. A longer one is copied in two pieces, the
    /// rest from the sender first and then the front over the bytes before it: that order
    /// costs about what one copy of the whole frame does, where the front first and then the
    /// rest cost 45 switch cycles a 1518-byte frame more (docs/benchmark-history.md, "The
    /// front copy against the build before it (issue 29's floor)").
    #[inline(always)]
    pub fn copy_to(&self, dst: &Segs<'_>, dst_off: u32, off: u32, n: u32) -> u32 {
        let front = self.front_len;
        if off.saturating_add(n) <= front {
            return dst.write_at(dst_off, &self.front.0[off as usize..(off + n) as usize]) as u32;
        }
        if off >= front {
            return dst.copy_from(dst_off, &self.segs, self.data_off + off, n);
        }
        let k = front - off;
        let rest = dst.copy_from(dst_off + k, &self.segs, self.data_off + front, n - k);
        let head = dst.write_at(dst_off, &self.front.0[off as usize..front as usize]) as u32;
        if head < k { head } else { k + rest }
    }

    /// Reads the frame's bytes from `off` into `out` as [`Frame::copy_to`] takes them; returns
    /// how many (fewer if the frame is shorter).
    #[inline(always)]
    pub fn read_at(&self, off: u32, out: &mut [u8]) -> usize {
        let mut done = 0;
        if off < self.front_len {
            let k = ((self.front_len - off) as usize).min(out.len());
            copy_slice(&mut out[..k], &self.front.0[off as usize..off as usize + k]);
            done = k;
        }
        if done < out.len() {
            let end = (self.len.saturating_sub(off) as usize).min(out.len());
            if done < end {
                done += self.segs.read_at(self.data_off + off + done as u32, &mut out[done..end]);
            }
        }
        done
    }

    /// The Internet checksum sum of the frame's `len` bytes at `off`, over the bytes
    /// [`Frame::copy_to`] delivers.
    pub fn sum(&self, off: u32, len: u32) -> Sum {
        let mut s = Sum::new();
        let end = off.saturating_add(len).min(self.len);
        let mut at = off;
        if at < self.front_len {
            let k = self.front_len.min(end);
            s.add_bytes(&self.front.0[at as usize..k as usize]);
            at = k;
        }
        if at < end {
            self.segs.add_to_sum(&mut s, self.data_off + at, end - at);
        }
        s
    }
}

/// A frame as it leaves the switch: `prefix` (rewritten Ethernet addresses and VLAN tags, a
/// segment's headers, or nothing) followed by at most `take` bytes of the sender's frame from
/// byte `skip` on, with `patch` (an offset in what is written, and a 16-bit value: a checksum
/// completed here) stored over them.
#[derive(Clone, Copy)]
pub(super) struct Shape<'a> {
    pub prefix: &'a [u8],
    pub skip: u32,
    pub take: u32,
    pub patch: Option<(u32, u16)>,
}

impl Shape<'_> {
    /// Bytes of the sender's frame `f` this shape sends.
    #[inline]
    pub fn body_len(&self, f: &Frame<'_>) -> u32 {
        (f.len - self.skip).min(self.take)
    }
}

/// The frame as it came.
pub(super) const AS_IS: Shape = Shape { prefix: &[], skip: 0, take: u32::MAX, patch: None };

/// Where a frame goes, once classified.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Out {
    /// Goes nowhere, and that is no drop (its destination is the port it came from).
    Nowhere,
    /// Dropped, counted for this reason once the frame is consumed.
    Drop(DropReason),
    Port(u16),
    Flood,
    /// Run flow `.0`'s action list.
    Actions(u32),
    /// Between classify and the pipeline stage: flow `.0` (table 0's) goes on to other tables
    /// or the tracker (`pipeline.rs`), which replaces this with where the frame goes.
    Pipeline(u32),
    /// Run the action lists of the flows the frame met (`Frame::path`; `.0` is the first).
    Path(u32),
    /// Routed (`route/`) to port `.0`, neighbour `.1` of the plan's routes: written with
    /// new addresses and TTL, in the VLAN `Frame::vlan` now says.
    Routed(u16, u16),
    /// Answered by the switch (`route/`: an ARP request or a solicitation for a gateway, an
    /// echo request to it, an ICMP error): the answer goes back to the sender.
    Answer,
}

/// Where a frame stands with the flow table, from classify's first pass to its counting.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FlowState {
    /// No flow decides it: there is no flow table (NORMAL), or it was dropped before a
    /// lookup. Nothing is counted on a flow.
    Unmatched,
    /// Between classify's two passes: its key (`Frame::key`, `Frame::hash`) waits for the lookup.
    Pending,
    /// Between classify's two passes: its key is the previous pending frame's (not stored
    /// again), so it takes that frame's flow.
    Repeat,
    /// It hit the table's flow `.0`, or none (`NO_MATCH`, counted as a miss).
    Hit(u32),
}

/// The flows a frame's walk met, in the order it met them (`NO_MATCH` where a table had none),
/// for tx to run (`Out::Path`; `pipeline.rs` records them).
#[derive(Clone, Copy, Default)]
pub(super) struct Path {
    n: u8,
    flows: [u32; MAX_PATH],
}

impl Path {
    /// The flows, in the order met.
    pub fn flows(&self) -> &[u32] {
        &self.flows[..self.n as usize]
    }

    /// Adds flow `i` (or `NO_MATCH`); false if the path holds `MAX_PATH` already.
    pub fn push(&mut self, i: u32) -> bool {
        let Some(slot) = self.flows.get_mut(self.n as usize) else { return false };
        *slot = i;
        self.n += 1;
        true
    }
}
