//! Masked exports (`qem convert --masked`): the pixels the detector validity
//! mask marks invalid are written as zero, so tools that know nothing of the
//! mask (Fiji, a plain `numpy.sum`) do not count hot or dead pixels.

#[cfg(test)]
use crate::qem::ValidMask;

/// The invalid pixels of one detector frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidPixels {
    pixels: usize,
    invalid: Vec<usize>,
}

impl InvalidPixels {
    /// The invalid pixels of a header's mask (the tests' way to build one).
    #[cfg(test)]
    pub fn of(mask: &ValidMask) -> Self {
        InvalidPixels {
            pixels: mask.pixels(),
            invalid: (0..mask.pixels()).filter(|&p| !mask.is_valid(p)).collect(),
        }
    }

    /// The invalid pixels of a validity list in pixel order (`true` = valid).
    pub fn of_flags(valid: &[bool]) -> Self {
        InvalidPixels {
            pixels: valid.len(),
            invalid: (0..valid.len()).filter(|&p| !valid[p]).collect(),
        }
    }

    /// Zeroes the invalid pixels of each frame in `frames`: whole frames in
    /// C order, `element` bytes per value. A trailing partial frame is left
    /// as it is (callers pass whole frames).
    pub fn zero(&self, frames: &mut [u8], element: usize) {
        let frame_bytes = self.pixels * element;
        if frame_bytes == 0 || self.invalid.is_empty() {
            return;
        }
        for frame in frames.chunks_exact_mut(frame_bytes) {
            for &p in &self.invalid {
                frame[p * element..(p + 1) * element].fill(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_invalid_pixels_become_zero_in_every_frame() {
        // 2 x 3 detector, pixels 1 and 5 invalid: flags 101110 -> 0b1011_1000.
        let mask = ValidMask::parse("b8", 6).unwrap();
        let invalid = InvalidPixels::of(&mask);
        let mut frames: Vec<u8> = (1..=24).collect(); // two uint16 frames
        invalid.zero(&mut frames, 2);
        let values: Vec<u16> = frames
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        let want: Vec<u16> = (0..12)
            .map(|i| {
                if i % 6 == 1 || i % 6 == 5 {
                    0
                } else {
                    u16::from_le_bytes([2 * i as u8 + 1, 2 * i as u8 + 2])
                }
            })
            .collect();
        assert_eq!(values, want);
        let all = InvalidPixels::of(&ValidMask::all_valid(6));
        let mut kept = vec![7u8; 12];
        all.zero(&mut kept, 1);
        assert_eq!(kept, vec![7u8; 12]);
    }
}
