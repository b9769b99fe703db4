//! The job owner's identity, worn by one thread for the length of a PFS operation.
//!
//! Linux keeps credentials per thread; glibc's `setgroups`/`setresuid` wrappers change
//! them on every thread of the process, so this module calls the system calls directly:
//! `setfsuid`, `setfsgid` and `setgroups` on the calling thread only. With a non-zero
//! filesystem uid the kernel also drops the thread's filesystem capabilities
//! (`CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH`, `CAP_FOWNER`, ...), so every permission
//! check on the PFS is the owner's, exactly as if the owner had made the call. The
//! server's other threads keep running as root meanwhile.

use std::cell::RefCell;
use std::ffi::CStr;
use std::io;

thread_local! {
    /// The identity this thread wears inside `as_identity`: a nested call for the same
    /// identity (a batch of PFS operations wrapped once) switches nothing.
    static WORN: RefCell<Option<Identity>> = const { RefCell::new(None) };
}

/// Who a stage runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary gid included, as `getgrouplist` gives them).
    pub groups: Vec<u32>,
}

/// Most supplementary groups honoured (NGROUPS_MAX on Linux).
const MAX_GROUPS: usize = 65536;

impl Identity {
    /// The identity of `uid` from this server's user database: primary gid and
    /// supplementary groups, as a login would get them.
    pub fn of_uid(uid: u32) -> Result<Identity, String> {
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut buf = vec![0u8; 16 << 10];
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        loop {
            // SAFETY: pwd, buf and result outlive the call; buf's length is passed.
            let rc = unsafe {
                libc::getpwuid_r(
                    uid,
                    &mut pwd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut result,
                )
            };
            if rc == libc::ERANGE && buf.len() < (1 << 24) {
                buf.resize(buf.len() * 4, 0);
                continue;
            }
            if rc != 0 {
                return Err(format!(
                    "cannot look up uid {uid}: {}",
                    io::Error::from_raw_os_error(rc)
                ));
            }
            break;
        }
        if result.is_null() {
            return Err(format!("uid {uid} is not a user on this server"));
        }
        let gid = pwd.pw_gid;
        // SAFETY: pw_name points into buf, NUL-terminated, valid while buf lives.
        let name = unsafe { CStr::from_ptr(pwd.pw_name) }.to_owned();
        let mut n: libc::c_int = 64;
        loop {
            let mut groups = vec![0 as libc::gid_t; n as usize];
            let mut count = n;
            // SAFETY: groups holds `count` entries; name is NUL-terminated.
            let rc =
                unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
            if rc >= 0 {
                groups.truncate(count.max(0) as usize);
                return Ok(Identity { uid, gid, groups });
            }
            if count as usize > MAX_GROUPS {
                return Err(format!("uid {uid} is in too many groups"));
            }
            n = count.max(n * 2);
        }
    }
}

fn sys_setfsuid(uid: u32) -> u32 {
    // SAFETY: plain system call on this thread; returns the previous fsuid.
    unsafe { libc::syscall(libc::SYS_setfsuid, uid as libc::c_long) as u32 }
}

fn sys_setfsgid(gid: u32) -> u32 {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_setfsgid, gid as libc::c_long) as u32 }
}

