//! Temporary names of stage-outs (docs/staging.md, "Files"): every file a stage-out
//! writes to the PFS is written under a hidden name beside its destination,
//! `.<name>.spillway-<stage>-<n>`, and renamed over the destination only once it is
//! complete and durable. So a destination is only ever its old file, absent, or the
//! complete copy: a stage terminated, failed or dropped part-way leaves no partial
//! file under the destination's name, and removes its temporaries.
//!
//! The name says what the file is (a Spillway stage's temporary), which stage made it
//! (a stage may touch only its own: `covered`) and stays unique within the stage
//! (`n`). A destination name too long to fit is cut (at a character boundary): the
//! temporary then names a prefix of it, which `covered` accepts beside a ticket path
//! starting with that prefix.

use spillway_types::stage_ticket::lies_under;

/// What sits between the (cut) destination name and the stage id.
const MARK: &str = ".spillway-";
/// Longest name a directory entry may have (Linux's NAME_MAX).
const NAME_MAX: usize = 255;

/// The temporary name for a destination whose last name is `name`.
pub(super) fn name(name: &str, stage: u64, n: u64) -> String {
    let suffix = format!("{MARK}{stage}-{n}");
    let room = NAME_MAX - 1 - suffix.len();
    let mut cut = name.len().min(room);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(".{}{suffix}", &name[..cut])
}

/// The temporary path beside the PFS path `dst` (absolute, normalised: the
/// coordinator's destinations are).
pub(super) fn path(dst: &str, stage: u64, n: u64) -> String {
    let (dir, last) = split(dst);
    format!("{dir}/{}", name(last, stage, n))
}

/// A temporary name's parts: (the destination name or its prefix, stage, n). None for
/// any other name.
pub(super) fn parse(last: &str) -> Option<(&str, u64, u64)> {
    let rest = last.strip_prefix('.')?;
    let at = rest.rfind(MARK)?;
    let (prefix, tail) = (&rest[..at], &rest[at + MARK.len()..]);
    let (stage, n) = tail.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if prefix.is_empty() || !digits(stage) || !digits(n) {
        return None;
    }
    Some((prefix, stage.parse().ok()?, n.parse().ok()?))
}

/// The directory and the last name of an absolute path (`/a/b` → (`/a`, `b`); `/b` →
/// (``, `b`), so that `dir/last` rebuilds it).
pub(super) fn split(p: &str) -> (&str, &str) {
    let p = p.trim_end_matches('/');
    match p.rfind('/') {
        Some(i) => (&p[..i], &p[i + 1..]),
        None => ("", p),
    }
}

/// `path` is a temporary of stage `stage` that the scope (a stage ticket's PFS paths)
/// covers: it lies in a directory the scope covers, or beside a path of the scope whose
/// name it carries. A stage can thus create, write, rename and remove only its own
/// temporaries, and only next to what it may write anyway.
pub(super) fn covered(path: &str, stage: u64, scope: &[String]) -> bool {
    let (dir, last) = split(path);
    let Some((prefix, of, _)) = parse(last) else {
        return false;
    };
    if of != stage || dir.is_empty() {
        return false;
    }
    scope.iter().any(|s| {
        if lies_under(dir, s) {
            return true;
        }
        let (sdir, sname) = split(s);
        sdir == dir && sname.starts_with(prefix)
    })
}

/// The destination a temporary path stands for, for messages (the cut prefix when the
/// name was cut); other paths as they are.
pub(super) fn shown(path: &str) -> String {
    let (dir, last) = split(path);
    match parse(last) {
        Some((prefix, _, _)) => format!("{dir}/{prefix}"),
        None => path.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_say_what_they_are() {
        assert_eq!(name("out.h5", 7, 3), ".out.h5.spillway-7-3");
        assert_eq!(path("/pfs/a/out.h5", 7, 3), "/pfs/a/.out.h5.spillway-7-3");
        assert_eq!(parse(".out.h5.spillway-7-3"), Some(("out.h5", 7, 3)));
        // A destination name that itself looks like one still parses by its last mark.
        let n = name("x.spillway-1-2", 9, 0);
        assert_eq!(parse(&n), Some(("x.spillway-1-2", 9, 0)));
        for bad in [
            "out.h5",
            ".out.h5",
            ".out.spillway-",
            ".out.spillway-7",
            ".out.spillway-7-",
            ".out.spillway-x-1",
            "..spillway-7-1",
            "out.spillway-7-1",
            ".out.spillway-7-1-2",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        assert_eq!(shown("/pfs/a/.out.h5.spillway-7-3"), "/pfs/a/out.h5");
        assert_eq!(shown("/pfs/a/out.h5"), "/pfs/a/out.h5");
    }

    #[test]
    fn long_names_are_cut_to_fit_a_directory_entry() {
        let long = "é".repeat(200); // 400 bytes
        let n = name(&long, u64::MAX, u64::MAX);
        assert!(n.len() <= NAME_MAX, "{}", n.len());
        let (prefix, stage, k) = parse(&n).unwrap();
        assert!(long.starts_with(prefix) && !prefix.is_empty());
        assert_eq!((stage, k), (u64::MAX, u64::MAX));
        let dst = format!("/pfs/a/{long}");
        assert!(covered(&path(&dst, 5, 1), 5, std::slice::from_ref(&dst)));
    }

    #[test]
    fn a_stage_is_covered_only_for_its_own_temporaries_beside_its_paths() {
        let file = vec!["/pfs/alice/out.dat".to_string()];
        assert!(covered("/pfs/alice/.out.dat.spillway-4-0", 4, &file));
        // Another stage's temporary, another name, another directory, a plain name.
        assert!(!covered("/pfs/alice/.out.dat.spillway-5-0", 4, &file));
        assert!(!covered("/pfs/alice/.passwd.spillway-4-0", 4, &file));
        assert!(!covered("/pfs/.alice.spillway-4-0", 4, &file));
        assert!(!covered("/pfs/bob/.out.dat.spillway-4-0", 4, &file));
        assert!(!covered("/pfs/alice/out.dat", 4, &file));
        // A directory stage: anywhere beneath its directory, not beside it.
        let tree = vec!["/pfs/alice/results".to_string()];
        assert!(covered("/pfs/alice/results/a/.x.spillway-4-9", 4, &tree));
        assert!(covered("/pfs/alice/results/.x.spillway-4-9", 4, &tree));
        assert!(!covered("/pfs/alice/.x.spillway-4-9", 4, &tree));
        assert!(!covered("/pfs/alice/results/../.x.spillway-4-9", 4, &tree));
    }
}
