//! Host-side planning shared by the GPU backends: how a block's streams are
//! split into passes that fit the bounded scratch buffer, which pixels each
//! product reads in each pass, and how the device's fault records become the
//! same [`QemError`] the CPU decoder reports.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;

use bytemuck::{Pod, Zeroable};
use qemfs::qem::{
    stream, Codec, Dtype, QemError, QemFile, RawBlockStreams, StreamFault, StreamSite,
};
use qemfs::reduce::{Moments, Neumaier, Partial, Pattern, ReduceError, Request, Values};

/// Decoded values held on the device at once: 8 Mi u32 = 32 MiB.
pub const SCRATCH_VALUES: usize = 8 << 20;
/// Streams per pass (one invocation each; 65535 workgroups of 64).
pub const MAX_PASS_STREAMS: usize = 65535 * 64;
/// Payload bytes uploaded per pass, at most.
pub const PAYLOAD_LIMIT: usize = 64 << 20;
/// Largest detector the pattern accumulators hold (`ACC_WORDS` = 4 u32 per
/// pixel in one 128 MiB binding).
pub const MAX_PIXELS: usize = 8 << 20;
/// u32 words of one accumulator in the kernels: (lo, hi, -, -) for exact
/// sums, a [`Neumaier`] state for floats.
pub const ACC_WORDS: usize = 4;
/// Bytes of per-frame accumulators per batch of blocks.
pub const ACC_LIMIT: usize = 32 << 20;
/// Bytes of segment partials per pass.
pub const PARTIAL_LIMIT: usize = 32 << 20;
/// Fault records the decode shader keeps.
pub const MAX_FAULTS: usize = 64;

/// How a product's list is summed (`segments` in the kernels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weight {
    /// A plain sum: a mask.
    One = 0,
    /// Total, row and column moments at once, into this product and the
    /// next two (whose lists are empty).
    Moments = 1,
    /// Filled by the preceding [`Weight::Moments`] product.
    WithMoments = 2,
}

/// What a file's stored values are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// u16 counts or scaled codes, summed exactly.
    Exact { u8_limit: bool },
    /// float32 from two u16 lanes, summed by the [`Neumaier`] rule.
    Float,
}

impl Source {
    pub fn of(file: &QemFile) -> Source {
        match file.codec() {
            Codec::Float => Source::Float,
            Codec::Integer | Codec::Scaled => Source::Exact {
                u8_limit: file.stored_dtype() == Dtype::U8,
            },
        }
    }

    /// Streams per pixel.
    pub fn lanes(self) -> usize {
        match self {
            Source::Float => 2,
            Source::Exact { .. } => 1,
        }
    }
}

/// One pass: pixels whose streams are decoded together.
#[derive(Debug, Clone)]
pub struct Pass {
    /// The pass's pixels, ascending: `Plan::pixels[pixels]`. Scratch slot
    /// `jl` holds pixel `Plan::pixels[pixels.start + jl]`.
    pub pixels: Range<usize>,
    /// True when the pixels are consecutive detector pixels (their streams
    /// are one span of the payload).
    pub contiguous: bool,
    /// Per product: (start in `Plan::lists`, count, mode); list entries
    /// are scratch slots.
    pub descs: Vec<[u32; 3]>,
}

/// The passes of blocks with `m` frames, and the slot lists of every
/// product in every pass.
#[derive(Debug, Clone)]
pub struct Plan {
    pub m: usize,
    /// The decoded pixels, ascending, pass after pass.
    pub pixels: Vec<u32>,
    pub passes: Vec<Pass>,
    pub lists: Vec<u32>,
    /// Pixels in the widest pass.
    pub max_width: usize,
    /// Longest list of any product in any pass.
    pub max_count: usize,
}

