//! One integration-test binary (links once): GPU tests run on whatever adapter
//! `WGPU_BACKEND` selects; CI runs them on Vulkan (lavapipe) and GL (llvmpipe).

mod attention;
mod compact;
mod compute;
mod coop;
mod custom;
mod examples;
mod f16;
mod gpu;
mod graph;
mod layering;
mod pool;
mod report;
mod serve;
mod serve_scheduling;
mod smoke;
mod transformer;
