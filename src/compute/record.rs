//! How a dispatch is recorded, once for every path: the bind group of "parameters + storage
//! ranges" ([`storage_group`]), the cache of those bind groups ([`BindGroups`]), the open compute
//! pass with the pipeline set in it ([`PassRecorder`]), and the uniform ring that parameters are
//! written through ([`ParamsRing`]).
//!
//! The context's eager ops, the dispatches of users' kernels and the replays of plans all go
//! through these: a dispatch binds group 0 = (the parameters' uniform at binding 0, with a
//! dynamic offset; the storage ranges at bindings 1..), then any further groups a user's kernel
//! takes.

use std::collections::HashMap;
use std::num::NonZeroU64;

use super::timing::{Timer, TimestampSupport};
use super::types::{ParamsBlock, PARAMS_BYTES};
use crate::device::{AccountedBuffer, Gpu};
use crate::state::BufferRole;

/// A storage range bound by a dispatch: `(buffer, offset, size)` in bytes.
pub(crate) type Range = (wgpu::Buffer, u64, u64);

/// The bind group of group 0 of a dispatch over `layout`: `params` (a uniform buffer and the
/// bytes of one slot, bound with a dynamic offset) at binding 0 when given, then `ranges` at
/// bindings 1, 2, ... The one place where a dispatch's bind group is made.
pub(crate) fn storage_group(
    device: &wgpu::Device,
    label: &str,
    layout: &wgpu::BindGroupLayout,
    params: Option<(&wgpu::Buffer, u64)>,
    ranges: &[Range],
) -> wgpu::BindGroup {
    let mut entries = Vec::with_capacity(ranges.len() + 1);
    if let Some((buffer, bytes)) = params {
        entries.push(wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer,
                offset: 0,
                size: NonZeroU64::new(bytes),
            }),
        });
    }
    for (binding, (buffer, offset, size)) in (1u32..).zip(ranges) {
        entries.push(wgpu::BindGroupEntry {
            binding,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer,
                offset: *offset,
                size: NonZeroU64::new(*size),
            }),
        });
    }
    device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(label),
        layout,
        entries: &entries,
    })
}

/// What a cached bind group binds: its layout (the context's kernels with this many storage
/// bindings, or a user's kernel) and its storage ranges.
#[derive(PartialEq, Eq, Hash)]
struct BindKey {
    layout: LayoutId,
    ranges: Vec<Range>,
}

/// The layout a bind group is made for.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum LayoutId {
    /// The context's kernels with this many storage bindings.
    Builtin(usize),
    /// A user's kernel, by its id ([`super::user_kernel::UserKernel`]).
    User(u64),
}

/// Bind groups of group 0 kept for reuse, by layout and ranges (the parameters are a dynamic
/// offset into one ring, so they are not part of the key). Emptied when it reaches its bound.
pub(crate) struct BindGroups {
    groups: HashMap<BindKey, wgpu::BindGroup>,
    max: usize,
    /// Whether anything is kept (not with a naive pool, whose tensors are all new buffers).
    enabled: bool,
    /// Bind groups made.
    pub(crate) created: u64,
    /// Bind groups found in the cache.
    pub(crate) hits: u64,
}

impl BindGroups {
    /// A cache of at most `max` bind groups; nothing is kept when `enabled` is false.
    pub(crate) fn new(max: usize, enabled: bool) -> Self {
        Self {
            groups: HashMap::new(),
            max,
            enabled: enabled && max > 0,
            created: 0,
            hits: 0,
        }
    }

    /// The bind group over `layout` of `ranges`, from the cache or made with `make`.
    pub(crate) fn get_or_make(
        &mut self,
        layout: LayoutId,
        ranges: Vec<Range>,
        make: impl FnOnce(&[Range]) -> wgpu::BindGroup,
    ) -> wgpu::BindGroup {
        if !self.enabled {
            self.created += 1;
            return make(&ranges);
        }
        let key = BindKey { layout, ranges };
        if let Some(group) = self.groups.get(&key) {
            self.hits += 1;
            return group.clone();
        }
        let group = make(&key.ranges);
        self.created += 1;
        if self.groups.len() >= self.max {
            self.groups.clear();
        }
        self.groups.insert(key, group.clone());
        group
    }

    /// Bind groups held.
    pub(crate) fn len(&self) -> usize {
        self.groups.len()
    }

