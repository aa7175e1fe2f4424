//! The machine's CPUs and NUMA nodes, from hwloc (the `hwlocality` crate).

use hwlocality::Topology;
use hwlocality::object::types::ObjectType;

/// Which NUMA node each CPU (OS index) belongs to.
pub struct Numa {
    /// (node OS index, CPUs of the node)
    nodes: Vec<(usize, Vec<usize>)>,
}

impl Numa {
    /// Discovers this machine's topology. On failure, everything is one node 0.
    pub fn discover() -> Numa {
        match Topology::new() {
            Ok(t) => Numa::from_topology(&t),
            Err(e) => {
                log::warn!("hwloc topology discovery failed ({e}); assuming a single NUMA node");
                Numa { nodes: Vec::new() }
            }
        }
    }

    /// From any topology, including synthetic ones built in tests. In hwloc 2.x NUMA nodes are
    /// memory children, so a CPU maps to the node whose cpuset includes it.
    pub fn from_topology(t: &Topology) -> Numa {
        let nodes = t
            .objects_with_type(ObjectType::NUMANode)
            .map(|n| {
                let cpus = n.cpuset().map(|s| s.iter_set().map(usize::from).collect()).unwrap_or_default();
                (n.os_index().unwrap_or(0), cpus)
            })
            .collect();
        Numa { nodes }
    }

    pub fn node_of_cpu(&self, cpu: usize) -> Option<usize> {
        if self.nodes.is_empty() {
            return Some(0);
        }
        self.nodes.iter().find(|(_, cpus)| cpus.contains(&cpu)).map(|(n, _)| *n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_two_nodes() {
        let t = Topology::builder().from_synthetic("pack:2 numa:1 core:2 pu:2").unwrap().build().unwrap();
        let n = Numa::from_topology(&t);
        assert_eq!(n.node_of_cpu(0), Some(0));
        assert_eq!(n.node_of_cpu(3), Some(0));
        assert_eq!(n.node_of_cpu(4), Some(1));
        assert_eq!(n.node_of_cpu(7), Some(1));
        assert_eq!(n.node_of_cpu(8), None);
    }
}
