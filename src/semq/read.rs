//! Reading an image: validation in the exact order of spec section 4.

use std::io::Read;
use std::path::Path;

use super::config::{Config, CONFIG_LEN};
use super::encoding::{
    read_u64, Encoding, Image, Layout, CONTENT_START, FOOTER_LEN, HEADER_LEN, MAGIC, MIN_IMAGE_LEN,
};
use super::error::{Result, Section, SemqError, Which};
use super::identity::{self, ContentHasher, Digest32};
use super::ids::{is_valid_text, IdKind, MAX_UTF8_ID_LEN};
use super::manifest::{Manifest, MAX_SECTION_LEN};
use super::rows;

use rayon::prelude::*;

/// Files below this size are read into memory; larger ones are mapped.
const MAP_THRESHOLD: u64 = 1 << 20;

/// A progress callback: (work done, total work), called from any thread.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Sync);

/// Bytes hashed between two progress reports.
const PROGRESS_STEP: usize = 64 << 20;

/// The content digest of S, in steps so that progress can be reported.
fn hash_content(s: &[u8], progress: Progress<'_>) -> Digest32 {
    let total = s.len() as u64;
    let mut hasher = ContentHasher::new();
    let mut done = 0u64;
    for chunk in s.chunks(PROGRESS_STEP) {
        hasher.update(chunk);
        done += chunk.len() as u64;
        progress(done, total);
    }
    hasher.finish()
}

impl Encoding {
    /// Reads and fully verifies a file. Large files are memory-mapped and
    /// their rows are never copied.
    ///
    /// The mapping assumes the file is not modified while the Encoding is
    /// alive (as every mmap-based reader does); a concurrent writer could
    /// change bytes after they were verified.
    pub fn open(path: impl AsRef<Path>) -> Result<Encoding> {
        Encoding::open_with_progress(path, &|_, _| {})
    }

    /// [`Encoding::open`], reporting verification progress as (bytes
    /// hashed, bytes to hash) from time to time (for a progress bar).
    pub fn open_with_progress(path: impl AsRef<Path>, progress: Progress<'_>) -> Result<Encoding> {
        let path = path.as_ref();
        let io = |source| SemqError::Io {
            path: path.to_path_buf(),
            source,
        };
        // A state is verified whole before any of it is shown: a remote
        // one is staged whole, then mapped as a local file is.
        if let Some(address) = crate::remote::Address::of_path(path) {
            let remote = |e: crate::remote::RemoteError| io(e.into_io());
            let staged = crate::remote::Staged::open(&address.map_err(remote)?).map_err(remote)?;
            staged.ensure_all().map_err(remote)?;
            let map = crate::mapguard::Mapping::map(staged.file()).map_err(io)?;
            framing(&map)?;
            return verified(Image::Mapped(map), progress);
        }
        let mut file = crate::regular_file::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < MAP_THRESHOLD {
            // len is below the threshold, so reserving it is bounded.
            let mut bytes = Vec::with_capacity(len as usize);
            file.read_to_end(&mut bytes).map_err(io)?;
            return verified(Image::Owned(bytes), progress);
        }
        // A truncation while mapped faults on access, which `mapguard`
        // (when installed) absorbs and charges to this mapping.
        let map = match crate::mapguard::Mapping::map(&file) {
            Ok(map) => map,
            // Some filesystems cannot map: read the (regular) file instead.
            Err(_) => {
                let mut bytes = Vec::new();
                file.read_to_end(&mut bytes).map_err(io)?;
                return verified(Image::Owned(bytes), progress);
            }
        };
        // The framing, config and declared sizes read only the first
        // pages: a file of the wrong size or kind fails here, before the
        // whole of it is read in.
        framing(&map)?;
        map.will_need();
        verified(Image::Mapped(map), progress)
    }

    /// Verifies an image held in memory and takes ownership of it.
    pub fn from_vec(bytes: Vec<u8>) -> Result<Encoding> {
        verified(Image::Owned(bytes), &|_, _| {})
    }

    /// Verifies an image given as a slice (for tests and fuzzing). The
    /// slice is validated before anything is copied.
    pub fn from_slice(bytes: &[u8]) -> Result<Encoding> {
        let (layout, manifest, content, state) = validate(bytes, &|_, _| {})?;
        Ok(Encoding::from_parts(
            Image::Owned(bytes.to_vec()),
            layout,
            manifest,
            content,
            state,
        ))
    }
}

