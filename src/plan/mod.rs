#![deny(unsafe_code)]
//! Memory planning for buffers with known lifetimes.

mod buffers;
mod exact;
mod greedy;
mod place;
mod problem;
mod rng;
mod search;
mod skyline;
#[cfg(test)]
mod tests;

pub use buffers::{max_live_bytes, Buffer, Placement, Plan, PlanError, PlanOptions};
pub use greedy::greedy_by_size;
pub use search::plan;
