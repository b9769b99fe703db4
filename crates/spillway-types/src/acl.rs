//! POSIX ACLs: the binary xattr format Linux uses for `system.posix_acl_access` and
//! `system.posix_acl_default`, and the rules Linux file systems apply to them (the
//! kernel's `fs/posix_acl.c`), so that the servers and the client agree with ext4:
//!
//! * `Acl::parse` accepts exactly what `posix_acl_valid()` accepts (version 2 header;
//!   8-byte entries tag/perm/id; USER_OBJ, USER..., GROUP_OBJ, GROUP..., MASK, OTHER in
//!   that order; MASK required when a named entry is present; perms within rwx);
//!   anything else is EINVAL. Values come from outside (every client, the wire).
//! * `Acl::equiv_mode` is `posix_acl_equiv_mode()`: the permission bits an access ACL
//!   shows in the mode (the mask's bits as the group bits), and whether the ACL says
//!   nothing more than the mode (then the file system stores the mode alone).
//! * `Acl::chmod` is `__posix_acl_chmod()`: a chmod rewrites the owner, the mask (or the
//!   owning group, without a mask) and the other entries.
//! * `inherit` is `posix_acl_create()`: what a new inode gets from its directory's
//!   default ACL (and the umask applied only when there is none).

use crate::Errno;

/// The access ACL's xattr name.
pub const ACCESS_XATTR: &[u8] = b"system.posix_acl_access";
/// The default ACL's xattr name (directories only).
pub const DEFAULT_XATTR: &[u8] = b"system.posix_acl_default";

/// `POSIX_ACL_XATTR_VERSION`: the only header Linux reads or writes.
pub const XATTR_VERSION: u32 = 2;
/// The kernel reads an ACL into one page (`fuse_get_acl`) and refuses to send a larger
/// one (`fuse_set_acl`: E2BIG); stored ACLs never exceed it.
pub const MAX_XATTR_BYTES: usize = 4096;
/// `ACL_UNDEFINED_ID`: the id of entries without a qualifier.
pub const UNDEFINED_ID: u32 = u32::MAX;

const HEADER_BYTES: usize = 4;
const ENTRY_BYTES: usize = 8;

/// Entry tags (`ACL_USER_OBJ` ...).
pub mod tag {
    pub const USER_OBJ: u16 = 0x01;
    pub const USER: u16 = 0x02;
    pub const GROUP_OBJ: u16 = 0x04;
    pub const GROUP: u16 = 0x08;
    pub const MASK: u16 = 0x10;
    pub const OTHER: u16 = 0x20;
}

/// Permission bits of one entry (`ACL_READ | ACL_WRITE | ACL_EXECUTE`).
const PERM_BITS: u16 = 0o7;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub tag: u16,
    pub perm: u16,
    /// The uid or gid of a USER or GROUP entry; `UNDEFINED_ID` for the others.
    pub id: u32,
}

/// A valid ACL (only `parse` and the constructors below make one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

/// Where `posix_acl_valid()`'s walk is: which tags may come next.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    UserObj,
    User,
    Group,
    Other,
    Done,
}

impl Acl {
    /// Parse and validate an xattr value. EINVAL for anything Linux would refuse (and
    /// for an empty entry list, which the kernel never sends: it removes instead),
    /// E2BIG beyond one page.
    pub fn parse(value: &[u8]) -> Result<Acl, Errno> {
        if value.len() > MAX_XATTR_BYTES {
            return Err(Errno::E2BIG);
        }
        let (header, body) = value.split_at_checked(HEADER_BYTES).ok_or(Errno::EINVAL)?;
        let version = u32::from_le_bytes(header.try_into().map_err(|_| Errno::EINVAL)?);
        if version != XATTR_VERSION || body.is_empty() || body.len() % ENTRY_BYTES != 0 {
            return Err(Errno::EINVAL);
        }
        let entries = body
            .chunks_exact(ENTRY_BYTES)
            .map(|c| {
                let tag = u16::from_le_bytes([c[0], c[1]]);
                let perm = u16::from_le_bytes([c[2], c[3]]);
                let id = u32::from_le_bytes([c[4], c[5], c[6], c[7]]);
                // Unqualified entries carry no id: stored in the canonical form.
                let id = if tag == tag::USER || tag == tag::GROUP {
                    id
                } else {
                    UNDEFINED_ID
                };
                Entry { tag, perm, id }
            })
            .collect();
        let acl = Acl { entries };
        acl.validate()?;
        Ok(acl)
    }

