//! Recording a matmul: [`Context::matmul`], [`Context::matmul_with`] and its [`Epilogue`],
//! [`Context::matmul_layer_norm`] (a layer norm folded into the narrow kernel's loads), the
//! kernel and parameters of a plan, and split-K's partial products and reduction.

use std::sync::Arc;

use super::select::MatmulPlan;
use crate::compute::context::{Context, Dispatch};
use crate::compute::ops::{common_dtype, grid_1d};
use crate::compute::shared::Storage;
use crate::compute::tensor::Tensor;
use crate::compute::types::{
    element_count, kernel_u32, tensor_bytes, Activation, ComputeError, CoopTiles, DType,
    ElementTypes, FusedEpilogue, KernelKey, MatmulOptions, MatmulParams, NarrowParams, ParamsBlock,
    ReduceParams, Variant,
};

/// What a matmul does to its result before storing it: `act(A·B + bias) + residual`.
///
/// Build it with `..Default::default()` for the parts left out:
/// `Epilogue { residual: Some(&x), ..Default::default() }`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Epilogue<'a> {
    /// A bias of shape `[N]`, added to every row.
    pub bias: Option<&'a Tensor>,
    /// The activation, applied to the product plus the bias.
    pub activation: Activation,
    /// A tensor of C's shape `[M, N]` and element type, added last (after the activation): a
    /// transformer's residual stream, `x + proj(h)` in one dispatch. Added in f32 and rounded
    /// once with the rest of the epilogue.
    pub residual: Option<&'a Tensor>,
}

/// A layer norm over the rows of a matmul's A, folded into the narrow kernel's loads
/// ([`Context::matmul_layer_norm`]).
#[derive(Clone, Copy)]
struct Prologue<'a> {
    gamma: &'a Tensor,
    beta: &'a Tensor,
    eps: f32,
}

impl Context {
    /// `C = A · B` for `A` of shape `[M, K]` and `B` of shape `[K, N]`.
    pub fn matmul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor, ComputeError> {
        self.matmul_with(a, b, Epilogue::default())
    }

    /// `C = act(A · B + bias) + residual`, the epilogue fused into the matmul's stores.
    ///
    /// A, B, the bias and the residual share one element type, which C takes
    /// ([`ComputeError::DTypeMismatch`] otherwise); the bias is `[N]` and the residual `[M, N]`
    /// ([`ComputeError::ShapeMismatch`] otherwise). On f16 the kernels load f16, accumulate in
    /// f32 (split-K partial products too) and round once to f16 as they store C; on a device
    /// opened with cooperative matrices, f16 products of 16 rows and more run on them
    /// ([`Context::matmul_plan_for`]), and f32 ones too (their operands rounded to f16) under
    /// [`MatmulOptions::cooperative_f32_as_f16`](crate::compute::MatmulOptions::cooperative_f32_as_f16).
    /// Every kernel adds the residual in its epilogue (the split-K reduction where K is split),
    /// but on a device whose `max_storage_buffers_per_shader_stage` cannot bind it: there the
    /// product is stored, then an `add` adds the residual (one dispatch more, and on f16 a
    /// second rounding).
    pub fn matmul_with(
        &self,
        a: &Tensor,
        b: &Tensor,
        epilogue: Epilogue<'_>,
    ) -> Result<Tensor, ComputeError> {
        const OP: &str = "matmul";
        let (m, k, n) = self.check_product(OP, a, b, None, epilogue)?;
        let plan = self.matmul_plan_for(a.dtype(), m, n, k)?;
        self.matmul_planned(a, b, epilogue, plan)
    }

