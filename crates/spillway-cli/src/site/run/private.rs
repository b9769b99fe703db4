//! The job's private directory: where `spillway run` puts the copy of the script that
//! it executes as the job's user (Slurm keeps its copy in slurmd's spool).
//!
//! When root runs a job for a user, nothing on the way to that copy may be the user's
//! to change, or the user could turn root's `chown`/`chmod` of the copy onto any file
//! (rename the directory, plant `script` as a symlink). So:
//! * the parent is [`ROOT_PARENT`], made root-owned 0711 and checked to be a
//!   root-owned directory that no one else may write, opened without following a
//!   symlink; users can cross it but not list or change it;
//! * the job's directory is made in it with `mkdirat` and opened with `O_NOFOLLOW`
//!   relative to the parent's descriptor; it stays root's (0711: the user reaches the
//!   script, cannot add, rename or remove anything);
//! * the script is created with `openat(O_CREAT|O_EXCL|O_NOFOLLOW)` relative to the
//!   directory's descriptor, and given to the user with `fchown`/`fchmod` on its own
//!   descriptor: no path is ever resolved again after it was made;
//! * removal goes through the same descriptors (`unlinkat`).
//!
//! A caller that is not root runs its own job: the directory is made under the
//! temporary directory the same way, owned by the caller, and nothing changes owner.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Where root's `spillway run` keeps the jobs' private directories.
pub const ROOT_PARENT: &str = "/run/spillway-run";

pub struct JobDir {
    parent: OwnedFd,
    dir: OwnedFd,
    name: CString,
    /// Where the script is, for exec.
    script: PathBuf,
    /// The caller's own directory (not root): may hold what the job left there.
    owned_by_caller: Option<PathBuf>,
}

fn cstr(p: &str) -> CString {
    // Our own constant names: never hold a NUL.
    CString::new(p).unwrap_or_default()
}

fn last_err(what: &str) -> String {
    format!("{what}: {}", io::Error::last_os_error())
}

fn open_dir_at(at: libc::c_int, name: &CStr, what: &str) -> Result<OwnedFd, String> {
    // SAFETY: name is NUL-terminated; at is a directory descriptor or AT_FDCWD.
    let fd = unsafe {
        libc::openat(
            at,
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(last_err(what));
    }
    // SAFETY: fd was just opened and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstat(fd: &OwnedFd, what: &str) -> Result<libc::stat, String> {
    // SAFETY: libc::stat is plain data, valid when zeroed.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open; st is written by the call.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(last_err(what));
    }
    Ok(st)
}

/// A name no one can guess ahead: the token's plain characters and 64 random bits.
fn fresh_name(token: &str) -> Result<CString, String> {
    let mut r = [0u8; 8];
    // SAFETY: r is 8 writable bytes.
    let n = unsafe { libc::getrandom(r.as_mut_ptr().cast(), r.len(), 0) };
    if n != r.len() as isize {
        return Err(last_err("getrandom"));
    }
    let plain: String = token
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(32)
        .collect();
    Ok(cstr(&format!("job-{plain}-{:016x}", u64::from_le_bytes(r))))
}

/// The root-owned parent, made if missing, checked, opened without following links.
fn root_parent() -> Result<OwnedFd, String> {
    let path = cstr(ROOT_PARENT);
    // SAFETY: a NUL-terminated path. /run is root's: no one else can put anything here.
    if unsafe { libc::mkdir(path.as_ptr(), 0o711) } != 0
        && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
    {
        return Err(last_err(&format!("cannot make {ROOT_PARENT}")));
    }
    let fd = open_dir_at(
        libc::AT_FDCWD,
        &path,
        &format!("cannot open {ROOT_PARENT} (it must be a directory, not a symlink)"),
    )?;
    let st = fstat(&fd, ROOT_PARENT)?;
    if st.st_uid != 0 || st.st_mode & 0o022 != 0 {
        return Err(format!(
            "refusing {ROOT_PARENT}: it must be a directory of root that only root may write (owner uid {}, mode {:o}); remove it and run again",
            st.st_uid,
            st.st_mode & 0o7777
        ));
    }
    Ok(fd)
}

