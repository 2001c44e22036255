//! A 4-D dataset (or a 3-D one with `--scan`) of any HDF5 file, named by
//! path: `qem convert FILE.h5:/path/to/dataset OUT.qem` (py4DSTEM's and
//! generic 4D-STEM data). Frames are read scan row by scan row through the
//! HDF5 library (its own filters, gzip and shuffle, and ours for h5py's
//! LZF and what `hdf5plugin` writes: Bitshuffle, LZ4, Zstd, Blosc) and
//! stored by the exact-narrowing rule. When the dataset sits in an EMD
//! data group — EMD 1.0 as emdfile and py4DSTEM write it
//! (`emd_group_type = "array"`, vectors `dim0`…`dim3`), or NCEM's earlier
//! layout (`emd_group_type = 1`, `dim1`…`dim4`) — the dimension vectors
//! give the calibration: their spacing, with the `units` attribute (scan
//! axes in m, nm, Å; detector axes in mrad or 1/nm, 1/Å). An EMD file needs
//! no dataset path: [`find_emd_array`] finds its 4-D array.

use std::path::{Path, PathBuf};

use hdf5_metno as h5;
use hdf5_metno::types::{TypeDescriptor as T, VarLenAscii, VarLenUnicode};
use serde_json::{json, Map};

use super::dense::not_representable;
use super::describe::{foreign, shape4};
use super::element::{Narrowing, SourceDtype};
use super::{ConvertError, Description, Options, Source};
use crate::npy::DType;
use crate::qem::write::{Calibration, DetectorUnit};

/// Opens an HDF5 file through the library, with our filter decoders
/// registered (see `hdf5_filters`), so that any dataset in it reads.
pub(super) fn open_file(path: &Path) -> h5::Result<h5::File> {
    super::hdf5_filters::register();
    h5::File::open(path)
}

/// Splits `FILE:/dataset` when `FILE` exists and the whole does not.
pub fn split_dataset_path(input: &Path) -> Option<(PathBuf, String)> {
    if input.exists() {
        return None;
    }
    let text = input.to_str()?;
    let (file, dataset) = text.rsplit_once(":/")?;
    let file = PathBuf::from(file);
    file.is_file().then(|| (file, format!("/{dataset}")))
}

fn dtype_of(d: &T) -> Option<DType> {
    use h5::types::{FloatSize, IntSize};
    Some(match d {
        T::Unsigned(IntSize::U1) => DType::U8,
        T::Unsigned(IntSize::U2) => DType::U16,
        T::Unsigned(IntSize::U4) => DType::U32,
        T::Unsigned(IntSize::U8) => DType::U64,
        T::Integer(IntSize::U1) => DType::I8,
        T::Integer(IntSize::U2) => DType::I16,
        T::Integer(IntSize::U4) => DType::I32,
        T::Integer(IntSize::U8) => DType::I64,
        T::Float(FloatSize::U4) => DType::F32,
        T::Float(FloatSize::U8) => DType::F64,
        _ => return None,
    })
}

fn string_attr(loc: &h5::Location, name: &str) -> Option<String> {
    let a = loc.attr(name).ok()?;
    if let Ok(s) = a.read_scalar::<VarLenUnicode>() {
        return Some(s.as_str().to_string());
    }
    if let Ok(s) = a.read_scalar::<VarLenAscii>() {
        return Some(s.as_str().to_string());
    }
    let bytes = a.read_raw::<u8>().ok()?;
    Some(
        String::from_utf8_lossy(&bytes)
            .trim_end_matches('\0')
            .to_string(),
    )
}

/// How a group declares itself an EMD data group, and so how its
/// dimension vectors are numbered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EmdGroup {
    /// EMD 1.0 (`"array"`): `dim0`…
    Array,
    /// NCEM's EMD 0.x (`1`): `dim1`…
    Ncem,
}

