"""POSIX ACLs (`system.posix_acl_access`/`default`) enforced by the kernel on a Spillway
mount: named entries grant and the mask limits, chmod and ACLs keep each other in step,
default ACLs are inherited (umask only without one), `cp -a` and `rsync -aA` preserve
them, bad values and non-owners are refused, and a second mount sees and inherits what
the first set. Results are compared with the same operations on the local ext4 tree
(`local_dir`), with `getfacl -n` output and modes."""

import errno
import os
import shutil
import stat
import struct
import subprocess
import time

import pytest

import spwhelpers as H

pytestmark = pytest.mark.spillway_only

CLUSTER_OPTS = {"servers": 2, "capacity": "4G"}
ATTR_TIMEOUT = 2.5  # another mount sees a change within the attribute lifetime (1 s)

if shutil.which("setfacl") is None or shutil.which("getfacl") is None:
    pytest.skip("setfacl/getfacl missing (Debian package acl)", allow_module_level=True)

ACCESS = "system.posix_acl_access"
DEFAULT = "system.posix_acl_default"


def run(*args, cwd=None):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, timeout=120)
    assert r.returncode == 0, f"{args} exited {r.returncode}: {r.stderr}"
    return r.stdout


def facl(root, paths):
    """getfacl -n of `paths` (relative to root), in that order, plus each one's mode."""
    out = run("getfacl", "-n", "-p", *paths, cwd=root)
    modes = {q: oct(os.lstat(os.path.join(root, q)).st_mode) for q in paths}
    return out, modes


def tree(root):
    """Every path below root (sorted), symlinks apart: getfacl follows them."""
    paths, links = [], []
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            q = os.path.relpath(os.path.join(d, n), root)
            (links if os.path.islink(os.path.join(d, n)) else paths).append(q)
    return sorted(paths), sorted(links)


def same_as_ext4(spw_root, ext4_root):
    paths, links = tree(ext4_root)
    assert tree(spw_root) == (paths, links)
    assert facl(spw_root, paths) == facl(ext4_root, paths)
    for q in links:
        assert os.lstat(os.path.join(spw_root, q)).st_mode == os.lstat(os.path.join(ext4_root, q)).st_mode


def opens(user, path, flags):
    def f():
        os.close(os.open(path, flags))

    return user.errno(f)


@pytest.fixture
def root_dir(cluster, fresh_dir):
    return fresh_dir(cluster)


def test_named_user_entry_and_mask(root_dir, local_dir, user, user2):
    for d in (root_dir, local_dir):
        f = os.path.join(d, "f")
        H.write_file(f, b"secret", mode=0o600)
        os.chmod(f, 0o600)
        assert opens(user, f, os.O_RDONLY) == errno.EACCES
        run("setfacl", "-m", f"u:{user.name}:rw", f)
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o660, "the mask shows as the group bits"
        assert user.run(H.read_file, f) == b"secret"
        assert opens(user, f, os.O_WRONLY) == 0
        assert opens(user2, f, os.O_RDONLY) == errno.EACCES, "another user is still refused"
        run("setfacl", "-m", "m::r", f)
        assert opens(user, f, os.O_RDONLY) == 0
        assert opens(user, f, os.O_WRONLY) == errno.EACCES, "the mask limits the named entry"
        run("setfacl", "-m", "m::rw", f)
        assert opens(user, f, os.O_RDWR) == 0
    same_as_ext4(root_dir, local_dir)
    for d in (root_dir, local_dir):
        f = os.path.join(d, "f")
        run("setfacl", "-b", f)
        assert opens(user, f, os.O_RDONLY) == errno.EACCES, "removing the ACL restores refusal"
        assert ACCESS not in os.listxattr(f)
    same_as_ext4(root_dir, local_dir)


