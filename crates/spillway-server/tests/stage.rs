//! The stage engine through the wire, on real servers: a coordinator started with
//! StageStart, its progress followed with StageProgress, the data checked through the
//! stripes the servers hold and on the "PFS" (a temporary directory).

mod common;

use common::{Cluster, INSTANCE};
use spillway_types::{FileKind, Tunables, ROOT_INODE};
use spillway_wire::{
    stage_kind, stage_state, FileState, StageDir, StageFileEvent, StagePair, StageProgressReq,
    StageStartReq,
};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

static NEXT_STAGE: AtomicU64 = AtomicU64::new(1);

struct Outcome {
    state: u8,
    files_total: u64,
    files_done: u64,
    bytes_done: u64,
    events: Vec<StageFileEvent>,
    error: String,
}

impl Outcome {
    fn failed(&self) -> Vec<(&str, i32)> {
        self.events
            .iter()
            .filter(|e| e.file_state() == Some(FileState::Failed))
            .map(|e| (e.path.as_str(), e.errno))
            .collect()
    }
}

/// Run a stage to its end with the ticket the manager would sign for it (the pairs'
/// paths, `uid`, `dir`), as the coordinator chosen by its id.
fn stage(c: &Cluster, dir: StageDir, kind: u8, pairs: &[(&str, &str)], uid: u32) -> Outcome {
    let id = NEXT_STAGE.fetch_add(1, Ordering::SeqCst);
    let (pfs, inside): (Vec<&str>, Vec<&str>) = pairs
        .iter()
        .map(|&(s, d)| if dir == StageDir::In { (s, d) } else { (d, s) })
        .unzip();
    let ticket = common::ticket(id, uid, dir, &pfs, &inside);
    let admin = c.nodes[(id as usize) % c.nodes.len()].admin();
    admin
        .call(&StageStartReq {
            stage: id,
            instance: INSTANCE,
            direction: dir,
            kind,
            pairs: pairs
                .iter()
                .map(|(s, d)| StagePair {
                    source: s.to_string(),
                    destination: d.to_string(),
                })
                .collect(),
            ticket,
            files_in_flight: std::env::var("FIF")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(8),
        })
        .expect("stage start");
    let mut events = Vec::new();
    let mut cursor = 0;
    let t0 = Instant::now();
    loop {
        let r = admin
            .call(&StageProgressReq {
                stage: id,
                cursor,
                wait_ms: 1000,
            })
            .expect("progress");
        events.extend(r.events);
        cursor = r.cursor;
        if r.state != stage_state::RUNNING {
            return Outcome {
                state: r.state,
                files_total: r.files_total,
                files_done: r.files_done,
                bytes_done: r.bytes_done,
                events,
                error: r.error,
            };
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "stage {id} never ended"
        );
    }
}

/// Run a stage as root that must complete.
fn staged(c: &Cluster, dir: StageDir, kind: u8, pairs: &[(&str, &str)]) -> Outcome {
    let o = stage(c, dir, kind, pairs, 0);
    assert_eq!(o.state, stage_state::COMPLETE, "{}", o.error);
    o
}