    /// Forgets every bind group (they keep the buffers they bind alive).
    pub(crate) fn clear(&mut self) {
        self.groups.clear();
    }
}

/// One dispatch, ready to encode: its pipeline, its bind groups (group 0 with the parameters'
/// dynamic offset, if the layout has one; then the user's groups), its grid.
pub(crate) struct Encoded<'a> {
    pub(crate) pipeline: &'a wgpu::ComputePipeline,
    pub(crate) group: &'a wgpu::BindGroup,
    pub(crate) params_offset: Option<u32>,
    pub(crate) more_groups: &'a [wgpu::BindGroup],
    pub(crate) workgroups: [u32; 3],
}

/// The open compute pass of an encoder and the pipeline set in it: pass bookkeeping, for the
/// context's batches and for plans' replays.
#[derive(Default)]
pub(crate) struct PassRecorder {
    pass: Option<wgpu::ComputePass<'static>>,
    /// The pipeline set in the open pass.
    pipeline: Option<wgpu::ComputePipeline>,
    /// Passes begun.
    pub(crate) passes: u64,
}

impl PassRecorder {
    /// Encodes `dispatch` into the open pass of `encoder` (begun here if none is open, labelled
    /// `label`). With `timing` (the timer and the kernel's name), the dispatch is timed: with
    /// timestamps around it in the pass, or in a pass of its own where the adapter has timestamps
    /// only at pass boundaries.
    pub(crate) fn dispatch(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        label: &str,
        dispatch: &Encoded<'_>,
        timing: Option<(&mut Timer, String)>,
    ) {
        let pair = timing.map(|(timer, name)| {
            let pair = timer.next_pair(name);
            let timer: &Timer = timer;
            (timer.support, pair, &timer.query_set)
        });
        if let Some((TimestampSupport::PassBoundaries, (begin, end), query_set)) = pair {
            // A pass of its own, timed at its boundaries.
            self.end();
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("wgpu-pool compute (timed)"),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set,
                    beginning_of_pass_write_index: Some(begin),
                    end_of_pass_write_index: Some(end),
                }),
            });
            self.passes += 1;
            encode(&mut pass, dispatch);
            return;
        }
        let pass = self.open(encoder, label);
        if let Some((_, (begin, _), query_set)) = pair {
            pass.write_timestamp(query_set, begin);
        }
        if self.pipeline.as_ref() != Some(dispatch.pipeline) {
            let pass = self.pass.as_mut().expect("opened above");
            pass.set_pipeline(dispatch.pipeline);
            self.pipeline = Some(dispatch.pipeline.clone());
        }
        let pass = self.pass.as_mut().expect("opened above");
        set_groups(pass, dispatch);
        let [x, y, z] = dispatch.workgroups;
        pass.dispatch_workgroups(x, y, z);
        if let Some((_, (_, end), query_set)) = pair {
            pass.write_timestamp(query_set, end);
        }
    }

    /// The open pass, begun if none is.
    fn open(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        label: &str,
    ) -> &mut wgpu::ComputePass<'static> {
        if self.pass.is_none() {
            self.passes += 1;
            self.pipeline = None;
        }
        self.pass.get_or_insert_with(|| {
            encoder
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some(label),
                    timestamp_writes: None,
                })
                .forget_lifetime()
        })
    }

    /// Ends the open pass (dropping it records its end into the encoder), for a command that is
    /// not a dispatch or for the end of the encoder.
    pub(crate) fn end(&mut self) {
        self.pass = None;
        self.pipeline = None;
    }
}

/// Sets `dispatch`'s pipeline, groups and grid in `pass` (a pass of its own).
fn encode(pass: &mut wgpu::ComputePass<'_>, dispatch: &Encoded<'_>) {
    pass.set_pipeline(dispatch.pipeline);
    set_groups(pass, dispatch);
    let [x, y, z] = dispatch.workgroups;
    pass.dispatch_workgroups(x, y, z);
}

/// Sets `dispatch`'s bind groups: group 0 with its parameters' offset, then the others.
fn set_groups(pass: &mut wgpu::ComputePass<'_>, dispatch: &Encoded<'_>) {
    let offsets: &[u32] = match &dispatch.params_offset {
        Some(offset) => std::slice::from_ref(offset),
        None => &[],
    };
    pass.set_bind_group(0, dispatch.group, offsets);
    for (index, group) in (1u32..).zip(dispatch.more_groups) {
        pass.set_bind_group(index, group, &[]);
    }
}

