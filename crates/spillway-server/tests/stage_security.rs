//! Who may make a server stage what (docs/staging.md, "Who may stage what"): a peer
//! that holds the instance secret but no ticket the manager signed for the stage gets
//! nothing from the PFS and writes nothing to it, whatever uid or path it names; a
//! ticket is good only for its instance, stage, direction, paths and lifetime, and
//! only under the server's own PFS roots. Each refusal leaves a root-only 0600 file
//! unchanged and the instance without a new entry.

mod common;

use common::{stage_one, stage_one_done, ticket, ticket_for, Cluster, INSTANCE, SECRET};
use spillway_types::stage_ticket::StageTicket;
use spillway_types::{Attr, Errno, FileKind, InodeNo, ROOT_INODE};
use spillway_wire::{
    stage_file_outcome as outcome, stage_kind, StageDir, StageFileSpec, StageFilesReq, StagePair,
    StageStartReq, StageStripesReq, StageSyncReq,
};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A user that exists on every Debian machine and owns nothing of the test's.
const NOBODY: u32 = 65534;

/// A root-only file (0600) whose bytes and mode must survive every refused request.
struct Victim {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl Victim {
    fn new(path: PathBuf) -> Victim {
        let bytes = b"root only: never to be read or replaced\n".to_vec();
        std::fs::write(&path, &bytes).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        Victim { path, bytes }
    }

    fn unchanged(&self) {
        let m = std::fs::metadata(&self.path).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o600, "{}", self.path.display());
        assert!(
            std::fs::read(&self.path).unwrap() == self.bytes,
            "{} was overwritten",
            self.path.display()
        );
    }

    fn s(&self) -> String {
        self.path.display().to_string()
    }
}

fn unix_now() -> u64 {
    common::unix_now()
}

fn t(stage: u64, uid: u32, dir: StageDir, pfs: &[&str], expires: u64) -> StageTicket {
    StageTicket {
        instance: INSTANCE,
        stage,
        uid,
        direction: dir.into(),
        expires,
        pfs_paths: pfs.iter().map(|p| p.to_string()).collect(),
        instance_paths: vec!["/".into()],
    }
}

/// A name in the root directory whose entry lives on server 0 (a StageFiles of
/// server 0 would create it there).
fn name_on_0(prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|n| spillway_placement::dentry_server(ROOT_INODE, n.as_bytes(), 2).0 == 0)
        .unwrap()
}

fn spec_in(name: &str, src: &str) -> StageFileSpec {
    StageFileSpec {
        parent: ROOT_INODE,
        name: name.as_bytes().to_vec(),
        gid: 0,
        stripe_size: 64 << 10,
        stripe_width: 2,
        ino: InodeNo(0),
        pfs_path: src.to_string(),
        shown: format!("/{name}"),
    }
}

fn spec_out(a: &Attr, dst: &str) -> StageFileSpec {
    StageFileSpec {
        ino: a.ino,
        pfs_path: dst.to_string(),
        ..spec_in("", "")
    }
}

/// A small file homed on server 0 (so server 0 stages it out alone).
fn instance_file_on_0(c: &Cluster) -> Attr {
    let name = name_on_0("src");
    let a = c.create(ROOT_INODE, &name, FileKind::Regular).unwrap();
    assert_eq!(a.ino.home().0, 0);
    c.write(&a, 0, b"attacker's bytes").unwrap();
    c.getattr(a.ino).unwrap()
}

/// The tickets a peer holding the secret could bring without the manager: none, one
/// tagged with another secret, an expired one, one for another instance.
fn bad_tickets(dir: StageDir, pfs: &[&str]) -> Vec<(&'static str, Vec<u8>)> {
    let far = unix_now() + 3600;
    vec![
        ("no ticket", Vec::new()),
        (
            "garbage",
            b"SPWT\x01 not a ticket at all, only bytes".to_vec(),
        ),
        (
            "forged tag",
            ticket_for(b"a secret guessed by the attacker", &t(1, 0, dir, pfs, far)),
        ),
        (
            "expired",
            ticket_for(SECRET, &t(1, 0, dir, pfs, unix_now() - 1)),
        ),
        (
            "another instance",
            ticket_for(
                SECRET,
                &StageTicket {
                    instance: INSTANCE + 1,
                    ..t(1, 0, dir, pfs, far)
                },
            ),
        ),
        (
            "the other direction",
            ticket_for(
                SECRET,
                &t(
                    1,
                    0,
                    if dir == StageDir::In {
                        StageDir::Out
                    } else {
                        StageDir::In
                    },
                    pfs,
                    far,
                ),
            ),
        ),
        (
            // A capability is keyed by the secret itself: never a ticket.
            "a capability",
            common::capability(),
        ),
    ]
}

