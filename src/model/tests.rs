//! The model layer's tests, without a GPU: the layout, round trips through files and bytes, every
//! refusal of a bad file, the `transformer.` prefix, f16 and bf16 widening, metadata from the
//! caller, and the seed's determinism.

use std::collections::HashMap;
use std::path::PathBuf;

use safetensors::tensor::TensorView;
use safetensors::Dtype;

use super::config::{Gpt2Config, METADATA_KEYS};
use super::error::{ConfigError, ConfigSource, TokensError, WeightsError};
use super::layout::{gpt2_layout, Init};
use super::reference::GreedyAgreement;
use super::weights::Gpt2Weights;
use super::write::{write_random, StoredDtype};

/// A model small enough to cut its file at every byte.
fn micro() -> Gpt2Config {
    Gpt2Config {
        n_layer: 1,
        n_embd: 8,
        n_head: 2,
        n_ctx: 4,
        vocab_size: 8,
    }
}

fn temp_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wgpu-pool-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

/// One tensor to put in a hand-made file: name, type, shape, bytes.
type Raw = (String, Dtype, Vec<usize>, Vec<u8>);

/// The weights' tensors as raw f32 entries, names prefixed.
fn raw_tensors(weights: &Gpt2Weights, prefix: &str) -> Vec<Raw> {
    weights
        .tensors()
        .into_iter()
        .map(|(spec, values)| {
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            (
                format!("{prefix}{}", spec.name),
                Dtype::F32,
                spec.shape,
                bytes,
            )
        })
        .collect()
}

/// A safetensors file made by the safetensors crate from raw entries.
fn file_of(tensors: &[Raw], metadata: Option<HashMap<String, String>>) -> Vec<u8> {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            let view = TensorView::new(*dtype, shape.clone(), bytes).expect("consistent view");
            (name.clone(), view)
        })
        .collect();
    safetensors::serialize(views, metadata).expect("serialize")
}

fn tiny_weights() -> Gpt2Weights {
    Gpt2Weights::random(&Gpt2Config::tiny(), 1).expect("tiny is valid")
}

#[test]
fn the_layout_is_hugging_faces_gpt2() {
    let config = Gpt2Config::gpt2_small();
    config.validate().expect("GPT-2 small is valid");
    let layout = gpt2_layout(&config);
    assert_eq!(layout.len(), 2 + 12 * 12 + 2);
    let shape = |name: &str| {
        layout
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("{name} in the layout"))
            .shape
            .clone()
    };
    assert_eq!(shape("wte.weight"), [50257, 768]);
    assert_eq!(shape("wpe.weight"), [1024, 768]);
    assert_eq!(shape("h.0.ln_1.weight"), [768]);
    assert_eq!(shape("h.0.attn.c_attn.weight"), [768, 2304]);
    assert_eq!(shape("h.0.attn.c_attn.bias"), [2304]);
    assert_eq!(shape("h.5.attn.c_proj.weight"), [768, 768]);
    assert_eq!(shape("h.11.ln_2.bias"), [768]);
    assert_eq!(shape("h.11.mlp.c_fc.weight"), [768, 3072]);
    assert_eq!(shape("h.11.mlp.c_fc.bias"), [3072]);
    assert_eq!(shape("h.11.mlp.c_proj.weight"), [3072, 768]);
    assert_eq!(shape("h.11.mlp.c_proj.bias"), [768]);
    assert_eq!(shape("ln_f.weight"), [768]);
    assert!(layout.iter().all(|s| !s.name.starts_with("lm_head")));
    // GPT-2 small's published parameter count, lm_head tied.
    assert_eq!(config.parameter_count(), 124_439_808);
    let total: usize = layout.iter().map(|s| s.len()).sum();
    assert_eq!(total, config.parameter_count());
    let residual = 0.02 / 24f32.sqrt();
    assert_eq!(
        layout
            .iter()
            .find(|s| s.name == "h.3.mlp.c_proj.weight")
            .map(|s| s.init),
        Some(Init::Normal { std: residual })
    );
    assert_eq!(config.head_dim(), 64);
    assert_eq!(Gpt2Config::tiny().head_dim(), 16);
}

#[test]
fn bad_configurations_are_refused_with_their_field() {
    for (i, field) in METADATA_KEYS.iter().enumerate() {
        let mut config = Gpt2Config::tiny();
        match i {
            0 => config.n_layer = 0,
            1 => config.n_embd = 0,
            2 => config.n_head = 0,
            3 => config.n_ctx = 0,
            _ => config.vocab_size = 0,
        }
        assert_eq!(config.validate(), Err(ConfigError::Zero { field }));
        assert!(matches!(
            Gpt2Weights::random(&config, 0),
            Err(WeightsError::Config(ConfigError::Zero { .. }))
        ));
    }
    let config = Gpt2Config {
        n_head: 5,
        ..Gpt2Config::tiny()
    };
    assert_eq!(
        config.validate(),
        Err(ConfigError::HeadsDoNotDivideWidth {
            n_embd: 64,
            n_head: 5
        })
    );
    let huge = Gpt2Config {
        n_embd: 1 << 40,
        n_head: 1,
        ..Gpt2Config::tiny()
    };
    assert!(matches!(huge.validate(), Err(ConfigError::TooLarge { .. })));
    assert_eq!(huge.parameter_count(), usize::MAX);
}

#[test]
fn random_weights_round_trip_through_a_file() {
    let config = Gpt2Config::tiny();
    let path = temp_path("round-trip.safetensors");
    write_random(&path, &config, 42).expect("write");
    let loaded = Gpt2Weights::load(&path, None).expect("load");
    assert_eq!(
        loaded.weights,
        Gpt2Weights::random(&config, 42).expect("random")
    );
    assert_eq!(loaded.weights.config, config);
    assert!(loaded.config_from_file);
    assert!(loaded.ignored.is_empty());
    assert_eq!(loaded.prefix, "");
    assert_eq!(loaded.weights.blocks.len(), 2);
    assert_eq!(loaded.weights.lm_head(), loaded.weights.wte.as_slice());
    // The file's metadata is the configuration as strings, as config.json gives it.
    let bytes = std::fs::read(&path).expect("read");
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).expect("header");
    let metadata = header.metadata().clone().expect("metadata");
    assert_eq!(metadata["n_layer"], "2");
    assert_eq!(metadata["n_embd"], "64");
    assert_eq!(metadata["n_head"], "4");
    assert_eq!(metadata["n_ctx"], "128");
    assert_eq!(metadata["vocab_size"], "256");
    // Every tensor f32, named without prefix.
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("deserialize");
    assert_eq!(file.len(), gpt2_layout(&config).len());
    let c_attn = file.tensor("h.1.attn.c_attn.weight").expect("present");
    assert_eq!(
        (c_attn.dtype(), c_attn.shape()),
        (Dtype::F32, &[64, 192][..])
    );
    std::fs::remove_file(&path).ok();
}

