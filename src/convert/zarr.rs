//! A Zarr store as a source: any 4-D uint8, uint16 or float32 array that
//! zarr-python writes, or a store `qem convert X.qem X.zarr` wrote (whose
//! `qem.header` attribute brings the original metadata back). The reading
//! itself is [`crate::zarr::store::ZarrSource`].

use std::path::{Path, PathBuf};

use super::element::Element;
use super::{describe, ConvertError, Description, Source};
use crate::qem::write::Calibration;
use crate::qem::Dtype;
use crate::zarr::store::ZarrSource;

pub struct ZarrIn {
    path: PathBuf,
    store: ZarrSource,
    description: Description,
}

impl ZarrIn {
    pub fn open(path: &Path) -> Result<ZarrIn, ConvertError> {
        let store =
            ZarrSource::open(path).map_err(|e| ConvertError::input(path, e.reason.clone()))?;
        let shape = store.shape().map(|s| s as u64);
        let defaults = describe::fresh_metadata(shape, &Calibration::default(), "zarr", &[])
            .map_err(|e| ConvertError::input(path, e.to_string()))?;
        let spec = store.write_spec(defaults);
        let element = match store.dtype() {
            Dtype::U8 => Element::U8,
            Dtype::U16 => Element::U16,
            Dtype::F32 => Element::F32,
        };
        Ok(ZarrIn {
            path: path.to_path_buf(),
            description: Description {
                shape,
                element,
                content: spec.content,
                scientific_metadata: spec.scientific_metadata,
                extra: spec.extra,
            },
            store,
        })
    }
}

impl Source for ZarrIn {
    fn description(&self) -> &Description {
        &self.description
    }

    fn description_mut(&mut self) -> &mut Description {
        &mut self.description
    }

    fn read_frames(&mut self, first: u64, out: &mut [u8]) -> Result<(), ConvertError> {
        self.store
            .read_frames(first as usize, out)
            .map_err(|e| ConvertError::input(&self.path, e.reason))
    }
}
