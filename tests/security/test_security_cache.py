"""Issue 30, items 1 and 2: a cache instance protects exactly what the PFS protects.

Each case is the attack as an unprivileged user, against a cluster caching a directory
of a loop-mounted XFS (the PFS):

* the directories above the cached one keep protecting it: files made with umask 022
  under a 0700 directory are not readable through the mount by another user, who gets
  EACCES at the mount root as on the PFS (the client's gate, crates/spillway-client/
  src/gate.rs, asking the namespace server, crates/spillway-server/src/cache/reach.rs);
* a removal in a sticky directory is made on the PFS as the caller, so it is judged
  against what the name holds at that moment: B cannot remove the file A put where
  B's own file was a moment before (the kernel checked B's old file)."""

import errno
import os
import shutil
import tempfile
import time

import pytest

import spwhelpers as H
from spwhelpers import p

pytestmark = pytest.mark.spillway_only


@pytest.fixture(scope="module")
def pfs():
    base = tempfile.mkdtemp(prefix=H.BASE_PREFIX + "seccache-")
    os.chmod(base, 0o755)
    try:
        with H.loop_xfs(os.path.join(base, "pfs"), os.path.join(base, "pfs.img"), "512M") as mnt:
            yield mnt
    finally:
        shutil.rmtree(base, ignore_errors=True)


def cache_cluster(request, binary, pfs, cached, name):
    c = H.Cluster(binary, name, servers=2, capacity="512M", stripe_size="64K")
    tun = os.path.join(c.dir, "tunables")
    with open(tun, "w") as f:
        f.write(f"pfs_roots = {pfs}\n")
    c.up(extra=["--cache-pfs", cached, "--tunables", tun])
    return c


@pytest.fixture
def cluster_of(request, spillway_bin, pfs):
    made = []

    def make(cached, name):
        c = cache_cluster(request, spillway_bin, pfs, cached, name)
        made.append(c)
        return c

    failed_before = request.session.testsfailed
    yield make
    for c in made:
        logs = H.kept_logs_dir(c.dir) if request.session.testsfailed > failed_before else None
        c.teardown(keep_logs_to=logs)


def errno_of(fn, *args):
    try:
        fn(*args)
    except OSError as e:
        return e.errno
    return 0


def test_a_closed_directory_above_the_cache_protects_what_lies_beneath(users, pfs, cluster_of):
    a, b = users
    home = os.path.join(pfs, "A")
    priv = os.path.join(home, "priv")
    data = os.path.join(priv, "data")
    os.makedirs(data)
    for d, mode in ((home, 0o755), (priv, 0o700), (data, 0o755)):
        os.chown(d, a.uid, a.gid)
        os.chmod(d, mode)
    secret = os.path.join(data, "secret.txt")
    with open(secret, "w") as f:
        f.write("A's secret\n")
    os.chown(secret, a.uid, a.gid)
    os.chmod(secret, 0o644)  # umask 022: protected only by priv/ above
    drop = os.path.join(data, "drop")
    os.mkdir(drop)
    os.chown(drop, a.uid, a.gid)
    os.chmod(drop, 0o777)

    def read(path):
        with open(path) as f:
            return f.read()

    # On the PFS itself B is refused at priv/.
    assert H.as_user(b.uid, b.gid, errno_of, read, secret) == errno.EACCES
    c = cluster_of(data, "seccache-anc")
    m = c.mnt
    # Through the mount: B is refused at the mount root, whatever it tries.
    assert H.as_user(b.uid, b.gid, errno_of, read, p(m, "secret.txt")) == errno.EACCES
    assert H.as_user(b.uid, b.gid, errno_of, os.listdir, m) == errno.EACCES
    assert H.as_user(b.uid, b.gid, errno_of, os.stat, m) == errno.EACCES
    assert H.as_user(b.uid, b.gid, errno_of, os.stat, p(m, "drop")) == errno.EACCES
    assert H.as_user(b.uid, b.gid, errno_of, H.write_file, p(m, "drop", "x"), b"B") == errno.EACCES
    assert H.as_user(b.uid, b.gid, errno_of, os.chdir, m) == errno.EACCES
    assert not os.path.exists(os.path.join(drop, "x"))
    # A, who can reach it on the PFS, reads and writes through the mount; so does root.
    assert H.as_user(a.uid, a.gid, read, p(m, "secret.txt")) == "A's secret\n"
    H.as_user(a.uid, a.gid, H.write_file, p(m, "drop", "a"), b"A")
    assert read(p(m, "secret.txt")) == "A's secret\n"
    # B still refused right after A's accesses (nothing of A's answer serves B).
    assert H.as_user(b.uid, b.gid, errno_of, read, p(m, "secret.txt")) == errno.EACCES
    # The PFS decides: priv/ opened to B's group, B gets through within the answers'
    # lifetime (1 s); closed again, refused again.
    os.chown(priv, a.uid, b.gid)
    os.chmod(priv, 0o710)
    time.sleep(1.5)
    assert H.as_user(b.uid, b.gid, read, p(m, "secret.txt")) == "A's secret\n"
    os.chmod(priv, 0o700)
    time.sleep(1.5)
    assert H.as_user(b.uid, b.gid, errno_of, read, p(m, "secret.txt")) == errno.EACCES
    # A supplementary group counts as on the PFS.
    os.chmod(priv, 0o710)
    time.sleep(1.5)
    assert H.as_user(a.uid, a.gid, read, p(m, "secret.txt")) == "A's secret\n"


