//! `semq`: inspect, compare, gate and encode `.semq` embedding states.

use qemfs_cmds::out_of_memory::Refusing;
use std::io::Write;
use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: Refusing = Refusing { hint: "" };

fn main() -> ExitCode {
    // First, before any thread starts.
    qemfs_cmds::interrupt::install();
    let argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    match qemfs_cmds::semq_args::parse(&argv) {
        Ok(cli) => qemfs_cmds::exit::finish(qemfs_cmds::semq_cmd::run(cli)),
        Err(rendered) => {
            // A closed pipe while printing help is not worth a complaint.
            let _ = std::io::stdout().write_all(rendered.stdout.as_bytes());
            let _ = std::io::stderr().write_all(rendered.stderr.as_bytes());
            ExitCode::from(rendered.status)
        }
    }
}
