"""One file shared by several mounts of one instance at once, as ranks of one MPI job
on several compute nodes share a checkpoint (issue 31; docs/data-plane.md,
"Consistency"). Each case holds on a scratch instance and on a cache instance:

* close-to-open with two writers: each mount writes its half and closes; each then
  reopens and reads the whole file right (the version the kernel's pages reflect is
  carried through a mount's own flushes only when nobody else changed the file);
* locks carry data: a counter incremented under `fcntl` byte-range locks and under
  whole-file locks from processes on two mounts ends exact (an unlock pushes the
  mount's writes, a granted lock drops what the mount caches if the file changed);
* sync-barrier-sync: after every writer's fsync, a reader's fsync makes its next read
  of the open file show what the others wrote (pages it read before are dropped).

The MPI-IO programs of tests/c (test_mpi_io.py) run the same promises through ROMIO."""

import fcntl
import multiprocessing as mp
import os
import struct
import time

import pytest

import spwhelpers as H
from spwhelpers import MiB

pytestmark = pytest.mark.spillway_only

CLUSTER_OPTS = {"servers": 3, "capacity": "4G", "stripe_size": "64K"}


@pytest.fixture(scope="module")
def cache_mounts(request, spillway_bin, pfs):
    """(mount 1, mount 2, the cached PFS directory) of a cache instance."""
    d = os.path.join(pfs, "shared")
    os.mkdir(d)
    c = H.Cluster(spillway_bin, "sharedcache", servers=2, capacity="2G", stripe_size="64K")
    failed_before = request.session.testsfailed
    try:
        c.up(extra=["--cache-pfs", d])
        mp2 = os.path.join(c.dir, "mnt2")
        c.mount(mp2)
        yield c.mnt, mp2, d
    finally:
        logs = H.kept_logs_dir(c.dir) if request.session.testsfailed > failed_before else None
        c.teardown(keep_logs_to=logs)


@pytest.fixture(params=["scratch", "cache"])
def two(request, mounts):
    """(a fresh directory on mount 1, the same on mount 2)."""
    if request.param == "scratch":
        m1, m2 = mounts
    else:
        m1, m2, _ = request.getfixturevalue("cache_mounts")
    name = f"{request.node.name}-{time.monotonic_ns()}".replace("[", "_").replace("]", "")
    a, b = os.path.join(m1, name), os.path.join(m2, name)
    os.mkdir(a)
    os.chmod(a, 0o777)
    assert H.poll(lambda: os.path.isdir(b), timeout=3)
    return a, b


def _pattern(seed, n):
    import random

    return random.Random(seed).randbytes(n)


def test_two_writers_of_one_file_each_read_the_others_half_after_close(two):
    """Issue 31, item 3. Each mount writes its half of one file (after reading the
    whole file, so each kernel holds pages of the other's half) and closes; each
    reopen reads both halves. Before: the mount that closed last kept serving its
    stale pages of the other's half for over 10 s (its close recorded the file's new
    version, which already held the other's change, as its own)."""
    a, b = two
    half = 3 * MiB + 4096
    for k in range(4):
        f = f"f{k}"
        H.write_file(os.path.join(a, f), bytes(2 * half))
        old = H.read_file(os.path.join(b, f))  # B's kernel caches the zeros
        assert old == bytes(2 * half)
        p1, p2 = _pattern(k, half), _pattern(100 + k, half)
        fa = os.open(os.path.join(a, f), os.O_RDWR)
        fb = os.open(os.path.join(b, f), os.O_RDWR)
        assert H.pread_all(fb, 2 * half, 0) == old
        os.pwrite(fa, p1, 0)
        os.pwrite(fb, p2, half)
        # Either order of closes.
        first, second = (fa, fb) if k % 2 == 0 else (fb, fa)
        os.close(first)
        os.close(second)
        want = p1 + p2
        assert H.read_file(os.path.join(a, f)) == want, f"mount 1, round {k}"
        assert H.read_file(os.path.join(b, f)) == want, f"mount 2, round {k}"


def _count(path, n, whole, q):
    """Add 1 to the 8-byte counter at offset 0 of `path`, `n` times, each under an
    exclusive fcntl lock (of the 8 bytes, or of the whole file)."""
    try:
        fd = os.open(path, os.O_RDWR)
        for _ in range(n):
            length = 0 if whole else 8
            fcntl.lockf(fd, fcntl.LOCK_EX, length, 0)
            v = struct.unpack("<q", os.pread(fd, 8, 0))[0]
            os.pwrite(fd, struct.pack("<q", v + 1), 0)
            fcntl.lockf(fd, fcntl.LOCK_UN, length, 0)
        os.close(fd)
        q.put(None)
    except Exception as e:  # reported by the parent
        q.put(repr(e))


