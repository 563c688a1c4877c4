//! Getting a device: one place that picks an adapter (obeying `WGPU_BACKEND` and
//! `WGPU_ADAPTER_NAME`), chooses limits and optional features, and explains what to install when
//! no adapter is found. Examples and tests both start here.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::state::{AccountedBytes, BufferRole, RoleBytes};

/// Which limits to ask the device for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LimitsChoice {
    /// Everything the adapter supports (largest buffers and bindings).
    #[default]
    Adapter,
    /// WebGPU's default limits (`wgpu::Limits::default()`): 256-byte storage offset alignment,
    /// 128 MiB bindings, 256 MiB buffers. Code that works here works in browsers, on Metal and DX12.
    WebGpuDefault,
}

/// How to open a device ([`request_gpu_with`], [`open_with`]): its limits, and the experimental
/// features the user accepts. Build it from [`GpuOptions::default`] (the adapter's limits, no
/// experimental feature: what [`request_gpu`] and [`open`] do) with the `with_*` methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct GpuOptions {
    /// Which limits to ask the device for.
    pub limits: LimitsChoice,
    /// Ask for [`wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX`] where the adapter has it, so
    /// that f16 matmuls run on cooperative matrices (the tensor cores on NVIDIA GPUs; see
    /// [`crate::compute::CoopTiles`]). Off by default. wgpu marks the feature experimental:
    /// asking for it is the user's acknowledgement that wgpu's implementation may still have
    /// bugs that lead to undefined behaviour, as wgpu's
    /// [`ExperimentalFeatures::enabled`](wgpu::ExperimentalFeatures::enabled) says. Where the
    /// adapter lacks the feature (software adapters, GL, browsers) the device is opened without
    /// it and a warning is logged; [`Gpu::cooperative_matrix`] says which happened.
    pub cooperative_matrix: bool,
}

impl GpuOptions {
    /// These options with `limits`.
    pub fn with_limits(self, limits: LimitsChoice) -> Self {
        Self { limits, ..self }
    }

    /// These options asking (or not) for cooperative matrices (see
    /// [`GpuOptions::cooperative_matrix`]).
    pub fn with_cooperative_matrix(self, cooperative_matrix: bool) -> Self {
        Self {
            cooperative_matrix,
            ..self
        }
    }
}

/// Optional features used when the adapter has them; none is required.
pub const OPTIONAL_FEATURES: wgpu::Features = wgpu::Features::TIMESTAMP_QUERY
    .union(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES)
    .union(wgpu::Features::SHADER_F16)
    .union(wgpu::Features::SUBGROUP);

/// Why no device could be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// No adapter answered for the enabled backends.
    #[error(
        "no GPU adapter found (backends: {backends}; WGPU_BACKEND={env_backend}): {source}. \
         On a headless Linux machine install Mesa's software drivers: \
         `apt-get install mesa-vulkan-drivers` (Vulkan, lavapipe) or \
         `apt-get install libegl-mesa0 libgl1-mesa-dri` (GL, llvmpipe), \
         then select one with WGPU_BACKEND=vulkan or WGPU_BACKEND=gl"
    )]
    NoAdapter {
        /// The backends that were enabled.
        backends: String,
        /// The value of `WGPU_BACKEND`, or `(unset)`.
        env_backend: String,
        /// What wgpu said.
        source: wgpu::RequestAdapterError,
    },
    /// `WGPU_ADAPTER_NAME` named an adapter that is not present.
    #[error("WGPU_ADAPTER_NAME={wanted:?} matches none of the adapters found: {found:?}")]
    AdapterNameNotFound {
        /// The name asked for.
        wanted: String,
        /// The adapters that were found.
        found: Vec<String>,
    },
    /// The adapter refused to open a device.
    #[error("the adapter refused a device: {0}")]
    RequestDevice(#[from] wgpu::RequestDeviceError),
}

