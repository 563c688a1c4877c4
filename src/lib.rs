#![doc = include_str!("../README.md")]
// In a browser wgpu's handles are neither `Send` nor `Sync` (the page has one thread), so the
// `Arc`s that share them natively hold types that are not there either.
#![cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]

pub mod buddy;
pub mod compute;
mod device;
pub mod history;
pub mod model;
pub mod paging;
pub mod plan;
pub mod policy;
mod pool;
pub mod replay;
pub mod report;
mod rng;
pub mod scheduler;
pub mod serve;
pub mod snapshot;
pub mod state;

pub use device::{
    adapters, adapters_async, fresh_instance, instance, open, open_async, open_with,
    open_with_async, request_gpu, request_gpu_async, request_gpu_with, request_gpu_with_async,
    DeviceError, Gpu, GpuOptions, LimitsChoice, OPTIONAL_FEATURES, SPIN_BEFORE_BLOCKING,
};
pub use pool::{
    AllocOptions, Allocation, BudgetScope, Compaction, OomObserver, OomReport, OpScope, Pool,
    PoolError, PoolOptions, ReuseSafety, MAX_STAGING_BYTES, SEGMENT_USAGES,
};