@pytest.mark.parametrize("whole", [False, True], ids=["range", "whole-file"])
def test_a_counter_under_locks_from_two_mounts_is_exact(two, whole):
    """Issue 31, item 2: two processes per mount, 250 increments each, under fcntl
    locks: the counter ends at 1,000. Before: about half the increments were lost
    (the lock kept the writers apart, but an unlock left the increment buffered in
    its mount and a lock taken on the other mount read its stale cached page)."""
    a, b = two
    H.write_file(os.path.join(a, "counter"), struct.pack("<q", 0) + bytes(4088))
    assert H.poll(lambda: os.path.exists(os.path.join(b, "counter")), timeout=3)
    q = mp.get_context("fork").Queue()
    n = 250
    ps = [mp.get_context("fork").Process(target=_count, args=(os.path.join(d, "counter"), n, whole, q))
          for d in (a, b, a, b)]
    for p in ps:
        p.start()
    errs = [q.get(timeout=300) for _ in ps]
    for p in ps:
        p.join(timeout=30)
    assert errs == [None] * len(ps), errs
    for d in (a, b):
        got = struct.unpack("<q", H.read_file(os.path.join(d, "counter"))[:8])[0]
        assert got == n * len(ps), f"{d}: {got} of {n * len(ps)} increments"


def test_sync_barrier_sync_shows_every_writers_bytes_to_an_open_reader(two):
    """Issue 31, item 4, without MPI: mount 2 keeps the file open and has read it
    (its kernel caches the pages); mount 1 writes a range and fsyncs (the "sync" of
    the writer); then mount 2 fsyncs (its own "sync" after the barrier) and reads
    through the same descriptor: the new bytes, and the new size. Before: the reads
    came back stale."""
    a, b = two
    size = 2 * MiB
    H.write_file(os.path.join(a, "f"), bytes(size))
    fb = os.open(os.path.join(b, "f"), os.O_RDWR)
    fa = os.open(os.path.join(a, "f"), os.O_RDWR)
    try:
        assert H.pread_all(fb, size, 0) == bytes(size)
        for k in range(4):
            new = _pattern(k, 256 * 1024)
            at = k * 300_000
            os.pwrite(fa, new, at)
            os.pwrite(fa, b"tail%d" % k, size + k * 10)  # the file grows too
            os.fsync(fa)
            os.fsync(fb)
            assert os.pread(fb, len(new), at) == new, f"round {k}: stale bytes after sync-barrier-sync"
            assert os.fstat(fb).st_size == size + k * 10 + 5, f"round {k}: stale size"
            assert os.pread(fb, 5, size + k * 10) == b"tail%d" % k
    finally:
        os.close(fa)
        os.close(fb)


def test_a_reader_that_never_syncs_sees_what_another_mount_fsynced(two):
    """Issue 31, item 4, as ROMIO does it: MPI_File_sync makes no system call on a rank
    that wrote nothing since its last sync, so the reader here only reads, through a
    descriptor it holds open and whose pages its kernel caches. Once the writer's
    fsync returned, the reader's next read shows the new bytes and the new size: the
    home told the reader's mount to drop its pages before answering the writer."""
    a, b = two
    size = 2 * MiB
    H.write_file(os.path.join(a, "f"), bytes(size))
    fb = os.open(os.path.join(b, "f"), os.O_RDONLY)
    fa = os.open(os.path.join(a, "f"), os.O_RDWR)
    try:
        assert H.pread_all(fb, size, 0) == bytes(size)
        for k in range(4):
            new = _pattern(100 + k, 200_000)
            at = k * 450_000
            os.pwrite(fa, new, at)
            os.pwrite(fa, b"end%d" % k, size + k * 10)  # the file grows too
            os.fsync(fa)
            assert os.pread(fb, len(new), at) == new, f"round {k}: stale bytes"
            assert os.fstat(fb).st_size == size + k * 10 + 4, f"round {k}: stale size"
            assert os.pread(fb, 4, size + k * 10) == b"end%d" % k
            # And the other way round: the reader's pages of the whole file again.
            assert len(H.pread_all(fb, size + k * 10 + 4, 0)) == size + k * 10 + 4
    finally:
        os.close(fa)
        os.close(fb)


