//! Fusion: bias adds and activations folded into the matmuls (or split-K reductions) that feed
//! them, and residual adds joined to the layer norm of their sum, on a capture's tape.

use std::collections::HashMap;
use std::sync::Arc;

use crate::compute::shared::{Step, Storage};
use crate::compute::types::{
    Activation, ElementwiseParams, FusedEpilogue, KernelKey, Source, Variant,
};

/// What an element-wise step would fold into the epilogue of the step that produced its
/// operand: a bias add (the bias and the result) or an activation (and the result).
enum Fold {
    Bias {
        bias: Arc<Storage>,
        result: Arc<Storage>,
    },
    Activation {
        activation: Activation,
        result: Arc<Storage>,
    },
}

impl Fold {
    /// The fold a step offers, with the operand it reads; `None` for a step that offers none.
    fn of(step: &Step) -> Option<(Arc<Storage>, Fold)> {
        let Step::Kernel {
            kernel, bindings, ..
        } = step
        else {
            return None;
        };
        let fold = match (kernel.source, kernel.entry, kernel.activation()) {
            (Source::Binary, "add_bias", _) => Fold::Bias {
                bias: bindings[1].clone(),
                result: bindings[2].clone(),
            },
            (_, _, Some(activation)) => Fold::Activation {
                activation,
                result: bindings[1].clone(),
            },
            _ => return None,
        };
        Some((bindings[0].clone(), fold))
    }

    fn result(&self) -> &Arc<Storage> {
        match self {
            Fold::Bias { result, .. } | Fold::Activation { result, .. } => result,
        }
    }
}

/// Folds bias adds and activations into the matmul (or split-K reduction) that produces their
/// operand, when nothing else uses the intermediate (`keep`: inputs and outputs) — the same
/// kernels the eager `matmul_with` runs with an epilogue. Which kernels fold what, and where
/// their epilogue binds, is read from the kernel's variant (`KernelKey::epilogue_bindings`,
/// `Variant::epilogue`).
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
        let Some(step) = &steps[index] else { continue };
        if let Some((out, _)) = epilogue_of(step) {
            producer.insert(Arc::as_ptr(&out), index);
            continue;
        }
        let Some((operand, fold)) = Fold::of(step) else {
            continue;
        };
        let operand_ptr = Arc::as_ptr(&operand);
        let private = operand.capture == Some(capture)
            && uses.get(&operand_ptr) == Some(&2)
            && !keep.contains(&operand_ptr);
        let Some(&at) = producer.get(&operand_ptr).filter(|_| private) else {
            continue;
        };
        if !movable(&steps, at, index, &fold) || !fold_into(&mut steps[at], &fold) {
            continue;
        }
        producer.remove(&operand_ptr);
        uses.remove(&operand_ptr);
        producer.insert(Arc::as_ptr(fold.result()), at);
        steps[index] = None;
    }
    join_residual_norms(steps.into_iter().flatten().collect())
}

/// Joins each `add` that the next step, a `layer_norm`, normalizes the sum of into one
/// `add_layer_norm` step, which writes the sum (still bound by later steps, or kept) and the
/// normalized rows with the bits of the two ops (`shaders/add_layer_norm.wgsl`): one dispatch,
/// and the sum read back by the invocation that wrote it, not by another kernel.
fn join_residual_norms(steps: Vec<Step>) -> Vec<Step> {
    let mut joined = Vec::with_capacity(steps.len());
    let mut steps = steps.into_iter().peekable();
    while let Some(step) = steps.next() {
        let Some(next) = steps.peek() else {
            joined.push(step);
            break;
        };
        match residual_norm(&step, next) {
            Some(fused) => {
                joined.push(fused);
                steps.next();
            }
            None => joined.push(step),
        }
    }
    joined
}