/// The pixel lists of a request, independent of passes: per product the
/// sorted valid pixels it sums, and its weight.
#[derive(Debug, Clone)]
pub struct Products {
    pub lists: Vec<(Vec<u32>, Weight)>,
    pub masks: usize,
    pub moments: bool,
    /// The pixels to decode, ascending: every valid pixel for moments or a
    /// pattern, else the valid pixels of the masks (as the CPU reference).
    pub needed: Vec<u32>,
}

impl Products {
    /// Masks first (in request order), then total, row and column moments.
    pub fn new(file: &QemFile, request: &Request) -> Result<Products, ReduceError> {
        let p_count = file.pixels();
        let valid = |p: u32| file.valid_mask().is_none_or(|v| v.is_valid(p as usize));
        let mut lists = Vec::new();
        for (k, set) in request.masks.iter().enumerate() {
            if let Some(&p) = set.pixels().iter().find(|&&p| p as usize >= p_count) {
                return Err(ReduceError::Unsupported(format!(
                    "mask {k} selects pixel {p}, but the detector has {p_count} pixels"
                )));
            }
            let list: Vec<u32> = set.pixels().iter().copied().filter(|&p| valid(p)).collect();
            lists.push((list, Weight::One));
        }
        let all: Vec<u32> = (0..p_count as u32).filter(|&p| valid(p)).collect();
        let needed = if request.moments || request.pattern {
            all.clone()
        } else {
            let mut union: Vec<u32> = lists.iter().flat_map(|(l, _)| l.iter().copied()).collect();
            union.sort_unstable();
            union.dedup();
            union
        };
        if request.moments {
            lists.push((all, Weight::Moments));
            lists.push((Vec::new(), Weight::WithMoments));
            lists.push((Vec::new(), Weight::WithMoments));
        }
        Ok(Products {
            lists,
            masks: request.masks.len(),
            moments: request.moments,
            needed,
        })
    }

    /// No products; every pixel decoded (parity checks, benchmarks).
    pub fn decode_all(file: &QemFile) -> Products {
        Products {
            lists: Vec::new(),
            masks: 0,
            moments: false,
            needed: (0..file.pixels() as u32).collect(),
        }
    }

    pub fn count(&self) -> usize {
        self.lists.len()
    }
}

impl Plan {
    /// Splits the needed pixels into passes for blocks of `m` frames: each
    /// pass's decoded values fit the scratch buffer and its valid payload
    /// (at most `4m + 4` bytes per stream, see [`longest_valid_stream`])
    /// fits [`PAYLOAD_LIMIT`].
    pub fn new(source: Source, m: usize, products: &Products) -> Plan {
        let lanes = source.lanes();
        let pixels = products.needed.clone();
        let width = (SCRATCH_VALUES / (lanes * m))
            .min(MAX_PASS_STREAMS / lanes)
            .min(PAYLOAD_LIMIT / (lanes * longest_valid_stream(m)))
            .max(1);
        let mut passes = Vec::new();
        let mut lists = Vec::new();
        let mut max_count = 0;
        let mut a = 0;
        while a < pixels.len() {
            let b = (a + width).min(pixels.len());
            let run = &pixels[a..b];
            let contiguous = run[run.len() - 1] - run[0] == (run.len() - 1) as u32;
            let mut descs = Vec::with_capacity(products.count());
            for (list, weight) in &products.lists {
                let start = lists.len();
                // Lists are subsets of `needed`: map each pixel to its slot.
                let lo = list.partition_point(|&p| p < run[0]);
                let hi = list.partition_point(|&p| p <= run[run.len() - 1]);
                let mut slot = 0;
                for &p in &list[lo..hi] {
                    while run[slot] < p {
                        slot += 1;
                    }
                    lists.push(slot as u32);
                }
                let count = lists.len() - start;
                descs.push([start as u32, count as u32, *weight as u32]);
                max_count = max_count.max(count);
            }
            passes.push(Pass {
                pixels: a..b,
                contiguous,
                descs,
            });
            a = b;
        }
        Plan {
            m,
            max_width: width.min(pixels.len()),
            pixels,
            passes,
            lists,
            max_count,
        }
    }

