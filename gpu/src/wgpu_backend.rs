//! The wgpu backend: WGSL compute shaders over Vulkan (or GL), tested on
//! Mesa's software Vulkan (lavapipe).
//!
//! The streams a request needs are uploaded as stored: for consecutive
//! pixels one span of the chunk's payload with its u32 offsets and selector
//! bytes, for a sparse set of pixels (a mask alone) those streams gathered
//! on the host. `decode.wgsl` decodes one stream per invocation into a
//! scratch buffer of at most 32 MiB that is reused pass after pass, and
//! `reduce.wgsl` reduces it there; the whole cube is never expanded on the
//! device. Integer products are exact (u64 as u32 pairs); float products
//! follow the CPU's summation rule ([`qemfs::reduce::Neumaier`]) step for
//! step, in an order that differs from the CPU's, so they agree with the
//! CPU reference within the tolerance documented in the crate root.

use std::ops::Range;
use std::sync::{mpsc, Arc, Mutex};

use qemfs::qem::{rans, tables, QemFile, RawBlockStreams};
use qemfs::reduce::{Accelerator, Partial, ReduceError, Request};
use wgpu::util::DeviceExt;

use crate::plan::{
    self, Call, DecodeParams, Gathered, PassUpload, Plan, ReduceParams, FAULT_RECORD_WORDS,
    MAX_FAULTS,
};
use crate::{BlockDecoder, BlockValues};

const NAME: &str = "wgpu";
const WORKGROUP: u32 = 64;

fn backend(reason: impl std::fmt::Display) -> ReduceError {
    ReduceError::Backend {
        backend: NAME,
        reason: reason.to_string(),
    }
}

/// Why [`Wgpu::new`] gave no backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenError {
    /// No adapter fit (none at all, or none with compute shaders, or only
    /// software ones when they were not admitted).
    NoAdapter(String),
    /// An adapter exists but could not be used (device creation or the
    /// shaders failed): a bug or a broken driver, never to be ignored.
    Failed(String),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::NoAdapter(why) | OpenError::Failed(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for OpenError {}

/// Reductions on a wgpu adapter.
pub struct Wgpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    decode: wgpu::ComputePipeline,
    segments: wgpu::ComputePipeline,
    combine: wgpu::ComputePipeline,
    pattern: wgpu::ComputePipeline,
    /// The 64 rANS slot tables (see `qemfs::qem::rans::slot_table`).
    slots: wgpu::Buffer,
    /// Errors wgpu reports outside any call's control (validation, out of
    /// memory, device loss), drained after every readback.
    errors: Arc<Mutex<Vec<String>>>,
    /// One reduction at a time per device.
    busy: Mutex<()>,
}

impl std::fmt::Debug for Wgpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wgpu")
            .field("adapter", &self.info.name)
            .field("backend", &self.info.backend)
            .finish_non_exhaustive()
    }
}

fn rank(info: &wgpu::AdapterInfo) -> (u8, u8) {
    let kind = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let api = u8::from(info.backend != wgpu::Backend::Vulkan);
    (kind, api)
}

/// Vulkan drivers probe the Wayland window system while they load, and
/// libwayland prints `error: XDG_RUNTIME_DIR is invalid or not set` to
/// stderr when that variable is missing (daemons, CI, ssh sessions): noise
/// that reads like our own error lines. A private, empty 0700 directory
/// lets the probe fail silently. Set only when unset, before any adapter
/// is opened (start-up, while the process is single-threaded).
fn quiet_window_system_probe() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_some() {
        return;
    }
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    // One per user, reused: /proc/self belongs to the process's user.
    let Ok(uid) = std::fs::metadata("/proc/self").map(|m| m.uid()) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("qemfs-runtime-{uid}"));
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    let ours = std::fs::symlink_metadata(&dir)
        .is_ok_and(|m| m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0);
    if ours {
        std::env::set_var("XDG_RUNTIME_DIR", &dir);
    }
}

