//! `spillway-server --root DIR --listen ADDR [--tunables FILE] [--log-level LEVEL]`

use clap::Parser;
use spillway_server::{run_server, ServerArgs};
use spillway_types::Tunables;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "spillway-server", version, about = "Spillway storage server")]
struct Args {
    /// Storage root: fragments and the admin key live here (created if missing).
    #[arg(long)]
    root: PathBuf,
    /// Address to serve on, host:port.
    #[arg(long)]
    listen: String,
    /// File of `key = value` tunables.
    #[arg(long)]
    tunables: Option<PathBuf>,
    /// Log filter (error, warn, info, debug, trace, or tracing directives).
    #[arg(long, default_value = "info")]
    log_level: String,
}

fn main() -> ExitCode {
    // Whatever the server creates is private unless it says otherwise.
    spillway_types::files::private_umask();
    let args = Args::parse();
    let filter = match tracing_subscriber::EnvFilter::try_new(&args.log_level) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("spillway-server: bad --log-level {}: {e}", args.log_level);
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let mut tunables = Tunables::default();
    if let Some(path) = &args.tunables {
        if let Err(e) = tunables.apply_file(path) {
            eprintln!("spillway-server: {e}");
            return ExitCode::from(2);
        }
    }
    match run_server(ServerArgs {
        root: args.root,
        listen: args.listen,
        tunables,
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spillway-server: {e}");
            ExitCode::FAILURE
        }
    }
}