#[test]
fn random_weights_are_initialised_as_gpt2_and_fixed_by_the_seed() {
    let config = Gpt2Config::tiny();
    let a = Gpt2Weights::random(&config, 9).expect("random");
    assert_eq!(a, Gpt2Weights::random(&config, 9).expect("random"));
    let b = Gpt2Weights::random(&config, 10).expect("random");
    assert_ne!(a.wte, b.wte);
    assert_ne!(a.blocks[1].mlp_c_fc_weight, b.blocks[1].mlp_c_fc_weight);
    // Two files written with one seed hold the same tensors.
    let (p, q) = (
        temp_path("seed-a.safetensors"),
        temp_path("seed-b.safetensors"),
    );
    write_random(&p, &config, 9).expect("write");
    write_random(&q, &config, 9).expect("write");
    let (p_loaded, q_loaded) = (
        Gpt2Weights::load(&p, None).expect("load"),
        Gpt2Weights::load(&q, None).expect("load"),
    );
    assert_eq!(p_loaded.weights, q_loaded.weights);
    assert_eq!(p_loaded.weights, a);
    std::fs::remove_file(&p).ok();
    std::fs::remove_file(&q).ok();
    // GPT-2's initialisation: std 0.02 (residual projections smaller), biases 0, gains 1.
    let std = |v: &[f32]| {
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
        (v.iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / v.len() as f64)
            .sqrt()
    };
    let wte_std = std(&a.wte);
    assert!((0.019..0.021).contains(&wte_std), "wte std {wte_std}");
    let proj_std = std(&a.blocks[0].mlp_c_proj_weight);
    assert!(
        (0.0095..0.0105).contains(&proj_std),
        "c_proj std {proj_std}"
    );
    assert!(a
        .wte
        .iter()
        .all(|x| x.is_finite() && x.abs() <= 0.02 * 3.47));
    assert!(a
        .blocks
        .iter()
        .all(|b| b.ln_1_weight.iter().all(|&x| x == 1.0)));
    assert!(a
        .blocks
        .iter()
        .all(|b| b.attn_c_attn_bias.iter().all(|&x| x == 0.0)));
    assert!(a.ln_f_bias.iter().all(|&x| x == 0.0));
}

#[test]
fn half_and_bfloat_files_are_widened_to_f32() {
    let weights = tiny_weights();
    for (dtype, round) in [
        (
            StoredDtype::F16,
            (|v: f32| half::f16::from_f32(v).to_f32()) as fn(f32) -> f32,
        ),
        (StoredDtype::Bf16, |v: f32| half::bf16::from_f32(v).to_f32()),
    ] {
        let bytes = weights.to_bytes(dtype).expect("to bytes");
        let loaded = Gpt2Weights::from_bytes(&bytes, None).expect("load").weights;
        for ((spec, stored), (_, original)) in loaded.tensors().into_iter().zip(weights.tensors()) {
            let expected: Vec<f32> = original.iter().map(|&v| round(v)).collect();
            assert_eq!(stored, expected.as_slice(), "{} as {dtype:?}", spec.name);
        }
        assert_ne!(loaded.wte, weights.wte, "{dtype:?} rounds");
    }
    // An f16 file written by another tool, one tensor F16 among f32 ones.
    let mut raw = raw_tensors(&weights, "");
    let wte = &mut raw[0];
    wte.1 = Dtype::F16;
    wte.3 = weights
        .wte
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    let loaded = Gpt2Weights::from_bytes(&file_of(&raw, Some(weights.config.to_metadata())), None)
        .expect("mixed types load");
    assert_eq!(loaded.weights.wpe, weights.wpe);
    assert!(loaded
        .weights
        .wte
        .iter()
        .zip(&weights.wte)
        .all(|(a, b)| (a - b).abs() < 1e-4));
}

#[test]
fn names_with_the_transformer_prefix_load_and_extra_tensors_are_listed() {
    let weights = tiny_weights();
    let mut raw = raw_tensors(&weights, "transformer.");
    // GPT2LMHeadModel's export: lm_head (tied) and the attention mask beside the layout.
    let lm_head = raw[0].3.clone();
    raw.push((
        "lm_head.weight".to_owned(),
        Dtype::F32,
        vec![256, 64],
        lm_head,
    ));
    raw.push((
        "transformer.h.0.attn.bias".to_owned(),
        Dtype::BOOL,
        vec![1, 1, 2, 2],
        vec![1, 0, 1, 1],
    ));
    let loaded = Gpt2Weights::from_bytes(&file_of(&raw, Some(weights.config.to_metadata())), None)
        .expect("prefixed names load");
    // The head equals wte bit for bit: the tied head, not kept twice.
    assert_eq!(loaded.weights, weights);
    assert_eq!(loaded.weights.untied_lm_head, None);
    assert_eq!(loaded.prefix, "transformer.");
    assert_eq!(loaded.ignored, ["transformer.h.0.attn.bias"]);
    // Without prefix, Hugging Face's own file carries the masks too.
    let mut raw = raw_tensors(&weights, "");
    raw.push(("h.1.attn.bias".to_owned(), Dtype::F32, vec![1], vec![0; 4]));
    let loaded = Gpt2Weights::from_bytes(&file_of(&raw, Some(weights.config.to_metadata())), None)
        .expect("load");
    assert_eq!(loaded.ignored, ["h.1.attn.bias"]);
    assert_eq!(loaded.prefix, "");
    // A prefixed file missing a tensor names it with its prefix.
    let raw: Vec<Raw> = raw_tensors(&weights, "transformer.")
        .into_iter()
        .filter(|t| t.0 != "transformer.ln_f.bias")
        .collect();
    let error = Gpt2Weights::from_bytes(&file_of(&raw, Some(weights.config.to_metadata())), None)
        .expect_err("missing");
    assert!(
        matches!(&error, WeightsError::MissingTensor { tensor } if tensor == "transformer.ln_f.bias"),
        "{error}"
    );
    // Names that mix the prefix and none: the tensor found under the other is named.
    let raw: Vec<Raw> = raw_tensors(&weights, "transformer.")
        .into_iter()
        .map(|mut t| {
            if t.0 == "transformer.h.1.ln_1.weight" {
                t.0 = "h.1.ln_1.weight".to_owned();
            }
            t
        })
        .collect();
    let error = Gpt2Weights::from_bytes(&file_of(&raw, Some(weights.config.to_metadata())), None)
        .expect_err("mixed");
    assert!(
        matches!(&error, WeightsError::MixedPrefix { tensor, found }
            if tensor == "transformer.h.1.ln_1.weight" && found == "h.1.ln_1.weight"),
        "{error}"
    );
}

