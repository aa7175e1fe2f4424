//! Which poll thread polls which receive queue: a pure function of the threads, the queues (with
//! their NUMA node, recent load and `affinity` pin) and the policy (`rxq_assign`). The policy
//! names follow Open vSwitch's `pmd-rxq-assign` (`roundrobin`, `cycles`, `group`) and pinned
//! queues isolate their thread as `pmd-rxq-isolate` does; the rules below are this module's own.
//!
//! Order of work in [`place`]:
//!
//! 1. Queues are taken in id order (port id, then queue pair); ties keep input order.
//! 2. **Pinned** queues go to the first thread on their core. No thread on that core: a warning,
//!    and the queue is placed like an unpinned one. A pinned queue whose node differs from its
//!    thread's gets a warning (it is polled across the interconnect, as asked).
//! 3. **Isolation** (`isolate_pinned`): a thread holding a pinned queue gets no other queue. If
//!    that would isolate every thread while unpinned queues remain, nothing is isolated (warning).
//! 4. **Local first**: an unpinned queue on node N is eligible for the non-isolated threads on
//!    node N. If there are none, it is eligible for every non-isolated thread, with a warning
//!    naming the queue, its node, the reason and the node it is polled from. A queue whose node
//!    is unknown (`None`) is eligible for every non-isolated thread, silently.
//! 5. The **policy** picks among the eligible threads; queues with the same eligible set share
//!    one cursor (so each node's queues are dealt over that node's threads).
//!
//! The policies:
//!
//! - [`RxqAssign::RoundRobin`]: queues by id; each to the next eligible thread in thread-index
//!   order, wrapping around (0, 1, .., n-1, 0, 1, ..). Loads are ignored.
//! - [`RxqAssign::Cycles`] (OVS's `cycles`): queues by load descending (ties by id); dealt over the
//!   eligible threads in ascending-then-descending order, each end thread taking two in a row
//!   (0, 1, .., n-1, n-1, .., 1, 0, 0, 1, ..). A sorted round robin: it ignores what the threads
//!   already hold (pinned queues on non-isolated threads).
//! - [`RxqAssign::Group`] (OVS's `group`): queues by load descending (ties by id); each to the
//!   eligible thread with the least total load so far, pinned queues included; ties go to the
//!   thread with the fewest queues, then the lowest index. This is greedy "longest processing
//!   time first": within one eligible set without pins, the most and least loaded threads differ
//!   by at most the largest single queue load.
//!
//! Every thread's queue list in the result is sorted by id. Equal input gives equal output, and
//! the output does not depend on the order of `queues`, except among duplicate ids.

use std::collections::BTreeMap;

use crate::config::RxqAssign;
use crate::topology::Numa;

/// A receive queue's identity: (port id, queue pair).
pub type QueueId = (u16, usize);

/// One poll thread: the CPU it is pinned to and that CPU's NUMA node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadInfo {
    /// CPU (OS index) the thread runs on.
    pub core: usize,
    /// NUMA node of that CPU, `None` if unknown.
    pub node: Option<usize>,
}

impl ThreadInfo {
    /// The poll threads for these cores, their nodes looked up in `numa`.
    pub fn on_cores(cores: &[usize], numa: &Numa) -> Vec<ThreadInfo> {
        cores.iter().map(|&core| ThreadInfo { core, node: numa.node_of_cpu(core) }).collect()
    }
}

/// One receive queue to place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    /// (port id, queue pair).
    pub id: QueueId,
    /// NUMA node where its memory or device lives; `None` if unknown (any node will do).
    pub node: Option<usize>,
    /// Cycles spent on it over a recent window (used by `Cycles` and `Group`).
    pub load: u64,
    /// The core `affinity` pins it to, if any.
    pub pinned: Option<usize>,
}

/// The result of [`place`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placement {
    /// Per thread (same index as the `threads` given to [`place`]): its queues, sorted by id.
    pub assignment: Vec<Vec<QueueId>>,
    /// Human-readable problems: cross-node polling, pins to cores without a poll thread, ...
    pub warnings: Vec<String>,
    /// Indices of the threads that poll only their pinned queues, ascending.
    pub isolated: Vec<usize>,
}

impl Placement {
    /// The thread index polling queue `id`, if any.
    pub fn thread_of(&self, id: QueueId) -> Option<usize> {
        self.assignment.iter().position(|qs| qs.contains(&id))
    }

