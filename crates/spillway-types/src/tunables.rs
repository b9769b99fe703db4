//! Every tunable of the data plane, in one place, with its default and the reason for it.
//! Servers and clients read an optional TOML/JSON-free `key = value` file into this
//! struct (see `Tunables::apply_file`); nothing is read from environment variables.

use std::time::Duration;

/// Largest stripe a file may use (and so the largest single data RPC payload).
pub const MAX_STRIPE_SIZE: u32 = 64 << 20;
/// Default stripe size for new files (DataWarp's and GekkoFS's choice of scale).
pub const DEFAULT_STRIPE_SIZE: u32 = 8 << 20;
/// Largest frame the wire accepts: one full stripe of data plus headers.
pub const MAX_FRAME_LEN: u32 = MAX_STRIPE_SIZE + (1 << 20);
/// Longest file name component (as Linux).
pub const MAX_NAME_LEN: usize = 255;
/// Longest symlink target and xattr value.
pub const MAX_SYMLINK_LEN: usize = 4096;
pub const MAX_XATTR_VALUE_LEN: usize = 65536;
pub const MAX_XATTR_NAME_LEN: usize = 255;

/// Most files one `StageFilesReq` may carry (a server refuses more with EINVAL).
pub const MAX_STAGE_BATCH_FILES: usize = 1024;

