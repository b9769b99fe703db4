"""POSIX behaviour of a Spillway mount, one focused test per behaviour, error codes included.

Every test takes `fs_root` (a fresh directory on the mount, or a local tmp dir with
SPILLWAY_TEST_TARGET=local). Tests marked spillway_only check Spillway's own contract
(statfs, capacity, stripes). `striped_root` runs a test twice: on the module's default
cluster (8 MiB stripes) and on a second one with 64 KiB stripes, so that the same
offsets cross many stripe boundaries.
"""

import errno
import fcntl
import hashlib
import mmap
import os
import random
import socket
import stat
import struct
import time

import pytest

import spwhelpers as H
from spwhelpers import MiB

CLUSTER_OPTS = {"servers": 2, "capacity": "4G"}
SMALL_STRIPE = "64K"


def assert_errno(expected, fn, *args, **kwargs):
    """fn(*args) must fail with errno `expected` (an int or a tuple of allowed ints)."""
    allowed = expected if isinstance(expected, tuple) else (expected,)
    try:
        fn(*args, **kwargs)
    except OSError as e:
        assert e.errno in allowed, (
            f"{getattr(fn, '__name__', fn)}{args}: expected {'/'.join(H.ename(a) for a in allowed)}, "
            f"got {H.ename(e.errno)} ({e})"
        )
        return e
    raise AssertionError(
        f"{getattr(fn, '__name__', fn)}{args}: expected {'/'.join(H.ename(a) for a in allowed)}, but it succeeded"
    )


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


def p(root, *names):
    return os.path.join(root, *names)


# =========================================================================== create/open/read/write


