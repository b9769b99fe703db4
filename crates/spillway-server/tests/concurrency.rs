//! Many callers sharing one connection: every reply must reach its own caller, whether
//! that caller reads the socket itself or another caller hands the reply over (a reply
//! can even arrive before its caller starts waiting).

mod common;

use common::*;
use spillway_types::FileKind;
use spillway_wire::{GetAttrReq, PendingCall, StatFsReq, TouchDirReq};

#[test]
fn concurrent_calls_on_one_connection_all_get_their_replies() {
    let c = Cluster::start(2, 1 << 30, 1 << 20);
    let files: Vec<_> = (0..16)
        .map(|i| {
            c.create(root(), &format!("f{i}"), FileKind::Regular)
                .unwrap()
        })
        .collect();
    std::thread::scope(|s| {
        for t in 0..8 {
            let (c, files) = (&c, &files);
            s.spawn(move || {
                for i in 0..1500 {
                    let f = &files[(t * 7 + i) % files.len()];
                    let a = c.home(f.ino).call(&GetAttrReq { ino: f.ino }).unwrap();
                    assert_eq!(a.attr.ino, f.ino, "a reply went to the wrong caller");
                    // Not idempotent, so never resent: a lost reply fails the call.
                    c.home(root())
                        .call(&TouchDirReq {
                            ino: root(),
                            nlink_delta: 0,
                        })
                        .unwrap();
                    if i % 50 == 0 {
                        // Fan out: several calls in flight from this thread at once.
                        let calls: Vec<_> =
                            (0..2).map(|k| c.at(k).start(&StatFsReq {}, &[])).collect();
                        for r in calls.into_iter().map(PendingCall::wait) {
                            r.unwrap();
                        }
                    }
                }
            });
        }
    });
}