/// Verifies `image` (spec §4) and makes it the Encoding's own.
fn verified(image: Image, progress: Progress<'_>) -> Result<Encoding> {
    let (layout, manifest, content, state) = validate(image.bytes(), progress)?;
    Ok(Encoding::from_parts(
        image, layout, manifest, content, state,
    ))
}

fn fail(section: Section, message: &str) -> SemqError {
    SemqError::format(section, message)
}

/// Steps 1-3 of validation (framing, config, declared sizes against the
/// buffer's length), which read only the first bytes of the image and its
/// id offsets' last entry.
fn framing(buf: &[u8]) -> Result<Layout> {
    // 1. Framing.
    if buf.len() < MIN_IMAGE_LEN {
        return Err(fail(
            Section::Framing,
            "buffer is shorter than the smallest image",
        ));
    }
    if &buf[0..4] != MAGIC {
        return Err(fail(Section::Framing, "magic bytes are not SEMQ"));
    }
    match u16::from_le_bytes([buf[4], buf[5]]) {
        2 => {}
        1 => return Err(fail(Section::Framing, "unsupported version 1")),
        _ => return Err(fail(Section::Framing, "unsupported file version")),
    }

    // 2. Config.
    let mut config_bytes = [0u8; CONFIG_LEN];
    config_bytes.copy_from_slice(&buf[6..6 + CONFIG_LEN]);
    let config = Config::from_bytes(&config_bytes).map_err(|f| f.into_format_error())?;

    // 3. Sizes, in overflow-checked u64 arithmetic.
    sizes(buf, config)
}

/// Checks every rule of spec section 4 and returns where the sections
/// are. The content digest is computed on one core while ids, manifest
/// and rows are checked on the other; the first failure in spec order is
/// reported, so the parallelism never changes the outcome.
pub(crate) fn validate(
    buf: &[u8],
    progress: Progress<'_>,
) -> Result<(Layout, Manifest, Digest32, Digest32)> {
    // 1-3. Framing, config, sizes.
    let layout = framing(buf)?;
    let config = layout.config;
    let ids = &buf[layout.ids.clone()];
    let rows_section = &buf[layout.rows.clone()];
    let manifest_section = &buf[layout.manifest.clone()];

    let (content, checks) = rayon::join(
        || hash_content(&buf[CONTENT_START..layout.rows.end], progress),
        || {
            // 4. Ids, then 5. manifest, then (after the digests) 7. rows.
            check_ids(ids, &layout)?;
            let manifest = Manifest::parse_section(manifest_section)
                .map_err(|m| fail(Section::Manifest, m))?;
            let first_bad_row = first_non_canonical_row(&config, rows_section);
            Ok::<_, SemqError>((manifest, first_bad_row))
        },
    );
    let (manifest, first_bad_row) = checks?;

    // 6. Identities.
    let footer = &buf[buf.len() - FOOTER_LEN..];
    // Fuzzing builds (`cargo fuzz`, `--cfg fuzzing`) accept any footer so
    // that mutated images reach the readers behind the digests.
    if content[..] != footer[..32] && !cfg!(fuzzing) {
        return Err(SemqError::Integrity {
            which: Which::Content,
        });
    }
    let state = identity::state_id(&content, manifest_section);
    if state[..] != footer[32..] && !cfg!(fuzzing) {
        return Err(SemqError::Integrity {
            which: Which::State,
        });
    }

    // 7. Rows.
    if let Some(row) = first_bad_row {
        return Err(SemqError::Format {
            section: Section::Rows,
            row: Some(row as u64),
            message: "row is not canonical".into(),
        });
    }
    Ok((layout, manifest, content, state))
}