#[derive(Clone, Debug, PartialEq)]
pub struct Tunables {
    /// Deadline carried by every RPC. A call not answered by then fails with ETIMEDOUT.
    pub rpc_deadline: Duration,
    /// How long a client keeps retrying to reach a server that refuses connections (a
    /// restarting server) before failing the call with EIO.
    pub reconnect_window: Duration,
    /// Clients of a load-balanced instance: how long a read keeps trying to reach its
    /// replica before going on to the next one (another replica holds the same bytes,
    /// so there is no point waiting out a restart), and how long a replica found dead
    /// is left alone before it is tried again (docs/cache.md §6).
    pub replica_failover: Duration,
    pub replica_rest: Duration,
    /// Server threads executing requests (I/O and SQLite both block).
    pub server_workers: usize,
    /// Stripe files a server keeps open at once. The fd limit here is 20,000: never one
    /// fd per file, an LRU of this many.
    pub fd_cache_size: usize,
    /// Threads reading /dev/fuse in the client.
    pub fuse_threads: usize,
    /// How long the kernel may cache attributes and names (close-to-open holds anyway:
    /// every open fetches fresh attributes).
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
    /// How long the kernel may remember that a name is *not* there. 0 (the default):
    /// not at all, so an open or stat finds a name another mount (another node) just
    /// made, as NFS revalidates a negative entry at open; MPI-IO stats a shared file on
    /// every rank before rank 0 creates it. A site whose jobs each keep to one node may
    /// set it to save the round trip of repeated misses (`entry_ttl_ms` is a fair value).
    pub negative_ttl: Duration,
    /// Bytes of one open file's writes in flight to the servers (sent, not yet
    /// answered) before a writer waits for the oldest reply.
    pub writeback_per_file: usize,
    /// Write RPCs of one open file in flight at once.
    pub writeback_inflight: usize,
    /// Small contiguous writes are gathered up to this many bytes per write RPC.
    pub writeback_chunk: usize,
    /// Servers: most bytes of free capacity promised to one client connection (its
    /// space grant, docs/data-plane.md "Space grants"). A client writes behind only
    /// what its grant covers; past it, each write waits for the server's answer. Twice
    /// `writeback_per_file`, so that one streaming writer never waits for grant.
    pub grant_per_connection: u64,
    /// Servers: free space of the file system under a fragment never promised in
    /// grants (room for metadata and for what the page cache has not allocated yet).
    pub grant_disk_reserve: u64,
    /// Clients: a grant not drawn on for this long is given back to its server, so
    /// that idle clients do not hold space others need.
    pub grant_idle: Duration,
    /// Servers of a cache instance: how long a write that finds the fragment full
    /// waits for room (clean stripes evicted, dirty ones written behind to the PFS)
    /// before it is answered with what fit, or ENOSPC (docs/cache.md, "Eviction").
    /// Well below `rpc_deadline`: the client waits for the answer.
    pub cache_room_wait: Duration,
    /// Servers: how long a mount's write, close or fsync waits at most for the other
    /// mounts holding the file open to drop what they cached of it (docs/data-plane.md,
    /// "Consistency"). A mount that lets it pass is not waited for again until it
    /// answers a notice in time.
    pub notice_wait: Duration,
    /// Clients: `fcntl`/`flock` locks held at the servers and enforced across every
    /// mount (`locks = cluster`, the default), or left to this node's kernel
    /// (`locks = node`: no round trip per lock call, but no exclusion between nodes,
    /// like Lustre's `localflock`) for jobs whose lockers all run on one node, such as
    /// SQLite on one compute node.
    pub cluster_locks: bool,
    /// Clients: blocked lock requests (F_SETLKW, flock without LOCK_NB) one caller
    /// (uid) may have waiting at once in one mount; past it a blocking request fails
    /// with ENOLCK at once. The mount client is root's and serves every user of the
    /// node: without a bound one user's waiters would grow its memory (and once its
    /// threads: docs/security.md section 5) without end.
    pub lock_waiters_per_uid: usize,
    /// Servers: a write request of at least this many bytes (aligned to 4 KiB) goes to
    /// the disk with O_DIRECT instead of through the page cache (0: never). Streaming
    /// writes then cost no copy into the page cache, which was the servers' largest
    /// CPU cost, and are on the device as they arrive instead of at the next sync
    /// (docs/data-plane.md, "Direct writes"). Small writes stay buffered: a direct
    /// write waits for the device, and an fsync-heavy stream of 4 KiB writes is
    /// faster gathered by the page cache into one flush.
    pub direct_write_min: u64,
    /// A server drops its page cache behind reads of 256 KiB or more into a client's
    /// arena (a client on its own host, whose kernel caches the bytes itself): one copy
    /// of a streamed file in memory instead of two, and a cold stream reuses the pages
    /// it freed (docs/data-plane.md, "Reads drop behind them"). On by default.
    pub drop_behind_reads: bool,
    /// Largest kernel read/write request.
    pub max_write: u32,
    /// Kernel readahead window of the mount (16 MiB: measured against 4 MiB, cold
    /// streaming reads gained 10-15% with the data through shared memory).
    pub max_readahead: u32,
    /// Entries per readdir RPC page.
    pub readdir_page: u32,
    /// Clients: answer directory listings with each entry's attributes (FUSE
    /// READDIRPLUS), so that `find`, `ls -l` and `du` cost one round trip per
    /// directory instead of one more per name (`readdirplus = off` to compare).
    pub readdir_plus: bool,
    /// Client: a file opened to be written from the start (write-only, or created by
    /// this open) goes around the kernel's page cache (`FOPEN_DIRECT_IO`): each
    /// write(2) reaches the client from the caller's own pages, without the copy into
    /// the page cache and the pages it takes (`direct_writes = off` to compare).
    pub direct_writes: bool,
    /// Clients: bytes of shared memory (one sealed memfd, in slots of
    /// `writeback_chunk`) through which write and read data travel to and from
    /// servers on this same host, instead of through their TCP connections
    /// (docs/wire-protocol.md, "Shared-memory bulk"). 0: never. Memory is taken as
    /// slots are first used and kept up to the most ever in use at once.
    pub arena_size: usize,
    /// Servers: the largest client arena a server maps (0: it offers none).
    pub arena_max: usize,
    /// Clients: subdirectories of a listed directory whose listings are read ahead
    /// of a walk, a window kept ahead as the walk goes (0: none). A listing read
    /// ahead is served only while younger than the entry lifetime and only if
    /// nothing changed through the mount since (docs/data-plane.md, "Listings").
    pub readdir_ahead: usize,
    /// munged's socket, for the manager's admin credential to servers (None: libmunge's
    /// default, /run/munge/munge.socket.2).
    pub munge_socket: Option<std::path::PathBuf>,
    /// Bytes of a file one stage copy request covers: a large file is copied range by
    /// range (every server's share of a range at once), so a stage stops within one
    /// range when terminated and no request comes near `rpc_deadline`.
    pub stage_range: u64,
    /// Ranges of one large file a stage keeps in flight at each server: the next
    /// range's reads are already queued at the disk when one ends, and each server
    /// copies with as many threads.
    pub stage_ranges_in_flight: usize,
    /// Small files a stage hands one server in one request (`StageFilesReq`): a file of
    /// one stripe is created, filled and sized by the server holding it, so a batch
    /// costs one round trip and a file none of its own.
    pub stage_batch_files: usize,
    /// Storage servers: the PFS directories stages may touch (absolute, normal paths).
    /// Only this server's own configuration says so, never a request: without it the
    /// server refuses every stage. Set with `pfs_roots = /a:/b` (colons or commas).
    pub pfs_roots: Vec<String>,
}

