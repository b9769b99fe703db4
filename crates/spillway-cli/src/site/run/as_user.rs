//! Reading the job script with its user's permissions, from a root `spillway run`.
//!
//! Root runs jobs for other users (`spillway run --user NAME`); the script named on the
//! command line must be one the user may read, or a symlink (or a root-only file)
//! would hand root's data to the user's job. So the file is opened by a short-lived
//! thread that first takes on the user's filesystem identity: `setfsuid`,
//! `setfsgid` and `setgroups` as raw system calls, which change the calling thread
//! only (glibc's wrappers would change every thread of the process). With a non-zero
//! filesystem uid the kernel also drops the thread's `CAP_DAC_OVERRIDE` and
//! `CAP_DAC_READ_SEARCH`, so every permission check on the way to the file, and on the
//! file, is the user's. The thread ends with the read: its credentials end with it and
//! nothing else in the process ever runs under them.
//!
//! The identity switch itself is `spillway_types::identity` (the storage servers wear
//! a stage owner's identity the same way).

use spillway_jobs::input;
use spillway_types::identity::{as_identity, Identity};
use std::path::Path;

/// Read the regular file `path` (at most `limit` bytes) with the permissions of `id`
/// only, on a thread of its own. Fails without opening anything if the identity cannot
/// be taken on completely.
pub fn read_as(id: &Identity, path: &Path, limit: u64, what: &str) -> Result<Vec<u8>, String> {
    let (id, path, what_owned) = (id.clone(), path.to_path_buf(), what.to_string());
    let reader = std::thread::Builder::new()
        .name("read-as-user".into())
        .spawn(move || -> Result<Vec<u8>, String> {
            as_identity(&id, || input::read_regular(&path, limit, &what_owned))
                .map_err(|e| format!("cannot take on uid {} to read {what_owned}: {e}", id.uid))?
        })
        .map_err(|e| format!("cannot start a thread to read {what}: {e}"))?;
    reader
        .join()
        .map_err(|_| format!("the thread reading {what} failed"))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_root_only_file_is_refused_and_the_caller_stays_root() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return; // needs root to switch
        }
        let dir = std::env::temp_dir().join(format!("spillway-as-user-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let secret = dir.join("secret");
        std::fs::write(&secret, b"root only").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        let open = dir.join("open");
        std::fs::write(&open, b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        let nobody = Identity {
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
        };
        for p in [&secret, &link] {
            let e = read_as(&nobody, p, 1 << 20, "the job script").unwrap_err();
            assert!(e.contains("Permission denied"), "{e}");
        }
        assert_eq!(
            read_as(&nobody, &open, 1 << 20, "the job script").unwrap(),
            b"#!/bin/sh\n"
        );
        // This thread never changed.
        assert_eq!(std::fs::read(&secret).unwrap(), b"root only");
        assert_eq!(spillway_types::identity::thread_fsuid(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
