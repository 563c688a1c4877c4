//! CPU twins of the kernels: one function per kernel, of the same name, computing the same
//! formula. The tests and the benchmark compare the GPU's results with these.
//!
//! Element-wise twins compute in f32 like the kernels (one correctly rounded operation each;
//! `gelu` in f64, rounded once). Accumulating twins (`matmul`, `sum`, `softmax`) accumulate in
//! f64, so they are the reference the kernels' f32 accumulation is measured against.
//! Keep in sync with `shaders/`: a test (`cpu/tests.rs`) checks that every entry point of every
//! kernel module has a twin here of its name, or is a listed exception with its reason.
//!
//! On f16 tensors the kernels load f16, compute in f32 and round once as they store: their twin
//! is the f32 twin on the f16 values ([`rounded`] inputs, as uploaded), its result [`rounded`]
//! to f16. The twin and the kernel may then round to neighbouring f16s: compare within an f16
//! ulp (2⁻¹⁰ of the magnitude) on top of the f32 tolerance.

use super::ops::elementwise::{BinaryOp, UnaryOp};
use super::types::{Activation, DType};

/// `values` rounded to the nearest value of `dtype` (ties to even; beyond ±65,504 to ±∞ for
/// f16), as an upload to a tensor of `dtype` and an f16 kernel's stores round them; unchanged
/// for f32.
pub fn rounded(values: &[f32], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F32 => values.to_vec(),
        DType::F16 => values
            .iter()
            .map(|&v| half::f16::from_f32(v).to_f32())
            .collect(),
    }
}

/// `max(x, 0)`.
pub fn relu(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| v.max(0.0)).collect()
}

/// GELU, tanh approximation, as the kernel computes it: `x / (1 + e^(−t))` with
/// `t = 2·√(2/π)·(x + 0.044715·x³)` (equal to `0.5·x·(1 + tanh(t / 2))`), 0 where `t < −80`.
pub fn gelu(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| gelu_one(f64::from(v)) as f32).collect()
}

fn gelu_one(x: f64) -> f64 {
    let t = 1.595_769_121_605_730_8 * (x + 0.044715 * x * x * x);
    if t < -80.0 {
        0.0
    } else {
        x / (1.0 + (-t.min(80.0)).exp())
    }
}

/// `eˣ`.
pub fn exp(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| v.exp()).collect()
}

/// `−x`.
pub fn neg(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| -v).collect()
}

/// `√x`.
pub fn sqrt(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| v.sqrt()).collect()
}

/// `x`, copied.
pub fn copy(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

/// The twin of `op`.
pub fn unary(op: UnaryOp, x: &[f32]) -> Vec<f32> {
    match op {
        UnaryOp::Relu => relu(x),
        UnaryOp::Gelu => gelu(x),
        UnaryOp::Exp => exp(x),
        UnaryOp::Neg => neg(x),
        UnaryOp::Sqrt => sqrt(x),
        UnaryOp::Copy => copy(x),
    }
}

fn apply(op: BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Maximum => a.max(b),
    }
}

/// `a op b`, element-wise (`a` and `b` of one length).
pub fn binary(op: BinaryOp, a: &[f32], b: &[f32]) -> Vec<f32> {
    assert_eq!(a.len(), b.len(), "binary twin: lengths differ");
    a.iter().zip(b).map(|(&a, &b)| apply(op, a, b)).collect()
}

/// `a + b`.
pub fn add(a: &[f32], b: &[f32]) -> Vec<f32> {
    binary(BinaryOp::Add, a, b)
}

/// `a − b`.
pub fn sub(a: &[f32], b: &[f32]) -> Vec<f32> {
    binary(BinaryOp::Sub, a, b)
}

/// `a · b`.
pub fn mul(a: &[f32], b: &[f32]) -> Vec<f32> {
    binary(BinaryOp::Mul, a, b)
}

/// `a / b`.
pub fn div(a: &[f32], b: &[f32]) -> Vec<f32> {
    binary(BinaryOp::Div, a, b)
}

/// `max(a, b)`.
pub fn maximum(a: &[f32], b: &[f32]) -> Vec<f32> {
    binary(BinaryOp::Maximum, a, b)
}