def test_create_write_read(fs_root):
    path = p(fs_root, "f")
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o666)
    assert os.write(fd, b"hello ") == 6
    assert os.write(fd, b"world\n") == 6
    assert os.fstat(fd).st_size == 12
    os.close(fd)
    st = os.stat(path)
    assert stat.S_ISREG(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o644, "mode 0666 with umask 022 must give 0644"
    assert st.st_size == 12
    assert st.st_nlink == 1
    assert st.st_uid == 0 and st.st_gid == 0
    assert H.read_file(path) == b"hello world\n"
    fd = os.open(path, os.O_RDONLY)
    assert os.read(fd, 5) == b"hello"
    assert os.read(fd, 100) == b" world\n"
    assert os.read(fd, 100) == b"", "read at EOF returns 0 bytes"
    assert os.lseek(fd, 0, os.SEEK_END) == 12
    assert os.lseek(fd, 6, os.SEEK_SET) == 6
    assert os.read(fd, 5) == b"world"
    os.close(fd)
    assert os.listdir(fs_root) == ["f"]


def test_open_rdwr_and_overwrite_middle(fs_root):
    path = p(fs_root, "f")
    H.write_file(path, b"0123456789")
    fd = os.open(path, os.O_RDWR)
    os.lseek(fd, 3, os.SEEK_SET)
    os.write(fd, b"abc")
    os.lseek(fd, 0, os.SEEK_SET)
    assert os.read(fd, 100) == b"012abc6789"
    os.close(fd)
    assert H.read_file(path) == b"012abc6789"


def test_o_trunc(fs_root):
    path = p(fs_root, "f")
    H.write_file(path, b"x" * 10000)
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    assert os.fstat(fd).st_size == 0
    os.write(fd, b"yz")
    os.close(fd)
    assert H.read_file(path) == b"yz"


def test_o_excl(fs_root):
    path = p(fs_root, "f")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.write(fd, b"first")
    os.close(fd)
    assert_errno(errno.EEXIST, os.open, path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.mkdir(p(fs_root, "d"))
    assert_errno(errno.EEXIST, os.open, p(fs_root, "d"), os.O_CREAT | os.O_EXCL | os.O_RDONLY, 0o600)
    os.symlink("nowhere", p(fs_root, "dangling"))
    assert_errno(errno.EEXIST, os.open, p(fs_root, "dangling"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    assert H.read_file(path) == b"first", "a failed O_EXCL must not truncate or change the file"
    assert not os.path.lexists(p(fs_root, "nowhere"))


def test_o_excl_race_one_winner(fs_root):
    """Two processes racing O_CREAT|O_EXCL on the same 200 names: exactly one wins each."""
    names = [f"n{i}" for i in range(200)]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        won = []
        for n in names:
            try:
                os.close(os.open(p(fs_root, n), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                won.append(n)
            except FileExistsError:
                pass
        os.write(w, ",".join(won).encode() + b"\n")
        os._exit(0)
    os.close(w)
    mine = set()
    for n in names:
        try:
            os.close(os.open(p(fs_root, n), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            mine.add(n)
        except FileExistsError:
            pass
    data = b""
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        data += b
    os.close(r)
    os.waitpid(pid, 0)
    theirs = set(x for x in data.decode().strip().split(",") if x)
    assert not (mine & theirs), f"both processes created {sorted(mine & theirs)[:5]}..."
    assert mine | theirs == set(names)
    assert sorted(os.listdir(fs_root)) == sorted(names)


def test_o_append_single_fd(fs_root):
    path = p(fs_root, "f")
    H.write_file(path, b"abc")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, b"def")  # O_APPEND ignores the file offset
    os.close(fd)
    assert H.read_file(path) == b"abcdef"


def test_o_append_two_appenders_interleave(fs_root):
    """Two processes (two open file descriptions) append 1,000 fixed-size records each,
    concurrently: nothing lost, nothing overwritten, every record whole."""
    path = p(fs_root, "log")
    H.write_file(path, b"")
    rec_len, count = 100, 1000

    def record(tag, i):
        head = f"{tag}{i:06d}:".encode()
        return head + bytes([ord(tag)]) * (rec_len - len(head) - 1) + b"\n"

    pids = []
    for tag in "AB":
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND)
                for i in range(count):
                    if os.write(fd, record(tag, i)) != rec_len:
                        code = 2
                os.close(fd)
            except BaseException:
                code = 1
            os._exit(code)
        pids.append(pid)
    for pid in pids:
        _, st = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(st) == 0
    data = H.read_file(path)
    assert len(data) == 2 * count * rec_len, f"size {len(data)}, expected {2 * count * rec_len}"
    recs = [data[i:i + rec_len] for i in range(0, len(data), rec_len)]
    seen = {"A": [], "B": []}
    for r in recs:
        tag = chr(r[0])
        assert tag in seen and r == record(tag, int(r[1:7])), f"torn record {r[:40]!r}"
        seen[tag].append(int(r[1:7]))
    for tag in "AB":
        assert seen[tag] == list(range(count)), f"records of {tag} lost or out of order"


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


# =========================================================================== unlink


def test_unlink(fs_root):
    path = p(fs_root, "f")
    H.write_file(path, b"abc")
    os.unlink(path)
    assert_errno(errno.ENOENT, os.stat, path)
    assert_errno(errno.ENOENT, os.open, path, os.O_RDONLY)
    assert_errno(errno.ENOENT, os.unlink, path)
    assert os.listdir(fs_root) == []
    os.mkdir(p(fs_root, "d"))
    assert_errno(errno.EISDIR, os.unlink, p(fs_root, "d"))
    H.write_file(path, b"new")
    assert H.read_file(path) == b"new", "a file recreated under an unlinked name is a new, fresh file"


def test_open_unlinked_file_stays_usable(fs_root):
    path = p(fs_root, "f")
    H.write_file(path, b"A" * 5000)
    fd = os.open(path, os.O_RDWR)
    other = os.open(path, os.O_RDONLY)
    os.unlink(path)
    assert not os.path.lexists(path)
    assert os.listdir(fs_root) == []
    st = os.fstat(fd)
    assert st.st_nlink == 0
    assert st.st_size == 5000
    os.pwrite(fd, b"B" * 3 * MiB, 4000)  # it can still grow, also across stripes
    os.fsync(fd)
    expect = b"A" * 4000 + b"B" * 3 * MiB
    assert H.pread_all(fd, len(expect) + 1, 0) == expect
    assert H.pread_all(other, len(expect) + 1, 0) == expect
    assert os.fstat(fd).st_size == len(expect)
    H.write_file(path, b"new file")  # the name is free: a new, different file
    assert H.read_file(path) == b"new file"
    assert H.pread_all(fd, 10, 0) == b"A" * 10
    os.close(other)
    os.close(fd)
    assert H.read_file(path) == b"new file"


# =========================================================================== mkdir/rmdir


def test_mkdir_rmdir(fs_root):
    d = p(fs_root, "d")
    os.mkdir(d, 0o750)
    st = os.stat(d)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o750
    assert os.listdir(d) == []
    assert_errno(errno.EEXIST, os.mkdir, d)
    H.write_file(p(fs_root, "f"), b"x")
    assert_errno(errno.EEXIST, os.mkdir, p(fs_root, "f"))
    assert_errno(errno.ENOENT, os.mkdir, p(fs_root, "missing", "sub"))
    assert_errno(errno.ENOTDIR, os.mkdir, p(fs_root, "f", "sub"))
    os.mkdir(p(d, "sub"))
    assert_errno(errno.ENOTEMPTY, os.rmdir, d)
    assert_errno(errno.ENOTDIR, os.rmdir, p(fs_root, "f"))
    assert_errno(errno.ENOENT, os.rmdir, p(fs_root, "missing"))
    assert_errno(errno.EINVAL, os.rmdir, p(d, "."))
    os.rmdir(p(d, "sub"))
    os.rmdir(d)
    assert_errno(errno.ENOENT, os.stat, d)
    assert os.listdir(fs_root) == ["f"]


def test_directory_names_reused_at_once(fs_root):
    """Lookups of subdirectories are answered from a short-lived client cache: every
    change this client makes to a name must take effect immediately."""
    d, e = p(fs_root, "d"), p(fs_root, "e")
    for _ in range(3):
        os.mkdir(d)
        assert_errno(errno.EEXIST, os.mkdir, d)
        os.rmdir(d)
        assert_errno(errno.ENOENT, os.stat, d)
    os.mkdir(d)
    assert_errno(errno.EEXIST, os.mkdir, d)  # the client now remembers d
    os.rename(d, e)
    assert_errno(errno.ENOENT, os.stat, d)
    os.mkdir(d)  # the old name is free at once
    assert_errno(errno.EEXIST, os.mkdir, e)
    os.rmdir(e)
    os.rename(d, e)
    assert sorted(os.listdir(fs_root)) == ["e"]
    H.write_file(p(fs_root, "f"), b"x")
    os.rename(p(fs_root, "f"), d)  # a file takes a former directory's name
    assert_errno(errno.ENOTDIR, os.listdir, d)
    assert_errno(errno.EEXIST, os.mkdir, d)
    os.unlink(d)
    os.mkdir(d)
    assert os.listdir(d) == []


def test_rmdir_nonempty_after_create_from_other_fd(fs_root):
    d = p(fs_root, "d")
    os.mkdir(d)
    assert os.listdir(d) == []  # the client has now seen it empty
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    os.close(os.open("viafd", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=dfd))
    assert_errno(errno.ENOTEMPTY, os.rmdir, d)
    os.unlink("viafd", dir_fd=dfd)
    assert os.listdir(d) == []
    pid = os.fork()  # now from another process
    if pid == 0:
        try:
            os.close(os.open(p(d, "child"), os.O_CREAT | os.O_WRONLY, 0o644))
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 0
    assert_errno(errno.ENOTEMPTY, os.rmdir, d)
    assert os.listdir(d) == ["child"]
    os.unlink(p(d, "child"))
    os.close(dfd)
    os.rmdir(d)
    assert not os.path.exists(d)


# =========================================================================== readdir


@pytest.mark.timeout(900)
def test_readdir_20000_entries(fs_root):
    d = p(fs_root, "big")
    os.mkdir(d)
    n = 20000
    names = [f"{i:05d}-" + "x" * (i % 50) for i in range(n)]
    t0 = time.monotonic()
    for name in names:
        os.close(os.open(p(d, name), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
    t_create = time.monotonic() - t0
    t0 = time.monotonic()
    listed = os.listdir(d)
    t_list = time.monotonic() - t0
    print(f"\n20,000 creates: {t_create:.1f} s ({n / t_create:.0f}/s); listdir: {t_list:.2f} s")
    assert len(listed) == len(set(listed)), f"{len(listed) - len(set(listed))} duplicate names in readdir"
    assert len(listed) == n, f"readdir returned {len(listed)} names, expected {n}"
    assert set(listed) == set(names)
    assert t_list < 120, f"listing 20,000 entries took {t_list:.0f} s"
    with os.scandir(d) as it:
        kinds = {e.name: e.is_file(follow_symlinks=False) for e in it}
    assert len(kinds) == n and all(kinds.values())
    # remove every other entry and list again: the rest complete, no ghosts
    for name in names[::2]:
        os.unlink(p(d, name))
    listed = os.listdir(d)
    assert sorted(listed) == sorted(names[1::2])


# =========================================================================== rename


def test_rename_file_same_dir(fs_root):
    a, b = p(fs_root, "a"), p(fs_root, "b")
    H.write_file(a, b"data")
    ino = os.stat(a).st_ino
    os.rename(a, b)
    assert_errno(errno.ENOENT, os.stat, a)
    assert H.read_file(b) == b"data"
    assert os.stat(b).st_ino == ino, "rename must keep the file (same inode)"
    assert os.stat(b).st_nlink == 1
    assert os.listdir(fs_root) == ["b"]


def test_rename_file_across_dirs(fs_root):
    os.mkdir(p(fs_root, "d1"))
    os.mkdir(p(fs_root, "d2"))
    a = p(fs_root, "d1", "a")
    H.write_file(a, b"payload" * 1000)
    fd = os.open(a, os.O_RDONLY)
    os.rename(a, p(fs_root, "d2", "b"))
    assert os.listdir(p(fs_root, "d1")) == []
    assert os.listdir(p(fs_root, "d2")) == ["b"]
    assert H.read_file(p(fs_root, "d2", "b")) == b"payload" * 1000
    assert os.pread(fd, 7, 0) == b"payload", "an open descriptor survives rename"
    os.close(fd)


def test_rename_dir_within_and_across(fs_root):
    d1, d2 = p(fs_root, "d1"), p(fs_root, "d2")
    os.mkdir(d1)
    os.mkdir(d2)
    os.makedirs(p(d1, "sub", "deep"))
    H.write_file(p(d1, "sub", "f"), b"f")
    H.write_file(p(d1, "sub", "deep", "g"), b"g")
    os.rename(p(d1, "sub"), p(d1, "sub2"))
    assert os.listdir(d1) == ["sub2"]
    assert H.read_file(p(d1, "sub2", "deep", "g")) == b"g"
    os.rename(p(d1, "sub2"), p(d2, "sub3"))
    assert os.listdir(d1) == []
    assert sorted(os.listdir(p(d2, "sub3"))) == ["deep", "f"]
    assert H.read_file(p(d2, "sub3", "f")) == b"f"
    assert H.read_file(p(d2, "sub3", "deep", "g")) == b"g"
    assert os.stat(p(d2, "sub3", "..")).st_ino == os.stat(d2).st_ino, "'..' of a moved directory"
    H.write_file(p(d2, "sub3", "deep", "new"), b"n")  # creating under the moved tree works
    assert sorted(os.listdir(p(d2, "sub3", "deep"))) == ["g", "new"]


def test_rename_replaces_existing_file(fs_root):
    a, b = p(fs_root, "a"), p(fs_root, "b")
    H.write_file(a, b"AAAA")
    H.write_file(b, b"BBBBBBBB")
    ino_a = os.stat(a).st_ino
    fd_b = os.open(b, os.O_RDONLY)
    os.rename(a, b)
    assert os.listdir(fs_root) == ["b"]
    assert H.read_file(b) == b"AAAA"
    assert os.stat(b).st_ino == ino_a
    assert os.pread(fd_b, 100, 0) == b"BBBBBBBB", "the replaced file stays readable through an open fd"
    assert os.fstat(fd_b).st_nlink == 0
    os.close(fd_b)


def test_rename_replaces_empty_dir(fs_root):
    d1, d2 = p(fs_root, "d1"), p(fs_root, "d2")
    os.mkdir(d1)
    os.mkdir(d2)
    H.write_file(p(d1, "f"), b"f")
    os.rename(d1, d2)
    assert os.listdir(fs_root) == ["d2"]
    assert os.listdir(d2) == ["f"]


def test_rename_onto_nonempty_dir(fs_root):
    d1, d2 = p(fs_root, "d1"), p(fs_root, "d2")
    os.mkdir(d1)
    os.mkdir(d2)
    H.write_file(p(d2, "f"), b"f")
    # Linux file systems return ENOTEMPTY; POSIX also allows EEXIST
    assert_errno((errno.ENOTEMPTY, errno.EEXIST), os.rename, d1, d2)
    assert sorted(os.listdir(fs_root)) == ["d1", "d2"]
    assert os.listdir(d2) == ["f"]


def test_rename_type_mismatch(fs_root):
    d, f = p(fs_root, "d"), p(fs_root, "f")
    os.mkdir(d)
    H.write_file(f, b"f")
    os.mkdir(p(fs_root, "e"))
    assert_errno(errno.ENOTDIR, os.rename, d, f)  # dir onto a file
    assert_errno(errno.EISDIR, os.rename, f, p(fs_root, "e"))  # file onto a dir
    assert_errno(errno.ENOTDIR, os.rename, f, p(fs_root, "f", "x"))
    assert sorted(os.listdir(fs_root)) == ["d", "e", "f"]
    assert H.read_file(f) == b"f"


def test_rename_dir_into_own_subdir(fs_root):
    d = p(fs_root, "d")
    os.makedirs(p(d, "sub", "deeper"))
    assert_errno(errno.EINVAL, os.rename, d, p(d, "x"))
    assert_errno(errno.EINVAL, os.rename, d, p(d, "sub", "deeper", "x"))
    assert_errno(errno.EINVAL, os.rename, d, p(d, "sub", "deeper"))
    # and onto its own ancestor (Linux: ENOTEMPTY, the ancestor holds it)
    assert_errno(errno.ENOTEMPTY, os.rename, p(d, "sub"), d)
    assert os.listdir(fs_root) == ["d"]
    assert os.listdir(p(d, "sub")) == ["deeper"]


def test_rename_onto_itself_is_noop(fs_root):
    a, ln = p(fs_root, "a"), p(fs_root, "hardlink")
    H.write_file(a, b"same")
    os.rename(a, a)
    assert H.read_file(a) == b"same"
    os.link(a, ln)
    os.rename(a, ln)  # the same file: POSIX says do nothing, both names stay
    assert sorted(os.listdir(fs_root)) == ["a", "hardlink"]
    assert os.stat(a).st_nlink == 2
    assert H.read_file(ln) == b"same"
    d = p(fs_root, "d")
    os.mkdir(d)
    H.write_file(p(d, "x"), b"x")
    os.rename(d, d)
    assert os.listdir(d) == ["x"]


def test_rename_errors(fs_root):
    H.write_file(p(fs_root, "a"), b"a")
    assert_errno(errno.ENOENT, os.rename, p(fs_root, "missing"), p(fs_root, "b"))
    assert_errno(errno.ENOENT, os.rename, p(fs_root, "a"), p(fs_root, "nodir", "b"))
    assert_errno(errno.EBUSY, os.rename, fs_root + "/.", p(fs_root, "x"))  # Linux: '.' is busy
    assert os.listdir(fs_root) == ["a"]


def test_rename_symlink_moves_the_link(fs_root):
    H.write_file(p(fs_root, "target"), b"t")
    os.symlink("target", p(fs_root, "l1"))
    os.rename(p(fs_root, "l1"), p(fs_root, "l2"))
    assert os.readlink(p(fs_root, "l2")) == "target"
    assert sorted(os.listdir(fs_root)) == ["l2", "target"]
    assert H.read_file(p(fs_root, "l2")) == b"t"


# =========================================================================== hard links


def test_hard_links(fs_root):
    a, b = p(fs_root, "a"), p(fs_root, "b")
    H.write_file(a, b"one")
    os.link(a, b)
    sa, sb = os.stat(a), os.stat(b)
    assert sa.st_nlink == 2 and sb.st_nlink == 2
    assert sa.st_ino == sb.st_ino
    fd = os.open(b, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"+two")
    os.close(fd)
    assert H.read_file(a) == b"one+two", "data is shared between hard links"
    os.mkdir(p(fs_root, "d"))
    os.link(a, p(fs_root, "d", "c"))
    assert os.stat(a).st_nlink == 3
    os.unlink(a)
    assert os.stat(b).st_nlink == 2
    assert H.read_file(b) == b"one+two"
    os.rename(b, p(fs_root, "d", "b"))
    assert os.stat(p(fs_root, "d", "c")).st_nlink == 2
    os.unlink(p(fs_root, "d", "c"))
    assert os.stat(p(fs_root, "d", "b")).st_nlink == 1
    assert H.read_file(p(fs_root, "d", "b")) == b"one+two"


def test_hard_link_errors(fs_root):
    a = p(fs_root, "a")
    H.write_file(a, b"a")
    H.write_file(p(fs_root, "b"), b"b")
    os.mkdir(p(fs_root, "d"))
    assert_errno(errno.EEXIST, os.link, a, p(fs_root, "b"))
    assert_errno(errno.ENOENT, os.link, p(fs_root, "missing"), p(fs_root, "c"))
    assert_errno(errno.EPERM, os.link, p(fs_root, "d"), p(fs_root, "dlink"))
    assert_errno(errno.ENOENT, os.link, a, p(fs_root, "nodir", "c"))
    assert os.stat(a).st_nlink == 1


def test_hard_link_to_symlink(fs_root):
    os.symlink("target", p(fs_root, "l"))
    os.link(p(fs_root, "l"), p(fs_root, "l2"), follow_symlinks=False)
    assert os.readlink(p(fs_root, "l2")) == "target"
    assert os.lstat(p(fs_root, "l")).st_nlink == 2


# =========================================================================== symlinks


def test_symlinks(fs_root):
    H.write_file(p(fs_root, "target"), b"content")
    os.mkdir(p(fs_root, "dir"))
    H.write_file(p(fs_root, "dir", "inner"), b"inner")
    os.symlink("target", p(fs_root, "l"))
    assert os.readlink(p(fs_root, "l")) == "target"
    lst = os.lstat(p(fs_root, "l"))
    assert stat.S_ISLNK(lst.st_mode)
    assert lst.st_size == len("target")
    st = os.stat(p(fs_root, "l"))
    assert stat.S_ISREG(st.st_mode) and st.st_size == 7
    assert H.read_file(p(fs_root, "l")) == b"content"
    os.symlink("dir", p(fs_root, "ldir"))
    assert os.listdir(p(fs_root, "ldir")) == ["inner"]
    assert H.read_file(p(fs_root, "ldir", "inner")) == b"inner"
    long_target = "/".join(["x" * 200] * 20)  # 4019 bytes
    os.symlink(long_target, p(fs_root, "long"))
    assert os.readlink(p(fs_root, "long")) == long_target
    assert_errno(errno.EEXIST, os.symlink, "other", p(fs_root, "l"))
    assert_errno(errno.EINVAL, os.readlink, p(fs_root, "target"))
    assert_errno(errno.ENOENT, os.readlink, p(fs_root, "missing"))
    assert_errno(errno.ELOOP, os.open, p(fs_root, "l"), os.O_RDONLY | os.O_NOFOLLOW)
    os.unlink(p(fs_root, "l"))
    assert H.read_file(p(fs_root, "target")) == b"content", "unlinking a symlink leaves its target"


def test_symlink_dangling(fs_root):
    os.symlink("nothing-here", p(fs_root, "dangling"))
    assert stat.S_ISLNK(os.lstat(p(fs_root, "dangling")).st_mode)
    assert_errno(errno.ENOENT, os.stat, p(fs_root, "dangling"))
    assert_errno(errno.ENOENT, os.open, p(fs_root, "dangling"), os.O_RDONLY)
    assert os.path.lexists(p(fs_root, "dangling")) and not os.path.exists(p(fs_root, "dangling"))
    # O_CREAT through a dangling symlink creates its target
    fd = os.open(p(fs_root, "dangling"), os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"made")
    os.close(fd)
    assert H.read_file(p(fs_root, "nothing-here")) == b"made"


def test_symlink_loops(fs_root):
    os.symlink("b", p(fs_root, "a"))
    os.symlink("a", p(fs_root, "b"))
    os.symlink("self", p(fs_root, "self"))
    for name in ("a", "b", "self"):
        assert_errno(errno.ELOOP, os.stat, p(fs_root, name))
        assert_errno(errno.ELOOP, os.open, p(fs_root, name), os.O_RDONLY)
        assert_errno(errno.ELOOP, os.open, p(fs_root, name), os.O_CREAT | os.O_WRONLY, 0o644)
    assert os.readlink(p(fs_root, "a")) == "b"
    assert sorted(os.listdir(fs_root)) == ["a", "b", "self"]


# =========================================================================== chmod/chown/utimens (root)


def test_chmod(fs_root):
    f = p(fs_root, "f")
    H.write_file(f, b"x")
    for mode in (0o600, 0o755, 0o4755, 0o2750, 0o1777, 0o000, 0o644):
        os.chmod(f, mode)
        assert stat.S_IMODE(os.stat(f).st_mode) == mode, oct(mode)
    d = p(fs_root, "d")
    os.mkdir(d)
    os.chmod(d, 0o3775)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o3775
    assert_errno(errno.ENOENT, os.chmod, p(fs_root, "missing"), 0o644)


def test_chown_as_root(fs_root, user):
    f = p(fs_root, "f")
    H.write_file(f, b"x")
    os.chown(f, user.uid, user.gid)
    st = os.stat(f)
    assert (st.st_uid, st.st_gid) == (user.uid, user.gid)
    os.chown(f, -1, 0)
    st = os.stat(f)
    assert (st.st_uid, st.st_gid) == (user.uid, 0), "-1 leaves the uid alone"
    os.symlink("f", p(fs_root, "l"))
    os.chown(p(fs_root, "l"), 0, user.gid, follow_symlinks=False)
    assert os.lstat(p(fs_root, "l")).st_gid == user.gid
    assert os.stat(f).st_gid == 0, "lchown must not touch the target"


def test_utimens(fs_root):
    f = p(fs_root, "f")
    H.write_file(f, b"x")
    atime, mtime = 1_500_000_000_123_456_789, 1_600_000_000_987_654_321
    os.utime(f, ns=(atime, mtime))
    st = os.stat(f)
    assert st.st_mtime_ns == mtime
    assert st.st_atime_ns == atime
    old = 100_000_000_000_000_000  # 1973, pre-epoch-safe positive value
    os.utime(f, ns=(old, old))
    assert os.stat(f).st_mtime_ns == old
    before = time.time_ns()
    os.utime(f)  # now
    st = os.stat(f)
    assert before - 2_000_000_000 <= st.st_mtime_ns <= time.time_ns() + 2_000_000_000
    os.symlink("f", p(fs_root, "l"))
    os.utime(p(fs_root, "l"), ns=(atime, atime), follow_symlinks=False)
    assert os.lstat(p(fs_root, "l")).st_mtime_ns == atime
    assert os.stat(f).st_mtime_ns != atime, "utimensat(AT_SYMLINK_NOFOLLOW) must not touch the target"


def test_mtime_ctime_advance(fs_root):
    f = p(fs_root, "f")
    H.write_file(f, b"x")
    os.utime(f, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    st0 = os.stat(f)
    time.sleep(0.02)
    fd = os.open(f, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"y")
    os.close(fd)
    st1 = os.stat(f)
    assert st1.st_mtime_ns > st0.st_mtime_ns, "write must update mtime"
    assert st1.st_ctime_ns > st0.st_ctime_ns
    time.sleep(0.02)
    os.chmod(f, 0o600)
    st2 = os.stat(f)
    assert st2.st_ctime_ns > st1.st_ctime_ns, "chmod must update ctime"
    assert st2.st_mtime_ns == st1.st_mtime_ns, "chmod must not update mtime"
    time.sleep(0.02)
    os.truncate(f, 0)
    st3 = os.stat(f)
    assert st3.st_mtime_ns > st2.st_mtime_ns, "truncate must update mtime"
    d0 = os.stat(fs_root)
    time.sleep(0.02)
    H.write_file(p(fs_root, "g"), b"")
    d1 = os.stat(fs_root)
    assert d1.st_mtime_ns > d0.st_mtime_ns, "creating an entry must update the directory's mtime"


# =========================================================================== permissions as a non-root user


def _user_dir(root, u, mode=0o755, name="home"):
    d = p(root, name)
    os.mkdir(d)
    os.chown(d, u.uid, u.gid)
    os.chmod(d, mode)
    return d


def _create(path, data=b"", mode=0o644):
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, mode)
    os.write(fd, data)
    os.close(fd)


@pytest.mark.needs_root
def test_user_created_files_owned_by_user(fs_root, user):
    d = _user_dir(fs_root, user)
    user.run(_create, p(d, "f"), b"mine")
    user.run(os.mkdir, p(d, "sub"))
    user.run(os.symlink, "f", p(d, "l"))
    for name, stf in (("f", os.stat), ("sub", os.stat), ("l", os.lstat)):
        st = stf(p(d, name))
        assert (st.st_uid, st.st_gid) == (user.uid, user.gid), f"{name} owned by {st.st_uid}:{st.st_gid}"
    assert user.run(H.read_file, p(d, "f")) == b"mine"


@pytest.mark.needs_root
def test_eacces_create_in_0555_dir(fs_root, user):
    d = _user_dir(fs_root, user, mode=0o555)
    assert user.errno(_create, p(d, "f")) == errno.EACCES
    assert user.errno(os.mkdir, p(d, "sub")) == errno.EACCES
    assert os.listdir(d) == []
    root_dir = p(fs_root, "rootdir")  # and a root-owned 0755 dir is not writable by others
    os.mkdir(root_dir, 0o755)
    assert user.errno(_create, p(root_dir, "f")) == errno.EACCES
    H.write_file(p(root_dir, "g"), b"g")
    assert user.errno(os.unlink, p(root_dir, "g")) == errno.EACCES
    assert user.errno(os.rename, p(root_dir, "g"), p(root_dir, "h")) == errno.EACCES


@pytest.mark.needs_root
def test_eacces_reading_other_users_0600_file(fs_root, user, user2):
    d = _user_dir(fs_root, user)
    user.run(_create, p(d, "secret"), b"top secret", 0o600)
    assert user.run(H.read_file, p(d, "secret")) == b"top secret"
    assert user2.errno(os.open, p(d, "secret"), os.O_RDONLY) == errno.EACCES
    assert user2.errno(os.open, p(d, "secret"), os.O_WRONLY) == errno.EACCES
    H.write_file(p(fs_root, "rootonly"), b"r", mode=0o600)
    assert user.errno(os.open, p(fs_root, "rootonly"), os.O_RDONLY) == errno.EACCES
    # a 0700 directory blocks lookups below it too
    priv = _user_dir(fs_root, user, mode=0o700, name="private")
    user.run(_create, p(priv, "f"), b"x", 0o644)
    assert user2.errno(os.stat, p(priv, "f")) == errno.EACCES
    assert user2.errno(os.listdir, priv) == errno.EACCES


@pytest.mark.needs_root
def test_chmod_owner_and_non_owner(fs_root, user, user2):
    d = _user_dir(fs_root, user, mode=0o777)
    user.run(_create, p(d, "f"), b"x", 0o644)
    user.run(os.chmod, p(d, "f"), 0o600)
    assert stat.S_IMODE(os.stat(p(d, "f")).st_mode) == 0o600
    assert user2.errno(os.chmod, p(d, "f"), 0o666) == errno.EPERM
    assert stat.S_IMODE(os.stat(p(d, "f")).st_mode) == 0o600
    # setting setgid on a file of a group the owner is not in: the bit is silently dropped
    os.chown(p(d, "f"), user.uid, user2.gid)
    user.run(os.chmod, p(d, "f"), 0o2755)
    assert stat.S_IMODE(os.stat(p(d, "f")).st_mode) == 0o755


@pytest.mark.needs_root
def test_chown_by_non_owner_eperm(fs_root, user, user2):
    d = _user_dir(fs_root, user, mode=0o777)
    user.run(_create, p(d, "f"), b"x", 0o666)
    assert user2.errno(os.chown, p(d, "f"), user2.uid, user2.gid) == errno.EPERM
    assert user.errno(os.chown, p(d, "f"), user2.uid, -1) == errno.EPERM, "giving a file away needs privilege"
    assert user.errno(os.chown, p(d, "f"), -1, user2.gid) == errno.EPERM, "not a member of that group"
    user.run(os.chown, p(d, "f"), user.uid, user.gid)  # a no-op chown by the owner is fine
    st = os.stat(p(d, "f"))
    assert (st.st_uid, st.st_gid) == (user.uid, user.gid)


@pytest.mark.needs_root
def test_utime_permissions(fs_root, user, user2):
    d = _user_dir(fs_root, user, mode=0o777)
    user.run(_create, p(d, "f"), b"x", 0o666)
    user.run(os.chmod, p(d, "f"), 0o666)  # (umask 022 made it 0644)
    user.run(os.utime, p(d, "f"), ns=(1, 2_000_000_000))  # the owner may set any time
    assert os.stat(p(d, "f")).st_mtime_ns == 2_000_000_000
    assert user2.errno(os.utime, p(d, "f"), ns=(5, 5)) == errno.EPERM, "explicit times need ownership"
    user2.run(os.utime, p(d, "f"))  # 'now' needs only write permission
    assert os.stat(p(d, "f")).st_mtime_ns > 2_000_000_000
    os.chmod(p(d, "f"), 0o644)
    assert user2.errno(os.utime, p(d, "f")) == errno.EACCES


@pytest.mark.needs_root
def test_setgid_directory_inheritance(fs_root, user, user2):
    d = p(fs_root, "shared")
    os.mkdir(d)
    os.chown(d, user.uid, user2.gid)
    os.chmod(d, 0o2775)
    user.run(_create, p(d, "f"), b"x", 0o644)
    user.run(os.mkdir, p(d, "sub"))
    st = os.stat(p(d, "f"))
    assert st.st_uid == user.uid
    assert st.st_gid == user2.gid, "a new file takes the setgid directory's group"
    sd = os.stat(p(d, "sub"))
    assert sd.st_gid == user2.gid
    assert sd.st_mode & stat.S_ISGID, "a new subdirectory inherits the setgid bit"


@pytest.mark.needs_root
def test_sticky_directory(fs_root, user, user2):
    d = p(fs_root, "tmp")
    os.mkdir(d)
    os.chmod(d, 0o1777)
    user.run(_create, p(d, "f"), b"x", 0o666)
    assert user2.errno(os.unlink, p(d, "f")) == errno.EPERM
    assert user2.errno(os.rename, p(d, "f"), p(d, "g")) == errno.EPERM
    user.run(os.unlink, p(d, "f"))
    assert os.listdir(d) == []


@pytest.mark.needs_root
def test_xattr_needs_write_permission(fs_root, user, user2):
    d = _user_dir(fs_root, user, mode=0o755)
    user.run(_create, p(d, "f"), b"x", 0o644)
    user.run(os.setxattr, p(d, "f"), "user.k", b"v")
    assert user2.run(os.getxattr, p(d, "f"), "user.k") == b"v"
    assert user2.errno(os.setxattr, p(d, "f"), "user.k", b"w") == errno.EACCES
    assert os.getxattr(p(d, "f"), "user.k") == b"v"


# =========================================================================== xattrs


def test_xattrs(fs_root):
    f = p(fs_root, "f")
    H.write_file(f, b"x")
    os.setxattr(f, "user.a", b"alpha")
    os.setxattr(f, "user.bin", bytes(range(256)) * 3)
    os.setxattr(f, "user.empty", b"")
    assert os.getxattr(f, "user.a") == b"alpha"
    assert os.getxattr(f, "user.bin") == bytes(range(256)) * 3
    assert os.getxattr(f, "user.empty") == b""
    assert sorted(x for x in os.listxattr(f) if x.startswith("user.")) == ["user.a", "user.bin", "user.empty"]
    os.setxattr(f, "user.a", b"overwritten")
    assert os.getxattr(f, "user.a") == b"overwritten"
    assert_errno(errno.ENODATA, os.getxattr, f, "user.missing")
    assert_errno(errno.EEXIST, os.setxattr, f, "user.a", b"x", os.XATTR_CREATE)
    assert_errno(errno.ENODATA, os.setxattr, f, "user.new", b"x", os.XATTR_REPLACE)
    os.setxattr(f, "user.new", b"created", os.XATTR_CREATE)
    os.setxattr(f, "user.new", b"replaced", os.XATTR_REPLACE)
    assert os.getxattr(f, "user.new") == b"replaced"
    os.removexattr(f, "user.a")
    assert_errno(errno.ENODATA, os.getxattr, f, "user.a")
    assert_errno(errno.ENODATA, os.removexattr, f, "user.a")
    assert sorted(x for x in os.listxattr(f) if x.startswith("user.")) == ["user.bin", "user.empty", "user.new"]
    # directories carry xattrs too; symlinks may not carry user.* (Linux: EPERM)
    os.mkdir(p(fs_root, "d"))
    os.setxattr(p(fs_root, "d"), "user.dir", b"d")
    assert os.getxattr(p(fs_root, "d"), "user.dir") == b"d"
    os.symlink("f", p(fs_root, "l"))
    assert_errno(errno.EPERM, os.setxattr, p(fs_root, "l"), "user.x", b"x", follow_symlinks=False)
    assert os.getxattr(p(fs_root, "l"), "user.new") == b"replaced", "getxattr follows the symlink"
    # xattrs survive rename and are shared by hard links
    os.rename(f, p(fs_root, "g"))
    os.link(p(fs_root, "g"), p(fs_root, "h"))
    assert os.getxattr(p(fs_root, "h"), "user.bin") == bytes(range(256)) * 3
    assert_errno(errno.ENOENT, os.getxattr, p(fs_root, "missing"), "user.a")


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


# =========================================================================== EISDIR / ENOENT / names


def test_eisdir(fs_root):
    d = p(fs_root, "d")
    os.mkdir(d)
    assert_errno(errno.EISDIR, os.open, d, os.O_WRONLY)
    assert_errno(errno.EISDIR, os.open, d, os.O_RDWR)
    assert_errno(errno.EISDIR, os.open, d, os.O_WRONLY | os.O_CREAT, 0o644)
    assert_errno(errno.EISDIR, os.open, d, os.O_RDONLY | os.O_TRUNC)
    fd = os.open(d, os.O_RDONLY)
    assert_errno(errno.EISDIR, os.read, fd, 10)
    assert_errno(errno.EBADF, os.write, fd, b"x")
    os.close(fd)
    H.write_file(p(fs_root, "f"), b"f")
    assert_errno(errno.ENOTDIR, os.open, p(fs_root, "f"), os.O_RDONLY | os.O_DIRECTORY)
    assert_errno(errno.ENOTDIR, os.listdir, p(fs_root, "f"))


def test_enoent(fs_root):
    m = p(fs_root, "missing")
    assert_errno(errno.ENOENT, os.stat, m)
    assert_errno(errno.ENOENT, os.lstat, m)
    assert_errno(errno.ENOENT, os.open, m, os.O_RDONLY)
    assert_errno(errno.ENOENT, os.open, p(m, "f"), os.O_CREAT | os.O_WRONLY, 0o644)
    assert_errno(errno.ENOENT, os.listdir, m)
    assert_errno(errno.ENOENT, os.chmod, m, 0o644)
    assert_errno(errno.ENOENT, os.utime, m)
    assert_errno(errno.ENOENT, os.rmdir, m)
    assert_errno(errno.ENOENT, os.unlink, m)
    assert_errno(errno.ENOENT, os.setxattr, m, "user.x", b"1")
    H.write_file(p(fs_root, "f"), b"f")
    assert_errno(errno.ENOTDIR, os.stat, p(fs_root, "f", "x"))
    assert_errno(errno.ENOTDIR, os.open, p(fs_root, "f", "x"), os.O_CREAT | os.O_WRONLY, 0o644)


def test_badf_wrong_access_mode(fs_root):
    path = p(fs_root, "f")
    H.write_file(path, b"abc")
    fd = os.open(path, os.O_WRONLY)
    assert_errno(errno.EBADF, os.read, fd, 1)
    os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    assert_errno(errno.EBADF, os.write, fd, b"x")
    os.close(fd)
    assert H.read_file(path) == b"abc"


def test_name_lengths(fs_root):
    ok = "n" * 255
    H.write_file(p(fs_root, ok), b"long name")
    assert os.listdir(fs_root) == [ok]
    assert H.read_file(p(fs_root, ok)) == b"long name"
    assert_errno(errno.ENAMETOOLONG, os.open, p(fs_root, "n" * 256), os.O_CREAT | os.O_WRONLY, 0o644)
    assert_errno(errno.ENAMETOOLONG, os.mkdir, p(fs_root, "d" * 256))
    assert_errno(errno.ENAMETOOLONG, os.stat, p(fs_root, "s" * 256))
    odd = "sp ace\ttab\u00e9\u4e2d-\x01"
    H.write_file(p(fs_root, odd), b"odd")
    assert odd in os.listdir(fs_root)


# =========================================================================== who may talk to the servers (Spillway)

HELLO_OP, ROLE_CLIENT, ROLE_PEER = 1, 1, 2


def _hello_errno(addr, role, instance, credential):
    """Connect to a server and send a Hello as its first frame (docs/wire-protocol.md);
    the errno of the reply, 0 when a session was granted."""
    host, port = addr.rsplit(":", 1)
    body = struct.pack("<HHBQI", 1, 1, role, instance, len(credential)) + credential
    body += struct.pack("<I", 4) + b"test"
    frame = struct.pack("<IBBHQI", 16 + len(body), 1, 0, HELLO_OP, 0, 5000) + body
    with socket.create_connection((host.strip("[]"), int(port)), timeout=10) as s:
        s.sendall(frame)
        head = b""
        while len(head) < 20:
            chunk = s.recv(20 - len(head))
            if not chunk:
                raise ConnectionError(f"{addr} closed the connection without a reply")
            head += chunk
    return struct.unpack("<IBBHQI", head)[5]


def _capability_fields(cap):
    """(instance, expires, node, [addresses]) of a version-1 capability."""
    assert cap[:5] == b"SPWC\x01", f"not a capability: {cap[:5]!r}"
    instance, expires = struct.unpack_from("<QQ", cap, 5)
    n = cap[21]
    node = cap[22 : 22 + n].decode()
    pos, addrs = 23 + n, []
    for _ in range(cap[22 + n]):
        family = cap[pos]
        size = {4: 4, 6: 16}[family]
        addrs.append(socket.inet_ntop(socket.AF_INET if family == 4 else socket.AF_INET6, cap[pos + 1 : pos + 1 + size]))
        pos += 1 + size
    assert pos == len(cap) - 32, "the tag is the last 32 bytes"
    return instance, expires, node, addrs


def _read_text(path):
    with open(path) as f:
        return f.read()


@pytest.mark.spillway_only
def test_clients_hold_a_capability_not_the_instance_secret(cluster, user):
    """`cluster up` keeps the instance secret to itself and hands its client a capability
    bound to the address the client connects from, in a descriptor only root may read;
    servers refuse clients anything else, and a user of the machine gets nothing."""
    desc_path = cluster.instance_path
    secret_path = os.path.join(cluster.dir, "instance.secret")
    for path in (desc_path, secret_path):
        st = os.stat(path)
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, 0), f"{path}: mode {oct(st.st_mode)}, uid {st.st_uid}"
    d = cluster.instance()
    cap = bytes.fromhex(d["credential"])
    secret = bytes.fromhex(_read_text(secret_path).strip())
    assert secret not in cap and secret.hex() not in _read_text(desc_path), "the secret is in the descriptor"
    instance, expires, node, addrs = _capability_fields(cap)
    assert instance == d["instance"]
    assert node == socket.gethostname()
    assert expires > time.time() + 9 * 365 * 86400, "a developer cluster's capability lasts years"
    servers = d["servers"]
    for server in servers:
        host, port = server.rsplit(":", 1)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.connect((host, int(port)))  # no packet: only picks the source address
            source = u.getsockname()[0]
        assert addrs == [source], f"capability bound to {addrs}, the client connects from {source}"
        tampered = cap[:-1] + bytes([cap[-1] ^ 1])
        for what, role, cred in [
            ("no credential", ROLE_CLIENT, b""),
            ("the instance secret as a client", ROLE_CLIENT, secret),
            ("a tampered capability", ROLE_CLIENT, tampered),
            ("the capability as a peer", ROLE_PEER, cap),
        ]:
            assert _hello_errno(server, role, instance, cred) == errno.EACCES, f"{server}: {what}"
        assert _hello_errno(server, ROLE_CLIENT, instance, cap) == 0, f"{server}: the capability"
        assert _hello_errno(server, ROLE_PEER, instance, secret) == 0, f"{server}: the secret as a peer"
    # A user of this machine can read neither file and opens no session without them.
    for path in (desc_path, secret_path):
        assert_errno(errno.EACCES, H.as_user, user.uid, user.gid, _read_text, path)
    got = H.as_user(user.uid, user.gid, _hello_errno, servers[0], ROLE_CLIENT, instance, b"")
    assert got == errno.EACCES


# =========================================================================== capacity / statfs (Spillway)


@pytest.mark.spillway_only
@pytest.mark.timeout(600)
def test_enospc_at_instance_capacity(fresh_dir, clusters):
    c = clusters(servers=2, capacity="64M")
    cap = c.capacity()
    d = fresh_dir(c)
    path = p(d, "fill")
    chunk = os.urandom(MiB)
    written, err = 0, None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while written < 2 * cap:
            os.write(fd, chunk)
            written += len(chunk)
        os.fsync(fd)
    except OSError as e:
        err = e
    try:
        os.close(fd)
    except OSError as e:
        err = err or e
    assert err is not None, f"wrote {written} bytes (capacity {cap}) without an error"
    assert err.errno == errno.ENOSPC, f"expected ENOSPC, got {H.ename(err.errno)} ({err})"
    assert written <= cap + 64 * MiB, f"{written} bytes accepted by write() on a {cap}-byte instance"
    # and it recovers once the space is freed
    os.unlink(path)
    H.poll(lambda: os.statvfs(c.mnt).f_bavail * os.statvfs(c.mnt).f_frsize >= cap // 2, timeout=10)
    H.write_file(p(d, "after"), os.urandom(8 * MiB), fsync=True)
    assert os.stat(p(d, "after")).st_size == 8 * MiB


@pytest.mark.spillway_only
@pytest.mark.parametrize("servers,capacity", [(2, "256M"), (3, "1G")])
def test_statfs_semantics(fresh_dir, clusters, servers, capacity):
    c = clusters(servers=servers, capacity=capacity)
    cap = c.capacity()
    assert cap in (H.parse_size(capacity), H.parse_size(capacity, binary=False)), f"instance capacity {cap}"
    st = os.statvfs(c.mnt)
    assert st.f_blocks * st.f_frsize == cap, f"f_blocks*f_frsize {st.f_blocks * st.f_frsize} != capacity {cap}"
    assert 0 < st.f_bavail <= st.f_bfree <= st.f_blocks
    assert st.f_namemax == 255
    free0 = st.f_bavail * st.f_frsize
    assert free0 >= cap - 16 * MiB, f"an empty instance reports {free0} of {cap} free"

    d = fresh_dir(c)
    # 6 MiB in one file: one 8 MiB stripe, so all on one server. The fullest fragment lost
    # 6 MiB, and free = servers x that fragment's free, so free drops by servers x 6 MiB.
    H.write_file(p(d, "one"), os.urandom(6 * MiB), fsync=True)
    lines = c.stripes(p(d, "one"))
    assert len(lines) == 1
    frag = cap // c.servers
    used = [0] * c.servers
    for _, server, _, n in lines:
        used[server] += n
    expect = c.servers * (frag - max(used))

    def free():
        s = os.statvfs(c.mnt)
        return s.f_bavail * s.f_frsize

    got = H.poll(lambda: abs(free() - expect) <= 2 * MiB and free(), timeout=5) or free()
    assert abs(got - expect) <= 2 * MiB, (
        f"free {got} after writing 6 MiB to server {lines[0][1]}; expected servers x free of the "
        f"fullest fragment = {expect} (free before: {free0})"
    )
    os.unlink(p(d, "one"))
    got = H.poll(lambda: free() >= free0 - MiB and free(), timeout=10) or free()
    assert got >= free0 - MiB, f"free {got} after unlink, {free0} before the write"


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
