//! `qem`: inspect, check, compare and convert `.qem` 4D-STEM acquisitions.

use clap::Parser;
use qemfs_cmds::out_of_memory::Refusing;
use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: Refusing = Refusing {
    hint: " (work on a file holds about 256 MiB plus 20 bytes per detector pixel; \
           see Memory in `qem --help`)",
};

fn main() -> ExitCode {
    // First, before any thread starts.
    qemfs_cmds::interrupt::install();
    let cli = match qemfs_cmds::qem_args::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Usage errors exit 2; --help and --version print and exit 0.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    qemfs_cmds::exit::finish(qemfs_cmds::qem_cmd::run(cli))
}
