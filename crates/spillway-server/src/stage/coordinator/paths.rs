//! The stage's paths are strings (instance paths and PFS paths alike, absolute and
//! `/`-separated, as the request and the walks give them): joining and splitting them.

use spillway_types::Timespec;

/// `dir/rel`, or `dir` itself for an empty `rel`.
pub(super) fn join(dir: &str, rel: &str) -> String {
    if rel.is_empty() {
        return dir.to_string();
    }
    format!("{}/{rel}", dir.trim_end_matches('/'))
}

/// The directory holding `path` (`/` for a name in the root).
pub(super) fn parent_of(path: &str) -> &str {
    match path.trim_end_matches('/').rfind('/') {
        Some(0) => "/",
        Some(i) => &path[..i],
        None => "/",
    }
}

/// The last name of `path`.
pub(super) fn base_of(path: &str) -> &str {
    let p = path.trim_end_matches('/');
    p.rsplit('/').next().unwrap_or(p)
}

/// A PFS stat time as the instance keeps times.
pub(super) fn ts(t: (i64, u32)) -> Timespec {
    Timespec {
        sec: t.0,
        nsec: t.1,
    }
}
