//! Change notices between mounts (docs/wire-protocol.md, "Notices"): the home of a
//! file tells the other mounts holding it open of a mount's change, and the writer's
//! wait for their answers is bounded, also against mounts that never answer or that
//! answer for others. Real servers, real TCP; mounts are client connections naming a
//! mount in their hello.

mod common;

use common::*;
use spillway_types::{Errno, FileKind, InodeNo};
use spillway_wire::{
    ChangedNotice, Endpoint, ExtendSizeReply, ExtendSizeReq, NoticeDoneReq, NoticeWaitReq, OpenReq,
    ReleaseReq, Watch, WatchReq, Wire, NOTICE_CHANGED,
};
use std::time::{Duration, Instant};

const SS: u32 = 64 << 10;
const WAIT: Duration = Duration::from_millis(1500);

struct Mount {
    home: Endpoint,
    watch: Option<Watch>,
}

fn mount(c: &Cluster, home: u16, id: u64, watch: bool) -> Mount {
    let addr = c.nodes[usize::from(home)].addr;
    let ep = endpoint(addr, client_hello().for_mount(id));
    let watch = watch.then(|| Watch::open(&ep).expect("watch"));
    Mount { home: ep, watch }
}

fn cluster() -> Cluster {
    Cluster::start_tuned(
        2,
        1 << 30,
        SS,
        spillway_types::Tunables {
            notice_wait: WAIT,
            ..tunables()
        },
    )
}

fn write_told(m: &Mount, ino: InodeNo, size: u64) -> ExtendSizeReply {
    m.home
        .call(&ExtendSizeReq {
            ino,
            size,
            touch: true,
            sync: false,
        })
        .expect("extend size")
}

fn wait_told(m: &Mount, ino: InodeNo, r: &ExtendSizeReply) -> Duration {
    let t = Instant::now();
    m.home
        .call(&NoticeWaitReq {
            ino,
            first: r.notice_first,
            count: r.notices,
        })
        .expect("notice wait");
    t.elapsed()
}

fn file(c: &Cluster, name: &str) -> (InodeNo, u16) {
    let a = c.create(root(), name, FileKind::Regular).expect("create");
    (a.ino, a.ino.home().0)
}

#[test]
fn a_write_is_told_to_the_other_mounts_holding_the_file_open_and_waits_for_them() {
    let c = cluster();
    let (ino, home) = file(&c, "f");
    let writer = mount(&c, home, 11, true);
    let mut reader = mount(&c, home, 22, true);
    let bystander = mount(&c, home, 33, true);
    for m in [&writer, &reader] {
        m.home.call(&OpenReq { ino, flags: 2 }).expect("open");
    }
    // The writer's own change is not told to itself, and a mount without the file
    // open (the bystander) hears nothing.
    let r = write_told(&writer, ino, 4096);
    assert_eq!(r.notices, 1, "one other mount holds the file open");
    let n = reader
        .watch
        .as_mut()
        .unwrap()
        .next_notice()
        .expect("a notice");
    assert_eq!(n.opcode, NOTICE_CHANGED);
    let told = ChangedNotice::from_bytes(&n.body).expect("decodes");
    assert_eq!((told.attr.ino, told.attr.size), (ino, 4096));
    // The writer's wait ends when the reader answers, not at the timeout.
    let w = std::thread::scope(|s| {
        let waiting = s.spawn(|| wait_told(&writer, ino, &r));
        std::thread::sleep(Duration::from_millis(200));
        reader.watch.as_ref().unwrap().done(n.id).expect("answer");
        waiting.join().expect("waiter")
    });
    assert!(w >= Duration::from_millis(150) && w < WAIT, "waited {w:?}");
    // Once the reader closes, nobody is told.
    reader.home.call(&ReleaseReq { ino }).expect("release");
    assert_eq!(write_told(&writer, ino, 8192).notices, 0);
    drop(bystander);
}