    /// `matmul_with(layer_norm(x, gamma, beta, eps), w, epilogue)`: the layer norm of each row
    /// of `x` (`[M, K]`, over its K columns, as [`Context::layer_norm`] computes it: the mean,
    /// the biased variance, `(x − mean) / √(var + eps) · gamma + beta`) multiplied by `w`
    /// (`[K, N]`), with `epilogue` ([`Context::matmul_with`]). A transformer's `LN(x) · W`.
    ///
    /// Where the narrow kernel runs ([`MatmulPlan::narrow_lanes`]: at most
    /// [`MatmulOptions::NARROW_MAX_ROWS`](crate::compute::MatmulOptions::NARROW_MAX_ROWS) rows,
    /// K and N multiples of 4), the layer norm is its prologue: one dispatch (two where K is
    /// split: each split computes its rows' statistics over the whole of K), no normalized
    /// tensor. Each workgroup takes the mean and `1 / √(var + eps)` of its rows in f32 and
    /// normalizes each element of `x` as it loads it, rounded to the element type as the layer
    /// norm stores it; so the result is the two ops' but for the order in which the statistics
    /// are summed. The plan is the one the plain product of that shape takes (tuned or not).
    /// Elsewhere — more rows, K or N not multiples of 4, cooperative matrices, or a device that
    /// cannot bind all the operands at once — it records [`Context::layer_norm`] then the
    /// product (two dispatches; a plan may then join a residual `add` before it to the layer
    /// norm).
    ///
    /// Errors: those of [`Context::matmul_with`] (the shapes of `x` and `w`, the epilogue's);
    /// [`ComputeError::ShapeMismatch`] for `gamma` or `beta` not of shape `[K]`,
    /// [`ComputeError::DTypeMismatch`] for operands of different element types,
    /// [`ComputeError::InvalidScalar`] for an `eps` that is not finite or is negative. Every
    /// operand is checked before anything is recorded.
    pub fn matmul_layer_norm(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        eps: f32,
        w: &Tensor,
        epilogue: Epilogue<'_>,
    ) -> Result<Tensor, ComputeError> {
        const OP: &str = "matmul_layer_norm";
        let prologue = Prologue { gamma, beta, eps };
        let (m, k, n) = self.check_product(OP, x, w, Some(prologue), epilogue)?;
        let plan = self.matmul_plan_for(x.dtype(), m, n, k)?;
        let narrow = plan.narrow_lanes > 0 && plan.cooperative.is_none();
        if narrow && self.binds(&self.product_kernel(x, w, &plan, true, epilogue)?.0) {
            return self.record_product(x, w, Some(prologue), epilogue, plan);
        }
        let normalized = self.layer_norm(x, gamma, beta, eps)?;
        self.matmul_planned(&normalized, w, epilogue, plan)
    }

    /// Checks the operands of a product `a · b` (of `op`): owners, shapes (`a` `[M, K]`, `b`
    /// `[K, N]`; with `prologue` its gamma and beta `[K]` and its eps), the epilogue's bias
    /// (`[N]`) and residual (`[M, N]`), one element type for all. Returns `(M, K, N)`.
    fn check_product(
        &self,
        op: &'static str,
        a: &Tensor,
        b: &Tensor,
        prologue: Option<Prologue<'_>>,
        epilogue: Epilogue<'_>,
    ) -> Result<(usize, usize, usize), ComputeError> {
        let mut operands = vec![a, b];
        operands.extend(prologue.iter().flat_map(|p| [p.gamma, p.beta]));
        operands.extend(epilogue.bias);
        operands.extend(epilogue.residual);
        for tensor in &operands {
            self.check_owner(op, tensor)?;
        }
        let (&[m, k], &[k_b, n]) = (a.shape(), b.shape()) else {
            return Err(ComputeError::ShapeMismatch {
                op,
                left: a.shape().to_vec(),
                right: b.shape().to_vec(),
                expected: "A of shape [M, K] and B of shape [K, N]",
            });
        };
        if k != k_b {
            return Err(ComputeError::ShapeMismatch {
                op,
                left: a.shape().to_vec(),
                right: b.shape().to_vec(),
                expected: "A's columns equal to B's rows",
            });
        }
        if let Some(prologue) = prologue {
            for affine in [prologue.gamma, prologue.beta] {
                if affine.shape() != [k] {
                    return Err(ComputeError::ShapeMismatch {
                        op,
                        left: a.shape().to_vec(),
                        right: affine.shape().to_vec(),
                        expected: "gamma and beta of shape [K], the columns of x",
                    });
                }
            }
            if !prologue.eps.is_finite() || prologue.eps < 0.0 {
                return Err(ComputeError::InvalidScalar {
                    op,
                    what: "eps",
                    value: prologue.eps,
                    expected: "finite and not negative",
                });
            }
        }
        if let Some(bias) = epilogue.bias {
            if bias.shape() != [n] {
                return Err(ComputeError::ShapeMismatch {
                    op,
                    left: vec![m, n],
                    right: bias.shape().to_vec(),
                    expected: "bias of shape [N]",
                });
            }
        }
        if let Some(residual) = epilogue.residual {
            if residual.shape() != [m, n] {
                return Err(ComputeError::ShapeMismatch {
                    op,
                    left: vec![m, n],
                    right: residual.shape().to_vec(),
                    expected: "residual of C's shape [M, N]",
                });
            }
        }
        common_dtype(op, &operands)?;
        Ok((m, k, n))
    }

