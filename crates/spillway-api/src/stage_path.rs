//! Stage paths: the one rule for what a path named by a stage (an instance path,
//! absolute from the instance's root, or a PFS path) may be, and its normal form.
//!
//! Three parts of Spillway take stage paths from people and programs: the manager's REST
//! API (`POST /stages`, stage counts and actions), job scripts (`#DW stage_in`/
//! `stage_out`) and libdatawarp's ioctl on a mount. All keep a path in one normal form —
//! absolute, no empty, `.` or `..` components, no trailing `/` (the root is `/`) — so
//! "at or under" is a plain prefix test and one path has one spelling in the database.
//!
//! They differ in what they forgive, and that difference is kept on purpose, each as its
//! own constructor:
//!
//! * [`StagePath::parse`] — the REST API's rule: `.` components and repeated or
//!   trailing `/` are dropped; refused are relative paths, more than [`MAX_PATH`]
//!   bytes, a NUL byte, `..` components and names longer than [`MAX_NAME`] bytes.
//! * [`StagePath::exact`] — the rule of paths a person writes for a stage (job script
//!   lines, `dw_stage_*` calls through the ioctl): repeated and trailing `/` collapse,
//!   but `.` is refused as well as `..` (a stage path says exactly where it goes). No
//!   length limits of its own: the ioctl bounds its fields, and the manager applies
//!   [`StagePath::parse`] when the stage is made.

use std::fmt;

/// Longest path, in bytes, the REST API takes ([`StagePath::parse`]).
pub const MAX_PATH: usize = 4096;
/// Longest path component, in bytes, the REST API takes ([`StagePath::parse`]).
pub const MAX_NAME: usize = 255;

/// Linux `EINVAL`.
const EINVAL: i32 = 22;
/// Linux `ENAMETOOLONG`.
const ENAMETOOLONG: i32 = 36;

/// A normalised absolute stage path: `/`, or `/a/b` with no empty, `.` or `..`
/// component. Only the constructors make one, so holding one means it was checked.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StagePath(String);

/// Why a path is not a stage path. `Display` is the predicate alone ("is not an
/// absolute path"); callers put the path and what it is in front, as each always has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StagePathError {
    #[error("is not an absolute path")]
    NotAbsolute,
    /// More than [`MAX_PATH`] bytes ([`StagePath::parse`] only).
    #[error("is longer than {MAX_PATH} bytes")]
    TooLong,
    /// A NUL byte ([`StagePath::parse`] only).
    #[error("holds a NUL byte")]
    Nul,
    #[error("has .. components")]
    DotDot,
    /// A `.` component ([`StagePath::exact`] only; `parse` drops them).
    #[error("has . components")]
    Dot,
    /// A name longer than [`MAX_NAME`] bytes ([`StagePath::parse`] only).
    #[error("has a name longer than {MAX_NAME} bytes")]
    NameTooLong,
}

impl StagePathError {
    /// The positive errno a system call answers for this path: `ENAMETOOLONG` for the
    /// length limits, `EINVAL` for the rest.
    pub fn errno(self) -> i32 {
        match self {
            StagePathError::TooLong | StagePathError::NameTooLong => ENAMETOOLONG,
            StagePathError::NotAbsolute
            | StagePathError::Nul
            | StagePathError::DotDot
            | StagePathError::Dot => EINVAL,
        }
    }
}

impl StagePath {
    /// The root, `/`.
    pub fn root() -> StagePath {
        StagePath("/".into())
    }

    /// A path as the REST API takes it (see the module doc). The checks run in this
    /// order, the first failing one answers: absolute, length, NUL, `..`, name length.
    pub fn parse(p: &str) -> Result<StagePath, StagePathError> {
        if !p.starts_with('/') {
            return Err(StagePathError::NotAbsolute);
        }
        if p.len() > MAX_PATH {
            return Err(StagePathError::TooLong);
        }
        if p.contains('\0') {
            return Err(StagePathError::Nul);
        }
        let comps: Vec<&str> = p
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        if comps.contains(&"..") {
            return Err(StagePathError::DotDot);
        }
        if comps.iter().any(|c| c.len() > MAX_NAME) {
            return Err(StagePathError::NameTooLong);
        }
        Ok(Self::of(&comps))
    }

