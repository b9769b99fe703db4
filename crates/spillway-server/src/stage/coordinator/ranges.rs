//! One file's stripes between the instance and the PFS: every server holding some
//! copies its own share (`StageStripesReq`, copy.rs), range by range with a few ranges
//! in flight, all servers at once; the bytes they cover must add up to the size.

use super::{Ctx, CANCELLED};
use crate::stage::copy::my_pieces;
use crate::stage::{ns, Failure};
use spillway_types::{Attr, Errno, ServerIndex};
use spillway_wire::{PendingCall, StageDir, StageStripesReq};
use std::collections::VecDeque;

impl Ctx<'_> {
    /// Every server's stripes of `[0, size)`: each server copies its share range by
    /// range, all servers at once; the bytes they cover must add up to the size.
    pub(super) fn copy_ranges(
        &self,
        a: &Attr,
        size: u64,
        pfs_path: &str,
        pfs_ino: u64,
        shown: &str,
        direction: StageDir,
    ) -> Result<(), Failure> {
        let layout = self.inst.layout(a);
        let ss = u64::from(layout.stripe_size);
        let range = self.t.stage_range.div_ceil(ss).max(1) * ss;
        // A load-balanced instance (docs/cache.md §6): each server stores every
        // stripe, so a stage-in has every server copy the whole file (each answers
        // for all of it), and a stage-out needs one server, the file's home.
        let servers: Vec<_> = match (self.ldbal, direction) {
            (true, StageDir::In) => (0..self.inst.count()).map(ServerIndex).collect(),
            (true, StageDir::Out) => vec![a.ino.home()],
            (false, _) => layout
                .servers()
                .filter(|s| !my_pieces(&layout, s.0, size, 0, size).is_empty())
                .collect(),
        };
        let copies = servers.len() as u64;
        let request = |from: u64, to: u64| StageStripesReq {
            ino: a.ino,
            stripe_size: layout.stripe_size,
            stripe_width: layout.width,
            size,
            from,
            to,
            direction,
            pfs_path: pfs_path.to_string(),
            pfs_ino,
            ticket: self.req.ticket.clone(),
        };
        let one_server = |s: spillway_types::ServerIndex| -> Result<u64, Failure> {
            let ep = self
                .inst
                .server(s)
                .map_err(|e| ns::errno_failure(e, shown, "no such server"))?;
            let mut covered = 0;
            let mut from = 0u64;
            // Ranges in flight, oldest first. A failure or a termination drops the
            // rest unanswered: the stage ends either way, and a server finishes at
            // most those ranges.
            let mut in_flight = VecDeque::new();
            let depth = self.t.stage_ranges_in_flight.max(1);
            loop {
                if self.run.cancelled() {
                    return Err(Failure::new(CANCELLED, "terminated"));
                }
                while from < size && in_flight.len() < depth {
                    let to = (from + range).min(size);
                    let call = ep.start(&request(from, to), &[]);
                    let sent = call.is_sent();
                    in_flight.push_back(call);
                    from = to;
                    if !sent {
                        // The server did not come back within the reconnect window:
                        // waiting for this call fails at once, and starting another
                        // would spend a whole window again.
                        break;
                    }
                }
                let Some(call) = in_flight.pop_front() else {
                    break;
                };
                let r = call
                    .wait()
                    .map_err(|e| self.server_failure(s.0, e, shown, pfs_path))?;
                covered += r.bytes;
                self.run.add_bytes(r.bytes);
            }
            Ok(covered)
        };
        let results: Vec<Result<u64, Failure>> = if size <= range {
            // One request per server: no threads for a small file.
            let calls: Vec<_> = servers
                .iter()
                .map(|&s| {
                    let req = request(0, size);
                    (s, self.inst.server(s).map(|ep| ep.start(&req, &[])))
                })
                .collect();
            calls
                .into_iter()
                .map(|(s, call)| {
                    let r = call
                        .and_then(PendingCall::wait)
                        .map_err(|e| self.server_failure(s.0, e, shown, pfs_path))?;
                    self.run.add_bytes(r.bytes);
                    Ok(r.bytes)
                })
                .collect()
        } else {
            std::thread::scope(|sc| {
                let hs: Vec<_> = servers
                    .iter()
                    .map(|&s| sc.spawn(move || one_server(s)))
                    .collect();
                hs.into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(Failure::new(
                                libc::EIO,
                                format!("{shown}: a copy thread failed"),
                            ))
                        })
                    })
                    .collect()
            })
        };
        let mut covered = 0u64;
        // A termination wins over the failures it caused.
        if let Some(f) = results
            .iter()
            .find_map(|r| r.as_ref().err().filter(|f| f.errno == CANCELLED))
        {
            return Err(f.clone());
        }
        for r in results {
            covered += r?;
        }
        if covered != size * if self.ldbal { copies } else { 1 } {
            return Err(Failure::new(
                libc::EIO,
                format!("{shown}: short copy: the servers covered {covered} of {size} bytes of {pfs_path}"),
            ));
        }
        Ok(())
    }

    pub(super) fn server_failure(&self, s: u16, e: Errno, shown: &str, pfs_path: &str) -> Failure {
        let addr = self
            .inst
            .desc
            .servers
            .get(usize::from(s))
            .cloned()
            .unwrap_or_default();
        let why = match e.0 {
            libc::ESTALE => format!("{pfs_path} was replaced during the stage"),
            libc::EACCES => format!("{pfs_path}: permission denied"),
            libc::ENOSPC => "the instance is full".to_string(),
            libc::EIO => format!("I/O error or {pfs_path} changed size during the stage"),
            libc::ETIMEDOUT | libc::ECONNREFUSED | libc::ECONNRESET | libc::EHOSTUNREACH => {
                "the server did not answer".to_string()
            }
            _ => std::io::Error::from_raw_os_error(e.0).to_string(),
        };
        Failure::new(
            e.0,
            format!("{shown}: server {s} ({addr}) copying its stripes: {why}"),
        )
    }
}