#[test]
fn a_missing_tensor_a_wrong_shape_or_type_is_refused_naming_the_tensor() {
    let weights = tiny_weights();
    let metadata = Some(weights.config.to_metadata());
    let raw = raw_tensors(&weights, "");
    let missing: Vec<Raw> = raw
        .iter()
        .filter(|t| t.0 != "h.1.mlp.c_fc.bias")
        .cloned()
        .collect();
    let error =
        Gpt2Weights::from_bytes(&file_of(&missing, metadata.clone()), None).expect_err("missing");
    assert!(
        matches!(&error, WeightsError::MissingTensor { tensor } if tensor == "h.1.mlp.c_fc.bias"),
        "{error}"
    );
    assert!(error.to_string().contains("h.1.mlp.c_fc.bias"));

    // c_attn stored [out, in] (nn.Linear's layout), not Conv1D's [in, out].
    let mut transposed = raw.clone();
    let entry = transposed
        .iter_mut()
        .find(|t| t.0 == "h.0.attn.c_attn.weight")
        .expect("present");
    entry.2 = vec![192, 64];
    let error =
        Gpt2Weights::from_bytes(&file_of(&transposed, metadata.clone()), None).expect_err("shape");
    match &error {
        WeightsError::Shape {
            tensor,
            expected,
            found,
        } => {
            assert_eq!(tensor, "h.0.attn.c_attn.weight");
            assert_eq!(expected, &[64, 192]);
            assert_eq!(found, &[192, 64]);
        }
        other => panic!("expected a shape error, got {other}"),
    }
    assert!(error.to_string().contains("[192, 64]"), "{error}");

    // A configuration that disagrees with the tensors: wte has 256 rows, the metadata says 300.
    let mut wrong = weights.config;
    wrong.vocab_size = 300;
    let error = Gpt2Weights::from_bytes(&file_of(&raw, Some(wrong.to_metadata())), None)
        .expect_err("shape");
    assert!(
        matches!(&error, WeightsError::Shape { tensor, expected, found }
            if tensor == "wte.weight" && expected == &[300, 64] && found == &[256, 64]),
        "{error}"
    );

    // f64 (and integers) are refused with the tensor's name and type.
    for (dtype, width) in [(Dtype::F64, 8), (Dtype::I32, 4)] {
        let mut typed = raw.clone();
        let entry = typed
            .iter_mut()
            .find(|t| t.0 == "ln_f.weight")
            .expect("present");
        entry.1 = dtype;
        entry.3 = vec![0; 64 * width];
        let error =
            Gpt2Weights::from_bytes(&file_of(&typed, metadata.clone()), None).expect_err("dtype");
        assert!(
            matches!(&error, WeightsError::Dtype { tensor, found }
                if tensor == "ln_f.weight" && *found == dtype.to_string()),
            "{error}"
        );
    }
}

#[test]
fn the_configuration_comes_from_the_caller_when_the_metadata_lacks_it() {
    let weights = tiny_weights();
    let raw = raw_tensors(&weights, "");
    // Hugging Face's own files: only `format`.
    let hf_metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    for metadata in [None, Some(hf_metadata)] {
        let bytes = file_of(&raw, metadata);
        let error = Gpt2Weights::from_bytes(&bytes, None).expect_err("no configuration");
        assert!(
            matches!(error, WeightsError::MissingMetadata { key: "n_layer" }),
            "{error}"
        );
        let loaded = Gpt2Weights::from_bytes(&bytes, Some(&Gpt2Config::tiny())).expect("load");
        assert_eq!(loaded.weights, weights);
        assert!(!loaded.config_from_file);
        // A caller's configuration that does not fit the tensors: other layers than the
        // file's blocks, or a shape error.
        let error = Gpt2Weights::from_bytes(&bytes, Some(&Gpt2Config::gpt2_small()))
            .expect_err("wrong configuration");
        assert!(
            matches!(
                error,
                WeightsError::LayerCount {
                    file_blocks: 2,
                    n_layer: 12
                }
            ),
            "{error}"
        );
        let wider = Gpt2Config {
            n_embd: 128,
            ..Gpt2Config::tiny()
        };
        let error = Gpt2Weights::from_bytes(&bytes, Some(&wider)).expect_err("wrong width");
        assert!(matches!(error, WeightsError::Shape { .. }), "{error}");
    }
    // Part of it in the file, the rest from the caller.
    let partial = HashMap::from([("n_layer".to_owned(), "2".to_owned())]);
    let bytes = file_of(&raw, Some(partial));
    let error = Gpt2Weights::from_bytes(&bytes, None).expect_err("partial");
    assert!(
        matches!(error, WeightsError::MissingMetadata { key: "n_embd" }),
        "{error}"
    );
    let loaded = Gpt2Weights::from_bytes(&bytes, Some(&Gpt2Config::tiny())).expect("load");
    assert_eq!(loaded.weights, weights);
    // The file's and the caller's disagree.
    let error = Gpt2Weights::from_bytes(
        &file_of(&raw, Some(weights.config.to_metadata())),
        Some(&Gpt2Config {
            n_head: 8,
            ..Gpt2Config::tiny()
        }),
    )
    .expect_err("mismatch");
    assert!(
        matches!(
            error,
            WeightsError::ConfigMismatch {
                key: "n_head",
                first: ConfigSource::Metadata,
                first_value: 4,
                second: ConfigSource::Caller,
                second_value: 8
            }
        ),
        "{error}"
    );
}

