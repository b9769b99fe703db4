//! Users and groups as the system's name service knows them: the owner's primary group
//! (the instance root's group) and membership of the admin group.

use std::ffi::CString;

/// The primary gid of `uid`, or `uid` itself when the user is unknown here (a user who
/// exists only on compute nodes still gets a group that matches nobody else's).
pub fn primary_gid(uid: u32) -> u32 {
    let mut buf = vec![0u8; 16 << 10];
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: all pointers point to live buffers of the sizes passed.
    let rc =
        unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
    if rc == 0 && !out.is_null() {
        pwd.pw_gid
    } else {
        uid
    }
}

fn user_name(uid: u32) -> Option<(CString, u32)> {
    let mut buf = vec![0u8; 16 << 10];
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: as above.
    let rc =
        unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() {
        return None;
    }
    // SAFETY: pw_name points into buf, NUL-terminated, while buf lives.
    let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) }.to_owned();
    Some((name, pwd.pw_gid))
}

/// The gid of a group name.
pub fn group_gid(name: &str) -> Option<u32> {
    let cname = CString::new(name).ok()?;
    let mut buf = vec![0u8; 64 << 10];
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
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
    (rc == 0 && !out.is_null()).then_some(grp.gr_gid)
}

/// Whether `uid` (whose credential said `gid`) is in group `want`: its primary group,
/// the credential's group, or a supplementary group.
pub fn in_group(uid: u32, gid: u32, want: u32) -> bool {
    if gid == want {
        return true;
    }
    let Some((name, primary)) = user_name(uid) else {
        return false;
    };
    if primary == want {
        return true;
    }
    let mut n: libc::c_int = 64;
    loop {
        let mut groups: Vec<libc::gid_t> = vec![0; n as usize];
        let mut count = n;
        // SAFETY: groups has room for `count` entries; name is NUL-terminated.
        let rc =
            unsafe { libc::getgrouplist(name.as_ptr(), primary, groups.as_mut_ptr(), &mut count) };
        if rc >= 0 {
            return groups[..count.max(0) as usize].contains(&want);
        }
        if count <= n || n > 65536 {
            return false;
        }
        n = count;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_in_group_root() {
        assert_eq!(primary_gid(0), 0);
        assert_eq!(group_gid("root"), Some(0));
        assert!(in_group(0, 0, 0));
        assert!(group_gid("no-such-group-spillway").is_none());
        // An unknown uid falls back to its own number.
        assert_eq!(primary_gid(3_999_999_999), 3_999_999_999);
        assert!(!in_group(3_999_999_999, 3_999_999_999, 0));
    }
}
