//! `NAME.qem/virtual/`: virtual detector images, centre of mass, mean and
//! maximum patterns, each as `.npy` with an 8-bit `.png` preview (and the
//! exact calibrated `.tiff`), and `detectors.json` with the
//! geometry used.
//!
//! Sizes come from the header; values are computed on first read through
//! [`crate::reduce`] and kept in the budget (or spilled, see
//! `ImageValues`), once per image for its `.npy`, `.tiff` and `.png`, and
//! read by range from there. Each of the four default images is computed
//! on its own, when it is first read: counts take whole tiles from the
//! spatial index and decode only the pixels along an image's own edges,
//! and a pass over the four images' edges together cost the first
//! `bf.npy` several times what its own does; float and scaled files decode
//! each image's pixels, which the four images hardly share. The products
//! that need every pixel (centre of mass, mean and maximum pattern) are
//! computed together, and from them the DPC magnitude and angle and the
//! radial profile of the mean pattern.
//! `disk-CY-CX-R.npy`, `annulus-CY-CX-RI-RO.npy`, `point-R-C.npy` and the
//! masked centre of mass `com-CY-CX-R_row.npy` / `_col.npy` (and `.png`)
//! are made on lookup, not listed, and kept for repeated reads.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use lru::LruCache;

use super::budget::{Budget, CacheKey, Charged};
use super::content::{copy_range, read_all, Content, Held, Lazy, Windowed};
use super::qem_view::QemView;
use super::{Directory, Entry, TreeError};
use crate::export::png;
use crate::export::tiff::{Sample, Sampling, TiffLayout};
use crate::npy::{self, DType};
use crate::qem::{Codec, Dtype, Tile};
use crate::reduce::geometry::{
    mask_with, radial_bins, radial_profile, DetectorOptions, Geometry, Shape,
};
use crate::reduce::{
    idpc, image_kinds, mean_subtracted, Accelerator, Full, Image, ImageKind, MaxPattern, PixelSet,
    Reducer,
};

/// `detectors.json` is padded with spaces to this size: its size must be
/// known before the disk is found.
const DETECTORS_JSON_BYTES: usize = 4096;

/// Computed once, by one caller at a time, and held in the tree's budget
/// (computed again if it was evicted); a failure is not kept, so a later
/// read retries.
struct Shared<T> {
    budget: Arc<Budget>,
    key: CacheKey,
    busy: Mutex<()>,
    kind: PhantomData<fn() -> T>,
}

impl<T: Charged> Shared<T> {
    fn new(view: &QemView) -> Self {
        let (budget, id) = view.budget();
        Shared {
            budget: Arc::clone(budget),
            key: budget.derived(id),
            busy: Mutex::new(()),
            kind: PhantomData,
        }
    }

    fn get(&self, make: impl FnOnce() -> Result<T, TreeError>) -> Result<Arc<T>, TreeError> {
        if let Some(v) = self.budget.get(self.key) {
            return Ok(v);
        }
        let _turn = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = self.budget.get(self.key) {
            return Ok(v);
        }
        let v = Arc::new(make()?);
        self.budget.keep(self.key, Arc::clone(&v));
        Ok(v)
    }
}

fn image_bytes(image: &Image) -> usize {
    image.len() * npy_dtype(image.kind()).size()
}

impl Charged for Image {
    fn charge(&self) -> usize {
        image_bytes(self)
    }
}

impl<const N: usize> Charged for [Image; N] {
    fn charge(&self) -> usize {
        self.iter().map(image_bytes).sum()
    }
}

impl Charged for Full {
    fn charge(&self) -> usize {
        let max = match &self.max_dp {
            MaxPattern::U8(v) => v.len(),
            MaxPattern::U16(v) => v.len() * 2,
            MaxPattern::F32(v) => v.len() * 4,
        };
        self.com.charge() + image_bytes(&self.mean_dp) + max
    }
}

impl Charged for Geometry {
    fn charge(&self) -> usize {
        std::mem::size_of::<Geometry>()
    }
}

/// The products of one opened file.
struct Products {
    view: Arc<QemView>,
    accelerator: Arc<dyn Accelerator>,
    options: DetectorOptions,
    geometry: Shared<Geometry>,
    /// `bf`, `abf`, `adf`, `haadf`.
    images: [Shared<Image>; 4],
    full: Shared<Full>,
}

