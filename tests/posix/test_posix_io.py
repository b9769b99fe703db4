"""POSIX behaviour of a Spillway mount: file data and its state. pread/pwrite at random
offsets and across stripe boundaries, `spillway stripes`, sparse files, truncate and
ftruncate, fsync/fdatasync, flock and fcntl range locks between processes, shared mmap,
and a 300 MB sha256 round trip.

`striped_root` runs a test twice: on the module's default cluster (8 MiB stripes) and on
a second one with 64 KiB stripes, so that the same offsets cross many stripe boundaries.
"""

import errno
import fcntl
import hashlib
import mmap
import os
import random
import struct
import subprocess
import time

import pytest

import spwhelpers as H
from spwhelpers import MiB, assert_errno, p

CLUSTER_OPTS = {"servers": 2, "capacity": "4G"}

SMALL_STRIPE = "64K"


@pytest.fixture(params=["stripe8M", "stripe64K"])
def striped_root(request, fresh_dir):
    """(directory, stripe size in bytes): on the default cluster and on a 64 KiB-stripe one."""
    if request.param == "stripe8M":
        size = 8 * MiB
        if H.LOCAL:
            return fresh_dir(), size
        c = request.getfixturevalue("cluster")
    else:
        size = H.parse_size(SMALL_STRIPE)
        if H.LOCAL:
            return fresh_dir(), size
        c = request.getfixturevalue("clusters")(**{**CLUSTER_OPTS, "stripe_size": SMALL_STRIPE})
    got = int(c.instance()["stripe_size"])
    assert got == size, f"instance.json stripe_size {got}, expected {size}"
    return fresh_dir(c), size


# =========================================================================== pread/pwrite, stripes


def test_pread_pwrite_random_offsets(striped_root):
    """Random pwrites (some beyond EOF, many crossing stripe boundaries) against an
    in-memory model; random preads including beyond EOF; then again after reopen."""
    root, stripe = striped_root
    rng = random.Random(20240601)
    span = 3 * stripe + 12345
    path = p(root, "f")
    model = bytearray()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    hot = [stripe - 1, stripe, 2 * stripe - 7, 3 * stripe - 1]
    for i in range(150):
        if i % 3 == 0:
            off = max(0, rng.choice(hot) - rng.randrange(0, 300))
        else:
            off = rng.randrange(0, span)
        n = rng.randrange(1, min(3 * stripe, 300_000))
        data = rng.randbytes(n)
        assert os.pwrite(fd, data, off) == n
        if off > len(model):
            model.extend(bytes(off - len(model)))
        model[off:off + n] = data
    assert os.fstat(fd).st_size == len(model)

    def check_reads(fd):
        for _ in range(150):
            off = rng.randrange(0, len(model) + 2 * stripe)
            n = rng.randrange(0, 200_000)
            got = H.pread_all(fd, n, off)
            assert got == bytes(model[off:off + n]), f"pread({n}, {off}) mismatch (file size {len(model)})"
        assert os.pread(fd, 10, len(model)) == b""
        assert os.pread(fd, 10, len(model) + 10 * stripe) == b""
        assert H.pread_all(fd, len(model) + 100, 0) == bytes(model)

    check_reads(fd)
    os.close(fd)
    assert os.stat(path).st_size == len(model)
    H.drop_file_cache(path)
    fd = os.open(path, os.O_RDONLY)
    check_reads(fd)
    os.close(fd)


def test_write_across_stripe_boundary(striped_root):
    root, stripe = striped_root
    path = p(root, "f")
    data = os.urandom(1000)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    pwrite_off = stripe - 500
    H.pwrite_all(fd, data, pwrite_off)
    os.close(fd)
    H.drop_file_cache(path)
    got = H.read_file(path)
    assert len(got) == stripe + 500
    assert got[:pwrite_off] == bytes(pwrite_off)
    assert got[pwrite_off:] == data
    fd = os.open(path, os.O_RDONLY)
    assert os.pread(fd, 600, stripe - 300) == data[200:800]
    os.close(fd)


@pytest.mark.spillway_only
def test_stripes_listing(fresh_dir, clusters):
    """`spillway stripes` on a dense file: one line per stripe, in order, byte counts that
    add up, and (with 64 KiB stripes and 17 stripes) more than one server used."""
    c = clusters(**{**CLUSTER_OPTS, "stripe_size": SMALL_STRIPE})
    stripe = H.parse_size(SMALL_STRIPE)
    path = p(fresh_dir(c), "f")
    size = 16 * stripe + 1000
    H.write_file(path, os.urandom(size))
    lines = c.stripes(path)
    assert [k for k, *_ in lines] == list(range(17)), lines
    for k, server, addr, n in lines:
        assert 0 <= server < c.servers
        assert addr in c.instance()["servers"], f"{addr} is not one of the instance's servers"
        assert addr == c.instance()["servers"][server], "index and address must agree"
        assert n == min(stripe, size - k * stripe), f"stripe {k} holds {n} bytes"
    assert len({s for _, s, _, _ in lines}) == c.servers, "17 stripes should use every server"