/// A device and its queue, with the adapter when this crate opened it, and the accounting of
/// the buffers the crate creates on it ([`Gpu::accounted`]), shared by its clones.
#[derive(Debug, Clone)]
pub struct Gpu {
    /// The adapter the device was opened on: `None` for a device opened elsewhere and handed in
    /// with [`Gpu::from_device`].
    pub adapter: Option<wgpu::Adapter>,
    /// The device.
    pub device: wgpu::Device,
    /// The device's queue.
    pub queue: wgpu::Queue,
    /// Name, vendor, backend and driver of the adapter.
    pub info: wgpu::AdapterInfo,
    /// The bytes of every buffer the crate holds on the device, by role.
    ledger: Arc<Ledger>,
    /// The errors the device reported to no one (its uncaptured-error handler), where the crate
    /// opened the device in a browser: see [`Gpu::take_device_errors`].
    errors: Arc<Mutex<Vec<String>>>,
}

impl Gpu {
    /// A device and queue opened elsewhere (by another crate, an engine, a window's renderer), as
    /// they are handed out: no adapter is requested and no device is opened here. The adapter's
    /// name, backend and driver come from the device ([`wgpu::Device::adapter_info`]). Make one
    /// `Gpu` per device and clone it: the accounting ([`Gpu::accounted`]) is shared by clones,
    /// not by two `Gpu`s made of one device.
    pub fn from_device(device: wgpu::Device, queue: wgpu::Queue) -> Self {
        let info = device.adapter_info();
        Self {
            adapter: None,
            device,
            queue,
            info,
            ledger: Arc::default(),
            errors: Arc::default(),
        }
    }

    /// The errors the device reported outside any error scope since the last call, taken. In a
    /// browser, where nothing can wait for an error scope, a device the crate opened keeps them
    /// here (not the console alone), and the async reads (`Pool::read_async`,
    /// `Tensor::to_vec_async`, `PlanRun::wait_async`, `Context::sync_async`) refuse with
    /// `PoolError::DeviceReported` when there are any, so that a result of refused work is
    /// never taken for a result. Natively, and for a device handed in with
    /// [`Gpu::from_device`] (whose handler is its owner's), the list stays empty.
    pub fn take_device_errors(&self) -> Vec<String> {
        std::mem::take(&mut *self.errors.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// [`Gpu::take_device_errors`] as one text, `None` when there are none.
    pub(crate) fn reported_errors(&self) -> Option<String> {
        let errors = self.take_device_errors();
        (!errors.is_empty()).then(|| errors.join("; "))
    }

    /// Whether the device was opened with [`wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX`]
    /// (asked for with [`GpuOptions::cooperative_matrix`], or present on a device handed in with
    /// [`Gpu::from_device`]).
    pub fn cooperative_matrix(&self) -> bool {
        self.device
            .features()
            .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
    }

    /// Whether f16 matmuls can run on cooperative matrices here: the device has
    /// [`Gpu::cooperative_matrix`] and f16 ([`wgpu::Features::SHADER_F16`]), and the adapter
    /// offers 16×16×16 products of f16 into f32 (on a device handed in with
    /// [`Gpu::from_device`], whose adapter is unknown, the feature is taken at its word). The
    /// matmul's choice also needs subgroups of 32 (see `src/compute/ops/matmul`).
    pub fn cooperative_matmul_f16(&self) -> bool {
        let featured = self.cooperative_matrix()
            && self.device.features().contains(wgpu::Features::SHADER_F16);
        featured
            && match &self.adapter {
                None => true,
                Some(adapter) => adapter.cooperative_matrix_properties().iter().any(|p| {
                    (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
                        && p.ab_type == wgpu::CooperativeScalarType::F16
                        && p.cr_type == wgpu::CooperativeScalarType::F32
                }),
            }
    }

    /// Every buffer the crate holds on this device now (through this `Gpu` and its clones: all
    /// its pools, their read-back staging, compute contexts, plans, timestamps), by role. Put it
    /// beside the device's own figure (wgpu's allocator report) to see what else holds memory.
    pub fn accounted(&self) -> AccountedBytes {
        self.ledger.snapshot()
    }

    /// The ledger the crate's buffers are counted in.
    pub(crate) fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// `create_buffer`, counted in the ledger under `role` until the buffer is dropped.
    pub(crate) fn create_accounted_buffer(
        &self,
        role: BufferRole,
        descriptor: &wgpu::BufferDescriptor<'_>,
    ) -> AccountedBuffer {
        let buffer = self.device.create_buffer(descriptor);
        self.ledger.add(role, buffer.size());
        AccountedBuffer {
            buffer,
            role,
            ledger: self.ledger.clone(),
        }
    }
}

/// The bytes and number of the buffers the crate holds on one device, per [`BufferRole`].
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    bytes: [AtomicU64; BufferRole::ALL.len()],
    buffers: [AtomicU64; BufferRole::ALL.len()],
}

impl Ledger {
    fn index(role: BufferRole) -> usize {
        BufferRole::ALL
            .iter()
            .position(|&r| r == role)
            .expect("every role is listed")
    }

    /// A buffer of `bytes` was created for `role`.
    pub(crate) fn add(&self, role: BufferRole, bytes: u64) {
        let index = Self::index(role);
        self.bytes[index].fetch_add(bytes, Ordering::Relaxed);
        self.buffers[index].fetch_add(1, Ordering::Relaxed);
    }

    /// A buffer of `bytes` of `role` was given back.
    pub(crate) fn sub(&self, role: BufferRole, bytes: u64) {
        self.release(role, 1, bytes);
    }

    /// `buffers` buffers of `role`, of `bytes` together, were given back.
    pub(crate) fn release(&self, role: BufferRole, buffers: u64, bytes: u64) {
        let index = Self::index(role);
        // Saturating: a miscount must not wrap into exabytes.
        let _ = self.bytes[index].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
            Some(held.saturating_sub(bytes))
        });
        let _ = self.buffers[index].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
            Some(held.saturating_sub(buffers))
        });
    }

    fn snapshot(&self) -> AccountedBytes {
        AccountedBytes {
            roles: BufferRole::ALL
                .iter()
                .enumerate()
                .map(|(index, &role)| RoleBytes {
                    role,
                    bytes: self.bytes[index].load(Ordering::Relaxed),
                    buffers: self.buffers[index].load(Ordering::Relaxed),
                })
                .collect(),
        }
    }
}

