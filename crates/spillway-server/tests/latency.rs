//! Round-trip latencies of single requests through the real stack (TCP on loopback,
//! inline execution or the worker pool, SQLite). Not a timed test: run by hand with
//! `cargo test --release -p spillway-server --test latency -- --ignored --nocapture`.

mod common;

use common::*;
use spillway_types::FileKind;
use spillway_wire::{Call, ExtendSizeReq, GetAttrReq, StatFsReq, SyncDataReq, WriteReq};
use std::time::Instant;

const N: u32 = 5000;

fn time<C: Call>(label: &str, c: &Cluster, mut req: impl FnMut(u32) -> C) {
    let t = Instant::now();
    for i in 0..N {
        c.at(0).call(&req(i)).unwrap();
    }
    println!(
        "{label}: {:.1} us",
        t.elapsed().as_secs_f64() * 1e6 / f64::from(N)
    );
}

#[test]
#[ignore]
fn print_request_latencies() {
    let c = Cluster::start(1, 1 << 30, 8 << 20);
    time("GetAttr", &c, |_| GetAttrReq { ino: root() });
    let t = Instant::now();
    for i in 0..N {
        c.create(root(), &format!("f{i}"), FileKind::Regular)
            .unwrap();
    }
    println!(
        "Create: {:.1} us",
        t.elapsed().as_secs_f64() * 1e6 / f64::from(N)
    );
    let f = c.create(root(), "data", FileKind::Regular).unwrap();
    let buf = vec![7u8; 4096];
    let t = Instant::now();
    for i in 0..N {
        let req = WriteReq {
            ino: f.ino,
            stripe: 0,
            offset: (i % 256) * 4096,
            sync: false,
            grant_epoch: 0,
            charged: 0,
        };
        c.at(0).call_bulk(&req, &buf).unwrap();
    }
    println!(
        "Write 4 KiB: {:.1} us",
        t.elapsed().as_secs_f64() * 1e6 / f64::from(N)
    );
    time("ExtendSize(touch)", &c, |i| ExtendSizeReq {
        ino: f.ino,
        size: u64::from(i),
        touch: true,
        sync: false,
    });
    time("StatFs", &c, |_| StatFsReq {});
    time("SyncData (nothing dirty)", &c, |_| SyncDataReq {
        ino: f.ino,
    });
}