/// The `add_layer_norm` step of an `add` and a `layer_norm` of its result, of the same element
/// types; `None` for any other pair.
fn residual_norm(add: &Step, norm: &Step) -> Option<Step> {
    let (
        Step::Kernel {
            kernel: add_kernel,
            bindings: add_bindings,
            ..
        },
        Step::Kernel {
            kernel: norm_kernel,
            params,
            bindings: norm_bindings,
            workgroups,
        },
    ) = (add, norm)
    else {
        return None;
    };
    let is = |kernel: &KernelKey, source, entry| {
        kernel.source == source && kernel.entry == entry && kernel.variant == Variant::Plain
    };
    if !is(add_kernel, Source::Binary, "add")
        || !is(norm_kernel, Source::LayerNorm, "layer_norm")
        || add_kernel.types != norm_kernel.types
        || !Arc::ptr_eq(&add_bindings[2], &norm_bindings[0])
    {
        return None;
    }
    let kernel = KernelKey {
        source: Source::AddLayerNorm,
        entry: "add_layer_norm",
        variant: Variant::Plain,
        types: norm_kernel.types,
    };
    let [x, r, sum] = [0, 1, 2].map(|i| add_bindings[i].clone());
    let [_, gamma, beta, y] = [0, 1, 2, 3].map(|i| norm_bindings[i].clone());
    Some(Step::Kernel {
        kernel,
        params: *params,
        bindings: vec![x, r, gamma, beta, y, sum],
        workgroups: *workgroups,
    })
}

/// A step's epilogue output storage and the epilogue it folds now, for the kernels that fold
/// one.
fn epilogue_of(step: &Step) -> Option<(Arc<Storage>, FusedEpilogue)> {
    let Step::Kernel {
        kernel, bindings, ..
    } = step
    else {
        return None;
    };
    let (out, _) = kernel.epilogue_bindings()?;
    Some((bindings[out].clone(), kernel.variant.epilogue()?))
}

/// Whether the fold of step `index` may move into the producer at `at`: the fused step writes
/// the result where the producer ran, earlier than the op did, so nothing between may bind the
/// result or (for a bias) the bias, and a bias add must add along the product's own columns
/// (not a reshape of them); a producer folds one activation at most, and one that adds a
/// residual folds nothing more (its residual comes last: `act(x + r)` is not `act(x) + r`, and
/// a bias after the residual would change the order of the sums).
fn movable(steps: &[Option<Step>], at: usize, index: usize, fold: &Fold) -> bool {
    let Some((_, epilogue)) = steps[at].as_ref().and_then(epilogue_of) else {
        return false;
    };
    if epilogue.activation != Activation::None || epilogue.residual {
        return false;
    }
    let bound_between = |storage: &Arc<Storage>| {
        let ptr = Arc::as_ptr(storage);
        steps[at + 1..index]
            .iter()
            .flatten()
            .any(|step| step_storages(step).iter().any(|s| Arc::as_ptr(s) == ptr))
    };
    match fold {
        Fold::Bias { bias, result } => {
            !epilogue.bias
                && !bound_between(bias)
                && !bound_between(result)
                && steps[index].as_ref().and_then(bias_columns)
                    == steps[at].as_ref().and_then(product_columns)
        }
        Fold::Activation { result, .. } => !bound_between(result),
    }
}

/// Folds `fold` into the producer `step`'s epilogue and points its output at the fold's
/// result; false (nothing changed) where the step folds no epilogue.
fn fold_into(step: &mut Option<Step>, fold: &Fold) -> bool {
    let Some(Step::Kernel {
        kernel, bindings, ..
    }) = step
    else {
        return false;
    };
    let (Some((out, bias_slot)), Some(epilogue)) =
        (kernel.epilogue_bindings(), kernel.variant.epilogue())
    else {
        return false;
    };
    let (epilogue, result) = match fold {
        Fold::Bias { bias, result } => {
            bindings[bias_slot] = bias.clone();
            (
                FusedEpilogue {
                    bias: true,
                    ..epilogue
                },
                result,
            )
        }
        Fold::Activation { activation, result } => (
            FusedEpilogue {
                activation: *activation,
                ..epilogue
            },
            result,
        ),
    };
    *kernel = kernel.with_epilogue(epilogue);
    bindings[out] = result.clone();
    true
}

/// The columns of the product a matmul, narrow or reduction step writes (its N).
fn product_columns(step: &Step) -> Option<u32> {
    let Step::Kernel { kernel, params, .. } = step else {
        return None;
    };
    kernel.product_columns(params)
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
