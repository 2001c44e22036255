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
//! file's 512-scan blocks (see [`layout::scan_chunk`]); a chunk is read straight
//! from the decoded-block cache, so it decodes only the blocks it touches
//! and keeps no copy of its own. Every chunk file's size comes from the
//! header; edge chunks are full-size, padded with the fill value (zero) as
//! the Zarr specification requires.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::content::{copy_range, Bytes, Content, Held, Windowed};
use super::qem_view::QemView;
use super::{Directory, Entry, StaticDir, TreeError};
use crate::qem::{Codec, Dtype, QemFile};
use crate::zarr::layout::{self, DIMENSIONS};

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
    crate::export::json::pretty(v).into_bytes()
}

fn file_entry(bytes: Vec<u8>) -> Entry {
    Entry::File(Arc::new(Bytes::new(bytes)))
}

/// Where a chunked array's chunk bytes come from.
enum Chunks {
    /// The 4-D array: decoded values, or stored codes.
    Dense { view: Arc<QemView>, codes: bool },
    /// A small array held whole (the mask): one chunk.
    Whole(Arc<[u8]>),
    /// A coordinate array, one chunk made per read (never held: an axis
    /// of millions of scan rows would be a large copy per container).
    Coordinate(Arc<layout::Coordinate>),
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
            Chunks::Coordinate(c) => {
                let c = Arc::clone(c);
                Entry::File(Arc::new(Windowed::new(
                    (c.size * 8) as u64,
                    move |offset, buf: &mut [u8]| {
                        let first = (offset / 8) as usize;
                        let end = (offset + buf.len() as u64).div_ceil(8) as usize;
                        let bytes = c.le_bytes(first..end.min(c.size));
                        copy_range(&bytes, offset % 8, buf);
                        Ok(())
                    },
                )))
            }
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

    /// A chunk is read once, whole, by a Zarr client: its bytes go from
    /// the cached window straight into the reader's buffer.
    fn direct_io(&self) -> bool {
        true
    }

    fn held_at(&self, offset: u64, len: usize) -> Result<Option<Held>, TreeError> {
        let [rows, columns, ..] = self.view.file().shape();
        let fb = self.frame_bytes();
        let run = self.shape[1] as u64 * fb;
        let (local_row, within) = (offset / run, offset % run);
        let row = self.first[0] + local_row as usize;
        if row >= rows {
            return Ok(None);
        }
        // The bytes must exist in the array and be contiguous there: inside
        // one chunk row, or across rows when the chunk spans whole scan
        // rows. A chunk of whole blocks then reads straight from their
        // cached windows.
        let contiguous = if self.first[1] == 0 && self.shape[1] == columns {
            rows.saturating_sub(row) as u64 * run - within
        } else {
            let present = columns.saturating_sub(self.first[1]).min(self.shape[1]) as u64;
            (present * fb).saturating_sub(within)
        };
        if len as u64 > contiguous {
            return Ok(None);
        }
        let start = (row * columns + self.first[1]) as u64 * fb + within;
        self.view.held_dense(start, len, self.codes)
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

/// A coordinate array and its one chunk.
fn coordinate(file: &QemFile, axis: usize) -> (ArrayMeta, Chunks) {
    let c = layout::coordinate(file, axis);
    let size = c.size;
    let attributes = c.attributes.clone();
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
        Chunks::Coordinate(Arc::new(c)),
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
    let chunk_shape = layout::chunk_shape(file).to_vec();

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
    let (meta, chunks) = dense(
        file.decoded_dtype(),
        false,
        layout::data_attributes(file.codec()),
    );
    arrays.push(("data", meta, chunks));
    if file.codec() == Codec::Scaled {
        let (meta, chunks) = dense(Dtype::U16, true, layout::codes_attributes());
        arrays.push(("codes", meta, chunks));
    }
    if let Some(bytes) = layout::mask_bytes(file) {
        arrays.push((
            "mask",
            ArrayMeta {
                shape: vec![shape[2], shape[3]],
                chunks: vec![shape[2], shape[3]],
                v3_type: "bool",
                v2_type: "|b1",
                fill: json!(false),
                dimensions: DIMENSIONS[2..].to_vec(),
                attributes: layout::mask_attributes(),
            },
            Chunks::Whole(Arc::from(bytes)),
        ));
    }
    for (axis, name) in DIMENSIONS.iter().enumerate() {
        let (meta, chunks) = coordinate(file, axis);
        arrays.push((name, meta, chunks));
    }

    let mut group_attrs = layout::group_attributes(file, source_name);
    if let Some(Value::Object(qem)) = group_attrs.get_mut("qem") {
        // Both digests take a whole read; the container's files compute
        // them when first read (paths relative to this store).
        qem.insert(
            "identity_files".into(),
            json!({"file_sha256": "../sha256", "logical_sha256": "../logical_sha256"}),
        );
    }
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