fn sizes(buf: &[u8], config: Config) -> Result<Layout> {
    let err = |m: &str| fail(Section::Sizes, m);
    let Some(id_kind) = IdKind::from_byte(buf[19]) else {
        return Err(err("unknown id kind"));
    };
    let n = read_u64(buf, 20).ok_or_else(|| err("header is truncated"))?;
    let len = buf.len() as u64;
    let body = len - (HEADER_LEN + FOOTER_LEN) as u64;
    let rows_len = n
        .checked_mul(config.bytes_per_vector() as u64)
        .ok_or_else(|| err("row section overflows"))?;
    let ids_len = match id_kind {
        IdKind::U64 => n
            .checked_mul(8)
            .ok_or_else(|| err("id section overflows"))?,
        IdKind::Utf8 => {
            let off_bytes = n
                .checked_add(1)
                .and_then(|m| m.checked_mul(8))
                .ok_or_else(|| err("id section overflows"))?;
            if off_bytes > body {
                return Err(err("sections exceed the buffer"));
            }
            // off_bytes ≤ body < len, so the last offset lies in the buffer.
            let total = read_u64(buf, HEADER_LEN + 8 * n as usize)
                .ok_or_else(|| err("sections exceed the buffer"))?;
            off_bytes
                .checked_add(total)
                .ok_or_else(|| err("id section overflows"))?
        }
    };
    let used = ids_len
        .checked_add(rows_len)
        .ok_or_else(|| err("sections exceed the buffer"))?;
    if used > body {
        return Err(err("sections exceed the buffer"));
    }
    let manifest_len = body - used;
    if manifest_len < 4 {
        return Err(err("manifest section is missing"));
    }
    if manifest_len > MAX_SECTION_LEN as u64 {
        return Err(err("manifest section exceeds 16 MiB"));
    }
    // Every quantity is now bounded by the buffer length, so fits usize.
    let ids_end = HEADER_LEN + ids_len as usize;
    let rows_end = ids_end + rows_len as usize;
    Ok(Layout {
        config,
        id_kind,
        n: n as usize,
        ids: HEADER_LEN..ids_end,
        rows: ids_end..rows_end,
        manifest: rows_end..rows_end + manifest_len as usize,
    })
}

fn check_ids(ids: &[u8], layout: &Layout) -> Result<()> {
    let err = |m: &str| fail(Section::Ids, m);
    let n = layout.n;
    match layout.id_kind {
        IdKind::U64 => {
            let mut prev: Option<u64> = None;
            for chunk in ids.chunks_exact(8) {
                let mut a = [0u8; 8];
                a.copy_from_slice(chunk);
                let id = u64::from_le_bytes(a);
                if prev.is_some_and(|p| id <= p) {
                    return Err(err("u64 ids are not strictly increasing"));
                }
                prev = Some(id);
            }
            Ok(())
        }
        IdKind::Utf8 => {
            let off_bytes = 8 * (n + 1);
            let (offsets, data) = ids.split_at(off_bytes.min(ids.len()));
            let offset = |i: usize| read_u64(offsets, 8 * i).unwrap_or(u64::MAX);
            let total = offset(n);
            if offset(0) != 0 {
                return Err(err("utf8 offsets must start at 0"));
            }
            let mut prev: &[u8] = &[];
            for i in 0..n {
                let (a, b) = (offset(i), offset(i + 1));
                if b <= a || b > total {
                    return Err(err("utf8 offsets are not strictly increasing"));
                }
                if b - a > MAX_UTF8_ID_LEN as u64 {
                    return Err(err("utf8 id exceeds 4096 bytes"));
                }
                // a < b ≤ total = data.len() (sizes), so the range is in bounds.
                let id = data
                    .get(a as usize..b as usize)
                    .ok_or_else(|| err("utf8 offsets are not strictly increasing"))?;
                if !is_valid_text(id) {
                    return Err(err("utf8 id is not valid UTF-8"));
                }
                if i > 0 && id <= prev {
                    return Err(err("utf8 ids are not strictly increasing"));
                }
                prev = id;
            }
            Ok(())
        }
    }
}

/// Index of the first non-canonical row, checking rows in parallel only
/// when the config can have non-canonical rows at all.
fn first_non_canonical_row(config: &Config, rows_section: &[u8]) -> Option<usize> {
    let bpv = config.bytes_per_vector();
    if !rows::can_be_non_canonical(config) || bpv == 0 {
        return None;
    }
    rows_section
        .par_chunks(bpv)
        .with_min_len(4096)
        .position_first(|row| rows::check_canonical(config, row).is_err())
}