    /// List entries per segment: at least 64, more when the partials of
    /// `products` would exceed [`PARTIAL_LIMIT`].
    pub fn seg_len(&self, products: usize) -> usize {
        let per_entry = 4 * ACC_WORDS * products * self.m;
        let most_segments = (PARTIAL_LIMIT / per_entry.max(1)).max(1);
        self.max_count.div_ceil(most_segments).max(64)
    }
}

/// The longest stream of `m` values that can decode without a fault: each
/// step reads at most 2 renormalisation bytes and an escaped u16, after the
/// 4-byte initial state (literal streams are `2m`).
pub fn longest_valid_stream(m: usize) -> usize {
    4 * m + 4
}

/// Refuses a stream longer than any valid one before upload (it cannot
/// decode; the CPU decoder names its fault). This keeps uploads bounded
/// without trusting lengths.
fn check_stream_length(
    raw: &RawBlockStreams<'_>,
    stream: usize,
    bytes: &[u8],
) -> Result<(), ReduceError> {
    let m = raw.frames;
    if bytes.len() <= longest_valid_stream(m) {
        return Ok(());
    }
    let mut out = vec![0u16; m];
    let fault = match stream::decode(raw.selectors[stream], bytes, &mut out) {
        Err(f) => f,
        // Unreachable for a stream this long; report it as unread.
        Ok(()) => StreamFault::FinalState {
            state: 0,
            unread: bytes.len() - longest_valid_stream(m),
        },
    };
    Err(ReduceError::Decode(QemError::Stream {
        site: StreamSite {
            chunk: raw.block.chunk,
            stream: raw.first_stream + stream,
        },
        fault,
    }))
}

/// Fault codes written by the decode shader.
pub mod fault_code {
    pub const SELECTOR: u32 = 1;
    pub const LENGTH: u32 = 2;
    pub const INITIAL_STATE: u32 = 3;
    pub const TRUNCATED: u32 = 4;
    pub const TRUNCATED_ESCAPE: u32 = 5;
    pub const FINAL_STATE: u32 = 6;
    pub const SPARSE_POSITION: u32 = 7;
    pub const VALUE_RANGE: u32 = 8;
}

/// One fault record of the decode shader: global block, block-relative
/// stream, code and two details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultRecord {
    pub block: u32,
    pub stream: u32,
    pub code: u32,
    pub a: u32,
    pub b: u32,
}

/// Words per fault record: block, pass, stream in pass, code, a, b.
pub const FAULT_RECORD_WORDS: usize = 6;

/// Turns the device's fault buffer (count, then records) into the error of
/// the first faulty stream (lowest block, then stream), as the CPU decoder
/// would name it. `Ok` when no stream failed.
pub fn check_faults(file: &QemFile, call: &Call, words: &[u32]) -> Result<(), ReduceError> {
    let count = words[0] as usize;
    if count == 0 {
        return Ok(());
    }
    let lanes = call.source.lanes();
    let mut records = Vec::new();
    for r in words[1..]
        .chunks_exact(FAULT_RECORD_WORDS)
        .take(count.min(MAX_FAULTS))
    {
        let (block, q, j) = (r[0] as usize, r[1] as usize, r[2] as usize);
        let pass = file
            .blocks()
            .get(block)
            .and_then(|info| call.plans.get(&info.frames))
            .and_then(|plan| Some((plan, plan.passes.get(q)?)));
        let Some((plan, pass)) = pass else {
            return Err(backend_error(&format!(
                "fault record names block {block} pass {q}"
            )));
        };
        let Some(&pixel) = plan.pixels[pass.pixels.clone()].get(j / lanes) else {
            return Err(backend_error(&format!(
                "fault record names stream {j} of pass {q}"
            )));
        };
        records.push(FaultRecord {
            block: block as u32,
            stream: (pixel as usize * lanes + j % lanes) as u32,
            code: r[3],
            a: r[4],
            b: r[5],
        });
    }
    let first = records
        .iter()
        .min_by_key(|r| (r.block, r.stream))
        .copied()
        .ok_or_else(|| backend_error("fault count without records"))?;
    Err(fault_error(file, first))
}

