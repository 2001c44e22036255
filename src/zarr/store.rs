//! Zarr stores on disk, through `zarrs`: `write_store` renders a `.qem`
//! file as a compressed Zarr v3 group (the layout of the mount's
//! `data.zarr`, see `super::layout`), and [`ZarrSource`] reads any 4-D
//! Zarr v2 or v3 array (zarr-python's blosc, zstd, gzip or no compressor;
//! any chunking) in bounded bands of scan rows.
//!
//! A store is written into a temporary sibling directory and renamed into
//! place only when complete (`crate::publish::AtomicDir`).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rayon::prelude::*;
use serde_json::{Map, Value};
use zarrs::array::codec::api::BytesToBytesCodecTraits;
use zarrs::array::codec::{
    BloscCodec, BloscCompressionLevel, BloscCompressor, BloscShuffleMode, ShardingCodecOptions,
    SubchunkWriteOrder, ZstdCodec,
};
use zarrs::array::{
    data_type, Array, ArrayBuilder, ArrayBytes, ArrayShardedExt, ArrayShardedReadableExt,
    ArrayShardedReadableExtCache, ArraySubset, CodecSpecificOptions, DataType,
};
use zarrs::filesystem::FilesystemStore;
use zarrs::group::{Group, GroupBuilder};
use zarrs::plugin::ExtensionName;
use zarrs::storage::byte_range::ByteRange;
use zarrs::storage::{
    Bytes, OffsetBytesIterator, ReadableStorageTraits, StorageError, StoreKey, StorePrefix,
    WritableStorageTraits,
};

use super::identity;
use super::layout::{self, DIMENSIONS};
use super::shard;
use crate::contained::contained;
use crate::pool::{Pool, Pooled};
use crate::publish::{AtomicDir, Overwrite};
use crate::qem::write::{Content, CountDtype, WriteSpec, RESERVED};
use crate::qem::{Codec, Dtype, QemFile};

/// Why a store could not be written or read; names the store (and the
/// chunk, where one is to blame), or the source file when its content is
/// to blame.
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}", store.display())]
pub struct ZarrError {
    pub store: PathBuf,
    pub reason: String,
}

fn fail(store: &Path, reason: impl std::fmt::Display) -> ZarrError {
    ZarrError {
        store: store.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// The compression of a written store's chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Compression {
    /// Uncompressed chunks (the mount's view is uncompressed too).
    None,
    /// zstd level 3.
    Zstd,
    /// blosc: byte shuffle, then LZ4 (fastest to decode).
    BloscLz4,
    /// blosc: byte shuffle, then zstd level 3 (the default: small and fast).
    #[default]
    BloscZstd,
}

impl Compression {
    fn codecs(self, element_size: usize) -> Result<Vec<Arc<dyn BytesToBytesCodecTraits>>, String> {
        let blosc = |cname| -> Result<Arc<dyn BytesToBytesCodecTraits>, String> {
            let level = BloscCompressionLevel::try_from(3u8).map_err(|e| format!("{e:?}"))?;
            let shuffle = if element_size > 0 {
                BloscShuffleMode::BitShuffle
            } else {
                BloscShuffleMode::NoShuffle
            };
            Ok(Arc::new(
                BloscCodec::new(cname, level, None, shuffle, Some(element_size))
                    .map_err(|e| e.to_string())?,
            ))
        };
        Ok(match self {
            Compression::None => Vec::new(),
            Compression::Zstd => vec![Arc::new(ZstdCodec::new(3, false))],
            Compression::BloscLz4 => vec![blosc(BloscCompressor::LZ4)?],
            Compression::BloscZstd => vec![blosc(BloscCompressor::Zstd)?],
        })
    }
}

/// What `write_store` wrote.
#[derive(Debug, Clone, Copy)]
pub struct StoreSummary {
    /// Decoded bytes of `data` (and `codes`) written.
    pub dense_bytes: u64,
    /// Files of `data` (and `codes`) written: shards, or chunks when
    /// unsharded.
    pub chunks: u64,
}

/// The members of a `.qem` header that describe the measurement rather
/// than its encoding: kept in the store's `qem.header` attribute so that
/// converting back recreates the same file content.
const LAYOUT_MEMBERS: &[&str] = &["chunks", "bytes", "sha256", "logical_sha256"];

fn kept_header(file: &QemFile) -> Result<Map<String, Value>, crate::qem::QemError> {
    let mut header = file.header_object()?;
    for k in LAYOUT_MEMBERS {
        header.remove(*k);
    }
    Ok(header)
}

fn zarr_type(d: Dtype) -> DataType {
    match d {
        Dtype::U8 => data_type::uint8(),
        Dtype::U16 => data_type::uint16(),
        Dtype::F32 => data_type::float32(),
    }
}

type Store = FilesystemStore;

/// The store a conversion writes into: zarrs' store on disk, every write
/// made under [`crate::publish::by_path`]. It makes the store's folders as
/// it stores each chunk, so a write in flight while an interrupted run
/// removes the temporary store would make it anew.
struct Written(Store);

impl WritableStorageTraits for Written {
    fn set(&self, key: &StoreKey, value: Bytes) -> Result<(), StorageError> {
        crate::publish::by_path(|| self.0.set(key, value))
    }

    fn set_partial_many(
        &self,
        key: &StoreKey,
        offset_values: OffsetBytesIterator,
    ) -> Result<(), StorageError> {
        crate::publish::by_path(|| self.0.set_partial_many(key, offset_values))
    }

    fn erase(&self, key: &StoreKey) -> Result<(), StorageError> {
        crate::publish::by_path(|| self.0.erase(key))
    }

    fn erase_prefix(&self, prefix: &StorePrefix) -> Result<(), StorageError> {
        crate::publish::by_path(|| self.0.erase_prefix(prefix))
    }

    fn supports_set_partial(&self) -> bool {
        self.0.supports_set_partial()
    }
}

/// One array of a store to be written.
struct ArraySpec<'a> {
    name: &'a str,
    shape: Vec<u64>,
    chunks: Vec<u64>,
    /// The inner chunk shape when `chunks` is a shard shape.
    subchunks: Option<Vec<u64>>,
    dtype: DataType,
    codecs: Vec<Arc<dyn BytesToBytesCodecTraits>>,
    dimensions: &'a [&'a str],
    attributes: Map<String, Value>,
}