impl Default for Tunables {
    fn default() -> Self {
        Tunables {
            rpc_deadline: Duration::from_secs(60),
            reconnect_window: Duration::from_secs(30),
            replica_failover: Duration::from_secs(1),
            replica_rest: Duration::from_secs(10),
            server_workers: 16,
            fd_cache_size: 4096,
            fuse_threads: 8,
            attr_ttl: Duration::from_secs(1),
            entry_ttl: Duration::from_secs(1),
            negative_ttl: Duration::ZERO,
            writeback_per_file: 32 << 20,
            writeback_inflight: 64,
            writeback_chunk: 1 << 20,
            grant_per_connection: 64 << 20,
            grant_disk_reserve: 32 << 20,
            grant_idle: Duration::from_secs(2),
            cache_room_wait: Duration::from_secs(20),
            notice_wait: Duration::from_secs(2),
            cluster_locks: true,
            lock_waiters_per_uid: 64,
            direct_write_min: 256 << 10,
            drop_behind_reads: true,
            max_write: 1 << 20,
            max_readahead: 16 << 20,
            readdir_page: 1024,
            readdir_plus: true,
            direct_writes: true,
            readdir_ahead: 8,
            arena_size: 256 << 20,
            arena_max: 1 << 30,
            munge_socket: None,
            stage_range: 256 << 20,
            stage_ranges_in_flight: 2,
            stage_batch_files: 32,
            pfs_roots: Vec::new(),
        }
    }
}