    /// `posix_acl_valid()`, plus: a named entry's id must be a real id (the kernel's
    /// `make_kuid` refuses (uid_t)-1).
    fn validate(&self) -> Result<(), Errno> {
        let mut state = State::UserObj;
        let mut needs_mask = false;
        for e in &self.entries {
            if e.perm & !PERM_BITS != 0 {
                return Err(Errno::EINVAL);
            }
            state = match (e.tag, state) {
                (tag::USER_OBJ, State::UserObj) => State::User,
                (tag::USER, State::User) | (tag::GROUP, State::Group) => {
                    if e.id == UNDEFINED_ID {
                        return Err(Errno::EINVAL);
                    }
                    needs_mask = true;
                    state
                }
                (tag::GROUP_OBJ, State::User) => State::Group,
                (tag::MASK, State::Group) => State::Other,
                (tag::OTHER, State::Other) => State::Done,
                (tag::OTHER, State::Group) if !needs_mask => State::Done,
                _ => return Err(Errno::EINVAL),
            };
        }
        if state == State::Done {
            Ok(())
        } else {
            Err(Errno::EINVAL)
        }
    }

    /// The minimal ACL a mode stands for (owner, group, other).
    pub fn from_mode(mode: u32) -> Acl {
        let perm = |shift: u32| ((mode >> shift) & 0o7) as u16;
        let e = |tag, perm| Entry {
            tag,
            perm,
            id: UNDEFINED_ID,
        };
        Acl {
            entries: vec![
                e(tag::USER_OBJ, perm(6)),
                e(tag::GROUP_OBJ, perm(3)),
                e(tag::OTHER, perm(0)),
            ],
        }
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The xattr value (canonical: unqualified entries carry `UNDEFINED_ID`).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + ENTRY_BYTES * self.entries.len());
        out.extend_from_slice(&XATTR_VERSION.to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&e.id.to_le_bytes());
        }
        out
    }

    /// `posix_acl_equiv_mode()`: the rwx bits (0o777) this access ACL shows in the
    /// mode, and whether it is equivalent to them (no named entries, no mask).
    pub fn equiv_mode(&self) -> (u32, bool) {
        let mut mode = 0u32;
        let mut equivalent = true;
        for e in &self.entries {
            let p = u32::from(e.perm & PERM_BITS);
            match e.tag {
                tag::USER_OBJ => mode |= p << 6,
                tag::GROUP_OBJ => mode |= p << 3,
                tag::OTHER => mode |= p,
                tag::MASK => {
                    // Validated order: the mask follows the owning group and wins.
                    mode = (mode & !0o070) | (p << 3);
                    equivalent = false;
                }
                _ => equivalent = false,
            }
        }
        (mode, equivalent)
    }

    /// `__posix_acl_chmod()`: the ACL after a chmod to `mode`.
    pub fn chmod(&mut self, mode: u32) {
        let has_mask = self.entries.iter().any(|e| e.tag == tag::MASK);
        for e in &mut self.entries {
            match e.tag {
                tag::USER_OBJ => e.perm = ((mode >> 6) & 0o7) as u16,
                tag::MASK => e.perm = ((mode >> 3) & 0o7) as u16,
                tag::GROUP_OBJ if !has_mask => e.perm = ((mode >> 3) & 0o7) as u16,
                tag::OTHER => e.perm = (mode & 0o7) as u16,
                _ => {}
            }
        }
    }

    /// `posix_acl_create_masq()`: restrict this (a copy of a default ACL) by the create
    /// mode, and the mode by it. Returns the new mode (special bits kept) and whether
    /// the ACL says more than the mode (then it is stored as the access ACL).
    fn create_masq(&mut self, mode_in: u32) -> (u32, bool) {
        let mut mode = mode_in & 0o777;
        let mut not_equiv = false;
        let has_mask = self.entries.iter().any(|e| e.tag == tag::MASK);
        for e in &mut self.entries {
            match e.tag {
                tag::USER_OBJ => {
                    e.perm &= ((mode >> 6) & 0o7) as u16;
                    mode &= (u32::from(e.perm) << 6) | !0o700;
                }
                tag::USER | tag::GROUP => not_equiv = true,
                tag::OTHER => {
                    e.perm &= (mode & 0o7) as u16;
                    mode &= u32::from(e.perm) | !0o007;
                }
                tag::MASK => not_equiv = true,
                _ => {}
            }
        }
        // The mask (or, without one, the owning group) meets the group bits; the
        // validated ACL has a GROUP_OBJ, so one of the two always matches.
        let group_tag = if has_mask { tag::MASK } else { tag::GROUP_OBJ };
        for e in &mut self.entries {
            if e.tag == group_tag {
                e.perm &= ((mode >> 3) & 0o7) as u16;
                mode &= (u32::from(e.perm) << 3) | !0o070;
            }
        }
        ((mode_in & !0o777) | (mode & 0o777), not_equiv)
    }
}

