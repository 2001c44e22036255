//! The Encoding: one validated state, held as its canonical file image.
//!
//! Because the file bytes are a pure function of the state (spec 5), the
//! image is the representation: reading maps it without copying rows,
//! writing stores it as it is, and every accessor reads from it.

use std::ops::Range;
use std::sync::Arc;

use super::config::{Config, CONFIG_LEN};
use super::error::{Result, SemqError};
use super::identity::{self, Digest32};
use super::ids::{IdKind, IdRef};
use super::manifest::Manifest;
use super::rows;

pub const MAGIC: &[u8; 4] = b"SEMQ";
pub const VERSION: u16 = 2;
/// Magic, version, config, id kind and n.
pub const HEADER_LEN: usize = 28;
pub const FOOTER_LEN: usize = 64;
/// An empty u64 Encoding with an empty manifest.
pub const MIN_IMAGE_LEN: usize = HEADER_LEN + 4 + FOOTER_LEN;
/// Where S (the content digest input) starts.
pub(crate) const CONTENT_START: usize = 4 + 2;

pub(crate) enum Image {
    Owned(Vec<u8>),
    Mapped(crate::mapguard::Mapping),
}

impl Image {
    fn faults(&self) -> u64 {
        match self {
            Image::Owned(_) => 0,
            Image::Mapped(m) => m.faults(),
        }
    }

    fn release_pages(&self) {
        if let Image::Mapped(m) = self {
            m.release_pages();
        }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Image::Owned(v) => v,
            Image::Mapped(m) => m,
        }
    }
}

/// Offsets of the sections inside a validated image.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub config: Config,
    pub id_kind: IdKind,
    pub n: usize,
    pub ids: Range<usize>,
    pub rows: Range<usize>,
    pub manifest: Range<usize>,
}

struct Inner {
    image: Image,
    layout: Layout,
    manifest: Manifest,
    content_digest: Digest32,
    state_id: Digest32,
}

/// One state: config, id kind, sorted ids with one canonical row each,
/// manifest and the two digests. Cheap to clone (shared image).
#[derive(Clone)]
pub struct Encoding {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Encoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoding")
            .field("config", &self.config())
            .field("id_kind", &self.id_kind())
            .field("n", &self.len())
            .field("state_id", &identity::to_hex(self.state_id()))
            .finish()
    }
}

/// Two Encodings are equal iff their state ids are equal.
impl PartialEq for Encoding {
    fn eq(&self, other: &Self) -> bool {
        self.state_id() == other.state_id()
    }
}

impl Eq for Encoding {}

impl Encoding {
    pub(crate) fn from_parts(
        image: Image,
        layout: Layout,
        manifest: Manifest,
        content_digest: Digest32,
        state_id: Digest32,
    ) -> Encoding {
        Encoding {
            inner: Arc::new(Inner {
                image,
                layout,
                manifest,
                content_digest,
                state_id,
            }),
        }
    }

    fn bytes(&self) -> &[u8] {
        self.inner.image.bytes()
    }

    fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    pub fn config(&self) -> Config {
        self.layout().config
    }

    pub fn id_kind(&self) -> IdKind {
        self.layout().id_kind
    }

    /// Number of rows (= ids).
    pub fn len(&self) -> usize {
        self.layout().n
    }

    pub fn is_empty(&self) -> bool {
        self.layout().n == 0
    }

    pub fn content_digest(&self) -> &Digest32 {
        &self.inner.content_digest
    }

    pub fn state_id(&self) -> &Digest32 {
        &self.inner.state_id
    }

    pub fn manifest(&self) -> &Manifest {
        &self.inner.manifest
    }

    /// The manifest section exactly as stored.
    pub fn manifest_section(&self) -> &[u8] {
        self.bytes()
            .get(self.layout().manifest.clone())
            .unwrap_or(&[])
    }

    /// The complete file image (what [`Encoding::write`] stores).
    /// SIGBUS faults absorbed in this state's mapping (see
    /// [`crate::mapguard`]).
    pub fn faults(&self) -> u64 {
        self.inner.image.faults()
    }

    /// Lets go of the mapped file's pages this process has read
    /// ([`crate::mapguard::Mapping::release_pages`]); nothing for an image
    /// held in memory.
    pub fn release_mapped_pages(&self) {
        self.inner.image.release_pages();
    }

    /// Whether the mapped file changed since it was read: a fault, or a
    /// file now shorter than its mapping (see [`crate::mapguard`]).
    pub fn changed(&self) -> bool {
        self.faults() != 0
    }

    pub fn image(&self) -> &[u8] {
        self.bytes()
    }

