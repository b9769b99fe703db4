"""File times on a cache instance (issue 30, item 14; docs/cache.md, "File times"): the
cluster and PFS of test_cache.py (two servers caching a directory of a loop-mounted XFS).

- Times set with utime/futimens (`tar -x`, `cp -a`, `rsync -a`) survive the write-behind
  that lands seconds later, through the mount and on the PFS.
- The mtime seen through the mount is the time of the write, not that of the
  write-behind.
- A directory's mtime and ctime move at once when a name is made in it.
- `O_TRUNC` of a file whose bytes are only in the cache moves its mtime and ctime.
"""

import os
import stat
import subprocess
import time

import pytest

from spwhelpers import MiB, p
from test_cache import cache, fresh, pfs  # noqa: F401  (module fixtures, own cluster)
from test_times import assert_same_times, make_tree, times_of

# Longer than write-behind ever waits for a file (its 5 s age, a pass a second).
WRITE_BEHIND = 12.0


def write_behind_now(root):
    """Every regular file under `root` (through the mount) written to the PFS now:
    `user.spillway.sync` (what dw_wait_sync_complete sets) returns once it is there."""
    for dirpath, _, filenames in os.walk(root):
        for n in filenames:
            f = os.path.join(dirpath, n)
            if stat.S_ISREG(os.lstat(f).st_mode):
                os.setxattr(f, "user.spillway.sync", b"1")


def check_times(mount_dir, pfs_dir, want, what):
    """Right away, after the write-behind forced, and after it would have run on its
    own: the same times through the mount and on the PFS."""
    assert_same_times(times_of(mount_dir), want, f"{what}, through the mount, at once")
    write_behind_now(mount_dir)
    assert_same_times(times_of(mount_dir), want, f"{what}, through the mount, written behind")
    assert_same_times(times_of(pfs_dir), want, f"{what}, on the PFS, written behind")


@pytest.fixture
def source(tmp_path):
    src = str(tmp_path / "src")
    os.mkdir(src)
    make_tree(src, seed=14, files=150)
    return src


@pytest.mark.parametrize("tool", ["tar", "cp", "rsync"])
def test_copies_into_the_cache_keep_every_mtime(cache, tmp_path, source, tool):
    """`tar -x` (futimens on the open file before its close), `cp -a` and `rsync -a`
    (utimensat after the close) into the mount: each time set stays, through the mount
    and on the PFS, before and after write-behind. They used to become the write-behind's
    time 5-10 s later."""
    c, shared = cache
    name = f"copy-{tool}"
    dst = fresh(c.mnt, name)
    if tool == "tar":
        archive = str(tmp_path / "tree.tar")
        subprocess.run(["tar", "-C", source, "--format=posix", "-cf", archive, "."], check=True)
        subprocess.run(["tar", "-C", dst, "-xf", archive], check=True)
    elif tool == "cp":
        subprocess.run(["cp", "-a", source + "/.", dst], check=True)
    else:
        subprocess.run(["rsync", "-a", source + "/", dst + "/"], check=True)
    want = times_of(source)
    assert len(want) > 150
    check_times(dst, os.path.join(shared, name), want, tool)
    # Write-behind on its own (the 5 s age) changes nothing either.
    time.sleep(WRITE_BEHIND)
    assert_same_times(times_of(dst), want, f"{tool}, through the mount, later")
    assert_same_times(times_of(os.path.join(shared, name)), want, f"{tool}, on the PFS, later")


def test_times_set_on_a_closed_dirty_file_survive_write_behind(cache):
    """write, close, fsync-free, utime on the path: the write-behind (5-10 s later) keeps
    the time set, on the PFS too."""
    c, shared = cache
    fresh(c.mnt, "utime")
    f = p(c.mnt, "utime", "f")
    with open(f, "wb") as out:
        out.write(os.urandom(3 * 64 * 1024 + 5))  # on both servers
    t = 1_234_567_890_123_456_789
    os.utime(f, ns=(t, t))
    time.sleep(WRITE_BEHIND)
    assert os.stat(f).st_mtime_ns == t
    assert os.stat(os.path.join(shared, "utime", "f")).st_mtime_ns == t


def test_the_mtime_is_the_write_s_not_the_write_behind_s(cache):
    """The mtime shown after a write does not jump when the write-behind lands, and the
    PFS file's mtime is the write's too (within the time the write took)."""
    c, shared = cache
    fresh(c.mnt, "wtime")
    f = p(c.mnt, "wtime", "f")
    before = time.time_ns()
    with open(f, "wb") as out:
        out.write(os.urandom(MiB + 3))
    after = time.time_ns()
    seen = os.stat(f).st_mtime_ns
    assert before - 10**9 <= seen <= after + 10**9
    time.sleep(WRITE_BEHIND)
    assert os.path.getsize(os.path.join(shared, "wtime", "f")) == MiB + 3
    for what, path in (("mount", f), ("PFS", os.path.join(shared, "wtime", "f"))):
        m = os.stat(path).st_mtime_ns
        assert before - 10**9 <= m <= after + 10**9, (
            f"{what}: mtime {(m - after) / 1e9:+.2f} s after the write ended"
        )


MAKERS = {
    "create": lambda path: os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)),
    "mkfifo": lambda path: os.mkfifo(path, 0o644),
    "mknod": lambda path: os.mknod(path, 0o644 | stat.S_IFIFO),
    "symlink": lambda path: os.symlink("target", path),
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_a_directory_s_times_move_at_once_when_a_name_is_made_in_it(cache, kind):
    """pjdfstest open/00 #33-34, mkfifo/00, mknod/00, symlink/00: the parent's mtime and
    ctime, stat'ed right after the create, are later than before it. They used to be read
    in parallel with the create and could be the old ones until the attributes expired."""
    c, _ = cache
    d = fresh(c.mnt, f"parent-{kind}")
    for k in range(5):
        before = os.stat(d)
        time.sleep(1.05)
        MAKERS[kind](os.path.join(d, f"n{k}"))
        st = os.stat(d)
        assert st.st_mtime_ns > before.st_mtime_ns, f"{kind} #{k}: parent mtime did not move"
        assert st.st_ctime_ns > before.st_ctime_ns, f"{kind} #{k}: parent ctime did not move"


def test_o_trunc_of_a_file_only_in_the_cache_moves_its_times(cache):
    """pjdfstest open/00 #43-44: the file's bytes are not written behind yet (the PFS file
    is empty); O_TRUNC empties it and moves its mtime and ctime."""
    c, shared = cache
    fresh(c.mnt, "otrunc")
    f = p(c.mnt, "otrunc", "f")
    with open(f, "wb") as out:
        out.write(b"x" * 1000)
    assert os.path.getsize(os.path.join(shared, "otrunc", "f")) == 0, "written behind already"
    before = os.stat(f)
    assert before.st_size == 1000
    time.sleep(1.05)
    os.close(os.open(f, os.O_WRONLY | os.O_TRUNC))
    st = os.stat(f)
    assert st.st_size == 0
    assert st.st_mtime_ns > before.st_mtime_ns, "O_TRUNC did not move the mtime"
    assert st.st_ctime_ns > before.st_ctime_ns, "O_TRUNC did not move the ctime"
