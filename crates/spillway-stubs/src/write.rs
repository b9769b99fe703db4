//! The write stubs: bytes of a file go to the server of their stripe (`WriteReq` with
//! the bytes as bulk), with the space the caller charged them to (docs/data-plane.md,
//! "Space grants"). Three shapes for three callers:
//!
//! * `write_piece` — one piece, waited for (a write the grant does not cover: the
//!   server fits it into free space, or a prefix of it, or refuses it);
//! * `start_write_piece` / `queue_write_piece` — one piece put in flight owning its
//!   bytes, so it outlives the call starting it and is sent again after a reconnect
//!   (write-behind; queued for the connection's sending thread, or sent at once when
//!   the caller is about to wait for it);
//! * `write` — a run over any stripes, every piece in flight at once, waited for
//!   (a write-through).
//!
//! And `release_grant`, which gives unused grant space back to a server.
//!
//! A piece lies within one stripe (`Layout::pieces` cuts runs so); the stubs place it
//! with the layout, as every stub does, and never copy its bytes.

use crate::Instance;
use spillway_placement::Layout;
use spillway_types::{Errno, InodeNo, ServerIndex, StripeIndex};
use spillway_wire::messages::{GrantReleaseReq, WriteReply, WriteReq};
use spillway_wire::{OwnedCall, Payload};

/// What a write is paid with: `bytes` of it taken from this client's space grant of
/// session `epoch` on the stripe's server. `Charge::NONE`: nothing; the server fits
/// the bytes into its free space or refuses them (a shorter `written`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charge {
    pub epoch: u64,
    pub bytes: u32,
}

impl Charge {
    pub const NONE: Charge = Charge { epoch: 0, bytes: 0 };
}

/// A write in flight that owns its bytes (see `Instance::start_write_piece`).
pub struct PendingWrite(OwnedCall<WriteReq>);

impl PendingWrite {
    /// Wait for the reply (resent after a reconnect: writes are idempotent); the
    /// buffer comes back too, for reuse.
    pub fn wait(self) -> (Result<WriteReply, Errno>, Payload) {
        self.0.wait()
    }
}

fn write_req(ino: InodeNo, stripe: StripeIndex, within: u32, sync: bool, c: Charge) -> WriteReq {
    WriteReq {
        ino,
        stripe: stripe.0,
        offset: within,
        sync,
        grant_epoch: c.epoch,
        charged: c.bytes,
    }
}

impl Instance {
    /// Write `data`, which lies within one stripe, at file offset `offset` of `ino`,
    /// and wait for the reply (not synced).
    pub fn write_piece(
        &self,
        layout: &Layout,
        ino: InodeNo,
        offset: u64,
        data: &[u8],
        charge: Charge,
    ) -> Result<WriteReply, Errno> {
        let (stripe, within) = layout.locate(offset);
        let req = write_req(ino, stripe, within, false, charge);
        self.server(layout.server_of(stripe))?.call_bulk(&req, data)
    }

    /// Start writing `data`, which lies within one stripe, at file offset `offset` of
    /// `ino`; with `sync` the server fdatasyncs the file's dirty stripes before it
    /// answers. The call owns `data` until `PendingWrite::wait` hands it back. Sent
    /// before this returns: for a write its caller waits for soon (flush, fsync).
    pub fn start_write_piece(
        &self,
        layout: &Layout,
        ino: InodeNo,
        offset: u64,
        data: Payload,
        sync: bool,
        charge: Charge,
    ) -> Result<PendingWrite, Errno> {
        let (ep, req) = self.piece(layout, ino, offset, sync, charge)?;
        Ok(PendingWrite(OwnedCall::start(&ep, &req, data)))
    }

    /// `start_write_piece` (not synced), queued for the connection's sending thread:
    /// returns before the bytes are on the socket, so the caller (a write-behind)
    /// goes on while they cross it.
    pub fn queue_write_piece(
        &self,
        layout: &Layout,
        ino: InodeNo,
        offset: u64,
        data: Payload,
        charge: Charge,
    ) -> Result<PendingWrite, Errno> {
        let (ep, req) = self.piece(layout, ino, offset, false, charge)?;
        Ok(PendingWrite(OwnedCall::queue(&ep, &req, data)))
    }

    /// An empty slot of the client's arena for up to `want` bytes of a write to
    /// `server`, when that server is on this host (its bytes then reach it through
    /// shared memory) and a slot is free; None: use the heap.
    pub fn arena_payload(&self, server: ServerIndex, want: usize) -> Option<Payload> {
        if want > self.arena_slot_size() {
            return None;
        }
        self.server(server).ok()?.arena_buf().map(Payload::Arena)
    }

    /// The endpoint of the server of the stripe `offset` lies in, and the request for
    /// a piece written there.
    fn piece(
        &self,
        layout: &Layout,
        ino: InodeNo,
        offset: u64,
        sync: bool,
        charge: Charge,
    ) -> Result<(std::sync::Arc<spillway_wire::Endpoint>, WriteReq), Errno> {
        let (stripe, within) = layout.locate(offset);
        let ep = self.endpoint(layout.server_of(stripe))?;
        Ok((ep, write_req(ino, stripe, within, sync, charge)))
    }

    /// Give `bytes` of this client's space grant of session `epoch` on `server` back
    /// (`GrantReleaseReq`), for others to use.
    pub fn release_grant(&self, server: ServerIndex, epoch: u64, bytes: u64) -> Result<(), Errno> {
        let req = GrantReleaseReq {
            grant_epoch: epoch,
            bytes,
        };
        self.server(server)?.call(&req).map(|_| ())
    }

    /// Write one run of bytes at `offset` (no buffering, no sync, no grant), split over
    /// stripes, every piece in flight at once. Returns the servers written to.
    pub fn write(
        &self,
        layout: &Layout,
        ino: InodeNo,
        offset: u64,
        data: &[u8],
    ) -> Result<Vec<ServerIndex>, Errno> {
        let mut calls = Vec::new();
        let mut touched = Vec::new();
        let mut pos = 0usize;
        for (stripe, within, n) in layout.pieces(offset, data.len() as u64) {
            let server = layout.server_of(stripe);
            if !touched.contains(&server) {
                touched.push(server);
            }
            let piece = &data[pos..pos + n as usize];
            let req = write_req(ino, stripe, within, false, Charge::NONE);
            calls.push((self.server(server)?.start(&req, piece), n));
            pos += n as usize;
        }
        let mut first_err = None;
        for (call, n) in calls {
            match call.wait() {
                // Not charged to a grant: a full fragment stores only what fits.
                Ok(r) if r.written < n => {
                    first_err.get_or_insert(Errno::ENOSPC);
                }
                Ok(_) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(touched),
        }
    }
}