impl Wgpu {
    /// Opens the best adapter (discrete, integrated, virtual GPU, then
    /// software; Vulkan before GL). `allow_software` admits CPU adapters
    /// such as lavapipe, which tests use but `auto` selection should not.
    /// `WGPU_BACKEND` (e.g. `vulkan`, `gl`) restricts the APIs tried.
    ///
    /// Without `allow_software` only Vulkan is tried: probing GL costs a
    /// tenth of a second per start (noticeable in `qem show`), and the GL
    /// adapters of machines without a Vulkan driver are rarely worth it.
    pub fn new(allow_software: bool) -> Result<Wgpu, OpenError> {
        quiet_window_system_probe();
        let backends = wgpu::Backends::from_env().unwrap_or(if allow_software {
            wgpu::Backends::VULKAN | wgpu::Backends::GL
        } else {
            wgpu::Backends::VULKAN
        });
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = backends;
        let instance = wgpu::Instance::new(desc);
        let mut adapters = pollster::block_on(instance.enumerate_adapters(backends));
        adapters.retain(|a| {
            let info = a.get_info();
            let limits = a.limits();
            let down = a.get_downlevel_capabilities();
            (allow_software || info.device_type != wgpu::DeviceType::Cpu)
                && down.flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS)
                && limits.max_storage_buffers_per_shader_stage >= 8
                && limits.max_storage_buffer_binding_size >= 128 << 20
        });
        adapters.sort_by_key(|a| rank(&a.get_info()));
        let adapter = adapters.into_iter().next().ok_or_else(|| {
            OpenError::NoAdapter(if allow_software {
                "no wgpu adapter with compute shaders".to_string()
            } else {
                "no hardware wgpu adapter with compute shaders".to_string()
            })
        })?;
        let info = adapter.get_info();
        let limits = wgpu::Limits {
            max_storage_buffers_per_shader_stage: 8,
            max_storage_buffer_binding_size: 128 << 20,
            max_buffer_size: 256 << 20,
            ..wgpu::Limits::downlevel_defaults()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("qemfs-gpu"),
            required_features: wgpu::Features::empty(),
            required_limits: limits,
            ..Default::default()
        }))
        .map_err(|e| OpenError::Failed(format!("{} ({:?}): {e}", info.name, info.backend)))?;
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = |label, src: &str| {
            device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(label),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            })
        };
        let decode_mod = module("decode.wgsl", include_str!("../shaders/decode.wgsl"));
        let reduce_mod = module("reduce.wgsl", include_str!("../shaders/reduce.wgsl"));
        let pipeline = |module: &wgpu::ShaderModule, entry: &str| {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: None,
                module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            })
        };
        let decode = pipeline(&decode_mod, "decode");
        let segments = pipeline(&reduce_mod, "segments");
        let combine = pipeline(&reduce_mod, "combine");
        let pattern = pipeline(&reduce_mod, "pattern");
        let mut slot_words = Vec::with_capacity(tables::TABLES * 1024);
        for k in 0..tables::TABLES {
            slot_words.extend_from_slice(rans::slot_table(k));
        }
        let slots = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("rANS slot tables"),
            contents: bytemuck::cast_slice(&slot_words),
            usage: wgpu::BufferUsages::STORAGE,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(OpenError::Failed(format!(
                "{}: shaders rejected: {e}",
                info.name
            )));
        }
        Ok(Wgpu {
            device,
            queue,
            info,
            decode,
            segments,
            combine,
            pattern,
            slots,
            errors,
            busy: Mutex::new(()),
        })
    }

    /// The adapter in words: name, API and kind.
    pub fn describe(&self) -> String {
        format!(
            "{} ({:?}, {:?}, driver {} {})",
            self.info.name,
            self.info.backend,
            self.info.device_type,
            self.info.driver,
            self.info.driver_info
        )
    }

    /// True for a CPU (software) adapter such as lavapipe.
    pub fn is_software(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    fn take_errors(&self) -> Result<(), ReduceError> {
        let mut v = self
            .errors
            .lock()
            .map_err(|_| backend("error sink poisoned"))?;
        if v.is_empty() {
            return Ok(());
        }
        let all = v.join("; ");
        v.clear();
        Err(backend(all))
    }

    fn buffer(&self, label: &str, bytes: u64, usage: wgpu::BufferUsages) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.max(16).next_multiple_of(4),
            usage,
            mapped_at_creation: false,
        })
    }

    fn storage(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        use wgpu::BufferUsages as U;
        self.buffer(label, bytes, U::STORAGE | U::COPY_DST | U::COPY_SRC)
    }

    fn readback(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        use wgpu::BufferUsages as U;
        self.buffer(label, bytes, U::MAP_READ | U::COPY_DST)
    }

    /// Maps `buffer` (a readback buffer), waits, and returns its first
    /// `bytes` bytes as u32 words.
    fn read_words(&self, buffer: &wgpu::Buffer, bytes: u64) -> Result<Vec<u32>, ReduceError> {
        let bytes = bytes.max(4).next_multiple_of(4);
        let (tx, rx) = mpsc::channel();
        buffer.map_async(wgpu::MapMode::Read, 0..bytes, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(backend)?;
        rx.recv()
            .map_err(|_| backend("map callback dropped"))?
            .map_err(backend)?;
        let words = {
            let view = buffer.get_mapped_range(0..bytes).map_err(backend)?;
            bytemuck::cast_slice::<u8, u32>(&view).to_vec()
        };
        buffer.unmap();
        self.take_errors()?;
        Ok(words)
    }

    fn bind(
        &self,
        pipeline: &wgpu::ComputePipeline,
        entries: &[(u32, &wgpu::Buffer)],
    ) -> wgpu::BindGroup {
        let entries: Vec<wgpu::BindGroupEntry> = entries
            .iter()
            .map(|&(binding, buffer)| wgpu::BindGroupEntry {
                binding,
                resource: buffer.as_entire_binding(),
            })
            .collect();
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        })
    }

    fn decode_one(&self, file: &QemFile, block: usize) -> Result<BlockValues, ReduceError> {
        let _busy = self.busy.lock().map_err(|_| backend("lock poisoned"))?;
        let call = Call::decode_only(file, block)?;
        let raw = file.raw_block_streams(block)?;
        let m = raw.frames;
        let p_count = file.pixels();
        let lanes = call.source.lanes();
        let decoder = Decoder::new(self, &call)?;
        let read = self.readback("decoded", (call.max_values * 4) as u64);
        let mut values = vec![0u32; m * p_count];
        let plan = &call.plans[&m];
        for (q, pass) in plan.passes.iter().enumerate() {
            let mut enc = self.device.create_command_encoder(&Default::default());
            decoder.encode(self, &mut enc, &call, &raw, plan, q)?;
            let bytes = (pass.pixels.len() * lanes * m * 4) as u64;
            enc.copy_buffer_to_buffer(&decoder.scratch, 0, &read, 0, bytes);
            self.queue.submit([enc.finish()]);
            let words = self.read_words(&read, bytes)?;
            decoder.check_faults(self, file, &call)?;
            let pixels = &plan.pixels[pass.pixels.clone()];
            plan::scatter_frames(&words, pixels, m, lanes, p_count, &mut values);
        }
        Ok(BlockValues::from_words(values, lanes))
    }

    /// Runs a planned call: decodes its blocks' needed streams pass by
    /// pass and reduces them as `request` asks.
    fn run(&self, file: &QemFile, call: &Call, request: &Request) -> Result<Partial, ReduceError> {
        let n_prod = call.products.count();
        let p_count = file.pixels();
        let decoder = Decoder::new(self, call)?;
        let lists = self.storage("lists", (call.lists.len() * 4) as u64);
        self.queue
            .write_buffer(&lists, 0, bytemuck::cast_slice(&call.lists));
        let descs = self.storage("descs", (call.descs.len() * 4) as u64);
        self.queue
            .write_buffer(&descs, 0, bytemuck::cast_slice(&call.descs));
        let needed = &call.products.needed;
        let pass_pixels = self.storage("pass pixels", (needed.len() * 4) as u64);
        self.queue
            .write_buffer(&pass_pixels, 0, bytemuck::cast_slice(needed));
        let partials = self.storage("partials", call.partial_bytes);
        let acc = self.storage("accumulators", call.acc_bytes());
        let acc_read = self.readback("accumulators read", call.acc_bytes());
        let background = self.storage(
            "background",
            request.background.as_ref().map_or(4, |b| b.len() * 4) as u64,
        );
        if let Some(bg) = &request.background {
            self.queue
                .write_buffer(&background, 0, bytemuck::cast_slice(bg));
        }
        let (sum_bytes, max_bytes) = if request.pattern {
            (call.pattern_sum_bytes(p_count), p_count as u64 * 8)
        } else {
            (16, 8)
        };
        let pattern_sum = self.storage("pattern sum", sum_bytes);
        let pattern_max = self.storage("pattern max", max_bytes);
        if request.pattern {
            let init = plan::pattern_max_init(call, p_count);
            self.queue
                .write_buffer(&pattern_max, 0, bytemuck::cast_slice(&init));
        }
        let rparams = self.buffer(
            "reduce params",
            std::mem::size_of::<ReduceParams>() as u64,
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        );
        let seg_group = self.bind(
            &self.segments,
            &[
                (0, &rparams),
                (1, &decoder.scratch),
                (2, &lists),
                (3, &descs),
                (4, &partials),
                (6, &background),
                (9, &pass_pixels),
            ],
        );
        let combine_group = self.bind(&self.combine, &[(0, &rparams), (4, &partials), (5, &acc)]);
        let pattern_group = self.bind(
            &self.pattern,
            &[
                (0, &rparams),
                (1, &decoder.scratch),
                (6, &background),
                (7, &pattern_sum),
                (8, &pattern_max),
                (9, &pass_pixels),
            ],
        );

        let mut gathered = Gathered::new(call);
        for batch in &call.batches {
            let batch_frames: usize = file.blocks()[batch.clone()].iter().map(|b| b.frames).sum();
            let mut enc = self.device.create_command_encoder(&Default::default());
            enc.clear_buffer(&acc, 0, None);
            self.queue.submit([enc.finish()]);
            let mut frame0 = 0usize;
            for b in batch.clone() {
                let raw = file.raw_block_streams(b)?;
                let m = raw.frames;
                let plan = &call.plans[&m];
                for q in 0..plan.passes.len() {
                    let mut enc = self.device.create_command_encoder(&Default::default());
                    decoder.encode(self, &mut enc, call, &raw, plan, q)?;
                    let params = call.reduce_params(
                        m,
                        q,
                        frame0,
                        batch_frames,
                        request.background.is_some(),
                    );
                    self.queue
                        .write_buffer(&rparams, 0, bytemuck::bytes_of(&params));
                    {
                        let mut cp = enc.begin_compute_pass(&Default::default());
                        let mx = (m as u32).div_ceil(WORKGROUP);
                        if n_prod > 0 {
                            cp.set_pipeline(&self.segments);
                            cp.set_bind_group(0, &seg_group, &[]);
                            cp.dispatch_workgroups(mx, params.segments, n_prod as u32);
                            cp.set_pipeline(&self.combine);
                            cp.set_bind_group(0, &combine_group, &[]);
                            cp.dispatch_workgroups(mx, n_prod as u32, 1);
                        }
                        if request.pattern {
                            cp.set_pipeline(&self.pattern);
                            cp.set_bind_group(0, &pattern_group, &[]);
                            cp.dispatch_workgroups(params.width.div_ceil(WORKGROUP), 1, 1);
                        }
                    }
                    self.queue.submit([enc.finish()]);
                }
                frame0 += m;
            }
            // Faults first: values of a batch with a faulty stream are never used.
            decoder.check_faults(self, file, call)?;
            if n_prod > 0 {
                let bytes = (n_prod * batch_frames * 4 * plan::ACC_WORDS) as u64;
                let mut enc = self.device.create_command_encoder(&Default::default());
                enc.copy_buffer_to_buffer(&acc, 0, &acc_read, 0, bytes);
                self.queue.submit([enc.finish()]);
                gathered.push_batch(&self.read_words(&acc_read, bytes)?, batch_frames);
            }
        }
        let pattern = if request.pattern {
            let mut enc = self.device.create_command_encoder(&Default::default());
            let read_sum = self.readback("pattern sum read", sum_bytes);
            let read_max = self.readback("pattern max read", max_bytes);
            enc.copy_buffer_to_buffer(&pattern_sum, 0, &read_sum, 0, sum_bytes);
            enc.copy_buffer_to_buffer(&pattern_max, 0, &read_max, 0, max_bytes);
            self.queue.submit([enc.finish()]);
            Some((
                self.read_words(&read_sum, sum_bytes)?,
                self.read_words(&read_max, max_bytes)?,
            ))
        } else {
            None
        };
        self.take_errors()?;
        Ok(gathered.finish(file, call, pattern))
    }
}

