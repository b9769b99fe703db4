"""POSIX behaviour of a Spillway mount: attributes and who may change them. chmod,
chown, utimens and mtime/ctime as root; as non-root users (`user`, `user2`) ownership of
new files, EACCES/EPERM, set-group-ID and sticky directories; extended attributes.
"""

import errno
import os
import stat
import time

import pytest

import spwhelpers as H
from spwhelpers import assert_errno, create_file, p

CLUSTER_OPTS = {"servers": 2, "capacity": "4G"}


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


@pytest.mark.needs_root
def test_user_created_files_owned_by_user(fs_root, user):
    d = _user_dir(fs_root, user)
    user.run(create_file, p(d, "f"), b"mine")
    user.run(os.mkdir, p(d, "sub"))
    user.run(os.symlink, "f", p(d, "l"))
    for name, stf in (("f", os.stat), ("sub", os.stat), ("l", os.lstat)):
        st = stf(p(d, name))
        assert (st.st_uid, st.st_gid) == (user.uid, user.gid), f"{name} owned by {st.st_uid}:{st.st_gid}"
    assert user.run(H.read_file, p(d, "f")) == b"mine"


@pytest.mark.needs_root
def test_eacces_create_in_0555_dir(fs_root, user):
    d = _user_dir(fs_root, user, mode=0o555)
    assert user.errno(create_file, p(d, "f")) == errno.EACCES
    assert user.errno(os.mkdir, p(d, "sub")) == errno.EACCES
    assert os.listdir(d) == []
    root_dir = p(fs_root, "rootdir")  # and a root-owned 0755 dir is not writable by others
    os.mkdir(root_dir, 0o755)
    assert user.errno(create_file, p(root_dir, "f")) == errno.EACCES
    H.write_file(p(root_dir, "g"), b"g")
    assert user.errno(os.unlink, p(root_dir, "g")) == errno.EACCES
    assert user.errno(os.rename, p(root_dir, "g"), p(root_dir, "h")) == errno.EACCES


@pytest.mark.needs_root
def test_eacces_reading_other_users_0600_file(fs_root, user, user2):
    d = _user_dir(fs_root, user)
    user.run(create_file, p(d, "secret"), b"top secret", 0o600)
    assert user.run(H.read_file, p(d, "secret")) == b"top secret"
    assert user2.errno(os.open, p(d, "secret"), os.O_RDONLY) == errno.EACCES
    assert user2.errno(os.open, p(d, "secret"), os.O_WRONLY) == errno.EACCES
    H.write_file(p(fs_root, "rootonly"), b"r", mode=0o600)
    assert user.errno(os.open, p(fs_root, "rootonly"), os.O_RDONLY) == errno.EACCES
    # a 0700 directory blocks lookups below it too
    priv = _user_dir(fs_root, user, mode=0o700, name="private")
    user.run(create_file, p(priv, "f"), b"x", 0o644)
    assert user2.errno(os.stat, p(priv, "f")) == errno.EACCES
    assert user2.errno(os.listdir, priv) == errno.EACCES


@pytest.mark.needs_root
def test_chmod_owner_and_non_owner(fs_root, user, user2):
    d = _user_dir(fs_root, user, mode=0o777)
    user.run(create_file, p(d, "f"), b"x", 0o644)
    user.run(os.chmod, p(d, "f"), 0o600)
    assert stat.S_IMODE(os.stat(p(d, "f")).st_mode) == 0o600
    assert user2.errno(os.chmod, p(d, "f"), 0o666) == errno.EPERM
    assert stat.S_IMODE(os.stat(p(d, "f")).st_mode) == 0o600
    # setting setgid on a file of a group the owner is not in: the bit is silently dropped
    os.chown(p(d, "f"), user.uid, user2.gid)
    user.run(os.chmod, p(d, "f"), 0o2755)
    assert stat.S_IMODE(os.stat(p(d, "f")).st_mode) == 0o755


def _write_through(path, flags, data):
    fd = os.open(path, flags)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


