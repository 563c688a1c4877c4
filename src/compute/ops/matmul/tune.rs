//! The autotuner: its choice among candidate plans from measured times, as data in and an index
//! out ([`choose_plan`], no GPU), and its measuring, in a pool and context of its own; and
//! [`Context::matmul_plan`], the rules' plan ([`select`]) or the tuned one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use super::record::Epilogue;
use super::select::{self, MatmulPlan};
use crate::compute::context::{Context, ContextOptions};
use crate::compute::timing::{KernelTiming, TimestampSupport};
use crate::compute::types::{
    Autotune, Choices, ComputeError, CoopTiles, DType, DeviceCaps, MatmulDevice, MatmulOptions,
    MatmulTiles,
};
use crate::pool::{Pool, PoolOptions};

/// Rounds in which the autotuner times each candidate right after the automatic plan.
const TUNING_ROUNDS: usize = 5;

/// How many times the final confirmation times the autotuner's choice beside the automatic plan
/// in each of the orders A B B A and B A A B ([`beats_automatic`]): 16 timings, 8 ratios.
const CONFIRMATION_ROUNDS: usize = 2;

/// The plan the autotuner keeps of `count` plans, the automatic one at index 0, where
/// `time(i)` times plan `i` now, in seconds: the fastest by paired ratios over
/// [`TUNING_ROUNDS`] rounds ([`fastest_in_rounds`]), kept only if a final confirmation beside
/// the automatic plan ([`beats_automatic`]) shows it faster, else the automatic plan. `None`
/// when `count` is 0. The first error of `time` ends tuning.
pub(crate) fn choose_plan<E>(
    count: usize,
    mut time: impl FnMut(usize) -> Result<f64, E>,
) -> Result<Option<usize>, E> {
    match fastest_in_rounds(count, &mut time)? {
        Some(chosen) if chosen != 0 && !beats_automatic(chosen, &mut time)? => Ok(Some(0)),
        chosen => Ok(chosen),
    }
}

/// The fastest of `count` plans by paired ratios ([`fastest_by_paired_ratios`]): for
/// [`TUNING_ROUNDS`] rounds, each plan past the first is timed right after plan 0, in an order
/// that rotates from round to round.
fn fastest_in_rounds<E>(
    count: usize,
    time: &mut impl FnMut(usize) -> Result<f64, E>,
) -> Result<Option<usize>, E> {
    // pairs[i]: (plan 0's time, plan i's time) per round, back to back.
    let mut pairs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); count];
    if count > 1 {
        let others = count - 1;
        for round in 0..TUNING_ROUNDS {
            for turn in 0..others {
                let index = 1 + (turn + round) % others;
                let reference = time(0)?;
                pairs[index].push((reference, time(index)?));
            }
        }
    }
    Ok(fastest_by_paired_ratios(&pairs))
}

/// Whether plan `chosen` is faster than plan 0 timed beside it: [`CONFIRMATION_ROUNDS`] times
/// A B B A then B A A B (A plan 0, B `chosen`), a ratio B / A per adjacent pair, so that each
/// plan runs first as often as second and a clock that moves during a pair favours neither.
/// Faster when the greater of the two middle ratios is below 1: more than half of the pairs
/// show it faster, a clock dip that biases half of them does not make it.
fn beats_automatic<E>(
    chosen: usize,
    time: &mut impl FnMut(usize) -> Result<f64, E>,
) -> Result<bool, E> {
    let mut ratios = Vec::with_capacity(4 * CONFIRMATION_ROUNDS);
    for half in 0..2 * CONFIRMATION_ROUNDS {
        for pair in 0..2 {
            // A B B A, then B A A B.
            let (reference, candidate) = if (half % 2 == 0) == (pair == 0) {
                let reference = time(0)?;
                (reference, time(chosen)?)
            } else {
                let candidate = time(chosen)?;
                (time(0)?, candidate)
            };
            if reference > 0.0 && candidate.is_finite() {
                ratios.push(candidate / reference);
            }
        }
    }
    ratios.sort_by(f64::total_cmp);
    Ok(ratios
        .get(ratios.len() / 2)
        .is_some_and(|&ratio| ratio < 1.0))
}