    /// Whether the device binds every storage binding of `kernel` at once
    /// (`max_storage_buffers_per_shader_stage`; WebGPU's default, 8, binds every kernel's).
    fn binds(&self, kernel: &KernelKey) -> bool {
        kernel.storage_bindings() <= self.limits().max_storage_buffers_per_shader_stage as usize
    }

    /// [`Context::matmul_with`] following `plan` (one of [`Context::matmul_plan`]'s, or of the
    /// autotuner's candidates, for these operands' shapes).
    pub(crate) fn matmul_planned(
        &self,
        a: &Tensor,
        b: &Tensor,
        epilogue: Epilogue<'_>,
        plan: MatmulPlan,
    ) -> Result<Tensor, ComputeError> {
        self.record_product(a, b, None, epilogue, plan)
    }

    /// The product `a · b` following `plan`, with `prologue` (a narrow plan's layer norm, the
    /// device binding its kernel: checked by the caller) and `epilogue`: the product kernel, and
    /// where K is split the reduction, which runs the epilogue. A residual the kernel running
    /// the epilogue cannot bind on this device is added by an `add` after it.
    fn record_product(
        &self,
        a: &Tensor,
        b: &Tensor,
        prologue: Option<Prologue<'_>>,
        epilogue: Epilogue<'_>,
        plan: MatmulPlan,
    ) -> Result<Tensor, ComputeError> {
        const OP: &str = "matmul";
        let (&[m, _], &[_, n]) = (a.shape(), b.shape()) else {
            return Err(ComputeError::ShapeMismatch {
                op: OP,
                left: a.shape().to_vec(),
                right: b.shape().to_vec(),
                expected: "A of shape [M, K] and B of shape [K, N]",
            });
        };
        let len = element_count(OP, &[m, n])?;
        let split = plan.splits > 1;
        let dtype = a.dtype();
        let norm = prologue.is_some();
        let (kernel, mut params) = self.product_kernel(a, b, &plan, norm, epilogue)?;
        if let (Some(residual), false) = (epilogue.residual, split) {
            if !self.binds(&kernel) {
                // The product, then the residual added by another dispatch.
                let without = Epilogue {
                    residual: None,
                    ..epilogue
                };
                let c = self.record_product(a, b, prologue, without, plan)?;
                return self.add(&c, residual);
            }
        }
        if let Some(prologue) = prologue {
            let mut narrow: NarrowParams = params.read();
            narrow.eps = prologue.eps;
            params = ParamsBlock::new(&narrow);
        }
        // Compile before recording anything, so that a refused kernel records nothing.
        self.prepare(&kernel)?;
        // The matmul (or narrow) kernel writing `out`; a bias is bound even when unused: A
        // then, or in a browser a tensor of its own (`unused_binding`), never one bound already
        // (see `Context::record`); then the residual where this kernel adds it, and the
        // prologue's gamma and beta.
        let record_product = |out: &Tensor, bias: &Tensor| {
            let mut bindings: Vec<&Arc<Storage>> =
                vec![&a.storage, &b.storage, &out.storage, &bias.storage];
            if let (Some(residual), false) = (epilogue.residual, split) {
                bindings.push(&residual.storage);
            }
            if let Some(prologue) = prologue {
                bindings.extend([&prologue.gamma.storage, &prologue.beta.storage]);
            }
            self.record(Dispatch {
                kernel,
                params,
                bindings: &bindings,
                workgroups: plan.workgroups,
            })
        };
        if !split {
            self.before_op()?;
            let c = self.allocate_output(OP, vec![m, n], len, dtype)?;
            match epilogue.bias {
                Some(bias) => record_product(&c, bias)?,
                None if self.binds_distinct_ranges() => {
                    record_product(&c, &self.unused_binding(dtype)?)?
                }
                None => record_product(&c, a)?,
            }
            return Ok(c);
        }
        let reduce = KernelKey::generated(
            Variant::Reduce {
                bias: epilogue.bias.is_some(),
                activation: epilogue.activation,
                residual: epilogue.residual.is_some(),
            },
            ElementTypes::same(dtype),
        )
        .ok_or_else(|| ComputeError::Config("the split-K reduction has no kernel".into()))?;
        self.prepare(&reduce)?;
        let (reduce_workgroups, grid_x) = grid_1d(self, OP, (len as u64).div_ceil(256))?;
        let splits = plan.splits as usize;
        let partial_len = element_count(OP, &[splits, m, n])?;
        // f32 partial products whatever the operands.
        if tensor_bytes(partial_len, DType::F32) > self.limits().max_storage_buffer_binding_size {
            return Err(ComputeError::ExceedsLimit {
                op: OP,
                what: "bytes of split-K partial products",
                value: tensor_bytes(partial_len, DType::F32),
                limit_name: "max_storage_buffer_binding_size",
                limit: self.limits().max_storage_buffer_binding_size,
            });
        }
        self.before_op()?;
        let c = self.allocate_output(OP, vec![m, n], len, dtype)?;
        let partial = self.split_k_partial(splits, m, n, partial_len)?;
        // Without a bias, the reduction binds the partial products in its place (A in the
        // product's), or in a browser a tensor of its own.
        let unused = if self.binds_distinct_ranges() {
            Some(self.unused_binding(dtype)?)
        } else {
            None
        };
        record_product(&partial, unused.as_ref().unwrap_or(a))?;
        let bias = epilogue.bias.or(unused.as_ref()).unwrap_or(&partial);
        let reduce_params = ReduceParams {
            len: kernel_u32(OP, "M · N", len)?,
            n: kernel_u32(OP, "N", n)?,
            splits: plan.splits,
            grid_x,
        };
        let mut reduce_bindings = vec![&partial.storage, &bias.storage, &c.storage];
        reduce_bindings.extend(epilogue.residual.map(|residual| &residual.storage));
        self.record(Dispatch {
            kernel: reduce,
            params: ParamsBlock::new(&reduce_params),
            bindings: &reduce_bindings,
            workgroups: reduce_workgroups,
        })?;
        // Dropped here: reusable after the submission that carries the reduction.
        drop(partial);
        Ok(c)
    }