    /// Each thread's total load, from the loads in `queues` (queues not listed count 0).
    pub fn thread_loads(&self, queues: &[QueueInfo]) -> Vec<u64> {
        let load: BTreeMap<QueueId, u64> = queues.iter().map(|q| (q.id, q.load)).collect();
        self.assignment.iter().map(|qs| qs.iter().map(|id| load.get(id).copied().unwrap_or(0)).sum()).collect()
    }

    /// The loads of the non-isolated threads only (the ones rebalancing can change).
    fn movable_loads(&self, queues: &[QueueInfo]) -> Vec<u64> {
        let all = self.thread_loads(queues);
        all.into_iter().enumerate().filter(|(t, _)| !self.isolated.contains(t)).map(|(_, l)| l).collect()
    }
}

/// How uneven the threads' loads are: `(max - min) / max`, from 0.0 (all equal) to 1.0 (some
/// thread idle while another works). 0.0 for no threads, one thread, or all loads zero.
pub fn spread(loads_per_thread: &[u64]) -> f64 {
    let (Some(&max), Some(&min)) = (loads_per_thread.iter().max(), loads_per_thread.iter().min()) else {
        return 0.0;
    };
    if max == 0 { 0.0 } else { (max - min) as f64 / max as f64 }
}

/// How much `after` improves on `before`, both evaluated with the same current `queue_loads`: the
/// relative drop of [`spread`] over the non-isolated threads, `(before - after) / before`. 1.0
/// means perfectly balanced after, 0.0 no change, negative worse. 0.0 when `before` is already
/// perfectly balanced. Rebalance only when this exceeds a margin (e.g. 0.25), so that noise in
/// the measured loads does not move queues back and forth.
pub fn improvement(before: &Placement, after: &Placement, queue_loads: &[QueueInfo]) -> f64 {
    let b = spread(&before.movable_loads(queue_loads));
    if b == 0.0 {
        return 0.0;
    }
    (b - spread(&after.movable_loads(queue_loads))) / b
}

/// Assigns `queues` to `threads` under `policy` (see the module documentation for the rules).
/// Queues are named `port:queue` in warnings; [`place_named`] takes port names.
pub fn place(threads: &[ThreadInfo], queues: &[QueueInfo], policy: RxqAssign, isolate_pinned: bool) -> Placement {
    place_named(threads, queues, policy, isolate_pinned, &|(port, q)| format!("{port}:{q}"))
}