fn backend_error(reason: &str) -> ReduceError {
    ReduceError::Backend {
        backend: "gpu",
        reason: reason.to_string(),
    }
}

/// The [`QemError`] of one fault record.
pub fn fault_error(file: &QemFile, r: FaultRecord) -> ReduceError {
    let Some(info) = file.blocks().get(r.block as usize) else {
        return backend_error(&format!("fault record names block {}", r.block));
    };
    // Stream index inside the chunk, as the CPU decoder names it.
    let first = match file.codec() {
        Codec::Float => 0,
        _ => info.block_in_chunk * file.pixels(),
    };
    let site = StreamSite {
        chunk: info.chunk,
        stream: first + r.stream as usize,
    };
    use fault_code::*;
    let fault = match r.code {
        SELECTOR => StreamFault::UnknownSelector(r.a as u8),
        LENGTH => StreamFault::Length {
            selector: r.a as u8,
            len: r.b as usize,
        },
        INITIAL_STATE => StreamFault::InitialState(r.a),
        TRUNCATED => StreamFault::Truncated,
        TRUNCATED_ESCAPE => StreamFault::TruncatedEscape,
        FINAL_STATE => StreamFault::FinalState {
            state: r.a,
            unread: r.b as usize,
        },
        SPARSE_POSITION => StreamFault::SparsePosition {
            position: r.a as usize,
        },
        VALUE_RANGE => {
            return ReduceError::Decode(QemError::ValueRange {
                site,
                value: r.a as u16,
                dtype: "uint8",
            })
        }
        other => return backend_error(&format!("unknown fault code {other} in {site}")),
    };
    ReduceError::Decode(QemError::Stream { site, fault })
}

/// Runs of consecutive blocks whose per-frame accumulators (`products`
/// accumulators per frame) fit [`ACC_LIMIT`]; at least one block each.
pub fn batches(file: &QemFile, blocks: Range<usize>, products: usize) -> Vec<Range<usize>> {
    let most_frames = (ACC_LIMIT / (4 * ACC_WORDS * products.max(1))).max(1);
    let mut out = Vec::new();
    let mut b = blocks.start;
    while b < blocks.end {
        let mut e = b;
        let mut frames = 0;
        while e < blocks.end && (e == b || frames + file.blocks()[e].frames <= most_frames) {
            frames += file.blocks()[e].frames;
            e += 1;
        }
        out.push(b..e);
        b = e;
    }
    out
}

/// Checks what every backend refuses alike.
pub fn check_request(
    file: &QemFile,
    blocks: &Range<usize>,
    request: &Request,
) -> Result<(), ReduceError> {
    if blocks.start > blocks.end || blocks.end > file.blocks().len() {
        return Err(ReduceError::Unsupported(format!(
            "blocks {}..{} outside the file's {} blocks",
            blocks.start,
            blocks.end,
            file.blocks().len()
        )));
    }
    let [_, _, rows, columns] = file.shape();
    // Exact moments must fit u64: Σ index · value over a frame (the CPU
    // reference refuses the same detectors).
    if request.moments && (file.pixels() as u128) * 65535 * (rows.max(columns) as u128) >= 1 << 64 {
        return Err(ReduceError::Unsupported(
            "detector too large for exact 64-bit moments".into(),
        ));
    }
    if let Some(bg) = &request.background {
        if file.codec() != Codec::Float {
            return Err(ReduceError::Unsupported(
                "a background plane applies to float32 files only".into(),
            ));
        }
        if bg.len() != file.pixels() {
            return Err(ReduceError::Unsupported(format!(
                "background plane has {} values, the detector {} pixels",
                bg.len(),
                file.pixels()
            )));
        }
    }
    if request.pattern && file.pixels() > MAX_PIXELS {
        return Err(ReduceError::Unsupported(format!(
            "a pattern of {} pixels exceeds the GPU backends' limit of {MAX_PIXELS}",
            file.pixels()
        )));
    }
    Ok(())
}