    /// A path as a person writes it for a stage (see the module doc): absolute, no `.`
    /// or `..` component.
    pub fn exact(p: &str) -> Result<StagePath, StagePathError> {
        if !p.starts_with('/') {
            return Err(StagePathError::NotAbsolute);
        }
        let comps: Vec<&str> = p.split('/').filter(|c| !c.is_empty()).collect();
        for c in &comps {
            match *c {
                "." => return Err(StagePathError::Dot),
                ".." => return Err(StagePathError::DotDot),
                _ => {}
            }
        }
        Ok(Self::of(&comps))
    }

    /// `/` followed by the (checked) components.
    fn of(comps: &[&str]) -> StagePath {
        let mut out = String::with_capacity(comps.iter().map(|c| c.len() + 1).sum::<usize>());
        for c in comps {
            out.push('/');
            out.push_str(c);
        }
        if out.is_empty() {
            out.push('/');
        }
        StagePath(out)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }

    pub fn is_root(&self) -> bool {
        self.0 == "/"
    }

    /// This path is `base` or lies below it, component by component (`/ab` is not
    /// under `/a`).
    pub fn is_at_or_under(&self, base: &StagePath) -> bool {
        at_or_under(&self.0, &base.0)
    }
}

/// [`StagePath::is_at_or_under`] for paths already in normal form kept as text (a
/// database row, a configured root): `path` is `base` or lies below it.
pub fn at_or_under(path: &str, base: &str) -> bool {
    base == "/"
        || path == base
        || (path.starts_with(base) && path.as_bytes().get(base.len()) == Some(&b'/'))
}

impl fmt::Display for StagePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for StagePath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<StagePath> for String {
    fn from(p: StagePath) -> String {
        p.0
    }
}

impl PartialEq<str> for StagePath {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for StagePath {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(p: &str) -> Result<String, StagePathError> {
        StagePath::parse(p).map(String::from)
    }

    fn exact(p: &str) -> Result<String, StagePathError> {
        StagePath::exact(p).map(String::from)
    }

    #[test]
    fn both_rules_normalise_slashes() {
        for f in [parse, exact] {
            assert_eq!(f("/").unwrap(), "/");
            assert_eq!(f("//").unwrap(), "/");
            assert_eq!(f("//a///b/").unwrap(), "/a/b");
            assert_eq!(f("/a/b").unwrap(), "/a/b");
            assert_eq!(f("/a b/\u{e9}").unwrap(), "/a b/\u{e9}");
        }
    }

    #[test]
    fn both_rules_refuse_relative_paths_and_dotdot() {
        for f in [parse, exact] {
            assert_eq!(f(""), Err(StagePathError::NotAbsolute));
            assert_eq!(f("a/b"), Err(StagePathError::NotAbsolute));
            assert_eq!(f("./a"), Err(StagePathError::NotAbsolute));
            assert_eq!(f("/a/../b"), Err(StagePathError::DotDot));
            assert_eq!(f("/.."), Err(StagePathError::DotDot));
            assert_eq!(f("/a/.."), Err(StagePathError::DotDot));
            // Names that merely hold dots are names.
            assert_eq!(f("/a/...").unwrap(), "/a/...");
            assert_eq!(f("/.hidden/..x").unwrap(), "/.hidden/..x");
        }
    }

    /// The API drops `.`; paths written for a stage refuse it.
    #[test]
    fn dot_components_are_dropped_by_parse_and_refused_by_exact() {
        assert_eq!(parse("/a/./b/.").unwrap(), "/a/b");
        assert_eq!(parse("/.").unwrap(), "/");
        assert_eq!(exact("/a/./b"), Err(StagePathError::Dot));
        assert_eq!(exact("/."), Err(StagePathError::Dot));
        assert_eq!(exact("/a/."), Err(StagePathError::Dot));
    }