def test_a_removal_in_a_sticky_directory_is_judged_on_what_the_name_holds_now(users, pfs, cluster_of):
    a, b = users
    sticky = os.path.join(pfs, "sticky")
    os.mkdir(sticky)
    os.chmod(sticky, 0o1777)
    c = cluster_of(sticky, "seccache-sticky")
    m = c.mnt
    gone = 0
    for i in range(4):
        name = f"x{i}"
        on_pfs = os.path.join(sticky, name)
        # B's own file, seen through the mount (the kernel keeps its entry for 1 s).
        H.as_user(b.uid, b.gid, H.write_file, on_pfs, b"B's")
        assert H.as_user(b.uid, b.gid, lambda q: os.stat(q).st_uid, p(m, name)) == b.uid
        # B removes it on the PFS; A puts a file of its own in its place.
        H.as_user(b.uid, b.gid, os.unlink, on_pfs)
        H.as_user(a.uid, a.gid, H.write_file, on_pfs, b"A's")
        # B's unlink through the mount, within the second: the sticky rule refuses it.
        e = H.as_user(b.uid, b.gid, errno_of, os.unlink, p(m, name))
        if os.path.exists(on_pfs):
            assert e in (errno.EPERM, errno.EACCES), e
        else:
            gone += 1
    assert gone == 0, f"B removed A's file {gone} times of 4"
    # Nor can B rename A's file away, or replace it by a rename.
    H.as_user(b.uid, b.gid, H.write_file, os.path.join(sticky, "mine"), b"B's")
    assert H.as_user(b.uid, b.gid, errno_of, os.rename, p(m, "x0"), p(m, "y")) in (errno.EPERM, errno.EACCES)
    assert H.as_user(b.uid, b.gid, errno_of, os.rename, p(m, "mine"), p(m, "x1")) in (
        errno.EPERM,
        errno.EACCES,
    )
    assert H.read_file(os.path.join(sticky, "x0")) == b"A's"
    assert H.read_file(os.path.join(sticky, "x1")) == b"A's"
    # B's own removals and renames still work, and A's of its own file (once the
    # kernel's entry of B's old x0 has expired: names changed on the PFS directly show
    # within the entry lifetime).
    time.sleep(1.2)
    H.as_user(b.uid, b.gid, os.rename, p(m, "mine"), p(m, "mine2"))
    H.as_user(b.uid, b.gid, os.unlink, p(m, "mine2"))
    H.as_user(a.uid, a.gid, os.unlink, p(m, "x0"))
    assert not os.path.exists(os.path.join(sticky, "x0"))