@pytest.mark.needs_root
def test_a_write_by_another_user_clears_setuid_and_setgid(fs_root, user, user2):
    """A user who may write another's setuid file must not keep its privilege: the
    write clears setuid, and setgid where group execute is set, whichever way the
    file was opened (a write-only open goes around the page cache, and then the
    kernel leaves the clearing to the file system)."""
    d = _user_dir(fs_root, user, mode=0o777)
    f = p(d, "f")
    user.run(create_file, f, b"x", 0o644)
    for flags in (os.O_WRONLY | os.O_APPEND, os.O_RDWR):
        user.run(os.chmod, f, 0o6777)
        user2.run(_write_through, f, flags, b"y")
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o777, oct(flags)
    # setgid without group execute marks mandatory locking, not privilege: it stays
    user.run(os.chmod, f, 0o6767)
    user2.run(_write_through, f, os.O_WRONLY | os.O_APPEND, b"z")
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o2767
    # the owner's own writes clear setuid too (no CAP_FSETID); root's do not
    user.run(os.chmod, f, 0o4755)
    _write_through(f, os.O_WRONLY | os.O_APPEND, b"r")
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o4755
    user.run(_write_through, f, os.O_WRONLY | os.O_APPEND, b"o")
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o755
    assert H.read_file(f) == b"yyzro"  # the read-write open wrote at offset 0


@pytest.mark.needs_root
def test_truncate_and_chown_clear_setuid_as_the_kernel_would(fs_root, user, user2):
    """The kernel leaves clearing setuid and setgid on truncate and chown to the file
    system (FUSE_HANDLE_KILLPRIV_V2): a truncate by a user clears them (setgid only
    with group execute), root's keeps them; a chown clears them for anyone."""
    d = _user_dir(fs_root, user, mode=0o777)
    f = p(d, "f")
    user.run(create_file, f, b"data", 0o644)
    user.run(os.chmod, f, 0o6777)
    user2.run(os.truncate, f, 2)  # through a path
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o777
    user.run(os.chmod, f, 0o6767)
    user2.run(_open_truncating, f)  # open(O_TRUNC)
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o2767, "setgid without group execute stays"
    user.run(os.chmod, f, 0o6755)
    os.truncate(f, 1)  # root (CAP_FSETID) keeps them
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o6755
    os.chown(f, user2.uid, -1)
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o755, "a chown clears both, even root's"
    assert os.stat(f).st_uid == user2.uid
    sub = p(d, "sub")
    user.run(os.mkdir, sub)
    user.run(os.chmod, sub, 0o2775)
    os.chown(sub, user2.uid, -1)
    assert stat.S_IMODE(os.stat(sub).st_mode) == 0o2775, "a directory keeps setgid"


def _open_truncating(path):
    os.close(os.open(path, os.O_WRONLY | os.O_TRUNC))


@pytest.mark.needs_root
def test_chown_by_non_owner_eperm(fs_root, user, user2):
    d = _user_dir(fs_root, user, mode=0o777)
    user.run(create_file, p(d, "f"), b"x", 0o666)
    assert user2.errno(os.chown, p(d, "f"), user2.uid, user2.gid) == errno.EPERM
    assert user.errno(os.chown, p(d, "f"), user2.uid, -1) == errno.EPERM, "giving a file away needs privilege"
    assert user.errno(os.chown, p(d, "f"), -1, user2.gid) == errno.EPERM, "not a member of that group"
    user.run(os.chown, p(d, "f"), user.uid, user.gid)  # a no-op chown by the owner is fine
    st = os.stat(p(d, "f"))
    assert (st.st_uid, st.st_gid) == (user.uid, user.gid)


@pytest.mark.needs_root
def test_utime_permissions(fs_root, user, user2):
    d = _user_dir(fs_root, user, mode=0o777)
    user.run(create_file, p(d, "f"), b"x", 0o666)
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
    user.run(create_file, p(d, "f"), b"x", 0o644)
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
    user.run(create_file, p(d, "f"), b"x", 0o666)
    assert user2.errno(os.unlink, p(d, "f")) == errno.EPERM
    assert user2.errno(os.rename, p(d, "f"), p(d, "g")) == errno.EPERM
    user.run(os.unlink, p(d, "f"))
    assert os.listdir(d) == []


@pytest.mark.needs_root
def test_xattr_needs_write_permission(fs_root, user, user2):
    d = _user_dir(fs_root, user, mode=0o755)
    user.run(create_file, p(d, "f"), b"x", 0o644)
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
