//! `stats` (each poll thread) and `rxq` (each receive queue).

use serde::{Deserialize, Serialize};

use super::{Drops, RxqTotals};

/// `stats`: counters since start, or since `stats --clear`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsReply {
    pub uptime_secs: u64,
    pub tsc_hz: u64,
    pub cleared_secs_ago: Option<f64>,
    pub threads: Vec<ThreadStats>,
    /// Flow export's own counts since it was configured (None: no `[ipfix]`).
    #[serde(default)]
    pub flow_export: Option<FlowExportStats>,
}

/// What flow export (`[ipfix]`) did: frames it looked at, flows it holds, records and
/// messages sent, and what it lost (never silently).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowExportStats {
    pub collector: String,
    pub sampling: u32,
    /// Frames taken into a flow (one in `sampling`).
    pub observed: u64,
    /// Flows the poll threads' tables hold now.
    pub flows: u64,
    /// Flow records sent, and the messages that carried them (templates too).
    pub records: u64,
    pub messages: u64,
    /// New flows not recorded: a poll thread's table held `max_flows` already.
    pub flows_not_recorded: u64,
    /// Bursts not looked at (a poll thread found its table taken by the control thread).
    pub bursts_missed: u64,
    /// Messages the socket refused (lost).
    pub send_errors: u64,
}

/// One poll thread.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadStats {
    pub thread: usize,
    pub core: usize,
    pub numa_node: Option<usize>,
    /// Its receive queues, as "PORT:QUEUE".
    pub queues: Vec<String>,
    /// How the thread polls, as it runs (not the configuration's copy).
    pub poll_mode: PollMode,
    pub running: RunningInfo,
    pub iterations: u64,
    pub busy_cycles: u64,
    pub idle_cycles: u64,
    pub busy_pct: f64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub cycles_per_packet: f64,
    pub avg_rx_burst: f64,
    pub avg_tx_batch: f64,
    pub interrupts: u64,
    pub drops: Drops,
    pub sleeps: u64,
    pub sleeping: bool,
    pub asleep_secs: f64,
    pub wakeups: Wakeups,
    /// Its queues parked now, and what parking did.
    pub parked: u64,
    pub parking: Parking,
    pub wake_latency_us: Vec<WakeBucket>,
    /// Rates over the last sample interval (None before two samples).
    pub last_interval: Option<ThreadInterval>,
}

/// The polling settings a poll thread took from its last plan (a reload's reach them there).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunningInfo {
    pub burst: u64,
    pub rx_retry_us: u64,
    /// Adaptive polling: idle microseconds before it sleeps (None: it polls busily).
    pub idle_before_sleep_us: Option<u64>,
    pub nic_poll_interval_us: u64,
    #[serde(default)]
    pub nic_poll_max_us: u64,
    /// How long the thread's latest sleep on the NIC timer was to last: `nic_poll_interval_us`
    /// after a frame, doubled by each sleep that found nothing, up to `nic_poll_max_us`; 0 when
    /// every NIC queue it polls wakes it by interrupt (no timer). The ceiling alone when its
    /// only timer is the safety net of interrupts that must be armed.
    #[serde(default)]
    pub nic_sleep_us: u64,
    /// Parking: queues empty this long are parked (0: never); their kicks are looked at this often.
    pub park_after_us: u64,
    pub park_check_us: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PollMode {
    #[default]
    Busy,
    Adaptive,
}

/// Why a sleeping poll thread woke up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wakeups {
    pub kick: u64,
    pub control: u64,
    /// By the NIC poll timer.
    pub timeout: u64,
    /// By a NIC queue's receive interrupt.
    #[serde(default)]
    pub interrupt: u64,
}

/// What a thread's parking did: queues parked, polled again (by a kick, after a control
/// wake-up, by the sweep), and looks at the parked queues' kicks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parking {
    pub parks: u64,
    pub unparks_kick: u64,
    pub unparks_control: u64,
    pub unparks_sweep: u64,
    pub checks: u64,
}

/// Control wake-ups that took less than `below_us` microseconds (None: the open last bucket).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeBucket {
    pub below_us: Option<u64>,
    pub count: u64,
}

/// A poll thread over the last sample interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadInterval {
    pub seconds: f64,
    pub rx_pps: f64,
    pub tx_pps: f64,
    pub rx_bps: f64,
    pub busy_pct: f64,
    pub cycles_per_packet: f64,
}

/// One receive queue (`rxq`): its thread and its share of that thread's busy cycles.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RxqInfo {
    pub port: String,
    pub queue: usize,
    pub thread: usize,
    pub core: usize,
    pub numa_node: Option<usize>,
    pub busy_share_pct: f64,
    /// Parked now: not polled, its kicks watched (`parks`/`unparks` count the times).
    pub parked: bool,
    /// What wakes its thread for it in adaptive polling (None: a port of neither kind).
    #[serde(default)]
    pub woken_by: Option<WokenBy>,
    pub last_interval: Option<RxqInterval>,
    /// The queue's counters (their fields inline).
    #[serde(flatten)]
    pub counters: RxqTotals,
}

/// What wakes a sleeping poll thread for a receive queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WokenBy {
    /// A guest's TX queue: its kicks.
    Kick,
    /// A NIC queue with a receive interrupt that signals by itself (net_tap).
    Interrupt,
    /// A NIC queue whose interrupt is armed before each sleep (a NIC's register), with the
    /// timer at `nic_poll_max_us` as its safety net.
    ArmedInterrupt,
    /// A NIC queue without interrupts: the NIC timer, backing off to `nic_poll_max_us`.
    Timer,
}

/// A receive queue over the last sample interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RxqInterval {
    pub seconds: f64,
    pub pps: f64,
    pub busy_share_pct: f64,
}
