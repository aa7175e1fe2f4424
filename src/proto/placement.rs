//! Replies of `rebalance` and `move`.

use serde::{Deserialize, Serialize};

/// What `rebalance` did .
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Rebalanced {
    /// The placement policy used.
    pub policy: String,
    /// Each queue moved, as "PORT:QUEUE thread FROM -> TO".
    pub moved: Vec<String>,
    pub took_us: u64,
    /// The spread of load between threads before and after (`placement::spread`).
    pub spread_before: f64,
    pub spread_after: f64,
    pub warnings: Vec<String>,
}

/// What `move` did .
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moved {
    /// False when the queue already was on that thread.
    pub moved: bool,
    pub from: usize,
    pub to: usize,
    pub took_us: u64,
}