/// Stage the instance tree `/in` out, as root, into `back`, a new directory of the
/// PFS; it must complete.
fn tree_out(c: &Cluster) -> (Outcome, PathBuf) {
    let back = c.pfs.path().join("back");
    std::fs::create_dir(&back).unwrap();
    let to = back.to_str().unwrap();
    let o = staged(c, StageDir::Out, stage_kind::DIRECTORY, &[("/in", to)]);
    (o, back)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

fn instance_file(c: &Cluster, path: &str) -> (spillway_types::Attr, Vec<u8>) {
    let mut ino = ROOT_INODE;
    let mut attr = c.getattr(ino).unwrap();
    for name in path.split('/').filter(|s| !s.is_empty()) {
        ino = c.lookup(ino, name).unwrap().entry.ino;
        attr = c.getattr(ino).unwrap();
    }
    let data = if attr.kind == FileKind::Regular {
        c.read(&attr, 0, attr.size).unwrap()
    } else {
        Vec::new()
    };
    (attr, data)
}

#[test]
fn a_file_goes_in_and_out_with_its_bytes_mode_and_mtime() {
    let c = Cluster::start(2, 1 << 30, 64 << 10);
    let pfs = &c.pfs;
    let src = pfs.path().join("input.bin");
    let data = pattern((64 << 10) * 7 + 1234, 3);
    std::fs::write(&src, &data).unwrap();
    std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o640)).unwrap();
    let mtime = std::time::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    std::fs::File::options()
        .write(true)
        .open(&src)
        .unwrap()
        .set_modified(mtime)
        .unwrap();

    let o = staged(
        &c,
        StageDir::In,
        stage_kind::FILE,
        &[(src.to_str().unwrap(), "/input.bin")],
    );
    assert_eq!((o.files_total, o.files_done), (1, 1));
    assert_eq!(o.bytes_done, data.len() as u64);
    let (attr, got) = instance_file(&c, "/input.bin");
    assert!(got == data, "the instance holds the source's bytes");
    assert_eq!(attr.mode & 0o7777, 0o640);
    assert_eq!(attr.mtime.sec, 1_600_000_000);
    // Both servers hold stripes of it.
    assert!(!c.stripes_on(0, attr.ino).is_empty() && !c.stripes_on(1, attr.ino).is_empty());

    let out = pfs.path().join("output.bin");
    staged(
        &c,
        StageDir::Out,
        stage_kind::FILE,
        &[("/input.bin", out.to_str().unwrap())],
    );
    assert!(std::fs::read(&out).unwrap() == data);
    let m = std::fs::metadata(&out).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o640);
    assert_eq!(m.mtime(), 1_600_000_000);

    // Staging in again truncates and replaces.
    std::fs::write(&src, b"short").unwrap();
    staged(
        &c,
        StageDir::In,
        stage_kind::FILE,
        &[(src.to_str().unwrap(), "/input.bin")],
    );
    assert_eq!(instance_file(&c, "/input.bin").1, b"short");
}

/// A file of many ranges, several in flight at each server at once: every range lands
/// where it belongs both ways, and the bytes reported add up to the size.
#[test]
fn a_large_file_is_copied_with_several_ranges_in_flight() {
    let t = Tunables {
        stage_range: 1 << 20,
        stage_ranges_in_flight: 3,
        ..common::tunables()
    };
    let c = Cluster::start_tuned(2, 1 << 30, 64 << 10, t);
    let pfs = &c.pfs;
    let src = pfs.path().join("many-ranges.bin");
    let data = pattern((6 << 20) + 4321, 9);
    std::fs::write(&src, &data).unwrap();
    let o = staged(
        &c,
        StageDir::In,
        stage_kind::FILE,
        &[(src.to_str().unwrap(), "/many-ranges.bin")],
    );
    assert_eq!(o.bytes_done, data.len() as u64);
    assert!(instance_file(&c, "/many-ranges.bin").1 == data);

    let out = pfs.path().join("many-ranges.out");
    let o = staged(
        &c,
        StageDir::Out,
        stage_kind::FILE,
        &[("/many-ranges.bin", out.to_str().unwrap())],
    );
    assert_eq!(o.bytes_done, data.len() as u64);
    assert!(std::fs::read(&out).unwrap() == data);
}