/// `x op scalar`, element-wise (the kernels `add_scalar`, `sub_scalar`, ...).
pub fn binary_scalar(op: BinaryOp, x: &[f32], scalar: f32) -> Vec<f32> {
    x.iter().map(|&v| apply(op, v, scalar)).collect()
}

/// `x + scalar`, element-wise.
pub fn add_scalar(x: &[f32], scalar: f32) -> Vec<f32> {
    binary_scalar(BinaryOp::Add, x, scalar)
}

/// `x - scalar`, element-wise.
pub fn sub_scalar(x: &[f32], scalar: f32) -> Vec<f32> {
    binary_scalar(BinaryOp::Sub, x, scalar)
}

/// `x * scalar`, element-wise.
pub fn mul_scalar(x: &[f32], scalar: f32) -> Vec<f32> {
    binary_scalar(BinaryOp::Mul, x, scalar)
}

/// `x / scalar`, element-wise.
pub fn div_scalar(x: &[f32], scalar: f32) -> Vec<f32> {
    binary_scalar(BinaryOp::Div, x, scalar)
}

/// `max(x, scalar)`, element-wise.
pub fn maximum_scalar(x: &[f32], scalar: f32) -> Vec<f32> {
    binary_scalar(BinaryOp::Maximum, x, scalar)
}

/// `x[r, c] + bias[c]` for `x` of rows of `bias.len()` values.
///
/// # Panics
///
/// When `x` is not a whole number of rows of `bias.len()` values.
pub fn add_bias(x: &[f32], bias: &[f32]) -> Vec<f32> {
    assert_rows("add_bias", x, bias.len());
    x.iter()
        .enumerate()
        .map(|(i, &v)| v + bias[i % bias.len()])
        .collect()
}

/// The activation of a fused epilogue.
pub fn activate(activation: Activation, x: f32) -> f32 {
    match activation {
        Activation::None => x,
        Activation::Relu => x.max(0.0),
        Activation::Gelu => gelu_one(f64::from(x)) as f32,
    }
}

/// One element of `A · B` (A of `k` columns, B of `n` columns), accumulated in f64, and the sum of
/// the magnitudes of its terms `Σ |a_ik · b_kj|` (the scale of its rounding error).
///
/// # Panics
///
/// When `a` or `b` has no element at an index the sizes name (a test oracle's precondition, as
/// slice indexing), including sizes whose products overflow.
pub fn matmul_element(
    a: &[f32],
    b: &[f32],
    k: usize,
    n: usize,
    row: usize,
    col: usize,
) -> (f64, f64) {
    let mut sum = 0.0f64;
    let mut magnitude = 0.0f64;
    let index = |what: &str, outer: usize, stride: usize, inner: usize| {
        outer
            .checked_mul(stride)
            .and_then(|start| start.checked_add(inner))
            .unwrap_or_else(|| panic!("matmul_element twin: an index of {what} overflows"))
    };
    for i in 0..k {
        let term = f64::from(a[index("A", row, k, i)]) * f64::from(b[index("B", i, n, col)]);
        sum += term;
        magnitude += term.abs();
    }
    (sum, magnitude)
}

/// `C[m, n] = A[m, k] · B[k, n]`, row-major, accumulated in f64.
pub fn matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    matmul_with(a, b, m, k, n, Epilogue::default())
}

/// A matmul's epilogue on the host, `act(x + bias) + residual`: the twin of
/// [`compute::Epilogue`](crate::compute::Epilogue), of values instead of tensors.
#[derive(Debug, Clone, Copy, Default)]
pub struct Epilogue<'a> {
    /// `n` values, added to every row.
    pub bias: Option<&'a [f32]>,
    /// The activation, applied to the sum plus the bias.
    pub activation: Activation,
    /// `m · n` values, added last.
    pub residual: Option<&'a [f32]>,
}