/// Op parameters of the open batch (or of a plan, written once): slots of a uniform buffer, filled
/// on the CPU while recording and written with one `queue.write_buffer` before the batch is
/// submitted (the write lands at the start of that submission, before the batch's commands).
/// Identical parameters of the context's kernels share a slot; a user's kernel's parameters take
/// as many consecutive slots as they need.
pub(crate) struct ParamsRing {
    pub(crate) buffer: AccountedBuffer,
    slot_bytes: u64,
    slots: u64,
    staging: Vec<u8>,
    used_slots: u64,
    slots_by_params: HashMap<ParamsBlock, u32>,
}

impl ParamsRing {
    /// The most slots of a ring: their offsets fit a `u32`.
    pub(crate) const MAX_SLOTS: u32 = 65_536;

    /// The bytes of a slot on a device whose uniform offsets align to `alignment`.
    pub(crate) fn slot_bytes(alignment: u32) -> u64 {
        PARAMS_BYTES.max(u64::from(alignment))
    }

    /// A ring of `slots` (1..=[`Self::MAX_SLOTS`]) slots of `max(PARAMS_BYTES, alignment)` bytes.
    pub(crate) fn new(gpu: &Gpu, slots: u32, alignment: u32) -> Self {
        let slot_bytes = Self::slot_bytes(alignment);
        let size = slot_bytes * u64::from(slots);
        Self {
            buffer: gpu.create_accounted_buffer(
                BufferRole::Parameters,
                &wgpu::BufferDescriptor {
                    label: Some("wgpu-pool compute params ring"),
                    size,
                    usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                },
            ),
            slot_bytes,
            slots: u64::from(slots),
            staging: vec![0; size as usize],
            used_slots: 0,
            slots_by_params: HashMap::new(),
        }
    }

    /// The slots `bytes` of parameters take.
    pub(crate) fn slots_for(&self, bytes: u64) -> u64 {
        bytes.div_ceil(self.slot_bytes).max(1)
    }

    /// Whether `slots` more slots fit.
    pub(crate) fn has_room(&self, slots: u64) -> bool {
        self.used_slots + slots <= self.slots
    }

    /// The dynamic offset of a slot holding `params`. The ring has a slot per dispatch of a batch
    /// (per step of a plan), so it never fills before the batch does.
    pub(crate) fn push(&mut self, params: &ParamsBlock) -> u32 {
        if let Some(&offset) = self.slots_by_params.get(params) {
            return offset;
        }
        let offset = self.push_bytes(params.bytes(), PARAMS_BYTES);
        self.slots_by_params.insert(*params, offset);
        offset
    }

    /// The dynamic offset of consecutive slots holding `bytes` (a user's kernel's parameters)
    /// and zeros up to `binding_bytes` and the end of the last slot. The caller checked
    /// [`ParamsRing::has_room`] for [`ParamsRing::slots_for`] `binding_bytes`.
    pub(crate) fn push_bytes(&mut self, bytes: &[u8], binding_bytes: u64) -> u32 {
        let start = (self.used_slots * self.slot_bytes) as usize;
        let slots = self.slots_for(binding_bytes.max(bytes.len() as u64));
        let end = start + (slots * self.slot_bytes) as usize;
        self.staging[start..start + bytes.len()].copy_from_slice(bytes);
        self.staging[start + bytes.len()..end].fill(0);
        self.used_slots += slots;
        u32::try_from(start).expect("the ring has at most 65,536 slots of at most 256 bytes")
    }

    fn used_bytes(&self) -> usize {
        (self.used_slots * self.slot_bytes) as usize
    }

    /// Writes the slots filled so far to the buffer (landing at the start of the next
    /// submission); returns the bytes written.
    pub(crate) fn write(&self, queue: &wgpu::Queue) -> usize {
        let used = self.used_bytes();
        if used > 0 {
            queue.write_buffer(&self.buffer, 0, &self.staging[..used]);
        }
        used
    }

    /// Empties the ring (its slots were written and submitted).
    pub(crate) fn reset(&mut self) {
        self.used_slots = 0;
        self.slots_by_params.clear();
    }
}
