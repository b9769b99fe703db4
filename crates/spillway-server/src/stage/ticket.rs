//! The stage ticket as a server checks it: the only source of the identity a stage
//! runs as and of the PFS paths it may touch (docs/staging.md, "Who may stage what").
//!
//! Every stage request (StageStart from the manager, StageFiles, StageStripes and
//! StageSync from the coordinator) carries the ticket the manager signed for the
//! stage. It must verify under the fragment's instance secret, name this fragment's
//! instance, not be expired, and be for the request's direction (and stage, where the
//! request names one); only then is its uid taken on, and every PFS path of the
//! request must lie under the ticket's PFS paths and this server's own `pfs_roots`
//! (`Pfs`). A refusal is EACCES; the reason goes to this server's log (never the
//! ticket's bytes), as for refused handshakes.

use super::pfs::Pfs;
use super::Failure;
use crate::fragment::Fragment;
use spillway_types::identity::Identity;
use spillway_types::stage_ticket::{self, StageTicket};
use spillway_types::Errno;
use spillway_wire::StageDir;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What a checked ticket grants: the ticket, and the PFS as its owner may reach it.
pub(super) struct Grant {
    pub ticket: StageTicket,
    pub pfs: Pfs,
}

impl Grant {
    pub(super) fn identity(&self) -> &Identity {
        self.pfs.identity()
    }
}

/// Check `bytes` for a `what` request of `direction` (and `stage`, when the request
/// names it) on fragment `f`.
pub(super) fn check(
    f: &Fragment,
    bytes: &[u8],
    stage: Option<u64>,
    direction: StageDir,
    what: &str,
) -> Result<Grant, Failure> {
    let instance = f.config.instance;
    let ticket = stage_ticket::verify(&f.config.credential_bytes(), bytes, instance, unix_now())
        .and_then(|t| t.expect(stage, u8::from(direction)).map(|()| t))
        .map_err(|e| {
            tracing::warn!(instance, "{what} refused: {e}");
            Failure::new(libc::EACCES, format!("{what} refused: {e}"))
        })?;
    let id = identity(ticket.uid).map_err(|e| {
        Failure::new(
            e.0,
            format!("{what}: uid {} is not known on this server", ticket.uid),
        )
    })?;
    let pfs = Pfs::new(&f.pfs_roots, &ticket.pfs_paths, id)
        .inspect_err(|e| {
            tracing::warn!(instance, "{what} refused: {}", e.message);
        })?
        .for_stage(ticket.stage);
    Ok(Grant { ticket, pfs })
}

/// Who uid N is, looked up at most once a minute (a stage of 5,000 small files asks
/// 5,000 times).
fn identity(uid: u32) -> Result<Identity, Errno> {
    static CACHE: Mutex<Option<HashMap<u32, (Instant, Identity)>>> = Mutex::new(None);
    const TTL: Duration = Duration::from_secs(60);
    let mut g = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    if let Some((at, id)) = map.get(&uid) {
        if at.elapsed() < TTL {
            return Ok(id.clone());
        }
    }
    let id = Identity::of_uid(uid).map_err(|e| {
        tracing::warn!("stage: {e}");
        Errno::EACCES
    })?;
    if map.len() > 4096 {
        map.clear();
    }
    map.insert(uid, (Instant::now(), id.clone()));
    Ok(id)
}
