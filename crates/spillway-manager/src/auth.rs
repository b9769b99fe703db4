//! Who is calling: `Authorization: MUNGE cred=<credential>` decoded by the real munged
//! (which also refuses a replayed or expired credential), and whether that user is an
//! admin (root, or a member of the configured admin group).

use crate::identity;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub admin: bool,
}

impl Caller {
    pub fn viewer(&self) -> crate::db::Viewer {
        if self.admin {
            crate::db::Viewer::Admin
        } else {
            crate::db::Viewer::User(self.uid)
        }
    }
}

/// Decodes a credential into (uid, gid). The real one asks munged; unit tests may fake.
pub trait Verifier: Send + Sync {
    fn decode(&self, cred: &str) -> Result<(u32, u32), String>;
}

/// The real verifier: munged decodes (and refuses replayed, expired, forged ones).
pub struct MungeVerifier(pub spillway_munge::Munge);

impl Verifier for MungeVerifier {
    fn decode(&self, cred: &str) -> Result<(u32, u32), String> {
        self.0
            .decode(cred)
            .map(|c| (c.uid, c.gid))
            .map_err(|e| e.to_string())
    }
}

pub struct Auth {
    verifier: Box<dyn Verifier>,
    admin_group: Option<String>,
}

/// The longest credential accepted (munged's are a few hundred bytes).
const MAX_CRED: usize = 8192;

impl Auth {
    pub fn new(verifier: Box<dyn Verifier>, admin_group: Option<String>) -> Auth {
        Auth {
            verifier,
            admin_group,
        }
    }

    /// The caller named by an `Authorization` header value.
    pub fn caller(&self, header: Option<&str>) -> Result<Caller, String> {
        let h = header.ok_or("no Authorization header (expected `MUNGE cred=...`)")?;
        let cred = h
            .trim()
            .strip_prefix("MUNGE")
            .map(str::trim_start)
            .and_then(|r| r.strip_prefix("cred="))
            .map(str::trim)
            .ok_or("Authorization must be `MUNGE cred=<credential>`")?;
        if cred.is_empty() || cred.len() > MAX_CRED {
            return Err("MUNGE credential empty or too long".into());
        }
        let (uid, gid) = self
            .verifier
            .decode(cred)
            .map_err(|e| format!("MUNGE credential refused: {e}"))?;
        Ok(Caller {
            uid,
            gid,
            admin: self.is_admin(uid, gid),
        })
    }

    fn is_admin(&self, uid: u32, gid: u32) -> bool {
        if uid == 0 {
            return true;
        }
        match &self.admin_group {
            Some(g) => {
                identity::group_gid(g).is_some_and(|want| identity::in_group(uid, gid, want))
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake;
    impl Verifier for Fake {
        fn decode(&self, cred: &str) -> Result<(u32, u32), String> {
            match cred {
                "root" => Ok((0, 0)),
                "user" => Ok((4242, 4242)),
                _ => Err("Invalid credential".into()),
            }
        }
    }

    #[test]
    fn header_forms() {
        let a = Auth::new(Box::new(Fake), None);
        assert!(a.caller(Some("MUNGE cred=root")).unwrap().admin);
        let u = a.caller(Some("MUNGE  cred=user ")).unwrap();
        assert_eq!((u.uid, u.admin), (4242, false));
        assert!(a.caller(None).is_err());
        assert!(a.caller(Some("Basic abc")).is_err());
        assert!(a.caller(Some("MUNGE cred=")).is_err());
        assert!(a
            .caller(Some("MUNGE cred=forged"))
            .unwrap_err()
            .contains("refused"));
        let long = format!("MUNGE cred={}", "x".repeat(MAX_CRED + 1));
        assert!(a.caller(Some(&long)).is_err());
    }

    #[test]
    fn admin_group_membership() {
        let a = Auth::new(Box::new(Fake), Some("root".into()));
        // uid 4242 whose credential says gid 0 is in group root.
        struct G;
        impl Verifier for G {
            fn decode(&self, _: &str) -> Result<(u32, u32), String> {
                Ok((4242, 0))
            }
        }
        let b = Auth::new(Box::new(G), Some("root".into()));
        assert!(b.caller(Some("MUNGE cred=x")).unwrap().admin);
        assert!(!a.caller(Some("MUNGE cred=user")).unwrap().admin);
    }
}