/// A buffer the crate created, counted in its device's ledger until dropped. Derefs to the
/// `wgpu::Buffer`.
#[derive(Debug)]
pub(crate) struct AccountedBuffer {
    buffer: wgpu::Buffer,
    role: BufferRole,
    ledger: Arc<Ledger>,
}

impl std::ops::Deref for AccountedBuffer {
    type Target = wgpu::Buffer;

    fn deref(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

impl Drop for AccountedBuffer {
    fn drop(&mut self) {
        self.ledger.sub(self.role, self.buffer.size());
    }
}

impl fmt::Display for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let info = &self.info;
        write!(
            f,
            "{} ({:?}, {:?}, driver {} {})",
            info.name, info.backend, info.device_type, info.driver, info.driver_info
        )
    }
}

/// The process's instance: backends from `WGPU_BACKEND` (all by default), made on the first call
/// and shared by every later one (and by [`request_gpu`]), so that a program asking for several
/// devices starts the backends once.
pub fn instance() -> wgpu::Instance {
    static SHARED: std::sync::OnceLock<wgpu::Instance> = std::sync::OnceLock::new();
    SHARED.get_or_init(fresh_instance).clone()
}

/// A new instance, not shared: backends from `WGPU_BACKEND`. On GL every device needs one: the
/// devices of one GL instance share one EGL context, and devices used from several threads at once
/// then fail to make it current (`eglMakeCurrent` `BadAccess`, seen on llvmpipe).
pub fn fresh_instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env())
}

/// Every adapter the instance finds, for reports. Blocks: see [`adapters_async`].
pub fn adapters(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    pollster::block_on(adapters_async(instance))
}

/// [`adapters`] as a future, for async code and browsers.
pub async fn adapters_async(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    let backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all());
    instance.enumerate_adapters(backends).await
}

/// The default adapter (or the one `WGPU_ADAPTER_NAME` names) with a device using `limits`, from
/// the shared [`instance`] (on GL from a [`fresh_instance`]). Blocks the thread: see
/// [`request_gpu_async`].
pub fn request_gpu(limits: LimitsChoice) -> Result<Gpu, DeviceError> {
    pollster::block_on(request_gpu_async(limits))
}