    /// The split-K partial products `[splits, m, n]` (`partial_len` f32s). Outside a capture
    /// they are scratch, given back once the reduction is recorded: their size is rounded up to
    /// a power of two (where one binding holds it), so that products whose sizes vary (a
    /// server's batches, the tuner's splits) reuse a few sizes of pool segments rather than
    /// asking for a new size each time. A plan lays them out exactly.
    fn split_k_partial(
        &self,
        splits: usize,
        m: usize,
        n: usize,
        partial_len: usize,
    ) -> Result<Tensor, ComputeError> {
        const PARTIAL: &str = "matmul split-K partial";
        let scratch_len = partial_len.checked_next_power_of_two().filter(|&rounded| {
            tensor_bytes(rounded, DType::F32) <= self.limits().max_storage_buffer_binding_size
        });
        match scratch_len {
            Some(rounded) if self.capture_id().is_none() => {
                self.allocate_output(PARTIAL, vec![rounded], rounded, DType::F32)
            }
            _ => self.allocate_output(PARTIAL, vec![splits, m, n], partial_len, DType::F32),
        }
    }

    /// The product's kernel (tiled, narrow or cooperative, as `plan` says) and its parameters,
    /// for A and B (shapes checked), the narrow kernel's layer-norm prologue where `norm` (its
    /// eps left 0 in the parameters) and `epilogue`: with a split, the kernel writes f32 partial
    /// products and folds no epilogue (the reduction runs it).
    fn product_kernel(
        &self,
        a: &Tensor,
        b: &Tensor,
        plan: &MatmulPlan,
        norm: bool,
        epilogue: Epilogue<'_>,
    ) -> Result<(KernelKey, ParamsBlock), ComputeError> {
        const OP: &str = "matmul";
        let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
        let split = plan.splits > 1;
        // The operands' element type; the product kernel writes f32 partial products where it
        // splits K (the reduction rounds once, as it stores C).
        let dtype = a.dtype();
        let types = ElementTypes {
            input: dtype,
            output: if split { DType::F32 } else { dtype },
        };
        // With a split the reduction runs the epilogue.
        let fused = if split {
            FusedEpilogue::default()
        } else {
            FusedEpilogue {
                bias: epilogue.bias.is_some(),
                activation: epilogue.activation,
                residual: epilogue.residual.is_some(),
            }
        };
        if norm && (plan.narrow_lanes == 0 || plan.cooperative.is_some()) {
            return Err(ComputeError::Config(
                "a layer-norm prologue runs in the narrow matmul only".into(),
            ));
        }
        let (variant, params) = if let Some(tiles) = plan.cooperative {
            let options = &self.options().matmul;
            coop_kernel(tiles, plan, fused, (dtype, options), (m, n, k))?
        } else if plan.narrow_lanes > 0 {
            let groups = plan.narrow_row_groups.max(1);
            let variant = Variant::Narrow {
                rows: kernel_u32(OP, "rows", m)? / groups,
                lanes: plan.narrow_lanes,
                subgroup: plan.narrow_subgroup,
                split,
                bias: fused.bias,
                activation: fused.activation,
                residual: fused.residual,
                norm,
            };
            let params = NarrowParams {
                n4: kernel_u32(OP, "N / 4", n / 4)?,
                k4: kernel_u32(OP, "K / 4", k / 4)?,
                grid_x: plan.workgroups[0],
                k_chunk4: plan.k_chunk / 4,
                tiles: kernel_u32(
                    OP,
                    "tiles along N",
                    (n / 4).div_ceil(plan.narrow_lanes as usize),
                )?,
                m: kernel_u32(OP, "M", m)?,
                eps: 0.0,
                pad: 0,
            };
            (variant, ParamsBlock::new(&params))
        } else {
            let tiles_n = kernel_u32(OP, "tiles along N", n.div_ceil(plan.tiles.bn as usize))?;
            let tiles_m = kernel_u32(OP, "tiles along M", m.div_ceil(plan.tiles.bm as usize))?;
            let variant = Variant::Matmul {
                tiles: plan.tiles,
                group_rows: self.options().matmul.group_rows,
                vec4: plan.vec4,
                edges: plan.edges,
                bias: fused.bias,
                activation: fused.activation,
                residual: fused.residual,
                // The grid is not [tiles along N, tiles along M]: rows of linear ids.
                linear_grid: plan.workgroups[..2] != [tiles_n, tiles_m],
            };
            let params = MatmulParams {
                m: kernel_u32(OP, "M", m)?,
                n: kernel_u32(OP, "N", n)?,
                k: kernel_u32(OP, "K", k)?,
                k_chunk: plan.k_chunk,
                tiles_n,
                tiles_m,
                grid_x: plan.workgroups[0],
                pad: 0,
            };
            (variant, ParamsBlock::new(&params))
        };
        let kernel = KernelKey::generated(variant, types)
            .ok_or_else(|| ComputeError::Config("a matmul variant has no kernel".into()))?;
        Ok((kernel, params))
    }
}