#[test]
fn a_tree_goes_in_and_out() {
    let c = Cluster::start(2, 1 << 30, 64 << 10);
    let pfs = &c.pfs;
    let src = pfs.path().join("tree");
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    std::fs::create_dir_all(src.join("empty")).unwrap();
    let mut files = Vec::new();
    for i in 0..150 {
        let rel = match i % 3 {
            0 => format!("f{i}"),
            1 => format!("a/f{i}"),
            _ => format!("a/b/f{i}"),
        };
        let data = pattern(i * 997 % 200_000, i as u8);
        std::fs::write(src.join(&rel), &data).unwrap();
        files.push((rel, data));
    }
    std::fs::set_permissions(src.join("a/f1"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("a/f1", src.join("link")).unwrap();
    c.create(ROOT_INODE, "in", FileKind::Directory).unwrap();

    let o = staged(
        &c,
        StageDir::In,
        stage_kind::DIRECTORY,
        &[(src.to_str().unwrap(), "/in")],
    );
    assert_eq!(o.files_total, 151, "150 files and a symlink");
    assert_eq!(o.files_done, 151);
    for (rel, data) in &files {
        assert!(instance_file(&c, &format!("/in/{rel}")).1 == *data, "{rel}");
    }
    assert_eq!(instance_file(&c, "/in/a/f1").0.mode & 0o777, 0o755);
    assert_eq!(instance_file(&c, "/in/link").0.kind, FileKind::Symlink);
    assert_eq!(instance_file(&c, "/in/empty").0.kind, FileKind::Directory);

    let (o, back) = tree_out(&c);
    assert_eq!(o.files_done, 151);
    for (rel, data) in &files {
        assert!(std::fs::read(back.join(rel)).unwrap() == *data, "{rel}");
    }
    assert_eq!(
        std::fs::read_link(back.join("link")).unwrap(),
        Path::new("a/f1")
    );
    assert!(back.join("empty").is_dir());
    let m = std::fs::metadata(back.join("a/f1")).unwrap();
    assert_eq!(m.mode() & 0o777, 0o755);
}

/// A tree staged to a directory that does not exist yet makes it (its parent must
/// exist), with the source directory's mode, as `cp -a src dst` does: job scripts
/// stage into `$DW_JOB_STRIPED/in` of an empty instance.
#[test]
fn a_tree_staged_to_a_missing_directory_makes_it() {
    let c = Cluster::start(2, 1 << 30, 64 << 10);
    let pfs = &c.pfs;
    let src = pfs.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("sub/f"), pattern(70_000, 3)).unwrap();
    std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o750)).unwrap();
    staged(
        &c,
        StageDir::In,
        stage_kind::DIRECTORY,
        &[(src.to_str().unwrap(), "/new")],
    );
    assert_eq!(instance_file(&c, "/new").0.mode & 0o7777, 0o750);
    assert!(instance_file(&c, "/new/sub/f").1 == pattern(70_000, 3));

    let back = pfs.path().join("back");
    staged(
        &c,
        StageDir::Out,
        stage_kind::DIRECTORY,
        &[("/new", back.to_str().unwrap())],
    );
    assert_eq!(std::fs::metadata(&back).unwrap().mode() & 0o7777, 0o750);
    assert!(std::fs::read(back.join("sub/f")).unwrap() == pattern(70_000, 3));

    // Only the last component is made.
    for (dir, from, to) in [
        (
            StageDir::In,
            src.to_str().unwrap().to_string(),
            "/no/such".to_string(),
        ),
        (
            StageDir::Out,
            "/new".to_string(),
            pfs.path().join("no/such").display().to_string(),
        ),
    ] {
        let o = stage(&c, dir, stage_kind::DIRECTORY, &[(&from, &to)], 0);
        assert_ne!(o.state, stage_state::COMPLETE, "{from} -> {to}");
        assert!(
            o.error.contains("No such file"),
            "{from} -> {to}: {}",
            o.error
        );
    }
}

#[test]
fn a_list_goes_in_and_failures_name_their_files() {
    let c = Cluster::start(2, 1 << 30, 64 << 10);
    let pfs = &c.pfs;
    std::fs::write(pfs.path().join("one"), b"1").unwrap();
    std::fs::write(pfs.path().join("two"), b"22").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"s").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), pfs.path().join("escape")).unwrap();
    let p = |n: &str| pfs.path().join(n).display().to_string();
    let o = stage(
        &c,
        StageDir::In,
        stage_kind::LIST,
        &[
            (&p("one"), "/one"),
            (&p("two"), "/two"),
            (&p("missing"), "/missing"),
            (&p("escape"), "/escape"),
            (
                &outside.path().join("secret").display().to_string(),
                "/secret",
            ),
        ],
        0,
    );
    assert_eq!(o.state, stage_state::FAILED);
    assert_eq!(o.files_total, 5);
    assert_eq!(o.files_done, 2);
    let mut failed = o.failed();
    failed.sort();
    assert_eq!(
        failed,
        [
            ("/escape", libc::EACCES),
            ("/missing", libc::ENOENT),
            ("/secret", libc::EACCES)
        ]
    );
    assert!(
        o.error.contains("missing") || o.error.contains("escape") || o.error.contains("secret")
    );
    assert_eq!(instance_file(&c, "/two").1, b"22");
}