/// [`request_gpu`] as a future, for async code and browsers (where nothing may block).
pub async fn request_gpu_async(limits: LimitsChoice) -> Result<Gpu, DeviceError> {
    request_gpu_with_async(GpuOptions::default().with_limits(limits)).await
}

/// [`request_gpu`] with `options` (e.g. cooperative matrices, see [`GpuOptions`]). Blocks the
/// thread: see [`request_gpu_with_async`].
pub fn request_gpu_with(options: GpuOptions) -> Result<Gpu, DeviceError> {
    pollster::block_on(request_gpu_with_async(options))
}

/// [`request_gpu_with`] as a future, for async code and browsers.
pub async fn request_gpu_with_async(options: GpuOptions) -> Result<Gpu, DeviceError> {
    // GL alone (`WGPU_BACKEND=gl`): an instance per device, never the shared one (see
    // [`fresh_instance`]).
    let gl_only = wgpu::Backends::from_env() == Some(wgpu::Backends::GL);
    let adapter = if gl_only {
        pick_adapter(&fresh_instance()).await?
    } else {
        let adapter = pick_adapter(&instance()).await?;
        if adapter.get_info().backend == wgpu::Backend::Gl {
            drop(adapter);
            pick_adapter(&fresh_instance()).await?
        } else {
            adapter
        }
    };
    open_with_async(adapter, options).await
}

async fn pick_adapter(instance: &wgpu::Instance) -> Result<wgpu::Adapter, DeviceError> {
    if let Ok(wanted) = std::env::var("WGPU_ADAPTER_NAME") {
        let all = adapters_async(instance).await;
        let found: Vec<String> = all.iter().map(|a| a.get_info().name).collect();
        return all
            .into_iter()
            .find(|a| {
                a.get_info()
                    .name
                    .to_lowercase()
                    .contains(&wanted.to_lowercase())
            })
            .ok_or(DeviceError::AdapterNameNotFound { wanted, found });
    }
    let options = wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::from_env()
            .unwrap_or(wgpu::PowerPreference::HighPerformance),
        ..Default::default()
    };
    instance
        .request_adapter(&options)
        .await
        .map_err(|source| DeviceError::NoAdapter {
            backends: format!(
                "{:?}",
                wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all())
            ),
            env_backend: std::env::var("WGPU_BACKEND").unwrap_or_else(|_| "(unset)".into()),
            source,
        })
}

/// Opens a device on `adapter` with `limits` and whichever [`OPTIONAL_FEATURES`] it has. Blocks
/// the thread: see [`open_async`].
pub fn open(adapter: wgpu::Adapter, limits: LimitsChoice) -> Result<Gpu, DeviceError> {
    pollster::block_on(open_async(adapter, limits))
}

/// [`open`] as a future, for async code and browsers.
pub async fn open_async(adapter: wgpu::Adapter, limits: LimitsChoice) -> Result<Gpu, DeviceError> {
    open_with_async(adapter, GpuOptions::default().with_limits(limits)).await
}

/// [`open`] with `options` (e.g. cooperative matrices, see [`GpuOptions`]). Blocks the thread:
/// see [`open_with_async`].
pub fn open_with(adapter: wgpu::Adapter, options: GpuOptions) -> Result<Gpu, DeviceError> {
    pollster::block_on(open_with_async(adapter, options))
}

