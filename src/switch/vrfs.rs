//! `vrfs`: each `[[vrf]]`, its networks, and the neighbours the ports give it, as the plans
//! route them (`datapath::route::Routes`, made from the same configuration).

use super::Switch;
use crate::datapath::route::Routes;
use crate::proto::vrfs::{NeighbourInfo, NetworkInfo, VrfInfo};

impl Switch {
    pub fn vrfs(&self) -> Vec<VrfInfo> {
        let ports = self.ports.iter().flatten().map(|ps| {
            let c = &ps.cfg;
            (ps.id(), &c.allowed_macs[..], &c.allowed_ips[..], &c.vlan)
        });
        let routes = Routes::new(&self.cfg.vrfs, ports, &self.remote_neighbours());
        let name = |id: u16| self.port(id as usize).map(|p| p.name().to_string()).unwrap_or_default();
        self.cfg
            .vrfs
            .iter()
            .enumerate()
            .map(|(i, v)| VrfInfo {
                name: v.name.clone(),
                gateway_mac: v.gateway_mac.to_string(),
                networks: v
                    .networks
                    .iter()
                    .map(|n| NetworkInfo {
                        vlan: n.vlan,
                        gateway: format!("{}/{}", n.gateway, n.prefix_len),
                        gateway6: n.gateway6.map(|g| g.to_string()),
                    })
                    .collect(),
                neighbours: routes
                    .iter()
                    .flat_map(|r| {
                        r.neighbours().iter().filter(|n| r.nets[n.net as usize].vrf == i as u16).map(move |n| (r, n))
                    })
                    .map(|(r, n)| NeighbourInfo {
                        address: n.address().to_string(),
                        mac: n.mac.to_string(),
                        port: name(n.port),
                        vlan: r.nets[n.net as usize].vlan,
                    })
                    .collect(),
            })
            .collect()
    }
}
