//! Validation in two levels and the report behind `qem validate` and
//! `qem show --json`.
//!
//! `Quick`: envelope, header, metadata, chunk coverage and bounds (all done
//! at open), every body checksum block, and the structure of every stream
//! table and spatial index (no entropy decoding). `Full`: quick, then every
//! stream decoded (exact end, value range), float `logical_sha256`, and the
//! spatial index compared with sums of decoded valid counts.

use std::path::Path;

use serde::Serialize;

use super::error::Result;
use super::file::QemFile;
use super::header::Codec;
use super::metadata::Schema;
use super::QemError;

/// How much to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ValidationLevel {
    Quick,
    Full,
}

/// What was checked and what the file holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ValidationReport {
    pub level: ValidationLevel,
    pub container_version: u32,
    pub codec: &'static str,
    /// Header `dtype`.
    pub stored_dtype: &'static str,
    /// Element type of the decoded array.
    pub decoded_dtype: &'static str,
    pub shape: [usize; 4],
    pub frames: usize,
    pub pixels: usize,
    pub chunks: usize,
    /// `[first, scans]` of every chunk.
    pub chunk_table: Vec<[usize; 2]>,
    /// Decoded blocks (512-scan blocks; float: chunks).
    pub blocks: usize,
    pub streams: usize,
    pub model_selectors: Vec<u8>,
    pub file_bytes: usize,
    pub header_bytes: usize,
    pub body_bytes: usize,
    pub checksum_blocks: usize,
    /// Size of the decoded dense array (`None` if not addressable).
    pub decoded_bytes: Option<usize>,
    /// Decoded bytes per file byte.
    pub compression_ratio: Option<f64>,
    pub invalid_pixels: Option<usize>,
    pub metadata_schema: &'static str,
    pub metadata_coverage: String,
    pub processing: Vec<String>,
    pub measurements_changed_by: Vec<String>,
    pub calibrated_axes: Vec<&'static str>,
    pub override_fields: Vec<String>,
    pub calibration_regions: Option<usize>,
    /// Every body checksum block verified.
    pub integrity: bool,
    /// Every stream decoded to its exact end.
    pub decoded: bool,
    /// Float: decoded bytes match `logical_sha256`.
    pub logical_sha256_verified: Option<bool>,
    /// Integer: index equals sums of decoded valid counts.
    pub spatial_index_verified: Option<bool>,
}

impl QemFile {
    /// Validates an opened file; the first failure is returned as the error.
    pub fn validate(&self, level: ValidationLevel) -> Result<ValidationReport> {
        let full = level == ValidationLevel::Full;
        // The verdict is the sequential one: a checksum failure first,
        // then the structure checks, then the decoding.
        let checks = |file: &QemFile| -> Result<()> {
            file.check_structure()?;
            if full {
                file.check_decode()?;
            }
            Ok(())
        };
        if full {
            self.beside_checksums(checks)??;
        } else {
            checks(self)?;
        }
        let md = self.metadata();
        let decoded_bytes = self.dense_bytes();
        let per_block = match self.codec() {
            Codec::Float => 2 * self.pixels(),
            _ => self.pixels(),
        };
        let streams = self.blocks().len() * per_block;
        Ok(ValidationReport {
            level,
            container_version: 1,
            codec: self.codec().id(),
            stored_dtype: self.stored_dtype().name(),
            decoded_dtype: self.decoded_dtype().name(),
            shape: self.shape(),
            frames: self.frames(),
            pixels: self.pixels(),
            chunks: self.chunks().len(),
            chunk_table: self.chunks().iter().map(|c| [c.first, c.scans]).collect(),
            blocks: self.blocks().len(),
            streams,
            model_selectors: self.selectors_present()?,
            file_bytes: self.file_bytes(),
            header_bytes: self.header_bytes(),
            body_bytes: self.body_bytes(),
            checksum_blocks: self.checksum_blocks(),
            decoded_bytes,
            compression_ratio: decoded_bytes.map(|d| d as f64 / self.file_bytes() as f64),
            invalid_pixels: self.valid_mask().map(|v| v.invalid_count()),
            metadata_schema: match md.schema {
                Schema::V1 => super::metadata::SCHEMA_1,
                Schema::V2 => super::metadata::SCHEMA_2,
            },
            metadata_coverage: md.source_metadata_coverage.clone(),
            processing: md.processing.iter().map(|r| r.operation.clone()).collect(),
            measurements_changed_by: md
                .measurements_changed_by()
                .into_iter()
                .map(String::from)
                .collect(),
            calibrated_axes: md
                .axes
                .iter()
                .filter(|a| a.sampling.is_some())
                .map(|a| a.name)
                .collect(),
            override_fields: md
                .calibration_overrides
                .iter()
                .map(|(p, _)| p.clone())
                .collect(),
            calibration_regions: self.calibration().map(|c| c.regions.len()),
            integrity: true,
            decoded: full,
            logical_sha256_verified: (full && self.codec() == Codec::Float).then_some(true),
            spatial_index_verified: (full && self.codec() == Codec::Integer).then_some(true),
        })
    }
}

/// The identity of a file on disk, compared before and after validation.
fn identity(path: &Path) -> Option<(u64, u64, u64, Option<std::time::SystemTime>)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.len(), m.modified().ok()))
}

/// Opens and validates `path`. A file replaced, resized or touched while it
/// was being validated (or truncated under the map, see
/// [`crate::mapguard`]) fails with [`QemError::Changed`] whatever else was
/// found: its verdict would describe no stable file (§10 step 17).
pub fn validate_path(path: impl AsRef<Path>, level: ValidationLevel) -> Result<ValidationReport> {
    let path = path.as_ref();
    let before = identity(path);
    let faults = crate::mapguard::faults();
    let verdict = QemFile::open(path).and_then(|f| f.validate(level));
    if before.is_some() && (identity(path) != before || crate::mapguard::faults() != faults) {
        return Err(QemError::Changed);
    }
    verdict
}

/// Validates a file held in memory.
pub fn validate_bytes(bytes: Vec<u8>, level: ValidationLevel) -> Result<ValidationReport> {
    QemFile::from_bytes(bytes)?.validate(level)
}
