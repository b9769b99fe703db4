//! Round-trip latencies of single requests through the real stack (TCP on loopback,
//! worker pool, SQLite). Not a timed test: run by hand with
//! `cargo test --release -p spillway-server --test latency -- --ignored --nocapture`.

mod common;

use common::*;
use spillway_types::FileKind;
use spillway_wire::{ExtendSizeReq, GetAttrReq, StatFsReq, SyncDataReq, WriteReq};
use std::time::Instant;

#[test]
#[ignore]
fn print_request_latencies() {
    let c = Cluster::start(1, 1 << 30, 8 << 20);
    let n: u32 = 5000;
    let t = Instant::now();
    for _ in 0..n {
        c.at(0).call(&GetAttrReq { ino: root() }).unwrap();
    }
    println!(
        "GetAttr: {:.1} us",
        t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    );
    let t = Instant::now();
    for i in 0..n {
        c.create(root(), &format!("f{i}"), FileKind::Regular)
            .unwrap();
    }
    println!(
        "Create:  {:.1} us",
        t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    );
    let f = c.create(root(), "data", FileKind::Regular).unwrap();
    let buf = vec![7u8; 4096];
    let t = Instant::now();
    for i in 0..n {
        c.write(&f, u64::from(i % 256) * 4096, &buf).unwrap();
    }
    println!(
        "Write4K+ExtendSize: {:.1} us",
        t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    );
    let t = Instant::now();
    for i in 0..n {
        let req = WriteReq {
            ino: f.ino,
            stripe: 0,
            offset: (i % 256) * 4096,
            sync: false,
        };
        c.at(0).call_bulk(&req, &buf).unwrap();
    }
    println!(
        "Write4K alone: {:.1} us",
        t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    );
    let t = Instant::now();
    for _ in 0..n {
        c.at(0).call(&StatFsReq {}).unwrap();
    }
    let t = Instant::now();
    for i in 0..n {
        c.at(0)
            .call(&ExtendSizeReq {
                ino: f.ino,
                size: u64::from(i),
                touch: true,
                sync: false,
            })
            .unwrap();
    }
    println!(
        "ExtendSize(touch): {:.1} us",
        t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    );
    println!(
        "StatFs (inline, COUNT over inodes): {:.1} us",
        t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    );
    let t = Instant::now();
    for _ in 0..n {
        c.at(0).call(&SyncDataReq { ino: f.ino }).unwrap();
    }
    println!(
        "SyncData (pool, nothing dirty): {:.1} us",
        t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    );
}