def test_getfacl_round_trip_and_raw_value(root_dir, local_dir, user):
    spec = f"u::rwx,u:{user.name}:r-x,g::r--,g:{user.gid}:rw-,m::rwx,o::---"
    for d in (root_dir, local_dir):
        f = os.path.join(d, "f")
        H.write_file(f, b"x")
        run("setfacl", "--set", spec, f)
    same_as_ext4(root_dir, local_dir)
    raw = os.getxattr(os.path.join(local_dir, "f"), ACCESS)
    assert os.getxattr(os.path.join(root_dir, "f"), ACCESS) == raw
    assert ACCESS in os.listxattr(os.path.join(root_dir, "f"))
    # The same value set raw on another file (what cp -a and rsync -A do).
    for d in (root_dir, local_dir):
        H.write_file(os.path.join(d, "g"), b"y")
        os.setxattr(os.path.join(d, "g"), ACCESS, raw)
    same_as_ext4(root_dir, local_dir)
    # An ACL equivalent to a mode is the mode alone.
    for d in (root_dir, local_dir):
        run("setfacl", "--set", "u::rw,g::r,o::r", os.path.join(d, "g"))
        assert ACCESS not in os.listxattr(os.path.join(d, "g"))
        assert stat.S_IMODE(os.stat(os.path.join(d, "g")).st_mode) == 0o644


def test_chmod_and_acl_stay_in_step(root_dir, local_dir, user):
    for d in (root_dir, local_dir):
        f = os.path.join(d, "f")
        H.write_file(f, b"x")
        run("setfacl", "-m", f"u:{user.name}:rwx,g::r-x", f)
        os.chmod(f, 0o640)  # the mask becomes r--: the named entry is effectively r--
        g = os.path.join(d, "g")
        H.write_file(g, b"x")
        run("setfacl", "-m", "g::rwx,o::r", g)  # no named entries: the mode alone
        os.chmod(g, 0o701)
        os.mkdir(os.path.join(d, "sub"))
        run("setfacl", "-m", f"u:{user.name}:rwx", os.path.join(d, "sub"))
        os.chmod(os.path.join(d, "sub"), 0o1750)
    same_as_ext4(root_dir, local_dir)
    assert stat.S_IMODE(os.stat(os.path.join(root_dir, "f")).st_mode) == 0o640
    assert opens(user, os.path.join(root_dir, "f"), os.O_WRONLY) == errno.EACCES
    assert opens(user, os.path.join(root_dir, "f"), os.O_RDONLY) == 0


def _populate(d, umask):
    old = os.umask(umask)
    try:
        os.close(os.open(os.path.join(d, "file"), os.O_CREAT | os.O_WRONLY, 0o666))
        os.close(os.open(os.path.join(d, "exe"), os.O_CREAT | os.O_WRONLY, 0o777))
        os.mkdir(os.path.join(d, "sub"), 0o777)
        os.close(os.open(os.path.join(d, "sub", "inner"), os.O_CREAT | os.O_WRONLY, 0o644))
        os.mkdir(os.path.join(d, "sub", "deeper"), 0o750)
        os.mkfifo(os.path.join(d, "fifo"), 0o666)
        os.symlink("file", os.path.join(d, "link"))
    finally:
        os.umask(old)


def test_default_acl_inherited_umask_only_without(root_dir, local_dir, user):
    for d in (root_dir, local_dir):
        with_acl = os.path.join(d, "with")
        os.mkdir(with_acl)
        run("setfacl", "-d", "-m", f"u:{user.name}:rwx,g::r-x,o::---", with_acl)
        run("setfacl", "-m", f"u:{user.name}:rx", with_acl)
        _populate(with_acl, 0o077)  # ignored: the default ACL decides
        plain = os.path.join(d, "plain")
        os.mkdir(plain)
        _populate(plain, 0o027)
        # A default ACL that is only the mode's: inherited as modes, no access ACL.
        minimal = os.path.join(d, "minimal")
        os.mkdir(minimal)
        run("setfacl", "-d", "--set", "u::rwx,g::rx,o::r", minimal)
        _populate(minimal, 0o077)
    same_as_ext4(root_dir, local_dir)
    w = os.path.join(root_dir, "with")
    assert stat.S_IMODE(os.stat(os.path.join(w, "file")).st_mode) == 0o660, "umask not applied"
    assert DEFAULT in os.listxattr(os.path.join(w, "sub", "deeper")), "subdirectories inherit the default"
    assert DEFAULT not in os.listxattr(os.path.join(w, "file"))
    assert stat.S_IMODE(os.stat(os.path.join(root_dir, "plain", "file")).st_mode) == 0o640, "umask applied"
    assert ACCESS not in os.listxattr(os.path.join(root_dir, "minimal", "file"))
    # The inherited entry works for the named user.
    assert user.run(H.read_file, os.path.join(w, "file")) == b""
    # Removing the default ACL: later creates use the umask again.
    for d in (root_dir, local_dir):
        run("setfacl", "-k", os.path.join(d, "with"))
        old = os.umask(0o077)
        try:
            os.close(os.open(os.path.join(d, "with", "after"), os.O_CREAT | os.O_WRONLY, 0o666))
        finally:
            os.umask(old)
    same_as_ext4(root_dir, local_dir)
    assert stat.S_IMODE(os.stat(os.path.join(w, "after")).st_mode) == 0o600


