//! `NAME.qem/data.zarr/`: the acquisition as a Zarr group that zarr-python
//! 2 and 3, zarrs, tensorstore, xarray and Dask open lazily.
//!
//! Zarr v3 (`zarr.json`) and v2 (`.zgroup`, `.zarray`, `.zattrs`,
//! consolidated `.zmetadata`) metadata stand side by side over one set of
//! chunk files: v3 names its chunks with the v2 key encoding (`"."`
//! separator), so a chunk is `data/I.J.0.0` for both. Chunks are
//! uncompressed little-endian bytes, so a reader needs no codec of ours.
//!
//! The group holds `data` (decoded values; calibrated float32 for scaled
//! files), `codes` (stored codes, scaled files only), `mask` (the
//! detector's valid pixels, integer files only), and one 1-D coordinate
//! array per dimension (`scan_row`, ..., in the file's calibrated units,
//! else in pixels), which xarray turns into named, calibrated coordinates.
//!
//! Chunks span the whole detector and as many scan positions as one of the
//! file's 512-scan blocks (see [`scan_chunk`]); a chunk is read straight
//! from the decoded-block cache, so it decodes only the blocks it touches
//! and keeps no copy of its own. Every chunk file's size comes from the
//! header; edge chunks are full-size, padded with the fill value (zero) as
//! the Zarr specification requires.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::content::{Bytes, Content};
use super::qem_view::QemView;
use super::{Directory, Entry, StaticDir, TreeError};
use crate::qem::{Codec, Dtype, QemFile};

/// The dimension names, in array order.
pub const DIMENSIONS: [&str; 4] = ["scan_row", "scan_column", "detector_row", "detector_column"];

/// A chunk larger than this holds fewer scan positions than a block, so
/// that a reader never needs gigabytes for one chunk of a huge detector.
const CHUNK_BYTES_LIMIT: usize = 128 << 20;

/// The scan part `[rows, columns]` of the chunk shape for a scan of
/// `rows × columns` positions stored in blocks of `block_frames` frames of
/// `frame_bytes` bytes each.
///
/// A chunk holds up to one block's frames (halved while it would exceed
/// 128 MiB): whole scan rows when a row is shorter than that, else part of
/// one row. Chunks line up with blocks when the column count divides the
/// block length (or the block length divides the column count, as for
/// 128, 256 or 512 columns); otherwise a chunk may straddle two blocks and
/// reading it decodes both.
pub fn scan_chunk(
    rows: usize,
    columns: usize,
    block_frames: usize,
    frame_bytes: usize,
) -> [usize; 2] {
    let mut frames = block_frames.max(1);
    while frames > 1 && frames.saturating_mul(frame_bytes) > CHUNK_BYTES_LIMIT {
        frames /= 2;
    }
    if columns >= frames {
        [1, frames]
    } else {
        [(frames / columns).clamp(1, rows.max(1)), columns]
    }
}

/// One array of the group: its metadata in both Zarr versions.
struct ArrayMeta {
    shape: Vec<usize>,
    chunks: Vec<usize>,
    /// Zarr v3 data type name.
    v3_type: &'static str,
    /// Zarr v2 (numpy) type string.
    v2_type: &'static str,
    fill: Value,
    dimensions: Vec<&'static str>,
    attributes: Map<String, Value>,
}

impl ArrayMeta {
    fn v3(&self) -> Value {
        let mut codec = json!({"name": "bytes"});
        if !matches!(self.v3_type, "uint8" | "bool") {
            codec["configuration"] = json!({"endian": "little"});
        }
        json!({
            "zarr_format": 3,
            "node_type": "array",
            "shape": self.shape,
            "data_type": self.v3_type,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": self.chunks}},
            "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "."}},
            "fill_value": self.fill,
            "codecs": [codec],
            "attributes": self.attributes,
            "dimension_names": self.dimensions,
        })
    }

    fn v2(&self) -> Value {
        // A null fill value: every chunk exists, and xarray would read a
        // numeric v2 fill value as a missing-value marker (zeros as NaN).
        json!({
            "zarr_format": 2,
            "shape": self.shape,
            "chunks": self.chunks,
            "dtype": self.v2_type,
            "compressor": null,
            "fill_value": null,
            "order": "C",
            "filters": null,
            "dimension_separator": ".",
        })
    }

    fn v2_attributes(&self) -> Value {
        let mut attrs = self.attributes.clone();
        attrs.insert("_ARRAY_DIMENSIONS".into(), json!(self.dimensions));
        Value::Object(attrs)
    }
}

fn pretty(v: &Value) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s.into_bytes()
}