fn build_array(
    store: &Arc<Written>,
    root: &Path,
    spec: ArraySpec<'_>,
) -> Result<Array<Written>, ZarrError> {
    let ArraySpec {
        name,
        shape,
        chunks,
        subchunks,
        dtype,
        codecs,
        dimensions,
        attributes,
    } = spec;
    let fill: zarrs::array::FillValue = if dtype == data_type::float32() {
        0f32.into()
    } else if dtype == data_type::float64() {
        0f64.into()
    } else if dtype == data_type::uint16() {
        0u16.into()
    } else if dtype == data_type::bool() {
        false.into()
    } else {
        0u8.into()
    };
    let mut builder = ArrayBuilder::new(shape, chunks, dtype, fill);
    // With a subchunk shape zarrs writes `sharding_indexed`, the codecs
    // applying to each inner chunk (and a crc32c-checked index at the end).
    builder.subchunk_shape(subchunks);
    // Inner chunks laid out in row-major order, not in the order their
    // parallel encodes finish: converting the same file twice gives the
    // same bytes (content-addressed stores, checksums, `diff -r`), and a
    // reader of consecutive inner chunks reads consecutive bytes.
    builder.codec_specific_options(CodecSpecificOptions::default().with_option(
        ShardingCodecOptions::default().with_subchunk_write_order(SubchunkWriteOrder::C),
    ));
    let array = builder
        .bytes_to_bytes_codecs(codecs)
        .dimension_names(Some(dimensions.to_vec()))
        .attributes(attributes)
        .build(Arc::clone(store), &format!("/{name}"))
        .map_err(|e| fail(root, format!("array {name}: {e}")))?;
    array
        .store_metadata()
        .map_err(|e| fail(root, format!("array {name}: {e}")))?;
    Ok(array)
}

/// Decodes the values (or stored codes) of frames `frames` into `out`
/// (exactly their length), little-endian, in bounded windows whatever the
/// block's size. Every byte of `out` is written.
fn read_frames_into(
    file: &QemFile,
    frames: Range<usize>,
    codes: bool,
    out: &mut [u8],
) -> Result<(), String> {
    let read = if codes {
        file.read_frame_codes_le(frames, out)
    } else {
        file.read_frames(frames, out)
    };
    read.map_err(|e| e.to_string())
}

/// The chunk grid of a written 4-D array: the inner chunk shape (one
/// block's worth of frames, [`layout::chunk_shape`]) and, when sharded,
/// the shard shape.
#[derive(Debug, Clone, Copy)]
struct Grid {
    chunk: [usize; 4],
    shard: Option<[usize; 4]>,
}

impl Grid {
    fn of(file: &QemFile, shard_bytes: u64) -> Grid {
        let chunk = layout::chunk_shape(file);
        let [rows, columns, dr, dc] = file.shape();
        let frame_bytes = file.pixels() * file.decoded_dtype().size();
        let shard = shard::scan_shard(
            rows,
            columns,
            [chunk[0], chunk[1]],
            frame_bytes,
            shard_bytes,
        )
        .map(|[r, c]| [r, c, dr, dc]);
        Grid { chunk, shard }
    }