impl Products {
    fn fail(&self, e: impl std::fmt::Display) -> TreeError {
        self.view.decode_error(e)
    }

    fn reducer(&self) -> Result<Reducer<'_>, TreeError> {
        Reducer::new(self.view.file(), &*self.accelerator)
            .map(|r| r.verify_index(self.options.verify_index))
            .map_err(|e| self.fail(e))
    }

    /// Runs `make` with a reducer of this file, refusing its result when
    /// the file's mapping faulted meanwhile (the source was truncated and
    /// read as zeros), so that no product of a changed file is kept. The
    /// first product of a file is made while its body checksums are
    /// verified ([`QemFile::beside_checksums`]).
    fn guarded<T: Send>(
        &self,
        make: impl FnOnce(&Reducer<'_>) -> Result<T, TreeError> + Send,
    ) -> Result<T, TreeError> {
        let file = self.view.file();
        let faults = file.faults();
        let value = file
            .beside_checksums(|file| {
                let reducer = Reducer::new(file, &*self.accelerator)
                    .map_err(|e| self.fail(e))?
                    .verify_index(self.options.verify_index);
                make(&reducer)
            })
            .map_err(|e| self.fail(e));
        // A product reads much of the file (every block, or its index):
        // its pages are let go as a window's are (`QemView::load_window`).
        file.release_mapped_pages();
        let value = value??;
        if file.faults() != faults {
            return Err(TreeError::SourceChanged);
        }
        Ok(value)
    }

    fn geometry(&self) -> Result<Arc<Geometry>, TreeError> {
        self.geometry.get(|| {
            self.guarded(|reducer| {
                Geometry::resolve(reducer, &self.options).map_err(|e| self.fail(e))
            })
        })
    }

    /// Default image `k` (`bf`, `abf`, `adf`, `haadf`).
    fn image(&self, k: usize) -> Result<Arc<Image>, TreeError> {
        self.images[k].get(|| {
            let mask = self.geometry()?.masks()[k].clone();
            one_image(self, mask)
        })
    }

    fn full(&self) -> Result<Arc<Full>, TreeError> {
        self.full
            .get(|| self.guarded(|reducer| reducer.full().map_err(|e| self.fail(e))))
    }

    /// The sum of every valid pixel per scan. Counts: from the 32×32
    /// spatial sums, exact, and no stream is decoded. Float32 and scaled
    /// files: a whole-detector virtual image (decoded; compensated float32,
    /// background subtracted, or exact codes calibrated once in float64).
    fn sums(&self) -> Result<Image, TreeError> {
        self.guarded(|reducer| {
            let file = reducer.file();
            if file.codec() != Codec::Integer {
                let all = PixelSet::new((0..file.pixels() as u32).collect());
                let mut images = reducer.images(&[all]).map_err(|e| self.fail(e))?;
                return images
                    .pop()
                    .ok_or_else(|| TreeError::Internal("one image expected".into()));
            }
            let [_, _, r, c] = file.shape();
            let (gr, gc) = Tile::Px32.grid(r, c);
            let sums = file
                .spatial_sums_checked(Tile::Px32, 0..file.frames(), self.options.verify_index)
                .map_err(|e| self.fail(e))?;
            Ok(Image::U64(
                sums.chunks((gr * gc).max(1))
                    .map(|t| t.iter().map(|&v| u64::from(v)).sum())
                    .collect(),
            ))
        })
    }

    fn detectors_json(&self) -> Result<Vec<u8>, TreeError> {
        let geometry = self.geometry()?;
        let mut doc = geometry.to_json();
        doc["backend"] = self.accelerator.name().into();
        doc["background_subtracted"] = self.reducer()?.has_background().into();
        doc["sum"] = serde_json::json!({
            "file": "sum.npy",
            "what": "per scan position, the sum of every valid detector pixel",
            "how": match self.view.file().codec() {
                Codec::Integer => "exact uint64 counts from the spatial index (no decoding)",
                Codec::Float => "decoded float32, background subtracted, compensated float32 sum",
                Codec::Scaled => "exact sums of the decoded codes, calibrated once in float64",
            },
        });
        let file = self.view.file();
        let [images, means] = image_kinds(file.codec());
        doc["tiff"] = serde_json::json!({
            "what": "each NAME.tiff holds NAME.npy's values exactly, with the sampling",
            "images": tiff_sample(file, images).name(),
            "com_row, com_col, dpc_magnitude, dpc_angle, idpc, mean_dp": tiff_sample(file, means).name(),
            "why": "counts as uint32 when every valid pixel at the stored type's maximum sums within it, else float64",
        });
        doc["on_lookup"] = serde_json::json!({
            "disk-CY-CX-R.npy, annulus-CY-CX-RI-RO.npy": "any other detector, same edge rule",
            "point-R-C.npy": "detector pixel (R, C) per scan position",
            "com-CY-CX-R_row.npy, com-CY-CX-R_col.npy": "centre of mass inside the disk, minus (CY, CX); NaN where its total is 0",
        });
        doc["radial_profile"] = "radial_profile.npy: mean of mean_dp over valid pixels with k <= d < k+1 about the centre; NaN for empty rings".into();
        doc["idpc"] = "idpc.npy: Fourier integration of (com_row, com_col) over the scan (periodic least squares, mean 0, NaN taken as 0), in detector pixels times scan steps".into();
        doc["dpc"] = "dpc_magnitude = hypot(com_row, com_col), dpc_angle = atan2(com_row, com_col) in radians, of the mean-subtracted centre of mass".into();
        doc["centre_of_mass"] = serde_json::json!({
            "files": ["com_row.npy", "com_col.npy"],
            "origin": "zero-based detector (row, column), minus the scan mean of the finite values",
            "zero_total": "NaN, excluded from the mean",
        });
        let mut text = crate::export::json::pretty(&doc);
        // Padded with spaces before the final newline to the fixed size.
        text.pop();
        if text.len() >= DETECTORS_JSON_BYTES {
            return Err(TreeError::Internal(format!(
                "detectors.json needs {} bytes, more than its {DETECTORS_JSON_BYTES}",
                text.len()
            )));
        }
        text.extend(std::iter::repeat_n(
            ' ',
            DETECTORS_JSON_BYTES - 1 - text.len(),
        ));
        text.push('\n');
        Ok(text.into_bytes())
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// An `.npy` of `shape` whose data bytes `data` produces (small: a
/// detector-sized pattern or profile), held in the budget.
fn npy_file(
    view: &QemView,
    dtype: DType,
    shape: &[usize],
    data: impl Fn() -> Result<Vec<u8>, TreeError> + Send + Sync + 'static,
) -> Entry {
    let header = npy::encode_header(dtype, shape);
    let size = header.len() + dtype.size() * shape.iter().product::<usize>();
    let (budget, id) = view.budget();
    Entry::File(Arc::new(Lazy::new(budget, id, size as u64, move || {
        let mut out = header.clone();
        out.extend_from_slice(&data()?);
        Ok(out)
    })))
}

/// A preview of `shape` from the values `values` produces, held in the
/// budget (a PNG is compressed whole, so it is not made by windows).
fn png_file(
    view: &QemView,
    shape: [usize; 2],
    values: impl Fn() -> Result<Vec<f32>, TreeError> + Send + Sync + 'static,
) -> Entry {
    let (rows, columns) = (shape[0] as u32, shape[1] as u32);
    let (budget, id) = view.budget();
    Entry::File(Arc::new(Lazy::new(
        budget,
        id,
        png::preview_len(rows, columns),
        move || Ok(png::preview(rows, columns, &values()?)),
    )))
}

/// The `.npy` element type of an image kind.
fn npy_dtype(kind: ImageKind) -> DType {
    match kind {
        ImageKind::U64 => DType::U64,
        ImageKind::F64 => DType::F64,
        ImageKind::F32 => DType::F32,
    }
}

/// An image's values as the little-endian bytes of its kind (an `.npy`
/// body), computed once for its `.npy`, `.tiff` and `.png` together: held
/// in the budget, or spilled when larger than the whole budget ([`Lazy`]),
/// and read by range from there, so a reader asking piece by piece never
/// makes the image again.
struct ImageValues {
    kind: ImageKind,
    len: usize,
    bytes: Lazy,
}

impl ImageValues {
    /// The values `make` computes, announced as `kind` × `shape`.
    fn new(
        view: &QemView,
        kind: ImageKind,
        shape: [usize; 2],
        make: impl Fn() -> Result<Image, TreeError> + Send + Sync + 'static,
    ) -> Arc<Self> {
        let len = shape[0] * shape[1];
        let (budget, id) = view.budget();
        let size = (len * npy_dtype(kind).size()) as u64;
        let bytes = Lazy::new(budget, id, size, move || {
            let image = make()?;
            // Another kind of the same byte size would be read wrongly.
            if image.kind() != kind || image.len() != len {
                return Err(TreeError::Internal(format!(
                    "an image of {:?} × {} where {kind:?} × {len} was announced",
                    image.kind(),
                    image.len()
                )));
            }
            Ok(image.le_bytes())
        });
        Arc::new(ImageValues { kind, len, bytes })
    }

    fn element(&self) -> usize {
        npy_dtype(self.kind).size()
    }

    /// Fills `buf` with the value bytes from byte `at`.
    fn read_exact(&self, at: u64, buf: &mut [u8]) -> Result<(), TreeError> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.bytes.read_at(at + done as u64, &mut buf[done..])?;
            if n == 0 {
                return Err(TreeError::Internal(
                    "an image shorter than announced".into(),
                ));
            }
            done += n;
        }
        Ok(())
    }

    /// The value whose bytes (one element of this image's kind) are `bytes`.
    fn value(&self, bytes: &[u8]) -> f64 {
        match self.kind {
            ImageKind::U64 => u64::from_le_bytes(bytes.try_into().expect("8 bytes")) as f64,
            ImageKind::F64 => f64::from_le_bytes(bytes.try_into().expect("8 bytes")),
            ImageKind::F32 => f64::from(f32::from_le_bytes(bytes.try_into().expect("4 bytes"))),
        }
    }

    /// Bytes `[at, at + buf.len())` of the values as `sample` (a TIFF's
    /// pixels, exact by [`tiff_sample`]); past the values (a TIFF page's
    /// padding), zeros.
    fn read_as(&self, sample: Sample, at: u64, buf: &mut [u8]) -> Result<(), TreeError> {
        let size = sample.size();
        let first = ((at / size) as usize).min(self.len);
        let end = ((at + buf.len() as u64).div_ceil(size) as usize).min(self.len);
        let e = self.element();
        let mut native = vec![0u8; (end - first) * e];
        self.read_exact((first * e) as u64, &mut native)?;
        let mut converted = Vec::with_capacity((end - first) * size as usize);
        for v in native.chunks_exact(e) {
            match (sample, self.kind) {
                (Sample::U32, ImageKind::U64) => {
                    let n = u64::from_le_bytes(v.try_into().expect("8 bytes"));
                    // The bound of `tiff_sample` holds for every sum.
                    let n = u32::try_from(n)
                        .map_err(|_| TreeError::Internal(format!("a count of {n} past uint32")))?;
                    converted.extend_from_slice(&n.to_le_bytes());
                }
                (Sample::F64, _) => converted.extend_from_slice(&self.value(v).to_le_bytes()),
                _ => converted.extend_from_slice(&(self.value(v) as f32).to_le_bytes()),
            }
        }
        let done = copy_range(&converted, at - first as u64 * size, buf);
        buf[done..].fill(0);
        Ok(())
    }

    /// Every value as float32, for an 8-bit preview.
    fn preview(&self) -> Result<Vec<f32>, TreeError> {
        let bytes = read_all(&self.bytes)?;
        Ok(bytes
            .chunks_exact(self.element())
            .map(|v| self.value(v) as f32)
            .collect())
    }
}

