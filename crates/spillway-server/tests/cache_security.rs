//! What a client connection may ask of a cache fragment (docs/security.md section 8,
//! "Request fields a client sets" and "Handles never come from a client"). A client
//! connection holds the instance's capability, as a hostile user holding the instance
//! descriptor would: the peer-only cache requests (`CacheConfigReq`,
//! `CacheResolveReq`, `CacheDropReq`, `CacheInodeReq`, `CacheTimesReq`;
//! docs/wire-protocol.md, opcodes 110-115 and 120) answer it EPERM on every server, a `CacheFlushReq` of an undefined scope
//! EINVAL, and the fragment serves on afterwards with nothing resolved, dropped or
//! reconfigured: the file written before the attempts is still dirty, reads back and
//! reaches the PFS whole at a flush.

mod common;

use common::Cluster;
use spillway_types::{Attr, Errno, FileKind, InodeNo, Timespec, ROOT_INODE};
use spillway_wire::{
    flush_scope, times_set, CacheConfigReq, CacheDropReq, CacheFlushReq, CacheInodeReq,
    CacheResolveReq, CacheStatusReq, CacheTimesReq, CreateReq, LookupReq,
};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// The cache's namespace server: every name and inode of a cache instance is its.
const NS: u16 = 0;

/// Bytes that differ at every offset mod 251, so a misplaced stripe shows.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ seed.wrapping_mul(37))
        .collect()
}

/// The request the manager sends for a cache of `dir` owned by its owner, with the
/// default policies and a threshold far above what the test writes (so nothing is
/// written behind by size).
fn config(dir: &Path) -> CacheConfigReq {
    let m = std::fs::metadata(dir).expect("PFS directory");
    CacheConfigReq {
        pfs_dir: dir.display().to_string(),
        uid: m.uid(),
        gid: m.gid(),
        modified_threshold: 64 << 20,
        read_ahead: 16 << 20,
        sync_on_close: false,
        sync_to_pfs: false,
    }
}

/// A cache of `<pfs root>/job` holding `input`, on `n` servers with 64 KiB stripes.
fn cache_cluster(n: usize, input: &[u8]) -> (Cluster, std::path::PathBuf) {
    let c = Cluster::start(n, 1 << 30, 64 << 10);
    let dir = c.pfs.path().canonicalize().unwrap().join("job");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("input"), input).unwrap();
    let req = config(&dir);
    for i in 0..c.n() {
        c.peer(i).call(&req).expect("a peer configures the cache");
    }
    (c, dir)
}

fn lookup(c: &Cluster, name: &str) -> Attr {
    c.at(NS)
        .call(&LookupReq {
            parent: ROOT_INODE,
            name: name.as_bytes().to_vec(),
        })
        .expect("lookup")
        .attr
        .expect("the namespace server's own inode")
}

/// Still short of the write-behind's age (5 s for a file under its threshold, docs/
/// cache.md section 5), with a margin: bytes written at `t` must still be dirty.
fn young(t: Instant) -> bool {
    t.elapsed() < Duration::from_secs(4)
}

fn dirty_bytes(c: &Cluster) -> u64 {
    (0..c.n())
        .map(|i| c.at(i).call(&CacheStatusReq {}).unwrap().dirty_bytes)
        .sum()
}