/// The cooperative matmul's variant and parameters for `plan` (of tile `tiles`) over operands
/// of `[m, k] · [k, n]` stored as `dtype`, folding `fused`, under `options` (its
/// [`MatmulOptions::cooperative_probe`] goes into the variant): f16, or f32 under
/// [`MatmulOptions::cooperative_f32_as_f16`] (the kernel rounds them to f16 as it stages them);
/// a plan on cooperative matrices for f32 operands without it is a [`ComputeError::Config`].
fn coop_kernel(
    tiles: CoopTiles,
    plan: &MatmulPlan,
    fused: FusedEpilogue,
    (dtype, options): (DType, &MatmulOptions),
    (m, n, k): (usize, usize, usize),
) -> Result<(Variant, ParamsBlock), ComputeError> {
    const OP: &str = "matmul";
    if dtype == DType::F32 && !options.cooperative_f32_as_f16 {
        return Err(ComputeError::Config(format!(
            "a plan on cooperative matrices ({tiles}) multiplies f16 operands, not {dtype} \
             (unless MatmulOptions::cooperative_f32_as_f16)"
        )));
    }
    let variant = Variant::Coop {
        tiles,
        vec4: plan.vec4,
        bias: fused.bias,
        activation: fused.activation,
        residual: fused.residual,
        probe: options.cooperative_probe,
    };
    let params = MatmulParams {
        m: kernel_u32(OP, "M", m)?,
        n: kernel_u32(OP, "N", n)?,
        k: kernel_u32(OP, "K", k)?,
        k_chunk: plan.k_chunk,
        tiles_n: kernel_u32(OP, "tiles along N", n.div_ceil(tiles.bn as usize))?,
        tiles_m: kernel_u32(OP, "tiles along M", m.div_ceil(tiles.bm as usize))?,
        grid_x: plan.workgroups[0],
        pad: 0,
    };
    Ok((variant, ParamsBlock::new(&params)))
}