/// [`place`], naming queues in warnings with `name` (e.g. `vm3:0`). Long because it applies
/// the module's rules in their order (pinned queues, isolation, NUMA groups, then the policy's
/// spread), each rule seeing what the ones before it left.
pub fn place_named(
    threads: &[ThreadInfo],
    queues: &[QueueInfo],
    policy: RxqAssign,
    isolate_pinned: bool,
    name: &dyn Fn(QueueId) -> String,
) -> Placement {
    let n = threads.len();
    let mut assignment: Vec<Vec<QueueId>> = vec![Vec::new(); n];
    let mut load = vec![0u64; n];
    let mut warnings = Vec::new();

    let mut order: Vec<&QueueInfo> = queues.iter().collect();
    order.sort_by_key(|q| q.id);

    // Pinned queues first.
    let mut has_pinned = vec![false; n];
    let mut unpinned: Vec<&QueueInfo> = Vec::new();
    for q in order {
        if let Some(core) = q.pinned {
            if let Some(t) = threads.iter().position(|t| t.core == core) {
                assignment[t].push(q.id);
                load[t] += q.load;
                has_pinned[t] = true;
                if let (Some(qn), Some(tn)) = (q.node, threads[t].node)
                    && qn != tn
                {
                    warnings.push(format!(
                        "queue {} is pinned to core {core} on NUMA node {tn} but lives on node {qn}; \
                         it is polled across the interconnect",
                        name(q.id)
                    ));
                }
                continue;
            }
            warnings.push(format!(
                "queue {} is pinned to core {core}, which runs no poll thread; placing it like an unpinned queue",
                name(q.id)
            ));
        }
        unpinned.push(q);
    }

    // Isolation.
    let mut isolated: Vec<usize> =
        if isolate_pinned { (0..n).filter(|&t| has_pinned[t]).collect() } else { Vec::new() };
    if n > 0 && isolated.len() == n && !unpinned.is_empty() {
        warnings.push(format!(
            "every poll thread polls pinned queues; not isolating them, so that the {} unpinned queue(s) get polled",
            unpinned.len()
        ));
        isolated.clear();
    }
    let open: Vec<usize> = (0..n).filter(|t| !isolated.contains(t)).collect();

    // RxqAssign order.
    if policy != RxqAssign::RoundRobin {
        unpinned.sort_by(|a, b| b.load.cmp(&a.load).then(a.id.cmp(&b.id)));
    }

    // Deal.
    let mut cursors: BTreeMap<Vec<usize>, usize> = BTreeMap::new();
    for q in unpinned {
        let (eligible, cross_reason) = match q.node {
            Some(node) => {
                let local: Vec<usize> = open.iter().copied().filter(|&t| threads[t].node == Some(node)).collect();
                if !local.is_empty() {
                    (local, None)
                } else if threads.iter().any(|t| t.node == Some(node)) {
                    (open.clone(), Some(format!("every poll thread on NUMA node {node} is isolated (pinned queues)")))
                } else {
                    (open.clone(), Some(format!("no poll thread on NUMA node {node}")))
                }
            }
            None => (open.clone(), None),
        };
        if eligible.is_empty() {
            warnings.push(format!("no poll thread available; queue {} is not polled", name(q.id)));
            continue;
        }
        let t = match policy {
            RxqAssign::RoundRobin | RxqAssign::Cycles => {
                let k = cursors.entry(eligible.clone()).or_insert(0);
                let len = eligible.len();
                let i = if policy == RxqAssign::RoundRobin {
                    *k % len
                } else {
                    let pos = *k % (2 * len);
                    if pos < len { pos } else { 2 * len - 1 - pos }
                };
                *k += 1;
                eligible[i]
            }
            RxqAssign::Group => {
                *eligible.iter().min_by_key(|&&t| (load[t], assignment[t].len(), t)).expect("non-empty")
            }
        };
        assignment[t].push(q.id);
        load[t] += q.load;
        if let Some(reason) = cross_reason {
            let from = match threads[t].node {
                Some(tn) => format!("node {tn}"),
                None => format!("core {} (NUMA node unknown)", threads[t].core),
            };
            warnings.push(format!("{reason}; queue {} polled from {from}, crossing the interconnect", name(q.id)));
        }
    }

    for qs in &mut assignment {
        qs.sort();
    }
    Placement { assignment, warnings, isolated }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::tests::synthetic;

    fn q(port: u16, qp: usize, node: Option<usize>, load: u64) -> QueueInfo {
        QueueInfo { id: (port, qp), node, load, pinned: None }
    }

    fn pin(mut queue: QueueInfo, core: usize) -> QueueInfo {
        queue.pinned = Some(core);
        queue
    }

    fn vm_name((port, qp): QueueId) -> String {
        format!("vm{port}:{qp}")
    }

    /// 2 nodes: CPUs 0-3 on node 0, 4-7 on node 1 (2 cores x 2 hardware threads each).
    fn two_nodes() -> Numa {
        synthetic("pack:2 numa:1 core:2 pu:2", None)
    }

    /// Every queue is polled by exactly one thread, on its own node when that node has one.
    fn check_local_and_complete(numa: &Numa, threads: &[ThreadInfo], queues: &[QueueInfo], p: &Placement) {
        for queue in queues {
            let t = p.thread_of(queue.id).expect("every queue polled");
            assert_eq!(p.assignment.iter().flatten().filter(|&&id| id == queue.id).count(), 1);
            assert_eq!(threads[t].node, queue.node);
            assert_eq!(numa.node_of_cpu(threads[t].core), queue.node);
        }
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    }

    #[test]
    fn roundrobin_per_node() {
        let numa = two_nodes();
        let threads = ThreadInfo::on_cores(&[1, 2, 5, 6], &numa);
        assert_eq!(threads.iter().map(|t| t.node).collect::<Vec<_>>(), [Some(0), Some(0), Some(1), Some(1)]);
        let queues: Vec<QueueInfo> =
            (1..=4u16).flat_map(|port| (0..2).map(move |qp| q(port, qp, Some(usize::from(port > 2)), 7))).collect();
        let p = place(&threads, &queues, RxqAssign::RoundRobin, true);
        assert_eq!(p.assignment.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 2, 2]);
        assert_eq!(p.assignment.concat(), [(1, 0), (2, 0), (1, 1), (2, 1), (3, 0), (4, 0), (3, 1), (4, 1)]);
        check_local_and_complete(&numa, &threads, &queues, &p);
        assert!(p.isolated.is_empty());
    }

    #[test]
    fn roundrobin_spreads_evenly() {
        let numa = synthetic("pack:1 numa:1 core:6 pu:1", None);
        let threads = ThreadInfo::on_cores(&numa.auto_cores(4, &[]), &numa);
        assert_eq!(threads.iter().map(|t| t.core).collect::<Vec<_>>(), [1, 2, 3, 4]);
        // Loads are ignored: one huge queue doesn't change the deal.
        let queues: Vec<QueueInfo> = (0..10).map(|i| q(1, i, Some(0), if i == 0 { 1000 } else { 1 })).collect();
        let p = place(&threads, &queues, RxqAssign::RoundRobin, true);
        assert_eq!(p.assignment.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 2, 2]);
        assert_eq!(p.assignment[0], [(1, 0), (1, 4), (1, 8)]);
        check_local_and_complete(&numa, &threads, &queues, &p);
    }

    fn six_loads() -> Vec<QueueInfo> {
        [100, 90, 10, 10, 5, 5].iter().enumerate().map(|(i, &l)| q(1, i, Some(0), l)).collect()
    }

    #[test]
    fn cycles_is_sorted_serpentine() {
        let numa = two_nodes();
        let threads = ThreadInfo::on_cores(&[1, 2], &numa);
        let queues = six_loads();
        let p = place(&threads, &queues, RxqAssign::Cycles, true);
        // Deal order 100, 90, 10, 10, 5, 5 over threads 0, 1, 1, 0, 0, 1.
        assert_eq!(p.assignment, vec![vec![(1, 0), (1, 3), (1, 4)], vec![(1, 1), (1, 2), (1, 5)]]);
        let loads = p.thread_loads(&queues);
        assert_eq!(loads, [115, 105]);
        // Bound: totals differ by at most 10 (the third-largest queue).
        assert!(loads[0].abs_diff(loads[1]) <= 10);
        check_local_and_complete(&numa, &threads, &queues, &p);
    }

    #[test]
    fn cycles_serpentine_three_threads() {
        let numa = synthetic("pack:1 numa:1 core:4 pu:1", None);
        let threads = ThreadInfo::on_cores(&[1, 2, 3], &numa);
        let queues: Vec<QueueInfo> = (0..7).map(|i| q(2, i, Some(0), 70 - 10 * i as u64)).collect();
        let p = place(&threads, &queues, RxqAssign::Cycles, true);
        // 0, 1, 2, 2, 1, 0, 0
        assert_eq!(p.assignment, vec![vec![(2, 0), (2, 5), (2, 6)], vec![(2, 1), (2, 4)], vec![(2, 2), (2, 3)]]);
    }

    #[test]
    fn group_balances_loads() {
        let numa = two_nodes();
        let threads = ThreadInfo::on_cores(&[1, 2], &numa);
        let queues = six_loads();
        let p = place(&threads, &queues, RxqAssign::Group, true);
        assert_eq!(p.assignment, vec![vec![(1, 0), (1, 3)], vec![(1, 1), (1, 2), (1, 4), (1, 5)]]);
        assert_eq!(p.thread_loads(&queues), [110, 110]);
        assert_eq!(spread(&p.thread_loads(&queues)), 0.0);
        assert_ne!(p, place(&threads, &queues, RxqAssign::Cycles, true));
        check_local_and_complete(&numa, &threads, &queues, &p);
    }

    #[test]
    fn group_bound_on_many_inputs() {
        let numa = synthetic("pack:1 numa:1 core:4 pu:2", None);
        let threads = ThreadInfo::on_cores(&numa.auto_cores(3, &[]), &numa);
        let mut seed = 12345u64;
        for _ in 0..50 {
            let queues: Vec<QueueInfo> = (0..17)
                .map(|i| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    q(3, i, Some(0), (seed >> 33) % 1000)
                })
                .collect();
            let p = place(&threads, &queues, RxqAssign::Group, true);
            let loads = p.thread_loads(&queues);
            let largest = queues.iter().map(|x| x.load).max().unwrap();
            // Greedy least-loaded: max and min differ by at most the largest queue.
            assert!(loads.iter().max().unwrap() - loads.iter().min().unwrap() <= largest, "{loads:?}");
            check_local_and_complete(&numa, &threads, &queues, &p);
        }
    }

    #[test]
    fn group_counts_pinned_load_and_zero_loads_by_count() {
        let numa = two_nodes();
        let threads = ThreadInfo::on_cores(&[1, 2], &numa);
        let queues = vec![pin(q(9, 0, Some(0), 100), 1), q(1, 0, Some(0), 50), q(1, 1, Some(0), 50)];
        let p = place(&threads, &queues, RxqAssign::Group, false);
        assert_eq!(p.assignment, vec![vec![(9, 0)], vec![(1, 0), (1, 1)]]);
        // All loads zero (nothing measured yet): falls back to queue counts.
        let queues: Vec<QueueInfo> = (0..5).map(|i| q(1, i, Some(0), 0)).collect();
        let p = place(&threads, &queues, RxqAssign::Group, true);
        assert_eq!(p.assignment, vec![vec![(1, 0), (1, 2), (1, 4)], vec![(1, 1), (1, 3)]]);
    }

    #[test]
    fn pinned_isolates_its_thread() {
        let numa = two_nodes();
        let threads = ThreadInfo::on_cores(&[1, 2, 3], &numa);
        let mut queues: Vec<QueueInfo> = (0..4).map(|i| q(1, i, Some(0), 10)).collect();
        queues.push(pin(q(9, 0, Some(0), 50), 2));
        for policy in [RxqAssign::RoundRobin, RxqAssign::Cycles, RxqAssign::Group] {
            let p = place(&threads, &queues, policy, true);
            assert_eq!(p.isolated, [1]);
            assert_eq!(p.assignment[1], [(9, 0)], "{policy}");
            assert_eq!(p.assignment[0].len() + p.assignment[2].len(), 4);
            assert!(p.warnings.is_empty());
        }
        let p = place(&threads, &queues, RxqAssign::RoundRobin, false);
        assert!(p.isolated.is_empty());
        assert_eq!(p.assignment, vec![vec![(1, 0), (1, 3)], vec![(1, 1), (9, 0)], vec![(1, 2)]]);
    }

    #[test]
    fn pin_to_core_without_thread_is_unpinned() {
        let numa = two_nodes();
        let threads = ThreadInfo::on_cores(&[1, 2], &numa);
        let queues = vec![pin(q(9, 0, Some(0), 50), 3), q(1, 0, Some(0), 10)];
        let p = place(&threads, &queues, RxqAssign::RoundRobin, true);
        assert_eq!(
            p.warnings,
            ["queue 9:0 is pinned to core 3, which runs no poll thread; placing it like an unpinned queue"]
        );
        assert!(p.isolated.is_empty());
        assert_eq!(p.assignment, vec![vec![(1, 0)], vec![(9, 0)]]);
    }

    #[test]
    fn pin_across_nodes_warns() {
        let numa = two_nodes();
        let threads = ThreadInfo::on_cores(&[1, 5], &numa);
        let queues = vec![pin(q(4, 1, Some(1), 50), 1)];
        let p = place_named(&threads, &queues, RxqAssign::Cycles, true, &vm_name);
        assert_eq!(p.assignment, vec![vec![(4, 1)], vec![]]);
        assert_eq!(
            p.warnings,
            [
                "queue vm4:1 is pinned to core 1 on NUMA node 0 but lives on node 1; it is polled across the interconnect"
            ]
        );
    }

    #[test]
    fn all_isolated_means_none_isolated() {
        let numa = two_nodes();
        let threads = ThreadInfo::on_cores(&[1, 2], &numa);
        let pins = vec![pin(q(8, 0, Some(0), 5), 1), pin(q(9, 0, Some(0), 5), 2)];
        let p = place(&threads, &pins, RxqAssign::Group, true);
        assert_eq!(p.isolated, [0, 1]);
        assert!(p.warnings.is_empty());

        let mut queues = pins.clone();
        queues.push(q(1, 0, Some(0), 3));
        let p = place(&threads, &queues, RxqAssign::Group, true);
        assert!(p.isolated.is_empty());
        assert_eq!(p.warnings.len(), 1);
        assert!(p.warnings[0].starts_with("every poll thread polls pinned queues; not isolating"), "{:?}", p.warnings);
        assert_eq!(p.assignment, vec![vec![(1, 0), (8, 0)], vec![(9, 0)]]);
    }

    #[test]
    fn node_without_poll_threads_warns() {
        let numa = two_nodes();
        let threads = ThreadInfo::on_cores(&[1, 2], &numa);
        let queues = vec![q(3, 0, Some(1), 10), q(1, 0, Some(0), 10)];
        let p = place_named(&threads, &queues, RxqAssign::RoundRobin, true, &vm_name);
        assert_eq!(
            p.warnings,
            ["no poll thread on NUMA node 1; queue vm3:0 polled from node 0, crossing the interconnect"]
        );
        assert_eq!(p.thread_of((3, 0)).map(|t| threads[t].node), Some(Some(0)));
        assert_eq!(p.assignment.iter().map(Vec::len).sum::<usize>(), 2);
    }

    #[test]
    fn four_nodes_missing_and_isolated_nodes() {
        // Nodes 0..3 with CPUs 0-1, 2-3, 4-5, 6-7.
        let numa = synthetic("pack:4 numa:1 core:2 pu:1", None);
        let threads = ThreadInfo::on_cores(&[1, 3, 5], &numa);
        let queues = vec![
            q(1, 0, Some(0), 10),
            q(2, 0, Some(1), 10),
            pin(q(3, 0, Some(2), 10), 5),
            q(3, 1, Some(2), 10),
            q(4, 0, Some(3), 10),
        ];
        let p = place(&threads, &queues, RxqAssign::Group, true);
        assert_eq!(p.isolated, [2]);
        assert_eq!(
            p.warnings,
            [
                "every poll thread on NUMA node 2 is isolated (pinned queues); queue 3:1 polled from node 0, \
                 crossing the interconnect",
                "no poll thread on NUMA node 3; queue 4:0 polled from node 1, crossing the interconnect",
            ]
        );
        assert_eq!(p.assignment, vec![vec![(1, 0), (3, 1)], vec![(2, 0), (4, 0)], vec![(3, 0)]]);
    }

    #[test]
    fn four_nodes_uneven_all_policies_stay_local() {
        // Node 0: CPUs 0-3, node 1: 4-5, node 2: 8, node 3: 12-15 (one PU per core).
        let numa = synthetic("pack:4 numa:1 core:4 pu:1", Some(&[0, 1, 2, 3, 4, 5, 8, 12, 13, 14, 15]));
        let cores = numa.auto_cores(3, &[]);
        assert_eq!(cores, [1, 2, 3, 4, 5, 8, 12, 13, 14]);
        let threads = ThreadInfo::on_cores(&cores, &numa);
        let mut queues = Vec::new();
        for (port, node) in [(1u16, 0usize), (2, 1), (3, 2), (4, 3), (5, 0)] {
            for qp in 0..4 {
                queues.push(q(port, qp, Some(node), 10 * (qp as u64 + 1)));
            }
        }
        for policy in [RxqAssign::RoundRobin, RxqAssign::Cycles, RxqAssign::Group] {
            let p = place(&threads, &queues, policy, true);
            check_local_and_complete(&numa, &threads, &queues, &p);
            // Node 2's single thread takes all of its 4 queues.
            assert_eq!(p.assignment[5].len(), 4, "{policy}");
            // Node 0's 8 queues over 3 threads: 3, 3, 2 for the count-based deals.
            let mut counts: Vec<usize> = p.assignment[..3].iter().map(Vec::len).collect();
            counts.sort_unstable();
            assert_eq!(counts.iter().sum::<usize>(), 8);
            if policy != RxqAssign::Group {
                assert_eq!(counts, [2, 3, 3], "{policy}");
            }
        }
    }

    #[test]
    fn unknown_node_goes_anywhere_silently() {
        let numa = two_nodes();
        let threads = ThreadInfo::on_cores(&[1, 5], &numa);
        let queues: Vec<QueueInfo> = (0..4).map(|i| q(6, i, None, 1)).collect();
        let p = place(&threads, &queues, RxqAssign::RoundRobin, true);
        assert!(p.warnings.is_empty());
        assert_eq!(p.assignment, vec![vec![(6, 0), (6, 2)], vec![(6, 1), (6, 3)]]);
    }

    #[test]
    fn no_threads() {
        let queues = vec![q(1, 0, Some(0), 1), pin(q(1, 1, None, 1), 3)];
        let p = place(&[], &queues, RxqAssign::Cycles, true);
        assert!(p.assignment.is_empty());
        assert_eq!(p.warnings.len(), 3);
        assert_eq!(p.warnings.iter().filter(|w| w.starts_with("no poll thread available")).count(), 2);
    }

    #[test]
    fn deterministic_and_order_independent() {
        let numa = synthetic("pack:2 numa:1 core:3 pu:2", None);
        let threads = ThreadInfo::on_cores(&numa.auto_cores(2, &[]), &numa);
        let mut queues: Vec<QueueInfo> = (0..24u16)
            .map(|i| {
                q(i % 5, i as usize, if i % 7 == 0 { None } else { Some(usize::from(i % 2)) }, u64::from(i % 4) * 10)
            })
            .collect();
        queues.push(pin(q(9, 0, Some(1), 99), threads[3].core));
        for policy in [RxqAssign::RoundRobin, RxqAssign::Cycles, RxqAssign::Group] {
            for isolate in [true, false] {
                let a = place(&threads, &queues, policy, isolate);
                assert_eq!(a, place(&threads, &queues, policy, isolate));
                let mut reversed = queues.clone();
                reversed.reverse();
                assert_eq!(a, place(&threads, &reversed, policy, isolate), "{policy} {isolate}");
                assert_eq!(a.assignment.iter().map(Vec::len).sum::<usize>(), queues.len());
            }
        }
    }

    #[test]
    fn spread_and_improvement() {
        assert_eq!(spread(&[]), 0.0);
        assert_eq!(spread(&[5]), 0.0);
        assert_eq!(spread(&[0, 0]), 0.0);
        assert_eq!(spread(&[100, 50]), 0.5);
        assert_eq!(spread(&[40, 0, 20]), 1.0);

        let queues = six_loads();
        let lopsided = Placement {
            assignment: vec![vec![(1, 0), (1, 1)], vec![(1, 2), (1, 3), (1, 4), (1, 5)]],
            ..Placement::default()
        };
        assert_eq!(lopsided.thread_loads(&queues), [190, 30]);
        let numa = two_nodes();
        let threads = ThreadInfo::on_cores(&[1, 2], &numa);
        let cycles = place(&threads, &queues, RxqAssign::Cycles, true);
        let group = place(&threads, &queues, RxqAssign::Group, true);
        assert_eq!(improvement(&lopsided, &group, &queues), 1.0);
        assert_eq!(improvement(&group, &group, &queues), 0.0);
        assert_eq!(improvement(&group, &lopsided, &queues), 0.0); // already perfect: nothing to gain
        let i = improvement(&cycles, &lopsided, &queues);
        assert!(i < 0.0, "{i}");
        let i = improvement(&lopsided, &cycles, &queues);
        assert!(i > 0.85 && i < 1.0, "{i}"); // spread 160/190 -> 10/115

        // Isolated threads are left out: their load can't move.
        let mut queues = queues;
        queues.push(pin(q(9, 0, Some(0), 10_000), 3));
        let threads = ThreadInfo::on_cores(&[1, 2, 3], &numa);
        let group3 = place(&threads, &queues, RxqAssign::Group, true);
        assert_eq!(group3.isolated, [2]);
        assert_eq!(spread(&group3.movable_loads(&queues)), 0.0);
        let mut lopsided3 = lopsided.clone();
        lopsided3.assignment.push(vec![(9, 0)]);
        lopsided3.isolated = vec![2];
        assert_eq!(improvement(&lopsided3, &group3, &queues), 1.0);
    }

    #[test]
    fn policy_names() {
        for p in [RxqAssign::RoundRobin, RxqAssign::Cycles, RxqAssign::Group] {
            assert_eq!(p.to_string().parse::<RxqAssign>(), Ok(p));
        }
        assert_eq!(RxqAssign::default(), RxqAssign::Cycles);
        assert!("balanced".parse::<RxqAssign>().is_err());
    }
}
