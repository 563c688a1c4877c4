#!/usr/bin/env sh
# Runs the browser suite (tests/web) in headless Chromium: WebGPU on SwiftShader, driven by
# wasm-bindgen's test runner through chromedriver (webdriver.json gives Chromium its flags).
# Needs: the wasm32-unknown-unknown target, wasm-bindgen-cli of the crate's wasm-bindgen
# version, Debian's chromium and chromium-driver (`.ci/run` installs them). Extra arguments go
# to `cargo test` (e.g. a test name filter after `--`).
set -eu
cd "$(dirname "$0")/../.."
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner
export CHROMEDRIVER="${CHROMEDRIVER:-$(command -v chromedriver)}"
# The whole suite runs in one page; SwiftShader is a CPU.
export WASM_BINDGEN_TEST_TIMEOUT="${WASM_BINDGEN_TEST_TIMEOUT:-1800}"
exec cargo test --target wasm32-unknown-unknown --test web "$@"
