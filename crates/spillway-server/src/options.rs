//! The storage server's command-line options, shared by its two launchers (`spillway
//! server` and the `spillway-server` binary): both take the same flags, described once,
//! and read the tunables file the same way.

use crate::ServerArgs;
use spillway_types::Tunables;
use std::path::PathBuf;

/// `--root DIR --listen ADDR [--tunables FILE]`.
#[derive(clap::Args, Debug)]
pub struct ServeOptions {
    /// Storage root: fragments, metadata and stripes live below it (created if missing).
    #[arg(long)]
    pub root: PathBuf,
    /// Address to listen on, e.g. 127.0.0.1:7000.
    #[arg(long)]
    pub listen: String,
    /// File of `key = value` tunables (`pfs_roots = /pfs:/scratch` names the PFS
    /// directories stages may use; without it the server refuses every stage).
    #[arg(long)]
    pub tunables: Option<PathBuf>,
}

impl ServeOptions {
    /// The server's arguments: the defaults, then the tunables file if one is named.
    pub fn into_args(self) -> Result<ServerArgs, String> {
        let mut tunables = Tunables::default();
        if let Some(path) = &self.tunables {
            tunables.apply_file(path)?;
        }
        Ok(ServerArgs {
            root: self.root,
            listen: self.listen,
            tunables,
        })
    }
}
