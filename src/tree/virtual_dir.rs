//! `NAME.qem/virtual/`: virtual detector images, centre of mass, mean and
//! maximum patterns, each as `.npy` with an 8-bit `.png` preview (and the
//! float32 images as calibrated `.tiff`), and `detectors.json` with the
//! geometry used.
//!
//! Sizes come from the header; values are computed on first read through
//! [`crate::reduce`] and kept (they are small). The four default images
//! are computed together, as are the products that need every pixel
//! (centre of mass, mean and maximum pattern). `disk-CY-CX-R.npy` and
//! `annulus-CY-CX-RI-RO.npy` (and `.png`) are made on lookup, not listed.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, OnceLock};

use lru::LruCache;

use super::content::Lazy;
use super::qem_view::QemView;
use super::{Directory, Entry, TreeError};
use crate::export::png;
use crate::export::tiff::{Sample, Sampling, TiffLayout};
use crate::npy::{self, DType};
use crate::qem::{Codec, Dtype, Tile};
use crate::reduce::geometry::{mask, DetectorOptions, Geometry, Shape};
use crate::reduce::{mean_subtracted, Accelerator, Full, MaxPattern, Reducer};

/// `detectors.json` is padded with spaces to this size: its size must be
/// known before the disk is found.
const DETECTORS_JSON_BYTES: usize = 4096;

/// Computed once, by one caller at a time; a failure is not kept, so a
/// later read retries.
struct Shared<T> {
    value: OnceLock<Arc<T>>,
    busy: Mutex<()>,
}

impl<T> Shared<T> {
    fn new() -> Self {
        Shared {
            value: OnceLock::new(),
            busy: Mutex::new(()),
        }
    }

    fn get(&self, make: impl FnOnce() -> Result<T, TreeError>) -> Result<Arc<T>, TreeError> {
        if let Some(v) = self.value.get() {
            return Ok(Arc::clone(v));
        }
        let _turn = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = self.value.get() {
            return Ok(Arc::clone(v));
        }
        let v = Arc::new(make()?);
        Ok(Arc::clone(self.value.get_or_init(|| v)))
    }
}

/// The products of one opened file.
struct Products {
    view: Arc<QemView>,
    accelerator: Arc<dyn Accelerator>,
    options: DetectorOptions,
    geometry: Shared<Geometry>,
    /// `bf`, `abf`, `adf`, `haadf`.
    images: Shared<[Vec<f32>; 4]>,
    full: Shared<Full>,
    sums: Shared<Vec<u64>>,
}

impl Products {
    fn fail(&self, e: impl std::fmt::Display) -> TreeError {
        self.view.decode_error(e)
    }

