//! A whole stage, run by the server the manager chose: enumerate what is to be copied,
//! make the directories, then copy files `files_in_flight` at a time. For each file the
//! coordinator opens the source (as the owner), creates or truncates the destination,
//! and asks every server holding stripes of it to copy its own stripes
//! (`StageStripesReq`, range by range, each server's ranges in order and all servers
//! at once); then it checks the byte count, sets size, mode and times. Files become
//! durable in groups: one thread has every server of the instance sync what it wrote
//! (`StageSyncReq`) for all the files copied since its last round, while the workers
//! go on copying, and only then do those files count as complete (group commit).
//!
//! A stage-out writes each PFS file under a temporary name beside its destination
//! (temp.rs) and renames it over the destination after the group's sync, then syncs
//! the directory: a destination is its old file, absent, or the complete copy. A
//! stage that ends any other way (terminated, failed, dropped) removes its
//! temporaries; a journal (leftovers.rs) lets a restarted server remove those of a
//! coordinator that died.
//!
//! The coordinator's parts, each an `impl Ctx` block of its own:
//! * `walk`      — enumeration: the pairs of a file or list stage, the PFS or instance
//!   tree of a directory stage.
//! * `dirs`      — the directories a stage makes first and gives their modes and times
//!   last.
//! * `batch`     — small files handed to the one server that can stage each alone
//!   (`StageFilesReq`, files.rs).
//! * `copy_file` — one file or symlink the long way, in or out.
//! * `ranges`    — one file's stripes, every server copying its own range by range.
//! * `commit`    — group commit: sync what was copied, put stage-outs in place, count
//!   files complete.
//! * `temps`     — the stage-out temporaries handed out, and their removal.
//! * `paths`     — joining and splitting the stage's path strings.

mod batch;
mod commit;
mod copy_file;
mod dirs;
mod paths;
mod ranges;
mod temps;
mod walk;

use super::leftovers::Journal;
use super::pfs::Pfs;
use super::ticket::Grant;
use super::{Failure, Run};
use crate::fragment::Fragment;
use spillway_stubs::Instance;
use spillway_types::identity::Identity;
use spillway_types::{Attr, InodeNo, InstanceDescriptor, ServerIndex, Timespec, Tunables};
use spillway_wire::{StageDir, StageFileSpec, StageStartReq};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// What the enumeration found: one thing to make or copy.
enum Item {
    Dir {
        dst: String,
        mode: u32,
        atime: Timespec,
        mtime: Timespec,
    },
    File {
        src: String,
        dst: String,
        /// The file's path inside the instance (what events name).
        dw: String,
        /// Stage-out of a tree: the instance inode the walk found.
        ino: Option<InodeNo>,
        /// Stage-in of a tree: the size the walk saw.
        size: Option<u64>,
    },
    Symlink {
        src: String,
        dst: String,
        dw: String,
        ino: Option<InodeNo>,
    },
    /// Found, but cannot be staged (fails as a file, not silently skipped).
    Bad { dw: String, failure: Failure },
    /// Small files for one server to stage alone (`StageFilesReq`), each with the
    /// item to copy the long way if that server answers ELSEWHERE.
    Batch {
        server: ServerIndex,
        files: Vec<(StageFileSpec, Item)>,
    },
}

impl Item {
    fn dw(&self) -> Option<&str> {
        match self {
            Item::File { dw, .. } | Item::Symlink { dw, .. } | Item::Bad { dw, .. } => Some(dw),
            Item::Dir { .. } | Item::Batch { .. } => None,
        }
    }
}

/// A running stage, shared by the worker threads and the syncer: the request, the
/// instance as a peer reaches it, the PFS as the owner reaches it, and what the parts
/// hand one another (directories made, files awaiting the sync, temporaries out).
struct Ctx<'a> {
    run: &'a Run,
    req: &'a StageStartReq,
    t: &'a Tunables,
    inst: Instance,
    pfs: Pfs,
    id: Identity,
    /// Stage-in directories made or found, by instance path.
    dirs: Mutex<HashMap<String, Attr>>,
    /// Files copied but not yet made durable: (path, bytes, and for a stage-out the
    /// temporary written and the destination it is to be renamed over).
    unsynced: Mutex<Vec<Copied>>,
    /// Stage-out temporaries handed out and not yet renamed into place or removed.
    temps: Mutex<HashSet<String>>,
    /// The number of the next temporary name.
    next_temp: AtomicU64,
    /// Where the temporaries are noted for a restarted server (stage-outs only).
    journal: Option<Journal>,
    /// Rung when a file joins `unsynced`, or when the workers are done.
    copied: Condvar,
    workers_done: AtomicBool,
    /// The instance is load-balanced: every server holds every stripe (ranges.rs).
    ldbal: bool,
}

/// The errno of a file the stage's termination stopped (not reported as failed).
const CANCELLED: i32 = libc::ECANCELED;

/// A copied file waiting for the group's sync.
#[derive(Clone)]
struct Copied {
    dw: String,
    bytes: u64,
    /// Stage-out: (temporary, destination).
    place: Option<(String, String)>,
}

/// Run the stage to its end, as the checked ticket (`grant`) allows; the outcome is in
/// `run`.
pub(super) fn run(
    run: &Arc<Run>,
    frag: &Arc<Fragment>,
    req: &StageStartReq,
    grant: Grant,
    t: &Tunables,
) {
    if let Err(f) = execute(run, frag, req, grant, t) {
        tracing::info!(stage = req.stage, "stage failed: {}", f.message);
        // A failure of the whole stage still names a path: the one the stage named.
        let dw = req
            .pairs
            .first()
            .map(|p| {
                if req.direction == StageDir::In {
                    p.destination.clone()
                } else {
                    p.source.clone()
                }
            })
            .unwrap_or_default();
        if f.errno != CANCELLED {
            run.file_failed(dw, &f);
        }
    }
    run.finish();
}