/// What a new inode gets at creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inherited {
    /// The mode to create with (kind bits not included; special bits as given).
    pub mode: u32,
    /// Its access ACL, when the inherited one says more than the mode.
    pub access: Option<Vec<u8>>,
    /// Its default ACL (directories in a directory with one).
    pub default: Option<Vec<u8>>,
}

/// `posix_acl_create()`: a new inode of mode `mode` (permission and special bits) in a
/// directory whose default ACL is `parent_default`. Without one the umask applies;
/// with one it does not, and the new inode's access ACL is the default masked by the
/// mode (directories also inherit the default itself). Symlinks take neither.
pub fn inherit(parent_default: Option<&Acl>, is_dir: bool, mode: u32, umask: u32) -> Inherited {
    let Some(default) = parent_default else {
        return Inherited {
            mode: mode & !(umask & 0o777),
            access: None,
            default: None,
        };
    };
    let mut access = default.clone();
    let (mode, not_equiv) = access.create_masq(mode);
    Inherited {
        mode,
        access: not_equiv.then(|| access.to_bytes()),
        default: is_dir.then(|| default.to_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn e(tag: u16, perm: u16, id: u32) -> Entry {
        Entry { tag, perm, id }
    }

    fn acl(entries: &[Entry]) -> Vec<u8> {
        Acl {
            entries: entries.to_vec(),
        }
        .to_bytes()
    }

    const U: u32 = UNDEFINED_ID;

    fn with_user() -> Vec<Entry> {
        vec![
            e(tag::USER_OBJ, 6, U),
            e(tag::USER, 6, 1000),
            e(tag::GROUP_OBJ, 4, U),
            e(tag::MASK, 6, U),
            e(tag::OTHER, 0, U),
        ]
    }

    #[test]
    fn parses_what_setfacl_writes() {
        let v = acl(&with_user());
        let a = Acl::parse(&v).unwrap();
        assert_eq!(a.to_bytes(), v);
        assert_eq!(a.equiv_mode(), (0o660, false));
        let min = Acl::parse(&Acl::from_mode(0o751).to_bytes()).unwrap();
        assert_eq!(min.equiv_mode(), (0o751, true));
    }

    #[test]
    fn refuses_malformed() {
        let einval = |v: &[u8]| assert_eq!(Acl::parse(v), Err(Errno::EINVAL), "{v:?}");
        einval(b"");
        einval(&[2, 0, 0]);
        einval(&2u32.to_le_bytes()); // no entries
        let mut v = acl(&with_user());
        v[0] = 1; // version
        einval(&v);
        let mut v = acl(&with_user());
        v.push(0); // not a whole entry
        einval(&v);
        // Missing owner, group or other; a named entry without a mask.
        einval(&acl(&[e(tag::GROUP_OBJ, 4, U), e(tag::OTHER, 0, U)]));
        einval(&acl(&[e(tag::USER_OBJ, 6, U), e(tag::OTHER, 0, U)]));
        einval(&acl(&[e(tag::USER_OBJ, 6, U), e(tag::GROUP_OBJ, 4, U)]));
        einval(&acl(&[
            e(tag::USER_OBJ, 6, U),
            e(tag::USER, 6, 5),
            e(tag::GROUP_OBJ, 4, U),
            e(tag::OTHER, 0, U),
        ]));
        // Out of order, duplicated, unknown tag, bad perm, undefined id.
        let mut swapped = with_user();
        swapped.swap(1, 2);
        einval(&acl(&swapped));
        let mut twice = with_user();
        twice.insert(0, e(tag::USER_OBJ, 6, U));
        einval(&acl(&twice));
        let mut unknown = with_user();
        unknown[1].tag = 0x40;
        einval(&acl(&unknown));
        let mut perm = with_user();
        perm[4].perm = 8;
        einval(&acl(&perm));
        let mut id = with_user();
        id[1].id = U;
        einval(&acl(&id));
        assert_eq!(Acl::parse(&[0; 4100]), Err(Errno::E2BIG));
    }

    #[test]
    fn unqualified_ids_are_canonical() {
        let mut v = acl(&with_user());
        v[8..12].copy_from_slice(&7u32.to_le_bytes()); // USER_OBJ's id
        assert_eq!(Acl::parse(&v).unwrap().to_bytes(), acl(&with_user()));
    }

    #[test]
    fn chmod_rewrites_owner_mask_other() {
        let mut a = Acl::parse(&acl(&with_user())).unwrap();
        a.chmod(0o750);
        assert_eq!(
            a.entries(),
            &[
                e(tag::USER_OBJ, 7, U),
                e(tag::USER, 6, 1000),
                e(tag::GROUP_OBJ, 4, U),
                e(tag::MASK, 5, U),
                e(tag::OTHER, 0, U),
            ]
        );
        let mut m = Acl::from_mode(0o644);
        m.chmod(0o705);
        assert_eq!(m, Acl::from_mode(0o705));
    }

    #[test]
    fn inheritance_as_ext4() {
        // setfacl -d -m u:1000:rwx,g::r-x,o::--- on a directory, then `touch f`
        // (mode 0666) and `mkdir d` (0777) with umask 022 (ignored).
        let d = Acl::parse(&acl(&[
            e(tag::USER_OBJ, 7, U),
            e(tag::USER, 7, 1000),
            e(tag::GROUP_OBJ, 5, U),
            e(tag::MASK, 7, U),
            e(tag::OTHER, 0, U),
        ]))
        .unwrap();
        let f = inherit(Some(&d), false, 0o666, 0o022);
        assert_eq!(f.mode, 0o660);
        assert_eq!(f.default, None);
        let fa = Acl::parse(f.access.as_deref().unwrap()).unwrap();
        assert_eq!(fa.entries()[1], e(tag::USER, 7, 1000)); // effective rw- via mask
        assert_eq!(fa.entries()[3], e(tag::MASK, 6, U));
        let dir = inherit(Some(&d), true, 0o2777, 0o022);
        assert_eq!(dir.mode, 0o2770);
        assert_eq!(dir.default, Some(d.to_bytes()));
        // A minimal default ACL: the mode only, no access ACL stored.
        let min = Acl::from_mode(0o750);
        let g = inherit(Some(&min), false, 0o666, 0o077);
        assert_eq!((g.mode, g.access), (0o640, None));
        // No default ACL: the umask.
        assert_eq!(inherit(None, false, 0o666, 0o027).mode, 0o640);
        assert_eq!(inherit(None, true, 0o1777, 0o022).mode, 0o1755);
    }

    fn arb_acl() -> impl Strategy<Value = Acl> {
        (
            0u16..8,
            prop::collection::vec((0u16..8, 0u32..5000), 0..6),
            0u16..8,
            prop::collection::vec((0u16..8, 0u32..5000), 0..6),
            0u16..8,
            0u16..8,
            any::<bool>(),
        )
            .prop_map(|(uo, users, go, groups, mask, other, want_mask)| {
                let mut v = vec![e(tag::USER_OBJ, uo, U)];
                v.extend(users.iter().map(|&(p, id)| e(tag::USER, p, id)));
                v.push(e(tag::GROUP_OBJ, go, U));
                v.extend(groups.iter().map(|&(p, id)| e(tag::GROUP, p, id)));
                if want_mask || !users.is_empty() || !groups.is_empty() {
                    v.push(e(tag::MASK, mask, U));
                }
                v.push(e(tag::OTHER, other, U));
                Acl { entries: v }
            })
    }

    proptest! {
        /// Outside input: any bytes give an answer, never a panic; whatever is
        /// accepted re-encodes to a value that parses to the same ACL.
        #[test]
        fn parse_never_panics(v in prop::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(a) = Acl::parse(&v) {
                prop_assert_eq!(Acl::parse(&a.to_bytes()), Ok(a));
            }
        }

        /// Mutations of a valid ACL (one byte changed) are accepted or refused
        /// cleanly, and an accepted one is valid by construction.
        #[test]
        fn mutated(a in arb_acl(), at in any::<prop::sample::Index>(), b in any::<u8>()) {
            let mut v = a.to_bytes();
            let i = at.index(v.len());
            v[i] = b;
            if let Ok(p) = Acl::parse(&v) {
                prop_assert!(p.validate().is_ok());
            }
        }

        #[test]
        fn valid_round_trip_and_chmod(a in arb_acl(), mode in 0u32..0o1000) {
            let parsed = Acl::parse(&a.to_bytes());
            prop_assert_eq!(parsed.as_ref(), Ok(&a));
            let mut c = a.clone();
            c.chmod(mode);
            // After a chmod the ACL shows exactly the new mode.
            prop_assert_eq!(c.equiv_mode().0, mode);
            prop_assert_eq!(c.equiv_mode().1, a.equiv_mode().1);
        }

        #[test]
        fn inherited_mode_within_request(a in arb_acl(), mode in 0u32..0o10000, dir: bool) {
            let i = inherit(Some(&a), dir, mode, 0o777);
            prop_assert_eq!(i.mode & !0o777, mode & !0o777);
            prop_assert_eq!(i.mode & 0o777 & !mode, 0);
            if let Some(acc) = &i.access {
                // The stored access ACL and the mode agree.
                prop_assert_eq!(Acl::parse(acc).map(|x| x.equiv_mode().0), Ok(i.mode & 0o777));
            }
            prop_assert_eq!(i.default.is_some(), dir);
        }
    }
}