fn sys_setgroups(groups: &[u32]) -> io::Result<()> {
    // SAFETY: the pointer and length describe `groups`, alive for the call.
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn thread_groups() -> io::Result<Vec<u32>> {
    // SAFETY: a zero-length query returns the count only.
    let n = unsafe { libc::syscall(libc::SYS_getgroups, 0, std::ptr::null_mut::<u32>()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut v = vec![0u32; n as usize];
    // SAFETY: v has room for n entries.
    let m = unsafe { libc::syscall(libc::SYS_getgroups, n, v.as_mut_ptr()) };
    if m < 0 {
        return Err(io::Error::last_os_error());
    }
    v.truncate(m as usize);
    Ok(v)
}

/// Restores the thread's own credentials when dropped, whatever happened meanwhile.
struct Worn {
    fsuid: u32,
    fsgid: u32,
    groups: Vec<u32>,
    /// What `WORN` said before (an outer `as_identity` of another identity).
    outer: Option<Identity>,
}

impl Drop for Worn {
    fn drop(&mut self) {
        WORN.with(|w| *w.borrow_mut() = self.outer.take());
        // Order: uid first, so the capabilities needed to set the rest come back.
        sys_setfsuid(self.fsuid);
        sys_setfsgid(self.fsgid);
        if let Err(e) = sys_setgroups(&self.groups) {
            // A thread left with the wrong groups must not serve anything else.
            tracing::error!("cannot restore the thread's groups: {e}; aborting");
            std::process::abort();
        }
        if sys_setfsuid(u32::MAX) != self.fsuid {
            tracing::error!("cannot restore the thread's filesystem uid; aborting");
            std::process::abort();
        }
    }
}

/// Run `f` on this thread as `id` (filesystem uid, gid and groups), then switch back.
/// Fails without running `f` if the identity cannot be taken on completely.
pub fn as_identity<T>(id: &Identity, f: impl FnOnce() -> T) -> io::Result<T> {
    if WORN.with(|w| w.borrow().as_ref() == Some(id)) {
        return Ok(f());
    }
    let groups = thread_groups()?;
    // `setfsuid(-1)` changes nothing and returns the current value.
    let worn = Worn {
        fsuid: sys_setfsuid(u32::MAX),
        fsgid: sys_setfsgid(u32::MAX),
        groups,
        outer: WORN.with(|w| w.borrow().clone()),
    };
    sys_setgroups(&id.groups)?;
    sys_setfsgid(id.gid);
    sys_setfsuid(id.uid);
    if sys_setfsgid(u32::MAX) != id.gid || sys_setfsuid(u32::MAX) != id.uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("cannot take on uid {} gid {}", id.uid, id.gid),
        ));
    }
    WORN.with(|w| *w.borrow_mut() = Some(id.clone()));
    let out = f();
    drop(worn);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_a_user_with_gid_0() {
        let id = Identity::of_uid(0).unwrap();
        assert_eq!(id.gid, 0);
        assert!(id.groups.contains(&0));
    }

    #[test]
    fn unknown_uid_is_an_error() {
        let e = Identity::of_uid(4_000_000_123).unwrap_err();
        assert!(e.contains("not a user"), "{e}");
    }

    #[test]
    fn wearing_an_identity_changes_this_thread_only_and_comes_back() {
        if unsafe { libc::geteuid() } != 0 {
            return; // needs root to switch
        }
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"x").unwrap();
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let nobody = Identity {
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
        };
        let other = std::thread::spawn({
            let secret = secret.clone();
            move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                std::fs::read(&secret).is_ok()
            }
        });
        let denied = as_identity(&nobody, || {
            let r = std::fs::read(&secret);
            std::thread::sleep(std::time::Duration::from_millis(100));
            r
        })
        .unwrap();
        assert_eq!(
            denied.unwrap_err().kind(),
            io::ErrorKind::PermissionDenied,
            "nobody cannot read a root 0600 file"
        );
        assert!(
            other.join().unwrap(),
            "another thread stayed root meanwhile"
        );
        assert!(std::fs::read(&secret).is_ok(), "this thread is root again");
        assert_eq!(sys_setfsuid(u32::MAX), 0);
    }

    #[test]
    fn nested_identities_switch_only_when_different_and_unwind_in_order() {
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let nobody = Identity {
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
        };
        let other = Identity {
            uid: 4242,
            gid: 4242,
            groups: vec![4242],
        };
        let seen = as_identity(&nobody, || {
            let same = as_identity(&nobody, || sys_setfsuid(u32::MAX)).unwrap();
            let inner = as_identity(&other, || sys_setfsuid(u32::MAX)).unwrap();
            // Back to the outer identity, and nesting it again still works.
            let after = as_identity(&nobody, || sys_setfsuid(u32::MAX)).unwrap();
            (same, inner, after, sys_setfsuid(u32::MAX))
        })
        .unwrap();
        assert_eq!(seen, (65534, 4242, 65534, 65534));
        assert_eq!(sys_setfsuid(u32::MAX), 0);
        assert!(WORN.with(|w| w.borrow().is_none()));
    }
}