/// The little-endian u32 words of `bytes` (a multiple of 4 long).
pub fn le_words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Parameters of the decode kernel (`DecodeParams` in the shaders).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct DecodeParams {
    pub streams: u32,
    pub m: u32,
    pub byte_base: u32,
    pub u8_limit: u32,
    pub block: u32,
    /// Index of the pass in its plan, for fault records.
    pub pass: u32,
    pub pad: [u32; 2],
}

/// Parameters of the reduction kernels (`ReduceParams` in the shaders).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct ReduceParams {
    pub m: u32,
    pub pixel0: u32,
    pub width: u32,
    pub columns: u32,
    pub float_lanes: u32,
    pub background: u32,
    pub products: u32,
    pub segments: u32,
    pub seg_len: u32,
    pub desc_base: u32,
    pub frame0: u32,
    pub batch_frames: u32,
    /// Always 1.0; the kernels multiply running sums and weighted terms by
    /// it so that compilers which reassociate or fuse float arithmetic can
    /// neither drop the compensation nor fuse a product into a sum.
    pub one: f32,
    pub pad: [u32; 3],
}

/// What one pass uploads: the streams' payload bytes (a span of the
/// chunk's payload from a word boundary for consecutive pixels, else the
/// streams gathered), their offsets, their selectors (padded to whole
/// words) and the decode parameters.
#[derive(Debug)]
pub struct PassUpload<'a> {
    /// Payload bytes; offsets count from `params.byte_base` before them.
    pub payload: Cow<'a, [u8]>,
    pub offsets: Vec<u32>,
    pub selectors: Vec<u8>,
    pub params: DecodeParams,
}

impl<'a> PassUpload<'a> {
    /// The streams of pass `q` of `plan` in block `raw`, lengths checked.
    pub fn new(
        source: Source,
        raw: &RawBlockStreams<'a>,
        plan: &Plan,
        q: usize,
    ) -> Result<PassUpload<'a>, ReduceError> {
        let lanes = source.lanes();
        let pass = &plan.passes[q];
        let pixels = &plan.pixels[pass.pixels.clone()];
        let offset = |s: usize| {
            let b = &raw.offsets[4 * s..4 * s + 4];
            u32::from_le_bytes([b[0], b[1], b[2], b[3]])
        };
        let streams: Vec<usize> = pixels
            .iter()
            .flat_map(|&p| (0..lanes).map(move |l| p as usize * lanes + l))
            .collect();
        for &s in &streams {
            let bytes = &raw.payload[offset(s) as usize..offset(s + 1) as usize];
            check_stream_length(raw, s, bytes)?;
        }
        let mut selectors: Vec<u8> = streams.iter().map(|&s| raw.selectors[s]).collect();
        selectors.resize(selectors.len().next_multiple_of(4), 0);
        let (payload, offsets, base) = if pass.contiguous {
            let (s0, s1) = (streams[0], streams[0] + streams.len());
            let offsets = le_words(&raw.offsets[4 * s0..4 * (s1 + 1)]);
            let base = offsets[0] as usize & !3;
            let end = offsets[s1 - s0] as usize;
            (Cow::Borrowed(&raw.payload[base..end]), offsets, base)
        } else {
            let mut bytes = Vec::new();
            let mut offsets = Vec::with_capacity(streams.len() + 1);
            offsets.push(0);
            for &s in &streams {
                bytes.extend_from_slice(&raw.payload[offset(s) as usize..offset(s + 1) as usize]);
                offsets.push(bytes.len() as u32);
            }
            (Cow::Owned(bytes), offsets, 0)
        };
        Ok(PassUpload {
            payload,
            offsets,
            selectors,
            params: DecodeParams {
                streams: streams.len() as u32,
                m: raw.frames as u32,
                byte_base: base as u32,
                u8_limit: u32::from(matches!(source, Source::Exact { u8_limit: true })),
                block: raw.block.index as u32,
                pass: q as u32,
                pad: [0; 2],
            },
        })
    }

    /// The payload zero-padded to whole u32 words.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn payload_words(&self) -> Vec<u32> {
        let mut words = vec![0u32; self.payload.len().div_ceil(4)];
        bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..self.payload.len()]
            .copy_from_slice(&self.payload);
        words
    }
}

