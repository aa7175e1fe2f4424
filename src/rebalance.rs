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

use std::time::Instant;

use log::{info, warn};
use serde_json::{Value, json};

use crate::control::Control;
use crate::placement::{self, Placement, Policy, QueueId, QueueInfo, ThreadInfo};

impl Control {
    fn thread_infos(&self) -> Vec<ThreadInfo> {
        self.threads.iter().map(|t| ThreadInfo { core: t.core, node: t.numa_node }).collect()
    }

    /// Every receive queue with its node, pinning and its cycles over the last interval.
    fn queue_infos(&self) -> Vec<QueueInfo> {
        let loads = crate::ctl_stats::rxq_interval_cycles(self);
        let mut out = Vec::new();
        for pc in self.ports.iter().flatten() {
            let node = pc.numa_node();
            for (q, qc) in pc.cfg.queue_cfg.iter().enumerate() {
                let id = (pc.port.id, q);
                out.push(QueueInfo { id, node, load: loads.get(&id).copied().unwrap_or(0), pinned: qc.affinity });
            }
        }
        out
    }

    fn current_placement(&self) -> Placement {
        Placement { assignment: self.thread_queues.clone(), warnings: Vec::new(), isolated: Vec::new() }
    }

    /// The thread a new queue goes to: its pinned core's thread, else the one with the fewest
    /// queues (round robin from a fresh start).
    pub(crate) fn initial_thread(&self, pinned: Option<usize>) -> usize {
        if let Some(t) = pinned.and_then(|c| self.threads.iter().position(|t| t.core == c)) {
            return t;
        }
        (0..self.thread_queues.len()).min_by_key(|&t| self.thread_queues[t].len()).unwrap_or(0)
    }

    /// Applies a new assignment with two plan swaps (see the module docs). Returns the queues
    /// that moved and how long the move took.
    fn apply(&mut self, target: Vec<Vec<QueueId>>) -> (Vec<(QueueId, usize, usize)>, u128) {
        let t0 = Instant::now();
        let mut moves = Vec::new();
        for (to, qs) in target.iter().enumerate() {
            for id in qs {
                if let Some(from) = self.thread_queues.iter().position(|cur| cur.contains(id))
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
            self.thread_queues[*from].retain(|q| q != id);
        }
        self.publish();
        self.thread_queues = target;
        for qs in &mut self.thread_queues {
            qs.sort();
        }
        self.publish();
        (moves, t0.elapsed().as_micros())
    }

    fn queue_name(&self, id: QueueId) -> String {
        self.port(id.0 as usize)
            .map_or_else(|| format!("#{}:{}", id.0, id.1), |p| format!("{}:{}", p.port.name(), id.1))
    }

    /// `rebalance [POLICY]`: recomputes placement and moves queues to match it.
    pub fn rebalance(&mut self, policy: Option<&str>) -> Result<Value, String> {
        let policy: Policy = match policy {
            Some(p) => p.parse()?,
            None => self.cfg.rxq_assign,
        };
        let queues = self.queue_infos();
        let name = |id: QueueId| self.queue_name(id);
        let p = placement::place_named(&self.thread_infos(), &queues, policy, self.cfg.rxq_isolate, &name);
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
        Ok(json!({
            "policy": policy.to_string(),
            "moved": moved,
            "took_us": took_us,
            "spread_before": before,
            "spread_after": after,
            "warnings": p.warnings,
        }))
    }

    /// `move PORT:QUEUE THREAD`: one queue to one thread (a manual override until the next
    /// rebalance).
    pub fn move_queue(&mut self, args: &[String]) -> Result<Value, String> {
        let usage = "move: expected PORT:QUEUE THREAD, e.g. move vm1:0 1";
        let [q, t] = args else { return Err(usage.into()) };
        let (pname, qn) = q.rsplit_once(':').ok_or(usage)?;
        let qn: usize = qn.parse().map_err(|_| usage.to_string())?;
        let to: usize = t.parse().map_err(|_| usage.to_string())?;
        let pc =
            self.ports.iter().flatten().find(|p| p.port.name() == pname).ok_or(format!("move: no port {pname}"))?;
        let id = (pc.port.id, qn);
        if to >= self.thread_queues.len() {
            return Err(format!("move: no poll thread {to} (there are {})", self.thread_queues.len()));
        }
        let Some(from) = self.thread_queues.iter().position(|qs| qs.contains(&id)) else {
            return Err(format!("move: port {pname} has no queue {qn}"));
        };
        let mut target = self.thread_queues.clone();
        target[from].retain(|x| *x != id);
        target[to].push(id);
        let (moves, took_us) = self.apply(target);
        Ok(json!({ "moved": !moves.is_empty(), "from": from, "to": to, "took_us": took_us }))
    }

    /// Called once a second: with `auto_rebalance`, every `rebalance_interval_s`, rebalances if
    /// some thread was busier than the threshold and the new placement narrows the spread of
    /// load between threads by the configured margin.
    pub fn maybe_auto_rebalance(&mut self) {
        if !self.cfg.auto_rebalance || self.last_rebalance.elapsed().as_secs() < self.cfg.rebalance_interval_s as u64 {
            return;
        }
        self.last_rebalance = Instant::now();
        let busiest = crate::ctl_stats::busy_pct_last(self).into_iter().fold(0.0, f64::max);
        if busiest < self.cfg.rebalance_threshold_pct as f64 {
            return;
        }
        let queues = self.queue_infos();
        let p = placement::place(&self.thread_infos(), &queues, self.cfg.rxq_assign, self.cfg.rxq_isolate);
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
