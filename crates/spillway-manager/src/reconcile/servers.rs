//! The manager's calls to storage servers over the data-plane wire: heartbeats,
//! fragment builds and destroys, and the instance root's attributes. One connection per
//! call, opened with a fresh admin credential (a MUNGE credential is single-use), and a
//! short deadline so one dead server never holds the loop.

use crate::db::{CacheWork, CallError, ConfigWork, FragmentWork};
use spillway_types::{Errno, Timespec, ROOT_INODE};
use spillway_wire::{
    setattr, CacheConfigReq, Endpoint, FragmentCreateReq, FragmentDestroyReq, HelloReq,
    LdbalConfigReq, Role, ServerStatusReq, SetAttrReq,
};
use std::sync::Arc;
use std::time::Duration;

/// Why a heartbeat got no answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeError {
    /// The manager itself could not make the call (out of descriptors or memory, no
    /// credential from munged): this says nothing about the server.
    Local(String),
    /// The server did not answer, or refused.
    Server(String),
}

/// The error of opening a socket now, when it is a shortage of this process or host
/// (EMFILE, ENFILE, ENOBUFS, ENOMEM); None when a socket can be opened.
pub fn local_exhaustion() -> Option<std::io::Error> {
    // SAFETY: socket() takes no pointers; the descriptor is closed right away.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return spillway_types::rlimit::is_resource_exhaustion(&e).then_some(e);
    }
    // SAFETY: `fd` is the descriptor opened above, closed once.
    unsafe { libc::close(fd) };
    None
}

/// Makes the credential of one admin connection.
pub type AdminCredential = Arc<dyn Fn() -> Result<Vec<u8>, String> + Send + Sync>;

pub struct Servers {
    pub admin: AdminCredential,
    pub deadline: Duration,
}

pub(crate) fn hello(role: Role, instance: u64, credential: Vec<u8>) -> HelloReq {
    HelloReq::new(role, instance, credential, "spillway-manager")
}

fn describe(e: Errno) -> CallError {
    match e {
        Errno::EACCES => CallError::Refused("server refused the credential (EACCES)".into()),
        Errno::ETIMEDOUT => CallError::Transient("server did not answer in time".into()),
        Errno::EIO | Errno::ECONNREFUSED => CallError::Transient("server unreachable".into()),
        e => CallError::Refused(format!("server error {e:?}")),
    }
}

impl Servers {
    pub(crate) fn admin_endpoint(&self, address: &str) -> Result<Endpoint, CallError> {
        let cred = (self.admin)().map_err(CallError::Transient)?;
        // No reconnect window: a refused connection is an answer (the server is down).
        Ok(Endpoint::new(
            address.to_string(),
            hello(Role::Admin, 0, cred),
            self.deadline,
            Duration::ZERO,
        ))
    }

    /// Bytes the server offers. A failure says whose it was: only the server's own
    /// failures may count toward declaring it offline.
    pub fn probe(&self, address: &str) -> Result<u64, ProbeError> {
        if let Some(e) = local_exhaustion() {
            return Err(ProbeError::Local(format!("cannot open a socket: {e}")));
        }
        let cred =
            (self.admin)().map_err(|e| ProbeError::Local(format!("no admin credential: {e}")))?;
        let ep = Endpoint::new(
            address.to_string(),
            hello(Role::Admin, 0, cred),
            self.deadline,
            Duration::ZERO,
        );
        match ep.call(&ServerStatusReq {}) {
            Ok(st) => Ok(st.capacity),
            // The wire client does not say why a connection could not be made: when
            // the manager cannot open a socket now, that is taken to be why.
            Err(e) => match local_exhaustion() {
                Some(le) => Err(ProbeError::Local(format!("cannot open a socket: {le}"))),
                None => Err(ProbeError::Server(describe(e).to_string())),
            },
        }
    }

    pub fn create_fragment(&self, w: &FragmentWork) -> Result<(), CallError> {
        let ep = self.admin_endpoint(&w.address)?;
        let req = FragmentCreateReq {
            instance: w.instance,
            index: w.index,
            peers: w.peers.clone(),
            capacity: w.capacity,
            credential: w.secret.clone(),
            stripe_size: w.stripe_size,
            root_uid: w.root_uid,
            root_gid: w.root_gid,
            root_mode: 0o755,
        };
        match ep.call(&req) {
            Ok(_) => Ok(()),
            Err(Errno::EEXIST) => Err(CallError::Refused(format!(
                "{} already holds instance {} with other parameters",
                w.address, w.instance
            ))),
            Err(e) => Err(describe(e)),
        }
    }

    pub fn destroy_fragment(&self, address: &str, instance: u64) -> Result<(), CallError> {
        let ep = self.admin_endpoint(address)?;
        match ep.call(&FragmentDestroyReq { instance }) {
            // Already gone (an earlier attempt whose answer was lost): done.
            Ok(_) | Err(Errno::ENOENT) => Ok(()),
            // A cache whose written-behind bytes cannot reach the PFS yet refuses to
            // go (docs/cache.md): tried again until they can, never counted toward
            // the fuse, since giving up would drop them.
            Err(Errno::EBUSY) => Err(CallError::Transient(format!(
                "{address} still caches bytes the PFS has not taken (write-behind retrying); \
                 the instance goes once they are written"
            ))),
            Err(e) => Err(describe(e)),
        }
    }

