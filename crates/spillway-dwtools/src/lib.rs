//! DataWarp's command line as thin clients of the manager's REST API (`/dw/v1/`):
//! `dwstat` prints status tables, `dwcli` creates, changes, removes and lists resources,
//! `dw_wlm_cli` drives a job's burst-buffer phases for Slurm.
//! Neither keeps state; every answer comes from the manager. See docs/cli.md.
//!
//! * `connect` — reaching the manager (`ApiClient::munge`), raw answers, failures and
//!   exit codes.
//! * `args`    — option values (sizes, octal modes, access modes, host lists).
//! * `format`  — cells: times, sizes, booleans, empty text.
//! * `table`   — aligned text tables.
//! * `render`  — dwstat's table of each resource.
//! * `json`    — `--json`: the manager's answer, re-indented only.
//! * `stage`   — `dwcli stage`: staging, progress, waiting.
//! * `wlm`     — `dw_wlm_cli`, the program Slurm's burst_buffer/datawarp plugin runs.
//! * `dwstat`, `dwcli` — the two commands (their binaries only call `main`).

// `pub` marks what other crates may name; everything else is `pub(crate)` or narrower.
#![warn(unreachable_pub)]

pub mod args;
pub mod connect;
pub mod dwcli;
pub mod dwstat;
pub mod format;
pub mod json;
pub mod render;
pub mod stage;
pub mod table;
pub mod wlm;

use std::io::Write;
use std::process::ExitCode;

/// Print a command's output, or its failure on stderr, and give the exit status.
pub fn finish(prog: &str, result: Result<String, connect::Failure>) -> ExitCode {
    match result {
        Ok(out) => {
            let mut stdout = std::io::stdout().lock();
            match stdout
                .write_all(out.as_bytes())
                .and_then(|()| stdout.flush())
            {
                Ok(()) => ExitCode::SUCCESS,
                // `dwstat | head` closing the pipe early is not an error of ours.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{prog}: cannot write the output: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(f) => {
            eprint!("{}", f.report(prog));
            ExitCode::from(f.exit_code() as u8)
        }
    }
}
