//! `spillway-server --root DIR --listen ADDR [--tunables FILE] [--log-level LEVEL]`

use clap::Parser;
use spillway_server::options::ServeOptions;
use spillway_server::run_server;
use spillway_types::logging::stderr_line;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "spillway-server", version, about = "Spillway storage server")]
struct Args {
    #[command(flatten)]
    serve: ServeOptions,
    /// Log filter (error, warn, info, debug, trace, or tracing directives).
    #[arg(long, default_value = "info")]
    log_level: String,
}

fn main() -> ExitCode {
    // Whatever the server creates is private unless it says otherwise.
    spillway_types::files::private_umask();
    let args = Args::parse();
    // Logging that never panics: a full disk under the log must not kill the server.
    if let Err(e) = spillway_types::logging::init(&args.log_level) {
        stderr_line(&format!(
            "spillway-server: bad --log-level {}: {e}",
            args.log_level
        ));
        return ExitCode::from(2);
    }
    let server_args = match args.serve.into_args() {
        Ok(a) => a,
        Err(e) => {
            stderr_line(&format!("spillway-server: {e}"));
            return ExitCode::from(2);
        }
    };
    match run_server(server_args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            stderr_line(&format!("spillway-server: {e}"));
            ExitCode::FAILURE
        }
    }
}
