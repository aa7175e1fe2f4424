//! Moving receive queues between poll threads while traffic flows: `pvswitchctl rebalance`
//! (recompute placement with the configured policy and apply it), `pvswitchctl move PORT:Q N`
//! (one queue to thread N), and automatic rebalancing.
//!
//! A move is two plan swaps. First every moving queue leaves its old thread's plan, and the
//! control thread waits until each thread has adopted that plan: from then on the old thread
//! never touches the queue (it adopts plans between loop iterations, never inside a visit).
//! Then the queues join their new threads' plans. In between, frames simply wait in the guest's
//! ring. So a queue is never polled by two threads at once (its ring lock would serialize them
//! anyway), and no frame is lost, duplicated or reordered: the ring itself carries the order.

use crate::proto::{MoveReply as Moved, RebalanceReply as Rebalanced};
use std::time::Instant;

use log::{info, warn};

use super::placement::{self, Placement, QueueId, QueueInfo, ThreadInfo};
use super::{Switch, ThreadSlot};
use crate::config::RxqAssign;

impl Switch {
    /// The running poll threads' slot indices and what placement needs to know of them.
    fn thread_infos(&self) -> (Vec<usize>, Vec<ThreadInfo>) {
        let slots: Vec<usize> = (0..self.threads.len()).filter(|&i| self.threads[i].live).collect();
        let infos = slots
            .iter()
            .map(|&i| ThreadInfo { core: self.threads[i].core(), node: self.threads[i].stats.numa_node })
            .collect();
        (slots, infos)
    }

    /// A placement over running threads, spread back over all thread slots.
    fn to_slots(&self, slots: &[usize], assignment: Vec<Vec<QueueId>>) -> Vec<Vec<QueueId>> {
        let mut out = vec![Vec::new(); self.threads.len()];
        for (k, qs) in assignment.into_iter().enumerate() {
            out[slots[k]] = qs;
        }
        out
    }

    /// Every receive queue with its node, pinning and its cycles over the last interval.
    fn queue_infos(&self) -> Vec<QueueInfo> {
        let loads = self.rxq_interval_cycles();
        let mut out = Vec::new();
        for ps in self.ports.iter().flatten() {
            let node = ps.numa_node();
            for (q, qc) in ps.cfg.queue_cfg.iter().enumerate() {
                let id = (ps.id(), q);
                out.push(QueueInfo { id, node, load: loads.get(&id).copied().unwrap_or(0), pinned: qc.affinity });
            }
        }
        out
    }

    /// Each thread slot's queues.
    fn assignment(&self) -> Vec<Vec<QueueId>> {
        self.threads.iter().map(|t| t.queues.clone()).collect()
    }

    fn current_placement(&self) -> Placement {
        Placement { assignment: self.assignment(), warnings: Vec::new(), isolated: Vec::new() }
    }

    /// The thread a new queue goes to: its pinned core's thread, else the one with the fewest
    /// queues (round robin from a fresh start).
    pub(crate) fn initial_thread(&self, pinned: Option<usize>) -> usize {
        let live = |t: &usize| self.threads[*t].live;
        if let Some(t) =
            pinned.and_then(|c| (0..self.threads.len()).filter(live).find(|&t| self.threads[t].core() == c))
        {
            return t;
        }
        (0..self.threads.len()).filter(live).min_by_key(|&t| self.threads[t].queues.len()).unwrap_or(0)
    }

    /// Applies a new assignment with two plan swaps (see the module docs). Returns the queues
    /// that moved and how long the move took.
    fn apply(&mut self, target: Vec<Vec<QueueId>>) -> (Vec<(QueueId, usize, usize)>, u64) {
        let t0 = Instant::now();
        let mut moves = Vec::new();
        for (to, qs) in target.iter().enumerate() {
            for id in qs {
                if let Some(from) = self.owner(*id)
                    && from != to
                {
                    moves.push((*id, from, to));
                }
            }
        }
        if moves.is_empty() {
            return (moves, 0);
        }
        for (id, from, _) in &moves {
            self.threads[*from].queues.retain(|q| q != id);
        }
        self.publish();
        for (t, mut qs) in self.threads.iter_mut().zip(target) {
            qs.sort();
            t.queues = qs;
        }
        self.publish();
        (moves, t0.elapsed().as_micros() as u64)
    }

    fn queue_name(&self, id: QueueId) -> String {
        format!("{}:{}", self.port_name(id.0), id.1)
    }

