//! GPU implementations of [`qemfs::reduce::Accelerator`].
//!
//! * [`Wgpu`]: WGSL compute shaders through wgpu (Vulkan, or GL), which also
//!   runs on Mesa's software Vulkan (lavapipe), so CI tests it without a GPU.
//! * `Cuda` (cargo feature `cuda`, off by default): the same kernels in
//!   CUDA C (`kernels/qem.cu`), shipped as PTX and loaded through cudarc with
//!   dynamic loading, so a binary built with the feature still runs where no
//!   CUDA is installed. Off by default because its PTX, generated here with
//!   clang (no nvcc), has not yet run on a GPU; `scripts/gpu-device-check.sh`
//!   runs its tests on a GPU machine.
//!
//! Each backend decodes the count streams a request needs (every valid
//! pixel for moments or a pattern, else the masks' valid pixels, as the CPU
//! reference does) on the device, one invocation per stream, from the
//! arrays as stored, into a scratch buffer of at most 32 MiB reused pass
//! after pass, and reduces them there; the cube is never expanded on the
//! device. A stream that fails to decode becomes the CPU decoder's
//! [`QemError`](qemfs::qem::QemError), naming chunk and stream.
//!
//! Numerics: integer products (counts, scaled codes) equal the CPU
//! reference's exactly (u64 sums kept as u32 pairs with carry). Float
//! products follow the CPU's one summation rule step for step
//! ([`qemfs::reduce::Neumaier`]: Neumaier compensation, multiples of 2^126
//! carried in an integer so no partial sum overflows, non-finite terms only
//! flagged; the host computes each state's value with the same function).
//! The order differs from the CPU's (segments of 64 pixels merged in pixel
//! order; frames in order for the pattern), so results need not be
//! bit-identical: they agree with the CPU and with an exact reference
//! within `1e-6 + 1e-6 * M`, `M` the sum of the magnitudes of the finite
//! summed terms below 2^126 (spec §13's rtol = atol = 1e-6, relative to the
//! terms' magnitude; ±FLT_MAX terms are carried exactly). An overflowing
//! sum is ±inf, NaN comes only from a NaN or from both infinities among
//! the terms. Moment terms `row · value` are rounded to float32 before they
//! are summed (an overflowing one counts as an infinity). Pattern maxima
//! are exact.
//!
//! [`select`] picks a backend at start-up from `--gpu auto|wgpu|cuda|off`.

#[cfg(feature = "cuda")]
mod cuda_backend;
mod plan;
mod wgpu_backend;

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use qemfs::qem::QemFile;
use qemfs::reduce::{Accelerator, ReduceError};

#[cfg(feature = "cuda")]
pub use cuda_backend::Cuda;
pub use plan::{MAX_PIXELS, SCRATCH_VALUES};
pub use wgpu_backend::{OpenError, Wgpu};

/// Stored values of one block, frame-major, as decoded on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockValues {
    /// Integer counts or scaled codes.
    Codes(Vec<u16>),
    /// float32 bit patterns.
    FloatBits(Vec<u32>),
}

impl BlockValues {
    /// From decoded words: u16 values (one lane) or joined float32 bits.
    fn from_words(words: Vec<u32>, lanes: usize) -> BlockValues {
        if lanes == 1 {
            BlockValues::Codes(words.into_iter().map(|v| v as u16).collect())
        } else {
            BlockValues::FloatBits(words)
        }
    }
}

/// A GPU backend that also hands back a block's decoded stored values, for
/// parity checks against the CPU decoder and for decode benchmarks.
pub trait BlockDecoder: Accelerator {
    /// The stored values of `block`, decoded on the device.
    fn decode_block(&self, file: &QemFile, block: usize) -> Result<BlockValues, ReduceError>;

    /// Decodes every stream of `blocks` on the device, each checked as the
    /// CPU decoder checks it; only the fault records come back.
    fn decode_blocks(&self, file: &QemFile, blocks: Range<usize>) -> Result<(), ReduceError>;
}

/// Which backend to use (`--gpu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Choice {
    /// CUDA if a driver and device are present, else a hardware wgpu
    /// adapter, else none (the CPU).
    #[default]
    Auto,
    /// A wgpu adapter, software ones (lavapipe) included.
    Wgpu,
    /// CUDA only.
    Cuda,
    /// No accelerator: the CPU reference.
    Off,
}

impl FromStr for Choice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Choice::Auto),
            "wgpu" => Ok(Choice::Wgpu),
            "cuda" => Ok(Choice::Cuda),
            "off" => Ok(Choice::Off),
            other => Err(format!(
                "unknown GPU choice '{other}'; expected auto, wgpu, cuda or off"
            )),
        }
    }
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Choice::Auto => "auto",
            Choice::Wgpu => "wgpu",
            Choice::Cuda => "cuda",
            Choice::Off => "off",
        })
    }
}

/// Why CUDA is not available in a build without the `cuda` feature.
pub const CUDA_NOT_BUILT: &str =
    "cuda: this build has no CUDA backend (build qemfs-gpu with the `cuda` feature)";