/// Where a plan's passes find their product descriptors, and how its
/// lists are cut into segments.
#[derive(Debug, Clone)]
pub struct PlanLayout {
    /// Offset (in u32) of each pass's descriptors in [`Call::descs`].
    pub desc_bases: Vec<u32>,
    pub seg_len: usize,
    pub segments: usize,
}

/// Everything a backend needs to run one `reduce` call, computed once:
/// plans per block length, all lists and descriptors, buffer sizes and the
/// batches of blocks.
#[derive(Debug, Clone)]
pub struct Call {
    pub source: Source,
    pub products: Products,
    pub plans: BTreeMap<usize, Plan>,
    pub layouts: BTreeMap<usize, PlanLayout>,
    pub lists: Vec<u32>,
    pub descs: Vec<u32>,
    pub partial_bytes: u64,
    pub batches: Vec<Range<usize>>,
    pub batch_frames_max: usize,
    /// Frames of the call's blocks.
    pub frames: usize,
    pub columns: usize,
    /// Decode-only buffer sizes: streams, payload bytes and scratch values
    /// of the widest pass.
    pub max_streams: usize,
    pub max_payload: usize,
    pub max_values: usize,
}

impl Call {
    pub fn new(
        file: &QemFile,
        blocks: Range<usize>,
        request: &Request,
    ) -> Result<Call, ReduceError> {
        check_request(file, &blocks, request)?;
        let products = Products::new(file, request)?;
        if products.count() > 65535 {
            return Err(ReduceError::Unsupported(format!(
                "{} products in one request; at most 65535",
                products.count()
            )));
        }
        let ms: Vec<usize> = file.blocks()[blocks.clone()]
            .iter()
            .map(|b| b.frames)
            .collect();
        Ok(Call::for_lengths(file, &ms, products, blocks))
    }

    /// Every stream of `blocks` decoded, no products.
    pub fn decode_all(file: &QemFile, blocks: Range<usize>) -> Result<Call, ReduceError> {
        check_request(file, &blocks, &Request::default())?;
        let ms: Vec<usize> = file.blocks()[blocks.clone()]
            .iter()
            .map(|b| b.frames)
            .collect();
        Ok(Call::for_lengths(
            file,
            &ms,
            Products::decode_all(file),
            blocks,
        ))
    }

    /// Every stream of one block decoded, no products.
    pub fn decode_only(file: &QemFile, block: usize) -> Result<Call, ReduceError> {
        let m = file
            .blocks()
            .get(block)
            .ok_or(ReduceError::Decode(QemError::OutOfRange {
                what: "block",
                index: block,
                limit: file.blocks().len(),
            }))?
            .frames;
        Ok(Call::for_lengths(
            file,
            &[m],
            Products::decode_all(file),
            block..block + 1,
        ))
    }

