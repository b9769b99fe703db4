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

/// The request header with which an admin acts as another user: its value is a uid
/// (decimal). The request is then authorised exactly as if that user had called. The
/// FUSE client's control channel (root) sends it with the uid of the process that made
/// the ioctl, so users get through a mount exactly what the API gives them.
pub const ACT_AS_HEADER: &str = "x-spillway-as-uid";

/// Why an act-as header was not honoured.
#[derive(Debug, PartialEq, Eq)]
pub enum ActAsError {
    /// Not a uid (400).
    Malformed(String),
    /// The authenticated caller may not act as anyone else (403).
    NotAdmin(String),
}

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

    /// The caller a request is authorised as: `real` (who MUNGE says called), or with an
    /// act-as header (`value`), the user it names — gid from the name service, admin if
    /// that user is one. Only an admin may name another user; anyone else naming
    /// someone else is refused (never ignored). Naming oneself changes nothing, so a
    /// mount run by a plain user still works.
    pub fn act_as(&self, real: Caller, value: Option<&str>) -> Result<Caller, ActAsError> {
        let Some(value) = value else {
            return Ok(real);
        };
        let v = value.trim();
        let uid = if !v.is_empty() && v.len() <= 10 && v.bytes().all(|b| b.is_ascii_digit()) {
            v.parse::<u32>().ok()
        } else {
            None
        };
        let uid = uid.ok_or_else(|| {
            ActAsError::Malformed(format!(
                "{ACT_AS_HEADER} must be a uid (decimal), not {}",
                crate::echo::quoted(value)
            ))
        })?;
        if uid == real.uid {
            return Ok(real);
        }
        if !real.admin {
            return Err(ActAsError::NotAdmin(format!(
                "{ACT_AS_HEADER} is for admins: uid {} may not act as another user",
                real.uid
            )));
        }
        let gid = identity::primary_gid(uid);
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

/// A verifier for tests (this crate's and the API fuzz test, through the `testing`
/// feature; never in a production build): the credential is the name of who calls,
/// `root` (uid 0) or `user` (uid 4242); anything else is refused as munged would.
#[cfg(any(test, feature = "testing"))]
pub struct FakeVerifier;

#[cfg(any(test, feature = "testing"))]
impl Verifier for FakeVerifier {
    fn decode(&self, cred: &str) -> Result<(u32, u32), String> {
        match cred {
            "root" => Ok((0, 0)),
            "user" => Ok((4242, 4242)),
            _ => Err("Invalid credential".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use FakeVerifier as Fake;

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
    fn act_as() {
        let a = Auth::new(Box::new(Fake), Some("root".into()));
        let root = a.caller(Some("MUNGE cred=root")).unwrap();
        let user = a.caller(Some("MUNGE cred=user")).unwrap();
        // No header: the caller itself.
        assert_eq!(a.act_as(root, None), Ok(root));
        // An admin acting as a user is that user: not an admin, gid from NSS (an
        // unknown uid's own number).
        let as_user = a.act_as(root, Some("4242")).unwrap();
        assert_eq!(
            as_user,
            Caller {
                uid: 4242,
                gid: identity::primary_gid(4242),
                admin: false
            }
        );
        assert_eq!(as_user.viewer(), crate::db::Viewer::User(4242));
        // ... and as root, root (an admin); as a member of admin_group, an admin.
        assert!(a.act_as(root, Some(" 0 ")).unwrap().admin);
        assert_eq!(a.act_as(root, Some("0")).unwrap().uid, 0);
        // A user naming someone else is refused, whoever it names; naming oneself is
        // the same as no header.
        for other in ["0", "4243", "1"] {
            match a.act_as(user, Some(other)) {
                Err(ActAsError::NotAdmin(m)) => assert!(!m.contains(other), "{m}"),
                r => panic!("{other}: {r:?}"),
            }
        }
        assert_eq!(a.act_as(user, Some("4242")), Ok(user));
        // Not a uid: refused, the value cut.
        for bad in ["", "-1", "+5", "4294967296", "0x10", "12 34", "root"] {
            assert!(
                matches!(a.act_as(root, Some(bad)), Err(ActAsError::Malformed(_))),
                "{bad:?}"
            );
        }
        let huge = "9".repeat(1 << 20);
        match a.act_as(root, Some(&huge)) {
            Err(ActAsError::Malformed(m)) => assert!(m.len() < 300, "{}", m.len()),
            r => panic!("{r:?}"),
        }
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