/// [`open_with`] as a future, for async code and browsers.
pub async fn open_with_async(
    adapter: wgpu::Adapter,
    options: GpuOptions,
) -> Result<Gpu, DeviceError> {
    let required_limits = match options.limits {
        LimitsChoice::Adapter => adapter.limits(),
        // The defaults, but never more than the adapter has (GL adapters can be below them).
        LimitsChoice::WebGpuDefault => {
            wgpu::Limits::default().or_worse_values_from(&adapter.limits())
        }
    };
    let mut required_features = adapter.features() & OPTIONAL_FEATURES;
    let cooperative = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
    let experimental_features =
        if options.cooperative_matrix && adapter.features().contains(cooperative) {
            required_features |= cooperative;
            // SAFETY: the user asked for cooperative matrices (`GpuOptions::cooperative_matrix`,
            // off by default, documented as this acknowledgement): they accept that wgpu's
            // experimental implementation of the feature may have bugs leading to undefined
            // behaviour, which is what `ExperimentalFeatures::enabled` asks its caller to accept.
            // Only `EXPERIMENTAL_COOPERATIVE_MATRIX` among the experimental features is requested,
            // and only the cooperative matmul (`shaders/matmul_coop.wgsl`) uses it.
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            if options.cooperative_matrix {
                log::warn!(
                    "wgpu-pool: cooperative matrices asked for, but {} offers none: the device is \
                 opened without them (f16 matmuls run on the portable kernels)",
                    adapter.get_info().name
                );
            }
            wgpu::ExperimentalFeatures::disabled()
        };
    let descriptor = wgpu::DeviceDescriptor {
        label: Some("wgpu-pool"),
        required_features,
        required_limits,
        experimental_features,
        ..Default::default()
    };
    let (device, queue) = adapter.request_device(&descriptor).await?;
    let info = adapter.get_info();
    log::info!(
        "wgpu-pool: using {} ({:?}, {:?}, driver {} {})",
        info.name,
        info.backend,
        info.device_type,
        info.driver,
        info.driver_info
    );
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    #[cfg(target_arch = "wasm32")]
    {
        // A browser cannot wait for error scopes: the device's unscoped errors are kept for the
        // async reads to report (see `Gpu::take_device_errors`).
        let kept = Arc::clone(&errors);
        device.on_uncaptured_error(Arc::new(move |error| {
            kept.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(error.to_string());
        }));
    }
    Ok(Gpu {
        adapter: Some(adapter),
        device,
        queue,
        info,
        ledger: Arc::default(),
        errors,
    })
}

/// [`read_mapped`] as a future that never blocks the thread: see [`read_mapped_with_async`].
pub(crate) async fn read_mapped_async(
    device: &wgpu::Device,
    buffer: &wgpu::Buffer,
    size: u64,
) -> Result<Vec<u8>, String> {
    read_mapped_with_async(device, buffer, size, <[u8]>::to_vec).await
}

/// [`read_mapped_with`] as a future that never blocks the thread: it waits for the map callback,
/// and where nothing else drives the device (native backends) it polls the device without
/// waiting each time it is polled, and asks to be polled again. In a browser the device drives
/// itself, and the future resolves when the browser's event loop has run the callback.
pub(crate) async fn read_mapped_with_async<R>(
    device: &wgpu::Device,
    buffer: &wgpu::Buffer,
    size: u64,
    read: impl FnOnce(&[u8]) -> R,
) -> Result<R, String> {
    let (sender, receiver) = futures_intrusive::channel::shared::oneshot_channel();
    buffer.map_async(wgpu::MapMode::Read, 0..size, move |result| {
        sender.send(result).ok();
    });
    let mapped = driven(device, receiver.receive()).await?;
    read_from_mapped(buffer, size, mapped, read)
}

/// A future that resolves when the GPU has finished the work submitted on `queue` so far,
/// without blocking the thread (native backends are polled as [`read_mapped_with_async`] polls
/// them). Errors: the device's, as text.
pub(crate) async fn submitted_work_done_async(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
) -> Result<(), String> {
    let (sender, receiver) = futures_intrusive::channel::shared::oneshot_channel();
    queue.on_submitted_work_done(move || {
        sender.send(()).ok();
    });
    match driven(device, receiver.receive()).await? {
        Some(()) => Ok(()),
        None => Err("the device dropped the work-done callback (was it lost?)".into()),
    }
}