impl Epilogue<'_> {
    /// Element `i` of an `[m, n]` result whose sum (before the epilogue) is `value`: the bias
    /// added in f64 with the sum, rounded to f32, activated, then the residual added in f32 —
    /// as the kernels, which round the sum once to f32, add in f32 and round once as they store.
    fn apply(&self, i: usize, n: usize, value: f64) -> f32 {
        let with_bias = value + self.bias.map_or(0.0, |bias| f64::from(bias[i % n]));
        activate(self.activation, with_bias as f32) + self.residual.map_or(0.0, |r| r[i])
    }

    /// Panics (`what` names the twin) where the bias does not hold `n` values or the residual
    /// `len`.
    fn check(&self, what: &str, n: usize, len: usize) {
        if let Some(bias) = self.bias {
            assert_eq!(bias.len(), n, "{what} twin: the bias is not of length n");
        }
        if let Some(residual) = self.residual {
            assert_eq!(
                residual.len(),
                len,
                "{what} twin: the residual is not of length m · n"
            );
        }
    }
}

/// `act(A · B + bias) + residual`, the fused epilogue's twin.
///
/// # Panics
///
/// When `a` does not hold `m · k` values, `b` `k · n`, the bias (if any) `n` or the residual
/// (if any) `m · n` (a test oracle's precondition), including sizes whose products overflow.
pub fn matmul_with(
    a: &[f32],
    b: &[f32],
    m: usize,
    k: usize,
    n: usize,
    epilogue: Epilogue<'_>,
) -> Vec<f32> {
    assert_eq!(
        Some(a.len()),
        m.checked_mul(k),
        "matmul twin: A is not m × k"
    );
    assert_eq!(
        Some(b.len()),
        k.checked_mul(n),
        "matmul twin: B is not k × n"
    );
    let len = m
        .checked_mul(n)
        .expect("matmul twin: m × n overflows a usize");
    epilogue.check("matmul", n, len);
    let mut c = vec![0.0f64; len];
    // i-k-j order: rows of B stream through the cache.
    for row in 0..m {
        let out = &mut c[row * n..(row + 1) * n];
        for i in 0..k {
            let a_value = f64::from(a[row * k + i]);
            for (o, &b_value) in out.iter_mut().zip(&b[i * n..(i + 1) * n]) {
                *o += a_value * f64::from(b_value);
            }
        }
    }
    c.iter()
        .enumerate()
        .map(|(i, &v)| epilogue.apply(i, n, v))
        .collect()
}

/// `matmul_with(layer_norm(x, gamma, beta, k, eps), w, m, k, n, epilogue)`: the twin of
/// [`Context::matmul_layer_norm`](crate::compute::Context::matmul_layer_norm), `x` of `m` rows of
/// `k` values normalized (in f64, rounded to f32), then multiplied by `w` (`k × n`).
///
/// # Panics
///
/// Those of [`layer_norm`] and [`matmul_with`].
pub fn matmul_layer_norm(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    w: &[f32],
    (m, k, n): (usize, usize, usize),
    epilogue: Epilogue<'_>,
) -> Vec<f32> {
    let normalized = layer_norm(x, gamma, beta, k, eps);
    matmul_with(&normalized, w, m, k, n, epilogue)
}

/// The split-K reduction: `act(Σ_s partials[s, i, j] + bias[j]) + residual[i, j]` for
/// `partials` of `splits` products `[m, n]` one after another (`splits · m · n` values at least;
/// the kernel's scratch may hold more), summed in f64.
///
/// # Panics
///
/// When `partials` holds fewer than `splits · m · n` values, the bias (if any) not `n` or the
/// residual (if any) not `m · n` (a test oracle's precondition), including sizes whose products
/// overflow.
pub fn matmul_reduce(
    partials: &[f32],
    splits: usize,
    m: usize,
    n: usize,
    epilogue: Epilogue<'_>,
) -> Vec<f32> {
    let len = m
        .checked_mul(n)
        .expect("matmul_reduce twin: m × n overflows a usize");
    assert!(
        splits
            .checked_mul(len)
            .is_some_and(|all| all <= partials.len()),
        "matmul_reduce twin: fewer than splits × m × n partial products"
    );
    epilogue.check("matmul_reduce", n, len);
    (0..len)
        .map(|i| {
            let sum: f64 = (0..splits).map(|s| f64::from(partials[s * len + i])).sum();
            epilogue.apply(i, n, sum)
        })
        .collect()
}

