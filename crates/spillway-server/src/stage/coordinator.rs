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

use super::leftovers::Journal;
use super::ns::{self, may, MAY_EXEC, MAY_READ};
use super::pfs::{fstat, unchanged_since, Pfs, PfsStat};
use super::ticket::Grant;
use super::{copy::my_pieces, temp, Failure, Run};
use crate::fragment::Fragment;
use spillway_stubs::Instance;
use spillway_types::descriptor::encode_hex;
use spillway_types::identity::Identity;
use spillway_types::tunables::MAX_STAGE_BATCH_FILES;
use spillway_types::{
    Attr, Errno, FileKind, InodeNo, InstanceDescriptor, ServerIndex, Timespec, Tunables,
};
use spillway_wire::{
    setattr, stage_dir, stage_file_outcome, stage_kind, CreateReq, PendingCall, SetAttrReq,
    StageFileSpec, StageFilesReq, StageStartReq, StageStripesReq, StageSyncReq,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
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
}

const CANCELLED: i32 = libc::ECANCELED;

/// A copied file waiting for the group's sync.
#[derive(Clone)]
struct Copied {
    dw: String,
    bytes: u64,
    /// Stage-out: (temporary, destination).
    place: Option<(String, String)>,
}

fn join(dir: &str, rel: &str) -> String {
    if rel.is_empty() {
        return dir.to_string();
    }
    format!("{}/{rel}", dir.trim_end_matches('/'))
}

fn parent_of(path: &str) -> &str {
    match path.trim_end_matches('/').rfind('/') {
        Some(0) => "/",
        Some(i) => &path[..i],
        None => "/",
    }
}

fn base_of(path: &str) -> &str {
    let p = path.trim_end_matches('/');
    p.rsplit('/').next().unwrap_or(p)
}

fn ts(t: (i64, u32)) -> Timespec {
    Timespec {
        sec: t.0,
        nsec: t.1,
    }
}