/// A source that is not a regular file fails by itself, with its own errno and a
/// message naming it, on the batched path (a list of small files) and on the long one
/// (a file stage).
#[test]
fn a_source_that_is_not_a_regular_file_fails_naming_it() {
    let c = Cluster::start(2, 1 << 30, 64 << 10);
    let pfs = &c.pfs;
    std::fs::write(pfs.path().join("plain"), b"plain").unwrap();
    std::fs::create_dir(pfs.path().join("adir")).unwrap();
    let fifo = std::ffi::CString::new(pfs.path().join("afifo").display().to_string()).unwrap();
    // SAFETY: a valid path string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let p = |n: &str| pfs.path().join(n).display().to_string();
    let o = stage(
        &c,
        StageDir::In,
        stage_kind::LIST,
        &[
            (&p("plain"), "/plain"),
            (&p("adir"), "/adir"),
            (&p("afifo"), "/afifo"),
        ],
        0,
    );
    assert_eq!(o.state, stage_state::FAILED);
    assert_eq!(o.files_done, 1);
    let mut failed = o.failed();
    failed.sort();
    assert_eq!(failed, [("/adir", libc::EISDIR), ("/afifo", libc::EINVAL)]);
    let messages: Vec<_> = o.events.iter().map(|e| e.message.as_str()).collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("adir") && m.contains("not a regular file")),
        "{messages:?}"
    );
    assert_eq!(instance_file(&c, "/plain").1, b"plain");

    let o = stage(
        &c,
        StageDir::In,
        stage_kind::FILE,
        &[(&p("adir"), "/adir-file")],
        0,
    );
    assert_eq!(o.state, stage_state::FAILED);
    assert_eq!(o.failed(), [("/adir-file", libc::EISDIR)]);

    // Out onto a FIFO (nobody reading it) and onto a directory: each fails, none hangs.
    let o = stage(
        &c,
        StageDir::Out,
        stage_kind::LIST,
        &[("/plain", &p("afifo")), ("/plain", &p("adir"))],
        0,
    );
    assert_eq!(o.state, stage_state::FAILED);
    assert_eq!(o.files_done, 0);
    assert_eq!(o.failed().len(), 2, "{:?}", o.failed());
}

#[test]
fn the_owner_cannot_stage_what_it_may_not_read_or_write() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let c = Cluster::start(2, 1 << 30, 64 << 10);
    let pfs = &c.pfs;
    std::fs::set_permissions(pfs.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let private = pfs.path().join("private");
    std::fs::write(&private, b"root only").unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    let open = pfs.path().join("open");
    std::fs::write(&open, b"anyone").unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    // nobody (65534) may read `open` but not `private`; the instance root belongs to
    // uid 1000 (mode 0755), so nobody may not create in it either.
    let o = stage(
        &c,
        StageDir::In,
        stage_kind::LIST,
        &[
            (private.to_str().unwrap(), "/private"),
            (open.to_str().unwrap(), "/open"),
        ],
        65534,
    );
    assert_eq!(o.state, stage_state::FAILED);
    let mut failed = o.failed();
    failed.sort();
    assert_eq!(
        failed,
        [("/open", libc::EACCES), ("/private", libc::EACCES)]
    );
    // As uid 1000 (the instance root's owner), `open` goes in; out into the PFS
    // root's directory (root's, 0755) is refused.
    let o = stage(
        &c,
        StageDir::In,
        stage_kind::FILE,
        &[(open.to_str().unwrap(), "/open")],
        1000,
    );
    if o.state != stage_state::COMPLETE {
        // uid 1000 may not exist on this machine: then the stage says so.
        assert!(o.error.contains("not a user"), "{}", o.error);
        return;
    }
    assert_eq!(instance_file(&c, "/open").0.uid, 1000);
    let o = stage(
        &c,
        StageDir::Out,
        stage_kind::FILE,
        &[("/open", &pfs.path().join("copy").display().to_string())],
        1000,
    );
    assert_eq!(o.failed(), [("/open", libc::EACCES)]);
}