fn file_entry(bytes: Vec<u8>) -> Entry {
    Entry::File(Arc::new(Bytes::new(bytes)))
}

/// Where a chunked array's chunk bytes come from.
enum Chunks {
    /// The 4-D array: decoded values, or stored codes.
    Dense { view: Arc<QemView>, codes: bool },
    /// A small array held whole (coordinates, the mask): one chunk.
    Whole(Arc<[u8]>),
}

/// An array directory: metadata files and chunk files made on lookup.
struct ArrayDir {
    meta: BTreeMap<String, Entry>,
    chunks: Chunks,
    shape: Vec<usize>,
    chunk_shape: Vec<usize>,
}

impl ArrayDir {
    fn grid(&self) -> Vec<usize> {
        self.shape
            .iter()
            .zip(&self.chunk_shape)
            .map(|(s, c)| s.div_ceil(*c))
            .collect()
    }

    fn chunk(&self, index: &[usize]) -> Entry {
        match &self.chunks {
            Chunks::Whole(bytes) => Entry::File(Arc::new(Bytes(Arc::clone(bytes)))),
            Chunks::Dense { view, codes } => Entry::File(Arc::new(DenseChunk {
                view: Arc::clone(view),
                codes: *codes,
                first: [
                    index[0] * self.chunk_shape[0],
                    index[1] * self.chunk_shape[1],
                ],
                shape: [self.chunk_shape[0], self.chunk_shape[1]],
            })),
        }
    }

    /// Parses a chunk key `I.J...` inside the grid.
    fn parse_key(&self, name: &str) -> Option<Vec<usize>> {
        let grid = self.grid();
        let parts: Vec<&str> = name.split('.').collect();
        if parts.len() != grid.len() {
            return None;
        }
        parts
            .iter()
            .zip(&grid)
            .map(|(p, &n)| {
                // Canonical decimal only: `01` would alias `1`.
                let canonical = !p.is_empty()
                    && p.bytes().all(|b| b.is_ascii_digit())
                    && (p.len() == 1 || !p.starts_with('0'));
                canonical
                    .then(|| p.parse::<usize>().ok())
                    .flatten()
                    .filter(|&i| i < n)
            })
            .collect()
    }
}

impl Directory for ArrayDir {
    fn lookup(&self, name: &str) -> Option<Entry> {
        if let Some(e) = self.meta.get(name) {
            return Some(e.clone());
        }
        self.parse_key(name).map(|index| self.chunk(&index))
    }