    /// The shape of one stored file: the shard, or the chunk.
    fn stored(&self) -> [usize; 4] {
        self.shard.unwrap_or(self.chunk)
    }
}

/// Writes the stored objects (shards, or chunks when unsharded) of one 4-D
/// array. Every stored object holds one contiguous run of frames (whole
/// scan rows, or part of one, see [`shard::scan_shard`] and
/// [`layout::scan_chunk`]), laid out in its scan rows and padded past the
/// scan's edge.
/// Which identities [`write_dense`] hashes while it writes.
#[derive(Clone, Copy, PartialEq)]
enum Hash {
    Nothing,
    /// The file's bytes (the decoded array's digest is known already).
    File,
    /// The file's bytes and the decoded array, in order.
    FileAndArray,
}

#[allow(clippy::too_many_arguments)]
fn write_dense(
    file: &QemFile,
    source: &Path,
    array: &Array<Written>,
    grid: Grid,
    root: &Path,
    codes: bool,
    hash: Hash,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(u64, Option<identity::Identities>), ZarrError> {
    let [rows, columns, ..] = file.shape();
    let [object_rows, object_columns, ..] = grid.stored();
    let element = if codes {
        2
    } else {
        file.decoded_dtype().size()
    };
    let frame_bytes = file.pixels() * element;
    let counts = [rows.div_ceil(object_rows), columns.div_ceil(object_columns)];
    let what = if grid.shard.is_some() {
        "shard"
    } else {
        "chunk"
    };
    // The objects' buffers, reused from one object to the next (see
    // `crate::pool`): one pool for the conversion, not one buffer per
    // thread, since a rayon thread waiting inside zarrs' own parallel
    // encoding may start another object. Idle ones are kept up to two per
    // thread.
    let object_bytes = object_rows * object_columns * frame_bytes;
    let threads = rayon::current_num_threads();
    let buffers = Arc::new(Pool::new(2 * threads * object_bytes));
    let write = |feed: Option<&identity::Feed<'_>>| {
        // Objects are started in frame order (par_bridge takes them from
        // the iterator in turn), so that the in-order digest seldom waits.
        (0..counts[0])
            .flat_map(|i| (0..counts[1]).map(move |j| [i, j]))
            .par_bridge()
            .try_for_each(|[i, j]| {
                let row = i * object_rows;
                let column = j * object_columns;
                let present_rows = object_rows.min(rows - row);
                let present_columns = object_columns.min(columns - column);
                // Whole rows (present_columns == columns) or part of one
                // row: the present frames are one contiguous run either way.
                let first = row * columns + column;
                let count = if present_columns == columns {
                    present_rows * columns
                } else {
                    present_columns
                };
                let present = count * frame_bytes;
                let mut bytes = buffers.take_stale(object_bytes);
                if present_columns == object_columns {
                    read_frames_into(file, first..first + count, codes, &mut bytes[..present])
                        .map_err(|e| fail(source, e))?;
                    // Rows past the scan's edge.
                    bytes[present..].fill(0);
                    let bytes = Arc::new(Pooled::new(bytes, &buffers));
                    if let Some(feed) = feed {
                        feed.give(first, count, &bytes, 0..present);
                    }
                    store(array, [i, j], &bytes, what, root)?;
                } else {
                    // Columns padded up to the shard's width: place row by row.
                    let mut run = buffers.take_stale(present);
                    read_frames_into(file, first..first + count, codes, &mut run)
                        .map_err(|e| fail(source, e))?;
                    bytes.fill(0);
                    let row_bytes = present_columns * frame_bytes;
                    for (r, src) in run.chunks_exact(row_bytes.max(1)).enumerate() {
                        let at = r * object_columns * frame_bytes;
                        bytes[at..at + row_bytes].copy_from_slice(src);
                    }
                    let run = Arc::new(Pooled::new(run, &buffers));
                    if let Some(feed) = feed {
                        feed.give(first, count, &run, 0..present);
                    }
                    drop(run);
                    store(array, [i, j], &Pooled::new(bytes, &buffers), what, root)?;
                }
                progress(present as u64);
                Ok(())
            })
    };
    let identities = match hash {
        Hash::Nothing => {
            write(None)?;
            None
        }
        Hash::File | Hash::FileAndArray => {
            // Runs waiting for an earlier one: as many as the pool keeps.
            let bound = (2 * threads * object_bytes).max(64 << 20);
            let array = hash == Hash::FileAndArray;
            let (written, identities) =
                identity::while_writing(file, source, array, bound, |feed| write(Some(feed)));
            written?;
            Some(identities)
        }
    };
    Ok(((rows * columns * frame_bytes) as u64, identities))
}