#[test]
fn a_peer_without_a_valid_ticket_reads_and_writes_nothing() {
    let c = Cluster::start(2, 1 << 30, 64 << 10);
    let outside = tempfile::tempdir().unwrap();
    let victim = Victim::new(outside.path().join("victim"));
    let inside = Victim::new(c.pfs.path().join("root-only"));
    let paths = ["/".to_string(), victim.s(), inside.s()];
    let pfs: Vec<&str> = paths.iter().map(String::as_str).collect();
    let name = name_on_0("stolen");
    let src_file = instance_file_on_0(&c);
    let peer = c.peer(0);

    for dir in [StageDir::In, StageDir::Out] {
        for (why, tk) in bad_tickets(dir, &pfs) {
            let files = if dir == StageDir::In {
                vec![
                    spec_in(&name, "/etc/shadow"),
                    spec_in(&name, &victim.s()),
                    spec_in(&name, &inside.s()),
                ]
            } else {
                vec![
                    spec_out(&src_file, &victim.s()),
                    spec_out(&src_file, &inside.s()),
                ]
            };
            let e = peer
                .call(&StageFilesReq {
                    direction: dir,
                    ticket: tk.clone(),
                    files,
                })
                .unwrap_err();
            assert_eq!(e, Errno::EACCES, "StageFiles with {why}");
            let e = peer
                .call(&StageStripesReq {
                    ino: src_file.ino,
                    stripe_size: 64 << 10,
                    stripe_width: 2,
                    size: 1 << 20,
                    from: 0,
                    to: 1 << 20,
                    direction: dir,
                    pfs_path: victim.s(),
                    pfs_ino: std::fs::metadata(&victim.path).unwrap().ino(),
                    ticket: tk.clone(),
                })
                .unwrap_err();
            assert_eq!(e, Errno::EACCES, "StageStripes with {why}");
            let e = peer
                .call(&StageSyncReq {
                    direction: dir,
                    ticket: tk,
                })
                .unwrap_err();
            assert_eq!(e, Errno::EACCES, "StageSync with {why}");
        }
    }
    victim.unchanged();
    inside.unchanged();
    assert_eq!(
        c.lookup(ROOT_INODE, &name).map(|_| ()),
        Err(Errno::ENOENT),
        "no entry made from a refused stage-in"
    );
}

