//! The machine's CPUs and NUMA nodes, from hwloc (the `hwlocality` crate).
//!
//! All CPU numbers here are OS indices (what `taskset`, `/sys/devices/system/cpu/cpuN` and the
//! configuration's `poll_cores` use), never hwloc logical indices.
#![forbid(unsafe_code)]

use hwlocality::Topology;
use hwlocality::object::types::ObjectType;

/// The NUMA nodes and physical cores of the machine, reduced to plain CPU numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Numa {
    /// (node OS index, its CPUs ascending), ascending by node. Empty when discovery failed.
    nodes: Vec<(usize, Vec<usize>)>,
    /// Physical cores: the CPUs (hardware threads) of each, ascending; cores ordered by their
    /// first CPU. A CPU that hwloc puts under no Core object is a core of its own.
    cores: Vec<Vec<usize>>,
}

impl Numa {
    /// Discovers this machine's topology. On failure, everything is one node 0.
    pub fn discover() -> Numa {
        match Topology::new() {
            Ok(t) => Numa::from_topology(&t),
            Err(e) => {
                log::warn!("hwloc topology discovery failed ({e}); assuming a single NUMA node");
                Numa::single_node(std::thread::available_parallelism().map_or(1, |n| n.get()))
            }
        }
    }

    /// A stand-in for a machine whose topology is unknown: one node 0 with CPUs `0..cpus`, each
    /// CPU its own core. [`Numa::node_of_cpu`] answers node 0 for every CPU.
    pub fn single_node(cpus: usize) -> Numa {
        Numa { nodes: Vec::new(), cores: (0..cpus).map(|c| vec![c]).collect() }
    }

    /// From any topology, including synthetic ones built in tests. In hwloc 2.x NUMA nodes are
    /// memory children, so a CPU maps to the node whose cpuset includes it.
    pub fn from_topology(t: &Topology) -> Numa {
        let cpus_of = |o: &hwlocality::object::TopologyObject| -> Vec<usize> {
            o.cpuset().map(|s| s.iter_set().map(usize::from).collect()).unwrap_or_default()
        };
        let mut nodes: Vec<(usize, Vec<usize>)> =
            t.objects_with_type(ObjectType::NUMANode).map(|n| (n.os_index().unwrap_or(0), cpus_of(n))).collect();
        nodes.sort();

        let mut cores: Vec<Vec<usize>> =
            t.objects_with_type(ObjectType::Core).map(cpus_of).filter(|c| !c.is_empty()).collect();
        let mut covered: Vec<usize> = cores.iter().flatten().copied().collect();
        covered.sort_unstable();
        for pu in t.objects_with_type(ObjectType::PU).filter_map(|p| p.os_index()) {
            if covered.binary_search(&pu).is_err() {
                cores.push(vec![pu]);
            }
        }
        cores.sort();
        Numa { nodes, cores }
    }

    /// The NUMA node (OS index) of a CPU; `None` for a CPU the topology doesn't know. Without a
    /// discovered topology every CPU is on node 0.
    pub fn node_of_cpu(&self, cpu: usize) -> Option<usize> {
        if self.nodes.is_empty() {
            return Some(0);
        }
        self.nodes.iter().find(|(_, cpus)| cpus.contains(&cpu)).map(|(n, _)| *n)
    }

    /// The NUMA nodes, ascending by OS index, each with its CPUs (OS indices, ascending). A
    /// memory-only node (no CPUs) is listed with an empty CPU list.
    pub fn nodes(&self) -> Vec<(usize, Vec<usize>)> {
        if self.nodes.is_empty() {
            return vec![(0, self.cores.iter().flatten().copied().collect())];
        }
        self.nodes.clone()
    }

    /// The CPUs (OS indices, ascending) of NUMA node `node`; empty for an unknown node.
    pub fn pus_of_node(&self, node: usize) -> Vec<usize> {
        self.nodes().into_iter().find(|(n, _)| *n == node).map(|(_, cpus)| cpus).unwrap_or_default()
    }

    /// The physical cores, each as its CPUs (hardware threads) ascending, ordered by first CPU.
    pub fn cores(&self) -> &[Vec<usize>] {
        &self.cores
    }

