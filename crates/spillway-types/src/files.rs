//! Small files written whole: keys, secrets, descriptors, certificates, state; and
//! the modes of what holds secrets or metadata (`private_dir`, `make_private`,
//! `private_umask`): directories 0700, files 0600, owned by the daemon (root).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Replace `path` with `bytes` in one rename. The file has `mode` from its creation on
/// (a secret is never readable by others, even for an instant), its data is synced
/// before the rename, and the directory after it, so a crash or a concurrent reader
/// sees the old file or the new one, never a torn one.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Mode of every state directory: only its owner (the daemon, root) enters it.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// Mode of every file holding a secret or metadata.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// A daemon's first act: whatever it creates is private unless it says otherwise
/// (a backstop; files holding secrets are created with explicit modes too). Returns
/// the previous mask.
pub fn private_umask() -> u32 {
    // SAFETY: umask only changes this process's file mode creation mask; it cannot fail.
    unsafe { libc::umask(0o077) as u32 }
}

/// Create `dir` (and missing parents, with the process's umask) if absent, then give
/// it mode 0700 whatever it had: a directory left by an older version (0755) becomes
/// private at the next start. A symlink in its place is refused: the daemon must not
/// chmod whatever it points at.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is a symlink, not a directory", dir.display()),
            ))
        }
        Ok(m) if !m.is_dir() => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a directory", dir.display()),
            ))
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(PRIVATE_DIR_MODE)
                .create(dir)?;
        }
        Err(e) => return Err(e),
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(PRIVATE_DIR_MODE))
}

/// Take group and other permissions away from `path` if it exists (a file of an
/// older version, or one a library created with its own default mode, such as
/// SQLite's 0644). Symlinks are left alone (never followed). Absent is fine.
pub fn make_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if m.file_type().is_symlink() {
        return Ok(());
    }
    let mode = m.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        let keep = if m.is_dir() {
            PRIVATE_DIR_MODE
        } else {
            mode & 0o700
        };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(keep))?;
    }
    Ok(())
}

/// Create an empty file at `path` with mode 0600 unless it exists (then only its
/// mode is made private): for a database a library then opens, so that it never
/// exists with the library's default mode, even for an instant.
pub fn precreate_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(PRIVATE_FILE_MODE)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => make_private(path),
        Err(e) => Err(e),
    }
}

/// The names in an open directory, without `.` and `..`, sorted bytewise; read from
/// its start whatever was read through `dir` before (the descriptor is duplicated, and
/// a duplicate shares the position). `dir` stays open.
pub fn list_names(dir: &impl std::os::fd::AsRawFd) -> std::io::Result<Vec<Vec<u8>>> {
    let errno = || std::io::Error::last_os_error();
    // fdopendir takes the descriptor over: give it a duplicate.
    // SAFETY: dup of an open descriptor; the result is checked.
    let fd = unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: fd is a fresh duplicate; on failure it is closed here.
    let d = unsafe { libc::fdopendir(fd) };
    if d.is_null() {
        let e = errno();
        // SAFETY: fdopendir failed, so fd is still ours to close, once.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    // SAFETY: d is an open DIR*.
    unsafe { libc::rewinddir(d) };
    let mut names = Vec::new();
    let result = loop {
        // readdir signals the end and errors both with NULL: errno tells them apart.
        // SAFETY: __errno_location points at this thread's errno.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: d is an open DIR*.
        let ent = unsafe { libc::readdir64(d) };
        if ent.is_null() {
            // SAFETY: reading this thread's errno.
            let e = unsafe { *libc::__errno_location() };
            break if e == 0 {
                Ok(())
            } else {
                Err(std::io::Error::from_raw_os_error(e))
            };
        }
        // SAFETY: d_name is NUL-terminated within the entry, valid until the next
        // readdir on d.
        let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    };
    // SAFETY: d is open; closing it closes the duplicate too.
    unsafe { libc::closedir(d) };
    result?;
    names.sort_unstable();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn private_modes_are_made_and_repaired() {
        let d = tempfile::tempdir().unwrap();
        let sub = d.path().join("a/b");
        private_dir(&sub).unwrap();
        assert_eq!(mode(&sub), 0o700);
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&sub).unwrap();
        assert_eq!(mode(&sub), 0o700);
        let f = sub.join("db");
        precreate_private(&f).unwrap();
        assert_eq!(mode(&f), 0o600);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        precreate_private(&f).unwrap();
        assert_eq!(mode(&f), 0o600);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
        make_private(&f).unwrap();
        assert_eq!(mode(&f), 0o700);
        make_private(&sub.join("absent")).unwrap();
        // A symlink is neither followed nor accepted as the directory.
        let target = d.path().join("t");
        std::fs::write(&target, b"x").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
        let link = d.path().join("l");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        make_private(&link).unwrap();
        assert_eq!(mode(&target), 0o644);
        assert!(private_dir(&link).is_err());
    }

    #[test]
    fn replaces_with_the_mode_and_leaves_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("secret");
        write_atomic(&p, b"one", 0o600).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let m = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(m, 0o600);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }
}
