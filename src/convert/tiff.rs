//! Multi-page TIFF output: one page per frame, in scan order, laid out by
//! the same encoder the mount's TIFF views use.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::element::Element;
use super::{ConvertError, Description, Sink};
use crate::export::tiff::{Sample, TiffLayout};
use crate::publish::{AtomicFile, Overwrite};

pub struct TiffSink {
    path: PathBuf,
    layout: TiffLayout,
    out: BufWriter<AtomicFile>,
    frame_bytes: usize,
    page: u64,
    padding: Vec<u8>,
}

impl TiffSink {
    pub fn create(path: &Path, d: &Description, force: bool) -> Result<TiffSink, ConvertError> {
        let sample = match d.element {
            Element::U8 => Sample::U8,
            Element::U16 => Sample::U16,
            Element::F32 => Sample::F32,
        };
        // tifffile reads a JSON description with "shape" back as the 4-D array.
        let description = serde_json::json!({
            "shape": d.shape,
            "axes": ["scan_row", "scan_column", "detector_row", "detector_column"],
        })
        .to_string();
        let layout = TiffLayout::new(
            d.shape[2] as u32,
            d.shape[3] as u32,
            sample,
            d.frames(),
            &description,
        );
        let overwrite = if force {
            Overwrite::Replace
        } else {
            Overwrite::Never
        };
        let target = AtomicFile::create(path, overwrite)?;
        let mut out = BufWriter::with_capacity(1 << 20, target);
        out.write_all(&layout.header())
            .map_err(|e| ConvertError::io(path, e))?;
        Ok(TiffSink {
            path: path.to_path_buf(),
            padding: vec![0; layout.page_padding()],
            layout,
            out,
            frame_bytes: d.frame_bytes(),
            page: 0,
        })
    }
}

impl Sink for TiffSink {
    fn write_frames(&mut self, window: &[u8]) -> Result<(), ConvertError> {
        for frame in window.chunks_exact(self.frame_bytes.max(1)) {
            let prefix = self.layout.page_prefix(self.page);
            self.out
                .write_all(&prefix)
                .and_then(|()| self.out.write_all(frame))
                .and_then(|()| self.out.write_all(&self.padding))
                .map_err(|e| ConvertError::io(&self.path, e))?;
            self.page += 1;
        }
        Ok(())
    }

    fn publish(self: Box<Self>) -> Result<(), ConvertError> {
        let target = self
            .out
            .into_inner()
            .map_err(|e| ConvertError::io(&self.path, e.into_error()))?;
        Ok(target.publish()?)
    }
}