#[test]
fn bad_metadata_is_refused_with_its_key() {
    let weights = tiny_weights();
    let raw = raw_tensors(&weights, "");
    for (key, value) in [
        ("n_layer", "twelve"),
        ("n_embd", "-64"),
        ("n_ctx", "1.5"),
        ("vocab_size", ""),
        ("n_head", "99999999999999999999999999"),
    ] {
        let mut metadata = weights.config.to_metadata();
        metadata.insert(key.to_owned(), value.to_owned());
        let error = Gpt2Weights::from_bytes(&file_of(&raw, Some(metadata)), None)
            .expect_err("bad metadata");
        assert!(
            matches!(&error, WeightsError::BadMetadata { key: k, value: v } if *k == key && v == value),
            "{key} = {value:?}: {error}"
        );
    }
    let mut metadata = weights.config.to_metadata();
    metadata.insert("n_head".to_owned(), "5".to_owned());
    let error = Gpt2Weights::from_bytes(&file_of(&raw, Some(metadata)), None).expect_err("bad");
    assert!(
        matches!(
            error,
            WeightsError::Config(ConfigError::HeadsDoNotDivideWidth {
                n_embd: 64,
                n_head: 5
            })
        ),
        "{error}"
    );
    let mut metadata = weights.config.to_metadata();
    metadata.insert("n_ctx".to_owned(), "0".to_owned());
    let error = Gpt2Weights::from_bytes(&file_of(&raw, Some(metadata)), None).expect_err("zero");
    assert!(
        matches!(
            error,
            WeightsError::Config(ConfigError::Zero { field: "n_ctx" })
        ),
        "{error}"
    );
}

#[test]
fn truncated_files_name_the_tensor_that_runs_past_the_end() {
    let weights = tiny_weights();
    let bytes = weights.to_bytes(StoredDtype::F32).expect("bytes");
    let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    // The file's last tensor by offset (the safetensors crate orders by type, then name).
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("valid");
    let last = file
        .tensors()
        .into_iter()
        .max_by_key(|(_, view)| view.data().as_ptr() as usize)
        .map(|(name, _)| name)
        .expect("tensors");
    let error = Gpt2Weights::from_bytes(&bytes[..bytes.len() - 1], None).expect_err("cut");
    match &error {
        WeightsError::Truncated {
            tensor,
            expected_bytes,
            found_bytes,
        } => {
            assert_eq!(tensor.as_deref(), Some(last.as_str()));
            assert_eq!(*expected_bytes, bytes.len() as u64);
            assert_eq!(*found_bytes, bytes.len() as u64 - 1);
        }
        other => panic!("expected truncated, got {other}"),
    }
    assert!(error.to_string().contains(&last), "{error}");
    // Cut in the middle of the data: the first tensor past the end is named.
    let cut = header_end + (bytes.len() - header_end) / 2;
    let error = Gpt2Weights::from_bytes(&bytes[..cut], None).expect_err("cut");
    let named = match error {
        WeightsError::Truncated {
            tensor: Some(tensor),
            ..
        } => tensor,
        other => panic!("expected truncated naming a tensor, got {other}"),
    };
    let view = file.tensor(&named).expect("a tensor of the file");
    let start = view.data().as_ptr() as usize - bytes.as_ptr() as usize;
    assert!(
        start < cut && start + view.data().len() > cut,
        "{named} straddles the cut"
    );
    // Cut in the header.
    let error = Gpt2Weights::from_bytes(&bytes[..header_end - 3], None).expect_err("cut");
    assert!(
        matches!(error, WeightsError::Truncated { tensor: None, .. }),
        "{error}"
    );
    // A written file cut on disk.
    let path = temp_path("truncated.safetensors");
    std::fs::write(&path, &bytes[..bytes.len() - 100]).expect("write");
    assert!(matches!(
        Gpt2Weights::load(&path, None),
        Err(WeightsError::Truncated {
            tensor: Some(_),
            ..
        })
    ));
    std::fs::remove_file(&path).ok();
}

#[test]
fn files_cut_anywhere_or_corrupted_are_refused_never_a_panic() {
    let weights = Gpt2Weights::random(&micro(), 3).expect("micro is valid");
    let bytes = weights.to_bytes(StoredDtype::F32).expect("bytes");
    for len in 0..bytes.len() {
        assert!(
            Gpt2Weights::from_bytes(&bytes[..len], None).is_err(),
            "{len} of {} bytes accepted",
            bytes.len()
        );
    }
    // Every byte of the header (and the first data bytes) replaced by a few values: an error
    // or a load, never a panic.
    let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    for at in 0..header_end + 16 {
        for value in [0u8, b'"', b'9', b'{', 0xff] {
            let mut corrupt = bytes.clone();
            corrupt[at] = value;
            let _ = Gpt2Weights::from_bytes(&corrupt, None);
        }
    }
    // Not a safetensors file at all, or bytes after the last tensor.
    for junk in [
        &b""[..],
        b"GPT2",
        b"\x05\x00\x00\x00\x00\x00\x00\x00hello",
        b"{\"wte\": 1}",
    ] {
        let error = Gpt2Weights::from_bytes(junk, None).expect_err("junk");
        assert!(
            matches!(
                error,
                WeightsError::NotSafetensors { .. } | WeightsError::Truncated { .. }
            ),
            "{error}"
        );
    }
    let error =
        Gpt2Weights::from_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{]", None).expect_err("bad JSON");
    assert!(
        matches!(error, WeightsError::NotSafetensors { .. }),
        "{error}"
    );
    let mut longer = bytes.clone();
    longer.extend([0; 12]);
    let error = Gpt2Weights::from_bytes(&longer, None).expect_err("trailing");
    assert!(
        matches!(error, WeightsError::Corrupt { tensor: None, .. }),
        "{error}"
    );
    let error = Gpt2Weights::load(temp_path("absent.safetensors"), None).expect_err("absent");
    assert!(matches!(error, WeightsError::Io { .. }), "{error}");
}

#[test]
fn weights_that_do_not_fit_their_configuration_are_not_written_nor_run() {
    let mut weights = tiny_weights();
    weights.blocks[1].mlp_c_fc_bias.pop();
    let error = weights
        .to_bytes(StoredDtype::F32)
        .expect_err("short tensor");
    assert!(
        matches!(&error, WeightsError::Length { tensor, expected: 256, found: 255, .. }
            if tensor == "h.1.mlp.c_fc.bias"),
        "{error}"
    );
    assert!(matches!(
        weights.reference_logits(&[1, 2]),
        Err(WeightsError::Length { .. })
    ));
    let mut weights = tiny_weights();
    weights.blocks.pop();
    assert!(matches!(
        weights.write(temp_path("never.safetensors"), StoredDtype::F32),
        Err(WeightsError::Layers {
            expected: 2,
            found: 1
        })
    ));
    assert!(!temp_path("never.safetensors").exists());
    assert!(matches!(
        weights.reference_logits(&[1, 2]),
        Err(WeightsError::Layers { .. })
    ));
    let mut weights = tiny_weights();
    weights.config.n_head = 5;
    assert!(matches!(
        weights.check(),
        Err(WeightsError::Config(
            ConfigError::HeadsDoNotDivideWidth { .. }
        ))
    ));
    assert!(matches!(
        tiny_weights().reference_logits(&[]),
        Err(WeightsError::Tokens(TokensError::Empty))
    ));
}