# =========================================================================== sparse files


def test_sparse_file(striped_root):
    root, stripe = striped_root
    path = p(root, "sparse")
    far = 100 * MiB
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"head", 0)
    os.pwrite(fd, b"tail", far)
    assert os.fstat(fd).st_size == far + 4
    os.close(fd)
    assert os.stat(path).st_size == far + 4
    H.drop_file_cache(path)
    fd = os.open(path, os.O_RDONLY)
    assert os.pread(fd, 8, 0) == b"head" + bytes(4)
    assert H.pread_all(fd, MiB, 50 * MiB) == bytes(MiB)
    assert H.pread_all(fd, 8, far - 4) == bytes(4) + b"tail"
    assert os.pread(fd, 100, far + 4) == b""
    # the whole hole reads as zeros
    h = hashlib.sha256()
    off = 0
    while True:
        b = os.pread(fd, 4 * MiB, off)
        if not b:
            break
        h.update(b)
        off += len(b)
    os.close(fd)
    assert off == far + 4
    expect = hashlib.sha256()
    expect.update(b"head")
    zeros = bytes(4 * MiB)
    left = far - 4
    while left:
        n = min(left, len(zeros))
        expect.update(zeros[:n])
        left -= n
    expect.update(b"tail")
    assert h.hexdigest() == expect.hexdigest(), "hole did not read back as zeros"


# =========================================================================== truncate


def test_truncate_down_and_up(striped_root):
    root, stripe = striped_root
    path = p(root, "f")
    size = 3 * stripe + 777
    data = os.urandom(size)
    H.write_file(path, data)

    os.truncate(path, stripe + 5)
    assert os.stat(path).st_size == stripe + 5
    assert H.read_file(path) == data[:stripe + 5]

    os.truncate(path, 2 * stripe + 9)  # up: the new range reads as zeros, old data must not return
    got = H.read_file(path)
    assert len(got) == 2 * stripe + 9
    assert got[:stripe + 5] == data[:stripe + 5]
    assert got[stripe + 5:] == bytes(stripe + 4), "truncate up resurrected old data"

    fd = os.open(path, os.O_RDWR)
    os.ftruncate(fd, 10)
    assert os.fstat(fd).st_size == 10
    os.pwrite(fd, b"XY", 3 * stripe)  # extend past the old end again with a write
    os.close(fd)
    H.drop_file_cache(path)
    got = H.read_file(path)
    assert len(got) == 3 * stripe + 2
    assert got[:10] == data[:10]
    assert got[10:3 * stripe] == bytes(3 * stripe - 10), "bytes cut by truncate came back after a later write"
    assert got[3 * stripe:] == b"XY"

    os.truncate(path, 0)
    assert os.stat(path).st_size == 0
    assert H.read_file(path) == b""


def test_ftruncate_grow_then_write(fs_root):
    path = p(fs_root, "f")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"abc")
    os.ftruncate(fd, 5000)
    assert os.fstat(fd).st_size == 5000
    assert os.pread(fd, 10, 0) == b"abc" + bytes(7)
    os.pwrite(fd, b"z", 4999)
    assert H.pread_all(fd, 6000, 0) == b"abc" + bytes(4996) + b"z"
    os.close(fd)
    assert os.stat(path).st_size == 5000


def test_truncate_errors(fs_root):
    path = p(fs_root, "f")
    H.write_file(path, b"abc")
    os.mkdir(p(fs_root, "d"))
    assert_errno(errno.EISDIR, os.truncate, p(fs_root, "d"), 0)
    assert_errno(errno.ENOENT, os.truncate, p(fs_root, "missing"), 0)
    assert_errno(errno.EINVAL, os.truncate, path, -1)
    fd = os.open(path, os.O_RDONLY)
    assert_errno(errno.EINVAL, os.ftruncate, fd, 0)  # Linux: fd not open for writing
    os.close(fd)
    assert H.read_file(path) == b"abc"


# =========================================================================== fsync