/// `Σ_k |a_ik · b_kj|` for every element: the scale of the rounding error of `A · B`.
pub fn matmul_magnitude(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let abs_a: Vec<f32> = a.iter().map(|v| v.abs()).collect();
    let abs_b: Vec<f32> = b.iter().map(|v| v.abs()).collect();
    matmul(&abs_a, &abs_b, m, k, n)
}

/// The sum of each row of `cols` values, accumulated in f64. No rows for `cols` 0.
///
/// # Panics
///
/// When `x` is not a whole number of rows.
pub fn sum(x: &[f32], cols: usize) -> Vec<f32> {
    assert_rows("sum", x, cols);
    if cols == 0 {
        return Vec::new();
    }
    x.chunks_exact(cols)
        .map(|row| row.iter().map(|&v| f64::from(v)).sum::<f64>() as f32)
        .collect()
}

/// Softmax of each row of `cols` values (the row's maximum subtracted first), in f64. No rows
/// for `cols` 0.
///
/// # Panics
///
/// When `x` is not a whole number of rows.
pub fn softmax(x: &[f32], cols: usize) -> Vec<f32> {
    assert_rows("softmax", x, cols);
    if cols == 0 {
        return Vec::new();
    }
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks_exact(cols) {
        let max = row
            .iter()
            .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
        let exps: Vec<f64> = row.iter().map(|&v| (f64::from(v) - max).exp()).collect();
        let total: f64 = exps.iter().sum();
        y.extend(exps.iter().map(|e| (e / total) as f32));
    }
    y
}

/// Layer normalization of each row of `cols` values: `(x − mean) / √(var + eps) · gamma + beta`
/// with the biased variance (over `cols`, as PyTorch's `layer_norm`), in f64. No rows for
/// `cols` 0.
///
/// # Panics
///
/// When `x` is not a whole number of rows, or `gamma` or `beta` does not hold `cols` values.
pub fn layer_norm(x: &[f32], gamma: &[f32], beta: &[f32], cols: usize, eps: f32) -> Vec<f32> {
    assert_rows("layer_norm", x, cols);
    assert_eq!(
        gamma.len(),
        cols,
        "layer_norm twin: gamma is not of length cols"
    );
    assert_eq!(
        beta.len(),
        cols,
        "layer_norm twin: beta is not of length cols"
    );
    if cols == 0 {
        return Vec::new();
    }
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks_exact(cols) {
        let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / cols as f64;
        let variance = row
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / cols as f64;
        let inverse = 1.0 / (variance + f64::from(eps)).sqrt();
        y.extend(
            row.iter()
                .zip(gamma.iter().zip(beta))
                .map(|(&v, (&g, &b))| {
                    ((f64::from(v) - mean) * inverse * f64::from(g) + f64::from(b)) as f32
                }),
        );
    }
    y
}

/// The first `take` of each row's `cols` values.
pub fn take_columns(x: &[f32], cols: usize, take: usize) -> Vec<f32> {
    assert_rows("take_columns", x, cols);
    assert!(take <= cols, "take_columns twin: take above cols");
    x.chunks_exact(cols.max(1))
        .flat_map(|row| &row[..take])
        .copied()
        .collect()
}

/// `x + r` (rounded to f32) and [`layer_norm`] of it: the sum and the normalized rows, as a
/// plan's fused residual add and layer norm computes them.
pub fn add_layer_norm(
    x: &[f32],
    r: &[f32],
    gamma: &[f32],
    beta: &[f32],
    cols: usize,
    eps: f32,
) -> (Vec<f32>, Vec<f32>) {
    assert_eq!(
        x.len(),
        r.len(),
        "add_layer_norm twin: x and r differ in length"
    );
    let sum: Vec<f32> = x.iter().zip(r).map(|(a, b)| a + b).collect();
    let normalized = layer_norm(&sum, gamma, beta, cols, eps);
    (sum, normalized)
}