impl JobDir {
    /// A fresh private directory holding `text` as `script`, mode 0700; owned by `user`
    /// (uid, gid) when given (the caller is root), else by the caller.
    pub fn make(token: &str, user: Option<(u32, u32)>, text: &[u8]) -> Result<JobDir, String> {
        let (parent, parent_path) = match user {
            Some(_) => (root_parent()?, PathBuf::from(ROOT_PARENT)),
            None => {
                let tmp = std::env::temp_dir();
                let c = CString::new(tmp.as_os_str().as_encoded_bytes())
                    .map_err(|_| format!("bad temporary directory {}", tmp.display()))?;
                let fd = open_dir_at(
                    libc::AT_FDCWD,
                    &c,
                    &format!("cannot open {}", tmp.display()),
                )?;
                (fd, tmp)
            }
        };
        let name = fresh_name(token)?;
        let dir_path = parent_path.join(name.to_string_lossy().as_ref());
        // SAFETY: parent is an open directory; name is NUL-terminated and holds no '/'.
        if unsafe { libc::mkdirat(parent.as_raw_fd(), name.as_ptr(), 0o700) } != 0 {
            return Err(last_err(&format!("cannot make {}", dir_path.display())));
        }
        let shown = dir_path.display().to_string();
        let dir = match open_dir_at(parent.as_raw_fd(), &name, &format!("cannot open {shown}")) {
            Ok(d) => d,
            Err(e) => {
                // SAFETY: as for mkdirat.
                unsafe { libc::unlinkat(parent.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) };
                return Err(e);
            }
        };
        let jd = JobDir {
            parent,
            dir,
            name,
            script: dir_path.join("script"),
            owned_by_caller: user.is_none().then(|| dir_path.clone()),
        };
        jd.fill(user, text, &shown)?;
        Ok(jd)
    }

    fn fill(&self, user: Option<(u32, u32)>, text: &[u8], shown: &str) -> Result<(), String> {
        use std::io::Write;
        let st = fstat(&self.dir, shown)?;
        // SAFETY: geteuid cannot fail.
        if st.st_uid != unsafe { libc::geteuid() } {
            return Err(format!("{shown} is not the directory just made; refused"));
        }
        let script = cstr("script");
        // SAFETY: dir is an open directory; "script" is NUL-terminated. O_EXCL with
        // O_CREAT never follows or reuses anything already there.
        let fd = unsafe {
            libc::openat(
                self.dir.as_raw_fd(),
                script.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o700 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(last_err(&format!("cannot create {shown}/script")));
        }
        // SAFETY: fd was just opened and is owned by nothing else.
        let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let end = text.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        f.write_all(&text[..end])
            .map_err(|e| format!("cannot write {shown}/script: {e}"))?;
        if let Some((uid, gid)) = user {
            // SAFETY: fd is the open script; no path is involved.
            if unsafe { libc::fchown(f.as_raw_fd(), uid, gid) } != 0 {
                return Err(last_err(&format!(
                    "cannot give {shown}/script to uid {uid}"
                )));
            }
        }
        // SAFETY: as above. After fchown: a chown clears the mode's set-id bits.
        if unsafe { libc::fchmod(f.as_raw_fd(), 0o700) } != 0 {
            return Err(last_err(&format!("cannot chmod {shown}/script")));
        }
        // Closed before it is executed (a file open for writing cannot be: ETXTBSY).
        drop(f);
        // The user crosses the directory to the script, and does nothing else in it.
        let mode = if user.is_some() { 0o711 } else { 0o700 };
        // SAFETY: dir is open; no path is involved.
        if unsafe { libc::fchmod(self.dir.as_raw_fd(), mode) } != 0 {
            return Err(last_err(&format!("cannot chmod {shown}")));
        }
        Ok(())
    }

    pub fn script(&self) -> &Path {
        &self.script
    }
}

impl Drop for JobDir {
    fn drop(&mut self) {
        if let Some(p) = &self.owned_by_caller {
            // The caller's own directory, removed with the caller's own rights.
            let _ = std::fs::remove_dir_all(p);
            return;
        }
        let script = cstr("script");
        // SAFETY: open directory descriptors and NUL-terminated names without '/'.
        unsafe {
            libc::unlinkat(self.dir.as_raw_fd(), script.as_ptr(), 0);
            libc::unlinkat(
                self.parent.as_raw_fd(),
                self.name.as_ptr(),
                libc::AT_REMOVEDIR,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn a_root_job_dir_is_roots_and_its_script_the_users() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let jd = JobDir::make("12/../x", Some((65534, 65534)), b"#!/bin/sh\necho hi\n\0").unwrap();
        let dir = jd.script().parent().unwrap().to_path_buf();
        assert_eq!(dir.parent().unwrap(), Path::new(ROOT_PARENT));
        let p = std::fs::metadata(ROOT_PARENT).unwrap();
        assert_eq!((p.uid(), p.mode() & 0o022), (0, 0));
        let d = std::fs::symlink_metadata(&dir).unwrap();
        assert_eq!((d.uid(), d.permissions().mode() & 0o7777), (0, 0o711));
        let s = std::fs::symlink_metadata(jd.script()).unwrap();
        assert!(s.file_type().is_file());
        assert_eq!(
            (s.uid(), s.gid(), s.permissions().mode() & 0o7777),
            (65534, 65534, 0o700)
        );
        assert_eq!(std::fs::read(jd.script()).unwrap(), b"#!/bin/sh\necho hi\n");
        assert!(dir
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("job-12x-"));
        drop(jd);
        assert!(!dir.exists());
    }
}
