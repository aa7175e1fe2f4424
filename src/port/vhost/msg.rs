//! The vhost-user protocol's messages (QEMU's docs/interop/vhost-user.rst), as far as a
//! net backend needs them: the 12-byte header, the limits a message must keep (payload size,
//! file descriptors), and each request parsed from its payload. Pure code: the bytes and fds
//! come from the control loop, which owns the socket (`control::vhost`), and the parsed
//! request goes to the port's `Backend`.
//!
//! Everything is little-endian. Header: request (u32), flags (u32: version 1 in bits 0-1,
//! REPLY in bit 2, NEED_REPLY in bit 3), payload size (u32).

use std::fmt;

use crate::mem::RegionDesc;

pub const HEADER_LEN: usize = 12;
/// Most regions one SET_MEM_TABLE carries (VHOST_MEMORY_BASELINE_NREGIONS).
pub const MAX_MEM_REGIONS: usize = crate::config::MAX_MEMORY_REGIONS as usize;
/// Most file descriptors any message carries (SET_MEM_TABLE's, one per region).
pub const MAX_FDS: usize = MAX_MEM_REGIONS;
/// The largest payload accepted for a request pvswitchd does not know: it is read (so the
/// stream stays framed) and refused.
pub const MAX_UNKNOWN_PAYLOAD: u32 = 4096;

const VERSION: u32 = 0x1;
const VERSION_MASK: u32 = 0x3;
const FLAG_REPLY: u32 = 0x4;
const FLAG_NEED_REPLY: u32 = 0x8;
/// In the u64 of SET_VRING_KICK/CALL/ERR: no fd comes with the message (polling mode).
const VRING_NOFD: u64 = 0x100;
/// In SET_VRING_ADDR's flags: log the used ring's writes at `log_guest_addr`.
pub const VRING_F_LOG: u32 = 0x1;

/// Front-end request codes.
pub mod code {
    pub const GET_FEATURES: u32 = 1;
    pub const SET_FEATURES: u32 = 2;
    pub const SET_OWNER: u32 = 3;
    pub const RESET_OWNER: u32 = 4;
    pub const SET_MEM_TABLE: u32 = 5;
    pub const SET_LOG_BASE: u32 = 6;
    pub const SET_LOG_FD: u32 = 7;
    pub const SET_VRING_NUM: u32 = 8;
    pub const SET_VRING_ADDR: u32 = 9;
    pub const SET_VRING_BASE: u32 = 10;
    pub const GET_VRING_BASE: u32 = 11;
    pub const SET_VRING_KICK: u32 = 12;
    pub const SET_VRING_CALL: u32 = 13;
    pub const SET_VRING_ERR: u32 = 14;
    pub const GET_PROTOCOL_FEATURES: u32 = 15;
    pub const SET_PROTOCOL_FEATURES: u32 = 16;
    pub const GET_QUEUE_NUM: u32 = 17;
    pub const SET_VRING_ENABLE: u32 = 18;
    pub const SEND_RARP: u32 = 19;
    pub const NET_SET_MTU: u32 = 20;
    pub const SET_BACKEND_REQ_FD: u32 = 21;
    pub const GET_CONFIG: u32 = 24;
    pub const SET_CONFIG: u32 = 25;
    pub const GET_INFLIGHT_FD: u32 = 31;
    pub const SET_INFLIGHT_FD: u32 = 32;
    pub const GET_MAX_MEM_SLOTS: u32 = 36;
    pub const ADD_MEM_REG: u32 = 37;
    pub const REM_MEM_REG: u32 = 38;
    pub const SET_STATUS: u32 = 39;
    pub const GET_STATUS: u32 = 40;
}

/// Protocol feature bits (GET/SET_PROTOCOL_FEATURES).
pub mod protocol {
    pub const MQ: u64 = 1 << 0;
    /// The dirty log comes as a shared-memory fd (SET_LOG_BASE): live migration.
    pub const LOG_SHMFD: u64 = 1 << 1;
    /// The frontend may ask the backend to announce a migrated guest (SEND_RARP).
    pub const RARP: u64 = 1 << 2;
    pub const REPLY_ACK: u64 = 1 << 3;
}

/// A message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub request: u32,
    pub flags: u32,
    pub size: u32,
}

