//! What the kernel has mounted where: `/proc/self/mountinfo` read into `MountEntry`s,
//! and `mount_state`, which tells from mount ids (statx `STATX_MNT_ID`) whether a
//! directory is a mount point and whose: never from a path string.

use super::fd::{cstr, open_at, open_path, stat_fd};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub id: u64,
    pub mount_point: String,
    pub fstype: String,
    pub source: String,
    pub options: String,
}

impl MountEntry {
    /// A Spillway FUSE mount (`spillway mount` sets fsname `spillway:<instance>` and
    /// subtype `spillway`).
    pub fn is_spillway(&self) -> bool {
        (self.fstype == "fuse.spillway" || self.fstype == "fuse")
            && self.source.starts_with("spillway:")
    }
}

/// What the kernel has at a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mounted {
    /// A plain directory: nothing mounted on it.
    No,
    /// A Spillway FUSE mount (the topmost one if mounts are stacked).
    Spillway(MountEntry),
    /// Something else is mounted there.
    Other(MountEntry),
}

impl Mounted {
    /// What mount `id` (at `path`, for the message), listed as `entry`, is: an unlisted
    /// one is an error (the table and the mount ids disagree).
    pub fn of(entry: Option<MountEntry>, path: &Path, id: u64) -> Result<Mounted, String> {
        match entry {
            Some(e) if e.is_spillway() => Ok(Mounted::Spillway(e)),
            Some(e) => Ok(Mounted::Other(e)),
            None => Err(format!(
                "{}: mount {id} is not in /proc/self/mountinfo",
                path.display()
            )),
        }
    }
}

/// A mount for messages: its type, source and id (or the id alone when unlisted).
pub fn describe(e: Option<&MountEntry>, id: u64) -> String {
    match e {
        Some(e) => format!("{} {} (mount {})", e.fstype, e.source, e.id),
        None => format!("mount {id}"),
    }
}

fn parse_mountinfo_line(l: &str) -> Option<MountEntry> {
    let (left, right) = l.split_once(" - ")?;
    let mut f = left.split(' ');
    let id = f.next()?.parse().ok()?;
    let _parent = f.next()?;
    let _dev = f.next()?;
    let _root = f.next()?;
    let mount_point = unescape(f.next()?);
    let options = f.next()?.to_string();
    let mut r = right.split(' ');
    let fstype = r.next()?.to_string();
    let source = unescape(r.next()?);
    Some(MountEntry {
        id,
        mount_point,
        fstype,
        source,
        options,
    })
}

/// mountinfo's escapes (`\ooo` octal for space, tab, newline, backslash): the client's
/// reader of the same table.
use spillway_client::mount::unescape_mountinfo as unescape;

/// The mount table's entry for mount `id`.
pub fn mount_entry(id: u64) -> io::Result<Option<MountEntry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text
        .lines()
        .filter_map(parse_mountinfo_line)
        .find(|e| e.id == id))
}

/// What the kernel has at `path` (None: nothing there). For the developer's tools and
/// `spillway local`, on paths root gave them: the parent is opened as given (following
/// links), the last component never.
pub fn mount_state(path: &Path) -> Result<Option<Mounted>, String> {
    let name = path
        .file_name()
        .ok_or_else(|| format!("{} names no directory", path.display()))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let pc = cstr(parent.as_os_str().as_bytes(), parent)?;
    let pfd = match open_path(&pc) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        r => r.map_err(|e| format!("{}: {e}", parent.display()))?,
    };
    let n = cstr(name.as_bytes(), path)?;
    let fd = match open_at(pfd.as_fd(), &n) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        r => r.map_err(|e| format!("{}: {e}", path.display()))?,
    };
    let pst = stat_fd(pfd.as_fd()).map_err(|e| format!("{}: {e}", parent.display()))?;
    let st = stat_fd(fd.as_fd()).map_err(|e| format!("{}: {e}", path.display()))?;
    if st.mnt_id == pst.mnt_id {
        return Ok(Some(Mounted::No));
    }
    let entry = mount_entry(st.mnt_id).map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    Mounted::of(entry, path, st.mnt_id).map(Some)
}

/// Whether a Spillway FUSE mount is at `path` (the kernel's word, never a string match).
pub fn is_mounted(path: &Path) -> bool {
    matches!(mount_state(path), Ok(Some(Mounted::Spillway(_))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_parse() {
        let l = "812 29 0:77 / /tmp/a\\040b rw,nosuid,nodev,relatime shared:400 - fuse.spillway spillway:12 rw,user_id=0";
        let e = parse_mountinfo_line(l).unwrap();
        assert_eq!(e.id, 812);
        assert_eq!(e.mount_point, "/tmp/a b");
        assert_eq!(e.fstype, "fuse.spillway");
        assert_eq!(e.source, "spillway:12");
        assert!(e.options.contains("nosuid"));
        assert!(e.is_spillway());
        let l = "30 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw";
        assert!(!parse_mountinfo_line(l).unwrap().is_spillway());
        assert!(parse_mountinfo_line("garbage").is_none());
        assert_eq!(unescape("/x\\011y\\134z"), "/x\ty\\z");
        assert_eq!(unescape("/bad\\9"), "/bad\\9");
    }

    #[test]
    fn a_plain_directory_is_not_mounted_and_a_mount_point_is_seen() {
        let d = std::env::temp_dir().join(format!("spillway-mounts-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        assert_eq!(mount_state(&d).unwrap(), Some(Mounted::No));
        assert!(!is_mounted(&d));
        assert_eq!(mount_state(&d.join("missing")).unwrap(), None);
        // /proc is a mount point of its own, not Spillway's.
        match mount_state(Path::new("/proc")).unwrap() {
            Some(Mounted::Other(e)) => assert_eq!(e.fstype, "proc"),
            other => panic!("{other:?}"),
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
