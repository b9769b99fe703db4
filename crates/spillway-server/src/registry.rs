//! The fragments this server holds, by instance id: loaded from `ROOT/fragments/` at
//! start, changed by the admin requests.

use crate::error::{fs, StoreResult};
use crate::fragment::{Fragment, FragmentEnv};
use spillway_types::Errno;
use spillway_wire::{FragmentCreateReq, FragmentInfo, ServerStatusReply};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

pub(crate) struct Registry {
    dir: PathBuf,
    env: FragmentEnv,
    fragments: RwLock<HashMap<u64, Arc<Fragment>>>,
    /// Serialises creates and destroys (slow, rare) without blocking lookups.
    admin: Mutex<()>,
}

impl Registry {
    /// Open every fragment under `dir` (created if missing). Leftovers of interrupted
    /// creates and destroys are removed. A fragment that cannot be opened is logged and
    /// left on disk untouched (its clients are refused) rather than stopping the server
    /// for every other instance.
    pub(crate) fn load(dir: &Path, env: FragmentEnv) -> Result<Registry, String> {
        spillway_types::files::private_dir(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut fragments = HashMap::new();
        let entries =
            std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.')
                && (name.ends_with(".creating") || name.ends_with(".destroying"))
            {
                tracing::info!("removing leftover {}", path.display());
                if let Err(e) = std::fs::remove_dir_all(&path) {
                    tracing::warn!("cannot remove {}: {e}", path.display());
                }
                continue;
            }
            let Some(instance) = name.parse::<u64>().ok().filter(|i| i.to_string() == name) else {
                tracing::warn!("ignoring unexpected {}", path.display());
                continue;
            };
            match Fragment::open(&path, &env) {
                Ok(f) if f.config.instance == instance => {
                    tracing::info!(
                        instance,
                        index = f.config.index,
                        count = f.config.count(),
                        used = f.data.used(),
                        "loaded fragment"
                    );
                    fragments.insert(instance, f);
                }
                Ok(f) => tracing::error!(
                    "{} holds instance {}: not loaded",
                    path.display(),
                    f.config.instance
                ),
                Err(e) => tracing::error!("cannot load fragment {}: {e}", path.display()),
            }
        }
        Ok(Registry {
            dir: dir.to_path_buf(),
            env,
            fragments: RwLock::new(fragments),
            admin: Mutex::new(()),
        })
    }

    pub(crate) fn get(&self, instance: u64) -> Option<Arc<Fragment>> {
        self.fragments
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&instance)
            .cloned()
    }

    pub(crate) fn all(&self) -> Vec<Arc<Fragment>> {
        self.fragments
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Create a fragment. Repeating the same create is fine (a manager retries); a
    /// create for a present instance with other parameters is EEXIST.
    pub(crate) fn create(&self, req: &FragmentCreateReq) -> StoreResult<()> {
        let _admin = self.admin.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(existing) = self.get(req.instance) {
            let wanted = crate::fragment::config::FragmentConfig::from_request(req)?;
            return if existing.config == wanted {
                Ok(())
            } else {
                Err(fs(Errno::EEXIST))
            };
        }
        let f = match Fragment::create(&self.dir, req, &self.env) {
            Ok(f) => f,
            Err(e) => {
                // What the create assembled (`.<instance>.creating`, as `load` knows it)
                // only takes space, and a full disk is the likely cause: removed now,
                // not at the next start.
                let partial = self.dir.join(format!(".{}.creating", req.instance));
                if let Err(rm) = std::fs::remove_dir_all(&partial) {
                    if rm.kind() != std::io::ErrorKind::NotFound {
                        tracing::warn!("cannot remove {}: {rm}", partial.display());
                    }
                }
                tracing::error!(instance = req.instance, "cannot create the fragment: {e}");
                return Err(e);
            }
        };
        tracing::info!(
            instance = req.instance,
            index = req.index,
            count = req.peers.len(),
            "created fragment"
        );
        self.fragments
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(req.instance, f);
        Ok(())
    }

    /// Destroy a fragment and its data. Absent is fine (idempotent).
    pub(crate) fn destroy(&self, instance: u64) -> StoreResult<()> {
        let _admin = self.admin.lock().unwrap_or_else(|e| e.into_inner());
        let removed = self
            .fragments
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&instance);
        if let Some(f) = removed {
            if let Err(e) = f.destroy(&self.dir) {
                // Refused before anything closed (a cache whose dirty bytes cannot
                // reach the PFS yet, Fragment::destroy): it keeps serving, and the
                // manager's retry finds it again rather than nothing to destroy.
                if !f.is_closed() {
                    self.fragments
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(instance, f);
                }
                return Err(e);
            }
            tracing::info!(instance, "destroyed fragment");
        }
        Ok(())
    }

    pub(crate) fn list(&self) -> StoreResult<Vec<FragmentInfo>> {
        let mut out = Vec::new();
        for f in self.all() {
            match f.info() {
                Ok(i) => out.push(i),
                // Destroyed while we listed: it is gone, not an error.
                Err(_) if f.is_closed() => {}
                Err(e) => return Err(e),
            }
        }
        out.sort_by_key(|i| i.instance);
        Ok(out)
    }

    /// The storage behind this server's root, for the manager's heartbeat.
    pub(crate) fn status(&self) -> StoreResult<ServerStatusReply> {
        let path = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes())
            .map_err(|_| fs(Errno::EINVAL))?;
        // SAFETY: statvfs is plain old data; all zeroes is a valid value.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: path is NUL-terminated and st is a valid out-pointer.
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return Err(fs(Errno::from_io(&std::io::Error::last_os_error())));
        }
        let frsize = st.f_frsize as u64;
        let fragments = self.all();
        Ok(ServerStatusReply {
            capacity: (st.f_blocks as u64).saturating_mul(frsize),
            free: (st.f_bavail as u64).saturating_mul(frsize),
            allocated: fragments.iter().map(|f| f.config.capacity).sum(),
            fragments: fragments.len() as u32,
        })
    }

    /// Close every fragment (server stopping).
    pub(crate) fn close_all(&self) {
        for f in self.all() {
            f.close();
        }
    }
}