    fn list(&self) -> Vec<(String, Entry)> {
        let mut out: Vec<(String, Entry)> = self
            .meta
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let grid = self.grid();
        let count: usize = grid.iter().product();
        let mut index = vec![0usize; grid.len()];
        for _ in 0..count {
            let key = index
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(".");
            out.push((key, self.chunk(&index)));
            for d in (0..grid.len()).rev() {
                index[d] += 1;
                if index[d] < grid[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// One chunk of the 4-D array: `shape` scan positions from `first`, each
/// a whole frame, in C order; positions past the scan's edge read as zero.
struct DenseChunk {
    view: Arc<QemView>,
    codes: bool,
    first: [usize; 2],
    shape: [usize; 2],
}

impl DenseChunk {
    fn frame_bytes(&self) -> u64 {
        (self.view.file().pixels() * self.view.element_size(self.codes)) as u64
    }
}

impl Content for DenseChunk {
    fn size(&self) -> u64 {
        (self.shape[0] * self.shape[1]) as u64 * self.frame_bytes()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, TreeError> {
        let size = self.size();
        if offset >= size {
            return Ok(0);
        }
        let want = buf.len().min((size - offset) as usize);
        let [rows, columns, ..] = self.view.file().shape();
        let fb = self.frame_bytes();
        // One chunk row: `shape[1]` frames, contiguous in the source array
        // for the columns that exist.
        let run = self.shape[1] as u64 * fb;
        let present_columns = columns.saturating_sub(self.first[1]).min(self.shape[1]) as u64;
        let mut done = 0usize;
        while done < want {
            let at = offset + done as u64;
            let (local_row, within) = (at / run, at % run);
            let row = self.first[0] + local_row as usize;
            let n = (want - done).min((run - within) as usize);
            let present = if row < rows { present_columns * fb } else { 0 };
            if within < present {
                let m = n.min((present - within) as usize);
                let start = (row * columns + self.first[1]) as u64 * fb + within;
                let got = self
                    .view
                    .read_dense(start, &mut buf[done..done + m], self.codes)?;
                if got != m {
                    return Err(TreeError::Internal(format!(
                        "chunk read {got} of {m} bytes inside the array"
                    )));
                }
                done += m;
            } else {
                buf[done..done + n].fill(0);
                done += n;
            }
        }
        Ok(done)
    }
}

/// `{value, unit}` of a quantity, for attributes.
fn quantity(q: &crate::qem::Quantity) -> Value {
    json!({"value": q.value, "unit": q.unit, "provenance": q.provenance})
}

/// The group's attributes: what the array is and where it came from.
fn group_attributes(file: &QemFile, source_name: &str) -> Map<String, Value> {
    let header = &file.header().raw;
    let metadata = file.metadata();
    let mut qem = Map::new();
    qem.insert("source".into(), source_name.into());
    qem.insert("codec".into(), file.codec().id().into());
    qem.insert("stored_dtype".into(), file.stored_dtype().name().into());
    // The file's own identities: the per-64 MiB body digests, and for float
    // files the digest of the decoded array.
    for key in ["sha256", "logical_sha256"] {
        if let Some(v) = header.get(key) {
            qem.insert(key.into(), v.clone());
        }
    }
    let calibration: Map<String, Value> = metadata
        .electron_microscope
        .iter()
        .filter_map(|(path, _)| {
            metadata
                .effective(path)
                .map(|q| (path.clone(), quantity(q)))
        })
        .collect();
    qem.insert("electron_microscope".into(), Value::Object(calibration));
    if let Some(format) = &metadata.source_format {
        qem.insert("source_format".into(), format.clone().into());
    }
    qem.insert(
        "processing".into(),
        metadata
            .processing
            .iter()
            .map(|p| Value::Object(p.fields.clone()))
            .collect(),
    );
    let mut attrs = Map::new();
    attrs.insert("qem".into(), Value::Object(qem));
    attrs
}

/// A coordinate array: index × sampling, in the axis's unit when the file
/// is calibrated, in pixels otherwise.
fn coordinate(file: &QemFile, axis: usize) -> (ArrayMeta, Arc<[u8]>) {
    let size = file.shape()[axis];
    let sampling = file.metadata().effective_axis_sampling(axis);
    let (step, unit) = match sampling {
        Some(q) => (q.value, q.unit.clone()),
        None => (1.0, "pixel".to_string()),
    };
    let values: Vec<u8> = (0..size)
        .flat_map(|i| (i as f64 * step).to_le_bytes())
        .collect();
    let mut attributes = Map::new();
    attributes.insert("units".into(), unit.into());
    attributes.insert(
        "long_name".into(),
        DIMENSIONS[axis].replace('_', " ").into(),
    );
    if let Some(q) = sampling {
        attributes.insert("sampling".into(), quantity(q));
    }
    (
        ArrayMeta {
            shape: vec![size],
            chunks: vec![size.max(1)],
            v3_type: "float64",
            v2_type: "<f8",
            fill: json!(0.0),
            dimensions: vec![DIMENSIONS[axis]],
            attributes,
        },
        Arc::from(values),
    )
}

fn types(d: Dtype) -> (&'static str, &'static str, Value) {
    match d {
        Dtype::U8 => ("uint8", "|u1", json!(0)),
        Dtype::U16 => ("uint16", "<u2", json!(0)),
        Dtype::F32 => ("float32", "<f4", json!(0.0)),
    }
}

/// Builds `data.zarr/` of an opened file.
pub(super) fn directory(view: &Arc<QemView>, source_name: &str) -> Arc<dyn Directory> {
    let file = view.file();
    let shape = file.shape();
    let block_frames = file.blocks().first().map_or(1, |b| b.frames);
    let [chunk_rows, chunk_columns] = scan_chunk(
        shape[0],
        shape[1],
        block_frames,
        file.pixels() * file.decoded_dtype().size(),
    );
    let chunk_shape = vec![chunk_rows, chunk_columns, shape[2], shape[3]];

    let mut arrays: Vec<(&str, ArrayMeta, Chunks)> = Vec::new();
    let dense = |d: Dtype, codes: bool, attributes: Map<String, Value>| {
        let (v3_type, v2_type, fill) = types(d);
        (
            ArrayMeta {
                shape: shape.to_vec(),
                chunks: chunk_shape.clone(),
                v3_type,
                v2_type,
                fill,
                dimensions: DIMENSIONS.to_vec(),
                attributes,
            },
            Chunks::Dense {
                view: Arc::clone(view),
                codes,
            },
        )
    };
    let mut data_attrs = Map::new();
    let (long_name, units) = match file.codec() {
        Codec::Integer => ("electron counts", Some("counts")),
        Codec::Float => ("intensity", None),
        Codec::Scaled => ("calibrated intensity (decoded from stored codes)", None),
    };
    data_attrs.insert("long_name".into(), long_name.into());
    if let Some(u) = units {
        data_attrs.insert("units".into(), u.into());
    }
    let (meta, chunks) = dense(file.decoded_dtype(), false, data_attrs);
    arrays.push(("data", meta, chunks));
    if file.codec() == Codec::Scaled {
        let mut attrs = Map::new();
        attrs.insert(
            "long_name".into(),
            "stored uint16 codes of the scaled codec".into(),
        );
        let (meta, chunks) = dense(Dtype::U16, true, attrs);
        arrays.push(("codes", meta, chunks));
    }
    if let Some(mask) = file.valid_mask() {
        let bytes = mask.flags();
        let mut attributes = Map::new();
        attributes.insert(
            "long_name".into(),
            "valid detector pixels (false: excluded from every reduction)".into(),
        );
        arrays.push((
            "mask",
            ArrayMeta {
                shape: vec![shape[2], shape[3]],
                chunks: vec![shape[2], shape[3]],
                v3_type: "bool",
                v2_type: "|b1",
                fill: json!(false),
                dimensions: DIMENSIONS[2..].to_vec(),
                attributes,
            },
            Chunks::Whole(Arc::from(bytes)),
        ));
    }
    for (axis, name) in DIMENSIONS.iter().enumerate() {
        let (meta, values) = coordinate(file, axis);
        arrays.push((name, meta, Chunks::Whole(values)));
    }

    let group_attrs = group_attributes(file, source_name);
    let mut consolidated_v3 = Map::new();
    let mut consolidated_v2 = Map::new();
    consolidated_v2.insert(".zgroup".into(), json!({"zarr_format": 2}));
    consolidated_v2.insert(".zattrs".into(), Value::Object(group_attrs.clone()));
    let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
    for (name, meta, chunks) in arrays {
        let v3 = meta.v3();
        let v2 = meta.v2();
        let v2_attrs = meta.v2_attributes();
        consolidated_v3.insert(name.into(), v3.clone());
        consolidated_v2.insert(format!("{name}/.zarray"), v2.clone());
        consolidated_v2.insert(format!("{name}/.zattrs"), v2_attrs.clone());
        let mut files = BTreeMap::new();
        files.insert("zarr.json".to_string(), file_entry(pretty(&v3)));
        files.insert(".zarray".to_string(), file_entry(pretty(&v2)));
        files.insert(".zattrs".to_string(), file_entry(pretty(&v2_attrs)));
        entries.insert(
            name.to_string(),
            Entry::Dir(Arc::new(ArrayDir {
                meta: files,
                chunks,
                shape: meta.shape,
                chunk_shape: meta.chunks,
            })),
        );
    }
    let group = json!({
        "zarr_format": 3,
        "node_type": "group",
        "attributes": group_attrs,
        "consolidated_metadata": {
            "kind": "inline",
            "must_understand": false,
            "metadata": consolidated_v3,
        },
    });
    entries.insert("zarr.json".into(), file_entry(pretty(&group)));
    entries.insert(
        ".zgroup".into(),
        file_entry(pretty(&json!({"zarr_format": 2}))),
    );
    entries.insert(
        ".zattrs".into(),
        file_entry(pretty(&Value::Object(group_attrs))),
    );
    entries.insert(
        ".zmetadata".into(),
        file_entry(pretty(&json!({
            "metadata": consolidated_v2,
            "zarr_consolidated_format": 1,
        }))),
    );
    Arc::new(StaticDir::new(entries))
}

#[cfg(test)]
mod tests {
    use super::scan_chunk;

    #[test]
    fn chunks_follow_blocks_where_the_scan_allows() {
        let frame = 128 * 128 * 2;
        // 128 columns: four rows make one 512-scan block.
        assert_eq!(scan_chunk(128, 128, 512, frame), [4, 128]);
        // 1024 columns: half a row per block.
        assert_eq!(scan_chunk(8, 1024, 512, frame), [1, 512]);
        // 40 columns: twelve whole rows (480 scans) straddle blocks.
        assert_eq!(scan_chunk(100, 40, 512, frame), [12, 40]);
        // A scan smaller than a block is one chunk.
        assert_eq!(scan_chunk(2, 3, 6, frame), [2, 3]);
        // Huge frames: fewer positions, never more than 128 MiB a chunk.
        let big = 2048 * 2048 * 4;
        let [r, c] = scan_chunk(64, 64, 512, big);
        assert!(r * c * big <= 128 << 20 && r * c >= 1, "{r}x{c}");
        assert_eq!(scan_chunk(1, 1, 512, usize::MAX), [1, 1]);
    }
}