#[test]
fn clients_get_eperm_for_peer_only_cache_requests() {
    let input = pattern(300 << 10, 1);
    let (c, dir) = cache_cluster(2, &input);
    let other = c.pfs.path().canonicalize().unwrap();

    // A client's ordinary work: it reads the PFS file through the cache and writes a
    // new one, whose bytes stay dirty on both servers (under the threshold, younger
    // than the write-behind age).
    let inp = lookup(&c, "input");
    assert_eq!(c.read(&inp, 0, input.len() as u64).unwrap(), input);
    let owner = config(&dir);
    let out = c
        .at(NS)
        .call(&CreateReq::new(
            ROOT_INODE,
            "out",
            FileKind::Regular,
            0o644,
            owner.uid,
            owner.gid,
        ))
        .expect("create through the cache")
        .attr;
    let data = pattern(200 << 10, 2);
    c.write(&out, 0, &data).unwrap();
    let written = Instant::now();
    let servers: Vec<u16> = (0..4).map(|k| c.server_of(&out, k)).collect();
    assert!(servers.contains(&0) && servers.contains(&1), "{servers:?}");
    let dirty = dirty_bytes(&c);
    assert!(
        dirty > 0 || !young(written),
        "the write is waiting for write-behind"
    );

    // The peer-only requests, from a client connection to every server. Among them a
    // CacheConfigReq naming another directory (the whole PFS root), a CacheResolveReq
    // asking for the PFS file handle of a file (open_by_handle_at opens anything on
    // that file system), a CacheDropReq of a file with unwritten bytes.
    let nowhere = InodeNo(u64::MAX >> 1);
    for i in 0..c.n() {
        let client = c.at(i);
        let mut elsewhere = config(&other);
        elsewhere.uid = 0;
        elsewhere.gid = 0;
        assert_eq!(
            client.call(&elsewhere).unwrap_err(),
            Errno::EPERM,
            "config, server {i}"
        );
        assert_eq!(
            client.call(&config(&dir)).unwrap_err(),
            Errno::EPERM,
            "same config, {i}"
        );
        for ino in [inp.ino, out.ino, ROOT_INODE, nowhere] {
            let what = format!("server {i}, inode {ino:?}");
            let resolve = client.call(&CacheResolveReq { ino });
            assert_eq!(resolve.unwrap_err(), Errno::EPERM, "resolve, {what}");
            let drop = client.call(&CacheDropReq { ino });
            assert_eq!(drop.unwrap_err(), Errno::EPERM, "drop, {what}");
            let inode = client.call(&CacheInodeReq { ino });
            assert_eq!(inode.unwrap_err(), Errno::EPERM, "inode, {what}");
            // Times a server would leave on the PFS file after its write-behind.
            let times = client.call(&CacheTimesReq {
                ino,
                set: times_set::MTIME | times_set::VOID,
                atime: Timespec::default(),
                mtime: Timespec { sec: 1, nsec: 0 },
                set_at: Timespec::default(),
            });
            assert_eq!(times.unwrap_err(), Errno::EPERM, "times, {what}");
        }
        // CacheFlushReq is a client's request (dw_wait_sync_complete, sync_on_close),
        // but only with a defined scope.
        for scope in [4, 5, 0x7f, 0xff] {
            let r = client.call(&CacheFlushReq {
                ino: out.ino,
                scope,
            });
            assert_eq!(r.unwrap_err(), Errno::EINVAL, "scope {scope}, server {i}");
        }
    }
    // A flush of an inode the namespace server does not know.
    let r = c.at(NS).call(&CacheFlushReq {
        ino: nowhere,
        scope: flush_scope::FILE,
    });
    assert_eq!(r.unwrap_err(), Errno::ESTALE);

    // Nothing was reconfigured, dropped or written: the same configuration is still a
    // no-op for a peer (another one would be EEXIST), the bytes are still dirty (unless
    // the age of write-behind passed on a slow machine) and read back from the cache.
    for i in 0..c.n() {
        c.peer(i)
            .call(&config(&dir))
            .expect("still a cache of job/");
        assert_eq!(
            c.peer(i).call(&config(&other)).unwrap_err(),
            Errno::EEXIST,
            "server {i} is a cache of job/, nothing else"
        );
    }
    let dirty = dirty_bytes(&c);
    if young(written) {
        assert!(dirty > 0, "a client's CacheDropReq dropped nothing");
        assert_eq!(std::fs::metadata(dir.join("out")).unwrap().len(), 0);
    }
    assert_eq!(c.read(&out, 0, data.len() as u64).unwrap(), data);
    assert_eq!(c.read(&inp, 0, input.len() as u64).unwrap(), input);

    // The same requests from a peer are answered: the refusals were the role's.
    let resolved = c.peer(NS).call(&CacheResolveReq { ino: out.ino }).unwrap();
    assert_eq!((resolved.uid, resolved.gid), (owner.uid, owner.gid));
    let held = (0..c.n())
        .map(|i| c.peer(i).call(&CacheInodeReq { ino: out.ino }).unwrap())
        .collect::<Vec<_>>();
    let young = young(written);
    assert!(
        held.iter().all(|h| h.cached && (h.dirty || !young)),
        "{held:?}"
    );

    // And the fragment still writes behind: a client's flush of the file brings every
    // server's bytes to the PFS.
    c.at(NS)
        .call(&CacheFlushReq {
            ino: out.ino,
            scope: flush_scope::FILE,
        })
        .expect("flush");
    assert_eq!(std::fs::read(dir.join("out")).unwrap(), data);
    assert_eq!(dirty_bytes(&c), 0);
    assert_eq!(std::fs::read(dir.join("input")).unwrap(), input);
}

/// A scratch fragment is never turned into a cache by a client: its CacheConfigReq
/// answers EPERM and the fragment stays scratch (its other cache requests answer
/// EOPNOTSUPP, as they do for a peer).
#[test]
fn a_client_cannot_make_a_scratch_fragment_a_cache() {
    let c = Cluster::start(2, 1 << 30, 64 << 10);
    let a = c.create(ROOT_INODE, "f", FileKind::Regular).unwrap();
    c.write(&a, 0, b"scratch").unwrap();
    let pfs = c.pfs.path().canonicalize().unwrap();
    for i in 0..c.n() {
        assert_eq!(
            c.at(i).call(&config(&pfs)).unwrap_err(),
            Errno::EPERM,
            "server {i}"
        );
        let flush = c.at(i).call(&CacheFlushReq {
            ino: a.ino,
            scope: flush_scope::FILE,
        });
        assert_eq!(flush.unwrap_err(), Errno::EOPNOTSUPP, "server {i}");
    }
    assert_eq!(c.read(&a, 0, 7).unwrap(), b"scratch");
    assert!(
        std::fs::read_dir(&pfs).unwrap().next().is_none(),
        "nothing on the PFS"
    );
}