/// The index of the fastest candidate, from `pairs[i]`: per round, the reference's time (the
/// candidate at index 0, which `pairs[0]` need not hold) and candidate `i`'s, taken back to back.
/// Each candidate scores the median of its ratios over the rounds (the reference 1); the lowest
/// score wins, ties to the lower index; a candidate without pairs does not compete. `None` when
/// there is no candidate.
fn fastest_by_paired_ratios(pairs: &[Vec<(f64, f64)>]) -> Option<usize> {
    let score = |index: usize| -> Option<f64> {
        if index == 0 {
            return Some(1.0);
        }
        let mut ratios: Vec<f64> = pairs[index]
            .iter()
            .filter(|(reference, time)| *reference > 0.0 && time.is_finite())
            .map(|(reference, time)| time / reference)
            .collect();
        if ratios.is_empty() {
            return None;
        }
        ratios.sort_by(f64::total_cmp);
        let middle = ratios.len() / 2;
        Some(if ratios.len() % 2 == 1 {
            ratios[middle]
        } else {
            (ratios[middle - 1] + ratios[middle]) / 2.0
        })
    };
    (0..pairs.len())
        .filter_map(|index| Some((index, score(index)?)))
        .min_by(|x, y| x.1.total_cmp(&y.1).then(x.0.cmp(&y.0)))
        .map(|(index, _)| index)
}

/// The autotuner's choices of the process, by device (adapter, driver, backend) and matmul
/// options.
fn registry(key: String) -> Arc<Mutex<Choices>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Arc<Mutex<Choices>>>>> = OnceLock::new();
    REGISTRY
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .entry(key)
        .or_default()
        .clone()
}

