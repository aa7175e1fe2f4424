//! The namespace's bridge FDB and IPv4 and IPv6 neighbours over rtnetlink: dumped each tick, static
//! entries of local MACs and their addresses added (`NLM_F_REPLACE`) and deleted.

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::net::{IpAddr, Ipv4Addr};

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use pvswitch::wire::MacAddr;

use crate::tick::{FdbEntry, NeighEntry};

/// An rtnetlink socket for the bridge FDB.
pub struct Netlink {
    sock: Socket,
    seq: u32,
}

impl Netlink {
    pub fn open() -> std::io::Result<Netlink> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        Ok(Netlink { sock, seq: 0 })
    }

    fn send(&mut self, flags: u16, msg: RouteNetlinkMessage) -> Result<u32, String> {
        self.seq += 1;
        let mut h = NetlinkHeader::default();
        h.flags = flags;
        h.sequence_number = self.seq;
        let mut m = NetlinkMessage::new(h, NetlinkPayload::from(msg));
        m.finalize();
        let mut buf = vec![0u8; m.buffer_len()];
        m.serialize(&mut buf);
        self.sock.send(&buf, 0).map_err(|e| format!("netlink send: {e}"))?;
        Ok(self.seq)
    }

    /// Reads replies to `seq` until the dump's end (or the ACK), handing each message to `f`.
    fn replies(&mut self, seq: u32, mut f: impl FnMut(RouteNetlinkMessage)) -> Result<(), String> {
        loop {
            let (buf, _) = self.sock.recv_from_full().map_err(|e| format!("netlink recv: {e}"))?;
            let mut off = 0;
            while off < buf.len() {
                let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[off..])
                    .map_err(|e| format!("netlink: {e}"))?;
                let len = m.header.length as usize;
                if len == 0 {
                    return Ok(());
                }
                off += (len + 3) & !3;
                if m.header.sequence_number != seq {
                    continue;
                }
                match m.payload {
                    NetlinkPayload::Done(_) => return Ok(()),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(()),
                            Some(c) => Err(format!("netlink: {}", std::io::Error::from_raw_os_error(-c.get()))),
                        };
                    }
                    NetlinkPayload::InnerMessage(msg) => f(msg),
                    _ => {}
                }
            }
        }
    }

    /// Every bridge FDB entry of the namespace.
    pub fn dump_fdb(&mut self) -> Result<Vec<FdbEntry>, String> {
        let mut q = NeighbourMessage::default();
        q.header.family = AddressFamily::Bridge;
        let seq = self.send(NLM_F_REQUEST | NLM_F_DUMP, RouteNetlinkMessage::GetNeighbour(q))?;
        let mut out = Vec::new();
        self.replies(seq, |msg| {
            let RouteNetlinkMessage::NewNeighbour(n) = msg else { return };
            let mut e = FdbEntry {
                dev: ifname(n.header.ifindex),
                mac: MacAddr::ZERO,
                dst: None,
                ext_learned: n.header.flags.contains(NeighbourFlags::ExtLearned),
                own: n.header.flags.contains(NeighbourFlags::Own),
                is_static: n.header.state == NeighbourState::Noarp,
            };
            for a in &n.attributes {
                match a {
                    NeighbourAttribute::LinkLayerAddress(l) if l.len() == 6 => e.mac = MacAddr::from_bytes(l),
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => e.dst = Some(*ip),
                    NeighbourAttribute::Destination(NeighbourAddress::Other(b)) if b.len() == 4 => {
                        e.dst = Some(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
                    }
                    _ => {}
                }
            }
            out.push(e);
        })?;
        Ok(out)
    }

    /// Adds (replacing) or deletes the static bridge entry of `mac` on port `dev`.
    pub fn fdb(&mut self, add: bool, dev: &str, mac: MacAddr) -> Result<(), String> {
        let ifindex = ifindex(dev).ok_or(format!("no interface {dev}"))?;
        let mut m = NeighbourMessage::default();
        m.header.family = AddressFamily::Bridge;
        m.header.ifindex = ifindex;
        m.header.state = NeighbourState::Noarp;
        m.header.flags = NeighbourFlags::Controller;
        m.attributes.push(NeighbourAttribute::LinkLayerAddress(mac.0.to_vec()));
        let seq = if add {
            self.send(NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE, RouteNetlinkMessage::NewNeighbour(m))?
        } else {
            self.send(NLM_F_REQUEST | NLM_F_ACK, RouteNetlinkMessage::DelNeighbour(m))?
        };
        self.replies(seq, |_| {}).map_err(|e| format!("{} {mac} on {dev}: {e}", if add { "add" } else { "del" }))
    }
}