impl Header {
    pub fn parse(b: &[u8; HEADER_LEN]) -> Header {
        let w = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        Header { request: w(0), flags: w(4), size: w(8) }
    }

    pub fn need_reply(&self) -> bool {
        self.flags & FLAG_NEED_REPLY != 0
    }

    /// Checks what the header alone tells: version 1, not a reply, a payload no larger than
    /// the request can have.
    pub fn check(&self) -> Result<(), Error> {
        if self.flags & VERSION_MASK != VERSION {
            return Err(Error::Version(self.flags));
        }
        if self.flags & FLAG_REPLY != 0 {
            return Err(Error::Reply(self.request));
        }
        let max = max_payload(self.request);
        if self.size > max {
            return Err(Error::Size { request: self.request, size: self.size, max });
        }
        Ok(())
    }
}

/// The largest payload `request` may carry.
pub fn max_payload(request: u32) -> u32 {
    use code::*;
    match request {
        GET_FEATURES
        | SET_OWNER
        | RESET_OWNER
        | GET_PROTOCOL_FEATURES
        | GET_QUEUE_NUM
        | GET_MAX_MEM_SLOTS
        | GET_STATUS => 8,
        SET_FEATURES
        | SET_PROTOCOL_FEATURES
        | SET_VRING_KICK
        | SET_VRING_CALL
        | SET_VRING_ERR
        | SET_LOG_FD
        | SEND_RARP
        | NET_SET_MTU
        | SET_BACKEND_REQ_FD
        | SET_STATUS => 8,
        SET_VRING_NUM | SET_VRING_BASE | GET_VRING_BASE | SET_VRING_ENABLE => 8,
        SET_VRING_ADDR => 40,
        SET_LOG_BASE => 16,
        SET_MEM_TABLE => 8 + 32 * MAX_MEM_REGIONS as u32,
        _ => MAX_UNKNOWN_PAYLOAD,
    }
}

/// A request, parsed from a whole message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    GetFeatures,
    SetFeatures(u64),
    SetOwner,
    ResetOwner,
    SetMemTable(Vec<RegionDesc>),
    SetVringNum {
        index: u32,
        num: u32,
    },
    SetVringAddr {
        index: u32,
        desc: u64,
        used: u64,
        avail: u64,
        /// The guest address the used ring's writes are logged at, if VRING_F_LOG is set.
        log: Option<u64>,
    },
    /// SET_LOG_BASE: the dirty log is `size` bytes at `offset` of the fd that came with it.
    SetLogBase {
        size: u64,
        offset: u64,
    },
    SetVringBase {
        index: u32,
        base: u32,
    },
    GetVringBase {
        index: u32,
    },
    /// SET_VRING_KICK (`Kick`), SET_VRING_CALL (`Call`), SET_VRING_ERR (`Err`): `fd` says whether
    /// an fd comes with it.
    SetVringFd {
        which: VringFd,
        index: u8,
        fd: bool,
    },
    GetProtocolFeatures,
    SetProtocolFeatures(u64),
    GetQueueNum,
    /// SEND_RARP: announce the guest's MAC (a migrated VM whose guest cannot announce itself).
    SendRarp([u8; 6]),
    SetVringEnable {
        index: u32,
        enable: bool,
    },
    /// A request pvswitchd does not implement (nor offer the feature for).
    Unsupported(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VringFd {
    Kick,
    Call,
    Err,
}

/// Why a message is refused (and its connection closed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    Version(u32),
    Reply(u32),
    Size {
        request: u32,
        size: u32,
        max: u32,
    },
    /// The payload is not what the request's layout needs.
    Payload {
        request: u32,
        size: usize,
    },
    Fds {
        request: u32,
        got: usize,
        want: usize,
    },
    TooManyRegions(u32),
    Value(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Version(flags) => write!(f, "message flags {flags:#x}: not protocol version 1"),
            Error::Reply(r) => write!(f, "request {r} flagged as a reply"),
            Error::Size { request, size, max } => {
                write!(f, "request {request} with a {size}-byte payload (at most {max})")
            }
            Error::Payload { request, size } => write!(f, "request {request}: malformed {size}-byte payload"),
            Error::Fds { request, got, want } => {
                write!(f, "request {request} carries {got} file descriptors (it takes {want})")
            }
            Error::TooManyRegions(n) => write!(f, "memory table of {n} regions (at most {MAX_MEM_REGIONS})"),
            Error::Value(s) => f.write_str(s),
        }
    }
}