    /// The CPUs sharing a physical core with `cpu` (its hyperthread siblings, `cpu` excluded).
    pub fn siblings_of(&self, cpu: usize) -> Vec<usize> {
        self.cores
            .iter()
            .find(|c| c.contains(&cpu))
            .map(|c| c.iter().copied().filter(|&p| p != cpu).collect())
            .unwrap_or_default()
    }

    /// Chooses poll cores for `poll_cores = "auto"`: up to `per_node` CPUs on every NUMA node that
    /// has CPUs, never one listed in `avoid`. Within a node, candidates are taken in this order,
    /// physical cores ascending by their first CPU:
    ///
    /// 1. the first usable CPU of each *clean* physical core (none of its hardware threads is
    ///    CPU 0 or in `avoid`): one poll thread per physical core, hyperthread siblings unused;
    /// 2. the first usable CPU of each other core (sharing a core with CPU 0, the housekeeping
    ///    CPU, or with an avoided CPU);
    /// 3. the remaining hyperthread siblings, core by core;
    /// 4. CPU 0 itself, as a last resort.
    ///
    /// The result lists node 0's choices first, then node 1's, and so on, each node's ascending.
    /// A node with fewer usable CPUs than `per_node` contributes what it has. Equal input, equal
    /// output.
    pub fn auto_cores(&self, per_node: usize, avoid: &[usize]) -> Vec<usize> {
        let usable = |cpu: usize| cpu != 0 && !avoid.contains(&cpu);
        let mut chosen = Vec::new();
        for (_, cpus) in self.nodes() {
            let node_cores: Vec<&Vec<usize>> =
                self.cores.iter().filter(|core| core.first().is_some_and(|c| cpus.contains(c))).collect();
            let mut ranked: Vec<usize> = Vec::new();
            let clean = |core: &Vec<usize>| core.iter().all(|&c| usable(c));
            for pass_clean in [true, false] {
                for core in node_cores.iter().filter(|core| clean(core) == pass_clean) {
                    ranked.extend(core.iter().copied().find(|&c| usable(c)));
                }
            }
            for core in &node_cores {
                ranked.extend(core.iter().copied().filter(|&c| usable(c)).skip(1));
            }
            if cpus.contains(&0) && !avoid.contains(&0) {
                ranked.push(0);
            }
            let mut mine: Vec<usize> = ranked.into_iter().take(per_node).collect();
            mine.sort_unstable();
            chosen.extend(mine);
        }
        chosen
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use hwlocality::cpu::cpuset::CpuSet;
    use hwlocality::topology::editor::RestrictFlags;

    /// A synthetic topology, optionally restricted to some CPUs (to make uneven nodes).
    pub(crate) fn synthetic(desc: &str, keep: Option<&[usize]>) -> Numa {
        let mut t = Topology::builder().from_synthetic(desc).unwrap().build().unwrap();
        if let Some(keep) = keep {
            let mut set = CpuSet::new();
            for &c in keep {
                set.set(c);
            }
            t.edit(|e| e.restrict(&set, RestrictFlags::empty())).unwrap();
        }
        Numa::from_topology(&t)
    }

    #[test]
    fn synthetic_two_nodes() {
        let n = synthetic("pack:2 numa:1 core:2 pu:2", None);
        assert_eq!(n.node_of_cpu(0), Some(0));
        assert_eq!(n.node_of_cpu(3), Some(0));
        assert_eq!(n.node_of_cpu(4), Some(1));
        assert_eq!(n.node_of_cpu(7), Some(1));
        assert_eq!(n.node_of_cpu(8), None);
        assert_eq!(n.nodes(), vec![(0, vec![0, 1, 2, 3]), (1, vec![4, 5, 6, 7])]);
        assert_eq!(n.pus_of_node(1), vec![4, 5, 6, 7]);
        assert_eq!(n.pus_of_node(2), Vec::<usize>::new());
        assert_eq!(n.cores(), &[vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]);
        assert_eq!(n.siblings_of(5), vec![4]);
    }

    #[test]
    fn auto_two_nodes_smt_skips_siblings_and_cpu0() {
        let n = synthetic("pack:2 numa:1 core:4 pu:2", None);
        // Node 0: cores {0,1} (housekeeping), {2,3}, {4,5}, {6,7}; node 1: 8..16.
        assert_eq!(n.auto_cores(1, &[]), vec![2, 8]);
        assert_eq!(n.auto_cores(2, &[]), vec![2, 4, 8, 10]);
        assert_eq!(n.auto_cores(3, &[]), vec![2, 4, 6, 8, 10, 12]);
        // Only then the housekeeping core's sibling, then other siblings, CPU 0 last.
        assert_eq!(n.auto_cores(4, &[]), vec![1, 2, 4, 6, 8, 10, 12, 14]);
        assert_eq!(n.auto_cores(5, &[]), vec![1, 2, 3, 4, 6, 8, 9, 10, 12, 14]);
        assert_eq!(n.auto_cores(8, &[]), (0..16).collect::<Vec<_>>());
        assert_eq!(n.auto_cores(20, &[]).len(), 16);
        assert_eq!(n.auto_cores(0, &[]), Vec::<usize>::new());
    }

    #[test]
    fn auto_avoid() {
        let n = synthetic("pack:2 numa:1 core:4 pu:2", None);
        // Avoiding 2 makes core {2,3} unclean: 3 comes after the clean cores' first CPUs.
        assert_eq!(n.auto_cores(2, &[2, 8]), vec![4, 6, 10, 12]);
        assert_eq!(n.auto_cores(4, &[2, 8]), vec![1, 3, 4, 6, 9, 10, 12, 14]);
        // Avoiding CPU 0 means never using it.
        assert!(!n.auto_cores(8, &[0]).contains(&0));
        assert_eq!(n.auto_cores(8, &[0]).len(), 15);
    }

    #[test]
    fn auto_without_smt() {
        let n = synthetic("pack:2 numa:1 core:3 pu:1", None);
        assert_eq!(n.cores().len(), 6);
        assert!(n.siblings_of(4).is_empty());
        assert_eq!(n.auto_cores(1, &[]), vec![1, 3]);
        assert_eq!(n.auto_cores(2, &[]), vec![1, 2, 3, 4]);
        assert_eq!(n.auto_cores(3, &[]), vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn four_nodes_uneven() {
        // 4 nodes of 2 cores x 2 PUs; keep node 0 whole, one core of node 1, one PU of node 2,
        // nothing of node 3 (it stays, memory-only).
        let n = synthetic("pack:4 numa:1 core:2 pu:2", Some(&[0, 1, 2, 3, 4, 5, 8]));
        let nodes = n.nodes();
        assert_eq!(nodes.len(), 4);
        assert_eq!(nodes[0], (0, vec![0, 1, 2, 3]));
        assert_eq!(nodes[1], (1, vec![4, 5]));
        assert_eq!(nodes[2], (2, vec![8]));
        assert_eq!(nodes[3], (3, vec![]));
        assert_eq!(n.node_of_cpu(8), Some(2));
        assert_eq!(n.node_of_cpu(12), None);
        assert_eq!(n.auto_cores(1, &[]), vec![2, 4, 8]);
        assert_eq!(n.auto_cores(2, &[]), vec![1, 2, 4, 5, 8]);
        assert_eq!(n.auto_cores(2, &[4]), vec![1, 2, 5, 8]);
    }

    #[test]
    fn four_nodes_uneven_no_smt() {
        let n = synthetic("pack:4 numa:1 core:4 pu:1", Some(&[0, 1, 4, 5, 6, 7, 8, 12, 13, 14]));
        assert_eq!(n.pus_of_node(1), vec![4, 5, 6, 7]);
        assert_eq!(n.pus_of_node(2), vec![8]);
        assert_eq!(n.auto_cores(2, &[]), vec![0, 1, 4, 5, 8, 12, 13]);
        assert_eq!(n.auto_cores(2, &[0]), vec![1, 4, 5, 8, 12, 13]);
        // Stable: same input, same answer.
        assert_eq!(n.auto_cores(3, &[5]), n.auto_cores(3, &[5]));
    }

    #[test]
    fn single_node_fallback() {
        let n = Numa::single_node(4);
        assert_eq!(n.node_of_cpu(7), Some(0));
        assert_eq!(n.nodes(), vec![(0, vec![0, 1, 2, 3])]);
        assert_eq!(n.auto_cores(2, &[]), vec![1, 2]);
    }
}