#[test]
fn greedy_agreement_counts_the_twins_choices_and_names_the_first_other() {
    let weights = tiny_weights();
    let vocab = weights.config.vocab_size;
    let prompt = [3u32, 14, 15];
    // The twin's own greedy continuation, one token at a time.
    let mut tokens = prompt.to_vec();
    for _ in 0..5 {
        let logits = weights.reference_logits(&tokens).expect("logits");
        let row = &logits[(tokens.len() - 1) * vocab..];
        let best = (0..vocab).fold(0, |b, j| if row[j] > row[b] { j } else { b });
        tokens.push(best as u32);
    }
    let output = tokens[prompt.len()..].to_vec();
    let agreement = weights
        .greedy_agreement(&prompt, &output, 1e-3)
        .expect("agreement");
    assert_eq!(
        (
            agreement.equal,
            agreement.near_ties,
            agreement.disagreements
        ),
        (5, 0, 0)
    );
    assert!(agreement.agrees());
    // Another token at index 2: a disagreement (a near-tie only within its gap).
    let mut other = output.clone();
    other[2] = (other[2] + 1) % vocab as u32;
    let strict = weights
        .greedy_agreement(&prompt, &other, 0.0)
        .expect("agreement");
    assert!(!strict.agrees());
    let first = strict.first_disagreement.expect("a disagreement");
    assert_eq!(
        (first.index, first.token, first.best),
        (2, other[2], output[2])
    );
    assert!(first.gap > 0.0);
    let loose = weights
        .greedy_agreement(&prompt, &other, first.gap)
        .expect("agreement");
    assert!(loose.near_ties >= 1, "{loose:?}");
    // An output token outside the vocabulary is a typed error, not a panic.
    assert!(weights
        .greedy_agreement(&prompt, &[vocab as u32], 1e-3)
        .is_err());
    assert_eq!(
        weights.greedy_agreement(&prompt, &[], 1e-3).unwrap(),
        GreedyAgreement::default()
    );
}

/// The `config.json` Hugging Face's `save_pretrained` writes for a GPT-2 of `config` (its keys
/// as `transformers` writes them for `gpt2`, extras included).
fn hf_config_json(config: &Gpt2Config) -> String {
    format!(
        r#"{{
  "_name_or_path": "gpt2",
  "activation_function": "gelu_new",
  "architectures": [
    "GPT2LMHeadModel"
  ],
  "attn_pdrop": 0.1,
  "bos_token_id": 50256,
  "embd_pdrop": 0.1,
  "eos_token_id": 50256,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2",
  "n_ctx": {n_ctx},
  "n_embd": {n_embd},
  "n_head": {n_head},
  "n_inner": null,
  "n_layer": {n_layer},
  "n_positions": {n_ctx},
  "reorder_and_upcast_attn": false,
  "resid_pdrop": 0.1,
  "scale_attn_by_inverse_layer_idx": false,
  "scale_attn_weights": true,
  "summary_activation": null,
  "summary_first_dropout": 0.1,
  "summary_proj_to_labels": true,
  "summary_type": "cls_index",
  "summary_use_proj": true,
  "task_specific_params": {{
    "text-generation": {{
      "do_sample": true,
      "max_length": 50
    }}
  }},
  "torch_dtype": "float32",
  "transformers_version": "4.44.0",
  "use_cache": true,
  "vocab_size": {vocab_size}
}}
"#,
        n_ctx = config.n_ctx,
        n_embd = config.n_embd,
        n_head = config.n_head,
        n_layer = config.n_layer,
        vocab_size = config.vocab_size,
    )
}

/// `__metadata__` as Hugging Face writes it: only the format.
fn hf_metadata() -> Option<HashMap<String, String>> {
    Some(HashMap::from([("format".to_owned(), "pt".to_owned())]))
}

/// The weights' tensors with each block's causal mask `h.{i}.attn.bias` `[1, 1, n_ctx, n_ctx]`
/// (lower triangle of ones), names without prefix, as Hugging Face's `gpt2` file has them.
fn hf_tensors(weights: &Gpt2Weights) -> Vec<Raw> {
    let n = weights.config.n_ctx;
    let mask: Vec<u8> = (0..n * n)
        .flat_map(|i| f32::from(u8::from(i % n <= i / n)).to_le_bytes())
        .collect();
    let mut raw = raw_tensors(weights, "");
    for layer in 0..weights.config.n_layer {
        raw.push((
            format!("h.{layer}.attn.bias"),
            Dtype::F32,
            vec![1, 1, n, n],
            mask.clone(),
        ));
    }
    raw
}

/// A fresh folder under the test's temporary directory.
fn temp_dir(name: &str) -> PathBuf {
    let dir = temp_path(name);
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).expect("folder");
    dir
}

#[test]
fn a_save_pretrained_folder_loads_with_no_configuration_given() {
    let weights = tiny_weights();
    let dir = temp_dir("save-pretrained");
    let bytes = file_of(&hf_tensors(&weights), hf_metadata());
    std::fs::write(dir.join("model.safetensors"), &bytes).expect("write");
    std::fs::write(dir.join("config.json"), hf_config_json(&weights.config)).expect("write");
    // Without config.json, the file alone has no configuration.
    assert!(matches!(
        Gpt2Weights::from_bytes(&bytes, None),
        Err(WeightsError::MissingMetadata { key: "n_layer" })
    ));
    let from_folder = Gpt2Weights::load(&dir, None).expect("folder loads");
    assert_eq!(from_folder.weights, weights);
    assert_eq!(from_folder.weights.untied_lm_head, None);
    assert_eq!(from_folder.ignored, ["h.0.attn.bias", "h.1.attn.bias"]);
    assert!(!from_folder.config_from_file);
    for key in METADATA_KEYS {
        assert_eq!(
            from_folder.sources_of(key),
            [ConfigSource::ConfigJson],
            "{key}"
        );
    }
    // The file named: its config.json beside it is read too.
    let from_file = Gpt2Weights::load(dir.join("model.safetensors"), None).expect("file loads");
    assert_eq!(from_file, from_folder);
    // The bytes and the text, as a browser has them; the caller's agreeing configuration.
    let json = hf_config_json(&weights.config);
    let from_bytes =
        Gpt2Weights::from_bytes_with_config_json(&bytes, Some(&json), Some(&Gpt2Config::tiny()))
            .expect("bytes load");
    assert_eq!(from_bytes.weights, weights);
    assert_eq!(
        from_bytes.sources_of("n_ctx"),
        [ConfigSource::ConfigJson, ConfigSource::Caller]
    );
    // Our own files carry the configuration in __metadata__ too: every source agrees.
    std::fs::write(
        dir.join("model.safetensors"),
        weights.to_bytes(StoredDtype::F32).expect("bytes"),
    )
    .expect("write");
    let ours = Gpt2Weights::load(&dir, None).expect("loads");
    assert_eq!(ours.weights, weights);
    assert!(ours.config_from_file);
    assert_eq!(
        ours.sources_of("vocab_size"),
        [ConfigSource::Metadata, ConfigSource::ConfigJson]
    );
    assert!(ours.sources_of("not_a_field").is_empty());
    // A folder without model.safetensors: the path it looked for.
    let empty = temp_dir("no-model");
    let error = Gpt2Weights::load(&empty, None).expect_err("no file");
    assert!(
        matches!(&error, WeightsError::Io { path, .. } if path.ends_with("model.safetensors")),
        "{error}"
    );
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_dir_all(&empty).ok();
}