def test_a_truncate_on_one_mount_is_seen_by_a_reader_holding_the_file_open(two):
    """A truncate (SetAttr of the size) is told to the other mounts holding the file
    open before it returns: the reader's next fstat and read end at the new size."""
    a, b = two
    H.write_file(os.path.join(a, "t"), _pattern(7, 1 * MiB))
    fb = os.open(os.path.join(b, "t"), os.O_RDONLY)
    try:
        assert len(H.pread_all(fb, MiB, 0)) == MiB
        os.truncate(os.path.join(a, "t"), 1000)
        assert os.fstat(fb).st_size == 1000
        assert os.pread(fb, 4096, 0) == _pattern(7, 1 * MiB)[:1000]
    finally:
        os.close(fb)


def test_a_stopped_mount_holding_the_file_delays_its_writer_once(cluster):
    """A mount that holds a file open but does not answer the home's notices (its
    client stopped, a node cut off) delays a writer's fsync by `notice_wait` (2 s) once;
    it is not waited for again until it answers in time, and once running it catches
    up: its reads show the writer's bytes."""
    import signal

    mp3 = os.path.join(cluster.dir, "mnt-stopped")
    cluster.mount(mp3)
    d = os.path.join(cluster.mnt, f"stopped-{time.monotonic_ns()}")
    os.mkdir(d)
    path = os.path.join(d, "f")
    H.write_file(path, bytes(8192))
    there = os.path.join(mp3, os.path.basename(d), "f")
    assert H.poll(lambda: os.path.exists(there), timeout=3)
    f3 = os.open(there, os.O_RDONLY)
    pids = H.pids_mentioning(mp3)
    assert pids, "the third mount's client process"
    fa = os.open(path, os.O_RDWR)
    stopped = False
    try:
        assert os.pread(f3, 8192, 0) == bytes(8192)
        for p in pids:
            os.kill(p, signal.SIGSTOP)
        stopped = True
        took = []
        for k in range(3):
            t = time.monotonic()
            os.pwrite(fa, b"w%d" % k, 0)
            os.fsync(fa)
            took.append(time.monotonic() - t)
        assert took[0] >= 1.5, f"the first fsync did not wait for the stopped mount: {took}"
        assert max(took[1:]) < 1.5, f"a lagging mount was waited for again: {took}"
    finally:
        if stopped:
            for p in pids:
                os.kill(p, signal.SIGCONT)
        os.close(fa)
    try:
        assert H.poll(lambda: os.pread(f3, 2, 0) == b"w2", timeout=5)
    finally:
        os.close(f3)
        cluster.umount(mp3)


def test_a_reader_holding_a_file_open_across_a_server_restart_is_told_again(request, spillway_bin):
    """The servers restart (their sessions, and the opens they held, are gone) while a
    mount holds a file open. Once its watch is back the mount opens the file again at
    its home, so a later write and fsync on another mount still reaches the reader's
    open descriptor without a call of its own."""
    c = H.Cluster(spillway_bin, "restartnotice", servers=2, capacity="1G", stripe_size="64K")
    failed_before = request.session.testsfailed
    try:
        c.up()
        m2 = os.path.join(c.dir, "mnt2")
        c.mount(m2)
        H.write_file(os.path.join(c.mnt, "f"), bytes(256 * 1024))
        fb = os.open(os.path.join(m2, "f"), os.O_RDONLY)
        try:
            assert H.pread_all(fb, 256 * 1024, 0) == bytes(256 * 1024)
            for i in range(2):
                c.kill_server(i)
            for i in range(2):
                c.start_server(i)
            # The reader's pages again, fetched after the restart.
            assert H.poll(lambda: os.pread(fb, 4096, 0) == bytes(4096), timeout=20)
            fa = os.open(os.path.join(c.mnt, "f"), os.O_RDWR)
            try:
                for k in range(3):
                    new = _pattern(50 + k, 100_000)
                    os.pwrite(fa, new, k * 10_000)
                    os.fsync(fa)
                    assert os.pread(fb, len(new), k * 10_000) == new, f"round {k}: stale after the restart"
            finally:
                os.close(fa)
        finally:
            os.close(fb)
        c.umount(m2)
    finally:
        logs = H.kept_logs_dir(c.dir) if request.session.testsfailed > failed_before else None
        c.teardown(keep_logs_to=logs)
