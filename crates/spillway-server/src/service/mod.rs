//! The wire `Service`: the handshake (who may talk to which fragment) and the handler
//! boundary, where `StoreError`s become errnos.
//!
//! * `session`  — per-connection state and its open handles.
//! * `dispatch` — request to handler.
//! * `cache`    — the requests of a fragment that caches a PFS directory.
//! * `metadata` — the metadata handlers that turn flag words into store arguments.
//! * `convert`  — wire metadata messages to and from the metadata store's types.
//! * `notices`  — change notices to other mounts: the requests, and the changes told.

mod cache;
mod convert;
mod dispatch;
mod metadata;
mod notices;
mod readonly;
mod session;

use crate::auth::ct_eq;
use crate::registry::Registry;
use crate::stage::Stages;
use session::{InstanceSession, Session};
use spillway_types::{capability, Errno};
use spillway_wire::messages::*;
use spillway_wire::serve::{Pusher, Reply, Service};
use spillway_wire::{Call, Wire, PROTOCOL_VERSION};
use std::net::SocketAddr;
use std::sync::Arc;

pub(crate) struct SpillwayService {
    registry: Arc<Registry>,
    stages: Arc<Stages>,
    admin_key: Vec<u8>,
    munge: spillway_munge::Munge,
    /// The largest client arena mapped (tunable `arena_max`; 0: none offered).
    arena_max: usize,
}

impl SpillwayService {
    pub(crate) fn new(
        registry: Arc<Registry>,
        stages: Arc<Stages>,
        admin_key: Vec<u8>,
        munge: spillway_munge::Munge,
        arena_max: usize,
    ) -> SpillwayService {
        SpillwayService {
            registry,
            stages,
            admin_key,
            munge,
            arena_max,
        }
    }

    /// An admin is whoever holds this server's admin key (the local tools), or root
    /// anywhere in the MUNGE realm (the manager): munged refuses a replayed or expired
    /// credential, so a captured handshake cannot be reused.
    fn admin_credential_ok(&self, cred: &[u8], peer: SocketAddr) -> bool {
        if cred.starts_with(b"MUNGE:") {
            return match self.munge.decode_bytes(cred) {
                Ok(c) if c.uid == 0 => true,
                Ok(c) => {
                    tracing::info!(%peer, uid = c.uid, "admin refused: MUNGE credential of a non-root user");
                    false
                }
                Err(e) => {
                    tracing::info!(%peer, "admin refused: MUNGE credential: {e}");
                    false
                }
            };
        }
        let ok = ct_eq(cred, &self.admin_key);
        if !ok {
            tracing::info!(%peer, "admin refused: not the admin key");
        }
        ok
    }
}

/// Seconds since the epoch by this server's clock, against which capabilities expire
/// (a clock set before 1970 reads 0).
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Largest read run on the connection's thread.
const INLINE_DATA_MAX: usize = 64 << 10;

impl Service for SpillwayService {
    type Session = Session;

