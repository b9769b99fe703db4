//! Open files stay bounded by the fd cache however many stripe files are written (the
//! fd limit here is 20,000 and cannot be raised). Alone in its test binary so that no
//! other test's sockets move the count.

mod common;

use common::*;
use spillway_types::FileKind;
use spillway_wire::SyncDataReq;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

#[test]
fn writing_5000_files_keeps_fds_bounded() {
    let c = Cluster::start(1, 1 << 32, 64 << 10);
    let cache = tunables().fd_cache_size;
    let workers = tunables().server_workers;
    let first = c.create(root(), "warmup", FileKind::Regular).unwrap();
    c.write(&first, 0, b"x").unwrap();
    let baseline = open_fds();
    let mut peak = baseline;
    for i in 0..5000 {
        let f = c
            .create(root(), &format!("file{i}"), FileKind::Regular)
            .unwrap();
        c.at(0)
            .call_bulk(&write_req(f.ino, 0, 0), &[i as u8; 4096])
            .unwrap();
        if i % 3 == 0 {
            c.at(0).call(&SyncDataReq { ino: f.ino }).unwrap();
        }
        if i % 100 == 0 {
            peak = peak.max(open_fds());
        }
    }
    peak = peak.max(open_fds());
    eprintln!("fds: baseline {baseline}, peak {peak}");
    // The cache may fill up to its size, plus a file per request in flight.
    assert!(
        peak <= baseline + cache + workers + 8,
        "fds grew from {baseline} to {peak} (cache {cache})"
    );
    assert!(peak < baseline + 1000, "nowhere near one fd per file");
    // Evicted files still read back.
    let f = c.lookup(root(), "file17").unwrap().attr.unwrap();
    let back = c
        .at(0)
        .call(&spillway_wire::ReadReq {
            ino: f.ino,
            stripe: 0,
            offset: 0,
            len: 4096,
        })
        .unwrap();
    assert_eq!(back, vec![17u8; 4096]);
}
