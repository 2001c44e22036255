//! `--gpu`: where the reductions behind `virtual/` run, shared by
//! `qemfs mount`, `qem ls/cat` and `qem show`.

use std::sync::Arc;

use clap::Args;
use qemfs::reduce::{Accelerator, Cpu};
use qemfs_gpu::Choice;

#[derive(Debug, Clone, Default, Args, serde::Serialize, serde::Deserialize)]
pub struct GpuArgs {
    /// Where virtual images, centre of mass and patterns are computed:
    /// auto (CUDA, else a hardware wgpu adapter, else the CPU), wgpu
    /// (software adapters too), cuda or off
    #[arg(long, value_name = "BACKEND", default_value_t = Choice::Auto)]
    pub gpu: Choice,
}

impl GpuArgs {
    /// The chosen backend, or the CPU reference when it is unavailable
    /// (`log` gets one line saying which, or why not).
    pub fn accelerator(&self, log: impl Fn(&str)) -> Arc<dyn Accelerator> {
        match qemfs_gpu::select(self.gpu, log) {
            Some(gpu) => Arc::from(gpu),
            None => Arc::new(Cpu),
        }
    }

    /// For a command-line tool: a fallback is only worth a line on stderr
    /// when the user asked for a particular backend.
    pub fn accelerator_quiet_on_auto(&self) -> Arc<dyn Accelerator> {
        let explicit = self.gpu != Choice::Auto;
        self.accelerator(|line| {
            if explicit {
                eprintln!("{line}");
            }
        })
    }
}