fn execute(
    run: &Run,
    frag: &Fragment,
    req: &StageStartReq,
    grant: Grant,
    t: &Tunables,
) -> Result<(), Failure> {
    let id = grant.identity().clone();
    let pfs = grant.pfs;
    let desc = InstanceDescriptor {
        instance: frag.config.instance,
        servers: frag.config.peers.clone(),
        capacity: frag.config.capacity,
        stripe_size: frag.config.stripe_size,
        // Not used: a peer proves itself with the instance secret, given as bytes.
        credential: String::new(),
        // Stages run on scratch instances only (a cache instance refuses them).
        cache: false,
        ldbal: frag.ldbal(),
        replica: None,
    };
    let inst = Instance::peer(
        desc,
        &frag.config.credential_bytes(),
        t,
        &format!("stage {} coordinator pid {}", req.stage, std::process::id()),
    );
    let journal =
        (req.direction == StageDir::Out).then(|| Journal::start(frag.dir(), req.stage, id.uid));
    let ctx = Ctx {
        run,
        req,
        t,
        inst,
        pfs,
        id,
        dirs: Mutex::new(HashMap::new()),
        unsynced: Mutex::new(Vec::new()),
        copied: Condvar::new(),
        workers_done: AtomicBool::new(false),
        ldbal: frag.ldbal(),
        temps: Mutex::new(HashSet::new()),
        next_temp: AtomicU64::new(0),
        journal,
    };
    let r = ctx.stage();
    // Whatever the end, no temporary stays behind (those renamed are no longer ones).
    ctx.sweep();
    if let Some(j) = ctx.journal {
        j.finish();
    }
    r
}

impl Ctx<'_> {
    /// The stage proper, from enumeration to the directories' attributes.
    fn stage(&self) -> Result<(), Failure> {
        let (run, req, ctx) = (self.run, self.req, self);
        let t0 = std::time::Instant::now();
        let items = ctx.enumerate()?;
        let t_enum = t0.elapsed();
        let files: Vec<String> = items
            .iter()
            .filter_map(|i| i.dw().map(String::from))
            .collect();
        let bytes = ctx.known_bytes(&items);
        run.enumerated(files.len() as u64, bytes, files);

        // Directories first, in walk order (parents before children).
        let (dirs, files): (Vec<Item>, Vec<Item>) = items
            .into_iter()
            .partition(|i| matches!(i, Item::Dir { .. }));
        for d in &dirs {
            if run.cancelled() {
                return Ok(());
            }
            ctx.make_dir(d)?;
        }
        let t_dirs = t0.elapsed();
        let queue = Mutex::new(VecDeque::from(ctx.batch(files)));
        let workers = (req.files_in_flight as usize).clamp(1, 256);
        let t_copied = std::thread::scope(|s| {
            // Group commit: one thread syncs whatever has been copied since its last sync,
            // while the workers go on copying.
            s.spawn(|| ctx.syncer());
            let hs: Vec<_> = (0..workers).map(|_| s.spawn(|| ctx.work(&queue))).collect();
            for h in hs {
                let _ = h.join();
            }
            let copied = t0.elapsed();
            ctx.workers_done.store(true, Ordering::SeqCst);
            ctx.copied.notify_all();
            copied
        });
        // Where the time went (from the start: enumerated, directories made, files copied,
        // all durable), for whoever tunes a site.
        tracing::info!(
            stage = req.stage,
            enumerated = ?t_enum,
            dirs = ?t_dirs,
            copied = ?t_copied,
            durable = ?t0.elapsed(),
            "files staged"
        );
        // Directory modes and times last, deepest first: copying into them changed both.
        if !run.cancelled() {
            for d in dirs.iter().rev() {
                if let Err(f) = ctx.finish_dir(d) {
                    run.fail(&f.message);
                }
            }
        }
        Ok(())
    }

    fn inbound(&self) -> bool {
        self.req.direction == StageDir::In
    }

    fn work(&self, queue: &Mutex<VecDeque<Item>>) {
        loop {
            if self.run.cancelled() {
                return;
            }
            let next = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
            match next {
                None => return,
                Some(Item::Batch { server, files }) => self.run_batch(server, files),
                Some(item) => self.one(item),
            }
        }
    }

    /// Copy one item the long way and record the outcome.
    fn one(&self, item: Item) {
        let (dw, r) = match item {
            Item::File {
                src, dst, dw, ino, ..
            } => {
                if self.inbound() {
                    let r = self.file_in(&src, &dst);
                    (dw, r)
                } else {
                    let tmp = self.temp_for(&dst);
                    match self.file_out(&src, &dst, &tmp, ino) {
                        Ok(bytes) => {
                            return self.copied_file(dw, bytes, Some((tmp, dst)));
                        }
                        Err(f) => {
                            self.discard(&tmp);
                            (dw, Err(f))
                        }
                    }
                }
            }
            Item::Symlink { src, dst, dw, ino } => {
                let r = if self.inbound() {
                    self.symlink_in(&src, &dst)
                } else {
                    self.symlink_out(&src, &dst, ino)
                };
                (dw, r)
            }
            Item::Bad { dw, failure } => (dw, Err(failure)),
            Item::Batch { server, files } => return self.run_batch(server, files),
            Item::Dir { .. } => return,
        };
        match r {
            Ok(bytes) => self.copied_file(dw, bytes, None),
            Err(f) if f.errno == CANCELLED && self.run.cancelled() => {}
            Err(f) => self.run.file_failed(dw, &f),
        }
    }
}