def _acl_tree(d, user):
    os.makedirs(os.path.join(d, "proj", "data"))
    H.write_file(os.path.join(d, "proj", "plain"), b"p" * 1000)
    H.write_file(os.path.join(d, "proj", "shared"), b"s" * 5000)
    run("setfacl", "-m", f"u:{user.name}:rw,g:{user.gid}:r", os.path.join(d, "proj", "shared"))
    run("setfacl", "-d", "-m", f"u:{user.name}:rwx", os.path.join(d, "proj", "data"))
    run("setfacl", "-m", f"u:{user.name}:rx", os.path.join(d, "proj", "data"))
    H.write_file(os.path.join(d, "proj", "data", "made"), b"m")  # inherits
    os.symlink("shared", os.path.join(d, "proj", "link"))


def test_cp_a_and_rsync_aA_preserve(root_dir, local_dir, user):
    src = os.path.join(local_dir, "src")
    os.mkdir(src)
    _acl_tree(src, user)
    run("cp", "-a", os.path.join(src, "proj"), os.path.join(root_dir, "cp"))
    same_as_ext4(os.path.join(root_dir, "cp"), os.path.join(src, "proj"))
    run("cp", "-a", os.path.join(root_dir, "cp"), os.path.join(local_dir, "back"))
    same_as_ext4(os.path.join(local_dir, "back"), os.path.join(src, "proj"))
    if shutil.which("rsync") is None:
        pytest.skip("rsync missing")
    run("rsync", "-aA", os.path.join(src, "proj") + "/", os.path.join(root_dir, "rs") + "/")
    same_as_ext4(os.path.join(root_dir, "rs"), os.path.join(src, "proj"))
    run("rsync", "-aA", os.path.join(root_dir, "rs") + "/", os.path.join(local_dir, "rsback") + "/")
    same_as_ext4(os.path.join(local_dir, "rsback"), os.path.join(src, "proj"))


def _acl_value(*entries):
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", t, p, i) for t, p, i in entries)