    /// The rows section: len() rows of bytes_per_vector bytes, in id order.
    pub fn rows_section(&self) -> &[u8] {
        self.bytes().get(self.layout().rows.clone()).unwrap_or(&[])
    }

    /// The packed row at sorted index `i`.
    pub fn row(&self, i: usize) -> Option<&[u8]> {
        let bpv = self.config().bytes_per_vector();
        let start = i.checked_mul(bpv)?;
        self.rows_section().get(start..start.checked_add(bpv)?)
    }

    /// The u64 id at sorted index `i` (None for utf8 Encodings).
    pub fn u64_id(&self, i: usize) -> Option<u64> {
        if self.id_kind() != IdKind::U64 || i >= self.len() {
            return None;
        }
        let at = self.layout().ids.start + 8 * i;
        read_u64(self.bytes(), at)
    }

    /// The raw bytes of the utf8 id at sorted index `i`.
    pub fn utf8_id_bytes(&self, i: usize) -> Option<&[u8]> {
        if self.id_kind() != IdKind::Utf8 || i >= self.len() {
            return None;
        }
        let ids = &self.layout().ids;
        let bytes = self.bytes();
        let a = read_u64(bytes, ids.start + 8 * i)?;
        let b = read_u64(bytes, ids.start + 8 * (i + 1))?;
        let data = ids.start + 8 * (self.len() + 1);
        let a = data.checked_add(usize::try_from(a).ok()?)?;
        let b = data.checked_add(usize::try_from(b).ok()?)?;
        bytes.get(a..b)
    }

    /// The id at sorted index `i`.
    pub fn id(&self, i: usize) -> Option<IdRef<'_>> {
        match self.id_kind() {
            IdKind::U64 => self.u64_id(i).map(IdRef::U64),
            IdKind::Utf8 => self
                .utf8_id_bytes(i)
                .and_then(|b| std::str::from_utf8(b).ok())
                .map(IdRef::Utf8),
        }
    }

    /// All ids in sorted order.
    pub fn ids(&self) -> impl ExactSizeIterator<Item = IdRef<'_>> + '_ {
        (0..self.len()).map(move |i| self.id(i).unwrap_or(IdRef::U64(0)))
    }

    /// Sorted index of `id` (binary search), None when absent or of the
    /// other kind.
    pub fn find(&self, id: IdRef<'_>) -> Option<usize> {
        if id.kind() != self.id_kind() {
            return None;
        }
        let (mut lo, mut hi) = (0usize, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.id(mid)?.cmp(&id) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// The row of `id`, when present.
    pub fn get(&self, id: IdRef<'_>) -> Option<&[u8]> {
        self.find(id).and_then(|i| self.row(i))
    }

    /// Symbols of the row at sorted index `i`, one byte per unit.
    pub fn symbols(&self, i: usize) -> Option<Vec<u8>> {
        let row = self.row(i)?;
        let config = self.config();
        let mut out = vec![0u8; config.units_per_row()];
        rows::unpack(&config, row, &mut out);
        Some(out)
    }

    /// unpack: n × units_per_row symbols in sorted id order.
    pub fn unpack(&self) -> Vec<u8> {
        let config = self.config();
        let units = config.units_per_row();
        let mut out = vec![0u8; self.len() * units];
        if units > 0 {
            for (row, dst) in self
                .rows_section()
                .chunks_exact(config.bytes_per_vector())
                .zip(out.chunks_exact_mut(units))
            {
                rows::unpack(&config, row, dst);
            }
        }
        out
    }

    /// The identity-relevant header bytes of this state (config ‖ kind ‖ n).
    pub(crate) fn header_bytes(config: &Config, kind: IdKind, n: u64) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(MAGIC);
        h[4..6].copy_from_slice(&VERSION.to_le_bytes());
        h[6..6 + CONFIG_LEN].copy_from_slice(&config.to_bytes());
        h[19] = kind as u8;
        h[20..28].copy_from_slice(&n.to_le_bytes());
        h
    }
}