/// Softmax of each row of `cols` values of `scale · x` (the product rounded to f32, as the
/// kernel computes it, then in f64), the kept maximum subtracted first. With `causal` =
/// `Some(offset)`, row `r` is query `i = r mod queries` and keeps the columns `c ≤ i + offset`,
/// writing 0 at the others; `None` keeps every column. No rows for `cols` 0.
///
/// # Panics
///
/// When `x` is not a whole number of rows, or `queries` is 0 with a causal mask.
pub fn softmax_rows(
    x: &[f32],
    cols: usize,
    queries: usize,
    scale: f32,
    causal: Option<usize>,
) -> Vec<f32> {
    assert_rows("softmax_rows", x, cols);
    if cols == 0 {
        return Vec::new();
    }
    let mut y = Vec::with_capacity(x.len());
    for (r, row) in x.chunks_exact(cols).enumerate() {
        let kept = causal.map_or(cols, |offset| {
            (r % queries)
                .saturating_add(offset)
                .saturating_add(1)
                .min(cols)
        });
        let scores: Vec<f64> = row[..kept].iter().map(|&v| f64::from(scale * v)).collect();
        let max = scores.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
        let exps: Vec<f64> = scores.iter().map(|&v| (v - max).exp()).collect();
        let total: f64 = exps.iter().sum();
        y.extend(exps.iter().map(|e| (e / total) as f32));
        y.extend(std::iter::repeat_n(0.0, cols - kept));
    }
    y
}

/// Rows of `table` (`[vocab, width]`, row-major) selected by `ids`, f32 values of exact
/// integers: `ids.len() · width` values. An id that is not an integer in `[0, vocab)` gives a
/// row of NaN, as the kernel.
///
/// # Panics
///
/// When `table` is not a whole number of rows of `width`.
pub fn embedding(table: &[f32], width: usize, ids: &[f32]) -> Vec<f32> {
    assert_rows("embedding", table, width);
    let vocab = table.len().checked_div(width).unwrap_or(0);
    let mut y = Vec::with_capacity(ids.len() * width);
    for &id in ids {
        if id >= 0.0 && (id as f64) < vocab as f64 && id.floor() == id {
            let row = id as usize;
            y.extend_from_slice(&table[row * width..(row + 1) * width]);
        } else {
            y.extend(std::iter::repeat_n(f32::NAN, width));
        }
    }
    y
}

/// The twin of [`Context::embedding_sum`](crate::compute::Context::embedding_sum): for each row
/// `t`, `table[id(t)] + positions_table[positions[t]]` (`width` columns), `id(t) = ids[t] +
/// fed[t] · previous[picks[t]]` where `fed` is given (as `(fed, previous, picks)`) and
/// `fed[t] ≠ 0`, else `ids[t]`; a row of NaN for an id, position or pick that is not an integer
/// row of its table (or index of `previous`), as the kernel.
pub fn embedding_sum(
    table: &[f32],
    positions_table: &[f32],
    width: usize,
    ids: &[f32],
    positions: &[f32],
    fed: Option<(&[f32], &[f32], &[f32])>,
) -> Vec<f32> {
    let is_row = |v: f32, rows: usize| v >= 0.0 && (v as f64) < rows as f64 && v.floor() == v;
    let ids: Vec<f32> = match fed {
        None => ids.to_vec(),
        Some((fed, previous, picks)) => ids
            .iter()
            .zip(fed.iter().zip(picks))
            .map(|(&id, (&weight, &pick))| match weight {
                0.0 => id,
                _ if is_row(pick, previous.len()) => id + weight * previous[pick as usize],
                _ => -1.0,
            })
            .collect(),
    };
    let tokens = embedding(table, width, &ids);
    let places = embedding(positions_table, width, positions);
    add(&tokens, &places)
}

/// The index of the largest value of each row of `cols` values, the first on ties (NaN never
/// larger). No rows for `cols` 0.
///
/// # Panics
///
/// When `x` is not a whole number of rows.
pub fn argmax_rows(x: &[f32], cols: usize) -> Vec<u32> {
    assert_rows("argmax_rows", x, cols);
    if cols == 0 {
        return Vec::new();
    }
    x.chunks_exact(cols)
        .map(|row| {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = i;
                }
            }
            best as u32
        })
        .collect()
}