impl Netlink {
    /// Every IPv4 and IPv6 neighbour of the namespace.
    pub fn dump_neigh(&mut self) -> Result<Vec<NeighEntry>, String> {
        let mut out = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            self.dump_neigh_of(family, &mut out)?;
        }
        Ok(out)
    }

    fn dump_neigh_of(&mut self, family: AddressFamily, out: &mut Vec<NeighEntry>) -> Result<(), String> {
        let mut q = NeighbourMessage::default();
        q.header.family = family;
        let seq = self.send(NLM_F_REQUEST | NLM_F_DUMP, RouteNetlinkMessage::GetNeighbour(q))?;
        self.replies(seq, |msg| {
            let RouteNetlinkMessage::NewNeighbour(n) = msg else { return };
            let (mut ip, mut mac) = (None, None);
            for a in &n.attributes {
                match a {
                    NeighbourAttribute::LinkLayerAddress(l) if l.len() == 6 => mac = Some(MacAddr::from_bytes(l)),
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => ip = Some(IpAddr::V4(*a)),
                    NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => ip = Some(IpAddr::V6(*a)),
                    _ => {}
                }
            }
            if let (Some(ip), Some(mac)) = (ip, mac) {
                out.push(NeighEntry {
                    dev: ifname(n.header.ifindex),
                    ip,
                    mac,
                    ext_learned: n.header.flags.contains(NeighbourFlags::ExtLearned),
                    is_static: n.header.state == NeighbourState::Noarp,
                });
            }
        })
    }

    /// Adds (replacing) or deletes the static neighbour `ip` at `mac` on `dev` (a shadow
    /// bridge: zebra advertises it as a MAC+IP route).
    pub fn neigh(&mut self, add: bool, dev: &str, ip: IpAddr, mac: MacAddr) -> Result<(), String> {
        let ifindex = ifindex(dev).ok_or(format!("no interface {dev}"))?;
        let mut m = NeighbourMessage::default();
        m.header.ifindex = ifindex;
        m.header.state = NeighbourState::Noarp;
        let (family, dst) = match ip {
            IpAddr::V4(a) => (AddressFamily::Inet, NeighbourAddress::Inet(a)),
            IpAddr::V6(a) => (AddressFamily::Inet6, NeighbourAddress::Inet6(a)),
        };
        m.header.family = family;
        m.attributes.push(NeighbourAttribute::Destination(dst));
        m.attributes.push(NeighbourAttribute::LinkLayerAddress(mac.0.to_vec()));
        let seq = if add {
            self.send(NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE, RouteNetlinkMessage::NewNeighbour(m))?
        } else {
            self.send(NLM_F_REQUEST | NLM_F_ACK, RouteNetlinkMessage::DelNeighbour(m))?
        };
        self.replies(seq, |_| {})
            .map_err(|e| format!("{} {ip} at {mac} on {dev}: {e}", if add { "add" } else { "del" }))
    }
}

/// An interface's index, from sysfs (`ip netns exec` mounts the namespace's own).
fn ifindex(name: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex")).ok()?.trim().parse().ok()
}

/// The name of the interface with index `index` (its number if there is none).
fn ifname(index: u32) -> String {
    let found = std::fs::read_dir("/sys/class/net").ok().and_then(|d| {
        d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).find(|n| ifindex(n) == Some(index))
    });
    found.unwrap_or_else(|| index.to_string())
}