#[test]
fn a_mount_that_never_answers_costs_a_writer_one_wait_then_is_not_waited_for() {
    let c = cluster();
    let (ino, home) = file(&c, "f");
    let writer = mount(&c, home, 1, true);
    let mut silent = mount(&c, home, 2, true);
    for m in [&writer, &silent] {
        m.home.call(&OpenReq { ino, flags: 2 }).expect("open");
    }
    let r = write_told(&writer, ino, 1);
    assert_eq!(r.notices, 1);
    let w = wait_told(&writer, ino, &r);
    assert!(w >= WAIT - Duration::from_millis(50), "waited {w:?}");
    assert!(w < WAIT * 2, "waited {w:?}");
    // Lagging: still told, no longer waited for.
    let r = write_told(&writer, ino, 2);
    assert_eq!(r.notices, 0, "a lagging mount is not waited for");
    // An answer in time makes it waited for again.
    let watch = silent.watch.as_mut().unwrap();
    let mut last = None;
    for _ in 0..2 {
        last = Some(watch.next_notice().expect("notice"));
    }
    let n = last.unwrap();
    let attr = ChangedNotice::from_bytes(&n.body).unwrap().attr;
    assert_eq!(attr.size, 2);
    watch.done(n.id).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(write_told(&writer, ino, 3).notices, 1);
}

#[test]
fn a_mount_cannot_answer_for_another_nor_make_a_writer_wait_longer() {
    let c = cluster();
    let (ino, home) = file(&c, "f");
    let writer = mount(&c, home, 5, true);
    let victim = mount(&c, home, 6, true);
    let attacker = mount(&c, home, 7, true);
    for m in [&writer, &victim] {
        m.home.call(&OpenReq { ino, flags: 2 }).expect("open");
    }
    let r = write_told(&writer, ino, 100);
    assert_eq!(r.notices, 1);
    // The attacker answers every id near the victim's: the writer still waits (the
    // victim's kernel might hold stale pages).
    for id in r.notice_first.saturating_sub(4)..r.notice_first + 4 {
        attacker.home.call(&NoticeDoneReq { id }).expect("answer");
    }
    // Nor can the attacker wait in the writer's place (which would mark the victim
    // lagging), nor hold a worker with a wait for every id there is.
    let t = Instant::now();
    attacker
        .home
        .call(&NoticeWaitReq {
            ino,
            first: 0,
            count: u32::MAX,
        })
        .expect("wait");
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    let w = wait_told(&writer, ino, &r);
    assert!(
        w >= WAIT - Duration::from_millis(500),
        "the attacker's answer counted: {w:?}"
    );
}

#[test]
fn only_a_client_session_naming_a_mount_can_watch() {
    let c = cluster();
    let (_, home) = file(&c, "f");
    // No mount in the hello: refused.
    let none = mount(&c, home, 0, false);
    assert_eq!(none.home.call(&WatchReq {}).unwrap_err(), Errno::EINVAL);
    // A peer (a server) has no mount either, whatever its hello says.
    let addr = c.nodes[usize::from(home)].addr;
    let peer = endpoint(
        addr,
        hello(spillway_wire::Role::Peer, INSTANCE, SECRET).for_mount(9),
    );
    assert_eq!(peer.call(&WatchReq {}).unwrap_err(), Errno::EINVAL);
}

#[test]
fn a_newer_watch_of_a_mount_replaces_the_older_which_is_closed() {
    let c = cluster();
    let (ino, home) = file(&c, "f");
    let writer = mount(&c, home, 40, true);
    let mut old = mount(&c, home, 41, true);
    let mut new = mount(&c, home, 41, true);
    new.home.call(&OpenReq { ino, flags: 0 }).expect("open");
    let r = write_told(&writer, ino, 10);
    assert_eq!(r.notices, 1);
    assert!(
        old.watch.as_mut().unwrap().next_notice().is_err(),
        "the old watch is closed"
    );
    let n = new
        .watch
        .as_mut()
        .unwrap()
        .next_notice()
        .expect("the new watch hears");
    new.watch.as_ref().unwrap().done(n.id).unwrap();
    assert!(wait_told(&writer, ino, &r) < WAIT);
}
