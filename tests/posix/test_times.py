"""File times set on a file that still has buffered writes (issue 30, item 13): `tar -x`,
`cp -p` and `cp -a` set the times on the open file before they close it, and the client's
write-behind of the file must not move them afterwards. Each result is compared with the
same operation on the local file system; the stat is taken 2 s after the close (the
write-behind used to land about 1 s after it and put the flush time in the mtime), and
once through a second mount.
"""

import os
import random
import shutil
import stat
import subprocess
import time

import pytest

import spwhelpers as H
from spwhelpers import MiB, p

CLUSTER_OPTS = {"servers": 2, "capacity": "4G"}

# Longer than the write-behind ever held a closed file's last run (about 1 s).
SETTLE = 2.0


def make_tree(root, seed, files=400):
    """A tree of `files` files of varied sizes (empty, a few bytes, KiB, MiB, across
    stripes) in nested directories, each file and directory with its own past mtime
    (nanoseconds included)."""
    rng = random.Random(seed)
    dirs = [root]
    for k in range(12):
        d = os.path.join(rng.choice(dirs), f"d{k}")
        os.mkdir(d)
        dirs.append(d)
    sizes = [0, 1, 100, 4095, 4096, 65_537, 300_000, MiB + 17, 3 * MiB + 5]
    for k in range(files):
        size = rng.choice(sizes) if k % 4 else rng.randrange(0, 20_000)
        f = os.path.join(rng.choice(dirs), f"f{k}")
        with open(f, "wb") as out:
            out.write(rng.randbytes(size))
        t = rng.randrange(1_000_000_000, 1_700_000_000) * 10**9 + rng.randrange(10**9)
        os.utime(f, ns=(t, t))
    for d in reversed(dirs[1:]):
        t = rng.randrange(1_000_000_000, 1_700_000_000) * 10**9 + rng.randrange(10**9)
        os.utime(d, ns=(t, t))


def times_of(root):
    """{relative path: (kind, size, mtime_ns)} of everything under root but root (the
    size of regular files only: a directory's differs between file systems)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            full = os.path.join(dirpath, n)
            st = os.lstat(full)
            size = st.st_size if stat.S_ISREG(st.st_mode) else None
            out[os.path.relpath(full, root)] = (stat.S_IFMT(st.st_mode), size, st.st_mtime_ns)
    return out


def assert_same_times(got, want, what):
    assert got.keys() == want.keys(), f"{what}: different names"
    wrong = sorted(k for k in want if got[k] != want[k])
    assert not wrong, (
        f"{what}: {len(wrong)} of {len(want)} entries differ in size or mtime, e.g. "
        + "; ".join(f"{k}: got {got[k]}, want {want[k]}" for k in wrong[:5])
    )


@pytest.fixture
def source(local_dir):
    src = os.path.join(local_dir, "src")
    os.mkdir(src)
    make_tree(src, seed=30)
    return src


def test_tar_x_keeps_every_mtime(fs_root, local_dir, source):
    """GNU tar sets each file's times with futimens on the open file, then closes it."""
    archive = os.path.join(local_dir, "tree.tar")
    subprocess.run(["tar", "-C", source, "--format=posix", "-cf", archive, "."], check=True)
    ref = os.path.join(local_dir, "ref")
    os.mkdir(ref)
    subprocess.run(["tar", "-C", ref, "-xf", archive], check=True)
    dst = p(fs_root, "x")
    os.mkdir(dst)
    subprocess.run(["tar", "-C", dst, "-xf", archive], check=True)
    time.sleep(SETTLE)
    want = times_of(ref)
    assert len(want) > 400
    assert_same_times(times_of(dst), want, "tar -x into the mount vs a local extraction")


@pytest.mark.parametrize("flags", ["-p", "-a"])
def test_cp_keeps_mtimes(fs_root, source, flags):
    dst = p(fs_root, "copy")
    subprocess.run(["cp", "-r", flags, source, dst], check=True)
    time.sleep(SETTLE)
    assert_same_times(times_of(dst), times_of(source), f"cp -r {flags}")


def _write_utime_close(path, t, after=b""):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, b"a" * 10_000)  # small: buffered in the client's write-behind
        os.utime(fd, ns=(t, t))
        if after:
            os.write(fd, after)
    finally:
        os.close(fd)


def test_utimens_on_open_file_with_buffered_writes(fs_root):
    """write, futimens, close, wait: the time set stays; ctime is not older than the set."""
    f = p(fs_root, "f")
    t = 1_234_567_890_123_456_789
    before = time.time_ns()
    _write_utime_close(f, t)
    time.sleep(SETTLE)
    st = os.stat(f)
    assert (st.st_size, st.st_mtime_ns, st.st_atime_ns) == (10_000, t, t)
    # POSIX: setting the times changes the ctime to now (1 s slack for coarse clocks)
    assert st.st_ctime_ns >= before - 10**9


def test_write_after_utimens_moves_mtime(fs_root):
    """A write issued after the utimens is a modification after it: the mtime moves on."""
    f = p(fs_root, "f")
    t = 1_234_567_890_123_456_789
    before = time.time_ns()
    _write_utime_close(f, t, after=b"b" * 100)
    time.sleep(SETTLE)
    st = os.stat(f)
    assert st.st_size == 10_100
    assert st.st_mtime_ns >= before - 10**9, "a write after utimens must move the mtime"


@pytest.mark.spillway_only
def test_utimens_seen_by_second_mount(mounts):
    a, b = mounts
    name = f"times-{time.monotonic_ns()}"
    os.mkdir(os.path.join(a, name))
    try:
        t = 1_111_111_111_222_222_222
        _write_utime_close(os.path.join(a, name, "f"), t)
        time.sleep(SETTLE)
        fb = os.path.join(b, name, "f")
        assert H.poll(lambda: os.path.exists(fb), timeout=2.0)
        st = os.stat(fb)
        assert (st.st_size, st.st_mtime_ns) == (10_000, t)
        assert os.stat(os.path.join(a, name, "f")).st_mtime_ns == t
    finally:
        shutil.rmtree(os.path.join(a, name), ignore_errors=True)
