"""File times on a cache instance (issue 30, item 14; docs/cache.md, "File times"): the
cluster and PFS of test_cache.py (two servers caching a directory of a loop-mounted XFS).

- Times set with utime/futimens (`tar -x`, `cp -a`, `rsync -a`) survive the write-behind
  that lands seconds later, through the mount and on the PFS, a kill -9 of the servers
  before it too; a write after them moves the mtime again.
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

import spwhelpers as H
from spwhelpers import MiB, p
from test_cache import cache, fresh, pfs, wait_for_pfs  # noqa: F401  (module fixtures, own cluster)
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


def _mtime_ns(path):
    return os.stat(path).st_mtime_ns


def test_a_time_set_survives_a_kill_9_before_write_behind(cache):
    """Times set on files whose bytes are only in the cache, then every server killed
    with -9 before write-behind (its age is 5 s): after the restart the write-behind
    leaves the times set on the PFS files (the servers' write-behind logs carried them),
    not its own time."""
    c, shared = cache
    fresh(c.mnt, "tkill")
    files = {f"f{i}": os.urandom(3 * 64 * 1024 + 5 + i * 777) for i in range(6)}  # both servers
    want = {}
    for i, (name, data) in enumerate(files.items()):
        f = p(c.mnt, "tkill", name)
        H.write_file(f, data)
        t = 1_100_000_000_000_000_000 + i * 1_000_000_123
        os.utime(f, ns=(t, t))
        want[name] = t
    for i in range(c.servers):
        c.kill_server(i)
    dirty_at_kill = [
        n for n, d in files.items() if H.read_file(os.path.join(shared, "tkill", n)) != d
    ]
    for i in range(c.servers):
        c.start_server(i)
    for name, data in files.items():
        wait_for_pfs(os.path.join(shared, "tkill", name), data)
    # The last write-behind of a file lands a moment after its bytes: let it.
    time.sleep(2.0)
    for name, t in want.items():
        assert _mtime_ns(os.path.join(shared, "tkill", name)) == t, f"{name} on the PFS"
        assert _mtime_ns(p(c.mnt, "tkill", name)) == t, f"{name} through the mount"
    assert dirty_at_kill, "every file was on the PFS before the kill: nothing was tested"


@pytest.mark.parametrize("where", ["one server", "both servers"])
def test_a_write_after_a_time_set_moves_the_mtime(cache, where):
    """POSIX: a write after utime moves the mtime. The file's bytes are only in the
    cache when its time is set; the later write reaches one server of the file or both;
    after write-behind the mtime is the write's, through the mount and on the PFS (the
    server the write did not reach must not put the time set back)."""
    c, shared = cache
    d = f"twrite-{where.replace(' ', '-')}"
    fresh(c.mnt, d)
    f = p(c.mnt, d, "f")
    H.write_file(f, os.urandom(4 * 64 * 1024))  # stripes 0-3: servers 0, 1, 0, 1
    t = 1_000_000_000_000_000_000
    os.utime(f, ns=(t, t))
    assert _mtime_ns(f) == t
    time.sleep(0.05)
    before = time.time_ns()
    with open(f, "r+b") as out:
        out.write(b"y" * 100)  # stripe 0
        if where == "both servers":
            out.seek(64 * 1024 + 10)
            out.write(b"z" * 100)  # stripe 1
    after = time.time_ns()
    slack = 10**9
    seen = _mtime_ns(f)
    assert before - slack <= seen <= after + slack, "through the mount, at once"
    write_behind_now(os.path.join(c.mnt, d))
    time.sleep(WRITE_BEHIND)
    for what, path in (("mount", f), ("PFS", os.path.join(shared, d, "f"))):
        m = _mtime_ns(path)
        assert before - slack <= m <= after + slack, (
            f"{what}: mtime {m} is not the write's ({before}..{after}); the time set was {t}"
        )


def test_times_set_on_many_files_hold(cache):
    """1,500 small files, each written and given its own time at once (as `tar -x` does):
    every time holds through the mount at once, after write-behind, and on the PFS."""
    c, shared = cache
    d = fresh(c.mnt, "tmany")
    want = {}
    for i in range(1500):
        name = f"f{i:04d}"
        f = os.path.join(d, name)
        H.write_file(f, b"x" * (100 + i * 37))
        t = 1_200_000_000_000_000_000 + i * 1_000_003_001
        os.utime(f, ns=(t, t))
        want[name] = (stat.S_IFREG, 100 + i * 37, t)
    check_times(d, os.path.join(shared, "tmany"), want, "1,500 files")
    time.sleep(WRITE_BEHIND)
    assert_same_times(times_of(os.path.join(shared, "tmany")), want, "on the PFS, later")