    fn hello(&self, req: &HelloReq, peer: SocketAddr) -> Result<(HelloReply, Session), Errno> {
        if !(req.version_min <= PROTOCOL_VERSION && PROTOCOL_VERSION <= req.version_max) {
            return Err(Errno::EPROTO);
        }
        // An unknown role decodes (it is a byte in HelloReq) and is refused here.
        let Some(role) = req.role() else {
            return Err(Errno::EINVAL);
        };
        match role {
            Role::Admin => {
                if !self.admin_credential_ok(&req.credential, peer) {
                    return Err(Errno::EACCES);
                }
                tracing::debug!(%peer, name = %req.peer_name, "admin session");
                let reply = HelloReply {
                    version: PROTOCOL_VERSION,
                    server_index: 0,
                    server_count: 0,
                };
                Ok((reply, Session::Admin))
            }
            Role::Client | Role::Peer => {
                let Some(fragment) = self.registry.get(req.instance).filter(|f| !f.is_closed())
                else {
                    tracing::info!(%peer, name = ?req.peer_name, instance = req.instance, role = req.role, "refused: no fragment of this instance here");
                    return Err(Errno::ENOENT);
                };
                let secret = fragment.config.credential_bytes();
                if role == Role::Client {
                    // Clients never hold the instance secret, only a capability keyed
                    // by it, so that what a compute node leaks opens one instance, from
                    // that node's addresses, until the capability expires.
                    match capability::verify(
                        &secret,
                        &req.credential,
                        req.instance,
                        peer.ip(),
                        unix_now(),
                    ) {
                        Ok(cap) => {
                            tracing::debug!(%peer, name = %req.peer_name, instance = req.instance, node = ?cap.node, expires = cap.expires, "client session");
                        }
                        Err(e) => {
                            // The peer name is the caller's own claim: logged escaped.
                            tracing::info!(%peer, name = ?req.peer_name, instance = req.instance, "client refused: {e}");
                            return Err(Errno::EACCES);
                        }
                    }
                } else {
                    if !ct_eq(&req.credential, &secret) {
                        tracing::info!(%peer, name = ?req.peer_name, instance = req.instance, "peer refused: not the instance secret");
                        return Err(Errno::EACCES);
                    }
                    tracing::debug!(%peer, name = %req.peer_name, instance = req.instance, "peer session");
                }
                let reply = HelloReply {
                    version: PROTOCOL_VERSION,
                    server_index: fragment.config.index,
                    server_count: fragment.config.count(),
                };
                Ok((
                    reply,
                    Session::Instance(InstanceSession::new(
                        fragment,
                        role == Role::Peer,
                        req.mount,
                    )),
                ))
            }
        }
    }

    fn arena_max(&self) -> usize {
        self.arena_max
    }

    fn handle(&self, session: &Session, req: Request) -> Result<Reply, Errno> {
        let r = match session {
            Session::Admin => dispatch::admin(&self.registry, &self.stages, req),
            Session::Instance(s) => dispatch::instance(s, req),
        };
        r.map_err(|e| e.errno())
    }

    fn runs_inline(&self, opcode: u16, body: &[u8]) -> bool {
        // Writes run in arrival order on the connection's thread: the bytes just
        // received are copied into the page cache on the same CPU while still in its
        // cache, and one client's stream of writes to a stripe file never has several
        // workers queueing on that file's lock. A client keeps many writes in flight,
        // so the connection stays busy; other clients have their own connections.
        if opcode == WriteReq::OP || opcode == WriteArenaReq::OP {
            return true;
        }
        if opcode == ReadReq::OP {
            return ReadReq::from_bytes(body).is_ok_and(|r| r.len as usize <= INLINE_DATA_MAX);
        }
        if opcode == ReadArenaReq::OP {
            return ReadArenaReq::from_bytes(body)
                .is_ok_and(|r| r.read.len as usize <= INLINE_DATA_MAX);
        }
        // Metadata requests answered from this fragment's SQLite store alone (which
        // serialises them anyway). Not: large data I/O, syncs of data, and anything
        // that may wait on another server (SetAttr truncates on peers).
        matches!(
            opcode,
            LookupReq::OP
                | GetAttrReq::OP
                | CreateReq::OP
                | RemoveEntryReq::OP
                | InsertEntryReq::OP
                | RenameReq::OP
                | LinkCountReq::OP
                | TouchDirReq::OP
                | SealDirReq::OP
                | UnsealDirReq::OP
                | ReadDirReq::OP
                | OpenReq::OP
                | ReleaseReq::OP
                | ExtendSizeReq::OP
                | SetXattrReq::OP
                | GetXattrReq::OP
                | ListXattrReq::OP
                | RemoveXattrReq::OP
                | StatFsReq::OP
                | ReadLinkReq::OP
                | SetLayoutReq::OP
                // SQLite only: inline, so servers waiting on each other's reports in
                // their workers never starve the pools (fragment/allocs.rs).
                | AllocReportReq::OP
                | LockReq::OP
                | GetLkReq::OP
                | UnlockOwnerReq::OP
                | LockRenewReq::OP
                | GrantReleaseReq::OP
        )
    }

    fn attached(&self, session: &Session, pusher: Pusher) {
        if let Session::Instance(s) = session {
            let _ = s.pusher.set(pusher);
        }
    }

    fn closed(&self, session: &Session) {
        if let Session::Instance(s) = session {
            s.close();
        }
    }
}