/// Awaits `receive` (a callback's answer), polling `device` without waiting each time it is
/// polled where the backend needs that (native), so that the callback runs.
async fn driven<T>(
    device: &wgpu::Device,
    receive: impl std::future::Future<Output = T>,
) -> Result<T, String> {
    use std::task::Poll;

    let mut receive = std::pin::pin!(receive);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(result) = receive.as_mut().poll(cx) {
            return Poll::Ready(Ok(result));
        }
        if let Err(error) = device.poll(wgpu::PollType::Poll) {
            return Poll::Ready(Err(error.to_string()));
        }
        match receive.as_mut().poll(cx) {
            Poll::Ready(result) => Poll::Ready(Ok(result)),
            // Native: nothing else will wake this future, so it asks to be polled again. In a
            // browser the callback wakes it once the event loop has run it.
            Poll::Pending => {
                if cfg!(not(target_arch = "wasm32")) {
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
        }
    })
    .await
}

/// What a blocking wait answers in a browser, where the thread may not wait for the GPU (the
/// browser runs the GPU's callbacks only when control returns to its event loop).
pub(crate) const BLOCKING_IN_BROWSER: &str = "a browser cannot block on the GPU: use the `_async` \
     form of this call (Pool::read_async, Tensor::to_vec_async, Context::sync_async, \
     Plan::run_async, PlanRun::wait_async, Server::run_async, ...)";

/// How long a blocking read spins on `device.poll(Poll)` for its map callback before it blocks in
/// `device.poll(Wait)`. Blocking costs a sleep and a wake-up: on the H200 (Vulkan, driver 580),
/// one tiny dispatch read back took 65.6 µs blocking and 47.2 µs spinning (medians,
/// `bench_kernels --large --only overhead`, MEASUREMENTS.md); CUDA's default synchronisation
/// spins too. Past this bound the wait is long anyway and the thread sleeps.
pub const SPIN_BEFORE_BLOCKING: std::time::Duration = std::time::Duration::from_millis(2);

/// How long one blocking wait on GL may hold the device's one GL context (see
/// [`wait_for_submitted`]).
#[cfg(not(target_arch = "wasm32"))]
const GL_WAIT_SLICE: std::time::Duration = std::time::Duration::from_millis(5);

/// Blocks until the device has finished the work submitted so far. On GL, wgpu holds the
/// device's one GL context for the whole of a fence wait (up to 4.3 s at a time), and a thread
/// that cannot take the context within 6 s panics ("Could not lock adapter context"): a long
/// wait there, on a loaded machine, brought down other threads using the device. So on GL the
/// wait is made of slices of [`GL_WAIT_SLICE`], the context free between them; elsewhere it is
/// one wait.
pub(crate) fn wait_for_submitted(device: &wgpu::Device) -> Result<(), WaitError> {
    wait_for_submission(device, None)
}

/// [`wait_for_submitted`] for the submission `index` and those before it only (`None`: all).
pub(crate) fn wait_for_submission(
    device: &wgpu::Device,
    index: Option<wgpu::SubmissionIndex>,
) -> Result<(), WaitError> {
    #[cfg(target_arch = "wasm32")]
    {
        let _ = (device, index);
        Err(WaitError::Blocking)
    }
    #[cfg(not(target_arch = "wasm32"))]
    wait_natively(device, index).map_err(WaitError::Poll)
}

/// Why a blocking wait for the device failed.
#[derive(Debug)]
pub(crate) enum WaitError {
    /// The device's poll failed.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    Poll(wgpu::PollError),
    /// In a browser, where nothing may block.
    #[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
    Blocking,
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Poll(error) => error.fmt(f),
            Self::Blocking => f.write_str(BLOCKING_IN_BROWSER),
        }
    }
}

/// [`wait_for_submission`] on native backends.
#[cfg(not(target_arch = "wasm32"))]
fn wait_natively(
    device: &wgpu::Device,
    index: Option<wgpu::SubmissionIndex>,
) -> Result<(), wgpu::PollError> {
    if device.adapter_info().backend != wgpu::Backend::Gl {
        return device
            .poll(wgpu::PollType::Wait {
                submission_index: index,
                timeout: None,
            })
            .map(drop);
    }
    loop {
        let slice = wgpu::PollType::Wait {
            submission_index: index.clone(),
            timeout: Some(GL_WAIT_SLICE),
        };
        match device.poll(slice) {
            Err(wgpu::PollError::Timeout) => std::thread::yield_now(),
            done => return done.map(drop),
        }
    }
}