/// The decoding half of a call: upload buffers sized for the widest pass
/// of the call's plans, the scratch buffer and the fault records.
struct Decoder {
    params: wgpu::Buffer,
    payload: wgpu::Buffer,
    offsets: wgpu::Buffer,
    selectors: wgpu::Buffer,
    scratch: wgpu::Buffer,
    faults: wgpu::Buffer,
    faults_read: wgpu::Buffer,
    group: wgpu::BindGroup,
}

const FAULT_BYTES: u64 = 4 * (1 + (FAULT_RECORD_WORDS * MAX_FAULTS) as u64);

impl Decoder {
    fn new(gpu: &Wgpu, call: &Call) -> Result<Decoder, ReduceError> {
        let params = gpu.buffer(
            "decode params",
            std::mem::size_of::<DecodeParams>() as u64,
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        );
        let payload = gpu.storage("payload", call.max_payload as u64);
        let offsets = gpu.storage("offsets", (4 * (call.max_streams + 1)) as u64);
        let selectors = gpu.storage("selectors", call.max_streams.next_multiple_of(4) as u64);
        let scratch = gpu.storage("scratch", (call.max_values * 4) as u64);
        let faults = gpu.storage("faults", FAULT_BYTES);
        let faults_read = gpu.readback("faults read", FAULT_BYTES);
        let group = gpu.bind(
            &gpu.decode,
            &[
                (0, &params),
                (1, &payload),
                (2, &offsets),
                (3, &selectors),
                (4, &gpu.slots),
                (5, &scratch),
                (6, &faults),
            ],
        );
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        enc.clear_buffer(&faults, 0, None);
        gpu.queue.submit([enc.finish()]);
        gpu.take_errors()?;
        Ok(Decoder {
            params,
            payload,
            offsets,
            selectors,
            scratch,
            faults,
            faults_read,
            group,
        })
    }