def test_fsync_fdatasync(fs_root):
    path = p(fs_root, "f")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    data = os.urandom(3 * MiB + 17)
    H.pwrite_all(fd, data, 0)
    os.fsync(fd)
    os.pwrite(fd, b"more", len(data))
    os.fdatasync(fd)
    fd2 = os.open(path, os.O_RDONLY)
    assert H.pread_all(fd2, len(data) + 10, 0) == data + b"more"
    os.fsync(fd2)  # fsync of a read-only descriptor is allowed
    os.close(fd2)
    os.close(fd)
    dfd = os.open(fs_root, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)  # and of a directory
    os.close(dfd)
    os.sync()
    assert H.read_file(path) == data + b"more"


# =========================================================================== locks


def _child(fn):
    """Run fn() in a forked child; return what it returns (picklable) or raise its OSError."""
    return H.as_user(os.getuid(), os.getgid(), fn, groups=os.getgroups())


def test_flock_conflicts_between_open_file_descriptions(fs_root):
    path = p(fs_root, "f")
    H.write_file(path, b"x")
    fd1 = os.open(path, os.O_RDWR)
    fd2 = os.open(path, os.O_RDWR)  # a second open file description, same process
    fcntl.flock(fd1, fcntl.LOCK_EX)
    with pytest.raises(BlockingIOError) as ei:
        fcntl.flock(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert ei.value.errno == errno.EWOULDBLOCK
    with pytest.raises(BlockingIOError):
        fcntl.flock(fd2, fcntl.LOCK_SH | fcntl.LOCK_NB)

    def child_try():
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return "locked"
        except OSError as e:
            return e.errno

    assert _child(child_try) == errno.EWOULDBLOCK, "another process must see the flock too"
    fcntl.flock(fd1, fcntl.LOCK_UN)
    fcntl.flock(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fcntl.flock(fd2, fcntl.LOCK_UN)
    # shared locks coexist
    fcntl.flock(fd1, fcntl.LOCK_SH)
    fcntl.flock(fd2, fcntl.LOCK_SH | fcntl.LOCK_NB)
    os.close(fd1)
    os.close(fd2)
    assert _child(child_try) == "locked", "closing releases flocks"


FLOCK_FMT = "hhqqi4x"  # struct flock on x86_64/aarch64 Linux


def _getlk(fd, ltype, start, length):
    res = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(FLOCK_FMT, ltype, os.SEEK_SET, start, length, 0))
    l_type, _, l_start, l_len, l_pid = struct.unpack(FLOCK_FMT, res)
    return l_type, l_start, l_len, l_pid


def test_fcntl_range_locks_between_processes(fs_root):
    path = p(fs_root, "f")
    H.write_file(path, bytes(4096))
    fd = os.open(path, os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 100, 0)  # bytes 0..99
    fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 100, 1000)  # bytes 1000..1099
    parent = os.getpid()

    def child_probe():
        cfd = os.open(path, os.O_RDWR)
        out = {}
        for name, (kind, length, start) in {
            "overlap_ex": (fcntl.LOCK_EX, 100, 50),
            "overlap_sh": (fcntl.LOCK_SH, 10, 0),
            "disjoint_ex": (fcntl.LOCK_EX, 100, 200),
            "shared_on_shared": (fcntl.LOCK_SH, 10, 1000),
            "ex_on_shared": (fcntl.LOCK_EX, 10, 1050),
        }.items():
            try:
                fcntl.lockf(cfd, kind | fcntl.LOCK_NB, length, start)
                out[name] = "ok"
                fcntl.lockf(cfd, fcntl.LOCK_UN, length, start)
            except OSError as e:
                out[name] = e.errno
        out["getlk"] = _getlk(cfd, fcntl.F_WRLCK, 0, 10)
        out["getlk_free"] = _getlk(cfd, fcntl.F_WRLCK, 500, 10)[0]
        os.close(cfd)
        return out

    r = _child(child_probe)
    assert r["overlap_ex"] in (errno.EAGAIN, errno.EACCES), r
    assert r["overlap_sh"] in (errno.EAGAIN, errno.EACCES), r
    assert r["disjoint_ex"] == "ok", r
    assert r["shared_on_shared"] == "ok", r
    assert r["ex_on_shared"] in (errno.EAGAIN, errno.EACCES), r
    l_type, l_start, l_len, l_pid = r["getlk"]
    assert (l_type, l_start, l_len, l_pid) == (fcntl.F_WRLCK, 0, 100, parent), r["getlk"]
    assert r["getlk_free"] == fcntl.F_UNLCK
    fcntl.lockf(fd, fcntl.LOCK_UN, 100, 0)
    r = _child(child_probe)
    assert r["overlap_ex"] == "ok", "unlocked range must be free"
    os.close(fd)


