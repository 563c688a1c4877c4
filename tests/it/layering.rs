//! Layering invariants of ARCHITECTURE.md, checked on the source text.

use std::path::Path;

fn rust_files(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// The modules that must run without a GPU: the allocator core, the policy, the replay that drives
/// the policy offline, the snapshot format, the history, and the plain-data exporters.
const PURE_MODULES: &[&str] = &[
    "src/buddy",
    "src/policy",
    "src/replay",
    "src/snapshot",
    "src/history",
];

#[test]
fn the_pure_layers_know_nothing_of_wgpu() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    for module in PURE_MODULES {
        let mut files = Vec::new();
        let path = root.join(module);
        if path.is_dir() {
            rust_files(&path, &mut files);
        }
        if path.with_extension("rs").is_file() {
            files.push(path.with_extension("rs"));
        }
        for file in files {
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
            for (number, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                assert!(
                    !code.contains("wgpu::")
                        && !code.contains("use wgpu")
                        && !code.contains("crate::device")
                        && !code.contains("crate::pool"),
                    "{}:{}: the pure layer must not use wgpu or the GPU layers: {line}",
                    file.display(),
                    number + 1
                );
            }
            checked += 1;
        }
    }
    assert!(
        checked >= 3,
        "expected to check the core's files, checked {checked}"
    );
}