fn u32_at(p: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(p[i..i + 4].try_into().unwrap())
}

fn u64_at(p: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(p[i..i + 8].try_into().unwrap())
}

/// Parses a whole message: its header, payload and the number of fds that came with it.
/// Checks the payload's layout and that exactly the fds the request takes came with it.
/// Long because it is one arm per vhost-user request (the protocol's table), each a few lines.
pub fn parse(h: &Header, p: &[u8], nfds: usize) -> Result<Request, Error> {
    use code::*;
    let need =
        |len: usize| if p.len() >= len { Ok(()) } else { Err(Error::Payload { request: h.request, size: p.len() }) };
    let fds = |want: usize| if nfds == want { Ok(()) } else { Err(Error::Fds { request: h.request, got: nfds, want }) };
    let r = match h.request {
        GET_FEATURES => Request::GetFeatures,
        SET_FEATURES => {
            need(8)?;
            Request::SetFeatures(u64_at(p, 0))
        }
        SET_OWNER => Request::SetOwner,
        RESET_OWNER => Request::ResetOwner,
        SET_MEM_TABLE => {
            need(8)?;
            let n = u32_at(p, 0);
            if n as usize > MAX_MEM_REGIONS {
                return Err(Error::TooManyRegions(n));
            }
            need(8 + 32 * n as usize)?;
            fds(n as usize)?;
            let regions = (0..n as usize)
                .map(|i| {
                    let o = 8 + 32 * i;
                    RegionDesc {
                        guest_phys_addr: u64_at(p, o),
                        size: u64_at(p, o + 8),
                        user_addr: u64_at(p, o + 16),
                        mmap_offset: u64_at(p, o + 24),
                    }
                })
                .collect();
            return Ok(Request::SetMemTable(regions));
        }
        SET_VRING_NUM | SET_VRING_BASE | GET_VRING_BASE | SET_VRING_ENABLE => {
            need(8)?;
            let (index, num) = (u32_at(p, 0), u32_at(p, 4));
            match h.request {
                SET_VRING_NUM => Request::SetVringNum { index, num },
                SET_VRING_BASE => Request::SetVringBase { index, base: num },
                GET_VRING_BASE => Request::GetVringBase { index },
                _ if num > 1 => return Err(Error::Value(format!("SET_VRING_ENABLE {index}: state {num}"))),
                _ => Request::SetVringEnable { index, enable: num == 1 },
            }
        }
        SET_VRING_ADDR => {
            need(40)?;
            let log = (u32_at(p, 4) & VRING_F_LOG != 0).then(|| u64_at(p, 32));
            Request::SetVringAddr {
                index: u32_at(p, 0),
                desc: u64_at(p, 8),
                used: u64_at(p, 16),
                avail: u64_at(p, 24),
                log,
            }
        }
        SET_LOG_BASE => {
            need(16)?;
            fds(1)?;
            return Ok(Request::SetLogBase { size: u64_at(p, 0), offset: u64_at(p, 8) });
        }
        SET_VRING_KICK | SET_VRING_CALL | SET_VRING_ERR => {
            need(8)?;
            let v = u64_at(p, 0);
            let fd = v & VRING_NOFD == 0;
            fds(fd as usize)?;
            let which = match h.request {
                SET_VRING_KICK => VringFd::Kick,
                SET_VRING_CALL => VringFd::Call,
                _ => VringFd::Err,
            };
            return Ok(Request::SetVringFd { which, index: v as u8, fd });
        }
        GET_PROTOCOL_FEATURES => Request::GetProtocolFeatures,
        SET_PROTOCOL_FEATURES => {
            need(8)?;
            Request::SetProtocolFeatures(u64_at(p, 0))
        }
        GET_QUEUE_NUM => Request::GetQueueNum,
        SEND_RARP => {
            need(8)?;
            Request::SendRarp(p[..6].try_into().unwrap())
        }
        other => {
            // Its fds are closed when the message is dropped; the request is refused.
            return Ok(Request::Unsupported(other));
        }
    };
    fds(0)?;
    Ok(r)
}

