//! What a Zarr rendering of a `.qem` file holds, wherever it is written:
//! the mount's `data.zarr` view and `qem convert X.qem X.zarr` use these
//! same rules, so xarray sees the same dataset from both.

use serde_json::{json, Map, Value};

use crate::qem::{Codec, QemFile, Quantity};

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
        [(frames / columns.max(1)).clamp(1, rows.max(1)), columns]
    }
}

/// The 4-D chunk shape of `file`'s arrays: [`scan_chunk`] and the whole
/// detector.
pub fn chunk_shape(file: &QemFile) -> [usize; 4] {
    let shape = file.shape();
    let block_frames = file.blocks().first().map_or(1, |b| b.frames);
    let [rows, columns] = scan_chunk(
        shape[0],
        shape[1],
        block_frames,
        file.pixels() * file.decoded_dtype().size(),
    );
    [rows, columns, shape[2], shape[3]]
}

/// `{value, unit, provenance}` of a quantity, for attributes.
fn quantity(q: &Quantity) -> Value {
    json!({"value": q.value, "unit": q.unit, "provenance": q.provenance})
}

/// The group's attributes: what the array is and where it came from,
/// under one `qem` member.
pub fn group_attributes(file: &QemFile, source_name: &str) -> Map<String, Value> {
    let header = file.header();
    let metadata = file.metadata();
    let mut qem = Map::new();
    qem.insert("source".into(), source_name.into());
    qem.insert("codec".into(), file.codec().id().into());
    qem.insert("stored_dtype".into(), file.stored_dtype().name().into());
    // The identities the header holds: the digests of the body's 64 MiB
    // pieces, and for float files the digest of the decoded array. A
    // written store adds the file's digest and every codec's array digest
    // (`super::identity`); the mount's view cannot without reading the
    // whole file to open `zarr.json`, and points to its files instead.
    qem.insert("body_sha256".into(), json!(header.sha256));
    if let Some(digest) = &header.logical_sha256 {
        qem.insert("logical_sha256".into(), digest.as_str().into());
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

fn named(long_name: &str, units: Option<&str>) -> Map<String, Value> {
    let mut attrs = Map::new();
    attrs.insert("long_name".into(), long_name.into());
    if let Some(u) = units {
        attrs.insert("units".into(), u.into());
    }
    attrs
}

/// Attributes of the `data` array.
pub fn data_attributes(codec: Codec) -> Map<String, Value> {
    match codec {
        Codec::Integer => named("electron counts", Some("counts")),
        Codec::Float => named("intensity", None),
        Codec::Scaled => named("calibrated intensity (decoded from stored codes)", None),
    }
}

/// Attributes of the `codes` array (scaled files).
pub fn codes_attributes() -> Map<String, Value> {
    named("stored uint16 codes of the scaled codec", None)
}

/// Attributes of the `mask` array.
pub fn mask_attributes() -> Map<String, Value> {
    named(
        "valid detector pixels (false: excluded from every reduction)",
        None,
    )
}

/// The valid mask as one byte (0 or 1) per detector pixel, for files whose
/// codec has one.
pub fn mask_bytes(file: &QemFile) -> Option<Vec<u8>> {
    Some(file.valid_mask()?.flags())
}

/// A coordinate array of one dimension: `size` values `i × step`, made
/// when asked for (an axis of 16.7 M scan rows is 134 MB of them).
pub struct Coordinate {
    pub size: usize,
    pub step: f64,
    pub attributes: Map<String, Value>,
}

impl Coordinate {
    /// Little-endian float64 bytes of values `range`.
    pub fn le_bytes(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        range
            .flat_map(|i| (i as f64 * self.step).to_le_bytes())
            .collect()
    }
}

/// Index × sampling along `axis`, in the axis's unit when the file is
/// calibrated, in pixels otherwise (xarray reads `units`).
pub fn coordinate(file: &QemFile, axis: usize) -> Coordinate {
    let size = file.shape()[axis];
    let sampling = file.metadata().effective_axis_sampling(axis);
    let (step, unit) = match sampling {
        Some(q) => (q.value, q.unit.clone()),
        None => (1.0, "pixel".to_string()),
    };
    let mut attributes = Map::new();
    attributes.insert("units".into(), unit.into());
    attributes.insert(
        "long_name".into(),
        DIMENSIONS[axis].replace('_', " ").into(),
    );
    if let Some(q) = sampling {
        attributes.insert("sampling".into(), quantity(q));
    }
    Coordinate {
        size,
        step,
        attributes,
    }
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