#[test]
fn clients_cannot_ask_for_stage_copies() {
    let c = Cluster::start(2, 1 << 30, 64 << 10);
    let a = c.create(ROOT_INODE, "f", FileKind::Regular).unwrap();
    let e = c
        .at(0)
        .call(&spillway_wire::StageStripesReq {
            ino: a.ino,
            stripe_size: 65536,
            stripe_width: 2,
            size: 5,
            from: 0,
            to: 5,
            direction: StageDir::In,
            pfs_path: "/etc/shadow".into(),
            pfs_ino: 0,
            ticket: common::ticket(1, 0, StageDir::In, &["/etc"], &["/"]),
        })
        .unwrap_err();
    assert_eq!(e.0, libc::EPERM);
    let e = c
        .at(0)
        .call(&spillway_wire::StageFilesReq {
            direction: StageDir::In,
            ticket: common::ticket(1, 0, StageDir::In, &["/etc"], &["/"]),
            files: vec![spillway_wire::StageFileSpec {
                parent: ROOT_INODE,
                name: b"shadow".to_vec(),
                gid: 0,
                stripe_size: 65536,
                stripe_width: 2,
                ino: spillway_types::InodeNo(0),
                pfs_path: "/etc/shadow".into(),
                shown: "/shadow".into(),
            }],
        })
        .unwrap_err();
    assert_eq!(e.0, libc::EPERM);
    let e = c
        .at(1)
        .call(&spillway_wire::StageSyncReq {
            direction: StageDir::Out,
            ticket: common::ticket(1, 0, StageDir::Out, &["/"], &["/"]),
        })
        .unwrap_err();
    assert_eq!(e.0, libc::EPERM);
}

/// Files of one stripe go to the server holding their entry in batches
/// (`StageFilesReq`): each lands with its first stripe on its inode's home, staging in
/// again replaces them in place (no stale bytes), someone who may not write them is
/// refused per file, and out they come with bytes, mode and mtime.
#[test]
fn small_files_are_staged_by_the_server_holding_them() {
    let c = Cluster::start(2, 1 << 30, 64 << 10);
    let pfs = &c.pfs;
    std::fs::set_permissions(pfs.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = pfs.path().join("small");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    let write_set = |seed: u8, sizes: &dyn Fn(usize) -> usize| {
        (0..120)
            .map(|i| {
                let rel = if i % 2 == 0 {
                    format!("f{i}")
                } else {
                    format!("sub/f{i}")
                };
                let data = pattern(sizes(i), seed.wrapping_add(i as u8));
                std::fs::write(src.join(&rel), &data).unwrap();
                std::fs::set_permissions(
                    src.join(&rel),
                    std::fs::Permissions::from_mode(0o600 + (i as u32 % 3) * 0o40),
                )
                .unwrap();
                (rel, data)
            })
            .collect::<Vec<_>>()
    };
    // Up to a whole stripe, and empty files.
    let files = write_set(1, &|i| (i * 547) % ((64 << 10) + 1));
    c.create(ROOT_INODE, "in", FileKind::Directory).unwrap();
    let stage_in = |uid| {
        stage(
            &c,
            StageDir::In,
            stage_kind::DIRECTORY,
            &[(src.to_str().unwrap(), "/in")],
            uid,
        )
    };
    let o = stage_in(0);
    assert_eq!(o.state, stage_state::COMPLETE, "{}", o.error);
    assert_eq!(o.files_done, 120);
    assert_eq!(
        o.bytes_done,
        files.iter().map(|(_, d)| d.len() as u64).sum::<u64>()
    );
    for (rel, data) in &files {
        let (a, got) = instance_file(&c, &format!("/in/{rel}"));
        assert!(got == *data, "{rel}");
        let mode = std::fs::metadata(src.join(rel)).unwrap().mode() & 0o7777;
        assert_eq!(a.mode & 0o7777, mode, "{rel}");
        if !data.is_empty() {
            assert!(
                !c.stripes_on(a.ino.home().0, a.ino).is_empty(),
                "{rel}: first stripe on the inode's home"
            );
        }
    }

    // Again, with other (mostly shorter) contents: replaced in place, nothing stale.
    let again = write_set(9, &|i| (i * 31) % 5000);
    let before = instance_file(&c, "/in/f2").0.ino;
    let o = stage_in(0);
    assert_eq!(o.state, stage_state::COMPLETE, "{}", o.error);
    assert_eq!(instance_file(&c, "/in/f2").0.ino, before, "the same inode");
    for (rel, data) in &again {
        assert!(instance_file(&c, &format!("/in/{rel}")).1 == *data, "{rel}");
    }

    // nobody may not replace root's files (the directories stay root's, 0755).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let o = stage_in(65534);
        assert_eq!(o.state, stage_state::FAILED);
        assert!(
            o.failed().iter().all(|(_, e)| *e == libc::EACCES) && !o.failed().is_empty(),
            "{:?}",
            o.failed()
        );
        for (rel, data) in &again {
            assert!(
                instance_file(&c, &format!("/in/{rel}")).1 == *data,
                "{rel} kept"
            );
        }
    }

    let (_, back) = tree_out(&c);
    for (rel, data) in &again {
        assert!(std::fs::read(back.join(rel)).unwrap() == *data, "{rel}");
        let (a, _) = instance_file(&c, &format!("/in/{rel}"));
        let m = std::fs::metadata(back.join(rel)).unwrap();
        assert_eq!(m.mode() & 0o7777, a.mode & 0o7777, "{rel}");
        assert_eq!(m.mtime(), a.mtime.sec, "{rel}");
    }
}