    /// `rebalance [POLICY]`: recomputes placement and moves queues to match it.
    pub fn rebalance(&mut self, policy: Option<RxqAssign>) -> Rebalanced {
        let policy = policy.unwrap_or(self.cfg.rxq_assign);
        let queues = self.queue_infos();
        let name = |id: QueueId| self.queue_name(id);
        let (slots, infos) = self.thread_infos();
        let mut p = placement::place_named(&infos, &queues, policy, self.cfg.rxq_isolate, &name);
        p.assignment = self.to_slots(&slots, p.assignment);
        for w in &p.warnings {
            warn!("rebalance: {w}");
        }
        let before = placement::spread(&self.current_placement().thread_loads(&queues));
        let after = placement::spread(&p.thread_loads(&queues));
        let (moves, took_us) = self.apply(p.assignment.clone());
        let moved: Vec<String> =
            moves.iter().map(|(id, f, t)| format!("{} thread {f} -> {t}", self.queue_name(*id))).collect();
        if !moved.is_empty() {
            info!("rebalance ({policy}): {} in {took_us} us", moved.join(", "));
        }
        Rebalanced {
            policy: policy.to_string(),
            moved,
            took_us,
            spread_before: before,
            spread_after: after,
            warnings: p.warnings,
        }
    }

    /// `move PORT:QUEUE THREAD`: one queue to one thread (a manual override until the next
    /// rebalance).
    pub fn move_queue(&mut self, pname: &str, qn: usize, to: usize) -> Result<Moved, String> {
        let ps = self.port_by_name(pname).ok_or(format!("move: no port {pname}"))?;
        let id = (ps.id(), qn);
        if to >= self.threads.len() || !self.threads[to].live {
            return Err(format!("move: no poll thread {to} (there are {})", self.threads.len()));
        }
        let Some(from) = self.owner(id) else {
            return Err(format!("move: port {pname} has no queue {qn}"));
        };
        let mut target = self.assignment();
        target[from].retain(|x| *x != id);
        target[to].push(id);
        let (moves, took_us) = self.apply(target);
        Ok(Moved { moved: !moves.is_empty(), from, to, took_us })
    }

    /// Called once a second: with `auto_rebalance`, every `rebalance_interval_s`, rebalances if
    /// some thread was busier than the threshold and the new placement narrows the spread of
    /// load between threads by the configured margin.
    pub fn maybe_auto_rebalance(&mut self) {
        if !self.cfg.auto_rebalance || self.last_rebalance.elapsed().as_secs() < self.cfg.rebalance_interval_s as u64 {
            return;
        }
        self.last_rebalance = Instant::now();
        let busiest = self.busy_pct_last().into_iter().fold(0.0, f64::max);
        if busiest < self.cfg.rebalance_threshold_pct as f64 {
            return;
        }
        let queues = self.queue_infos();
        let (slots, infos) = self.thread_infos();
        let mut p = placement::place(&infos, &queues, self.cfg.rxq_assign, self.cfg.rxq_isolate);
        p.assignment = self.to_slots(&slots, p.assignment);
        let gain = placement::improvement(&self.current_placement(), &p, &queues);
        if gain * 100.0 >= self.cfg.rebalance_improvement_pct as f64 {
            info!(
                "auto rebalance: a thread was {busiest:.0}% busy; the new placement narrows the load spread by {:.0}%",
                gain * 100.0
            );
            let (moves, took_us) = self.apply(p.assignment);
            info!("auto rebalance: {} queues moved in {took_us} us", moves.len());
        }
    }
}

/// Starting and stopping poll threads: at start, at shutdown, and when a reload changes
/// `poll_cores` (queues leave a removed core's thread by the same two plan swaps as any move).
impl Switch {
    /// Applies a new `poll_cores` list: starts threads on new cores, moves every queue off
    /// threads whose core is gone (then stops them), and spreads queues over the threads with
    /// the configured policy. Returns a summary.
    pub(crate) fn set_poll_cores(&mut self, cores: &[usize]) -> Result<String, String> {
        let running: Vec<usize> = (0..self.threads.len()).filter(|&i| self.threads[i].live).collect();
        let added: Vec<usize> =
            cores.iter().copied().filter(|c| running.iter().all(|&i| self.threads[i].core() != *c)).collect();
        let removed: Vec<usize> =
            running.iter().copied().filter(|&i| !cores.contains(&self.threads[i].core())).collect();
        if added.is_empty() && removed.is_empty() {
            return Ok(String::new());
        }
        let numa = crate::topology::Numa::discover();
        for &core in &added {
            let i = self.threads.len();
            self.threads.push(ThreadSlot::new(core, &numa));
            let plan = self.plans().pop().expect("the new thread's plan");
            self.spawn(i, plan).map_err(|e| format!("poll core {core}: {e}"))?;
            info!("poll thread {i} started on core {core}");
        }
        // Queues of removed threads go to the remaining ones, then the policy spreads them.
        for &i in &removed {
            self.threads[i].live = false;
        }
        let mut target = self.assignment();
        for &i in &removed {
            let orphans = std::mem::take(&mut target[i]);
            for q in orphans {
                let t =
                    (0..target.len()).filter(|&t| self.threads[t].live).min_by_key(|&t| target[t].len()).unwrap_or(0);
                target[t].push(q);
            }
        }
        self.apply(target);
        for &i in &removed {
            self.stop_thread(i);
            info!("poll thread {i} on core {} stopped", self.threads[i].core());
        }
        let r = self.rebalance(None);
        Ok(format!(
            "poll cores: {} added, {} removed, {} queues moved by {}",
            added.len(),
            removed.len(),
            r.moved.len(),
            r.policy
        ))
    }
}