impl EmdGroup {
    fn of(loc: &h5::Location) -> Option<EmdGroup> {
        let a = loc.attr("emd_group_type").ok()?;
        // An integer attribute read as text would convert, so ask for the
        // integer first.
        if let Ok(n) = a.read_scalar::<i64>() {
            return (n == 1).then_some(EmdGroup::Ncem);
        }
        (string_attr(loc, "emd_group_type")? == "array").then_some(EmdGroup::Array)
    }

    fn first_dim(self) -> usize {
        match self {
            EmdGroup::Array => 0,
            EmdGroup::Ncem => 1,
        }
    }
}

/// Data groups nested deeper than this are not searched.
const EMD_DEPTH: usize = 4;

/// The 4-D array of an EMD file (`/root/datacube/data`), or `None` when
/// the file is not EMD (its root has neither `emd_group_type = "file"` nor
/// `version_major`). An EMD file with no 4-D array, or with several
/// that are not told apart by py4DSTEM's `DataCube` class, is refused
/// with the candidates named.
pub fn find_emd_array(path: &Path) -> Result<Option<String>, ConvertError> {
    crate::regular_file::open(path).map_err(|e| ConvertError::io(path, e))?;
    let file = open_file(path)
        .map_err(|e| ConvertError::input(path, format!("not a readable HDF5 file: {e}")))?;
    // EMD 1.0 marks the file; NCEM's files carry the version at the root.
    // Anything else (a DECTRIS master file with thousands of external
    // links) is not searched at all.
    let emd_file = string_attr(&file, "emd_group_type").as_deref() == Some("file")
        || file.attr("version_major").is_ok();
    if !emd_file {
        return Ok(None);
    }
    // (dataset path, is a py4DSTEM DataCube)
    let mut found: Vec<(String, bool)> = Vec::new();
    let top = file
        .group("/")
        .map_err(|e| ConvertError::input(path, e.to_string()))?;
    let mut todo = vec![(top, 0)];
    // Groups and arrays met so far, by identity: one reached again (a
    // second hard link, a soft or external link back into the file, a
    // loop) is taken once. Without it, 120 links from the root to itself
    // made the search exponential, and one array under two names was
    // refused as "several".
    let mut seen: Vec<(u64, h5::LocationToken)> = Vec::new();
    let mut first_time = |object: &h5::Location| match object.loc_info() {
        Ok(info) if !seen.contains(&(info.fileno, info.token)) => {
            seen.push((info.fileno, info.token));
            true
        }
        _ => false,
    };
    while let Some((group, depth)) = todo.pop() {
        if !first_time(&group) {
            continue;
        }
        if EmdGroup::of(&group).is_some() {
            if let Ok(ds) = group.dataset("data") {
                if ds.ndim() == 4 && first_time(&ds) {
                    let cube = string_attr(&group, "python_class").as_deref() == Some("DataCube");
                    found.push((ds.name(), cube));
                }
            }
        }
        if depth < EMD_DEPTH {
            for name in group.member_names().unwrap_or_default() {
                // A link to a FIFO would block the search (see
                // `check_external_links`); it holds no EMD array.
                if unreadable_link(path, &group, &name).is_some() {
                    continue;
                }
                if let Ok(g) = group.group(&name) {
                    todo.push((g, depth + 1));
                }
            }
        }
    }
    if found.is_empty() {
        return Err(ConvertError::input(
            path,
            "an EMD file without a 4-D array; name a dataset as FILE:/path",
        ));
    }
    found.sort();
    if found.len() > 1 && found.iter().filter(|(_, cube)| *cube).count() == 1 {
        found.retain(|(_, cube)| *cube);
    }
    match &found[..] {
        [(one, _)] => Ok(Some(one.clone())),
        many => Err(ConvertError::input(
            path,
            format!(
                "holds several 4-D EMD arrays ({}); name one as FILE:/path",
                many.iter()
                    .map(|(p, _)| p.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// Spacing and unit of an EMD dimension vector.
fn emd_dim(group: &h5::Group, i: usize) -> Option<(f64, String, String)> {
    let ds = group.dataset(&format!("dim{i}")).ok()?;
    // The first two entries give the step: the vector may be declared of
    // any length, stored or not, so it is not read whole.
    if ds.ndim() != 1 || ds.size() < 2 {
        return None;
    }
    let v: Vec<f64> = ds.read_slice_1d(0..2).ok()?.to_vec();
    let step = v[1] - v[0];
    let units = string_attr(&ds, "units").unwrap_or_default();
    let name = string_attr(&ds, "name").unwrap_or_default();
    Some((step, units, name))
}

fn angstrom(step: f64, unit: &str) -> Option<f64> {
    let f = match unit.trim() {
        "m" => 1e10,
        "nm" => 10.0,
        "A" | "Å" | "angstrom" => 1.0,
        "pm" => 0.01,
        _ => return None,
    };
    Some(step * f)
}

fn reciprocal(step: f64, unit: &str) -> Option<(f64, DetectorUnit)> {
    Some(match unit.trim() {
        "mrad" => (step, DetectorUnit::Mrad),
        "rad" => (step * 1e3, DetectorUnit::Mrad),
        "1/nm" | "nm^-1" => (step / 10.0, DetectorUnit::InverseAngstrom),
        "1/A" | "1/Å" | "A^-1" => (step, DetectorUnit::InverseAngstrom),
        _ => return None,
    })
}

/// What a file `qem convert X.qem X.emd` wrote carries beyond the values
/// (see `emd.rs`), in the root's `metadatabundle/qem`: the validity mask
/// (`valid_mask`, true = valid) and the original `scientific_metadata`.
/// Anything that does not fit the array is left out, as if absent.
fn ours(file: &h5::File, array_group: &str, description: &mut Description) {
    let [_, _, rows, columns] = description.shape;
    let root = array_group
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default();
    let qem = format!("/{root}/metadatabundle/qem");
    if let super::Content::Counts { valid, .. } = &mut description.content {
        let mask = file
            .dataset(&format!("{qem}/valid_mask"))
            .ok()
            .filter(|ds| ds.shape() == [rows as usize, columns as usize])
            .and_then(|ds| ds.read_raw::<bool>().ok());
        if let Some(mask) = mask.filter(|m| m.iter().any(|v| !v)) {
            *valid = Some(mask);
        }
    }
    let original = file
        .dataset(&format!("{qem}/scientific_metadata"))
        .and_then(|ds| ds.read_scalar::<VarLenUnicode>())
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(s.as_str()).ok())
        .filter(|v| crate::qem::ScientificMetadata::parse(v, &description.shape).is_ok());
    if let Some(sm) = original {
        description.scientific_metadata = sm;
    }
}

pub struct Hdf5Source {
    description: Description,
    path: PathBuf,
    name: String,
    dataset: h5::Dataset,
    narrowing: Narrowing,
    /// The dataset's own dimensions (3-D or 4-D).
    dims: Vec<u64>,
    bytes: Vec<u8>,
}

/// The file an external link names, or `None` for any other link.
pub(super) fn linked_file(group: &h5::Group, name: &str) -> Option<String> {
    use hdf5_metno_sys::{h5l, h5p::H5P_DEFAULT};
    let cname = std::ffi::CString::new(name).ok()?;
    // A link value is a flags byte and two C strings; 4 KiB holds any
    // path a DECTRIS master file writes. The library copies at most 4096
    // bytes, so the last byte stays 0 and unpacking a longer, cut value
    // finds an end to every string (it fails instead of overrunning).
    let mut value = vec![0u8; 4097];
    h5::sync::sync(|| unsafe {
        if h5l::H5Lget_val(
            group.id(),
            cname.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len() - 1,
            H5P_DEFAULT,
        ) < 0
        {
            return None;
        }
        let (mut flags, mut file, mut object) = (0u32, std::ptr::null(), std::ptr::null());
        if h5l::H5Lunpack_elink_val(
            value.as_ptr().cast(),
            value.len(),
            &mut flags,
            &mut file,
            &mut object,
        ) < 0
            || file.is_null()
        {
            return None;
        }
        Some(
            std::ffi::CStr::from_ptr(file)
                .to_string_lossy()
                .into_owned(),
        )
    })
}

/// Refuses a path to an HDF5 object through an external link to anything
/// but a regular file: the library opens a linked file by its name, and
/// would wait forever on a FIFO. Each link on `object` (`/a/b/data`) is
/// looked at before the library follows it. A linked file that is missing
/// is left to the library's own error.
pub(super) fn check_external_links(
    path: &Path,
    file: &h5::File,
    object: &str,
) -> Result<(), ConvertError> {
    let parts: Vec<&str> = object.split('/').filter(|p| !p.is_empty()).collect();
    for i in 0..parts.len() {
        let Ok(group) = file.group(&format!("/{}", parts[..i].join("/"))) else {
            return Ok(());
        };
        if let Some(reason) = unreadable_link(path, &group, parts[i]) {
            return Err(ConvertError::input(
                path,
                format!("/{} {reason}", parts[..=i].join("/")),
            ));
        }
    }
    Ok(())
}

/// Which kind of name the library looks up: its search differs only in
/// the environment variable that puts folders before the usual places.
#[derive(Clone, Copy)]
pub(super) enum Linked {
    /// The file of an external link (`HDF5_EXT_PREFIX`).
    Link,
    /// The source file of a virtual dataset (`HDF5_VDS_PREFIX`).
    Virtual,
}

/// Every path the library may open for `name`, named in a link or a
/// virtual mapping of the file `path`, in the order it tries them: an
/// absolute `name` as it is (then, as the library does, its last
/// component alone in the places below); each folder of the prefix
/// variable (`${ORIGIN}` is `path`'s folder); `path`'s folder; the working
/// directory; the folder of the file `path` resolves to, where it is a
/// symbolic link.
fn search(path: &Path, name: &str, kind: Linked) -> Vec<PathBuf> {
    let origin = folder_of(path);
    let mut found = Vec::new();
    let mut name = Path::new(name);
    if name.is_absolute() {
        found.push(name.to_path_buf());
        let Some(last) = name.file_name() else {
            return found;
        };
        name = Path::new(last);
    }
    let var = match kind {
        Linked::Link => "HDF5_EXT_PREFIX",
        Linked::Virtual => "HDF5_VDS_PREFIX",
    };
    if let Some(prefixes) = std::env::var_os(var) {
        for prefix in prefixes
            .to_string_lossy()
            .split(':')
            .filter(|p| !p.is_empty())
        {
            let prefix = prefix.replace("${ORIGIN}", &origin.to_string_lossy());
            found.push(Path::new(&prefix).join(name));
        }
    }
    found.push(origin.join(name));
    found.push(name.to_path_buf());
    if let Some(resolved) = path.canonicalize().ok().as_deref().and_then(Path::parent) {
        let there = resolved.join(name);
        if !found.contains(&there) {
            found.push(there);
        }
    }
    found
}

/// The folder of the file `path`, where the files it names by relative
/// names belong.
pub(super) fn folder_of(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new("."))
}

/// The file the library will open for `name` (see [`search`]): the first
/// that exists, `Ok(None)` for none. `Err` names the first that exists
/// and is not a regular file (a FIFO, a device), which the library would
/// open and wait on for ever. Folders it passes by, as the library does.
pub(super) fn located(
    path: &Path,
    name: &str,
    kind: Linked,
) -> Result<Option<PathBuf>, (PathBuf, std::io::Error)> {
    for candidate in search(path, name, kind) {
        match std::fs::metadata(&candidate) {
            Err(_) => continue,
            Ok(meta) if meta.is_dir() => continue,
            Ok(_) => {}
        }
        return match crate::regular_file::open(&candidate) {
            Ok(_) => Ok(Some(candidate)),
            Err(e) => Err((candidate, e)),
        };
    }
    Ok(None)
}

/// Why the external link `name` of `group` must not be followed: the
/// file the library would open for it is not a regular file.
fn unreadable_link(path: &Path, group: &h5::Group, name: &str) -> Option<String> {
    let file = linked_file(group, name)?;
    located(path, &file, Linked::Link)
        .err()
        .map(|(linked, e)| format!("links to {}, which cannot be read: {e}", linked.display()))
}

/// Virtual datasets are followed to their sources before the library
/// reads them: a virtual dataset whose sources lead back to itself made
/// the library recurse until the stack overflowed, and a source file that
/// is a FIFO would block it. Refuses a cycle, a chain deeper than
/// [`VIRTUAL_DEPTH`], and a source file that is not a regular file.
pub(super) fn check_virtual(path: &Path, object: &str) -> Result<(), ConvertError> {
    let mut chain = Vec::new();
    follow_virtual(path, object, &mut chain)
        .map_err(|reason| ConvertError::input(path, format!("{object} {reason}")))
}

/// Virtual datasets nested deeper than this are refused.
const VIRTUAL_DEPTH: usize = 8;

/// `chain`: the (file, dataset) pairs from the dataset asked for down to
/// `file`'s `object`.
fn follow_virtual(
    file: &Path,
    object: &str,
    chain: &mut Vec<(PathBuf, String)>,
) -> Result<(), String> {
    let here = (
        file.canonicalize().unwrap_or_else(|_| file.to_path_buf()),
        format!("/{}", object.trim_start_matches('/')),
    );
    if chain.contains(&here) {
        return Err(format!(
            "is a virtual dataset whose sources lead back to {}:{}",
            here.0.display(),
            here.1
        ));
    }
    if chain.len() >= VIRTUAL_DEPTH {
        return Err(format!(
            "is a virtual dataset whose sources nest more than {VIRTUAL_DEPTH} deep"
        ));
    }
    let Ok(opened) = open_file(file) else {
        // The library's own error comes when the data is read.
        return Ok(());
    };
    let Ok(dataset) = opened.dataset(object) else {
        return Ok(());
    };
    if dataset.layout() != h5::plist::dataset_create::Layout::Virtual {
        return Ok(());
    }
    let sources_named = |e: String| format!("is a virtual dataset {e}");
    let mut sources: Vec<(PathBuf, String)> = Vec::new();
    for (file_name, dataset_name) in virtual_sources(&dataset).map_err(sources_named)? {
        // "." is the virtual dataset's own file; other names are looked
        // up as the library looks them up. A missing source reads as the
        // fill value.
        let source = if file_name == "." {
            file.to_path_buf()
        } else {
            match located(file, &file_name, Linked::Virtual) {
                Ok(Some(source)) => source,
                Ok(None) => continue,
                Err((source, e)) => {
                    return Err(format!(
                        "is a virtual dataset with a source in {}, which cannot be read: {e}",
                        source.display()
                    ))
                }
            }
        };
        if !sources.contains(&(source.clone(), dataset_name.clone())) {
            sources.push((source, dataset_name));
        }
    }
    chain.push(here);
    for (source, name) in sources {
        follow_virtual(&source, &name, chain)?;
    }
    chain.pop();
    Ok(())
}

/// The (file, dataset) names of a virtual dataset's mappings. Read from
/// the library directly: `hdf5_metno`'s own list gives up on the whole
/// list (returning none) when it cannot express one mapping's selection.
fn virtual_sources(dataset: &h5::Dataset) -> Result<Vec<(String, String)>, String> {
    use hdf5_metno_sys::h5p::{
        H5Pget_virtual_count, H5Pget_virtual_dsetname, H5Pget_virtual_filename,
    };
    let dcpl = dataset.dcpl().map_err(|e| e.to_string())?;
    let id = dcpl.id();
    // A name of the length the library reports, up to a bound: names come
    // from the file.
    let name = |get: &dyn Fn(*mut std::ffi::c_char, usize) -> isize| -> Option<String> {
        let len = usize::try_from(get(std::ptr::null_mut(), 0)).ok()?;
        if len > 4096 {
            return None;
        }
        let mut buffer = vec![0u8; len + 1];
        (get(buffer.as_mut_ptr().cast(), buffer.len()) >= 0).then(|| {
            buffer.truncate(len);
            String::from_utf8_lossy(&buffer).into_owned()
        })
    };
    h5::sync::sync(|| {
        let mut count = 0;
        // SAFETY: `id` is a live dataset creation list; `count` is written.
        if unsafe { H5Pget_virtual_count(id, &mut count) } < 0 {
            return Err("whose mappings cannot be read".to_string());
        }
        (0..count)
            .map(|i| {
                // SAFETY: as above; `name` passes a null pointer with size 0
                // (the call then only reports the length) or a buffer of
                // the size it passes.
                let file = name(&|s, n| unsafe { H5Pget_virtual_filename(id, i, s, n) });
                let data = name(&|s, n| unsafe { H5Pget_virtual_dsetname(id, i, s, n) });
                file.zip(data)
                    .ok_or_else(|| format!("whose mapping {i} cannot be read"))
            })
            .collect()
    })
}

/// The library's whole error stack, outermost first. Its one-line `Display`
/// keeps only the outermost and innermost frames, which drops the reason in
/// between (an external link's file is "truncated", say).
pub(super) fn library_error(e: &h5::Error) -> String {
    let h5::Error::HDF5(stack) = e else {
        return e.to_string();
    };
    // A chunk one of our filters could not decode: why, after where.
    let filter = super::hdf5_filters::take_error()
        .map(|why| format!(": {why}"))
        .unwrap_or_default();
    let text = match stack.clone().expand() {
        Ok(frames) if !frames.is_empty() => {
            let mut descs: Vec<&str> = Vec::new();
            for f in frames.iter() {
                if !descs.contains(&f.desc()) {
                    descs.push(f.desc());
                }
            }
            format!("{}(): {}", frames[0].func(), descs.join(": "))
        }
        _ => e.to_string(),
    };
    text + &filter
}

impl Hdf5Source {
    pub fn open(path: &Path, name: &str, options: &Options) -> Result<Hdf5Source, ConvertError> {
        let err = |what: &str, e: h5::Error| {
            ConvertError::input(path, format!("{what}: {}", library_error(&e)))
        };
        // HDF5 opens the file itself; check first that it is one.
        crate::regular_file::open(path).map_err(|e| ConvertError::io(path, e))?;
        let file = open_file(path).map_err(|e| err("not a readable HDF5 file", e))?;
        check_external_links(path, &file, name)?;
        check_virtual(path, name)?;
        let dataset = file.dataset(name).map_err(|e| err(name, e))?;
        let dims: Vec<u64> = dataset.shape().iter().map(|&d| d as u64).collect();
        let shape = shape4(path, &dims, options.scan)?;
        let descriptor = dataset
            .dtype()
            .and_then(|t| t.to_descriptor())
            .map_err(|e| err(name, e))?;
        let dtype = dtype_of(&descriptor).ok_or_else(|| {
            ConvertError::input(
                path,
                format!("{name} holds {descriptor:?}, not integers or floats"),
            )
        })?;
        let narrowing = Narrowing::plan(SourceDtype::little(dtype), options.allow_float_rounding);
        let mut calibration = Calibration {
            processing: narrowing.record.iter().cloned().collect(),
            provenance: "source file".into(),
            ..Calibration::default()
        };
        let mut source_metadata = Map::new();
        source_metadata.insert("hdf5_dataset".into(), name.into());
        let parent = name
            .rsplit_once('/')
            .map(|(p, _)| p)
            .filter(|p| !p.is_empty())
            .unwrap_or("/");
        let mut format = "hdf5";
        if let Ok(group) = file.group(parent) {
            let emd = EmdGroup::of(&group);
            if let (Some(emd), 4) = (emd, dims.len()) {
                format = "emd";
                let first = emd.first_dim();
                let d: Vec<_> = (first..first + 4).map(|i| emd_dim(&group, i)).collect();
                for (i, dim) in d.iter().enumerate() {
                    if let Some((step, units, dname)) = dim {
                        source_metadata.insert(
                            format!("dim{}", first + i),
                            json!({"name": dname, "units": units, "step": step}),
                        );
                    }
                }
                if let (Some((r, ru, _)), Some((c, cu, _))) = (&d[0], &d[1]) {
                    if let (Some(r), Some(c)) = (angstrom(*r, ru), angstrom(*c, cu)) {
                        calibration.scan_sampling_angstrom = Some([r, c]);
                    }
                }
                if let (Some((r, ru, _)), Some((c, cu, _))) = (&d[2], &d[3]) {
                    if let (Some((r, a)), Some((c, b))) = (reciprocal(*r, ru), reciprocal(*c, cu)) {
                        if a == b {
                            calibration.detector_sampling = Some(([r, c], a));
                        }
                    }
                }
            }
        }
        calibration.source_metadata = source_metadata;
        let mut description = foreign(path, shape, narrowing.stored, &calibration, format, &[])?;
        if format == "emd" {
            ours(&file, parent, &mut description);
        }
        Ok(Hdf5Source {
            description,
            path: path.to_path_buf(),
            name: name.to_string(),
            dataset,
            narrowing,
            dims,
            bytes: Vec::new(),
        })
    }

    /// Reads frames `first..first + n` (within one scan row of a 4-D
    /// dataset) as little-endian source elements into `self.bytes`.
    fn read_run(&mut self, first: u64, n: u64) -> Result<(), ConvertError> {
        use ndarray::s;
        let fail = |e: h5::Error| {
            ConvertError::input(
                &self.path,
                format!(
                    "{} frames {first}..{}: {}",
                    self.name,
                    first + n,
                    library_error(&e)
                ),
            )
        };
        self.bytes.clear();
        macro_rules! read {
            ($t:ty) => {{
                let v: ndarray::ArrayD<$t> = if self.dims.len() == 4 {
                    let (r, c) = (
                        (first / self.dims[1]) as usize,
                        (first % self.dims[1]) as usize,
                    );
                    self.dataset
                        .read_slice(s![r, c..c + n as usize, .., ..])
                        .map_err(fail)?
                } else {
                    self.dataset
                        .read_slice(s![first as usize..(first + n) as usize, .., ..])
                        .map_err(fail)?
                };
                self.bytes.extend(v.iter().flat_map(|x| x.to_le_bytes()));
            }};
        }
        match self.narrowing.source.dtype {
            DType::U8 | DType::Bool => read!(u8),
            DType::U16 => read!(u16),
            DType::U32 => read!(u32),
            DType::U64 => read!(u64),
            DType::I8 => read!(i8),
            DType::I16 => read!(i16),
            DType::I32 => read!(i32),
            DType::I64 => read!(i64),
            DType::F32 => read!(f32),
            DType::F64 => read!(f64),
        }
        Ok(())
    }
}

impl Source for Hdf5Source {
    fn description(&self) -> &Description {
        &self.description
    }

    fn description_mut(&mut self) -> &mut Description {
        &mut self.description
    }

    fn read_frames(&mut self, first: u64, out: &mut [u8]) -> Result<(), ConvertError> {
        let stored = self.description.frame_bytes();
        let total = (out.len() / stored) as u64;
        let pixels = self.description.pixels();
        let row = if self.dims.len() == 4 {
            self.dims[1]
        } else {
            total.max(1)
        };
        let (mut frame, mut at) = (first, 0usize);
        while frame < first + total {
            // A 4-D dataset is read in runs that stay inside one scan row.
            let n = (row - frame % row).min(first + total - frame);
            self.read_run(frame, n)?;
            let len = n as usize * stored;
            let shape = self.description.shape;
            self.narrowing
                .apply(&self.bytes, &mut out[at..at + len])
                .map_err(|(i, v)| {
                    not_representable(
                        &self.path,
                        &self.narrowing,
                        &shape,
                        frame * pixels + i as u64,
                        &v,
                    )
                })?;
            at += len;
            frame += n;
        }
        Ok(())
    }
}