/// Opens the CUDA backend, or says why not.
#[cfg(feature = "cuda")]
fn open_cuda() -> Result<(Box<dyn Accelerator>, String), String> {
    Cuda::new().map(|c| {
        let name = c.describe();
        (Box::new(c) as Box<dyn Accelerator>, name)
    })
}

#[cfg(not(feature = "cuda"))]
fn open_cuda() -> Result<(Box<dyn Accelerator>, String), String> {
    Err(CUDA_NOT_BUILT.into())
}

/// Picks an accelerator for `choice`, logging one line through `log` for
/// what was chosen or why nothing was. `None` means: use the CPU.
///
/// `auto` skips software adapters (lavapipe is slower than the CPU
/// decoder); `wgpu` accepts them.
pub fn select(choice: Choice, log: impl Fn(&str)) -> Option<Box<dyn Accelerator>> {
    let wgpu = |allow_software: bool| match Wgpu::new(allow_software) {
        Ok(gpu) => {
            log(&format!("gpu: wgpu on {}", gpu.describe()));
            Some(Box::new(gpu) as Box<dyn Accelerator>)
        }
        Err(why) => {
            log(&format!("gpu: {why}; reductions run on the CPU"));
            None
        }
    };
    let cuda = |quiet: bool| match open_cuda() {
        Ok((gpu, name)) => {
            log(&format!("gpu: cuda on {name}"));
            Some(gpu)
        }
        Err(why) => {
            if !quiet {
                log(&format!("gpu: {why}; reductions run on the CPU"));
            }
            None
        }
    };
    match choice {
        Choice::Off => None,
        Choice::Cuda => cuda(false),
        Choice::Wgpu => wgpu(true),
        // CUDA when present, else a hardware wgpu adapter, else the CPU
        // (one log line either way).
        Choice::Auto => cuda(true).or_else(|| {
            if gpu_device_present() {
                wgpu(false)
            } else {
                log(&format!("gpu: {NO_DEVICE}; reductions run on the CPU"));
                None
            }
        }),
    }
}

/// Why `auto` did not look for a wgpu adapter.
const NO_DEVICE: &str = "no GPU device (/dev/dri/renderD*, /dev/nvidia*, /dev/dxg)";

/// Whether the machine has a device node a hardware Vulkan driver can
/// drive: a DRM render node (Mesa's drivers, NVIDIA's with nvidia-drm),
/// NVIDIA's own nodes, or WSL's GPU. Without one no hardware adapter can
/// exist, and enumerating Vulkan's drivers to find that out loads them all
/// (Mesa's pull in LLVM): 80 ms and 58 MB for every `qem` command, and
/// 42 MiB a daemon keeps mapped for good, on every machine without a GPU.
pub fn gpu_device_present() -> bool {
    if !cfg!(target_os = "linux") {
        return true;
    }
    let render_node = std::fs::read_dir("/dev/dri").is_ok_and(|dir| {
        dir.flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("renderD"))
    });
    render_node
        || std::path::Path::new("/dev/nvidiactl").exists()
        || std::path::Path::new("/dev/dxg").exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shortcut of `auto` never hides a hardware adapter: where no
    /// GPU device node exists, wgpu finds no hardware adapter either.
    #[test]
    fn without_a_gpu_device_there_is_no_hardware_adapter() {
        if !gpu_device_present() {
            assert!(
                Wgpu::new(false).is_err(),
                "a hardware adapter without a device node"
            );
            let lines = std::cell::RefCell::new(vec![]);
            assert!(select(Choice::Auto, |l| lines.borrow_mut().push(l.to_string())).is_none());
            assert!(
                lines.borrow().iter().any(|l| l.contains(NO_DEVICE)),
                "{lines:?}"
            );
        }
    }

    #[test]
    fn choices_parse_and_print() {
        for c in [Choice::Auto, Choice::Wgpu, Choice::Cuda, Choice::Off] {
            assert_eq!(c.to_string().parse::<Choice>(), Ok(c));
        }
        assert!("gpu".parse::<Choice>().is_err());
        assert!("".parse::<Choice>().is_err());
    }

    /// Where no CUDA driver library exists, opening CUDA is an error with a
    /// reason, never a panic.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_without_a_driver_is_an_error() {
        // SAFETY: only probes for the driver library.
        let present = unsafe { cudarc::driver::sys::is_culib_present() };
        match Cuda::new() {
            Ok(c) => assert!(present, "opened {} without libcuda", c.describe()),
            Err(e) => assert!(present || e.contains("libcuda"), "{e}"),
        }
    }

    #[test]
    fn off_selects_nothing_and_says_nothing() {
        let lines = std::cell::RefCell::new(Vec::new());
        assert!(select(Choice::Off, |l| lines.borrow_mut().push(l.to_string())).is_none());
        assert!(lines.borrow().is_empty());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_says_so() {
        let lines = std::cell::RefCell::new(Vec::new());
        assert!(select(Choice::Cuda, |l| lines.borrow_mut().push(l.to_string())).is_none());
        assert_eq!(lines.borrow().len(), 1);
        assert!(
            lines.borrow()[0].contains(CUDA_NOT_BUILT),
            "{:?}",
            lines.borrow()
        );
    }
}