/// Locks one device's and options' choices.
fn lock(choices: &Mutex<Choices>) -> MutexGuard<'_, Choices> {
    choices
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Context {
    /// The plan [`Context::matmul`] follows for `[m, k] · [k, n]` under the context's options,
    /// on the portable kernels: for f32 operands, and for f16 where no cooperative matrices run
    /// ([`Context::matmul_plan_for`] gives the plan of either type).
    ///
    /// Any sizes give a plan or a typed error, never a panic: [`ComputeError::InvalidShape`] for
    /// a size of 0 or operands of more elements than a tensor holds,
    /// [`ComputeError::ParameterOverflow`] for sizes beyond the kernels' 32-bit parameters,
    /// [`ComputeError::ExceedsLimit`] for a grid the device cannot dispatch.
    pub fn matmul_plan(&self, m: usize, n: usize, k: usize) -> Result<MatmulPlan, ComputeError> {
        let caps = self.device_caps();
        if !self.options().matmul.autotune.applies_to(caps.device_type) {
            // Nothing is tuned on this device: the rules' plan.
            return select::plan(&self.options().matmul, caps, m, n, k);
        }
        select::check_sizes(m, n, k)?;
        let plan = match self.narrow_plan(m, n, k)? {
            Some(plan) => plan,
            None => match self.tuned_options(m, n, k)? {
                Some(options) => select::tiled_plan(&options, caps, m, n, k)?,
                None => select::tiled_plan(&self.options().matmul, caps, m, n, k)?,
            },
        };
        select::check_operands(m, n, k)?;
        Ok(plan)
    }

    /// The plan of `[m, k] · [k, n]` for operands of `dtype`, as [`Context::matmul_with`]
    /// chooses it: for f16 (or f32 under
    /// [`MatmulOptions::cooperative_f32_as_f16`](crate::compute::MatmulOptions::cooperative_f32_as_f16))
    /// on a device with cooperative matrices (opened with
    /// [`GpuOptions::cooperative_matrix`](crate::GpuOptions::cooperative_matrix)) the matmul on
    /// cooperative matrices where the rules of `src/compute/ops/matmul` give it (its tile is
    /// [`MatmulPlan::cooperative`]; with [`MatmulOptions::autotune`], and neither
    /// `cooperative_tiles` nor `split_k` forced, the tile and split measured fastest for the
    /// shape class, M rounded up to a power of two), else [`Context::matmul_plan`]'s.
    pub fn matmul_plan_for(
        &self,
        dtype: DType,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<MatmulPlan, ComputeError> {
        select::check_sizes(m, n, k)?;
        let options = &self.options().matmul;
        let caps = self.device_caps();
        let Some(automatic) = select::cooperative_plan(options, caps, dtype, m, n, k)? else {
            return self.matmul_plan(m, n, k);
        };
        select::check_operands(m, n, k)?;
        if !options.autotune.applies_to(caps.device_type)
            || options.cooperative_tiles.is_some()
            || options.split_k.is_some()
        {
            return Ok(automatic);
        }
        let class = (m.checked_next_power_of_two().unwrap_or(m), n, k);
        let choices = &self.matmul_device().choices;
        let known = lock(choices).cooperative.get(&class).copied();
        let (tiles, splits) = match known {
            Some(choice) => choice,
            None => {
                // Not locked while it tunes (see `tuned_options`); the first choice stays.
                let choice = self.autotune_cooperative(class, dtype)?;
                *lock(choices).cooperative.entry(class).or_insert(choice)
            }
        };
        let chosen = MatmulOptions {
            cooperative_tiles: Some(tiles),
            split_k: Some(splits),
            ..options.clone()
        };
        Ok(select::cooperative_plan(&chosen, caps, dtype, m, n, k)?.unwrap_or(automatic))
    }

    /// The fastest `(tiles, splits)` of the cooperative matmul for the shape class `(m, n, k)`
    /// (M a power of two) of `dtype` operands: its automatic plan and every tile of
    /// [`CoopTiles::ALL`] the device takes, unsplit and (where it leaves the GPU idle) with 2,
    /// 4, 8 and 16 splits ([`select::cooperative_candidates`]), timed as the tiled kernel's
    /// candidates are ([`Context::fastest`], [`choose_plan`]). A tuner that cannot run leaves the
    /// automatic plan.
    fn autotune_cooperative(
        &self,
        (m, n, k): (usize, usize, usize),
        dtype: DType,
    ) -> Result<(CoopTiles, u32), ComputeError> {
        let options = &self.options().matmul;
        let caps = self.device_caps();
        let automatic = select::cooperative_plan(options, caps, dtype, m, n, k)?
            .ok_or_else(|| ComputeError::Config("no cooperative plan to tune".into()))?;
        let tiles = automatic
            .cooperative
            .ok_or_else(|| ComputeError::Config("a cooperative plan without a tile".into()))?;
        let plans = select::cooperative_candidates(options, caps, dtype, (m, n, k), automatic);
        let fastest = self.fastest((m, n, k), dtype, plans).unwrap_or(None);
        Ok(fastest
            .and_then(|plan| Some((plan.cooperative?, plan.splits)))
            .unwrap_or((tiles, automatic.splits)))
    }

    /// What the matmul's choice reads of this context's device ([`DeviceCaps`]): made once, at
    /// the first matmul or plan, the grid's x capped by
    /// [`ContextOptions::max_grid_x`](crate::compute::ContextOptions::max_grid_x).
    pub(crate) fn device_caps(&self) -> &DeviceCaps {
        &self.matmul_device().caps
    }

    /// With [`MatmulOptions::autotune`]: the options with the tile and split-K measured fastest
    /// for the shape class of `[m, k] · [k, n]` (measured now if the class is new); `None` when
    /// autotuning is off or the tile or split is forced.
    fn tuned_options(
        &self,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<Option<MatmulOptions>, ComputeError> {
        let options = &self.options().matmul;
        if !options.autotune.applies_to(self.device_caps().device_type)
            || options.tiles.is_some()
            || options.split_k.is_some()
        {
            return Ok(None);
        }
        let class = (m.checked_next_power_of_two().unwrap_or(m), n, k);
        let choices = &self.matmul_device().choices;
        let known = lock(choices).tiled.get(&class).copied();
        let (tiles, splits) = match known {
            Some(choice) => choice,
            None => {
                // Not locked while it tunes: the tuner's own products look up nothing here.
                // Another context may have tuned the class meanwhile: the first choice stays,
                // so that every context of the process runs the same plan.
                let choice = self.autotune(class)?;
                *lock(choices).tiled.entry(class).or_insert(choice)
            }
        };
        Ok(Some(MatmulOptions {
            tiles: Some(tiles),
            split_k: Some(splits),
            ..options.clone()
        }))
    }

    /// What this context's matmuls keep of its device: its caps, and the autotuner's choices for
    /// the device (adapter, driver, backend) and the context's matmul options, in the whole
    /// process: every context of the device shares them. The context finds them once, so that a
    /// matmul looks up its class alone.
    fn matmul_device(&self) -> &Arc<MatmulDevice> {
        self.shared.tuned.get_or_init(|| {
            let info = &self.gpu().info;
            let choices = registry(format!(
                "{} / {} {} / {:?} / {:?}",
                info.name,
                info.driver,
                info.driver_info,
                info.backend,
                self.options().matmul
            ));
            let caps = DeviceCaps::of(self.gpu()).with_max_grid_x(self.options().max_grid_x);
            Arc::new(MatmulDevice { caps, choices })
        })
    }

    /// The fastest `(tiles, splits)` for `[m, k] · [k, n]`: the automatic plan and the large,
    /// small, thin and three medium tiles the device takes, each with 1, 2, 4, 8 and 16 splits (at
    /// least `min_split_depth` of K each), timed on the device (`fastest`). Where
    /// the automatic plan is the large tile without a split (the grid fills the GPU), that plan,
    /// untimed.
    ///
    /// Timing ([`choose_plan`]): each candidate is compiled and run once; then, for
    /// [`TUNING_ROUNDS`] rounds, each candidate is timed right after the automatic plan (two
    /// products each: GPU time from timestamps where the adapter has them, from the first
    /// dispatch's start to the last one's end, so that the barriers between a product's
    /// dispatches count, else the wall clock), in an order that rotates from round to round, and
    /// scores the median over the rounds of its time over the automatic plan's just before it
    /// ([`fastest_by_paired_ratios`]). Pairs, because a GPU's clock can move while it tunes (under
    /// Vulkan the H200's fell from 1,980 to 345 MHz and back within one tuning run, and dipped to
    /// 1.4 GHz for two seconds in another): times taken a second apart compare clocks, times
    /// taken back to back compare plans. Then the winner, unless it is the automatic plan, is
    /// confirmed: timed again beside the automatic plan in the orders A B B A and B A A B,
    /// [`CONFIRMATION_ROUNDS`] times each (16 timings), and kept only if more than half of those
    /// paired ratios show it faster; else the automatic plan stays ([`beats_automatic`]).
    /// Confirmation, because the rounds always time the automatic plan first, and a clock that
    /// wavers from one timing to the next or falls and recovers more than once while they run can
    /// favour a slow candidate in most of its pairs (the unit tests simulate such clocks): in one
    /// `bench_kernels --serving` process on the H200, whose SM clock fell to 345-510 MHz for
    /// three seconds, 8 × 4096 × 4096 ran 115.4 µs with the tuned narrow plan (32 lanes, 8
    /// splits), where PyTorch took 45.2 µs in the same call and the rules' plan about 50 in
    /// earlier calls (issue 26). The tuner never keeps a plan slower than the rules' plan
    /// measured beside it at the end of tuning.
    fn autotune(
        &self,
        (m, n, k): (usize, usize, usize),
    ) -> Result<(MatmulTiles, u32), ComputeError> {
        let options = &self.options().matmul;
        let caps = self.device_caps();
        let automatic = select::tiled_plan(options, caps, m, n, k)?;
        if Some(automatic.tiles) == options.large_tile(&caps.limits) && automatic.splits == 1 {
            return Ok((automatic.tiles, automatic.splits));
        }
        let plans = select::tiled_candidates(options, caps, (m, n, k), automatic);
        // A tuner that cannot run (no memory for the class's operands and partials, say) leaves
        // the rules' plan: tuning never fails a product that would run without it.
        let fastest = self.fastest((m, n, k), DType::F32, plans).unwrap_or(None);
        Ok(fastest.map_or((automatic.tiles, automatic.splits), |plan| {
            (plan.tiles, plan.splits)
        }))
    }

    /// The fastest `(lanes, splits, row groups)` of the narrow kernel for `[m, k] · [k, n]`, whose
    /// automatic plan is `automatic`: that plan and, for all rows in each workgroup and (with 8
    /// rows or more) 2 and 4 groups of rows, for every power of two of lanes from 2 to 128 that N
    /// fills, the splits of K (powers of two up to 64, each invocation keeping at least one vec4
    /// row of K) that give from `min_workgroups / 4` to `2 · min_workgroups` workgroups (the
    /// unsplit plan of each lanes too), timed as the tiled kernel's candidates are
    /// ([`Context::fastest`]). On the H200, 8 × 4096 × 4096 took 49.5 µs with the automatic plan
    /// (4 lanes, no split: 256 workgroups) and 43.7-45.3 µs with 32 to 128 lanes and 16 or 32
    /// splits (256 to 512 workgroups), where 1 × 4096 × 4096 was fastest as planned
    /// (MEASUREMENTS.md, 2026-12-02).
    fn autotune_narrow(
        &self,
        (m, n, k): (usize, usize, usize),
        automatic: MatmulPlan,
    ) -> Result<(u32, u32, u32), ComputeError> {
        let plans = select::narrow_candidate_plans(
            &self.options().matmul,
            self.device_caps(),
            (m, n, k),
            automatic,
        );
        let fastest = self.fastest((m, n, k), DType::F32, plans).unwrap_or(None);
        let plan = fastest.unwrap_or(automatic);
        Ok((plan.narrow_lanes, plan.splits, plan.narrow_row_groups))
    }

    /// The fastest of `candidates` for `[m, k] · [k, n]`, the automatic plan first (`None` when
    /// there is none), chosen by [`choose_plan`] (confirmed beside the automatic plan, else the
    /// automatic plan) and timed in a pool and context of their own, given back before it
    /// returns: tuning leaves the context's pool as it was (no segment created or cached for the
    /// tuner's operands and partials).
    fn fastest(
        &self,
        (m, n, k): (usize, usize, usize),
        dtype: DType,
        candidates: Vec<MatmulPlan>,
    ) -> Result<Option<MatmulPlan>, ComputeError> {
        let options = &self.options().matmul;
        // Timed by timestamps where the adapter has them: on the H200 a wall-clock tuner (batches
        // of about 0.5 ms from submission to completion, no timestamps) chose plans up to 25%
        // slower, its samples scattered by ±10% where timestamps agree within 1-2%
        // (MEASUREMENTS.md, 2026-12-02, calls 23 and 24).
        let timestamps = TimestampSupport::of(&self.gpu().device) != TimestampSupport::None;
        let pool = Pool::new(self.gpu(), PoolOptions::default())?;
        let tuner = Context::new(
            &pool,
            ContextOptions {
                shader_checks: self.options().shader_checks,
                matmul: MatmulOptions {
                    autotune: Autotune::Off,
                    ..options.clone()
                },
                profile: timestamps,
                ..ContextOptions::default()
            },
        )?;
        let a = tuner.zeros_with(&[m, k], dtype)?;
        let b = tuner.zeros_with(&[k, n], dtype)?;
        // One product each compiles its variant and warms up.
        let plans = candidates;
        for &plan in &plans {
            drop(tuner.matmul_planned(&a, &b, Epilogue::default(), plan)?);
        }
        tuner.sync()?;
        drop(tuner.take_kernel_timings());
        let time = |plan: MatmulPlan| -> Result<f64, ComputeError> {
            let started = web_time::Instant::now();
            for _ in 0..2 {
                drop(tuner.matmul_planned(&a, &b, Epilogue::default(), plan)?);
            }
            tuner.sync()?;
            let wall = started.elapsed().as_secs_f64();
            // From the first dispatch's start to the last one's end: a plan of two dispatches (a
            // split and its reduction) pays the barrier between them, as it does in a workload.
            let gpu = KernelTiming::span_ns(&tuner.take_kernel_timings()) * 1e-9;
            Ok(if timestamps && gpu > 0.0 { gpu } else { wall })
        };
        Ok(choose_plan(plans.len(), |index| time(plans[index]))?.map(|index| plans[index]))
    }

    /// The plan of the narrow kernel, where it applies (see [`select::narrow_plan`]):
    /// with [`MatmulOptions::autotune`], and none of `narrow_lanes`, `narrow_splits` and
    /// `narrow_row_groups` forced,
    /// the lanes and splits measured fastest for this shape (measured now if the shape is new).
    fn narrow_plan(
        &self,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<Option<MatmulPlan>, ComputeError> {
        let options = &self.options().matmul;
        let caps = self.device_caps();
        let Some(automatic) = select::narrow_plan(options, caps, m, n, k) else {
            return Ok(None);
        };
        if !options.autotune.applies_to(caps.device_type)
            || options.narrow_lanes.is_some()
            || options.narrow_splits.is_some()
            || options.narrow_row_groups.is_some()
        {
            return Ok(Some(automatic));
        }
        let shape = (m, n, k);
        let choices = &self.matmul_device().choices;
        let known = lock(choices).narrow.get(&shape).copied();
        let (lanes, splits, groups) = match known {
            Some(choice) => choice,
            None => {
                // Not locked while it tunes: the tuner's own products look up nothing here.
                let choice = self.autotune_narrow(shape, automatic)?;
                *lock(choices).narrow.entry(shape).or_insert(choice)
            }
        };
        let chosen = MatmulOptions {
            narrow_lanes: Some(lanes),
            narrow_splits: Some(splits),
            narrow_row_groups: Some(groups),
            ..options.clone()
        };
        Ok(Some(
            select::narrow_plan(&chosen, caps, m, n, k).unwrap_or(automatic),
        ))
    }
}

#[cfg(test)]
mod tests;
