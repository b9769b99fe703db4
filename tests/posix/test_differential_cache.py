"""The randomized differential run of test_differential.py on a cache instance (issue 30,
item 14; docs/cache.md): the same state machine on the mount of two servers caching a
directory of a loop-mounted XFS (the cluster and PFS of test_cache.py), against a plain
directory on that same XFS beside the cached one. Every result and errno must match,
then the trees; and at the end of each run, once every descriptor is closed and the
cache has written its dirty bytes behind (`user.spillway.sync` on every file, what
`dw_wait_sync_complete` sets), the cached directory *on the PFS itself* must match the
reference tree too: what lands on the PFS is what users keep.

The reference is on the PFS's own file system (XFS), not the test machine's ext4: a
cache promises the PFS's semantics, so a difference between XFS and ext4 is no
difference of the cache's.

Size: SPILLWAY_DIFF_CACHE_EXAMPLES (default 30) runs of up to
SPILLWAY_DIFF_CACHE_STEPS (default 300) steps: about 6,000 operations, 30 s on a quiet
machine, 2 min on a busy one (hypothesis's first ten-odd runs are short whatever the
size). Seed and shrinking as in test_differential.py (SPILLWAY_DIFF_SEED,
SPILLWAY_DIFF_SHRINK). By hand, to look for differences: 20 x 3,000 with
SPILLWAY_DIFF_SEED=random, several times."""

import os
import stat
import time

import pytest

import spwhelpers as H
from test_cache import cache, pfs  # noqa: F401  (module fixtures: this module's own cluster)
from test_differential import DiffMachine, run_machine

EXAMPLES = int(os.environ.get("SPILLWAY_DIFF_CACHE_EXAMPLES", "30"))
STEPS = int(os.environ.get("SPILLWAY_DIFF_CACHE_STEPS", "300"))

# The hidden name an open file unlinked keeps on the PFS (docs/cache.md, "Unlink") goes
# with the file's last close, which the kernel sends to the FUSE client after close(2)
# has returned: give it this long.
HIDDEN_PREFIX = ".spillway-unlinked-"
RELEASE_WAIT = 5.0


def write_behind_now(root):
    """Every regular file under `root` (through the mount) on the PFS now: setting
    `user.spillway.sync` returns once the file's dirty bytes are written behind."""
    for dirpath, _, filenames in os.walk(root):
        for n in filenames:
            f = os.path.join(dirpath, n)
            if stat.S_ISREG(os.lstat(f).st_mode):
                os.setxattr(f, "user.spillway.sync", b"1")


def hidden_names(root):
    return [os.path.join(d, n) for d, _, names in os.walk(root) for n in names if n.startswith(HIDDEN_PREFIX)]


class CacheDiffMachine(DiffMachine):
    MOUNT = None  # the cluster's mount point
    PFS_DIR = None  # the cached directory on the PFS (the mount's root)

    def pfs_path(self, rel=""):
        return os.path.join(self.PFS_DIR, os.path.relpath(self.roots[0], self.MOUNT), rel)

    def inherent_difference(self, op, path):
        """A directory holding the hidden name of an open file unlinked cannot be
        removed, nor renamed over, until that file's last close: ENOTEMPTY, as on NFS
        (docs/cache.md, "Unlink"). Only those calls are left out, and only while the
        PFS directory holds such a name."""
        try:
            return any(n.startswith(HIDDEN_PREFIX) for n in os.listdir(self.pfs_path(path)))
        except OSError:
            return False

    def more_checks(self, local_snapshot):
        write_behind_now(self.roots[0])
        pfs_root = self.pfs_path()
        deadline = time.monotonic() + RELEASE_WAIT
        while hidden_names(pfs_root) and time.monotonic() < deadline:
            time.sleep(0.1)
        return H.diff_snapshots(H.snapshot_tree(pfs_root), local_snapshot, names=("pfs", "local"))


@pytest.fixture
def reference_dir(request, pfs):  # noqa: F811
    """A fresh directory on the PFS's XFS outside the cached directory."""
    parent = os.path.join(pfs, "reference")
    os.makedirs(parent, exist_ok=True)
    d = os.path.join(parent, request.node.name)
    os.mkdir(d)
    yield d
    H.force_rmtree(d)


@pytest.mark.timeout(1800)
def test_differential_on_a_cache(cache, reference_dir):  # noqa: F811
    c, shared = cache
    base = os.path.join(c.mnt, "differential")
    os.mkdir(base)
    try:
        CacheDiffMachine.BASES = (base, reference_dir)
        CacheDiffMachine.MOUNT = c.mnt
        CacheDiffMachine.PFS_DIR = shared
        run_machine(CacheDiffMachine, EXAMPLES, STEPS)
    finally:
        H.force_rmtree(base)
