//! A mount's watch of one server (docs/wire-protocol.md, "Notices"): the
//! connection the server sends change notices on, their messages decoded, and the
//! stub that opens it (`Instance::watch`) beside the one that waits for them
//! (`Instance::await_notices`).

use crate::Instance;
use spillway_types::{Attr, Errno, ServerIndex};
use spillway_wire::messages::{ChangedNotice, NOTICE_CHANGED};
use spillway_wire::{Watch, WatchCloser, Wire};
use std::io;

/// What a server told, and the id to answer (`Watching::done`) once acted on.
#[derive(Debug)]
pub enum Told {
    /// Another mount changed a file this mount holds open: its attributes now.
    Changed { id: u64, attr: Attr },
    /// A notice this build does not know, or could not decode: answer it all the same.
    Other { id: u64 },
}

pub struct Watching(Watch);

/// Closes a `Watching` another thread reads.
pub struct WatchingCloser(WatchCloser);

impl WatchingCloser {
    pub fn close(&self) {
        self.0.close()
    }
}

impl Watching {
    /// The next notice, waiting as long as it takes; an error when the connection is
    /// gone (notices may have been lost: make a new watch).
    pub fn next_told(&mut self) -> io::Result<Told> {
        let n = self.0.next_notice()?;
        if n.opcode == NOTICE_CHANGED {
            match ChangedNotice::from_bytes(&n.body) {
                Ok(c) => {
                    return Ok(Told::Changed {
                        id: n.id,
                        attr: c.attr,
                    })
                }
                Err(e) => tracing::debug!("undecodable notice: {e}"),
            }
        }
        Ok(Told::Other { id: n.id })
    }

    /// The notice `id` was acted on.
    pub fn done(&self, id: u64) -> io::Result<()> {
        self.0.done(id)
    }

    pub fn close(&self) {
        self.0.close()
    }

    pub fn closer(&self) -> io::Result<WatchingCloser> {
        self.0.closer().map(WatchingCloser)
    }
}

impl Instance {
    /// The session at server `i` that calls made now land on (connecting if needed):
    /// a different one than before means the server forgot what the older held (its
    /// opens), as after a restart.
    pub fn session_at(&self, i: ServerIndex) -> Result<u64, Errno> {
        self.server(i)?.session().map_err(|e| e.errno())
    }

    /// A watching connection to server `i`, made as this instance's connections are
    /// (its mount, a fresh credential).
    pub fn watch(&self, i: ServerIndex) -> Result<Watching, Errno> {
        Watch::open(self.server(i)?)
            .map(Watching)
            .map_err(|e| e.errno())
    }
}
