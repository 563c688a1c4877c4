#![doc = include_str!("../README.md")]

pub mod buddy;
pub mod compute;
pub mod device;
pub mod history;
pub mod plan;
pub mod policy;
pub mod pool;
pub mod replay;
pub mod report;
pub mod snapshot;
pub mod state;

pub use buddy::{BuddyAllocator, Rounding};
pub use device::{request_gpu, Gpu, LimitsChoice};
pub use history::{History, HistoryOptions};
pub use policy::{PolicyConfig, PoolStats};
pub use pool::{
    AllocOptions, Allocation, Compaction, OpScope, Pool, PoolError, PoolOptions, ReuseSafety,
};
pub use report::Report;