    /// Set the instance root's mode and group, through the root's home server, as a
    /// peer of the instance.
    pub fn apply_config(&self, w: &ConfigWork) -> Result<(), CallError> {
        if w.ldbal {
            self.apply_ldbal(w)?;
        }
        if let Some(c) = &w.cache {
            return self.apply_cache(w, c);
        }
        let home = w
            .peers
            .get(ROOT_INODE.home().0 as usize)
            .ok_or_else(|| CallError::Refused("instance has no fragments".into()))?;
        let ep = self.peer(w, home);
        let zero = Timespec::default();
        ep.call(&SetAttrReq {
            ino: ROOT_INODE,
            valid: setattr::MODE | setattr::GID,
            mode: w.mode & 0o7777,
            uid: 0,
            gid: w.gid,
            size: 0,
            atime: zero,
            mtime: zero,
            ctime: zero,
        })
        .map(|_| ())
        .map_err(describe)
    }
}

impl Servers {
    /// A connection to server `addr` of the instance of `w`, as a peer (proving the
    /// instance secret); no reconnect window, as for every call the manager makes.
    fn peer(&self, w: &ConfigWork, addr: &str) -> Endpoint {
        Endpoint::new(
            addr.to_string(),
            hello(Role::Peer, w.instance, w.secret.clone()),
            self.deadline,
            Duration::ZERO,
        )
    }

    /// A load-balanced configuration: every server of the instance is told to hold
    /// whole replicas (docs/cache.md §6), before a cache is configured or anything is
    /// staged in. A server holding files already refuses (EEXIST): they were placed
    /// for another access mode and would read as holes from the other replicas.
    fn apply_ldbal(&self, w: &ConfigWork) -> Result<(), CallError> {
        for addr in &w.peers {
            let ep = self.peer(w, addr);
            ep.call(&LdbalConfigReq {}).map_err(|e| match e {
                Errno::EEXIST => CallError::Refused(format!(
                    "{addr} cannot hold load-balanced replicas of instance {}: it holds \
                     files already (an ldbal configuration needs an empty instance)",
                    w.instance
                )),
                e => describe(e),
            })?;
        }
        Ok(())
    }

    /// A cache configuration: every server of the instance is told which PFS directory
    /// it caches, for whom (docs/cache.md). The root's attributes are the directory's
    /// own, so the configuration's mode and group are not applied.
    fn apply_cache(&self, w: &ConfigWork, c: &CacheWork) -> Result<(), CallError> {
        let gid = spillway_types::identity::Passwd::by_uid(c.owner)
            .ok()
            .flatten()
            .map_or(w.gid, |p| p.gid);
        let req = CacheConfigReq {
            pfs_dir: c.pfs.clone(),
            uid: c.owner,
            gid,
            modified_threshold: c.modified_threshold,
            read_ahead: c.read_ahead,
            sync_on_close: c.sync_on_close,
            sync_to_pfs: c.sync_to_pfs,
        };
        for addr in &w.peers {
            let ep = self.peer(w, addr);
            ep.call(&req).map_err(|e| match e {
                Errno::EACCES | Errno::EPERM | Errno::ENOENT | Errno::ENOTDIR => {
                    CallError::Refused(format!(
                        "{addr} cannot cache {}: {} (it must be a directory the owner can \
                         read, under the servers' pfs_roots)",
                        c.pfs, e
                    ))
                }
                e => describe(e),
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(cred: AdminCredential) -> Servers {
        Servers {
            admin: cred,
            deadline: Duration::from_secs(2),
        }
    }

    #[test]
    fn a_dead_server_is_the_servers_failure() {
        // A port nobody listens on: refused, the server's doing.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let s = servers(Arc::new(|| Ok(vec![1, 2, 3])));
        assert!(matches!(s.probe(&addr), Err(ProbeError::Server(_))));
    }

    #[test]
    fn no_credential_is_the_managers_failure() {
        let s = servers(Arc::new(|| Err("munged: connection refused".into())));
        match s.probe("127.0.0.1:1") {
            Err(ProbeError::Local(e)) => assert!(e.contains("munged"), "{e}"),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn out_of_descriptors_is_the_managers_failure() {
        // In a child process whose descriptor limit is used up: the probe must blame
        // the manager, not the server.
        // SAFETY: the child runs only this test's code and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = (|| {
                let rl = libc::rlimit {
                    rlim_cur: 64,
                    rlim_max: 64,
                };
                // SAFETY: setrlimit only reads the struct.
                if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) } != 0 {
                    return 2;
                }
                let mut held = Vec::new();
                while let Ok(f) = std::fs::File::open("/dev/null") {
                    held.push(f);
                }
                let s = servers(Arc::new(|| Ok(vec![1])));
                match s.probe("127.0.0.1:1") {
                    Err(ProbeError::Local(e))
                        if e.contains("descriptor") || e.contains("files") =>
                    {
                        0
                    }
                    _ => 1,
                }
            })();
            // SAFETY: ends the forked child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child status {status:#x}"
        );
    }
}