fn assert_rows(twin: &str, x: &[f32], cols: usize) {
    let whole = if cols == 0 {
        x.is_empty()
    } else {
        x.len().is_multiple_of(cols)
    };
    assert!(
        whole,
        "{twin} twin: {} values are not rows of {cols}",
        x.len()
    );
}

/// The layout of a paged KV cache, `[num_blocks, block_tokens, n_head, head_dim]` (row-major):
/// what the twins [`kv_write`] and [`paged_attention_decode`] need besides the values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// Token slots per block.
    pub block_tokens: usize,
    /// Heads per token.
    pub n_head: usize,
    /// Values per head.
    pub head_dim: usize,
}

impl KvLayout {
    /// Values per token: `n_head · head_dim`.
    pub fn token_len(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// The cache's row (first value) of token `t` of a sequence with block table `table`, or
    /// `None` where the block id is not an integer in `[0, num_blocks)` or `t` is past the table.
    fn token_row(&self, table: &[f32], t: usize, num_blocks: usize) -> Option<usize> {
        let block = *table.get(t / self.block_tokens)?;
        let valid = block >= 0.0 && block < num_blocks as f32 && block.floor() == block;
        valid.then(|| {
            (block as usize * self.block_tokens + t % self.block_tokens) * self.token_len()
        })
    }
}

/// [`kv_write`] from a fused query-key-value tensor `qkv` (`[batch, 3, n_head, head_dim]`):
/// its keys and values, the queries left alone.
pub fn kv_write_qkv(
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    qkv: &[f32],
    block_table: &[f32],
    positions: &[f32],
    layout: KvLayout,
) {
    let [_, k_new, v_new] = split_qkv(qkv, layout.token_len());
    kv_write(
        k_cache,
        v_cache,
        &k_new,
        &v_new,
        block_table,
        positions,
        layout,
    );
}

/// The decode rows' cache write and attention of
/// [`Context::paged_attention_decode_write_qkv`](crate::compute::Context::paged_attention_decode_write_qkv):
/// [`kv_write_qkv`] at `positions`, then [`paged_attention_decode`] of the queries over lengths
/// `positions + 1`.
///
/// # Panics
///
/// As [`kv_write`] and [`paged_attention_decode`].
pub fn paged_attention_decode_write_qkv(
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    qkv: &[f32],
    block_table: &[f32],
    positions: &[f32],
    layout: KvLayout,
    scale: f32,
) -> Vec<f32> {
    kv_write_qkv(k_cache, v_cache, qkv, block_table, positions, layout);
    let [q, _, _] = split_qkv(qkv, layout.token_len());
    let lengths: Vec<f32> = positions.iter().map(|&p| p + 1.0).collect();
    paged_attention_decode(&q, k_cache, v_cache, block_table, &lengths, layout, scale)
}

/// The queries, keys and values of a fused `[batch, 3, token_len]` tensor, each
/// `[batch, token_len]`.
pub fn split_qkv(qkv: &[f32], token_len: usize) -> [Vec<f32>; 3] {
    assert!(
        qkv.len().is_multiple_of(3 * token_len.max(1)),
        "split_qkv: not [batch, 3, token_len]"
    );
    std::array::from_fn(|part| {
        qkv.chunks_exact(3 * token_len.max(1))
            .flat_map(|row| &row[part * token_len..(part + 1) * token_len])
            .copied()
            .collect()
    })
}

/// Writes each sequence's new token (`k_new`, `v_new`: `[batch, n_head, head_dim]`) into the
/// caches at position `positions[b]`: block `block_table[b, pos / block_tokens]` (a table of
/// `batch` rows), slot `pos % block_tokens`. Positions and block ids are f32 values of exact
/// integers; a position or block id out of range writes nothing for that sequence, as the
/// kernel.
///
/// # Panics
///
/// When the caches are not whole numbers of blocks of one length, the new tokens not `batch`
/// tokens each, or the table not `batch` rows (a test oracle's precondition).
pub fn kv_write(
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    k_new: &[f32],
    v_new: &[f32],
    block_table: &[f32],
    positions: &[f32],
    layout: KvLayout,
) {
    let (batch, token_len) = (positions.len(), layout.token_len());
    let block_len = layout.block_tokens * token_len;
    assert!(k_cache.len() == v_cache.len() && k_cache.len().is_multiple_of(block_len));
    assert!(k_new.len() == batch * token_len && v_new.len() == k_new.len());
    assert!(batch > 0 && block_table.len().is_multiple_of(batch));
    let num_blocks = k_cache.len() / block_len;
    let max_blocks = block_table.len() / batch;
    for (b, &pos) in positions.iter().enumerate() {
        let in_range = pos >= 0.0 && pos < (max_blocks * layout.block_tokens) as f32;
        if !(in_range && pos.floor() == pos) {
            continue;
        }
        let table = &block_table[b * max_blocks..(b + 1) * max_blocks];
        let Some(row) = layout.token_row(table, pos as usize, num_blocks) else {
            continue;
        };
        let new = b * token_len..(b + 1) * token_len;
        k_cache[row..row + token_len].copy_from_slice(&k_new[new.clone()]);
        v_cache[row..row + token_len].copy_from_slice(&v_new[new]);
    }
}

/// Attention of one query token per sequence over a paged KV cache, in f64: for sequence `b`
/// and head `h`, the scores `s_t = scale · q[b, h, ·] · K[t, h, ·]` over its tokens
/// `t < seq_lens[b]` (token `t` at block `block_table[b, t / block_tokens]`, slot
/// `t % block_tokens`), their softmax (the maximum subtracted first), and the weighted sum of
/// `V[t, h, ·]`: `[batch, n_head, head_dim]`. A length that is not an integer in
/// `[1, max_blocks · block_tokens]` or a used block id that is not an integer in
/// `[0, num_blocks)` gives NaN for every head of the sequence, as the kernel.
///
/// # Panics
///
/// When the caches are not whole numbers of blocks of one length, `q` not `batch` tokens, or
/// the table not `batch` rows (a test oracle's precondition).
pub fn paged_attention_decode(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    block_table: &[f32],
    seq_lens: &[f32],
    layout: KvLayout,
    scale: f32,
) -> Vec<f32> {
    let (batch, token_len, head_dim) = (seq_lens.len(), layout.token_len(), layout.head_dim);
    let block_len = layout.block_tokens * token_len;
    assert!(k_cache.len() == v_cache.len() && k_cache.len().is_multiple_of(block_len));
    assert!(q.len() == batch * token_len);
    assert!(batch > 0 && block_table.len().is_multiple_of(batch));
    let num_blocks = k_cache.len() / block_len;
    let max_blocks = block_table.len() / batch;
    let mut out = vec![f32::NAN; q.len()];
    for (b, &len) in seq_lens.iter().enumerate() {
        let in_range = len >= 1.0 && len <= (max_blocks * layout.block_tokens) as f32;
        if !(in_range && len.floor() == len) {
            continue;
        }
        let table = &block_table[b * max_blocks..(b + 1) * max_blocks];
        let rows: Option<Vec<usize>> = (0..len as usize)
            .map(|t| layout.token_row(table, t, num_blocks))
            .collect();
        let Some(rows) = rows else {
            continue;
        };
        for h in 0..layout.n_head {
            let query = &q[(b * layout.n_head + h) * head_dim..][..head_dim];
            let scores: Vec<f64> = rows
                .iter()
                .map(|&row| {
                    let key = &k_cache[row + h * head_dim..][..head_dim];
                    let dot: f64 = query
                        .iter()
                        .zip(key)
                        .map(|(&a, &k)| f64::from(a) * f64::from(k))
                        .sum();
                    f64::from(scale) * dot
                })
                .collect();
            let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|&s| (s - top).exp()).collect();
            let total: f64 = weights.iter().sum();
            for d in 0..head_dim {
                let value: f64 = rows
                    .iter()
                    .zip(&weights)
                    .map(|(&row, &w)| w * f64::from(v_cache[row + h * head_dim + d]))
                    .sum();
                out[(b * layout.n_head + h) * head_dim + d] = (value / total) as f32;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