    /// Limits are the API's: `exact` leaves them to the ioctl's field bound and to the
    /// manager.
    #[test]
    fn lengths_and_nul_are_limited_by_parse_only() {
        let long_name = format!("/{}", "n".repeat(MAX_NAME + 1));
        assert_eq!(parse(&long_name), Err(StagePathError::NameTooLong));
        assert_eq!(exact(&long_name).unwrap(), long_name);
        let name = format!("/{}", "n".repeat(MAX_NAME));
        assert_eq!(parse(&name).unwrap(), name);

        let at_limit = "/a".repeat(MAX_PATH / 2);
        assert_eq!(at_limit.len(), MAX_PATH);
        assert!(parse(&at_limit).is_ok());
        let over = format!("{at_limit}/");
        assert_eq!(parse(&over), Err(StagePathError::TooLong));
        assert_eq!(exact(&over).unwrap(), at_limit);

        assert_eq!(parse("/a\0b"), Err(StagePathError::Nul));
        assert_eq!(exact("/a\0b").unwrap(), "/a\0b");
    }

    /// The first failing check answers, in the order the API always checked.
    #[test]
    fn parse_checks_in_order() {
        assert_eq!(parse("a\0"), Err(StagePathError::NotAbsolute));
        let long = format!("/{}/..\0", "n".repeat(MAX_PATH));
        assert_eq!(parse(&long), Err(StagePathError::TooLong));
        assert_eq!(parse("/..\0"), Err(StagePathError::Nul));
        let both = format!("/{}/..", "n".repeat(MAX_NAME + 1));
        assert_eq!(parse(&both), Err(StagePathError::DotDot));
    }

    #[test]
    fn errnos_and_messages() {
        assert_eq!(StagePathError::NotAbsolute.errno(), EINVAL);
        assert_eq!(StagePathError::Dot.errno(), EINVAL);
        assert_eq!(StagePathError::DotDot.errno(), EINVAL);
        assert_eq!(StagePathError::Nul.errno(), EINVAL);
        assert_eq!(StagePathError::TooLong.errno(), ENAMETOOLONG);
        assert_eq!(StagePathError::NameTooLong.errno(), ENAMETOOLONG);
        assert_eq!(
            StagePathError::NotAbsolute.to_string(),
            "is not an absolute path"
        );
        assert_eq!(StagePathError::DotDot.to_string(), "has .. components");
        assert_eq!(
            StagePathError::NameTooLong.to_string(),
            "has a name longer than 255 bytes"
        );
    }

    #[test]
    fn at_or_under_goes_by_components() {
        let p = |s: &str| StagePath::parse(s).unwrap();
        assert!(p("/a/b").is_at_or_under(&p("/a")));
        assert!(p("/a").is_at_or_under(&p("/a")));
        assert!(p("/a").is_at_or_under(&StagePath::root()));
        assert!(StagePath::root().is_at_or_under(&StagePath::root()));
        assert!(!p("/ab").is_at_or_under(&p("/a")));
        assert!(!p("/a").is_at_or_under(&p("/a/b")));
        assert!(!StagePath::root().is_at_or_under(&p("/a")));
        assert!(StagePath::root().is_root() && !p("/a").is_root());
    }

    fn path_text() -> impl Strategy<Value = String> {
        let comp = prop::sample::select(vec!["", ".", "..", "a", "b", "...", ".x", "c d"]);
        (any::<bool>(), prop::collection::vec(comp, 0..8)).prop_map(|(abs, comps)| {
            let s = comps.join("/");
            if abs {
                format!("/{s}")
            } else {
                s
            }
        })
    }

    proptest! {
        /// What either rule accepts is in normal form, and stays itself under both.
        #[test]
        fn accepted_paths_are_normal_and_fixed_points(s in path_text()) {
            for p in [StagePath::parse(&s), StagePath::exact(&s)].into_iter().flatten() {
                let t = p.as_str();
                prop_assert!(t.starts_with('/'));
                prop_assert!(t == "/" || !t.ends_with('/'));
                prop_assert!(!t.contains("//"));
                prop_assert!(t.split('/').skip(1).all(|c| t == "/" || (c != "." && c != "..")));
                prop_assert_eq!(StagePath::parse(t), Ok(p.clone()));
                prop_assert_eq!(StagePath::exact(t), Ok(p.clone()));
            }
            // `exact` accepts a subset of `parse`, with the same result.
            if let Ok(p) = StagePath::exact(&s) {
                prop_assert_eq!(StagePath::parse(&s), Ok(p));
            }
        }
    }
}