#[test]
fn sources_that_disagree_are_refused_naming_the_field() {
    let weights = tiny_weights();
    let ours = weights.to_bytes(StoredDtype::F32).expect("bytes");
    let hf = file_of(&hf_tensors(&weights), hf_metadata());
    let json_with = |config: Gpt2Config| hf_config_json(&config);
    // config.json against the file's __metadata__.
    let json = json_with(Gpt2Config {
        n_head: 8,
        ..Gpt2Config::tiny()
    });
    let error =
        Gpt2Weights::from_bytes_with_config_json(&ours, Some(&json), None).expect_err("mismatch");
    assert!(
        matches!(
            error,
            WeightsError::ConfigMismatch {
                key: "n_head",
                first: ConfigSource::Metadata,
                first_value: 4,
                second: ConfigSource::ConfigJson,
                second_value: 8
            }
        ),
        "{error}"
    );
    assert_eq!(
        error.to_string(),
        "`n_head`: the file's __metadata__ says 4, config.json says 8"
    );
    // config.json against the caller.
    let json = json_with(Gpt2Config::tiny());
    let caller = Gpt2Config {
        vocab_size: 300,
        ..Gpt2Config::tiny()
    };
    let error = Gpt2Weights::from_bytes_with_config_json(&hf, Some(&json), Some(&caller))
        .expect_err("mismatch");
    assert!(
        matches!(
            error,
            WeightsError::ConfigMismatch {
                key: "vocab_size",
                first: ConfigSource::ConfigJson,
                first_value: 256,
                second: ConfigSource::Caller,
                second_value: 300
            }
        ),
        "{error}"
    );
    // n_positions and n_ctx in one config.json that differ.
    let json = json_with(Gpt2Config::tiny()).replace("\"n_ctx\": 128", "\"n_ctx\": 64");
    let error =
        Gpt2Weights::from_bytes_with_config_json(&hf, Some(&json), None).expect_err("context");
    assert!(
        matches!(&error, WeightsError::BadConfigJson { key: Some(key), .. } if key == "n_ctx"),
        "{error}"
    );
    // Only n_positions: it is the context.
    let json = json_with(Gpt2Config::tiny()).replace("\"n_ctx\": 128,", "");
    let loaded = Gpt2Weights::from_bytes_with_config_json(&hf, Some(&json), None).expect("loads");
    assert_eq!(loaded.weights, weights);
    // A config.json that states no shape leaves it to the other sources.
    let loaded = Gpt2Weights::from_bytes_with_config_json(&ours, Some("{}"), None).expect("loads");
    assert_eq!(loaded.sources_of("n_embd"), [ConfigSource::Metadata]);
    let error = Gpt2Weights::from_bytes_with_config_json(&hf, Some("{}"), None).expect_err("none");
    assert!(
        matches!(error, WeightsError::MissingMetadata { key: "n_layer" }),
        "{error}"
    );
}

/// Weights of `n_layer` blocks (the tiny model's other dimensions).
fn weights_of_layers(n_layer: usize) -> Gpt2Weights {
    Gpt2Weights::random(
        &Gpt2Config {
            n_layer,
            ..Gpt2Config::tiny()
        },
        3,
    )
    .expect("weights")
}

#[test]
fn blocks_other_than_n_layer_are_refused() {
    // Three blocks, metadata saying two: never served as two layers.
    let three = weights_of_layers(3);
    let two_config = Gpt2Config::tiny();
    let bytes = file_of(&raw_tensors(&three, ""), Some(two_config.to_metadata()));
    let error = Gpt2Weights::from_bytes(&bytes, None).expect_err("extra block");
    assert!(
        matches!(
            error,
            WeightsError::LayerCount {
                file_blocks: 3,
                n_layer: 2
            }
        ),
        "{error}"
    );
    // The same through config.json, and with the prefix.
    let bytes = file_of(&raw_tensors(&three, "transformer."), hf_metadata());
    let error =
        Gpt2Weights::from_bytes_with_config_json(&bytes, Some(&hf_config_json(&two_config)), None)
            .expect_err("extra block");
    assert!(
        matches!(
            error,
            WeightsError::LayerCount {
                file_blocks: 3,
                n_layer: 2
            }
        ),
        "{error}"
    );
    // Fewer blocks than layers.
    let two = weights_of_layers(2);
    let three_config = three.config;
    let bytes = file_of(&raw_tensors(&two, ""), Some(three_config.to_metadata()));
    let error = Gpt2Weights::from_bytes(&bytes, None).expect_err("missing block");
    assert!(
        matches!(
            error,
            WeightsError::LayerCount {
                file_blocks: 2,
                n_layer: 3
            }
        ),
        "{error}"
    );
    // Only a mask buffer numbered past the blocks counts as a block too.
    let mut raw = raw_tensors(&two, "");
    raw.push(("h.2.attn.bias".to_owned(), Dtype::F32, vec![1], vec![0; 4]));
    let error = Gpt2Weights::from_bytes(&file_of(&raw, Some(two_config.to_metadata())), None)
        .expect_err("block 2");
    assert!(
        matches!(
            error,
            WeightsError::LayerCount {
                file_blocks: 3,
                n_layer: 2
            }
        ),
        "{error}"
    );
    // A block index that overflows usize: refused, no panic.
    let mut raw = raw_tensors(&two, "");
    raw.push((
        "h.99999999999999999999999.ln_1.weight".to_owned(),
        Dtype::F32,
        vec![1],
        vec![0; 4],
    ));
    let error = Gpt2Weights::from_bytes(&file_of(&raw, Some(two_config.to_metadata())), None)
        .expect_err("huge index");
    assert!(
        matches!(error, WeightsError::LayerCount { n_layer: 2, .. }),
        "{error}"
    );
}