    fn for_lengths(
        file: &QemFile,
        lengths: &[usize],
        products: Products,
        blocks: Range<usize>,
    ) -> Call {
        let source = Source::of(file);
        let n_prod = products.count();
        let mut plans = BTreeMap::new();
        for &m in lengths {
            plans
                .entry(m)
                .or_insert_with(|| Plan::new(source, m, &products));
        }
        let mut lists: Vec<u32> = Vec::new();
        let mut descs: Vec<u32> = Vec::new();
        let mut layouts = BTreeMap::new();
        let mut partial_bytes = 0u64;
        let (mut max_streams, mut max_payload, mut max_values) = (1, 4, 1);
        for (&m, plan) in &plans {
            let list_base = lists.len() as u32;
            lists.extend_from_slice(&plan.lists);
            let mut desc_bases = Vec::with_capacity(plan.passes.len());
            for pass in &plan.passes {
                desc_bases.push(descs.len() as u32);
                for d in &pass.descs {
                    descs.extend_from_slice(&[d[0] + list_base, d[1], d[2]]);
                }
            }
            let seg_len = plan.seg_len(n_prod).max(plan.max_count.div_ceil(65535));
            let segments = plan.max_count.div_ceil(seg_len).max(1);
            partial_bytes = partial_bytes.max((n_prod * segments * m * 4 * ACC_WORDS) as u64);
            layouts.insert(
                m,
                PlanLayout {
                    desc_bases,
                    seg_len,
                    segments,
                },
            );
            let streams = plan.max_width * source.lanes();
            max_streams = max_streams.max(streams);
            max_payload = max_payload.max(streams * longest_valid_stream(m) + 8);
            max_values = max_values.max(streams * m);
        }
        let frames = file.blocks()[blocks.clone()].iter().map(|b| b.frames).sum();
        let batches = batches(file, blocks, n_prod);
        let batch_frames_max = batches
            .iter()
            .map(|r| {
                file.blocks()[r.clone()]
                    .iter()
                    .map(|b| b.frames)
                    .sum::<usize>()
            })
            .max()
            .unwrap_or(0);
        Call {
            source,
            products,
            plans,
            layouts,
            lists,
            descs,
            partial_bytes,
            batches,
            batch_frames_max,
            frames,
            columns: file.shape()[3],
            max_streams,
            max_payload,
            max_values,
        }
    }

    pub fn float(&self) -> bool {
        self.source == Source::Float
    }

    /// Reduction parameters of pass `q` of a block of `m` frames at frame
    /// `frame0` of a batch of `batch_frames`.
    pub fn reduce_params(
        &self,
        m: usize,
        q: usize,
        frame0: usize,
        batch_frames: usize,
        background: bool,
    ) -> ReduceParams {
        let plan = &self.plans[&m];
        let layout = &self.layouts[&m];
        let pass = &plan.passes[q];
        ReduceParams {
            m: m as u32,
            pixel0: pass.pixels.start as u32,
            width: pass.pixels.len() as u32,
            columns: self.columns as u32,
            float_lanes: u32::from(self.float()),
            background: u32::from(background),
            products: self.products.count() as u32,
            segments: layout.segments as u32,
            seg_len: layout.seg_len as u32,
            desc_base: layout.desc_bases[q],
            frame0: frame0 as u32,
            batch_frames: batch_frames as u32,
            one: 1.0,
            pad: [0; 3],
        }
    }

    /// Bytes of the per-frame accumulators (`products` per frame).
    pub fn acc_bytes(&self) -> u64 {
        (self.products.count() * self.batch_frames_max * 4 * ACC_WORDS) as u64
    }

    /// Bytes of the pattern sum accumulators (one per pixel).
    pub fn pattern_sum_bytes(&self, pixels: usize) -> u64 {
        (pixels * 4 * ACC_WORDS) as u64
    }
}

/// Per-frame products gathered batch by batch, then the [`Partial`].
#[derive(Debug)]
pub struct Gathered {
    float: bool,
    exact: Vec<Vec<u64>>,
    floats: Vec<Vec<f32>>,
}

impl Gathered {
    pub fn new(call: &Call) -> Gathered {
        let n = call.products.count();
        Gathered {
            float: call.float(),
            exact: vec![Vec::new(); n],
            floats: vec![Vec::new(); n],
        }
    }

    /// Adds one batch's accumulators: per product, `batch_frames` of
    /// [`ACC_WORDS`] words each.
    pub fn push_batch(&mut self, words: &[u32], batch_frames: usize) {
        let w = ACC_WORDS;
        for k in 0..self.exact.len() {
            let part = &words[w * k * batch_frames..w * (k + 1) * batch_frames];
            for a in part.chunks_exact(w) {
                if self.float {
                    self.floats[k].push(float_value(a));
                } else {
                    self.exact[k].push(exact_value(a));
                }
            }
        }
    }