    fn reducer(&self) -> Result<Reducer<'_>, TreeError> {
        Reducer::new(self.view.file(), &*self.accelerator).map_err(|e| self.fail(e))
    }

    fn geometry(&self) -> Result<Arc<Geometry>, TreeError> {
        self.geometry
            .get(|| Geometry::resolve(&self.reducer()?, &self.options).map_err(|e| self.fail(e)))
    }

    fn images(&self) -> Result<Arc<[Vec<f32>; 4]>, TreeError> {
        self.images.get(|| {
            let masks = self.geometry()?.masks();
            let images = self.reducer()?.images(&masks).map_err(|e| self.fail(e))?;
            images
                .try_into()
                .map_err(|_| TreeError::Internal("four images expected".into()))
        })
    }

    fn full(&self) -> Result<Arc<Full>, TreeError> {
        self.full
            .get(|| self.reducer()?.full().map_err(|e| self.fail(e)))
    }

    /// Total valid counts per scan from the 32×32 spatial sums: exact, and
    /// no stream is decoded.
    fn sums(&self) -> Result<Arc<Vec<u64>>, TreeError> {
        self.sums.get(|| {
            let file = self.view.file();
            let [_, _, r, c] = file.shape();
            let (gr, gc) = Tile::Px32.grid(r, c);
            let sums = file
                .spatial_sums(Tile::Px32, 0..file.frames())
                .map_err(|e| self.fail(e))?;
            Ok(sums
                .chunks((gr * gc).max(1))
                .map(|t| t.iter().map(|&v| u64::from(v)).sum())
                .collect())
        })
    }

    fn detectors_json(&self) -> Result<Vec<u8>, TreeError> {
        let geometry = self.geometry()?;
        let mut doc = geometry.to_json();
        doc["backend"] = self.accelerator.name().into();
        doc["background_subtracted"] = self.reducer()?.has_background().into();
        doc["centre_of_mass"] = serde_json::json!({
            "files": ["com_row.npy", "com_col.npy"],
            "origin": "zero-based detector (row, column), minus the scan mean of the finite values",
            "zero_total": "NaN, excluded from the mean",
        });
        let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
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

/// An `.npy` of `shape` whose data bytes `data` produces.
fn npy_file(
    dtype: DType,
    shape: [usize; 2],
    data: impl Fn() -> Result<Vec<u8>, TreeError> + Send + Sync + 'static,
) -> Entry {
    let header = npy::encode_header(dtype, &shape);
    let size = header.len() + dtype.size() * shape[0] * shape[1];
    Entry::File(Arc::new(Lazy::new(size as u64, move || {
        let mut out = header.clone();
        out.extend_from_slice(&data()?);
        Ok(out)
    })))
}

/// A preview of `shape` from the values `values` produces.
fn png_file(
    shape: [usize; 2],
    values: impl Fn() -> Result<Vec<f32>, TreeError> + Send + Sync + 'static,
) -> Entry {
    let (rows, columns) = (shape[0] as u32, shape[1] as u32);
    Entry::File(Arc::new(Lazy::new(
        png::preview_len(rows, columns),
        move || Ok(png::preview(rows, columns, &values()?)),
    )))
}

/// A float32 TIFF that carries the image's sampling (scan step or detector
/// sampling), so Fiji and hyperspy show it to scale.
fn tiff_file(
    shape: [usize; 2],
    sampling: &Sampling,
    values: impl Fn() -> Result<Vec<f32>, TreeError> + Send + Sync + 'static,
) -> Option<Entry> {
    // A 2-D image always fits (axes are below 2^24).
    let layout = TiffLayout::new(shape[0] as u32, shape[1] as u32, Sample::F32, sampling)?;
    Some(Entry::File(Arc::new(Lazy::new(
        layout.total_len(),
        move || {
            let mut pixels = f32_bytes(&values()?);
            pixels.resize(layout.page_data_len() as usize, 0);
            let mut out = Vec::with_capacity(layout.total_len() as usize);
            layout
                .write(&mut out, |_, w| std::io::Write::write_all(w, &pixels))
                .map_err(|e| TreeError::Internal(e.to_string()))?;
            Ok(out)
        },
    ))))
}

/// A float32 image as `NAME.npy`, `NAME.tiff` and `NAME.png`.
fn image_pair(
    entries: &mut BTreeMap<String, Entry>,
    name: &str,
    shape: [usize; 2],
    sampling: &Sampling,
    values: impl Fn() -> Result<Vec<f32>, TreeError> + Send + Sync + Clone + 'static,
) {
    let v = values.clone();
    entries.insert(
        format!("{name}.npy"),
        npy_file(DType::F32, shape, move || Ok(f32_bytes(&v()?))),
    );
    let v = values.clone();
    if let Some(tiff) = tiff_file(shape, sampling, v) {
        entries.insert(format!("{name}.tiff"), tiff);
    }
    entries.insert(format!("{name}.png"), png_file(shape, values));
}

/// The `virtual/` directory.
pub(super) struct VirtualDir {
    products: Arc<Products>,
    fixed: BTreeMap<String, Entry>,
    /// Custom detectors looked up recently (so repeated reads reuse them).
    custom: Mutex<LruCache<String, Entry>>,
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
    let p = Arc::new(Products {
        view,
        accelerator,
        options,
        geometry: Shared::new(),
        images: Shared::new(),
        full: Shared::new(),
        sums: Shared::new(),
    });
    let mut entries = BTreeMap::new();

    let q = Arc::clone(&p);
    entries.insert(
        "detectors.json".to_string(),
        Entry::File(Arc::new(Lazy::new(
            DETECTORS_JSON_BYTES as u64,
            move || q.detectors_json(),
        ))),
    );
    if codec == Codec::Integer {
        let q = Arc::clone(&p);
        entries.insert(
            "sum.npy".into(),
            npy_file(DType::U64, scan, move || {
                Ok(q.sums()?.iter().flat_map(|s| s.to_le_bytes()).collect())
            }),
        );
        let q = Arc::clone(&p);
        entries.insert(
            "sum.png".into(),
            png_file(scan, move || {
                Ok(q.sums()?.iter().map(|&s| s as f32).collect())
            }),
        );
    }
    for (k, name) in ["bf", "abf", "adf", "haadf"].into_iter().enumerate() {
        let q = Arc::clone(&p);
        image_pair(&mut entries, name, scan, &scan_sampling, move || {
            Ok(q.images()?[k].clone())
        });
    }
    for (k, name) in ["com_row", "com_col"].into_iter().enumerate() {
        let q = Arc::clone(&p);
        image_pair(&mut entries, name, scan, &scan_sampling, move || {
            Ok(mean_subtracted(&q.full()?.com[k]))
        });
    }
    let q = Arc::clone(&p);
    image_pair(
        &mut entries,
        "mean_dp",
        detector,
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
        npy_file(max_dtype, detector, move || {
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
        png_file(detector, move || {
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
    fn custom_entry(&self, name: &str) -> Option<Entry> {
        let (stem, preview) = match (name.strip_suffix(".npy"), name.strip_suffix(".png")) {
            (Some(stem), _) => (stem, false),
            (_, Some(stem)) => (stem, true),
            _ => return None,
        };
        let (center, shape) = custom_detector(stem)?;
        let mut cache = self.custom.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = cache.get(name) {
            return Some(entry.clone());
        }
        let p = Arc::clone(&self.products);
        let [sr, sc, r, c] = p.view.file().shape();
        let image = Arc::new(Shared::<Vec<f32>>::new());
        let values = move || -> Result<Vec<f32>, TreeError> {
            let image = image.get(|| {
                let set = mask([r, c], center, shape);
                let mut images = p.reducer()?.images(&[set]).map_err(|e| p.fail(e))?;
                images
                    .pop()
                    .ok_or_else(|| TreeError::Internal("one image expected".into()))
            })?;
            Ok(image.as_ref().clone())
        };
        let entry = if preview {
            png_file([sr, sc], values)
        } else {
            npy_file(DType::F32, [sr, sc], move || Ok(f32_bytes(&values()?)))
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
}