    /// Uploads the streams of pass `q` of `plan` in block `raw` and records
    /// their decoding into `enc` (the uploads take effect at its submission).
    fn encode(
        &self,
        gpu: &Wgpu,
        enc: &mut wgpu::CommandEncoder,
        call: &Call,
        raw: &RawBlockStreams<'_>,
        plan: &Plan,
        q: usize,
    ) -> Result<(), ReduceError> {
        let up = PassUpload::new(call.source, raw, plan, q)?;
        let payload: &[u8] = &up.payload;
        let whole = payload.len() & !3;
        if whole > 0 {
            gpu.queue.write_buffer(&self.payload, 0, &payload[..whole]);
        }
        if whole < payload.len() {
            let mut tail = [0u8; 4];
            tail[..payload.len() - whole].copy_from_slice(&payload[whole..]);
            gpu.queue.write_buffer(&self.payload, whole as u64, &tail);
        }
        gpu.queue
            .write_buffer(&self.offsets, 0, bytemuck::cast_slice(&up.offsets));
        gpu.queue.write_buffer(&self.selectors, 0, &up.selectors);
        gpu.queue
            .write_buffer(&self.params, 0, bytemuck::bytes_of(&up.params));
        let mut cp = enc.begin_compute_pass(&Default::default());
        cp.set_pipeline(&gpu.decode);
        cp.set_bind_group(0, &self.group, &[]);
        cp.dispatch_workgroups(up.params.streams.div_ceil(WORKGROUP), 1, 1);
        Ok(())
    }