pub(crate) fn read_u64(buf: &[u8], at: usize) -> Option<u64> {
    let b = buf.get(at..at.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Some(u64::from_le_bytes(a))
}

/// Assembles the image of a state from its parts. The caller supplies
/// ids and rows that are already sorted, canonical and unique.
pub(crate) struct ImageBuilder {
    image: Vec<u8>,
    layout: Layout,
    manifest: Manifest,
}

impl ImageBuilder {
    /// `id_bytes_total` is the number of utf8 id bytes (0 for u64 ids).
    pub(crate) fn new(
        config: Config,
        kind: IdKind,
        n: usize,
        id_bytes_total: usize,
        manifest: Manifest,
    ) -> Result<ImageBuilder> {
        let too_large = || SemqError::invalid("the Encoding is too large for this host");
        let ids_len = match kind {
            IdKind::U64 => n.checked_mul(8),
            IdKind::Utf8 => n
                .checked_add(1)
                .and_then(|m| m.checked_mul(8))
                .and_then(|o| o.checked_add(id_bytes_total)),
        }
        .ok_or_else(too_large)?;
        let rows_len = n
            .checked_mul(config.bytes_per_vector())
            .ok_or_else(too_large)?;
        let ids = HEADER_LEN..HEADER_LEN.checked_add(ids_len).ok_or_else(too_large)?;
        let rows = ids.end..ids.end.checked_add(rows_len).ok_or_else(too_large)?;
        let man_range = rows.end
            ..rows
                .end
                .checked_add(manifest.section_len())
                .ok_or_else(too_large)?;
        let total = man_range
            .end
            .checked_add(FOOTER_LEN)
            .ok_or_else(too_large)?;
        let mut image = vec![0u8; total];
        image[..HEADER_LEN].copy_from_slice(&Encoding::header_bytes(&config, kind, n as u64));
        let mut section = Vec::with_capacity(manifest.section_len());
        manifest.write_section(&mut section);
        image[man_range.clone()].copy_from_slice(&section);
        Ok(ImageBuilder {
            image,
            layout: Layout {
                config,
                id_kind: kind,
                n,
                ids,
                rows,
                manifest: man_range,
            },
            manifest,
        })
    }

    pub(crate) fn ids_mut(&mut self) -> &mut [u8] {
        &mut self.image[self.layout.ids.clone()]
    }

    pub(crate) fn rows_mut(&mut self) -> &mut [u8] {
        &mut self.image[self.layout.rows.clone()]
    }

    /// The content-digest input before the rows (config ‖ kind ‖ n ‖ ids)
    /// and the rows region, borrowed together so that rows can be hashed
    /// while later rows are still being written.
    pub(crate) fn content_parts_mut(&mut self) -> (&[u8], &mut [u8]) {
        let rows = self.layout.rows.clone();
        let (head, tail) = self.image.split_at_mut(rows.start);
        (&head[CONTENT_START..], &mut tail[..rows.len()])
    }

    /// Computes both digests, writes the footer and returns the state.
    pub(crate) fn finish(self) -> Encoding {
        let content = identity::content_digest(&self.image[CONTENT_START..self.layout.rows.end]);
        self.finish_with_content_digest(content)
    }

    /// Like `finish`, with the content digest already computed over
    /// exactly `image[CONTENT_START..rows.end]`.
    pub(crate) fn finish_with_content_digest(mut self, content: Digest32) -> Encoding {
        let state = identity::state_id(&content, &self.image[self.layout.manifest.clone()]);
        let f = self.layout.manifest.end;
        self.image[f..f + 32].copy_from_slice(&content);
        self.image[f + 32..f + 64].copy_from_slice(&state);
        Encoding::from_parts(
            Image::Owned(self.image),
            self.layout,
            self.manifest,
            content,
            state,
        )
    }
}

/// Writes a u64 ids section.
pub(crate) fn fill_u64_ids<'a>(dst: &mut [u8], ids: impl Iterator<Item = u64> + 'a) {
    for (chunk, id) in dst.chunks_exact_mut(8).zip(ids) {
        chunk.copy_from_slice(&id.to_le_bytes());
    }
}

/// Writes a utf8 ids section (offsets, then bytes) for `n` ids.
pub(crate) fn fill_utf8_ids<'a>(dst: &mut [u8], n: usize, ids: impl Iterator<Item = &'a [u8]>) {
    let (offsets, data) = dst.split_at_mut(8 * (n + 1));
    let mut pos = 0usize;
    offsets[..8].copy_from_slice(&0u64.to_le_bytes());
    for (i, id) in ids.enumerate().take(n) {
        if let Some(d) = data.get_mut(pos..pos + id.len()) {
            d.copy_from_slice(id);
        }
        pos += id.len();
        if let Some(o) = offsets.get_mut(8 * (i + 1)..8 * (i + 2)) {
            o.copy_from_slice(&(pos as u64).to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_can_be_shared_across_threads() {
        fn shared<T: Send + Sync + Clone>() {}
        shared::<Encoding>();
    }

    #[test]
    fn header_layout() {
        let c = Config::quant(4, 4).unwrap();
        let h = Encoding::header_bytes(&c, IdKind::Utf8, 3);
        assert_eq!(&h[..6], b"SEMQ\x02\x00");
        assert_eq!(h[6..19], c.to_bytes());
        assert_eq!(h[19], 1);
        assert_eq!(h[20..28], 3u64.to_le_bytes());
    }
}
