//! Tests of the policy over the simulated storage, by concern.

mod cache;
mod classes;
mod compaction;
mod fixtures;
mod growth;
mod settings;
