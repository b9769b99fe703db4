//! Users and groups from the system's name service, and a user's identity worn by one
//! thread: the one place Spillway asks NSS (reentrant calls only: the daemons are
//! multi-threaded) and switches credentials.
//!
//! Linux keeps credentials per thread; glibc's `setgroups`/`setresuid` wrappers change
//! them on every thread of the process, so `as_identity` calls the system calls
//! directly: `setfsuid`, `setfsgid` and `setgroups` on the calling thread only. With a
//! non-zero filesystem uid the kernel also drops the thread's filesystem capabilities
//! (`CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH`, `CAP_FOWNER`, ...), so every permission
//! check is the user's, exactly as if the user had made the call, while the process's
//! other threads keep running as root. The storage servers wear a stage owner's
//! identity for PFS operations; `spillway run` wears the job user's to read the script.

use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::io;

/// A user's entry in the name service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Passwd {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub dir: String,
    pub shell: String,
}

/// Most supplementary groups honoured (NGROUPS_MAX on Linux).
const MAX_GROUPS: usize = 65536;
/// Largest buffer offered to the `*_r` lookups (they answer ERANGE below their need).
const MAX_BUF: usize = 1 << 24;

fn text(p: *const libc::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string of an entry whose buffer is alive here.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

enum Key<'a> {
    Name(&'a CStr),
    Uid(u32),
}

fn passwd(key: Key) -> io::Result<Option<Passwd>> {
    // SAFETY: libc::passwd is plain data, valid when zeroed; filled by the call.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0u8; 16 << 10];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    loop {
        // SAFETY: pwd, buf and result outlive the call; buf's length is passed.
        let rc = unsafe {
            match key {
                Key::Name(n) => libc::getpwnam_r(
                    n.as_ptr(),
                    &mut pwd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut result,
                ),
                Key::Uid(u) => {
                    libc::getpwuid_r(u, &mut pwd, buf.as_mut_ptr().cast(), buf.len(), &mut result)
                }
            }
        };
        if rc == libc::ERANGE && buf.len() < MAX_BUF {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        break;
    }
    if result.is_null() {
        return Ok(None);
    }
    Ok(Some(Passwd {
        name: text(pwd.pw_name),
        uid: pwd.pw_uid,
        gid: pwd.pw_gid,
        dir: text(pwd.pw_dir),
        shell: text(pwd.pw_shell),
    }))
}

impl Passwd {
    /// The entry of user `name` (`Ok(None)`: no such user).
    pub fn by_name(name: &str) -> io::Result<Option<Passwd>> {
        let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        passwd(Key::Name(&c))
    }

    /// The entry of `uid` (`Ok(None)`: no such user).
    pub fn by_uid(uid: u32) -> io::Result<Option<Passwd>> {
        passwd(Key::Uid(uid))
    }
}

/// The gid of group `name`.
pub fn group_gid(name: &str) -> Option<u32> {
    let cname = CString::new(name).ok()?;
    // SAFETY: libc::group is plain data, valid when zeroed; filled by the call.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0u8; 64 << 10];
    let mut out: *mut libc::group = std::ptr::null_mut();
    loop {
        // SAFETY: all pointers point to live buffers of the sizes passed.
        let rc = unsafe {
            libc::getgrnam_r(
                cname.as_ptr(),
                &mut grp,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut out,
            )
        };
        if rc == libc::ERANGE && buf.len() < MAX_BUF {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        return (rc == 0 && !out.is_null()).then_some(grp.gr_gid);
    }
}

/// The groups of user `name` whose primary group is `gid` (that one included), as a
/// login gets them.
pub fn groups_of(name: &str, gid: u32) -> Result<Vec<u32>, String> {
    let c = CString::new(name).map_err(|_| format!("invalid user name {name:?}"))?;
    let mut n: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let mut count = n;
        // SAFETY: groups holds `count` entries; the name is NUL-terminated.
        let rc = unsafe { libc::getgrouplist(c.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if rc >= 0 {
            groups.truncate(count.max(0) as usize);
            return Ok(groups);
        }
        if count as usize > MAX_GROUPS || n as usize >= MAX_GROUPS {
            return Err(format!("user {name:?} is in too many groups"));
        }
        n = count.max(n * 2).min(MAX_GROUPS as libc::c_int);
    }
}

thread_local! {
    /// The identity this thread wears inside `as_identity`: a nested call for the same
    /// identity (a batch of operations wrapped once) switches nothing.
    static WORN: RefCell<Option<Identity>> = const { RefCell::new(None) };
}

/// Who an operation runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary gid included, as `getgrouplist` gives them).
    pub groups: Vec<u32>,
}

impl Identity {
    /// The identity of `uid` from this host's user database: primary gid and
    /// supplementary groups, as a login would get them.
    pub fn of_uid(uid: u32) -> Result<Identity, String> {
        let pw = Passwd::by_uid(uid)
            .map_err(|e| format!("cannot look up uid {uid}: {e}"))?
            .ok_or_else(|| format!("uid {uid} is not a user on this host"))?;
        Identity::of(&pw)
    }

    /// The identity of a user's entry.
    pub fn of(pw: &Passwd) -> Result<Identity, String> {
        Ok(Identity {
            uid: pw.uid,
            gid: pw.gid,
            groups: groups_of(&pw.name, pw.gid)?,
        })
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

/// This thread's filesystem uid.
pub fn thread_fsuid() -> u32 {
    // `setfsuid(-1)` changes nothing and returns the current value.
    sys_setfsuid(u32::MAX)
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
        // A thread left with another user's credentials must not serve anything else.
        if let Err(e) = sys_setgroups(&self.groups) {
            // Not eprintln!: it panics if stderr cannot be written, and a panic would
            // unwind with the other user's credentials instead of aborting.
            crate::logging::stderr_line(&format!(
                "cannot restore the thread's groups: {e}; aborting"
            ));
            std::process::abort();
        }
        if sys_setfsuid(u32::MAX) != self.fsuid {
            crate::logging::stderr_line("cannot restore the thread's filesystem uid; aborting");
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
    let worn = Worn {
        fsuid: sys_setfsuid(u32::MAX),
        fsgid: sys_setfsgid(u32::MAX),
        groups,
        outer: WORN.with(|w| w.borrow().clone()),
    };
    // Groups first: setgroups needs the capability that the fsuid switch drops.
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
        let pw = Passwd::by_name("root").unwrap().unwrap();
        assert_eq!((pw.uid, pw.gid, pw.name.as_str()), (0, 0, "root"));
        assert_eq!(Passwd::by_uid(0).unwrap(), Some(pw));
        assert_eq!(group_gid("root"), Some(0));
        assert!(group_gid("no-such-group-spillway").is_none());
    }

    #[test]
    fn unknown_users_are_none_or_an_error() {
        let e = Identity::of_uid(4_000_000_123).unwrap_err();
        assert!(e.contains("not a user"), "{e}");
        assert_eq!(Passwd::by_name("no-such-user-spillway").unwrap(), None);
        assert!(Passwd::by_name("a\0b").is_err());
    }

    #[test]
    fn wearing_an_identity_changes_this_thread_only_and_comes_back() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return; // needs root to switch
        }
        let dir = std::env::temp_dir().join(format!("spillway-identity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
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
        assert_eq!(thread_fsuid(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn nested_identities_switch_only_when_different_and_unwind_in_order() {
        // SAFETY: geteuid cannot fail.
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
            let same = as_identity(&nobody, thread_fsuid).unwrap();
            let inner = as_identity(&other, thread_fsuid).unwrap();
            // Back to the outer identity, and nesting it again still works.
            let after = as_identity(&nobody, thread_fsuid).unwrap();
            (same, inner, after, thread_fsuid())
        })
        .unwrap();
        assert_eq!(seen, (65534, 4242, 65534, 65534));
        assert_eq!(thread_fsuid(), 0);
        assert!(WORN.with(|w| w.borrow().is_none()));
    }
}
