"""POSIX behaviour of a Spillway mount: the namespace. mkdir/rmdir (names reused at
once, ENOTEMPTY), readdir of 20,000 entries, rename in all its cases, hard links and
symbolic links (dangling, ELOOP). One focused test per behaviour, its errno included.
"""

import errno
import os
import stat
import time

import pytest

import fusetrace
import spwhelpers as H
from spwhelpers import assert_errno, p

CLUSTER_OPTS = {"servers": 2, "capacity": "4G"}


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


def _tree(root, dirs=12, files=3):
    """root/dNN/fK (K bytes each) and root/dNN/sub: a directory of subdirectories, as a
    walk (find, du, rm -r) meets them."""
    os.mkdir(root)
    for i in range(dirs):
        d = p(root, f"d{i:02d}")
        os.mkdir(d)
        os.mkdir(p(d, "sub"))
        for k in range(files):
            H.write_file(p(d, f"f{k}"), b"x" * k)


def _walk(root):
    """{relative path: (kind bits, mode, size)} as os.walk and lstat see them."""
    seen = {}
    for top, dirs, files in os.walk(root):
        for n in dirs + files:
            st = os.lstat(p(top, n))
            seen[os.path.relpath(p(top, n), root)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size)
    return seen


def test_walk_lists_what_is_there(fs_root):
    """READDIRPLUS and the listings read ahead of a walk (client dirahead.rs) give the
    same names, kinds, modes and sizes as asking each name."""
    root = p(fs_root, "walked")
    _tree(root)
    want = {}
    for i in range(12):
        want[f"d{i:02d}"] = (stat.S_IFDIR, 0o777 & ~_umask(), 0)
        want[f"d{i:02d}/sub"] = (stat.S_IFDIR, 0o777 & ~_umask(), 0)
        for k in range(3):
            want[f"d{i:02d}/f{k}"] = (stat.S_IFREG, 0o644 & ~_umask(), k)
    for _ in range(3):
        got = _walk(root)
        # Directory sizes are the file system's own business.
        got = {k: (t, m, 0 if t == stat.S_IFDIR else sz) for k, (t, m, sz) in got.items()}
        assert got == want


def _umask():
    u = os.umask(0)
    os.umask(u)
    return u


def test_a_walk_of_a_large_directory_looks_no_name_up(fs_root):
    """Every page of a listing carries attributes (READDIRPLUS, not READDIRPLUS_AUTO):
    a walk that descends into each of 600 subdirectories, after their names' entry
    lifetime ran out, sends the kernel's LOOKUP for none of them (counted at the
    kernel's fuse tracepoint). With AUTO the pages after the first (about 170 names in
    a 32 KiB getdents buffer) came without attributes and each descent cost a LOOKUP,
    a round trip to a server: a third of `find`'s time on /usr/share/doc."""
    if H.LOCAL or not fusetrace.available():
        pytest.skip("counts the kernel's FUSE requests to a Spillway mount (tracefs)")
    root = p(fs_root, "wide")
    os.mkdir(root)
    names = [f"a-subdirectory-with-a-long-name-{i:04d}" for i in range(600)]
    for n in names:
        os.mkdir(p(root, n))
    time.sleep(1.5)  # the names' entry lifetime (1 s) has run out
    with fusetrace.FuseRequests(root) as seen:
        walked = [top for top, _, _ in os.walk(root)]
    assert len(walked) == 601
    assert seen.count("FUSE_READDIRPLUS") >= 600
    # A few for the path above `root`, whose entries may expire during the walk.
    assert seen.count("FUSE_LOOKUP") < 20, seen.counts


def test_changes_through_the_mount_show_at_once_in_a_walk(fs_root):
    """A listing read ahead of a walk is never served after a change made through this
    mount: names created, removed and renamed, and attributes changed (mode, size by
    truncate and by write) right after the parent was listed show in the very next
    listing and lstat, every time."""
    root = p(fs_root, "changing")
    _tree(root)
    for rnd in range(6):
        os.listdir(root)  # reads d00.. ahead
        d = [p(root, f"d{i:02d}") for i in range(12)]
        H.write_file(p(d[0], f"new{rnd}"), b"n")
        os.unlink(p(d[1], "f0"))
        H.write_file(p(d[1], "f0"), b"again")
        os.chmod(p(d[2], "f1"), 0o600 if rnd % 2 == 0 else 0o640)
        os.truncate(p(d[3], "f2"), 1000 + rnd)
        os.rename(p(d[4], "f1"), p(d[4], f"moved{rnd}"))
        os.mkdir(p(d[5], f"dir{rnd}"))
        with open(p(d[6], "f2"), "ab") as f:
            f.write(b"y" * 4096)
        got = _walk(root)
        assert f"d00/new{rnd}" in got
        assert got["d01/f0"][2] == 5
        assert got["d02/f1"][1] == (0o600 if rnd % 2 == 0 else 0o640)
        assert got["d03/f2"][2] == 1000 + rnd
        assert f"d04/moved{rnd}" in got and "d04/f1" not in got
        assert got[f"d05/dir{rnd}"][0] == stat.S_IFDIR
        assert got["d06/f2"][2] == 2 + 4096 * (rnd + 1)
        # Put d04 back for the next round.
        os.rename(p(d[4], f"moved{rnd}"), p(d[4], "f1"))


def test_scandir_right_after_a_truncate_shows_the_new_size(fs_root):
    """READDIRPLUS hands the kernel attributes: those of a listing read before a
    truncate must never overwrite what the truncate set (st_size from lstat after
    scandir)."""
    root = p(fs_root, "scan")
    _tree(root, dirs=8)
    for rnd in range(5):
        os.listdir(root)
        for i in range(8):
            os.truncate(p(root, f"d{i:02d}", "f2"), 100 * (rnd + 1) + i)
        for i in range(8):
            with os.scandir(p(root, f"d{i:02d}")) as it:
                sizes = {e.name: e.stat(follow_symlinks=False).st_size for e in it}
            assert sizes["f2"] == 100 * (rnd + 1) + i


def test_a_listing_read_ahead_reaches_only_those_the_kernel_lets_list(fs_root, user):
    """Attack: an unprivileged user lists a directory whose subdirectories belong to
    root with mode 0700, so that the client (root) reads their listings ahead; the
    user's own listing of one of them must still fail with EACCES, and a walk as the
    user must not name what is inside."""
    root = p(fs_root, "guarded")
    os.mkdir(root)
    os.chmod(root, 0o755)
    for i in range(6):
        d = p(root, f"private{i}")
        os.mkdir(d)
        H.write_file(p(d, "secret-name"), b"s")
        os.chmod(d, 0o700)
    for _ in range(3):
        assert sorted(user.run(os.listdir, root)) == [f"private{i}" for i in range(6)]
        for i in range(6):
            assert user.errno(os.listdir, p(root, f"private{i}")) == errno.EACCES
        walked = user.run(lambda: [n for _, ds, fs in os.walk(root) for n in ds + fs])
        assert "secret-name" not in walked


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