def test_refusals(root_dir, local_dir, user, user2):
    undef = 0xFFFFFFFF
    no_mask = _acl_value((1, 6, undef), (2, 6, 1000), (4, 4, undef), (0x20, 0, undef))
    bad_values = {
        b"\x02\x00\x00\x00garbage": errno.EINVAL,  # not whole entries
        b"\x02\x00": errno.EINVAL,  # no header
        no_mask: errno.EINVAL,  # a named entry needs a mask
        _acl_value((4, 4, undef), (1, 6, undef), (0x20, 0, undef)): errno.EINVAL,  # order
        _acl_value((1, 6, undef), (4, 9, undef), (0x20, 0, undef)): errno.EINVAL,  # perm
        b"\x01\x00\x00\x00" + b"\x00" * 8: None,  # version 1: whatever ext4 says
    }
    for bad, want in bad_values.items():
        got = []
        for d in (root_dir, local_dir):
            f = os.path.join(d, "bad")
            H.write_file(f, b"x")
            got.append(H.errno_of(os.setxattr, f, ACCESS, bad))
            assert ACCESS not in os.listxattr(f)
        assert got[0] == got[1] != 0, (bad, got)
        assert want is None or got[0] == want, (bad, got)
    for d in (root_dir, local_dir):
        f = os.path.join(d, "f")
        H.write_file(f, b"x")
        # A default ACL belongs to directories.
        assert H.errno_of(os.setxattr, f, DEFAULT, _acl_value((1, 6, undef), (4, 4, undef), (0x20, 0, undef))) == errno.EACCES
        # Only the owner (or root) sets ACLs, even with write permission.
        os.chmod(f, 0o666)
        assert user.errno(os.setxattr, f, ACCESS, _acl_value((1, 6, undef), (4, 6, undef), (0x20, 6, undef))) == errno.EPERM
        assert subprocess.run(
            ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "setfacl", "-m", "u:0:r", f],
            capture_output=True,
        ).returncode != 0
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o666
        assert ACCESS not in os.listxattr(f)
        # Other system.* names keep their answers.
        assert H.errno_of(os.getxattr, f, "system.nfs4_acl") in (errno.ENODATA, errno.EOPNOTSUPP)
    # The owner may; setting an ACL as a non-member of the group clears set-group-ID.
    for d in (root_dir, local_dir):
        g = os.path.join(d, "g")
        H.write_file(g, b"x")
        os.chown(g, user.uid, 0)
        os.chmod(g, 0o2770)
        user.run(os.setxattr, g, ACCESS, _acl_value((1, 7, undef), (2, 4, user2.uid), (4, 7, undef), (0x10, 7, undef), (0x20, 0, undef)))
    same_as_ext4(root_dir, local_dir)
    assert stat.S_IMODE(os.stat(os.path.join(root_dir, "g")).st_mode) == 0o770


@pytest.fixture(scope="module")
def second_mount(cluster):
    mp2 = os.path.join(cluster.dir, "mnt2")
    cluster.mount(mp2)
    yield mp2
    try:
        cluster.umount(mp2)
    except Exception as e:  # the cluster teardown cleans up and reports leftovers
        print(f"umount {mp2}: {e}")


def test_second_mount_enforces_and_inherits(root_dir, second_mount, user, user2):
    name = os.path.basename(root_dir)
    other = os.path.join(second_mount, name)
    f = os.path.join(root_dir, "f")
    H.write_file(f, b"data", mode=0o600)
    os.chmod(f, 0o600)
    d = os.path.join(root_dir, "d")
    os.mkdir(d)
    # Mount B looks first: its caches hold "no ACL" until the attribute lifetime ends.
    assert opens(user, os.path.join(other, "f"), os.O_RDONLY) == errno.EACCES
    os.close(os.open(os.path.join(other, "d", "before"), os.O_CREAT | os.O_WRONLY, 0o666))
    run("setfacl", "-m", f"u:{user.name}:r", f)
    run("setfacl", "-d", "-m", f"u:{user2.name}:rw", d)
    time.sleep(ATTR_TIMEOUT)
    assert user.run(H.read_file, os.path.join(other, "f")) == b"data"
    assert opens(user2, os.path.join(other, "f"), os.O_RDONLY) == errno.EACCES
    # Creates from mount B in the directory (entries and inodes on both servers)
    # inherit what mount A set.
    old = os.umask(0o077)
    try:
        for i in range(12):
            os.close(os.open(os.path.join(other, "d", f"n{i}"), os.O_CREAT | os.O_WRONLY, 0o644))
        os.mkdir(os.path.join(other, "d", "sub"))
    finally:
        os.umask(old)
    want = run("getfacl", "-n", "--omit-header", os.path.join(d, "n0"))
    assert f"user:{user2.uid}:rw-" in want
    for i in range(12):
        assert run("getfacl", "-n", "--omit-header", os.path.join(d, f"n{i}")) == want
        assert user2.run(H.read_file, os.path.join(other, "d", f"n{i}")) == b""
    assert DEFAULT in os.listxattr(os.path.join(d, "sub"))
    # Removing the ACL on A: refused on B again after the lifetime.
    run("setfacl", "-b", f)
    time.sleep(ATTR_TIMEOUT)
    assert opens(user, os.path.join(other, "f"), os.O_RDONLY) == errno.EACCES