/// A reply to `h` with `body` (a u64 or a vring state).
pub fn reply(h: &Header, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&h.request.to_le_bytes());
    out.extend_from_slice(&(VERSION | FLAG_REPLY).to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// The body of a vring state reply.
pub fn vring_state(index: u32, num: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0..4].copy_from_slice(&index.to_le_bytes());
    b[4..8].copy_from_slice(&num.to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(request: u32, size: u32) -> Header {
        Header { request, flags: VERSION, size }
    }

    #[test]
    fn header_limits() {
        let h = Header::parse(&[5, 0, 0, 0, 9, 0, 0, 0, 8, 1, 0, 0]);
        assert_eq!(h, Header { request: 5, flags: 9, size: 264 });
        assert!(h.need_reply());
        assert_eq!(h.check(), Ok(()));
        assert!(matches!(hdr(5, 265).check(), Err(Error::Size { max: 264, .. })));
        assert!(matches!(hdr(1, 9).check(), Err(Error::Size { .. })));
        assert!(matches!(hdr(999, MAX_UNKNOWN_PAYLOAD + 1).check(), Err(Error::Size { .. })));
        assert!(matches!(Header { flags: 2, ..hdr(1, 0) }.check(), Err(Error::Version(2))));
        assert!(matches!(Header { flags: 5, ..hdr(1, 0) }.check(), Err(Error::Reply(1))));
    }

    #[test]
    fn requests_and_their_fds() {
        let mut mt = vec![2, 0, 0, 0, 0, 0, 0, 0];
        for (gpa, size) in [(0u64, 1u64 << 20), (1 << 30, 4096)] {
            for v in [gpa, size, 0x7f00_0000_0000 + gpa, 0] {
                mt.extend_from_slice(&v.to_le_bytes());
            }
        }
        let h = hdr(code::SET_MEM_TABLE, mt.len() as u32);
        let Request::SetMemTable(r) = parse(&h, &mt, 2).unwrap() else { panic!() };
        assert_eq!((r.len(), r[1].guest_phys_addr, r[1].size), (2, 1 << 30, 4096));
        assert_eq!(parse(&h, &mt, 3), Err(Error::Fds { request: 5, got: 3, want: 2 }));
        assert!(matches!(parse(&h, &mt[..40], 2), Err(Error::Payload { .. })));
        let mut nine = mt.clone();
        nine[0] = 9;
        assert_eq!(parse(&h, &nine, 2), Err(Error::TooManyRegions(9)));

        let kick = |v: u64, nfds| parse(&hdr(code::SET_VRING_KICK, 8), &v.to_le_bytes(), nfds);
        assert_eq!(kick(1, 1), Ok(Request::SetVringFd { which: VringFd::Kick, index: 1, fd: true }));
        assert_eq!(kick(0x101, 0), Ok(Request::SetVringFd { which: VringFd::Kick, index: 1, fd: false }));
        assert!(matches!(kick(1, 0), Err(Error::Fds { .. })));
        assert!(matches!(kick(0x101, 1), Err(Error::Fds { .. })));
        // A request that takes no fd refuses one.
        assert!(matches!(parse(&hdr(code::SET_FEATURES, 8), &[0; 8], 1), Err(Error::Fds { .. })));
        let en = |num: u32| parse(&hdr(code::SET_VRING_ENABLE, 8), &vring_state(3, num), 0);
        assert_eq!(en(1), Ok(Request::SetVringEnable { index: 3, enable: true }));
        assert!(en(2).is_err());
        assert_eq!(parse(&hdr(77, 3), &[1, 2, 3], 0), Ok(Request::Unsupported(77)));
        // SEND_RARP's MAC is the u64's first six bytes.
        let rarp = |p: &[u8], nfds| parse(&hdr(code::SEND_RARP, p.len() as u32), p, nfds);
        assert_eq!(rarp(&[0x52, 0x54, 0, 1, 2, 3, 0, 0], 0), Ok(Request::SendRarp([0x52, 0x54, 0, 1, 2, 3])));
        assert!(matches!(rarp(&[0x52, 0x54, 0, 1, 2, 3], 0), Err(Error::Payload { .. })));
        assert!(matches!(rarp(&[0; 8], 1), Err(Error::Fds { .. })));
    }

    #[test]
    fn replies() {
        let r = reply(&hdr(code::GET_FEATURES, 0), &7u64.to_le_bytes());
        assert_eq!(r, [1, 0, 0, 0, 5, 0, 0, 0, 8, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0]);
    }
}
