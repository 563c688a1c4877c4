#!/usr/bin/env sh
# Builds the page of examples/web_serve.rs into target/web (index.html and pkg/): the example
# compiled for wasm32-unknown-unknown, then bound to JavaScript by wasm-bindgen (the CLI of the
# crate's wasm-bindgen version: `cargo install wasm-bindgen-cli --version <that version>`).
# Serve target/web with any static server. PROFILE=dev builds faster, unoptimised.
set -eu
cd "$(dirname "$0")/.."
profile="${PROFILE:-release}"
cargo build --profile "$profile" --target wasm32-unknown-unknown --example web_serve
case "$profile" in dev) dir=debug ;; *) dir="$profile" ;; esac
target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target/web"
wasm-bindgen --target web --no-typescript --out-dir "$target/web/pkg" \
  "$target/wasm32-unknown-unknown/$dir/examples/web_serve.wasm"
cp web/index.html "$target/web/index.html"
echo "built $target/web: serve it (python3 -m http.server -d $target/web 8000) and open it in a browser with WebGPU"
