"""Sparse files (issue 15, item 4): fallocate(2) in every mode Linux file systems commonly
support, counted against the instance's capacity; st_blocks from what the stripes really
occupy; SEEK_DATA/SEEK_HOLE answered from the stripes, so that du, cp --sparse and
tar --sparse keep a 1 TiB file holding 5 MiB small. 64 KiB stripes on 2 servers, so every
range here crosses stripes and servers."""

import ctypes
import errno
import os
import subprocess

import pytest

import spwhelpers as H
from spwhelpers import MiB

pytestmark = pytest.mark.spillway_only

CLUSTER_OPTS = {"servers": 2, "capacity": "4G", "stripe_size": "64K"}
KiB = 1024
TiB = 1 << 40

KEEP_SIZE, PUNCH_HOLE, COLLAPSE_RANGE, ZERO_RANGE, INSERT_RANGE, UNSHARE_RANGE = 0x1, 0x2, 0x8, 0x10, 0x20, 0x40
# How long st_blocks may trail data that reached the servers (docs/data-plane.md).
BLOCKS_LAG = 3.0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def fallocate(fd, mode, offset, length):
    if _libc.fallocate(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def blocks_bytes(path):
    return os.stat(path).st_blocks * 512


def data_regions(path):
    """[(start, end)] of the data SEEK_DATA/SEEK_HOLE find, walking the whole file."""
    out = []
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as e:
                assert e.errno == errno.ENXIO, e
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            assert start < end <= size, (start, end, size)
            out.append((start, end))
            pos = end
    finally:
        os.close(fd)
    return out


def pattern(n, seed):
    return bytes((seed * 31 + i * 7) & 0xFF for i in range(256)) * (n // 256)


def test_fallocate_default_grows_size_and_blocks(fs_root):
    p = os.path.join(fs_root, "f")
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fallocate(fd, 0, 0, 1 * MiB)
        st = os.fstat(fd)
        assert st.st_size == 1 * MiB
        assert st.st_blocks * 512 >= 1 * MiB, f"st_blocks {st.st_blocks} after allocating 1 MiB"
        os.posix_fallocate(fd, 3 * MiB, 256 * KiB)
        assert os.fstat(fd).st_size == 3 * MiB + 256 * KiB
        assert os.pread(fd, 64 * KiB, 1 * MiB - 100) == bytes(64 * KiB)
        # Allocating what is there already changes nothing; a shorter range no size.
        fallocate(fd, 0, 0, 4096)
        assert os.fstat(fd).st_size == 3 * MiB + 256 * KiB
    finally:
        os.close(fd)


def test_keep_size_allocates_without_growing(fs_root):
    p = os.path.join(fs_root, "f")
    with open(p, "wb") as f:
        f.write(b"0123456789")
    before = blocks_bytes(p)
    fd = os.open(p, os.O_RDWR)
    try:
        fallocate(fd, KEEP_SIZE, 0, 2 * MiB)
        st = os.fstat(fd)
        assert st.st_size == 10
        assert st.st_blocks * 512 >= 2 * MiB > before
        assert os.pread(fd, 100, 0) == b"0123456789"
        # Growing the file later reads zeros from the preallocated space.
        os.pwrite(fd, b"x", 1 * MiB)
        assert os.pread(fd, 10, 1 * MiB - 10) == bytes(10)
    finally:
        os.close(fd)


def test_punch_hole_reads_zeros_and_frees_blocks(fs_root):
    p = os.path.join(fs_root, "f")
    data = pattern(1 * MiB, 1)
    with open(p, "wb") as f:
        f.write(data)
        os.fsync(f.fileno())
    assert H.poll(lambda: blocks_bytes(p) >= 1 * MiB, timeout=BLOCKS_LAG), blocks_bytes(p)
    before = blocks_bytes(p)
    fd = os.open(p, os.O_RDWR)
    try:
        # Four whole stripes (on both servers), and a piece inside one stripe.
        fallocate(fd, PUNCH_HOLE | KEEP_SIZE, 256 * KiB, 256 * KiB)
        fallocate(fd, PUNCH_HOLE | KEEP_SIZE, 600 * KiB + 123, 5000)
        st = os.fstat(fd)
        assert st.st_size == 1 * MiB
        after = st.st_blocks * 512
        assert after <= before - 256 * KiB, f"st_blocks {before} -> {after} after punching 256 KiB"
        got = os.pread(fd, 1 * MiB, 0)
    finally:
        os.close(fd)
    want = bytearray(data)
    want[256 * KiB : 512 * KiB] = bytes(256 * KiB)
    want[600 * KiB + 123 : 600 * KiB + 5123] = bytes(5000)
    assert got == bytes(want)
    # Another open (fresh pages) reads the same.
    with open(p, "rb") as f:
        assert f.read() == bytes(want)
    assert (256 * KiB, 512 * KiB) not in data_regions(p)
    assert data_regions(p)[0] == (0, 256 * KiB)


def test_zero_range(fs_root):
    p = os.path.join(fs_root, "f")
    data = pattern(256 * KiB, 2)
    with open(p, "wb") as f:
        f.write(data)
    fd = os.open(p, os.O_RDWR)
    try:
        fallocate(fd, ZERO_RANGE, 10000, 100000)
        assert os.fstat(fd).st_size == 256 * KiB
        got = os.pread(fd, 256 * KiB, 0)
        # Past the end, with KEEP_SIZE: allocated, size kept; without: size grows.
        fallocate(fd, ZERO_RANGE | KEEP_SIZE, 256 * KiB, 1 * MiB)
        assert os.fstat(fd).st_size == 256 * KiB
        assert os.fstat(fd).st_blocks * 512 >= 1 * MiB + 200 * KiB
        fallocate(fd, ZERO_RANGE, 256 * KiB, 64 * KiB + 1)
        assert os.fstat(fd).st_size == 320 * KiB + 1
        assert os.pread(fd, 64 * KiB + 1, 256 * KiB) == bytes(64 * KiB + 1)
    finally:
        os.close(fd)
    want = bytearray(data)
    want[10000:110000] = bytes(100000)
    assert got == bytes(want)


def test_unsupported_modes_answer_eopnotsupp(fs_root):
    p = os.path.join(fs_root, "f")
    with open(p, "wb") as f:
        f.write(bytes(256 * KiB))
    fd = os.open(p, os.O_RDWR)
    try:
        for mode in (COLLAPSE_RANGE, INSERT_RANGE, UNSHARE_RANGE, PUNCH_HOLE):
            with pytest.raises(OSError) as e:
                fallocate(fd, mode, 64 * KiB, 64 * KiB)
            assert e.value.errno == errno.EOPNOTSUPP, f"mode {mode:#x}: {H.ename(e.value.errno)}"
        # ...and the supported ones still work afterwards (the kernel did not give up).
        fallocate(fd, KEEP_SIZE, 0, 4096)
    finally:
        os.close(fd)
    assert os.path.getsize(p) == 256 * KiB


def test_fallocate_counts_against_capacity(fresh_dir, clusters):
    c = clusters(servers=2, capacity="64M", stripe_size="64K")
    d = fresh_dir(c)
    cap = c.capacity()

    def free():
        s = os.statvfs(c.mnt)
        return s.f_bavail * s.f_frsize

    p = os.path.join(d, "big")
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fallocate(fd, 0, 0, 40 * MiB)
        assert os.fstat(fd).st_size == 40 * MiB
        f1 = free()
        assert f1 <= cap - 40 * MiB, f"free {f1} after allocating 40 of {cap}"
        # Too large for what is left: refused, nothing allocated, nothing grown.
        blocks = os.fstat(fd).st_blocks
        with pytest.raises(OSError) as e:
            fallocate(fd, 0, 40 * MiB, 40 * MiB)
        assert e.value.errno == errno.ENOSPC, H.ename(e.value.errno)
        st = os.fstat(fd)
        assert (st.st_size, st.st_blocks) == (40 * MiB, blocks)
        assert free() == f1, "a refused fallocate allocated something"
        with pytest.raises(OSError) as e:
            fallocate(fd, ZERO_RANGE | KEEP_SIZE, 40 * MiB, 1 * TiB)
        assert e.value.errno == errno.ENOSPC
        # A punch gives the space back: statfs shows it, and writes fit again.
        fallocate(fd, PUNCH_HOLE | KEEP_SIZE, 0, 40 * MiB)
        assert H.poll(lambda: free() >= f1 + 39 * MiB, timeout=5), (f1, free())
        assert os.fstat(fd).st_blocks * 512 < 1 * MiB
        os.pwrite(fd, b"z" * (20 * MiB), 0)
        os.fsync(fd)
        fallocate(fd, 0, 20 * MiB, 16 * MiB)
    finally:
        os.close(fd)
    with open(p, "rb") as f:
        assert f.read(20 * MiB) == b"z" * (20 * MiB)
    os.unlink(p)


# Data of the 1 TiB file: 5 regions of 1 MiB.
HUGE_DATA = [0, 3 * MiB, 100 << 30, 700 << 30, TiB - 1 * MiB]


def write_huge(path):
    with open(path, "wb") as f:
        for i, off in enumerate(HUGE_DATA):
            f.seek(off)
            f.write(pattern(1 * MiB, i + 3))
        f.truncate(TiB)


def test_one_tib_file_holding_5_mib(fs_root, tmp_path):
    p = os.path.join(fs_root, "huge")
    write_huge(p)
    assert os.path.getsize(p) == TiB
    # du: about 5 MiB, not 1.0T.
    assert H.poll(lambda: 5 * MiB <= blocks_bytes(p) <= 6 * MiB, timeout=BLOCKS_LAG), blocks_bytes(p)
    du = subprocess.run(["du", "-B1", p], capture_output=True, text=True, check=True).stdout
    assert 5 * MiB <= int(du.split()[0]) <= 6 * MiB, du
    # SEEK_DATA/SEEK_HOLE find exactly the data, as on a local file written alike.
    want = [(off, off + 1 * MiB) for off in HUGE_DATA]
    assert data_regions(p) == want
    local = tmp_path / "huge"
    write_huge(local)
    assert data_regions(str(local)) == want
    # cp --sparse=always, within the instance: small, same data where the data is.
    q = os.path.join(fs_root, "copy")
    subprocess.run(["cp", "--sparse=always", p, q], check=True, timeout=120)
    assert os.path.getsize(q) == TiB
    assert H.poll(lambda: blocks_bytes(q) <= 6 * MiB, timeout=BLOCKS_LAG), blocks_bytes(q)
    assert data_regions(q) == want
    with open(q, "rb") as f:
        for i, off in enumerate(HUGE_DATA):
            f.seek(off)
            assert f.read(1 * MiB) == pattern(1 * MiB, i + 3)
    # tar --sparse: a small archive that extracts to the same sparse file.
    tarball = tmp_path / "huge.tar"
    subprocess.run(["tar", "--sparse", "-cf", str(tarball), "-C", fs_root, "huge"], check=True, timeout=120)
    assert tarball.stat().st_size < 8 * MiB, tarball.stat().st_size
    out = tmp_path / "x"
    out.mkdir()
    subprocess.run(["tar", "-xf", str(tarball), "-C", str(out)], check=True, timeout=120)
    assert os.path.getsize(out / "huge") == TiB
    assert os.stat(out / "huge").st_blocks * 512 <= 6 * MiB
    with open(out / "huge", "rb") as f:
        for i, off in enumerate(HUGE_DATA):
            f.seek(off)
            assert f.read(1 * MiB) == pattern(1 * MiB, i + 3)


def test_seek_sees_unflushed_writes_and_the_end(fs_root):
    p = os.path.join(fs_root, "f")
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.ftruncate(fd, 10 * MiB)
        os.pwrite(fd, b"a" * 4096, 5 * MiB)  # still in this client's write-behind
        assert os.lseek(fd, 0, os.SEEK_DATA) == 5 * MiB
        assert os.lseek(fd, 5 * MiB, os.SEEK_HOLE) == 5 * MiB + 4096
        assert os.lseek(fd, 0, os.SEEK_HOLE) == 0
        assert os.lseek(fd, 6 * MiB, os.SEEK_HOLE) == 6 * MiB
        with pytest.raises(OSError) as e:
            os.lseek(fd, 6 * MiB, os.SEEK_DATA)
        assert e.value.errno == errno.ENXIO
        with pytest.raises(OSError) as e:
            os.lseek(fd, 10 * MiB, os.SEEK_HOLE)
        assert e.value.errno == errno.ENXIO
        # Data to the very end: the only hole is the one at the end of the file.
        os.pwrite(fd, b"b" * (64 * KiB), 10 * MiB - 64 * KiB)
        assert os.lseek(fd, 10 * MiB - 64 * KiB, os.SEEK_HOLE) == 10 * MiB
    finally:
        os.close(fd)


def test_second_mount_sees_the_same_blocks(cluster, fs_root):
    mp2 = os.path.join(cluster.dir, "mnt-sparse")
    cluster.mount(mp2)
    try:
        # Never 0 blocks for a file holding data once its writer closed it, on either
        # mount: tar --sparse archives such a file as all hole without reading it.
        for i in range(20):
            n = os.path.join(fs_root, f"small{i}")
            with open(n, "wb") as f:
                f.write(b"s" * 3000)
            other = os.path.join(mp2, os.path.relpath(n, cluster.mnt))
            assert os.stat(n).st_blocks > 0 and os.stat(other).st_blocks > 0, i
        p = os.path.join(fs_root, "f")
        with open(p, "wb") as f:
            f.write(pattern(3 * MiB, 9))
            f.seek(13 * MiB)
            f.write(b"end")
        q = os.path.join(mp2, os.path.relpath(p, cluster.mnt))
        # st_blocks trails the data by up to the attribute lifetime + the reports' delay.
        assert H.poll(lambda: 3 * MiB <= blocks_bytes(p) <= 4 * MiB, timeout=BLOCKS_LAG), blocks_bytes(p)
        assert H.poll(lambda: blocks_bytes(q) == blocks_bytes(p), timeout=BLOCKS_LAG), (
            blocks_bytes(p),
            blocks_bytes(q),
        )
        assert data_regions(q) == data_regions(p)
        # A punch on this mount shows on the other once its attributes expire.
        fd = os.open(p, os.O_RDWR)
        try:
            fallocate(fd, PUNCH_HOLE | KEEP_SIZE, 0, 3 * MiB)
        finally:
            os.close(fd)
        assert H.poll(lambda: blocks_bytes(q) < 1 * MiB, timeout=BLOCKS_LAG), blocks_bytes(q)
    finally:
        cluster.umount(mp2)