#[test]
fn a_valid_ticket_reaches_only_its_paths_under_the_servers_roots() {
    let c = Cluster::start(2, 1 << 30, 64 << 10);
    // The PFS root is a tempdir (0700): others must be able to enter it, as on a PFS.
    std::fs::set_permissions(c.pfs.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let alice = c.pfs.path().join("alice");
    std::fs::create_dir(&alice).unwrap();
    std::fs::set_permissions(&alice, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(alice.join("data"), b"alice's data").unwrap();
    std::fs::set_permissions(alice.join("data"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let alice_s = alice.display().to_string();
    let inside = Victim::new(c.pfs.path().join("root-only"));
    let outside = tempfile::tempdir().unwrap();
    let victim = Victim::new(outside.path().join("victim"));
    let peer = c.peer(0);
    let src_file = instance_file_on_0(&c);

    // Genuine tickets, but the request names what they do not cover: a path outside
    // the ticket's (as its uid), or a ticket as wide as "/" for root reaching outside
    // the server's own roots (/etc/shadow, a root-only file elsewhere).
    let narrow_in = ticket(1, NOBODY, StageDir::In, &[&alice_s], &["/"]);
    let wide_in = ticket(2, 0, StageDir::In, &["/"], &["/"]);
    let narrow_out = ticket(3, NOBODY, StageDir::Out, &[&alice_s], &["/"]);
    let wide_out = ticket(4, 0, StageDir::Out, &["/"], &["/"]);
    let climbing = format!("{alice_s}/../root-only");
    let cases_in = [
        (&narrow_in, inside.s()),
        (&narrow_in, climbing.clone()),
        (&narrow_in, "/etc/shadow".to_string()),
        (&wide_in, "/etc/shadow".to_string()),
        (&wide_in, victim.s()),
    ];
    for (i, (tk, src)) in cases_in.iter().enumerate() {
        let name = name_on_0(&format!("in{i}-"));
        let x = stage_one(&peer, StageDir::In, (*tk).clone(), spec_in(&name, src));
        assert_eq!(
            (x.outcome, x.errno),
            (outcome::FAILED, libc::EACCES),
            "{src}: {}",
            x.message
        );
        assert_eq!(c.lookup(ROOT_INODE, &name).map(|_| ()), Err(Errno::ENOENT));
    }
    let cases_out = [
        (&narrow_out, inside.s()),
        (&narrow_out, climbing),
        (&wide_out, victim.s()),
        (
            &wide_out,
            "/etc/spillway-stage-test-must-not-exist".to_string(),
        ),
    ];
    for (tk, dst) in &cases_out {
        let x = stage_one(
            &peer,
            StageDir::Out,
            (*tk).clone(),
            spec_out(&src_file, dst),
        );
        assert_eq!(
            (x.outcome, x.errno),
            (outcome::FAILED, libc::EACCES),
            "{dst}: {}",
            x.message
        );
    }
    assert!(!Path::new("/etc/spillway-stage-test-must-not-exist").exists());
    let e = peer
        .call(&StageStripesReq {
            ino: src_file.ino,
            stripe_size: 64 << 10,
            stripe_width: 2,
            size: src_file.size,
            from: 0,
            to: src_file.size,
            direction: StageDir::Out,
            pfs_path: victim.s(),
            pfs_ino: std::fs::metadata(&victim.path).unwrap().ino(),
            ticket: wide_out.clone(),
        })
        .unwrap_err();
    assert_eq!(e, Errno::EACCES, "StageStripes outside the server's roots");
    inside.unchanged();
    victim.unchanged();

    // Within its paths the ticket works, as its uid: nobody reads alice's 0644 file
    // and writes into her 0777 directory, but not into the root-owned PFS root.
    let name = name_on_0("ok");
    let data = format!("{alice_s}/data");
    stage_one_done(&peer, StageDir::In, narrow_in, spec_in(&name, &data));
    let a = c.lookup(ROOT_INODE, &name).unwrap();
    let attr = c.getattr(a.entry.ino).unwrap();
    assert_eq!(attr.uid, NOBODY, "the stage ran as the ticket's uid");
    assert!(c.read(&attr, 0, attr.size).unwrap() == b"alice's data");
    let out = spec_out(&src_file, &format!("{alice_s}/out"));
    stage_one_done(&peer, StageDir::Out, narrow_out.clone(), out);
    assert_eq!(
        std::fs::metadata(alice.join("out")).unwrap().uid(),
        NOBODY,
        "made as the ticket's uid"
    );
    peer.call(&StageSyncReq {
        direction: StageDir::Out,
        ticket: narrow_out,
    })
    .unwrap();
}

#[test]
fn stage_start_needs_the_stages_own_ticket_covering_its_pairs() {
    let c = Cluster::start(2, 1 << 30, 64 << 10);
    let alice = c.pfs.path().join("alice");
    std::fs::create_dir(&alice).unwrap();
    let alice_s = alice.display().to_string();
    let victim = Victim::new(c.pfs.path().join("root-only"));
    let admin = c.nodes[0].admin();
    let start = |stage: u64, src: &str, tk: Vec<u8>| {
        admin.call(&StageStartReq {
            stage,
            instance: INSTANCE,
            direction: StageDir::In,
            kind: stage_kind::FILE,
            pairs: vec![StagePair {
                source: src.to_string(),
                destination: "/copy".into(),
            }],
            ticket: tk,
            files_in_flight: 1,
        })
    };
    let far = unix_now() + 3600;
    let refused = [
        ("no ticket", 10, victim.s(), Vec::new()),
        (
            "another stage's ticket",
            11,
            victim.s(),
            ticket(99, 0, StageDir::In, &["/"], &["/"]),
        ),
        (
            "a ticket not covering the source",
            12,
            victim.s(),
            ticket(12, 0, StageDir::In, &[&alice_s], &["/"]),
        ),
        (
            "a ticket not covering the destination",
            13,
            victim.s(),
            ticket(13, 0, StageDir::In, &["/"], &["/elsewhere"]),
        ),
        (
            "a ticket for stage-out",
            14,
            victim.s(),
            ticket(14, 0, StageDir::Out, &["/"], &["/"]),
        ),
        (
            "an expired ticket",
            15,
            victim.s(),
            ticket_for(SECRET, &t(15, 0, StageDir::In, &["/"], unix_now() - 1)),
        ),
        (
            "a forged ticket",
            16,
            victim.s(),
            ticket_for(b"not the secret", &t(16, 0, StageDir::In, &["/"], far)),
        ),
    ];
    for (why, stage, src, tk) in refused {
        assert_eq!(start(stage, &src, tk), Err(Errno::EACCES), "{why}");
    }
    // A client holding only a capability may not start or feed stages at all.
    let e = c
        .at(0)
        .call(&StageStartReq {
            stage: 17,
            instance: INSTANCE,
            direction: StageDir::In,
            kind: stage_kind::FILE,
            pairs: vec![StagePair {
                source: victim.s(),
                destination: "/copy".into(),
            }],
            ticket: ticket(17, 0, StageDir::In, &["/"], &["/"]),
            files_in_flight: 1,
        })
        .unwrap_err();
    assert_eq!(e, Errno::EPERM);
    victim.unchanged();
    assert_eq!(c.lookup(ROOT_INODE, "copy").map(|_| ()), Err(Errno::ENOENT));
}
