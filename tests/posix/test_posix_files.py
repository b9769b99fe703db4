"""POSIX behaviour of a Spillway mount: files by name. Create, open, read and write
(O_EXCL with a two-process race, O_TRUNC, O_APPEND with two appenders), unlink and files
still open after it, and the errors of names and access modes (EISDIR, ENOENT, EBADF,
ENAMETOOLONG). One focused test per behaviour, its errno included.

The POSIX suite is split by subject into tests/posix/test_posix_*.py; every test takes
`fs_root` (a fresh directory on the mount, or a local tmp dir with
SPILLWAY_TEST_TARGET=local), and test_netns.py runs all of them again over veths.
"""

import errno
import os
import stat

import spwhelpers as H
from spwhelpers import MiB, assert_errno, p

CLUSTER_OPTS = {"servers": 2, "capacity": "4G"}


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
    data = H.read_to_eof(r)
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
