//! The send queue of a connection (a part of `conn`): request frames handed to a thread of the connection
//! that writes them in order, so that the caller goes on while the bytes cross the
//! socket. Write-behind uses it (`OwnedCall::queue`): a client's FUSE thread copies a
//! write into its buffer, queues it and answers the kernel at once, and the
//! application's next write overlaps this one's trip through TCP (perf of one
//! streaming writer: the socket send, with the loopback receive the kernel runs inside
//! it, was the longest step of every write(2)). Calls waited for at once (a flush's or an fsync's last write
//! included: `OwnedCall::start`) keep sending on their own thread (`Conn::send_raw`),
//! which costs no thread hand-off: measured, queueing those cost SQLite's
//! write + fsync commits a wake-up each.
//!
//! A write through the arena (a server on this host) is queued too, though its frame
//! is a few bytes: the socket send still runs the server's side of loopback TCP inside
//! it, and off the FUSE thread a 4 KiB random writer ran about a fifth faster.
//! What is queued while the thread writes leaves together, in one `writev`.
//!
//! The thread starts with the first queued frame and ends with the connection: it
//! holds the connection weakly and stops when its queue closes (`Conn::fail`) or the
//! connection is gone.

use super::{CallError, Conn};
use crate::arena::Payload;
use crate::frame::HEADER_LEN;
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::sync::{Arc, Weak};

/// One frame to write: its header, fields and bulk data, and the call it belongs to.
pub(crate) struct Queued {
    pub(crate) id: u64,
    pub(crate) head: [u8; HEADER_LEN],
    pub(crate) body: Vec<u8>,
    pub(crate) bulk: Arc<Payload>,
}

/// Start the sending thread of `conn`; the sender end of its queue.
pub(crate) fn start(conn: &Arc<Conn>) -> std::io::Result<Sender<Queued>> {
    let (tx, rx) = unbounded();
    let weak = Arc::downgrade(conn);
    std::thread::Builder::new()
        .name("wire-send".into())
        .spawn(move || run(weak, rx))?;
    Ok(tx)
}

/// Most frames one `writev` carries (each is up to three parts; IOV_MAX is 1024).
const BATCH: usize = 64;

fn run(conn: Weak<Conn>, rx: Receiver<Queued>) {
    let mut batch: Vec<Queued> = Vec::with_capacity(BATCH);
    while let Ok(job) = rx.recv() {
        let Some(conn) = conn.upgrade() else {
            return;
        };
        // What queued up meanwhile leaves with it in one write: a writer that outpaces
        // the socket costs one system call (and one wake-up of the server) per batch,
        // not per frame.
        batch.push(job);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        // A call failed meanwhile (the connection broke) is no longer pending: its
        // caller already has its error and sends again on a new connection.
        batch.retain(|j| conn.is_pending(j.id));
        send_batch(&conn, &batch);
        // The callers take their buffers back once answered; hold them no longer
        // than the write.
        batch.clear();
    }
}

/// Write the frames of `batch` in order with as few system calls as they take; a
/// failure fails each call by how much of it left (none: NotSent; part: Lost).
fn send_batch(conn: &Conn, batch: &[Queued]) {
    let mut parts: Vec<&[u8]> = Vec::with_capacity(batch.len() * 3);
    for j in batch {
        parts.extend_from_slice(&[&j.head[..], &j.body[..], &j.bulk[..]]);
    }
    let Err(sent) = conn.write_parts(&parts) else {
        return;
    };
    let mut start = 0usize;
    for j in batch {
        let len = j.head.len() + j.body.len() + j.bulk.len();
        let end = start + len;
        if end > sent {
            conn.fail_call(
                j.id,
                if sent <= start {
                    CallError::NotSent
                } else {
                    CallError::Lost
                },
            );
        }
        start = end;
    }
}

#[cfg(test)]
mod tests {
    use crate::conn::{Endpoint, OwnedCall};
    use crate::testkit::{write_req as req, Sink};

    use std::net::SocketAddr;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Duration;

    fn endpoint(addr: SocketAddr) -> Arc<Endpoint> {
        let hello = crate::testkit::hello();
        Arc::new(Endpoint::new(
            addr.to_string(),
            hello,
            Duration::from_secs(10),
            Duration::from_secs(5),
        ))
    }

    /// Queued frames leave in the order they were queued, whole, each answered; the
    /// bulk buffers come back to their callers.
    #[test]
    fn queued_writes_arrive_in_order_and_their_buffers_come_back() {
        let (mut server, addr, sink) = Sink::serve(Duration::ZERO, true, 2);
        let ep = endpoint(addr);
        let calls: Vec<_> = (0..64u32)
            .map(|i| {
                let bulk = vec![(i % 200) as u8; 256 << 10];
                OwnedCall::queue(&ep, &req(i), bulk)
            })
            .collect();
        let mut returned = 0;
        for (i, c) in calls.into_iter().enumerate() {
            let (r, buf) = c.wait();
            assert_eq!(r.unwrap().written, 256 << 10, "call {i}");
            returned += usize::from(buf.len() == 256 << 10);
        }
        let seen = sink.writes();
        let want: Vec<(u32, u64)> = (0..64u32)
            .map(|i| (i, u64::from(i % 200) * (256 << 10)))
            .collect();
        assert_eq!(seen, want, "order and content as queued");
        assert!(returned > 32, "only {returned} of 64 buffers came back");
        server.stop();
    }

    /// A connection that breaks under queued writes (one being written, others still
    /// in the queue) fails them over to a new one: every write is answered (writes
    /// are idempotent, so they are sent again).
    #[test]
    fn queued_writes_are_sent_again_after_the_connection_breaks() {
        // A slow server, and more bytes than the socket buffers hold: the sending
        // thread is blocked in a write with frames queued behind it when it breaks.
        let (mut server, addr, sink) = Sink::serve(Duration::from_millis(10), true, 2);
        let ep = endpoint(addr);
        let first = ep.conn().unwrap();
        let calls: Vec<_> = (0..16u32)
            .map(|i| OwnedCall::queue(&ep, &req(i), vec![(i + 1) as u8; 4 << 20]))
            .collect();
        std::thread::sleep(Duration::from_millis(30));
        first.close();
        for (i, c) in calls.into_iter().enumerate() {
            let (r, _) = c.wait();
            assert_eq!(r.unwrap().written, 4 << 20, "call {i}");
        }
        let seen = sink.writes();
        for i in 0..16u32 {
            let want = u64::from(i + 1) * (4 << 20);
            assert!(
                seen.iter().any(|(o, sum)| *o == i && *sum == want),
                "write {i} never arrived whole"
            );
        }
        assert!(
            sink.calls.load(Ordering::SeqCst) < 16 * 2 + 2,
            "sent again only what the break cost"
        );
        assert!(
            !Arc::ptr_eq(&first, &ep.conn().unwrap()),
            "a new connection"
        );
        server.stop();
    }
}