/// Stores object `[i, j]` of `array`.
fn store(
    array: &Array<Written>,
    [i, j]: [usize; 2],
    bytes: &[u8],
    what: &str,
    root: &Path,
) -> Result<(), ZarrError> {
    array
        .store_chunk(&[i as u64, j as u64, 0, 0], ArrayBytes::new_flen(bytes))
        .map_err(|e| fail(root, format!("{what} {i}.{j}.0.0: {e}")))
}

/// Writes `file` as a Zarr v3 store at `target`: the group with `data`,
/// `codes` (scaled files), `mask` (counts) and the coordinate arrays, all
/// with the attributes of the mount's `data.zarr`, plus `qem.header` for
/// the way back. `progress` is told the dense bytes of each chunk written.
/// A fault in `file`'s content is reported against `source`, its path.
pub(crate) fn write_store(
    file: &QemFile,
    source: &Path,
    target: &Path,
    overwrite: Overwrite,
    compression: Compression,
    shard_bytes: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<StoreSummary, ZarrError> {
    if file.logical_expected().is_some() {
        // A whole float array leaves: its logical checksum must hold
        // (see crate::qem::logical), before anything is written.
        file.verify_logical().map_err(|e| fail(source, e))?;
    }
    let dir = AtomicDir::create(target, overwrite).map_err(|e| fail(target, e))?;
    let root = dir.temp().to_path_buf();
    let store = Arc::new(Written(Store::new(&root).map_err(|e| fail(target, e))?));

    let source_name = source
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();

    let shape: Vec<u64> = file.shape().iter().map(|&s| s as u64).collect();
    let grid = Grid::of(file, shard_bytes);
    let chunks: Vec<u64> = grid.stored().iter().map(|&c| c as u64).collect();
    let subchunks: Option<Vec<u64>> = grid
        .shard
        .map(|_| grid.chunk.iter().map(|&c| c as u64).collect());
    let dtype = file.decoded_dtype();
    let data = build_array(
        &store,
        target,
        ArraySpec {
            name: "data",
            shape: shape.clone(),
            chunks: chunks.clone(),
            subchunks: subchunks.clone(),
            dtype: zarr_type(dtype),
            codecs: compression
                .codecs(dtype.size())
                .map_err(|e| fail(target, e))?,
            dimensions: &DIMENSIONS,
            attributes: layout::data_attributes(file.codec()),
        },
    )?;
    let mut arrays = vec![("data".to_string(), data.metadata().clone())];
    // A float file's digest was checked above; the others' is hashed as
    // the data is written.
    let hash = match file.logical_verdict() {
        Some(_) => Hash::File,
        None => Hash::FileAndArray,
    };
    let (mut dense_bytes, identities) =
        write_dense(file, source, &data, grid, target, false, hash, progress)?;
    let mut written = data.chunk_grid_shape().iter().product::<u64>();
    if file.codec() == Codec::Scaled {
        let codes = build_array(
            &store,
            target,
            ArraySpec {
                name: "codes",
                shape: shape.clone(),
                chunks,
                subchunks,
                dtype: data_type::uint16(),
                codecs: compression.codecs(2).map_err(|e| fail(target, e))?,
                dimensions: &DIMENSIONS,
                attributes: layout::codes_attributes(),
            },
        )?;
        arrays.push(("codes".to_string(), codes.metadata().clone()));
        let (bytes, _) = write_dense(
            file,
            source,
            &codes,
            grid,
            target,
            true,
            Hash::Nothing,
            progress,
        )?;
        dense_bytes += bytes;
        written += codes.chunk_grid_shape().iter().product::<u64>();
    }
    if let Some(mask) = layout::mask_bytes(file) {
        let detector = shape[2..].to_vec();
        let array = build_array(
            &store,
            target,
            ArraySpec {
                name: "mask",
                shape: detector.clone(),
                chunks: detector,
                subchunks: None,
                dtype: data_type::bool(),
                codecs: Vec::new(),
                dimensions: &DIMENSIONS[2..],
                attributes: layout::mask_attributes(),
            },
        )?;
        array
            .store_chunk(&[0, 0], ArrayBytes::new_flen(mask))
            .map_err(|e| fail(target, format!("mask: {e}")))?;
        arrays.push(("mask".to_string(), array.metadata().clone()));
    }
    for (axis, name) in DIMENSIONS.iter().enumerate() {
        let c = layout::coordinate(file, axis);
        let n = c.size as u64;
        let array = build_array(
            &store,
            target,
            ArraySpec {
                name,
                shape: vec![n],
                chunks: vec![n.max(1)],
                subchunks: None,
                dtype: data_type::float64(),
                codecs: Vec::new(),
                dimensions: &[name],
                attributes: c.attributes.clone(),
            },
        )?;
        let bytes = c.le_bytes(0..c.size);
        array
            .store_chunk(&[0], ArrayBytes::new_flen(bytes))
            .map_err(|e| fail(target, format!("{name}: {e}")))?;
        arrays.push((name.to_string(), array.metadata().clone()));
    }
    // The group last: its attributes hold the identities hashed above.
    let identities = identities.unwrap_or(identity::Identities {
        logical: None,
        file: None,
    });
    let logical = match identities.logical {
        Some(digest) => file.check_logical(digest),
        // The runs came too far out of order to hash as they went.
        None => file.verify_logical(),
    }
    .map_err(|e| fail(source, e))?;
    let file_sha256 = identities
        .file
        .ok_or_else(|| fail(source, "the file changed while it was converted"))?;
    let mut attributes = layout::group_attributes(file, &source_name);
    if let Some(Value::Object(qem)) = attributes.get_mut("qem") {
        qem.insert("file_sha256".into(), file_sha256.into());
        qem.insert("logical_sha256".into(), logical.into());
        let kept = kept_header(file).map_err(|e| fail(source, e))?;
        qem.insert("header".into(), Value::Object(kept));
    }
    let mut group = GroupBuilder::new()
        .build(Arc::clone(&store), "/")
        .map_err(|e| fail(target, e))?;
    *group.attributes_mut() = attributes;
    group.store_metadata().map_err(|e| fail(target, e))?;
    consolidate(&root, &arrays).map_err(|e| fail(target, e))?;
    dir.publish().map_err(|e| fail(target, e))?;
    Ok(StoreSummary {
        dense_bytes,
        chunks: written,
    })
}

/// Adds zarr-python's inline consolidated metadata (every array's
/// `zarr.json`) to the root group's `zarr.json`, so that xarray and
/// zarr-python open the store with one read.
fn consolidate(
    root: &Path,
    arrays: &[(String, zarrs::array::ArrayMetadata)],
) -> Result<(), String> {
    let path = root.join("zarr.json");
    let text = std::fs::read(&path).map_err(|e| e.to_string())?;
    let mut group: Value = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    let mut metadata = Map::new();
    for (name, meta) in arrays {
        metadata.insert(
            name.clone(),
            serde_json::to_value(meta).map_err(|e| e.to_string())?,
        );
    }
    group["consolidated_metadata"] = serde_json::json!({
        "kind": "inline",
        "must_understand": false,
        "metadata": metadata,
    });
    std::fs::write(&path, crate::export::json::pretty(&group)).map_err(|e| e.to_string())
}

/// A 4-D Zarr array opened for conversion: a store's `data` array (the
/// layout we write), or the array at the store's root.
pub struct ZarrSource {
    path: PathBuf,
    array: Array<Store>,
    shape: [usize; 4],
    dtype: Dtype,
    mask: Option<Vec<bool>>,
    /// `qem.header` of a store we wrote: the original file's members.
    header: Option<Map<String, Value>>,
    /// The shard indexes checked so far, when `array` is sharded.
    shards: Option<Shards>,
    /// Whether chunks are stored uncompressed (the `bytes` codec alone):
    /// zarrs then reads only the bytes a read needs, so a chunk file cut
    /// short within an edge chunk's padding went unnoticed. Each such
    /// chunk's stored size is checked instead.
    plain: bool,
}

/// zarrs trusts a shard index's offsets and lengths: one edited (its
/// checksum recomputed) to point past the shard's end made it panic on an
/// overflowing sum, or abort on an allocation of 2^63 bytes. So each
/// shard's index is checked against the shard's size before the shard is
/// read.
struct Shards {
    cache: ArrayShardedReadableExtCache,
    checked: std::sync::Mutex<std::collections::HashSet<Vec<u64>>>,
}

impl ZarrSource {
    /// Opens `path` (a store folder). Refuses arrays that are not 4-D
    /// uint8, uint16 or float32, naming the store and what it found.
    pub fn open(path: &Path) -> Result<ZarrSource, ZarrError> {
        if !path.is_dir() {
            return Err(fail(path, "not a Zarr store (a folder)"));
        }
        let store = Arc::new(Store::new(path).map_err(|e| fail(path, e))?);
        let group = Group::open(Arc::clone(&store), "/").ok();
        let array = match &group {
            Some(_) => Array::open(Arc::clone(&store), "/data").map_err(|e| {
                fail(
                    path,
                    format!("a Zarr group without a readable array `data`: {e}"),
                )
            })?,
            None => Array::open(Arc::clone(&store), "/").map_err(|e| {
                // An array there whose codec or type zarrs refuses
                // lands here too: `e` says which.
                fail(
                    path,
                    format!("not a Zarr group, and no Zarr array it can read at its root: {e}"),
                )
            })?,
        };
        let dims = array.shape();
        let shape: [usize; 4] = match dims {
            [a, b, c, d] => [*a, *b, *c, *d].map(|s| s as usize),
            _ => {
                return Err(fail(
                    path,
                    format!(
                        "a {}-D array; .qem holds 4-D arrays (scan_row, scan_column, detector_row, detector_column)",
                        dims.len()
                    ),
                ))
            }
        };
        if shape.contains(&0) {
            return Err(fail(path, format!("empty array of shape {shape:?}")));
        }
        let t = array.data_type();
        let dtype = if *t == data_type::uint8() {
            Dtype::U8
        } else if *t == data_type::uint16() {
            Dtype::U16
        } else if *t == data_type::float32() {
            Dtype::F32
        } else {
            return Err(fail(
                path,
                format!(
                    "data type {}; .qem holds uint8, uint16 or float32",
                    type_name(&array)
                ),
            ));
        };
        // Only an array sharded and nothing else lets zarrs say where its
        // inner chunks lie (see `Shards`).
        let shards = array.is_exclusively_sharded().then(|| Shards {
            cache: ArrayShardedReadableExtCache::new(&array),
            checked: Default::default(),
        });
        let codecs = array.codecs();
        let plain = codecs.array_to_array_codecs().is_empty()
            && codecs.bytes_to_bytes_codecs().is_empty()
            && codecs.array_to_bytes_codec().name_v3().as_deref() == Some("bytes");
        let mut source = ZarrSource {
            path: path.to_path_buf(),
            array,
            shape,
            dtype,
            mask: None,
            header: None,
            shards,
            plain,
        };
        if let Some(group) = group {
            if let Some(Value::Object(h)) =
                group.attributes().get("qem").and_then(|q| q.get("header"))
            {
                source.header = Some(h.clone());
            }
            if let Ok(mask) = Array::open(store, "/mask") {
                source.mask = Some(source.read_mask(&mask)?);
            }
        }
        Ok(source)
    }

    fn read_mask(&self, mask: &Array<Store>) -> Result<Vec<bool>, ZarrError> {
        let detector = [self.shape[2] as u64, self.shape[3] as u64];
        if mask.shape() != detector || *mask.data_type() != data_type::bool() {
            return Err(fail(
                &self.path,
                format!(
                    "array `mask` must be bool of the detector's shape {detector:?}, not {:?}",
                    mask.shape()
                ),
            ));
        }
        let bytes = contained(|| {
            mask.retrieve_array_subset::<ArrayBytes>(&mask.subset_all())
                .and_then(|b| Ok(b.into_fixed()?.into_owned()))
                .map_err(|e| e.to_string())
        })
        .and_then(|r| r)
        .map_err(|e| fail(&self.path, format!("mask: {e}")))?;
        Ok(bytes.iter().map(|&b| b != 0).collect())
    }

    pub fn shape(&self) -> [usize; 4] {
        self.shape
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// What the `.qem` written from this array holds. A store we wrote
    /// (with `qem.header`) gets its original metadata, producer record,
    /// valid mask, EMPAD description and unknown header members back; any
    /// other array gets `scientific_metadata` (the caller's defaults) and
    /// the `mask` array, if there is one. A scaled file's store comes back
    /// as float32 measurements of the same values: the stored codes and
    /// their calibration regions are not recreated.
    pub fn write_spec(&self, scientific_metadata: Value) -> WriteSpec {
        let shape = self.shape.map(|s| s as u64);
        let header = self.header.clone().unwrap_or_default();
        let object = |key: &str| match header.get(key) {
            Some(Value::Object(m)) => m.clone(),
            _ => Map::new(),
        };
        let sm = match header.get("scientific_metadata") {
            Some(v @ Value::Object(_)) => v.clone(),
            _ => scientific_metadata,
        };
        let content = match self.dtype {
            Dtype::U8 | Dtype::U16 => Content::Counts {
                dtype: if self.dtype == Dtype::U8 {
                    CountDtype::U8
                } else {
                    CountDtype::U16
                },
                valid: self.mask.clone(),
                metadata: object("metadata"),
            },
            Dtype::F32 => {
                let from_float =
                    header.get("codec").and_then(Value::as_str) == Some(Codec::Float.id());
                Content::Float32 {
                    empad: from_float
                        .then(|| header.get("empad").and_then(Value::as_object).cloned())
                        .flatten(),
                    metadata: object("metadata"),
                }
            }
        };
        let mut spec = match content {
            Content::Float32 { .. } => WriteSpec::float32(shape, sm),
            _ => WriteSpec::counts(shape, CountDtype::U8, sm),
        };
        spec.content = content;
        spec.extra = header
            .into_iter()
            .filter(|(k, _)| !RESERVED.contains(&k.as_str()))
            .collect();
        spec
    }

    /// Frames `first..first + out.len() / frame_bytes` in scan order into
    /// `out`, read as boxes of the array that are contiguous there (a part
    /// of one scan row, or whole rows), so that nothing beyond the window
    /// is held whatever a scan row's size.
    pub fn read_frames(&self, first: usize, out: &mut [u8]) -> Result<(), ZarrError> {
        let [_, columns, dr, dc] = self.shape;
        let frame_bytes = dr * dc * self.dtype.size();
        if frame_bytes == 0 || columns == 0 {
            return Ok(());
        }
        let end = first + out.len() / frame_bytes;
        let (mut frame, mut at) = (first, 0);
        while frame < end {
            let (row, column) = (frame / columns, frame % columns);
            let (rows, cols) = if column > 0 || end - frame < columns {
                (row..row + 1, column..columns.min(column + end - frame))
            } else {
                (row..row + (end - frame) / columns, 0..columns)
            };
            let n = rows.len() * cols.len();
            self.read_box(rows, cols, &mut out[at..at + n * frame_bytes])?;
            (frame, at) = (frame + n, at + n * frame_bytes);
        }
        Ok(())
    }

    /// The frames of scan rows `rows` × columns `cols` into `out`, in C
    /// order, little-endian. A missing chunk reads as the fill value, as
    /// the Zarr specification says; a chunk that cannot be decoded is an
    /// error naming it.
    fn read_box(
        &self,
        rows: Range<usize>,
        cols: Range<usize>,
        out: &mut [u8],
    ) -> Result<(), ZarrError> {
        let [_, _, dr, dc] = self.shape;
        let band = ArraySubset::new_with_ranges(&[
            rows.start as u64..rows.end as u64,
            cols.start as u64..cols.end as u64,
            0..dr as u64,
            0..dc as u64,
        ]);
        let element = self.dtype.size();
        let band_shape = [rows.len(), cols.len(), dr, dc];
        let chunks = self
            .array
            .chunks_in_array_subset(&band)
            .map_err(|e| fail(&self.path, e))?
            .ok_or_else(|| fail(&self.path, "chunk grid does not cover the array"))?;
        // A stored object is a shard of inner chunks in a sharded array.
        let what = if self.array.is_sharded() {
            "shard"
        } else {
            "chunk"
        };
        for index in chunks.indices() {
            let key = format!("{what} {}", self.array.chunk_key(&index));
            let chunk = self
                .array
                .chunk_subset(&index)
                .map_err(|e| fail(&self.path, format!("{key}: {e}")))?;
            // zarrs computes byte offsets within a chunk in u64 without
            // checking: a chunk shape whose bytes overflow made it panic.
            let whole = chunk
                .shape()
                .iter()
                .try_fold(element as u64, |b, &n| b.checked_mul(n))
                .filter(|&b| b <= i64::MAX as u64);
            let Some(whole) = whole else {
                return Err(fail(
                    &self.path,
                    format!(
                        "{key}: a chunk of shape {:?} is too large to read",
                        chunk.shape()
                    ),
                ));
            };
            let part = chunk
                .overlap(&band)
                .map_err(|e| fail(&self.path, format!("{key}: {e}")))?;
            if part.is_empty() {
                continue;
            }
            let local = part
                .relative_to(chunk.start())
                .map_err(|e| fail(&self.path, format!("{key}: {e}")))?;
            self.check_shard(&index, &key)?;
            if self.plain {
                self.check_plain(&index, &key, whole)?;
            }
            let bytes = contained(|| {
                self.array
                    .retrieve_chunk_subset::<ArrayBytes>(&index, &local)
                    .and_then(|b| Ok(b.into_fixed()?.into_owned()))
                    .map_err(|e| e.to_string())
            })
            .and_then(|r| r)
            .map_err(|e| fail(&self.path, format!("{key}: {e}")))?;
            copy_box(
                &bytes,
                part.shape_usize().as_slice(),
                out,
                &band_shape,
                &[
                    part.start()[0] as usize - rows.start,
                    part.start()[1] as usize - cols.start,
                    part.start()[2] as usize,
                    part.start()[3] as usize,
                ],
                element,
            );
        }
        Ok(())
    }
}

impl ZarrSource {
    /// Refuses an uncompressed chunk whose file does not hold exactly
    /// `bytes`, its whole shape's (see `plain`). A missing chunk reads as
    /// the fill value.
    fn check_plain(&self, chunk: &[u64], key: &str, bytes: u64) -> Result<(), ZarrError> {
        let stored = self
            .array
            .storage()
            .size_key(&self.array.chunk_key(chunk))
            .map_err(|e| fail(&self.path, format!("{key}: {e}")))?;
        match stored {
            Some(size) if size != bytes => Err(fail(
                &self.path,
                format!("{key}: {size} bytes stored, where the uncompressed chunk holds {bytes}"),
            )),
            _ => Ok(()),
        }
    }

    /// Checks, once per shard, that the shard's index places every inner
    /// chunk within the shard's bytes (see [`Shards`]). `key` names the
    /// shard in errors. A shard whose bytes are encoded further as a whole
    /// (a compressor after `sharding_indexed`) is not checked here: its
    /// index is only read when the shard is decoded, inside [`contained`].
    fn check_shard(&self, shard: &[u64], key: &str) -> Result<(), ZarrError> {
        let Some(shards) = &self.shards else {
            return Ok(());
        };
        let checked = || shards.checked.lock().unwrap_or_else(|e| e.into_inner());
        if checked().contains(shard) {
            return Ok(());
        }
        let err = |e: &dyn std::fmt::Display| fail(&self.path, format!("{key}: {e}"));
        let store_key = self.array.chunk_key(shard);
        let Some(size) = self
            .array
            .storage()
            .size_key(&store_key)
            .map_err(|e| err(&e))?
        else {
            // A missing shard reads as the fill value.
            return Ok(());
        };
        let inner = self
            .array
            .subchunk_shape()
            .ok_or_else(|| err(&"sharded without an inner chunk shape"))?;
        let outer = self.array.chunk_shape(shard).map_err(|e| err(&e))?;
        let grid = self.array.subchunk_grid_shape();
        // The inner chunks of this shard that hold part of the array.
        let ranges: Vec<Range<u64>> = (0..shard.len())
            .map(|d| {
                let per = outer[d].get() / inner[d].get();
                let first = shard[d].saturating_mul(per);
                first..first.saturating_add(per).min(grid[d])
            })
            .collect();
        for at in ArraySubset::new_with_ranges(&ranges).indices().iter() {
            let range = self
                .array
                .subchunk_byte_range(&shards.cache, &at)
                .map_err(|e| err(&e))?;
            let (offset, len) = match range {
                None => continue,
                Some(ByteRange::FromStart(offset, len)) => (offset, len.unwrap_or(0)),
                Some(ByteRange::Suffix(len)) => (size.saturating_sub(len), len),
            };
            if offset.checked_add(len).is_none_or(|end| end > size) {
                return Err(err(&format_args!(
                    "its index places inner chunk {at:?} at byte {offset}, {len} bytes long, \
                     past the shard's {size} bytes"
                )));
            }
        }
        // The decoded index is needed no more: memory stays bounded
        // whatever the number of shards.
        shards.cache.clear();
        checked().insert(shard.to_vec());
        Ok(())
    }
}

/// The data type as the store's metadata names it (`int32`, `<i4`).
fn type_name(array: &Array<Store>) -> String {
    let meta = serde_json::to_value(array.metadata()).unwrap_or_default();
    ["data_type", "dtype"]
        .iter()
        .find_map(|k| meta.get(*k))
        .map_or_else(
            || "unknown".to_string(),
            |v| v.to_string().trim_matches('"').to_string(),
        )
}

/// Copies a C-order box of `shape` into `out` (C order, `out_shape`) at
/// `origin`, one innermost run at a time.
fn copy_box(
    src: &[u8],
    shape: &[usize],
    out: &mut [u8],
    out_shape: &[usize; 4],
    origin: &[usize; 4],
    element: usize,
) {
    let run = shape[3] * element;
    let mut at = 0;
    for a in 0..shape[0] {
        for b in 0..shape[1] {
            for c in 0..shape[2] {
                let index =
                    ((origin[0] + a) * out_shape[1] + origin[1] + b) * out_shape[2] + origin[2] + c;
                let start = (index * out_shape[3] + origin[3]) * element;
                out[start..start + run].copy_from_slice(&src[at..at + run]);
                at += run;
            }
        }
    }
}