# =========================================================================== mmap


def test_shared_mmap(fs_root):
    path = p(fs_root, "f")
    size = 3 * 4096 + 100
    H.write_file(path, b"." * size)
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    mm[0:5] = b"HELLO"
    mm[4094:4100] = b"across"  # spans a page boundary
    mm[size - 3:size] = b"END"
    mm.flush()  # msync
    mm.close()
    os.close(fd)
    expect = bytearray(b"." * size)
    expect[0:5] = b"HELLO"
    expect[4094:4100] = b"across"
    expect[size - 3:] = b"END"
    assert H.read_file(path) == bytes(expect)

    # another process maps it, writes, msyncs; we see it with read() and through our map
    fd = os.open(path, os.O_RDWR)
    mine = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def child():
        cfd = os.open(path, os.O_RDWR)
        m = mmap.mmap(cfd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        seen = bytes(m[0:5])
        m[8192:8197] = b"CHILD"
        m.flush()
        m.close()
        os.close(cfd)
        return seen

    assert _child(child) == b"HELLO"
    assert mine[8192:8197] == b"CHILD"
    assert os.pread(fd, 5, 8192) == b"CHILD"
    mine.close()
    os.close(fd)
    H.drop_file_cache(path)
    expect[8192:8197] = b"CHILD"
    assert H.read_file(path) == bytes(expect)


def test_a_write_shows_at_once_through_every_other_descriptor_and_mapping(fs_root):
    """A file opened to be written from the start goes around the page cache
    (docs/data-plane.md, "Writes go around the page cache"): the pages another
    descriptor or a shared mapping holds must still show each write at once, and a
    mapping's dirty pages must reach a read through the writing descriptor."""
    path = p(fs_root, "f")
    writer = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)  # made: direct
    os.write(writer, b"a" * 3 * 4096)
    reader = os.open(path, os.O_RDONLY)
    assert os.pread(reader, 4, 4096) == b"aaaa"  # now in the page cache
    os.pwrite(writer, b"bbbb", 4096)
    assert os.pread(reader, 4, 4096) == b"bbbb"
    mm = mmap.mmap(writer, 3 * 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    assert mm[4096:4100] == b"bbbb"
    mm[8192:8196] = b"cccc"  # dirty in the mapping, not yet written back
    assert os.pread(writer, 4, 8192) == b"cccc"
    assert os.pread(reader, 4, 8192) == b"cccc"
    os.pwrite(writer, b"dddd", 8192)
    assert mm[8192:8196] == b"dddd"
    mm.close()
    appender = os.open(path, os.O_WRONLY | os.O_APPEND)  # write-only: direct
    os.write(appender, b"zz")
    assert os.pread(reader, 6, 3 * 4096 - 4) == b"aaaazz"
    assert os.fstat(reader).st_size == 3 * 4096 + 2
    os.close(appender)
    os.close(writer)
    os.close(reader)
    H.drop_file_cache(path)
    expect = bytearray(b"a" * 3 * 4096 + b"zz")
    expect[4096:4100] = b"bbbb"
    expect[8192:8196] = b"dddd"
    assert H.read_file(path) == bytes(expect)


def _write_from_own_mapping(path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)  # made: direct
    try:
        os.write(fd, bytes(range(256)) * (8 * 1024))  # 2 MiB
        os.ftruncate(fd, 4 * MiB)
        mm = mmap.mmap(fd, 4 * MiB)
        with memoryview(mm) as view:
            n = os.pwrite(fd, view[:2 * MiB], 2 * MiB)  # the buffer is the file itself
        os.fsync(fd)
        same = mm[:2 * MiB] == mm[2 * MiB:]
        mm.close()
        return n, same
    finally:
        os.close(fd)


@pytest.mark.needs_root
@pytest.mark.timeout(120)
def test_a_write_from_a_mapping_of_the_file_itself_completes(fs_root, user):
    """Attack: an unprivileged user writes to a file that goes around the page cache
    from a shared mapping of that same file, so that the kernel must fault the
    buffer's pages in through the mount while it holds the write. The mount must
    answer both (no deadlock) and store the bytes."""
    d = p(fs_root, "selfmap")
    os.mkdir(d)
    os.chown(d, user.uid, user.gid)
    path = p(d, "f")
    assert user.run(_write_from_own_mapping, path) == (2 * MiB, True)
    H.drop_file_cache(path)
    assert H.read_file(path) == (bytes(range(256)) * (8 * 1024)) * 2


def test_mmap_write_extends_after_ftruncate(fs_root):
    path = p(fs_root, "f")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, 2 * MiB)
    mm = mmap.mmap(fd, 2 * MiB, mmap.MAP_SHARED)
    block = os.urandom(4096)
    for off in range(0, 2 * MiB, 64 * 1024):
        mm[off:off + 4096] = block
    mm.flush()
    mm.close()
    os.fsync(fd)
    os.close(fd)
    H.drop_file_cache(path)
    data = H.read_file(path)
    assert len(data) == 2 * MiB
    for off in range(0, 2 * MiB, 64 * 1024):
        assert data[off:off + 4096] == block
        assert data[off + 4096:off + 64 * 1024] == bytes(60 * 1024)