/// `StageFilesReq` itself, as a coordinator sends it: a server stages the files that
/// are its alone, answers ELSEWHERE (changing nothing) for the rest, and fails the ones
/// that fail, each on its own.
#[test]
fn a_server_stages_alone_only_what_is_its_own() {
    use spillway_wire::{stage_file_outcome as outcome, StageFileSpec, StageFilesReq};
    let c = Cluster::start(2, 1 << 30, 64 << 10);
    let pfs = &c.pfs;
    let small = pattern(40_000, 7);
    std::fs::write(pfs.path().join("small"), &small).unwrap();
    std::fs::write(pfs.path().join("big"), pattern(200_000, 8)).unwrap();
    let p = |n: &str| pfs.path().join(n).display().to_string();
    // Names whose entries live on server 0, and one on server 1.
    let names: Vec<String> = (0..)
        .map(|i| format!("n{i}"))
        .filter(|n| spillway_placement::dentry_server(ROOT_INODE, n.as_bytes(), 2).0 == 0)
        .take(3)
        .collect();
    let other = (0..)
        .map(|i| format!("m{i}"))
        .find(|n| spillway_placement::dentry_server(ROOT_INODE, n.as_bytes(), 2).0 == 1)
        .unwrap();
    let spec = |name: &str, src: String| StageFileSpec {
        parent: ROOT_INODE,
        name: name.as_bytes().to_vec(),
        gid: 100,
        stripe_size: 64 << 10,
        stripe_width: 2,
        ino: spillway_types::InodeNo(0),
        pfs_path: src,
        shown: format!("/{name}"),
    };
    let root = pfs.path().display().to_string();
    let tin = common::ticket(1, 0, StageDir::In, &[&root], &["/"]);
    let tout = common::ticket(2, 0, StageDir::Out, &[&root], &["/"]);
    let r = c
        .peer(0)
        .call(&StageFilesReq {
            direction: StageDir::In,
            ticket: tin,
            files: vec![
                spec(&names[0], p("small")),
                spec(&names[1], p("big")),
                spec(&names[2], p("missing")),
                spec(&other, p("small")),
            ],
        })
        .unwrap();
    let got: Vec<(u8, i32, u64)> = r
        .results
        .iter()
        .map(|x| (x.outcome, x.errno, x.bytes))
        .collect();
    assert_eq!(
        got,
        [
            (outcome::DONE, 0, small.len() as u64),
            (outcome::ELSEWHERE, 0, 0),
            (outcome::FAILED, libc::ENOENT, 0),
            (outcome::ELSEWHERE, 0, 0),
        ]
    );
    assert!(r.results[2].message.contains("missing"));
    let (a, data) = instance_file(&c, &format!("/{}", names[0]));
    assert!(data == small);
    assert_eq!((a.ino.home().0, a.gid), (0, 100));
    for n in [&names[1], &names[2], &other] {
        assert_eq!(
            c.lookup(ROOT_INODE, n).map(|_| ()),
            Err(spillway_types::Errno::ENOENT),
            "{n}: nothing made"
        );
    }

    // Out: the file homed here is written; one homed elsewhere is not this server's.
    let out = |ino| StageFileSpec {
        ino,
        pfs_path: p("out"),
        ..spec("", String::new())
    };
    let x = common::stage_one(&c.peer(1), StageDir::Out, tout.clone(), out(a.ino));
    assert_eq!(x.outcome, outcome::ELSEWHERE);
    assert!(!pfs.path().join("out").exists());
    common::stage_one_done(&c.peer(0), StageDir::Out, tout, out(a.ino));
    assert!(std::fs::read(pfs.path().join("out")).unwrap() == small);
}
