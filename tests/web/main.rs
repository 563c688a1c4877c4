//! The browser suite: the crate on WebGPU in a browser (Chromium, through wasm-bindgen's test
//! runner and chromedriver; `webdriver.json` gives Chromium its flags). Every test awaits the
//! `_async` forms a page must use; nothing blocks. A test never passes without an adapter: the
//! helper fails with what to run instead.
//!
//! Run: `sh tests/web/run.sh` (it installs nothing; `.ci/run` installs what it needs).
//! Native builds compile this binary empty.
#![cfg(target_arch = "wasm32")]

wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

mod compute;
mod graph;
mod lifecycle;
mod limits;
mod pool;
mod report;
mod serve;
mod support;
mod tint;
mod transformer;
