//! Fusion: bias adds and activations folded into the matmuls (or split-K reductions) that feed
//! them, on a capture's tape.

use std::collections::HashMap;
use std::sync::Arc;

use crate::compute::shared::{Step, Storage};
use crate::compute::vocab::{
    Activation, ElementwiseParams, KernelKey, MatmulParams, NarrowParams, ReduceParams, Source,
    Variant,
};

/// Where a kernel step writes its result and reads its bias: `(output, bias)` binding indices,
/// for the matmul kernels whose epilogue can take a bias and an activation.
fn epilogue_slots(kernel: &KernelKey) -> Option<(usize, usize, bool, Activation)> {
    match kernel.variant {
        Variant::Matmul {
            bias, activation, ..
        }
        | Variant::Narrow {
            bias, activation, ..
        } => Some((2, 3, bias, activation)),
        Variant::Reduce { bias, activation } => Some((2, 1, bias, activation)),
        Variant::Plain => None,
    }
}

/// The epilogue of `kernel` set to `bias` and `activation`.
fn with_epilogue(mut kernel: KernelKey, with_bias: bool, with: Activation) -> KernelKey {
    match &mut kernel.variant {
        Variant::Matmul {
            bias, activation, ..
        }
        | Variant::Narrow {
            bias, activation, ..
        }
        | Variant::Reduce { bias, activation } => {
            *bias = with_bias;
            *activation = with;
        }
        Variant::Plain => {}
    }
    kernel
}

/// The activation a unary kernel computes, if the matmul epilogue has it.
fn activation_of(kernel: &KernelKey) -> Option<Activation> {
    match (kernel.source, kernel.entry) {
        (Source::Unary, "relu") => Some(Activation::Relu),
        (Source::Unary, "gelu") => Some(Activation::Gelu),
        _ => None,
    }
}

/// Folds bias adds and activations into the matmul (or split-K reduction) that produces their
/// operand, when nothing else uses the intermediate (`keep`: inputs and outputs) — the same
/// kernels the eager `matmul_with` runs with an epilogue.
// Over 80 lines: moved as it was; the kernels' variant table (issue 25, item 1) will reshape it.
pub(super) fn fuse(steps: Vec<Step>, keep: &[*const Storage], capture: u64) -> Vec<Step> {
    let mut uses: HashMap<*const Storage, usize> = HashMap::new();
    for step in &steps {
        for storage in step_storages(step) {
            *uses.entry(Arc::as_ptr(storage)).or_default() += 1;
        }
    }
    let mut steps: Vec<Option<Step>> = steps.into_iter().map(Some).collect();
    // The step that wrote each storage through a fusable epilogue, by pointer.
    let mut producer: HashMap<*const Storage, usize> = HashMap::new();
    for index in 0..steps.len() {
        let (operand, extra, activation) = match &steps[index] {
            Some(Step::Kernel {
                kernel, bindings, ..
            }) => {
                if let Some((out, _, _, _)) = epilogue_slots(kernel) {
                    producer.insert(Arc::as_ptr(&bindings[out]), index);
                    continue;
                }
                match (kernel.source, kernel.entry, activation_of(kernel)) {
                    (Source::Binary, "add_bias", _) => (
                        bindings[0].clone(),
                        Some((bindings[1].clone(), bindings[2].clone())),
                        None,
                    ),
                    (_, _, Some(activation)) => (
                        bindings[0].clone(),
                        None,
                        Some((activation, bindings[1].clone())),
                    ),
                    _ => continue,
                }
            }
            _ => continue,
        };
        let operand_ptr = Arc::as_ptr(&operand);
        let private = operand.capture == Some(capture)
            && uses.get(&operand_ptr) == Some(&2)
            && !keep.contains(&operand_ptr);
        let Some(&at) = producer.get(&operand_ptr).filter(|_| private) else {
            continue;
        };
        let Some(Step::Kernel { kernel, .. }) = &steps[at] else {
            continue;
        };
        let Some((out, bias_slot, has_bias, has_activation)) = epilogue_slots(kernel) else {
            continue;
        };
        if has_activation != Activation::None {
            continue;
        }
        // The fused step writes the result where the producer ran, earlier than the op did:
        // nothing between may bind the result or (for a bias) write the bias, and a bias add
        // must add along the product's own columns (not a reshape of them).
        let bound_between = |storage: &Arc<Storage>| {
            let ptr = Arc::as_ptr(storage);
            steps[at + 1..index]
                .iter()
                .flatten()
                .any(|step| step_storages(step).iter().any(|s| Arc::as_ptr(s) == ptr))
        };
        let movable = match (&extra, &activation) {
            (Some((bias, result)), None) => {
                !bound_between(bias)
                    && !bound_between(result)
                    && steps[index].as_ref().and_then(bias_columns)
                        == steps[at].as_ref().and_then(product_columns)
            }
            (None, Some((_, result))) => !bound_between(result),
            _ => false,
        };
        if !movable {
            continue;
        }
        let Some(Step::Kernel {
            kernel, bindings, ..
        }) = &mut steps[at]
        else {
            continue;
        };
        let result = match (extra, activation) {
            (Some((bias, result)), None) if !has_bias => {
                *kernel = with_epilogue(*kernel, true, Activation::None);
                bindings[bias_slot] = bias;
                result
            }
            (None, Some((activation, result))) => {
                *kernel = with_epilogue(*kernel, has_bias, activation);
                result
            }
            _ => continue,
        };
        producer.remove(&operand_ptr);
        uses.remove(&operand_ptr);
        producer.insert(Arc::as_ptr(&result), at);
        bindings[out] = result;
        steps[index] = None;
    }
    steps.into_iter().flatten().collect()
}

/// The columns of the product a matmul, narrow or reduction step writes (its N).
fn product_columns(step: &Step) -> Option<u32> {
    let Step::Kernel { kernel, params, .. } = step else {
        return None;
    };
    match kernel.variant {
        Variant::Matmul { .. } => Some(params.read::<MatmulParams>().n),
        Variant::Narrow { .. } => Some(params.read::<NarrowParams>().n4.saturating_mul(4)),
        Variant::Reduce { .. } => Some(params.read::<ReduceParams>().n),
        Variant::Plain => None,
    }
}

/// The columns (bias length) an `add_bias` step adds along.
fn bias_columns(step: &Step) -> Option<u32> {
    let Step::Kernel { params, .. } = step else {
        return None;
    };
    Some(params.read::<ElementwiseParams>().cols)
}

/// The storages a step binds.
pub(super) fn step_storages(step: &Step) -> Vec<&Arc<Storage>> {
    match step {
        Step::Kernel { bindings, .. } => bindings.iter().collect(),
        Step::Clear(storage) => vec![storage],
        Step::Custom { storage, .. } => storage.iter().collect(),
    }
}