/// `weights` with an untied head: another seed's embedding.
fn untied(weights: &Gpt2Weights) -> Gpt2Weights {
    let other = Gpt2Weights::random(&weights.config, 99).expect("weights");
    Gpt2Weights {
        untied_lm_head: Some(other.wte),
        ..weights.clone()
    }
}

#[test]
fn an_untied_lm_head_is_read_used_by_the_twin_and_written_back() {
    let tied = tiny_weights();
    let weights = untied(&tied);
    assert_eq!(
        weights.lm_head(),
        weights.untied_lm_head.as_deref().unwrap()
    );
    assert_eq!(tied.lm_head(), tied.wte.as_slice());
    // The twin uses it: other logits than the tied model's, from the same embeddings.
    let tokens = [1, 2, 3];
    let (a, b) = (
        tied.reference_logits(&tokens).expect("logits"),
        weights.reference_logits(&tokens).expect("logits"),
    );
    assert_ne!(a, b);
    // The head alone makes the logits from the last hidden state: a copy of wte gives the
    // tied logits, a head of zeros zero logits, a head of one row doubled that token's twice.
    let copy = Gpt2Weights {
        untied_lm_head: Some(tied.wte.clone()),
        ..tied.clone()
    };
    assert_eq!(copy.reference_logits(&tokens).expect("logits"), a);
    let zeros = Gpt2Weights {
        untied_lm_head: Some(vec![0.0; tied.wte.len()]),
        ..tied.clone()
    };
    assert!(zeros
        .reference_logits(&tokens)
        .expect("logits")
        .iter()
        .all(|&v| v == 0.0));
    let mut doubled = tied.wte.clone();
    doubled[5 * 64..6 * 64].iter_mut().for_each(|v| *v *= 2.0);
    let doubled = Gpt2Weights {
        untied_lm_head: Some(doubled),
        ..tied.clone()
    }
    .reference_logits(&tokens)
    .expect("logits");
    for (row, (d, t)) in doubled.chunks(256).zip(a.chunks(256)).enumerate() {
        assert!(
            (d[5] - 2.0 * t[5]).abs() <= 1e-5 * t[5].abs().max(1.0),
            "row {row}"
        );
        assert_eq!(d[6], t[6]);
    }
    // A file with it, as GPT2LMHeadModel saves an untied one: kept.
    let mut raw = hf_tensors(&tied);
    let head_bytes: Vec<u8> = weights
        .lm_head()
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    raw.push((
        "lm_head.weight".to_owned(),
        Dtype::F32,
        vec![256, 64],
        head_bytes.clone(),
    ));
    let bytes = file_of(&raw, hf_metadata());
    let untied_json = hf_config_json(&tied.config).replace(
        "\"use_cache\": true,",
        "\"use_cache\": true,\n  \"tie_word_embeddings\": false,",
    );
    for json in [hf_config_json(&tied.config), untied_json.clone()] {
        let loaded =
            Gpt2Weights::from_bytes_with_config_json(&bytes, Some(&json), None).expect("loads");
        assert_eq!(loaded.weights, weights);
        assert_eq!(loaded.ignored, ["h.0.attn.bias", "h.1.attn.bias"]);
    }
    // config.json saying it is tied while it differs: refused.
    let tied_json = untied_json.replace(
        "\"tie_word_embeddings\": false",
        "\"tie_word_embeddings\": true",
    );
    let error = Gpt2Weights::from_bytes_with_config_json(&bytes, Some(&tied_json), None)
        .expect_err("tied but differs");
    assert!(
        matches!(&error, WeightsError::TiedHeadDiffers { tensor } if tensor == "lm_head.weight"),
        "{error}"
    );
    // config.json saying untied, no head in the file: refused.
    let headless = file_of(&hf_tensors(&tied), hf_metadata());
    let error = Gpt2Weights::from_bytes_with_config_json(&headless, Some(&untied_json), None)
        .expect_err("no head");
    assert!(
        matches!(&error, WeightsError::MissingTensor { tensor } if tensor == "lm_head.weight"),
        "{error}"
    );
    // A head of the wrong shape: named.
    let mut raw = raw_tensors(&tied, "");
    raw.push((
        "lm_head.weight".to_owned(),
        Dtype::F32,
        vec![64, 256],
        head_bytes,
    ));
    let error = Gpt2Weights::from_bytes(&file_of(&raw, Some(tied.config.to_metadata())), None)
        .expect_err("shape");
    assert!(
        matches!(&error, WeightsError::Shape { tensor, .. } if tensor == "lm_head.weight"),
        "{error}"
    );
    // Round trips keep it, in every stored type.
    for dtype in [StoredDtype::F32, StoredDtype::F16] {
        let bytes = weights.to_bytes(dtype).expect("bytes");
        let loaded = Gpt2Weights::from_bytes(&bytes, None)
            .expect("loads")
            .weights;
        assert!(loaded.untied_lm_head.is_some(), "{dtype:?}");
        if dtype == StoredDtype::F32 {
            assert_eq!(loaded, weights);
        }
    }
    let path = temp_path("untied.safetensors");
    weights.write(&path, StoredDtype::F32).expect("write");
    assert_eq!(
        Gpt2Weights::load(&path, None).expect("load").weights,
        weights
    );
    std::fs::remove_file(&path).ok();
    assert_eq!(
        weights.tensor("lm_head.weight"),
        weights.untied_lm_head.as_deref()
    );
    assert_eq!(tied.tensor("lm_head.weight"), None);
    // A head of the wrong length held in memory: not written nor run.
    let mut short = weights.clone();
    short.untied_lm_head.as_mut().expect("head").pop();
    let error = short.to_bytes(StoredDtype::F32).expect_err("short head");
    assert!(
        matches!(&error, WeightsError::Length { tensor, .. } if tensor == "lm_head.weight"),
        "{error}"
    );
    assert!(short.reference_logits(&tokens).is_err());
}

