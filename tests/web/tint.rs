//! The browser's own WGSL compiler (Tint, in Chromium) on every module the crate can generate
//! for the adapter (`compute::shader_catalog`): each must compile with no error message. The
//! modules the adapter could never be asked for are listed as skipped, with the reason.

use std::collections::BTreeMap;

use wasm_bindgen_test::wasm_bindgen_test;
use wgpu_pool::compute::shader_catalog;
use wgpu_pool::LimitsChoice;

use crate::support::gpu_with;

/// Modules created before their compilation messages are awaited (each await is a trip
/// through the browser's event loop).
const BATCH: usize = 64;

/// Compiles every module of the catalog for a device of `limits` with Tint and fails on any
/// error; with `list`, logs every module compiled and every one skipped, with the reason (run
/// with `--nocapture` to see it).
async fn every_module_compiles(limits: LimitsChoice, list: bool) {
    let gpu = gpu_with(limits).await;
    let catalog = shader_catalog(&gpu);
    let mut failures = Vec::new();
    let mut compiled: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for batch in catalog.modules.chunks(BATCH) {
        let modules: Vec<_> = batch
            .iter()
            .map(|shader| {
                let wgsl = shader.wgsl();
                let module = gpu
                    .device
                    .create_shader_module(wgpu::ShaderModuleDescriptor {
                        label: Some("tint check"),
                        source: wgpu::ShaderSource::Wgsl(wgsl.into()),
                    });
                (shader, module)
            })
            .collect();
        for (shader, module) in modules {
            let info = module.get_compilation_info().await;
            let errors: Vec<String> = info
                .messages
                .iter()
                .filter(|message| message.message_type == wgpu::CompilationMessageType::Error)
                .map(|message| message.message.clone())
                .collect();
            let name = shader.name();
            let kernel = name.split([' ', '+']).next().unwrap_or("").to_owned();
            compiled.entry(kernel).or_default().push(name.clone());
            if !errors.is_empty() {
                failures.push(format!("{name}: {}", errors.join(" | ")));
            }
        }
    }
    let mut skipped: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (shader, reason) in &catalog.skipped {
        let reason = reason.split(':').next().unwrap_or(reason).to_owned();
        skipped.entry(reason).or_default().push(shader.name());
    }
    let counts = |map: &BTreeMap<String, Vec<String>>| -> Vec<String> {
        map.iter()
            .map(|(key, names)| format!("{key}: {}", names.len()))
            .collect()
    };
    let report = format!(
        "Tint ({limits:?}, {:?} {}): {} modules compiled, {} with errors; by kernel {:?}; \
         skipped {} ({:?})",
        gpu.info.backend,
        gpu.info.name,
        catalog.modules.len(),
        failures.len(),
        counts(&compiled),
        catalog.skipped.len(),
        counts(&skipped),
    );
    web_sys::console::log_1(&report.as_str().into());
    if list {
        for (kernel, names) in &compiled {
            let line = format!("compiled, {kernel} ({}): {}", names.len(), names.join(", "));
            web_sys::console::log_1(&line.into());
        }
        for (reason, names) in &skipped {
            let line = format!("skipped, {reason} ({}): {}", names.len(), names.join(", "));
            web_sys::console::log_1(&line.into());
        }
    }
    assert!(
        failures.is_empty(),
        "{report}\nthe first failures:\n{}",
        failures[..failures.len().min(5)].join("\n")
    );
    assert!(catalog.modules.len() > 100, "{report}");
}

#[wasm_bindgen_test]
async fn tint_compiles_every_module_for_the_adapters_limits() {
    every_module_compiles(LimitsChoice::Adapter, true).await;
}

#[wasm_bindgen_test]
async fn tint_compiles_every_module_for_the_default_limits() {
    every_module_compiles(LimitsChoice::WebGpuDefault, false).await;
}
