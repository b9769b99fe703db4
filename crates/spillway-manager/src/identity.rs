//! Users and groups as the system's name service knows them: the owner's primary group
//! (the instance root's group) and membership of the admin group. The lookups are
//! `spillway_types::identity`'s (reentrant, shared by every component).

use spillway_types::identity::{groups_of, Passwd};

pub use spillway_types::identity::group_gid;

/// The primary gid of `uid`, or `uid` itself when the user is unknown here (a user who
/// exists only on compute nodes still gets a group that matches nobody else's).
pub fn primary_gid(uid: u32) -> u32 {
    match Passwd::by_uid(uid) {
        Ok(Some(pw)) => pw.gid,
        _ => uid,
    }
}

/// Whether `uid` (whose credential said `gid`) is in group `want`: its primary group,
/// the credential's group, or a supplementary group.
pub fn in_group(uid: u32, gid: u32, want: u32) -> bool {
    if gid == want {
        return true;
    }
    let Ok(Some(pw)) = Passwd::by_uid(uid) else {
        return false;
    };
    pw.gid == want || groups_of(&pw.name, pw.gid).is_ok_and(|g| g.contains(&want))
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