#[test]
fn tensors_outside_the_layout_are_refused_except_the_mask_buffers() {
    let weights = tiny_weights();
    let metadata = Some(weights.config.to_metadata());
    for (name, shape) in [
        ("score.weight", vec![2, 64]),
        ("h.0.mlp.c_fc.lora_A", vec![8, 64]),
        ("transformer.wte.weight", vec![256, 64]),
        ("h.1.attn.bias_extra", vec![1]),
        ("h.x.attn.bias", vec![1]),
    ] {
        let mut raw = raw_tensors(&weights, "");
        let len: usize = shape.iter().product();
        raw.push((name.to_owned(), Dtype::F32, shape, vec![0; len * 4]));
        let error =
            Gpt2Weights::from_bytes(&file_of(&raw, metadata.clone()), None).expect_err(name);
        assert!(
            matches!(&error, WeightsError::UnexpectedTensor { tensor } if tensor == name),
            "{name}: {error}"
        );
        assert!(error.to_string().contains(name), "{error}");
    }
    // The causal-mask buffers, with the file's prefix: ignored and listed.
    for prefix in ["", "transformer."] {
        let mut raw = raw_tensors(&weights, prefix);
        for name in ["h.0.attn.bias", "h.1.attn.masked_bias"] {
            raw.push((
                format!("{prefix}{name}"),
                Dtype::BOOL,
                vec![1, 1, 2, 2],
                vec![1, 0, 1, 1],
            ));
        }
        let loaded =
            Gpt2Weights::from_bytes(&file_of(&raw, metadata.clone()), None).expect("masks");
        assert_eq!(
            loaded.ignored,
            [
                format!("{prefix}h.0.attn.bias"),
                format!("{prefix}h.1.attn.masked_bias")
            ]
        );
        assert_eq!(loaded.weights, weights);
    }
}

#[test]
fn a_bad_config_json_is_a_typed_error_never_a_panic() {
    let weights = tiny_weights();
    let bytes = file_of(&hf_tensors(&weights), hf_metadata());
    let good = hf_config_json(&weights.config);
    let bad_json = |text: &str| {
        Gpt2Weights::from_bytes_with_config_json(&bytes, Some(text), None).expect_err(text)
    };
    for text in ["", "not json", "{\"n_layer\": 2", "[1, 2]", "null", "7"] {
        let error = bad_json(text);
        assert!(
            matches!(error, WeightsError::BadConfigJson { key: None, .. }),
            "{text}: {error}"
        );
    }
    for (from, to, key) in [
        ("\"n_layer\": 2", "\"n_layer\": \"2\"", "n_layer"),
        ("\"n_layer\": 2", "\"n_layer\": -2", "n_layer"),
        ("\"n_embd\": 64", "\"n_embd\": 64.5", "n_embd"),
        ("\"n_head\": 4", "\"n_head\": null", "n_head"),
        ("\"vocab_size\": 256", "\"vocab_size\": 1e30", "vocab_size"),
        (
            "\"vocab_size\": 256",
            "\"vocab_size\": 99999999999999999999999",
            "vocab_size",
        ),
        (
            "\"n_positions\": 128",
            "\"n_positions\": [128]",
            "n_positions",
        ),
        ("\"n_inner\": null", "\"n_inner\": -1", "n_inner"),
        (
            "\"layer_norm_epsilon\": 1e-05",
            "\"layer_norm_epsilon\": \"1e-5\"",
            "layer_norm_epsilon",
        ),
        (
            "\"activation_function\": \"gelu_new\"",
            "\"activation_function\": 3",
            "activation_function",
        ),
        (
            "\"use_cache\": true,",
            "\"use_cache\": true, \"tie_word_embeddings\": \"yes\",",
            "tie_word_embeddings",
        ),
    ] {
        assert!(good.contains(from), "{from}");
        let error = bad_json(&good.replace(from, to));
        assert!(
            matches!(&error, WeightsError::BadConfigJson { key: Some(k), .. } if k == key),
            "{to}: {error}"
        );
        assert!(error.to_string().contains(key), "{error}");
    }
    // A zero dimension: the configuration's refusal.
    let error = bad_json(&good.replace("\"n_head\": 4", "\"n_head\": 0"));
    assert!(
        matches!(
            error,
            WeightsError::Config(ConfigError::Zero { field: "n_head" })
        ),
        "{error}"
    );
    // Another model than the kernels compute.
    for (from, to, key) in [
        (
            "\"model_type\": \"gpt2\"",
            "\"model_type\": \"gpt_neo\"",
            "model_type",
        ),
        (
            "\"activation_function\": \"gelu_new\"",
            "\"activation_function\": \"relu\"",
            "activation_function",
        ),
        (
            "\"activation_function\": \"gelu_new\"",
            "\"activation_function\": \"gelu\"",
            "activation_function",
        ),
        (
            "\"layer_norm_epsilon\": 1e-05",
            "\"layer_norm_epsilon\": 1e-06",
            "layer_norm_epsilon",
        ),
        ("\"n_inner\": null", "\"n_inner\": 128", "n_inner"),
        (
            "\"scale_attn_weights\": true",
            "\"scale_attn_weights\": false",
            "scale_attn_weights",
        ),
        (
            "\"scale_attn_by_inverse_layer_idx\": false",
            "\"scale_attn_by_inverse_layer_idx\": true",
            "scale_attn_by_inverse_layer_idx",
        ),
    ] {
        let error = bad_json(&good.replace(from, to));
        assert!(
            matches!(&error, WeightsError::UnsupportedConfig { key: k, .. } if *k == key),
            "{to}: {error}"
        );
    }
    // What the kernels compute, written otherwise: accepted.
    for (from, to) in [
        ("\"n_inner\": null", "\"n_inner\": 256"),
        (
            "\"layer_norm_epsilon\": 1e-05",
            "\"layer_norm_epsilon\": 0.00001",
        ),
        (
            "\"activation_function\": \"gelu_new\"",
            "\"activation_function\": \"gelu_pytorch_tanh\"",
        ),
    ] {
        let loaded =
            Gpt2Weights::from_bytes_with_config_json(&bytes, Some(&good.replace(from, to)), None)
                .expect(to);
        assert_eq!(loaded.weights, weights);
    }
    // A config.json that is not UTF-8, beside the file.
    let dir = temp_dir("bad-config-json");
    std::fs::write(dir.join("model.safetensors"), &bytes).expect("write");
    std::fs::write(dir.join("config.json"), [b'{', 0xff, b'}']).expect("write");
    let error = Gpt2Weights::load(&dir, None).expect_err("not UTF-8");
    assert!(
        matches!(error, WeightsError::BadConfigJson { key: None, .. }),
        "{error}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
