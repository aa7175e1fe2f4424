//! The kernel objects zebra reads, per VNI (`tick::shadow_names`): a bridge, a VXLAN device
//! and a veth standing for pvswitch's ports, made with `ip` and `bridge` (once per VNI).

use std::net::Ipv4Addr;
use std::process::Command;

use crate::tick;

/// Makes VNI `vni`'s shadow objects (again, if they were there with other settings): a bridge,
/// a VXLAN device on the VTEP's address and port without learning, and a veth as the local port,
/// all without IPv6 addresses (a kernel with them would learn MACs from its own solicitations);
/// the bridge with IPv6 on, for the IPv6 neighbours of MAC+IP routes.
pub fn shadow(vni: u32, local: Ipv4Addr, port: u16) -> Result<(), String> {
    let [br, vx, lp, peer] = tick::shadow_names(vni);
    for dev in [&br, &vx, &lp] {
        let _ = Command::new("ip").args(["link", "del", dev]).stderr(std::process::Stdio::null()).status();
    }
    let run = |args: &[&str]| -> Result<(), String> {
        let o = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{}: {e}", args[0]))?;
        if !o.status.success() {
            return Err(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim()));
        }
        Ok(())
    };
    let (id, local, port) = (vni.to_string(), local.to_string(), port.to_string());
    run(&["ip", "link", "add", &br, "type", "bridge"])?;
    run(&["ip", "link", "add", &vx, "type", "vxlan", "id", &id, "local", &local, "dstport", &port, "nolearning"])?;
    run(&["ip", "link", "add", &lp, "type", "veth", "peer", "name", &peer])?;
    for dev in [&br, &vx, &lp, &peer] {
        // No IPv6 address, so no solicitation the bridge could learn from: through netlink
        // (works under the unit's ProtectKernelTunables, where /proc/sys is read-only), and
        // IPv6 off where /proc/sys may be written. But the bridge holds the VNI's IPv6
        // neighbours (MAC+IP routes), so it keeps IPv6 on, without an address.
        run(&["ip", "link", "set", "dev", dev, "addrgenmode", "none"])?;
        let path = format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6");
        let off = if *dev == br { "0" } else { "1" };
        if let Err(e) = std::fs::write(&path, off) {
            log::debug!("{path}: {e}; {dev} has no IPv6 address (addrgenmode none) all the same");
        }
    }
    run(&["ip", "link", "set", &vx, "master", &br])?;
    run(&["ip", "link", "set", &lp, "master", &br])?;
    run(&["bridge", "link", "set", "dev", &vx, "learning", "off", "neigh_suppress", "on"])?;
    run(&["bridge", "link", "set", "dev", &lp, "learning", "off"])?;
    for dev in [&br, &vx, &lp, &peer] {
        run(&["ip", "link", "set", dev, "up"])?;
    }
    Ok(())
}
