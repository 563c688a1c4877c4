#![doc = include_str!("../README.md")]

pub mod buddy;
pub mod device;
pub mod policy;
pub mod replay;
pub mod snapshot;