/// Run the stage to its end, as the checked ticket (`grant`) allows; the outcome is in
/// `run`.
pub fn run(run: &Arc<Run>, frag: &Arc<Fragment>, req: &StageStartReq, grant: Grant, t: &Tunables) {
    if let Err(f) = execute(run, frag, req, grant, t) {
        tracing::info!(stage = req.stage, "stage failed: {}", f.message);
        // A failure of the whole stage still names a path: the one the stage named.
        let dw = req
            .pairs
            .first()
            .map(|p| {
                if req.direction == stage_dir::IN {
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
        credential: encode_hex(&frag.config.credential_bytes()),
    };
    let inst = Instance::peer(
        desc,
        t,
        &format!("stage {} coordinator pid {}", req.stage, std::process::id()),
    );
    let journal =
        (req.direction == stage_dir::OUT).then(|| Journal::start(frag.dir(), req.stage, id.uid));
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

    // ------------------------------------------------------------------ temporaries
    /// A new temporary name beside the PFS destination `dst`, noted (in memory and in
    /// the journal) before anything may create it.
    fn temp_for(&self, dst: &str) -> String {
        let n = self.next_temp.fetch_add(1, Ordering::Relaxed);
        let tmp = temp::path(dst, self.req.stage, n);
        if let Some(j) = &self.journal {
            j.add(&tmp);
        }
        self.temps().insert(tmp.clone());
        tmp
    }

    fn temps(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.temps.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remove a temporary that will not be put in place (its file failed, or the
    /// stage ends first). A removal that fails is logged: the name says what it is.
    fn discard(&self, tmp: &str) {
        if let Err(f) = self.pfs.remove_temporary(tmp) {
            tracing::warn!(stage = self.req.stage, "{}", f.message);
        }
        self.temps().remove(tmp);
    }

    /// At the stage's end: remove every temporary still out (none after a complete
    /// stage-out).
    fn sweep(&self) {
        let left: Vec<String> = self.temps().drain().collect();
        if left.is_empty() {
            return;
        }
        let r = self.pfs.as_owner(|| {
            for tmp in &left {
                if let Err(f) = self.pfs.remove_temporary(tmp) {
                    tracing::warn!(stage = self.req.stage, "{}", f.message);
                }
            }
        });
        if let Err(f) = r {
            tracing::warn!(stage = self.req.stage, "{}", f.message);
        }
        tracing::info!(
            stage = self.req.stage,
            "removed {} temporaries of files not put in place",
            left.len()
        );
    }

    fn inbound(&self) -> bool {
        self.req.direction == stage_dir::IN
    }

    // ------------------------------------------------------------------ enumeration
    fn enumerate(&self) -> Result<Vec<Item>, Failure> {
        match self.req.kind {
            stage_kind::FILE | stage_kind::LIST => {
                if self.req.kind == stage_kind::FILE && self.req.pairs.len() != 1 {
                    return Err(Failure::new(libc::EINVAL, "a file stage names one pair"));
                }
                Ok(self
                    .req
                    .pairs
                    .iter()
                    .map(|p| {
                        let dw = if self.inbound() {
                            p.destination.clone()
                        } else {
                            p.source.clone()
                        };
                        Item::File {
                            src: p.source.clone(),
                            dst: p.destination.clone(),
                            dw,
                            ino: None,
                            size: None,
                        }
                    })
                    .collect())
            }
            stage_kind::DIRECTORY => {
                let [p] = self.req.pairs.as_slice() else {
                    return Err(Failure::new(
                        libc::EINVAL,
                        "a directory stage names one pair",
                    ));
                };
                if self.inbound() {
                    self.enumerate_pfs_tree(&p.source, &p.destination)
                } else {
                    self.enumerate_instance_tree(&p.source, &p.destination)
                }
            }
            k => Err(Failure::new(
                libc::EINVAL,
                format!("unknown stage type {k}"),
            )),
        }
    }

    /// Stage-in of a tree: into the instance directory `dst`, which must be writable,
    /// or which is made (its parent must exist), as `cp -a src dst` does, with the
    /// source directory's mode and times. The PFS tree is walked as the owner.
    fn enumerate_pfs_tree(&self, src: &str, dst: &str) -> Result<Vec<Item>, Failure> {
        let mut out = Vec::new();
        match ns::resolve(&self.inst, &self.id, dst) {
            Ok(top) => {
                if top.kind != FileKind::Directory {
                    return Err(Failure::new(
                        libc::ENOTDIR,
                        format!("{dst}: the destination is not a directory"),
                    ));
                }
                ns::check_dir_writable(&top, &self.id, dst)?;
                self.dirs()
                    .insert(dst.trim_end_matches('/').to_string(), top);
            }
            Err(f) if f.errno == libc::ENOENT => {
                let st = self.pfs.lstat(src)?;
                out.push(Item::Dir {
                    dst: dst.trim_end_matches('/').to_string(),
                    mode: st.mode,
                    atime: ts(st.atime),
                    mtime: ts(st.mtime),
                });
            }
            Err(f) => return Err(f),
        }
        let entries = self.pfs.walk(src)?;
        out.extend(entries.into_iter().map(|(rel, st)| {
            let rel = rel.to_string_lossy().into_owned();
            let (s, d) = (join(src, &rel), join(dst, &rel));
            if st.is_dir() {
                Item::Dir {
                    dst: d,
                    mode: st.mode,
                    atime: ts(st.atime),
                    mtime: ts(st.mtime),
                }
            } else if st.is_file() {
                Item::File {
                    src: s,
                    dw: d.clone(),
                    dst: d,
                    ino: None,
                    size: Some(st.size),
                }
            } else if st.is_symlink() {
                Item::Symlink {
                    src: s,
                    dw: d.clone(),
                    dst: d,
                    ino: None,
                }
            } else {
                Item::Bad {
                    failure: Failure::new(
                        libc::EINVAL,
                        format!("{s}: not a regular file, directory or symlink"),
                    ),
                    dw: d,
                }
            }
        }));
        Ok(out)
    }

    /// Stage-out of a tree: into the PFS directory `dst`, or made (its parent must
    /// exist) with the instance directory's mode and times; the instance tree is
    /// walked with the owner's read and search permission on every directory.
    fn enumerate_instance_tree(&self, src: &str, dst: &str) -> Result<Vec<Item>, Failure> {
        let top = ns::resolve(&self.inst, &self.id, src)?;
        if top.kind != FileKind::Directory {
            return Err(Failure::new(
                libc::ENOTDIR,
                format!("{src}: not a directory"),
            ));
        }
        let mut out = Vec::new();
        match self.pfs.lstat(dst) {
            Ok(st) if st.is_dir() => {}
            Ok(_) => {
                return Err(Failure::new(
                    libc::ENOTDIR,
                    format!("{dst}: the destination is not a directory"),
                ))
            }
            Err(f) if f.errno == libc::ENOENT => out.push(Item::Dir {
                dst: dst.trim_end_matches('/').to_string(),
                mode: top.mode,
                atime: top.atime,
                mtime: top.mtime,
            }),
            Err(f) => return Err(f),
        }
        let mut stack = vec![(top, String::new())];
        while let Some((dir, rel)) = stack.pop() {
            let shown = join(src, &rel);
            if !may(&dir, &self.id, MAY_READ | MAY_EXEC) {
                return Err(Failure::new(
                    libc::EACCES,
                    format!("{shown}: permission denied (listing the directory)"),
                ));
            }
            let mut entries = self
                .inst
                .read_dir(dir.ino, self.t.readdir_page)
                .map_err(|e| ns::errno_failure(e, &shown, "readdir"))?;
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            let mut subdirs = Vec::new();
            for e in entries {
                let name = String::from_utf8_lossy(&e.name).into_owned();
                let child = if rel.is_empty() {
                    name
                } else {
                    format!("{rel}/{name}")
                };
                let (s, d) = (join(src, &child), join(dst, &child));
                match e.entry.kind {
                    FileKind::Directory => {
                        let a = self
                            .inst
                            .getattr(e.entry.ino)
                            .map_err(|er| ns::errno_failure(er, &s, "getattr"))?;
                        out.push(Item::Dir {
                            dst: d,
                            mode: a.mode,
                            atime: a.atime,
                            mtime: a.mtime,
                        });
                        subdirs.push((a, child));
                    }
                    FileKind::Regular => out.push(Item::File {
                        dw: s.clone(),
                        src: s,
                        dst: d,
                        ino: Some(e.entry.ino),
                        size: None,
                    }),
                    FileKind::Symlink => out.push(Item::Symlink {
                        dw: s.clone(),
                        src: s,
                        dst: d,
                        ino: Some(e.entry.ino),
                    }),
                    _ => out.push(Item::Bad {
                        failure: Failure::new(
                            libc::EINVAL,
                            format!("{s}: not a regular file, directory or symlink"),
                        ),
                        dw: s,
                    }),
                }
            }
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(out)
    }

    /// Bytes to copy, as far as they are known before copying: stage-in sizes from the
    /// PFS (the walk's, or an lstat of each listed file); stage-out sizes are found
    /// while copying.
    fn known_bytes(&self, items: &[Item]) -> u64 {
        if !self.inbound() {
            return 0;
        }
        items
            .iter()
            .filter_map(|i| match i {
                Item::File { size: Some(n), .. } => Some(*n),
                Item::File { src, .. } => self.pfs.lstat(src).ok().map(|s| s.size),
                _ => None,
            })
            .sum()
    }

    fn dirs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Attr>> {
        self.dirs.lock().unwrap_or_else(|e| e.into_inner())
    }

    // ------------------------------------------------------------------ directories
    fn make_dir(&self, item: &Item) -> Result<(), Failure> {
        let Item::Dir { dst, mode, .. } = item else {
            return Ok(());
        };
        // Made writable for the owner while being filled (as cp does); the real mode
        // is set at the end.
        let working = mode | 0o700;
        if !self.inbound() {
            return self.pfs.mkdir(dst, working);
        }
        let parent = self.parent_dir(dst)?;
        let name = base_of(dst);
        let (gid, mode) = ns::new_owner(&parent, &self.id, FileKind::Directory, working);
        let req = CreateReq {
            parent: parent.ino,
            name: name.as_bytes().to_vec(),
            kind: FileKind::Directory,
            mode,
            uid: self.id.uid,
            gid,
            rdev: 0,
            target: Vec::new(),
            stripe_size: 0,
            stripe_width: 0,
            open: false,
            xattrs: Vec::new(),
        };
        let attr = match self.inst.create(req) {
            Ok(a) => {
                let _ = self.inst.touch_dir(parent.ino, 1);
                a
            }
            Err(e) if e == Errno::EEXIST => {
                let (_, a) = self
                    .inst
                    .lookup(parent.ino, name.as_bytes())
                    .map_err(|e| ns::errno_failure(e, dst, "lookup"))?;
                if a.kind != FileKind::Directory {
                    return Err(Failure::new(
                        libc::ENOTDIR,
                        format!("{dst}: exists and is not a directory"),
                    ));
                }
                ns::check_dir_writable(&a, &self.id, dst)?;
                a
            }
            Err(e) => return Err(ns::errno_failure(e, dst, "mkdir")),
        };
        self.dirs().insert(dst.clone(), attr);
        Ok(())
    }

    fn finish_dir(&self, item: &Item) -> Result<(), Failure> {
        let Item::Dir {
            dst,
            mode,
            atime,
            mtime,
            ..
        } = item
        else {
            return Ok(());
        };
        if !self.inbound() {
            return self.pfs.set_attrs(dst, true, *mode, *atime, *mtime);
        }
        let Some(a) = self.dirs().get(dst.as_str()).cloned() else {
            return Ok(());
        };
        // Only the owner may change modes and times (as utimensat/chmod would say).
        if a.uid != self.id.uid && self.id.uid != 0 {
            return Ok(());
        }
        let mode = (mode & 0o7777) | (a.mode & libc::S_ISGID);
        self.inst
            .setattr(SetAttrReq {
                valid: setattr::MODE | setattr::ATIME | setattr::MTIME,
                mode,
                atime: *atime,
                mtime: *mtime,
                ..SetAttrReq::of(a.ino)
            })
            .map(|_| ())
            .map_err(|e| ns::errno_failure(e, dst, "setting mode and times"))
    }

    /// The instance directory a stage-in name goes in (made by this stage, or looked
    /// up with the owner's permissions).
    fn parent_dir(&self, dst: &str) -> Result<Attr, Failure> {
        let parent = parent_of(dst);
        if let Some(a) = self.dirs().get(parent.trim_end_matches('/')) {
            return Ok(a.clone());
        }
        let (p, _) = ns::resolve_parent(&self.inst, &self.id, dst)?;
        ns::check_dir_writable(&p, &self.id, dst)?;
        Ok(p)
    }

    // ------------------------------------------------------------------ files
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

    /// A file is copied: it counts complete once the next group sync is done (and, for
    /// a stage-out, its temporary is renamed into place).
    fn copied_file(&self, dw: String, bytes: u64, place: Option<(String, String)>) {
        self.unsynced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Copied { dw, bytes, place });
        self.copied.notify_one();
    }

    // ------------------------------------------------------------------ batches
    /// Hand the files a single server can stage alone to that server in batches
    /// (`StageFilesReq`, files.rs), the servers' batches interleaved so that all work
    /// from the start; everything else follows, one item at a time.
    fn batch(&self, items: Vec<Item>) -> Vec<Item> {
        let per = self.t.stage_batch_files.clamp(1, MAX_STAGE_BATCH_FILES);
        let mut groups: BTreeMap<u16, Vec<(StageFileSpec, Item)>> = BTreeMap::new();
        let mut rest = Vec::new();
        for item in items {
            match self.batch_spec(&item) {
                Some((server, spec)) => groups.entry(server.0).or_default().push((spec, item)),
                None => rest.push(item),
            }
        }
        let mut chunks: Vec<VecDeque<Item>> = groups
            .into_iter()
            .map(|(server, files)| {
                let mut out = VecDeque::new();
                let mut files = files.into_iter().peekable();
                while files.peek().is_some() {
                    out.push_back(Item::Batch {
                        server: ServerIndex(server),
                        files: files.by_ref().take(per).collect(),
                    });
                }
                out
            })
            .collect();
        let mut out = Vec::new();
        while chunks.iter().any(|c| !c.is_empty()) {
            for c in chunks.iter_mut() {
                out.extend(c.pop_front());
            }
        }
        out.extend(rest);
        out
    }

    /// Which server could stage this file alone, and what to tell it: stage-in, the
    /// server of the new entry (a file no bigger than a stripe, as far as the walk
    /// saw); stage-out, the inode's home (the walk found the inode). `None`: the long
    /// way (including whenever the answer needs a lookup that may fail: the long way
    /// reports it).
    fn batch_spec(&self, item: &Item) -> Option<(ServerIndex, StageFileSpec)> {
        let Item::File {
            src,
            dst,
            dw,
            ino,
            size,
        } = item
        else {
            return None;
        };
        if self.inbound() {
            let parent = self.parent_dir(dst).ok()?;
            if size.is_some_and(|n| parent.stripe_size != 0 && n > u64::from(parent.stripe_size)) {
                return None;
            }
            let name = base_of(dst);
            if name.is_empty() {
                return None;
            }
            let (gid, _) = ns::new_owner(&parent, &self.id, FileKind::Regular, 0);
            let server = self.inst.dentry_home(parent.ino, name.as_bytes());
            Some((
                server,
                StageFileSpec {
                    parent: parent.ino,
                    name: name.as_bytes().to_vec(),
                    gid,
                    stripe_size: parent.stripe_size,
                    stripe_width: parent.stripe_width,
                    ino: InodeNo(0),
                    pfs_path: src.clone(),
                    shown: dw.clone(),
                },
            ))
        } else {
            let ino = (*ino)?;
            Some((
                ino.home(),
                StageFileSpec {
                    parent: InodeNo(0),
                    name: Vec::new(),
                    gid: 0,
                    stripe_size: 0,
                    stripe_width: 0,
                    ino,
                    // The server writes a temporary; the rename comes after the sync.
                    pfs_path: self.temp_for(dst),
                    shown: dw.clone(),
                },
            ))
        }
    }

    /// One batch: the server's answer per file; what it leaves goes the long way.
    fn run_batch(&self, server: ServerIndex, files: Vec<(StageFileSpec, Item)>) {
        let (specs, items): (Vec<StageFileSpec>, Vec<Item>) = files.into_iter().unzip();
        let parents: BTreeSet<InodeNo> = specs.iter().map(|s| s.parent).collect();
        let req = StageFilesReq {
            direction: self.req.direction,
            ticket: self.req.ticket.clone(),
            files: specs,
        };
        let reply = self
            .inst
            .server(server)
            .and_then(|ep| ep.call(&req))
            .and_then(|r| {
                if r.results.len() == items.len() {
                    Ok(r.results)
                } else {
                    Err(Errno::EPROTO)
                }
            });
        let results = match reply {
            Ok(r) => r,
            Err(e) => {
                for (spec, item) in req.files.iter().zip(items) {
                    if !self.inbound() {
                        self.discard(&spec.pfs_path);
                    }
                    if let Some(dw) = item.dw() {
                        let shown = temp::shown(&spec.pfs_path);
                        let f = self.server_failure(server.0, e, dw, &shown);
                        self.run.file_failed(dw.to_string(), &f);
                    }
                }
                return;
            }
        };
        let mut created = false;
        for ((res, item), spec) in results.into_iter().zip(items).zip(&req.files) {
            // Stage-out: the temporary the server wrote, and where it goes.
            let place = match &item {
                Item::File { dst, .. } if !self.inbound() => {
                    Some((spec.pfs_path.clone(), dst.clone()))
                }
                _ => None,
            };
            match res.outcome {
                stage_file_outcome::DONE => {
                    created = true;
                    self.run.add_bytes(res.bytes);
                    if let Some(dw) = item.dw() {
                        self.copied_file(dw.to_string(), res.bytes, place);
                    }
                }
                stage_file_outcome::FAILED => {
                    if let Some((tmp, _)) = &place {
                        self.discard(tmp);
                    }
                    if let Some(dw) = item.dw() {
                        let f = Failure::new(res.errno, res.message);
                        self.run.file_failed(dw.to_string(), &f);
                    }
                }
                _ => {
                    // Untouched (ELSEWHERE): the long way makes a temporary of its own.
                    if let Some((tmp, _)) = &place {
                        self.temps().remove(tmp);
                    }
                    self.one(item)
                }
            }
        }
        // The directories' times change with their new entries (as for one create).
        if created && self.inbound() {
            for p in parents {
                let _ = self.inst.touch_dir(p, 0);
            }
        }
    }

    /// Sync what has been copied, again and again, until the workers are done and
    /// nothing is left.
    fn syncer(&self) {
        loop {
            let batch = {
                let mut u = self.unsynced.lock().unwrap_or_else(|e| e.into_inner());
                while u.is_empty() && !self.workers_done.load(Ordering::SeqCst) {
                    u = self
                        .copied
                        .wait_timeout(u, std::time::Duration::from_millis(100))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                if u.is_empty() {
                    return;
                }
                std::mem::take(&mut *u)
            };
            self.sync_batch(batch);
        }
    }

    /// Make the copied files durable on every server, put stage-outs in place (rename,
    /// then the directories synced), then count them complete.
    fn sync_batch(&self, batch: Vec<Copied>) {
        let req = StageSyncReq {
            direction: self.req.direction,
            ticket: self.req.ticket.clone(),
        };
        let calls: Vec<_> = (0..self.inst.count())
            .filter_map(|i| self.inst.server(spillway_types::ServerIndex(i)).ok())
            .map(|s| s.start(&req, &[]))
            .collect();
        let err = calls
            .into_iter()
            .map(PendingCall::wait)
            .find_map(Result::err);
        if let Some(e) = err {
            for c in batch {
                let f = ns::errno_failure(e, &c.dw, "making the copy durable");
                if let Some((tmp, _)) = &c.place {
                    self.discard(tmp);
                }
                self.run.file_failed(c.dw, &f);
            }
            return;
        }
        for (c, r) in self.put_in_place(&batch).into_iter() {
            match r {
                Ok(()) => self.run.file_done(c.dw, c.bytes),
                // A stage terminated before its files were in place: not complete,
                // and their temporaries go with the sweep.
                Err(f) if f.errno == CANCELLED => {}
                Err(f) => self.run.file_failed(c.dw, &f),
            }
        }
    }

    /// Rename each durable stage-out temporary over its destination, as the owner,
    /// then sync each directory renamed into once. Stage-ins (no temporary) are in
    /// place already.
    fn put_in_place(&self, batch: &[Copied]) -> Vec<(Copied, Result<(), Failure>)> {
        if batch.iter().all(|c| c.place.is_none()) {
            return batch.iter().map(|c| (c.clone(), Ok(()))).collect();
        }
        let done = self.pfs.as_owner(|| {
            let mut out: Vec<(Copied, Result<(), Failure>)> = Vec::new();
            // Per directory: one destination in it (to reach it by) and the files.
            let mut dirs: BTreeMap<String, (String, Vec<usize>)> = BTreeMap::new();
            for c in batch {
                let Some((tmp, dst)) = &c.place else {
                    out.push((c.clone(), Ok(())));
                    continue;
                };
                if self.run.cancelled() {
                    out.push((c.clone(), Err(Failure::new(CANCELLED, "terminated"))));
                    continue;
                }
                let r = self.pfs.rename_into_place(tmp, dst);
                match &r {
                    Ok(()) => {
                        self.temps().remove(tmp);
                        let (dir, _) = temp::split(dst);
                        dirs.entry(dir.to_string())
                            .or_insert_with(|| (dst.clone(), Vec::new()))
                            .1
                            .push(out.len());
                    }
                    Err(_) => self.discard(tmp),
                }
                out.push((c.clone(), r));
            }
            for (_, (dst, idx)) in dirs {
                if let Err(f) = self.pfs.sync_parent(&dst) {
                    for i in idx {
                        let dw = out[i].0.dw.clone();
                        out[i].1 = Err(Failure::new(
                            f.errno,
                            format!("{dw}: renamed into place, but {}", f.message),
                        ));
                    }
                }
            }
            out
        });
        match done {
            Ok(v) => v,
            Err(f) => batch.iter().map(|c| (c.clone(), Err(f.clone()))).collect(),
        }
    }

    /// PFS → instance, one regular file.
    fn file_in(&self, src: &str, dst: &str) -> Result<u64, Failure> {
        let (file, st) = self.pfs.open_source(src)?;
        let parent = self.parent_dir(dst)?;
        let attr = self.create_or_truncate(&parent, base_of(dst), st.mode, dst)?;
        let r = self.copy_ranges(&attr, st.size, src, st.ino, dst, stage_dir::IN);
        let r = r.and_then(|()| {
            unchanged_since(&file, &st, src)?;
            self.set_size_and_times(&attr, &st, dst)
        });
        // The release is not waited for: nothing depends on its answer, and a release
        // lost with a broken connection is done by the server when the connection goes.
        if let Ok(ep) = self.inst.endpoint(attr.ino.home()) {
            drop(spillway_wire::OwnedCall::start(
                &ep,
                &spillway_wire::ReleaseReq { ino: attr.ino },
                Vec::new(),
            ));
        }
        r.map(|()| st.size)
    }

    /// Create the instance file (opened for this stage), or open and truncate the one
    /// that is there.
    fn create_or_truncate(
        &self,
        parent: &Attr,
        name: &str,
        mode: u32,
        dst: &str,
    ) -> Result<Attr, Failure> {
        let (gid, mode) = ns::new_owner(parent, &self.id, FileKind::Regular, mode);
        let req = CreateReq {
            parent: parent.ino,
            name: name.as_bytes().to_vec(),
            kind: FileKind::Regular,
            mode,
            uid: self.id.uid,
            gid,
            rdev: 0,
            target: Vec::new(),
            stripe_size: parent.stripe_size,
            stripe_width: parent.stripe_width,
            open: true,
            xattrs: Vec::new(),
        };
        // The directory's times are updated in parallel with the create (as the FUSE
        // client does): a create that fails changed nothing, the touch is harmless.
        let touch = self.inst.start_touch_dir(parent.ino, 0);
        let created = self.inst.create(req);
        if let Ok(t) = touch {
            let _ = t.wait();
        }
        match created {
            Ok(a) => Ok(a),
            Err(e) if e == Errno::EEXIST => {
                let (_, a) = self
                    .inst
                    .lookup(parent.ino, name.as_bytes())
                    .map_err(|e| ns::errno_failure(e, dst, "lookup"))?;
                if a.kind != FileKind::Regular {
                    let e = if a.kind == FileKind::Directory {
                        libc::EISDIR
                    } else {
                        libc::EINVAL
                    };
                    return Err(Failure::new(
                        e,
                        format!("{dst}: exists and is not a regular file"),
                    ));
                }
                if !may(&a, &self.id, ns::MAY_WRITE) {
                    return Err(Failure::new(
                        libc::EACCES,
                        format!("{dst}: permission denied (write on the file)"),
                    ));
                }
                self.inst
                    .open(a.ino, 0)
                    .map_err(|e| ns::errno_failure(e, dst, "open"))?;
                let r = self.inst.setattr(super::replacing(&a, &self.id, mode));
                match r {
                    Ok(a) => Ok(a),
                    Err(e) => {
                        let _ = self.inst.release(a.ino);
                        Err(ns::errno_failure(e, dst, "truncate"))
                    }
                }
            }
            Err(e) => Err(ns::errno_failure(e, dst, "create")),
        }
    }

    fn set_size_and_times(&self, a: &Attr, st: &PfsStat, dst: &str) -> Result<(), Failure> {
        self.inst
            .setattr(super::staged_size_and_times(a.ino, st))
            .map(|_| ())
            .map_err(|e| ns::errno_failure(e, dst, "setting the size and times"))
    }

    /// Every server's stripes of `[0, size)`: each server copies its share range by
    /// range, all servers at once; the bytes they cover must add up to the size.
    fn copy_ranges(
        &self,
        a: &Attr,
        size: u64,
        pfs_path: &str,
        pfs_ino: u64,
        shown: &str,
        direction: u8,
    ) -> Result<(), Failure> {
        let layout = self.inst.layout(a);
        let ss = u64::from(layout.stripe_size);
        let range = self.t.stage_range.div_ceil(ss).max(1) * ss;
        let servers: Vec<_> = layout
            .servers()
            .filter(|s| !my_pieces(&layout, s.0, size, 0, size).is_empty())
            .collect();
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
        if covered != size {
            return Err(Failure::new(
                libc::EIO,
                format!("{shown}: short copy: the servers covered {covered} of {size} bytes of {pfs_path}"),
            ));
        }
        Ok(())
    }

    fn server_failure(&self, s: u16, e: Errno, shown: &str, pfs_path: &str) -> Failure {
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

    /// Instance → PFS, one regular file, written to the temporary `tmp` beside `dst`
    /// (put in place after the group's sync).
    fn file_out(
        &self,
        src: &str,
        dst: &str,
        tmp: &str,
        ino: Option<InodeNo>,
    ) -> Result<u64, Failure> {
        let a = match ino {
            Some(i) => self
                .inst
                .getattr(i)
                .map_err(|e| ns::errno_failure(e, src, "getattr"))?,
            None => ns::resolve(&self.inst, &self.id, src)?,
        };
        if a.kind != FileKind::Regular {
            let e = if a.kind == FileKind::Directory {
                libc::EISDIR
            } else {
                libc::EINVAL
            };
            return Err(Failure::new(e, format!("{src}: not a regular file")));
        }
        if !may(&a, &self.id, MAY_READ) {
            return Err(Failure::new(
                libc::EACCES,
                format!("{src}: permission denied (read on the file)"),
            ));
        }
        // A directory or a FIFO there fails now, not after the copy.
        self.pfs.check_destination(dst)?;
        let file = self.pfs.create_temporary(tmp, a.mode & 0o7777)?;
        file.set_len(a.size)
            .map_err(|e| ns::errno_failure(Errno::from_io(&e), dst, "setting the size"))?;
        let pst = fstat(&file).map_err(|e| ns::errno_failure(Errno(e), dst, "fstat"))?;
        self.copy_ranges(&a, a.size, tmp, pst.ino, src, stage_dir::OUT)?;
        // Durable with the group's StageSync (syncfs of the PFS on every server of
        // the instance, this one included), not by an fsync per file; then renamed.
        self.pfs
            .set_file_attrs(&file, dst, a.mode, a.atime, a.mtime)?;
        Ok(a.size)
    }

    fn symlink_in(&self, src: &str, dst: &str) -> Result<u64, Failure> {
        let target = self.pfs.read_link(src)?;
        let parent = self.parent_dir(dst)?;
        let name = base_of(dst);
        let (gid, _) = ns::new_owner(&parent, &self.id, FileKind::Symlink, 0o777);
        let req = CreateReq {
            parent: parent.ino,
            name: name.as_bytes().to_vec(),
            kind: FileKind::Symlink,
            mode: 0o777,
            uid: self.id.uid,
            gid,
            rdev: 0,
            target: target.clone(),
            stripe_size: 0,
            stripe_width: 0,
            open: false,
            xattrs: Vec::new(),
        };
        match self.inst.create(req) {
            Ok(_) => {
                let _ = self.inst.touch_dir(parent.ino, 0);
                Ok(0)
            }
            Err(e) if e == Errno::EEXIST => {
                let (_, a) = self
                    .inst
                    .lookup(parent.ino, name.as_bytes())
                    .map_err(|e| ns::errno_failure(e, dst, "lookup"))?;
                let same = a.kind == FileKind::Symlink
                    && self.inst.read_link(a.ino).ok().as_deref() == Some(&target[..]);
                if same {
                    Ok(0)
                } else {
                    Err(Failure::new(
                        libc::EEXIST,
                        format!("{dst}: exists and is not the same symlink"),
                    ))
                }
            }
            Err(e) => Err(ns::errno_failure(e, dst, "symlink")),
        }
    }

    fn symlink_out(&self, src: &str, dst: &str, ino: Option<InodeNo>) -> Result<u64, Failure> {
        let ino = match ino {
            Some(i) => i,
            None => ns::resolve(&self.inst, &self.id, src)?.ino,
        };
        let target = self
            .inst
            .read_link(ino)
            .map_err(|e| ns::errno_failure(e, src, "readlink"))?;
        self.pfs.symlink(&target, dst)?;
        Ok(0)
    }
}