    /// Reads the fault records and turns the first into the CPU's error.
    fn check_faults(&self, gpu: &Wgpu, file: &QemFile, call: &Call) -> Result<(), ReduceError> {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&self.faults, 0, &self.faults_read, 0, FAULT_BYTES);
        gpu.queue.submit([enc.finish()]);
        let words = gpu.read_words(&self.faults_read, FAULT_BYTES)?;
        plan::check_faults(file, call, &words)
    }
}

impl BlockDecoder for Wgpu {
    fn decode_block(&self, file: &QemFile, block: usize) -> Result<BlockValues, ReduceError> {
        self.decode_one(file, block)
    }

    fn decode_blocks(&self, file: &QemFile, blocks: Range<usize>) -> Result<(), ReduceError> {
        let _busy = self.busy.lock().map_err(|_| backend("lock poisoned"))?;
        let call = Call::decode_all(file, blocks)?;
        self.run(file, &call, &Request::default()).map(|_| ())
    }
}

impl Accelerator for Wgpu {
    fn name(&self) -> &str {
        NAME
    }

    fn reduce(
        &self,
        file: &QemFile,
        blocks: Range<usize>,
        request: &Request,
    ) -> Result<Partial, ReduceError> {
        let _busy = self.busy.lock().map_err(|_| backend("lock poisoned"))?;
        self.run(file, &Call::new(file, blocks, request)?, request)
    }
}