    fn take(&mut self, k: usize) -> Values {
        if self.float {
            Values::Float(std::mem::take(&mut self.floats[k]))
        } else {
            Values::Exact(std::mem::take(&mut self.exact[k]))
        }
    }

    /// The partial, with the pattern accumulators ([`ACC_WORDS`] words per
    /// pixel for the sum, two for the maximum) when the request asked for
    /// a pattern.
    pub fn finish(
        mut self,
        file: &QemFile,
        call: &Call,
        pattern: Option<(Vec<u32>, Vec<u32>)>,
    ) -> Partial {
        let masks = (0..call.products.masks).map(|k| self.take(k)).collect();
        let moments = call.products.moments.then(|| {
            let k = call.products.masks;
            Moments {
                total: self.take(k),
                row: self.take(k + 1),
                column: self.take(k + 2),
            }
        });
        let p_count = file.pixels();
        let valid = |p: usize| file.valid_mask().is_none_or(|v| v.is_valid(p));
        // Over no frames at all the maximum is 0, as in the CPU reference.
        let no_frames = call.frames == 0;
        let pattern = pattern.map(|(sums, maxes)| {
            if self.float {
                Pattern {
                    sum: Values::Float(
                        sums.chunks_exact(ACC_WORDS)
                            .take(p_count)
                            .map(float_value)
                            .collect(),
                    ),
                    max: Values::Float(
                        (0..p_count)
                            .map(|p| {
                                if no_frames {
                                    0.0
                                } else if maxes[2 * p + 1] != 0 {
                                    f32::NAN
                                } else {
                                    f32::from_bits(maxes[2 * p])
                                }
                            })
                            .collect(),
                    ),
                }
            } else {
                Pattern {
                    sum: Values::Exact(
                        sums.chunks_exact(ACC_WORDS)
                            .take(p_count)
                            .enumerate()
                            .map(|(p, a)| if valid(p) { exact_value(a) } else { 0 })
                            .collect(),
                    ),
                    max: Values::Exact(
                        (0..p_count)
                            .map(|p| if valid(p) { u64::from(maxes[2 * p]) } else { 0 })
                            .collect(),
                    ),
                }
            }
        });
        Partial {
            masks,
            moments,
            pattern,
        }
    }
}

/// The float32 value of a kernel's float accumulator.
fn float_value(words: &[u32]) -> f32 {
    Neumaier::from_words([words[0], words[1], words[2], words[3]]).value()
}

/// The u64 of a kernel's exact accumulator.
fn exact_value(words: &[u32]) -> u64 {
    u64::from(words[0]) | (u64::from(words[1]) << 32)
}

/// Initial pattern maximum words: 0 for integers, (-inf, no NaN) for floats.
pub fn pattern_max_init(call: &Call, pixels: usize) -> Vec<u32> {
    if call.float() {
        (0..pixels)
            .flat_map(|_| [f32::NEG_INFINITY.to_bits(), 0])
            .collect()
    } else {
        vec![0; 2 * pixels]
    }
}

/// Writes a pass's decoded scratch words (stream-major, slot `jl` holding
/// `pixels[jl]`; float lanes joined) into `out`, the block's values
/// frame-major.
pub fn scatter_frames(
    words: &[u32],
    pixels: &[u32],
    m: usize,
    lanes: usize,
    p_count: usize,
    out: &mut [u32],
) {
    for (jl, &p) in pixels.iter().enumerate() {
        let p = p as usize;
        for t in 0..m {
            out[t * p_count + p] = if lanes == 1 {
                words[jl * m + t]
            } else {
                words[2 * jl * m + t] | (words[(2 * jl + 1) * m + t] << 16)
            };
        }
    }
}