/// Maps the first `size` bytes of `buffer` (a `MAP_READ` buffer whose copy has been submitted),
/// waits for the device (spinning for up to [`SPIN_BEFORE_BLOCKING`], then blocking), copies the
/// bytes out and unmaps. Errors are wgpu's, as text, for the caller to wrap in its own error
/// type.
pub(crate) fn read_mapped(
    device: &wgpu::Device,
    buffer: &wgpu::Buffer,
    size: u64,
) -> Result<Vec<u8>, String> {
    read_mapped_with(device, buffer, size, <[u8]>::to_vec)
}

/// [`read_mapped`], handing the mapped bytes to `read` (which copies what it needs out of
/// them, into its own types: one copy rather than two) before unmapping.
pub(crate) fn read_mapped_with<R>(
    device: &wgpu::Device,
    buffer: &wgpu::Buffer,
    size: u64,
    read: impl FnOnce(&[u8]) -> R,
) -> Result<R, String> {
    read_mapped_after(device, buffer, size, None, read)
}

/// [`read_mapped_with`] for a buffer whose copy was in submission `index`: a blocking wait waits
/// for that submission only, not for those after it (`None`: for all).
pub(crate) fn read_mapped_after<R>(
    device: &wgpu::Device,
    buffer: &wgpu::Buffer,
    size: u64,
    index: Option<wgpu::SubmissionIndex>,
    read: impl FnOnce(&[u8]) -> R,
) -> Result<R, String> {
    #[cfg(target_arch = "wasm32")]
    {
        let _ = (device, buffer, size, index, read);
        Err(BLOCKING_IN_BROWSER.into())
    }
    #[cfg(not(target_arch = "wasm32"))]
    read_mapped_natively(device, buffer, size, index, read)
}

/// [`read_mapped_after`] on native backends.
#[cfg(not(target_arch = "wasm32"))]
fn read_mapped_natively<R>(
    device: &wgpu::Device,
    buffer: &wgpu::Buffer,
    size: u64,
    index: Option<wgpu::SubmissionIndex>,
    read: impl FnOnce(&[u8]) -> R,
) -> Result<R, String> {
    let (sender, receiver) = std::sync::mpsc::channel();
    buffer.map_async(wgpu::MapMode::Read, 0..size, move |result| {
        sender.send(result).ok();
    });
    let started = web_time::Instant::now();
    let mapped = loop {
        if let Ok(result) = receiver.try_recv() {
            break Some(result);
        }
        if started.elapsed() > SPIN_BEFORE_BLOCKING {
            wait_natively(device, index).map_err(|e| e.to_string())?;
            // The submission is done, so the callback has run, is running on another thread
            // whose poll took it (a device shared between threads), or was dropped: wait for
            // it rather than try once.
            break receiver.recv().ok();
        }
        device
            .poll(wgpu::PollType::Poll)
            .map_err(|e| e.to_string())?;
    };
    read_from_mapped(buffer, size, mapped, read)
}

/// Hands the first `size` bytes of `buffer` to `read` once its map callback said `mapped`, and
/// unmaps.
fn read_from_mapped<R>(
    buffer: &wgpu::Buffer,
    size: u64,
    mapped: Option<Result<(), wgpu::BufferAsyncError>>,
    read: impl FnOnce(&[u8]) -> R,
) -> Result<R, String> {
    match mapped {
        Some(Ok(())) => {}
        Some(Err(error)) => return Err(error.to_string()),
        None => return Err("the map callback was dropped".into()),
    }
    let result = read(
        &buffer
            .get_mapped_range(0..size)
            .map_err(|e| e.to_string())?,
    );
    buffer.unmap();
    Ok(result)
}

/// The error an error scope caught, if any. Native: waits for the scope's answer. In a browser
/// nothing may wait: the scope is popped without waiting for its answer, and the error (if any)
/// is left to the device's uncaptured-error handler.
pub(crate) fn caught(scope: wgpu::ErrorScopeGuard) -> Option<wgpu::Error> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        pollster::block_on(scope.pop())
    }
    #[cfg(target_arch = "wasm32")]
    {
        drop(scope.pop());
        None
    }
}
