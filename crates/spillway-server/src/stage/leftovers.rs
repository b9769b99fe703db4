//! What a coordinator that stops mid-stage leaves on the PFS, and how a restarted
//! server removes it (docs/staging.md, "Files").
//!
//! A running stage-out's temporaries (temp.rs) are removed by its coordinator when the
//! stage ends, whatever the end. A coordinator that dies first cannot: so before it
//! hands out a temporary name it appends it to the stage's journal, a root-only file
//! in the fragment's directory (`stage-temporaries/<stage>`), and removes the journal
//! once the stage has ended and its temporaries are gone. A server that starts finds
//! the journals of stages it no longer runs (it runs none yet) and removes what they
//! list, as the stage's owner and only names of that stage's temporaries under its own
//! PFS roots; then the journal.
//!
//! Bounds: the journal is written without fsync (appends reach the page cache, which a
//! crashed or killed process does not lose; a machine that crashes may lose the last
//! appends, and their temporaries stay, hidden and named as what they are). A
//! temporary a peer server creates after its coordinator gave up on it (a peer that
//! answers only after the reconnect window) is not in any journal either.

use super::pfs::Pfs;
use super::temp;
use crate::fragment::Fragment;
use spillway_types::identity::Identity;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const DIR: &str = "stage-temporaries";
/// A journal larger than this is not read back (it was not written by us).
const MAX_JOURNAL_BYTES: u64 = 1 << 30;

/// The journal of one running stage-out.
pub(super) struct Journal {
    path: PathBuf,
    file: Mutex<Option<File>>,
}

impl Journal {
    /// Start the journal of `stage`, run as `uid`. A journal that cannot be written
    /// costs only the clean-up after a crash: the stage goes on (and says so in the
    /// log).
    pub(super) fn start(frag_dir: &Path, stage: u64, uid: u32) -> Journal {
        let dir = frag_dir.join(DIR);
        let path = dir.join(stage.to_string());
        let file = std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(&dir)
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(&path)
            })
            .and_then(|mut f| {
                f.write_all(format!("{uid}\0").as_bytes())?;
                Ok(f)
            });
        let file = match file {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::warn!(
                    stage,
                    "cannot write the journal of the stage's temporaries ({}): {e}; a crash \
                     of this server mid-stage would leave them on the PFS",
                    path.display()
                );
                None
            }
        };
        Journal {
            path,
            file: Mutex::new(file),
        }
    }

    /// Note a temporary before it may exist.
    pub(super) fn add(&self, tmp: &str) {
        let mut g = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = g.as_mut() {
            let mut rec = tmp.as_bytes().to_vec();
            rec.push(0);
            if let Err(e) = f.write_all(&rec) {
                tracing::warn!(
                    "cannot append to {}: {e}; journal given up for this stage",
                    self.path.display()
                );
                *g = None;
            }
        }
    }

    /// The stage has ended and its temporaries are gone.
    pub(super) fn finish(self) {
        let had = self
            .file
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some();
        if had {
            if let Err(e) = std::fs::remove_file(&self.path) {
                tracing::warn!("cannot remove {}: {e}", self.path.display());
            }
        }
    }
}

/// What one journal says: the owner's uid and the temporaries.
fn parse(bytes: &[u8]) -> Option<(u32, Vec<String>)> {
    let mut fields = bytes.split(|&b| b == 0);
    let uid = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
    let temps = fields
        .filter(|f| !f.is_empty())
        .filter_map(|f| String::from_utf8(f.to_vec()).ok())
        .collect();
    Some((uid, temps))
}

/// At server start, before any stage runs: remove what the journals of `f` list (in a
/// thread of its own: a large stage's journal must not hold up the start).
pub(crate) fn clean_at_start(f: &std::sync::Arc<Fragment>) {
    let dir = f.dir().join(DIR);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    let journals: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let stage = e.file_name().to_str()?.parse().ok()?;
            Some((stage, e.path()))
        })
        .collect();
    if journals.is_empty() {
        return;
    }
    let roots = f.pfs_roots.clone();
    let instance = f.config.instance;
    let spawned = std::thread::Builder::new()
        .name("stage-leftovers".into())
        .spawn(move || {
            for (stage, path) in journals {
                clean_one(instance, &roots, stage, &path);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(instance, "cannot start the stage clean-up thread: {e}");
    }
}

fn clean_one(instance: u64, roots: &[String], stage: u64, path: &Path) {
    let mut bytes = Vec::new();
    let read = File::open(path).and_then(|f| f.take(MAX_JOURNAL_BYTES).read_to_end(&mut bytes));
    match read.ok().and_then(|_| parse(&bytes)) {
        Some((uid, temps)) => match Identity::of_uid(uid) {
            Ok(id) => {
                let mut removed = 0;
                for tmp in &temps {
                    // Only this stage's own temporaries, each as the path it names.
                    let (_, last) = temp::split(tmp);
                    if temp::parse(last).is_none_or(|(_, s, _)| s != stage) {
                        continue;
                    }
                    let pfs = Pfs::new(roots, std::slice::from_ref(tmp), id.clone())
                        .map(|p| p.for_stage(stage));
                    match pfs.and_then(|p| p.remove_temporary(tmp)) {
                        Ok(()) => removed += 1,
                        Err(e) => tracing::warn!(instance, stage, "{}", e.message),
                    }
                }
                tracing::info!(
                    instance,
                    stage,
                    "removed the temporaries of a stage-out this server was running when it stopped ({removed} of {} names)",
                    temps.len()
                );
            }
            Err(e) => tracing::warn!(instance, stage, "stage leftovers: {e}"),
        },
        None => tracing::warn!(
            instance,
            stage,
            "{}: not a journal of stage temporaries; removed",
            path.display()
        ),
    }
    if let Err(e) = std::fs::remove_file(path) {
        tracing::warn!(instance, stage, "cannot remove {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_lists_the_owner_and_the_temporaries() {
        let d = tempfile::tempdir().unwrap();
        let j = Journal::start(d.path(), 42, 1000);
        j.add("/pfs/a/.x.spillway-42-0");
        j.add("/pfs/a/b/.y.spillway-42-1");
        let path = d.path().join(DIR).join("42");
        let bytes = std::fs::read(&path).unwrap();
        let (uid, temps) = parse(&bytes).unwrap();
        assert_eq!(uid, 1000);
        assert_eq!(
            temps,
            ["/pfs/a/.x.spillway-42-0", "/pfs/a/b/.y.spillway-42-1"]
        );
        j.finish();
        assert!(!path.exists());
    }

    #[test]
    fn a_restart_removes_only_the_stages_own_temporaries_under_the_roots() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("pfs");
        std::fs::create_dir(&root).unwrap();
        let mine = root.join(".out.spillway-7-0");
        let other_stage = root.join(".out.spillway-8-0");
        let plain = root.join("out");
        for p in [&mine, &other_stage, &plain] {
            std::fs::write(p, b"x").unwrap();
        }
        let j = Journal::start(d.path(), 7, 0);
        for p in [&mine, &other_stage, &plain] {
            j.add(&p.display().to_string());
        }
        drop(j); // the server stopped: the journal stays
        let path = d.path().join(DIR).join("7");
        clean_one(1, &[root.display().to_string()], 7, &path);
        assert!(!mine.exists());
        assert!(other_stage.exists() && plain.exists());
        assert!(!path.exists());
    }
}