/// The `.npy` of an image: its header, then its values read by range (lent
/// from the budget where they are held there).
struct ImageNpy {
    header: Vec<u8>,
    values: Arc<ImageValues>,
}

impl ImageNpy {
    fn entry(shape: [usize; 2], values: Arc<ImageValues>) -> Entry {
        let header = npy::encode_header(npy_dtype(values.kind), &shape);
        Entry::File(Arc::new(ImageNpy { header, values }))
    }
}

impl Content for ImageNpy {
    fn size(&self) -> u64 {
        (self.header.len() + self.values.len * self.values.element()) as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, TreeError> {
        let size = self.size();
        if offset >= size {
            return Ok(0);
        }
        let n = buf.len().min((size - offset) as usize);
        let h = self.header.len() as u64;
        let mut done = 0;
        if offset < h {
            done = copy_range(&self.header, offset, &mut buf[..n]);
        }
        if done < n {
            let at = offset + done as u64 - h;
            self.values.read_exact(at, &mut buf[done..n])?;
        }
        Ok(n)
    }

    fn held_at(&self, offset: u64, len: usize) -> Result<Option<Held>, TreeError> {
        match offset.checked_sub(self.header.len() as u64) {
            Some(at) => self.values.bytes.held_at(at, len),
            None => Ok(None),
        }
    }
}

/// The TIFF sample type that holds an image of `kind` of `file` exactly:
/// float32 images as they are; sums of counts as uint32 when the largest
/// sum the file can hold (every valid pixel at the stored type's maximum)
/// fits, else float64 (exact to 2^53); float64 images as float64. A
/// float32 TIFF of counts was inexact above 2^24.
fn tiff_sample(file: &crate::qem::QemFile, kind: ImageKind) -> Sample {
    match kind {
        ImageKind::F32 => Sample::F32,
        ImageKind::F64 => Sample::F64,
        ImageKind::U64 => {
            let most = match file.stored_dtype() {
                Dtype::U8 => u64::from(u8::MAX),
                _ => u64::from(u16::MAX),
            };
            match (file.pixels() as u64).checked_mul(most) {
                Some(sum) if sum <= u64::from(u32::MAX) => Sample::U32,
                _ => Sample::F64,
            }
        }
    }
}

/// A TIFF of an image's exact values that carries its sampling (scan
/// step or detector sampling), so Fiji and hyperspy show it to scale.
fn tiff_file(
    shape: [usize; 2],
    sample: Sample,
    sampling: &Sampling,
    values: Arc<ImageValues>,
) -> Option<Entry> {
    // A 2-D image always fits (axes are below 2^24).
    let layout = TiffLayout::new(shape[0] as u32, shape[1] as u32, sample, sampling)?;
    Some(Entry::File(Arc::new(Windowed::new(
        layout.total_len(),
        move |offset, buf: &mut [u8]| {
            let n = layout.read_at(offset, buf, |at, out| {
                values.read_as(sample, at, out).map(|()| out.len())
            })?;
            if n != buf.len() {
                return Err(TreeError::Internal("a TIFF shorter than announced".into()));
            }
            Ok(())
        },
    ))))
}

/// An image as `NAME.npy` (in its kind's dtype), `NAME.tiff` (the same
/// values exactly, see [`tiff_sample`], with the sampling, for Fiji and
/// hyperspy) and `NAME.png`, all three from one computation of `make`.
fn image_pair(
    view: &QemView,
    entries: &mut BTreeMap<String, Entry>,
    name: &str,
    shape: [usize; 2],
    kind: ImageKind,
    sampling: &Sampling,
    make: impl Fn() -> Result<Image, TreeError> + Send + Sync + 'static,
) {
    let values = ImageValues::new(view, kind, shape, make);
    entries.insert(
        format!("{name}.npy"),
        ImageNpy::entry(shape, Arc::clone(&values)),
    );
    let sample = tiff_sample(view.file(), kind);
    if let Some(tiff) = tiff_file(shape, sample, sampling, Arc::clone(&values)) {
        entries.insert(format!("{name}.tiff"), tiff);
    }
    entries.insert(format!("{name}.png"), preview_png(view, shape, values));
}

/// The 8-bit preview of an image.
fn preview_png(view: &QemView, shape: [usize; 2], values: Arc<ImageValues>) -> Entry {
    png_file(view, shape, move || values.preview())
}

/// The `virtual/` directory.
pub(super) struct VirtualDir {
    products: Arc<Products>,
    fixed: BTreeMap<String, Entry>,
    /// Files of products looked up recently (so repeated reads reuse them).
    custom: Mutex<LruCache<String, Entry>>,
    /// Their values, by product (a `.npy` and its `.png` share them).
    values: Mutex<LruCache<String, Arc<ImageValues>>>,
    /// Masked centres of mass (row and column) by disk.
    coms: Mutex<LruCache<String, Arc<Shared<[Image; 2]>>>>,
}

/// How a looked-up product computes its image.
type ImageSource = Box<dyn Fn() -> Result<Image, TreeError> + Send + Sync>;

/// The virtual image of one mask.
fn one_image(p: &Products, set: PixelSet) -> Result<Image, TreeError> {
    p.guarded(|reducer| {
        let mut images = reducer.images(&[set]).map_err(|e| p.fail(e))?;
        images
            .pop()
            .ok_or_else(|| TreeError::Internal("one image expected".into()))
    })
}

pub(super) fn directory(
    view: Arc<QemView>,
    accelerator: Arc<dyn Accelerator>,
    options: DetectorOptions,
) -> Arc<dyn Directory> {
    let file = view.file();
    let [sr, sc, r, c] = file.shape();
    let (scan, detector) = ([sr, sc], [r, c]);
    let (scan_sampling, detector_sampling) = (Sampling::scan_image(file), Sampling::frame(file));
    let codec = file.codec();
    let decoded = file.decoded_dtype();
    let [sum_kind, mean_kind] = image_kinds(codec);
    let p = Arc::new(Products {
        geometry: Shared::new(&view),
        images: std::array::from_fn(|_| Shared::new(&view)),
        full: Shared::new(&view),
        view,
        accelerator,
        options,
    });
    let view = &*Arc::clone(&p.view);
    let mut entries = BTreeMap::new();

    let q = Arc::clone(&p);
    entries.insert(
        "detectors.json".to_string(),
        Entry::File(Arc::new(Lazy::new(
            view.budget().0,
            view.budget().1,
            DETECTORS_JSON_BYTES as u64,
            move || q.detectors_json(),
        ))),
    );
    let q = Arc::clone(&p);
    image_pair(
        view,
        &mut entries,
        "sum",
        scan,
        sum_kind,
        &scan_sampling,
        move || q.sums(),
    );
    for (k, name) in ["bf", "abf", "adf", "haadf"].into_iter().enumerate() {
        let q = Arc::clone(&p);
        image_pair(
            view,
            &mut entries,
            name,
            scan,
            sum_kind,
            &scan_sampling,
            move || Ok((*q.image(k)?).clone()),
        );
    }
    for (k, name) in ["com_row", "com_col"].into_iter().enumerate() {
        let q = Arc::clone(&p);
        image_pair(
            view,
            &mut entries,
            name,
            scan,
            mean_kind,
            &scan_sampling,
            move || Ok(mean_subtracted(&q.full()?.com[k])),
        );
    }
    // DPC: the mean-subtracted centre of mass as a vector (column, row).
    for (name, f) in [
        ("dpc_magnitude", f64::hypot as fn(f64, f64) -> f64),
        ("dpc_angle", f64::atan2),
    ] {
        let q = Arc::clone(&p);
        image_pair(
            view,
            &mut entries,
            name,
            scan,
            mean_kind,
            &scan_sampling,
            move || {
                let full = q.full()?;
                let [row, col] = [0, 1].map(|k| mean_subtracted(&full.com[k]).to_f64());
                let v = row.iter().zip(&col).map(|(&r, &c)| f(r, c));
                Ok(match mean_kind {
                    ImageKind::F32 => Image::F32(v.map(|x| x as f32).collect()),
                    _ => Image::F64(v.collect()),
                })
            },
        );
    }
    // iDPC: the field whose gradient is the centre-of-mass field.
    let q = Arc::clone(&p);
    image_pair(
        view,
        &mut entries,
        "idpc",
        scan,
        mean_kind,
        &scan_sampling,
        move || {
            let full = q.full()?;
            let [row, col] = [0, 1].map(|k| mean_subtracted(&full.com[k]).to_f64());
            let field = idpc::integrate(&row, &col, scan);
            Ok(match mean_kind {
                ImageKind::F32 => Image::F32(field.iter().map(|&x| x as f32).collect()),
                _ => Image::F64(field),
            })
        },
    );
    let q = Arc::clone(&p);
    entries.insert(
        "radial_profile.npy".into(),
        npy_file(view, DType::F64, &[radial_bins(detector)], move || {
            let geometry = q.geometry()?;
            let mean = q.full()?.mean_dp.to_f64();
            let reducer = q.reducer()?;
            let profile = radial_profile(&mean, detector, geometry.center, |p| reducer.is_valid(p));
            Ok(profile.iter().flat_map(|v| v.to_le_bytes()).collect())
        }),
    );
    let q = Arc::clone(&p);
    image_pair(
        view,
        &mut entries,
        "mean_dp",
        detector,
        mean_kind,
        &detector_sampling,
        move || Ok(q.full()?.mean_dp.clone()),
    );
    let max_dtype = match (codec, decoded) {
        (Codec::Integer, Dtype::U8) => DType::U8,
        (Codec::Integer, _) => DType::U16,
        _ => DType::F32,
    };
    let q = Arc::clone(&p);
    entries.insert(
        "max_dp.npy".into(),
        npy_file(view, max_dtype, &detector, move || {
            Ok(match &q.full()?.max_dp {
                MaxPattern::U8(v) => v.clone(),
                MaxPattern::U16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                MaxPattern::F32(v) => f32_bytes(v),
            })
        }),
    );
    let q = Arc::clone(&p);
    entries.insert(
        "max_dp.png".into(),
        png_file(view, detector, move || {
            Ok(match &q.full()?.max_dp {
                MaxPattern::U8(v) => v.iter().map(|&x| f32::from(x)).collect(),
                MaxPattern::U16(v) => v.iter().map(|&x| f32::from(x)).collect(),
                MaxPattern::F32(v) => v.clone(),
            })
        }),
    );
    Arc::new(VirtualDir {
        products: p,
        fixed: entries,
        custom: Mutex::new(LruCache::new(NonZeroUsize::new(64).expect("nonzero"))),
        values: Mutex::new(LruCache::new(NonZeroUsize::new(64).expect("nonzero"))),
        coms: Mutex::new(LruCache::new(NonZeroUsize::new(16).expect("nonzero"))),
    })
}

/// A non-negative decimal number as written in a custom detector's name
/// (digits and at most one point; no signs, exponents, `inf` or `nan`).
fn number(text: &str) -> Option<f64> {
    let plain = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && text.bytes().filter(|&b| b == b'.').count() <= 1
        && text != ".";
    plain.then(|| text.parse().ok()).flatten()
}

/// A product named on lookup (the stem of its file name).
#[derive(Debug, Clone, PartialEq)]
enum Custom {
    /// `disk-CY-CX-R`, `annulus-CY-CX-RI-RO`.
    Detector([f64; 2], Shape),
    /// `com-CY-CX-R_row` / `_col`: the centre of mass inside the disk,
    /// relative to its centre; `axis` 0 for rows, 1 for columns.
    Com {
        center: [f64; 2],
        radius: f64,
        axis: usize,
    },
    /// `point-R-C`: one detector pixel.
    Point(usize, usize),
}

fn custom_product(stem: &str) -> Option<Custom> {
    if let Some((rest, axis)) = stem
        .strip_suffix("_row")
        .map(|r| (r, 0))
        .or_else(|| stem.strip_suffix("_col").map(|r| (r, 1)))
    {
        let values: Vec<f64> = rest
            .strip_prefix("com-")?
            .split('-')
            .map(number)
            .collect::<Option<_>>()?;
        return match values.as_slice() {
            &[cy, cx, radius] => Some(Custom::Com {
                center: [cy, cx],
                radius,
                axis,
            }),
            _ => None,
        };
    }
    if let Some(rest) = stem.strip_prefix("point-") {
        let (r, c) = rest.split_once('-')?;
        let index = |t: &str| {
            (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
                .then(|| t.parse::<usize>().ok())
                .flatten()
        };
        return Some(Custom::Point(index(r)?, index(c)?));
    }
    custom_detector(stem).map(|(center, shape)| Custom::Detector(center, shape))
}

/// `disk-CY-CX-R` or `annulus-CY-CX-RI-RO` (without the extension).
fn custom_detector(stem: &str) -> Option<([f64; 2], Shape)> {
    let (kind, rest) = stem.split_once('-')?;
    let values: Vec<f64> = rest.split('-').map(number).collect::<Option<_>>()?;
    match (kind, values.as_slice()) {
        ("disk", &[cy, cx, radius]) => Some(([cy, cx], Shape::Disk { radius })),
        ("annulus", &[cy, cx, inner, outer]) if inner <= outer => {
            Some(([cy, cx], Shape::Annulus { inner, outer }))
        }
        _ => None,
    }
}

impl VirtualDir {
    /// The values of a product named on lookup, shared by its `.npy` and
    /// `.png`; `None` for a pixel outside the detector.
    fn custom_values(&self, stem: &str, product: Custom) -> Option<Arc<ImageValues>> {
        let mut cache = self.values.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(values) = cache.get(stem) {
            return Some(Arc::clone(values));
        }
        let p = Arc::clone(&self.products);
        let [sr, sc, r, c] = p.view.file().shape();
        let [sum_kind, mean_kind] = image_kinds(p.view.file().codec());
        let (kind, make): (ImageKind, ImageSource) = match product {
            Custom::Detector(center, shape) => (
                sum_kind,
                Box::new(move || one_image(&p, mask_with([r, c], center, shape, p.options.edges))),
            ),
            Custom::Point(row, column) => {
                if row >= r || column >= c {
                    return None;
                }
                let pixel = PixelSet::new(vec![(row * c + column) as u32]);
                (sum_kind, Box::new(move || one_image(&p, pixel.clone())))
            }
            Custom::Com {
                center,
                radius,
                axis,
            } => {
                // `_row` and `_col` come from one computation.
                let key = format!("{center:?}-{radius}");
                let pair = Arc::clone(
                    self.coms
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_or_insert(key, || Arc::new(Shared::new(&p.view))),
                );
                (
                    mean_kind,
                    Box::new(move || {
                        let both = pair.get(|| {
                            let disk = Shape::Disk { radius };
                            let set = mask_with([r, c], center, disk, p.options.edges);
                            p.guarded(|reducer| {
                                reducer.masked_com(&set, center).map_err(|e| p.fail(e))
                            })
                        })?;
                        Ok(both[axis].clone())
                    }),
                )
            }
        };
        let values = ImageValues::new(&self.products.view, kind, [sr, sc], make);
        cache.put(stem.to_string(), Arc::clone(&values));
        Some(values)
    }

    fn custom_entry(&self, name: &str) -> Option<Entry> {
        let (stem, preview) = match (name.strip_suffix(".npy"), name.strip_suffix(".png")) {
            (Some(stem), _) => (stem, false),
            (_, Some(stem)) => (stem, true),
            _ => return None,
        };
        let product = custom_product(stem)?;
        let mut cache = self.custom.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = cache.get(name) {
            return Some(entry.clone());
        }
        let values = self.custom_values(stem, product)?;
        let view = &self.products.view;
        let [sr, sc, ..] = view.file().shape();
        let entry = if preview {
            preview_png(view, [sr, sc], values)
        } else {
            ImageNpy::entry([sr, sc], values)
        };
        cache.put(name.to_string(), entry.clone());
        Some(entry)
    }
}

impl Directory for VirtualDir {
    fn lookup(&self, name: &str) -> Option<Entry> {
        self.fixed
            .get(name)
            .cloned()
            .or_else(|| self.custom_entry(name))
    }

    fn list(&self) -> Vec<(String, Entry)> {
        self.fixed
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn custom_detector_names() {
        assert_eq!(
            custom_detector("disk-64-63.5-10"),
            Some(([64.0, 63.5], Shape::Disk { radius: 10.0 }))
        );
        assert_eq!(
            custom_detector("annulus-64-64-20-40.5"),
            Some((
                [64.0, 64.0],
                Shape::Annulus {
                    inner: 20.0,
                    outer: 40.5
                }
            ))
        );
        for bad in [
            "disk-64-64",
            "disk-64-64-1-2",
            "annulus-1-1-5-4",
            "disk-inf-1-1",
            "disk-nan-1-1",
            "disk-1e3-1-1",
            "disk--1-1-1",
            "disk-1.2.3-1-1",
            "disk-.-1-1",
            "ring-1-1-1",
        ] {
            assert_eq!(custom_detector(bad), None, "{bad}");
        }
    }

    #[test]
    fn product_names() {
        assert_eq!(
            custom_product("com-12-13.5-6_col"),
            Some(Custom::Com {
                center: [12.0, 13.5],
                radius: 6.0,
                axis: 1
            })
        );
        assert_eq!(custom_product("point-3-40"), Some(Custom::Point(3, 40)));
        for bad in [
            "com-1-2_row",
            "com-1-2-3_x",
            "point-1",
            "point-1.5-2",
            "point--1-2",
            "com-1-2-3",
        ] {
            assert_eq!(custom_product(bad), None, "{bad}");
        }
    }
}