impl Tunables {
    /// Apply `key = value` lines (comments with `#`). Unknown keys and bad values are
    /// errors naming the line, so a typo never silently keeps a default.
    pub fn apply_text(&mut self, text: &str) -> Result<(), String> {
        for (n, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| format!("line {}: expected key = value", n + 1))?;
            let (k, v) = (k.trim(), v.trim());
            // A two-word setting: true for `yes`, false for `no`, else an error.
            let either = |yes: &str, no: &str| -> Result<bool, String> {
                match v {
                    _ if v == yes => Ok(true),
                    _ if v == no => Ok(false),
                    _ => Err(format!("line {}: {k}: `{yes}` or `{no}`, not {v}", n + 1)),
                }
            };
            let num = || -> Result<u64, String> {
                v.parse::<u64>()
                    .map_err(|_| format!("line {}: {k}: not a whole number: {v}", n + 1))
            };
            match k {
                "rpc_deadline_ms" => self.rpc_deadline = Duration::from_millis(num()?),
                "reconnect_window_ms" => self.reconnect_window = Duration::from_millis(num()?),
                "replica_failover_ms" => self.replica_failover = Duration::from_millis(num()?),
                "replica_rest_ms" => self.replica_rest = Duration::from_millis(num()?),
                "server_workers" => self.server_workers = (num()? as usize).max(1),
                "fd_cache_size" => self.fd_cache_size = (num()? as usize).max(16),
                "fuse_threads" => self.fuse_threads = (num()? as usize).max(1),
                "attr_ttl_ms" => self.attr_ttl = Duration::from_millis(num()?),
                "entry_ttl_ms" => self.entry_ttl = Duration::from_millis(num()?),
                "negative_ttl_ms" => self.negative_ttl = Duration::from_millis(num()?),
                "writeback_per_file" => self.writeback_per_file = num()? as usize,
                "writeback_inflight" => self.writeback_inflight = (num()? as usize).max(1),
                "writeback_chunk" => {
                    self.writeback_chunk = (num()? as usize).clamp(4096, MAX_STRIPE_SIZE as usize)
                }
                "grant_per_connection" => self.grant_per_connection = num()?,
                "grant_disk_reserve" => self.grant_disk_reserve = num()?,
                "grant_idle_ms" => self.grant_idle = Duration::from_millis(num()?),
                "cache_room_wait_ms" => self.cache_room_wait = Duration::from_millis(num()?),
                "notice_wait_ms" => self.notice_wait = Duration::from_millis(num()?),
                "locks" => self.cluster_locks = either("cluster", "node")?,
                "lock_waiters_per_uid" => {
                    self.lock_waiters_per_uid = (num()? as usize).clamp(1, 1 << 20)
                }
                "direct_write_min" => self.direct_write_min = num()?,
                "drop_behind_reads" => self.drop_behind_reads = either("on", "off")?,
                "max_write" => self.max_write = num()?.clamp(4096, 1 << 20) as u32,
                "max_readahead" => self.max_readahead = num()?.clamp(4096, 64 << 20) as u32,
                "readdir_page" => self.readdir_page = num()?.clamp(1, 65536) as u32,
                "readdirplus" => self.readdir_plus = either("on", "off")?,
                "direct_writes" => self.direct_writes = either("on", "off")?,
                "readdir_ahead" => self.readdir_ahead = (num()? as usize).min(256),
                "arena_size" => self.arena_size = num()?.min(16 << 30) as usize,
                "arena_max" => self.arena_max = num()?.min(64 << 30) as usize,
                "munge_socket" => self.munge_socket = Some(std::path::PathBuf::from(v)),
                "stage_range" => self.stage_range = num()?.clamp(1 << 20, 16 << 30),
                "stage_ranges_in_flight" => {
                    self.stage_ranges_in_flight = (num()? as usize).clamp(1, 16)
                }
                "stage_batch_files" => {
                    self.stage_batch_files = (num()? as usize).clamp(1, MAX_STAGE_BATCH_FILES)
                }
                "pfs_roots" => {
                    self.pfs_roots =
                        parse_pfs_roots(v).map_err(|e| format!("line {}: {e}", n + 1))?
                }
                _ => return Err(format!("line {}: unknown tunable {k}", n + 1)),
            }
        }
        Ok(())
    }

    pub fn apply_file(&mut self, path: &std::path::Path) -> Result<(), String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        self.apply_text(&text)
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// `pfs_roots`: absolute paths separated by colons or commas, each without `.` or `..`
/// components (a root is compared with request paths component by component).
pub fn parse_pfs_roots(v: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for r in v.split([':', ',']).map(str::trim).filter(|r| !r.is_empty()) {
        let normal = std::path::Path::new(r).components().all(|c| {
            matches!(
                c,
                std::path::Component::RootDir | std::path::Component::Normal(_)
            )
        });
        if !r.starts_with('/') || !normal || r.split('/').any(|c| c == ".") {
            return Err(format!(
                "pfs_roots: {r:?} is not an absolute path without . or .."
            ));
        }
        // Without the trailing slashes, as the manager writes them.
        let t = r.trim_end_matches('/');
        out.push(if t.is_empty() {
            "/".into()
        } else {
            t.to_string()
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applies_and_rejects() {
        let mut t = Tunables::default();
        t.apply_text("# c\nfuse_threads = 3\nrpc_deadline_ms=500 # x\n")
            .unwrap();
        assert_eq!(t.fuse_threads, 3);
        assert_eq!(t.rpc_deadline, Duration::from_millis(500));
        assert!(t.apply_text("bogus = 1").unwrap_err().contains("unknown"));
        assert!(t
            .apply_text("fuse_threads = x")
            .unwrap_err()
            .contains("line 1"));
        t.apply_text("pfs_roots = /pfs/a:/scratch/, /x\n").unwrap();
        assert_eq!(t.pfs_roots, vec!["/pfs/a", "/scratch", "/x"]);
        for bad in [
            "pfs_roots = rel",
            "pfs_roots = /a/../b",
            "pfs_roots = /a/./b",
        ] {
            assert!(t.apply_text(bad).is_err(), "{bad}");
        }
        t.apply_text("pfs_roots =").unwrap();
        assert!(t.pfs_roots.is_empty());
        assert!(t.cluster_locks);
        assert_eq!(t.lock_waiters_per_uid, 64);
        t.apply_text("lock_waiters_per_uid = 3").unwrap();
        assert_eq!(t.lock_waiters_per_uid, 3);
        t.apply_text("lock_waiters_per_uid = 0").unwrap();
        assert_eq!(t.lock_waiters_per_uid, 1, "at least one waiter");
        t.apply_text("locks = node").unwrap();
        assert!(!t.cluster_locks);
        assert!(t.readdir_plus);
        t.apply_text("readdirplus = off").unwrap();
        assert!(!t.readdir_plus);
        assert!(t.apply_text("readdirplus = no").is_err());
        t.apply_text("locks = cluster").unwrap();
        assert!(t.cluster_locks);
        assert!(t.apply_text("locks = yes").unwrap_err().contains("line 1"));
    }
}