# =========================================================================== large file


@pytest.mark.timeout(900)
def test_large_file_300mb_sha256(fs_root):
    path = p(fs_root, "large")
    size = 300 * 1000 * 1000
    rng = random.Random(300)
    block = rng.randbytes(4 * MiB)
    h = hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    written, i = 0, 0
    t0 = time.monotonic()
    while written < size:
        n = min(len(block), size - written)
        piece = (i.to_bytes(8, "little") + block[8:n]) if n > 8 else block[:n]
        H.pwrite_all(fd, piece, written)
        h.update(piece)
        written += n
        i += 1
    os.close(fd)
    t_write = time.monotonic() - t0
    assert os.stat(path).st_size == size
    H.drop_file_cache(path)
    t0 = time.monotonic()
    got = H.sha256_file(path, bufsize=4 * MiB)
    t_read = time.monotonic() - t0
    print(f"\n300 MB: write+close {size / t_write / MiB:.0f} MiB/s, read {size / t_read / MiB:.0f} MiB/s")
    assert got == h.hexdigest()


# =========================================================================== the servers' page cache
def _resident_bytes(paths):
    """Bytes of these files in the page cache (util-linux `fincore`)."""
    if not paths:
        return 0
    r = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *paths],
                       capture_output=True, text=True, timeout=30, check=True)
    return sum(int(x) for x in r.stdout.split())


def _stripe_files(c, path):
    """The servers' stripe files of the file at `path` (named by its inode number)."""
    import glob

    name = f"{os.stat(path).st_ino:016x}."
    return [f for k in range(c.servers)
            for f in glob.glob(os.path.join(c.server_root(k), "**", name + "*"), recursive=True)]


@pytest.mark.parametrize("drop", ["on", "off"])
def test_a_stream_read_on_the_servers_host_leaves_no_second_copy_in_their_cache(
        drop, request, fresh_dir, spillway_bin, tmp_path):
    """A client on the servers' own host reads through their arena; its kernel caches the
    bytes, so the servers drop theirs behind each large read (`drop_behind_reads`). With
    the tunable off (the control: this test sees the servers' cache) they stay."""
    if H.LOCAL:
        pytest.skip("the servers' page cache is Spillway's")
    if request.getfixturevalue("cluster").netns:
        # test_netns.py runs this module on servers in other network namespaces: no
        # arena there, and a remote server's cache is the only copy on its host.
        pytest.skip("the servers are not on this client's host")
    if drop == "on":
        c = request.getfixturevalue("cluster")
    else:
        tun = tmp_path / "tunables"
        tun.write_text("drop_behind_reads = off\n")
        c = H.Cluster(spillway_bin, "nodrop", servers=2, capacity="1G")
        # Before `up`: a start that fails half-way is cleaned up too.
        request.addfinalizer(c.teardown)
        c.up(extra=["--tunables", str(tun)])
    path = p(fresh_dir(c), "stream")
    size = 32 * MiB
    data = random.Random(7).randbytes(size)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    H.pwrite_all(fd, data, 0)
    os.fsync(fd)
    os.close(fd)
    stripes = _stripe_files(c, path)
    assert stripes, "the file's stripe files were not found under the servers' roots"
    for f in stripes:
        H.drop_file_cache(f)
    H.drop_file_cache(path)
    if _resident_bytes(stripes) != 0:
        pytest.skip("the servers' storage keeps no page cache to drop (tmpfs?)")
    with open(path, "rb", buffering=0) as f:
        got = b"".join(iter(lambda: f.read(MiB), b""))
    assert got == data
    resident = _resident_bytes(stripes)
    if drop == "on":
        assert resident <= MiB, f"{resident} bytes of the stream stayed in the servers' cache"
    else:
        assert resident >= size // 2, f"only {resident} bytes cached with drop_behind_reads off"
