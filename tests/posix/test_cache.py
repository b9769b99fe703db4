"""Cache instances (docs/cache.md): a `spillway cluster` made a cache of a PFS directory
(`cluster up --cache-pfs`), the PFS a loop-mounted XFS (another file system, as a PFS
is; its file handles are what the servers map inode numbers to).

The mount shows the PFS directory's tree; reads that miss are fetched by the servers;
writes are absorbed and written behind; names change on the PFS at once, as the
caller's permissions allow; a server killed with dirty data resumes write-behind from
its log after a restart, and the PFS ends byte-identical to what was written."""

import errno
import os
import random
import shutil
import tempfile
import time

import pytest

import spwhelpers as H
from spwhelpers import MiB, assert_errno, p

# Write-behind starts after at most this long (the flush policy's age, plus a pass).
SETTLE = 30.0


@pytest.fixture(scope="module")
def pfs():
    """A 1 GiB XFS mounted on a fresh directory: the PFS. Its root is 0755 root's, with
    a 1777 `shared/` directory to cache."""
    base = tempfile.mkdtemp(prefix=H.BASE_PREFIX + "cachepfs-")
    os.chmod(base, 0o755)
    try:
        with H.loop_xfs(os.path.join(base, "pfs"), os.path.join(base, "pfs.img"), "1G") as mnt:
            shared = os.path.join(mnt, "shared")
            os.mkdir(shared)
            os.chmod(shared, 0o1777)
            yield mnt
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def cache(request, spillway_bin, pfs):
    """(cluster, cached PFS directory): two servers caching `pfs/shared`, 64 KiB stripes
    so that files span both servers."""
    c = H.Cluster(spillway_bin, "cache", servers=2, capacity="1G", stripe_size="64K")
    tun = os.path.join(c.dir, "tunables")
    with open(tun, "w") as f:
        f.write(f"pfs_roots = {pfs}\n")
    shared = os.path.join(pfs, "shared")
    failed_before = request.session.testsfailed
    try:
        c.up(extra=["--cache-pfs", shared, "--tunables", tun])
        yield c, shared
    finally:
        logs = H.kept_logs_dir(c.dir) if request.session.testsfailed > failed_before else None
        c.teardown(keep_logs_to=logs)


def fresh(root, name):
    d = os.path.join(root, name)
    os.mkdir(d)
    return d


def wait_for_pfs(path, want, timeout=SETTLE):
    """Poll until the PFS file at `path` holds exactly `want`."""
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        try:
            with open(path, "rb") as f:
                got = f.read()
        except FileNotFoundError:
            got = None
        if got == want:
            return
        time.sleep(0.2)
    have = "missing" if got is None else f"{len(got)} bytes"
    raise AssertionError(f"{path}: the PFS never held the {len(want)} bytes written ({have})")


def test_the_mount_shows_the_pfs_tree(cache):
    c, shared = cache
    d = fresh(shared, "tree")
    os.makedirs(os.path.join(d, "a", "b"))
    data = os.urandom(3 * MiB + 12345)
    H.write_file(os.path.join(d, "a", "b", "f"), data, mode=0o640)
    os.symlink("b/f", os.path.join(d, "a", "link"))
    os.chown(os.path.join(d, "a", "b", "f"), 1234, 5678)
    m = p(c.mnt, "tree")
    assert sorted(os.listdir(m)) == ["a"]
    assert sorted(os.listdir(p(m, "a"))) == ["b", "link"]
    st = os.stat(p(m, "a", "b", "f"))
    assert (st.st_size, st.st_mode & 0o7777, st.st_uid, st.st_gid) == (len(data), 0o640, 1234, 5678)
    assert os.readlink(p(m, "a", "link")) == "b/f"
    # A read that misses: the servers fetch the PFS bytes (through the link too).
    assert H.read_file(p(m, "a", "link")) == data
    assert H.read_file(p(m, "a", "b", "f")) == data


def test_a_file_written_through_the_cache_reaches_the_pfs(cache):
    c, shared = cache
    fresh(c.mnt, "written")
    data = os.urandom(5 * MiB + 777)
    H.write_file(p(c.mnt, "written", "new"), data, mode=0o600)
    # The name is on the PFS at once; the bytes follow behind.
    assert os.path.exists(os.path.join(shared, "written", "new"))
    wait_for_pfs(os.path.join(shared, "written", "new"), data)
    assert os.stat(os.path.join(shared, "written", "new")).st_mode & 0o7777 == 0o600
    assert H.read_file(p(c.mnt, "written", "new")) == data


def test_small_random_writes_into_a_pfs_file_reach_it_whole(cache):
    c, shared = cache
    d = fresh(shared, "random")
    base = bytearray(os.urandom(2 * MiB))
    H.write_file(os.path.join(d, "f"), bytes(base))
    rng = random.Random(18)
    fd = os.open(p(c.mnt, "random", "f"), os.O_RDWR)
    try:
        for _ in range(400):
            off = rng.randrange(0, len(base) + 4096)
            n = rng.choice([1, 100, 4096])
            b = os.urandom(n)
            os.pwrite(fd, b, off)
            end = off + n
            if end > len(base):
                base.extend(b"\0" * (end - len(base)))
            base[off:end] = b
        os.fsync(fd)
    finally:
        os.close(fd)
    assert H.read_file(p(c.mnt, "random", "f")) == bytes(base)
    wait_for_pfs(os.path.join(d, "f"), bytes(base))


def test_names_change_on_the_pfs_at_once(cache):
    c, shared = cache
    m = fresh(c.mnt, "names")
    d = os.path.join(shared, "names")
    os.mkdir(p(m, "sub"))
    assert os.path.isdir(os.path.join(d, "sub"))
    H.write_file(p(m, "sub", "x"), b"x")
    os.rename(p(m, "sub", "x"), p(m, "y"))
    assert sorted(os.listdir(d)) == ["sub", "y"]
    os.link(p(m, "y"), p(m, "z"))
    assert os.stat(os.path.join(d, "z")).st_nlink == 2
    os.unlink(p(m, "y"))
    os.unlink(p(m, "z"))
    os.rmdir(p(m, "sub"))
    assert os.listdir(d) == []
    # And what the PFS does directly is seen by the next lookup.
    H.write_file(os.path.join(d, "direct"), b"direct")
    assert H.read_file(p(m, "direct")) == b"direct"
    assert_errno(errno.ENOTEMPTY, os.rmdir, m)


def test_truncate_cuts_the_cache_and_the_pfs(cache):
    c, shared = cache
    fresh(c.mnt, "trunc")
    data = os.urandom(MiB)
    H.write_file(p(c.mnt, "trunc", "f"), data)
    os.truncate(p(c.mnt, "trunc", "f"), 1000)
    assert H.read_file(p(c.mnt, "trunc", "f")) == data[:1000]
    wait_for_pfs(os.path.join(shared, "trunc", "f"), data[:1000])
    # Settled: nothing written behind regrows it.
    time.sleep(2)
    assert os.path.getsize(os.path.join(shared, "trunc", "f")) == 1000


def test_the_pfs_permissions_hold_for_users(cache, users):
    """The caller's permissions are the PFS's: another user's 0600 file is not
    readable through the cache, a file made is the maker's on the PFS."""
    c, shared = cache
    u1, u2 = users
    d = fresh(shared, "perm")
    os.chmod(d, 0o1777)
    secret = os.path.join(d, "secret")
    H.write_file(secret, b"only mine", mode=0o600)
    os.chown(secret, u1.uid, u1.gid)
    assert u1.run(H.read_file, p(c.mnt, "perm", "secret")) == b"only mine"
    assert u2.errno(H.read_file, p(c.mnt, "perm", "secret")) == errno.EACCES
    assert u2.errno(os.unlink, p(c.mnt, "perm", "secret")) == errno.EPERM  # sticky
    u2.run(H.write_file, p(c.mnt, "perm", "mine"), b"u2's", 0o644)
    st = os.stat(os.path.join(d, "mine"))
    assert (st.st_uid, st.st_gid) == (u2.uid, u2.gid)
    wait_for_pfs(os.path.join(d, "mine"), b"u2's")


def test_wait_sync_complete_returns_once_the_pfs_holds_the_file(cache):
    """`dw_wait_sync_complete(fd)` (libdatawarp sets `user.spillway.sync`): the file's
    changes, still in the client's write-back and the servers' cache, are on the PFS
    when it returns (write-behind alone would wait seconds)."""
    c, shared = cache
    fresh(c.mnt, "sync")
    data = os.urandom(MiB + 99)
    fd = os.open(p(c.mnt, "sync", "f"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.setxattr(fd, "user.spillway.sync", b"1")
        assert H.read_file(os.path.join(shared, "sync", "f")) == data
    finally:
        os.close(fd)
    assert "user.spillway.sync" not in os.listxattr(p(c.mnt, "sync", "f"))


def _logged(c, text):
    """Lines of the namespace server's log (server 0) holding `text`."""
    with open(os.path.join(c.dir, "logs", "server-0.log"), errors="replace") as f:
        return sum(text in line for line in f)


DROPPED = "cached copy dropped"
CONFLICT = "changed on the PFS while the cache holds writes"


def test_a_file_changed_on_the_pfs_is_read_anew_at_the_next_open(cache):
    """Coherence at open (docs/cache.md section 7): a file rewritten directly on the PFS
    while its bytes are cached shows the PFS's bytes and size at the next open, whether
    the size changed or not, and whether the cache read or wrote it first."""
    c, shared = cache
    d = fresh(shared, "coherent")
    path, m = os.path.join(d, "f"), p(c.mnt, "coherent", "f")
    old = os.urandom(300_000)
    H.write_file(path, old)
    # Read through the mount: cached on both servers (64 KiB stripes).
    assert H.read_file(m) == old
    dropped = _logged(c, DROPPED)
    for new in (os.urandom(len(old)), os.urandom(500_000), os.urandom(1000)):
        H.write_file(path, new)
        assert H.read_file(m) == new
        assert os.stat(m).st_size == len(new)
    assert _logged(c, DROPPED) == dropped + 3

    # Written through the cache (its size shown ahead of the PFS until written
    # behind), then cut short on the PFS: the PFS's size, not the cache's.
    w = p(c.mnt, "coherent", "w")
    data = os.urandom(200_000)
    H.write_file(w, data)
    wait_for_pfs(os.path.join(d, "w"), data)
    H.write_file(os.path.join(d, "w"), b"short")
    assert H.read_file(w) == b"short"
    assert os.stat(w).st_size == 5


def test_the_cache_s_own_write_behind_is_not_a_change_on_the_pfs(cache):
    """A file written through the cache and written behind (by both servers, each on
    its own), renamed and chmod'ed through the mount, is opened again without its
    cached copy being dropped."""
    c, shared = cache
    fresh(c.mnt, "own")
    m = p(c.mnt, "own", "f")
    data = os.urandom(700_000)
    H.write_file(m, data)
    wait_for_pfs(os.path.join(shared, "own", "f"), data)
    dropped = _logged(c, DROPPED)
    for _ in range(3):
        assert H.read_file(m) == data
    os.chmod(m, 0o600)
    os.rename(m, p(c.mnt, "own", "g"))
    assert H.read_file(p(c.mnt, "own", "g")) == data
    # And a second write-behind of it.
    more = os.urandom(100_000)
    with open(p(c.mnt, "own", "g"), "r+b", buffering=0) as f:
        f.seek(650_000)
        f.write(more)
    data = data[:650_000] + more
    wait_for_pfs(os.path.join(shared, "own", "g"), data)
    assert H.read_file(p(c.mnt, "own", "g")) == data
    assert H.read_file(p(c.mnt, "own", "g")) == data
    assert _logged(c, DROPPED) == dropped
    assert _logged(c, CONFLICT) == 0


def test_writes_not_yet_on_the_pfs_win_over_a_change_there(cache):
    """A file written through the cache and changed directly on the PFS before its
    write-behind: the cached writes win (read at the next open, then written to the
    PFS), with a warning naming the inode; once they are on the PFS the next open drops
    the copy and reads the PFS's bytes, which are the writes."""
    c, shared = cache
    fresh(c.mnt, "wins")
    m, path = p(c.mnt, "wins", "f"), os.path.join(shared, "wins", "f")
    data = os.urandom(300_000)
    H.write_file(m, data)
    # Write-behind waits 5 s: the PFS file is still empty.
    if H.read_file(path) == data:
        pytest.skip("the write-behind came before the PFS could be changed under it")
    conflicts = _logged(c, CONFLICT)
    H.write_file(path, os.urandom(len(data)))
    assert H.read_file(m) == data
    assert _logged(c, CONFLICT) == conflicts + 1
    wait_for_pfs(path, data)
    dropped = _logged(c, DROPPED)
    deadline = time.monotonic() + SETTLE
    while _logged(c, DROPPED) == dropped and time.monotonic() < deadline:
        # An open while a write-behind still runs decides nothing yet.
        assert H.read_file(m) == data
        time.sleep(0.2)
    assert _logged(c, DROPPED) == dropped + 1
    assert H.read_file(m) == data


def test_what_the_servers_keep_of_a_cache_is_root_s_alone(cache):
    """The cache's own files (cache.json, writeback.log, pfsns.sqlite and its WAL) hold
    which directory is cached, for whom, and every cached name's file handle: 0600 in
    0700 directories, like the rest of a fragment."""
    c, _ = cache
    H.write_file(p(c.mnt, "modes-probe"), b"x")
    seen = set()
    for top, dirs, files in os.walk(os.path.join(c.dir, "servers")):
        for d in dirs:
            st = os.lstat(os.path.join(top, d))
            assert st.st_mode & 0o077 == 0, (os.path.join(top, d), oct(st.st_mode))
        for f in files:
            path = os.path.join(top, f)
            st = os.lstat(path)
            if f.endswith(".log") and os.path.basename(top) == "logs":
                continue
            assert st.st_mode & 0o077 == 0, (path, oct(st.st_mode))
            seen.add(f)
    assert {"cache.json", "writeback.log", "pfsns.sqlite"} <= seen, seen


def test_kill_9_with_dirty_data_then_restart_loses_nothing(cache):
    """Servers killed with written-behind bytes only in their stripes and log: after a
    restart the write-behind resumes and the PFS ends byte-identical."""
    c, shared = cache
    fresh(c.mnt, "crash")
    files = {f"f{i}": os.urandom(300_000 + i * 70_001) for i in range(4)}
    for name, data in files.items():
        H.write_file(p(c.mnt, "crash", name), data)
    for i in range(c.servers):
        c.kill_server(i)
    on_pfs = {n: H.read_file(os.path.join(shared, "crash", n)) for n in files}
    dirty_at_kill = [n for n, d in files.items() if on_pfs[n] != d]
    for i in range(c.servers):
        c.start_server(i)
    for name, data in files.items():
        wait_for_pfs(os.path.join(shared, "crash", name), data)
    for name, data in files.items():
        assert H.read_file(p(c.mnt, "crash", name)) == data
    # The kill came before write-behind (its age is 5 s): the log is what carried them.
    assert dirty_at_kill, "every file was on the PFS before the kill: nothing was tested"


def _stripe_bytes(c):
    """Bytes the servers' stripe files hold on disk."""
    total = 0
    for top, _, files in os.walk(os.path.join(c.dir, "servers")):
        if "stripes" in top.split(os.sep):
            total += sum(os.lstat(os.path.join(top, f)).st_blocks * 512 for f in files)
    return total


def test_a_stream_goes_to_the_pfs_past_the_stripe_files(cache):
    """A sequential writer's bytes go straight to the PFS file (docs/cache.md, "Streams"):
    the stripe files take only the start of each server's run. A write into the streamed
    range wins in order, fsync makes all of it durable (a kill -9 of every server right
    after loses nothing), and reads through the mount give the bytes written."""
    c, shared = cache
    d = fresh(c.mnt, "stream")
    before = _stripe_bytes(c)
    total = 48 * MiB
    model = bytearray(_pattern(30, total))
    fd = os.open(p(d, "f"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for off in range(0, total, MiB):
            os.pwrite(fd, model[off:off + MiB], off)
            if off == 24 * MiB:
                # A random write into bytes already streamed.
                x = os.urandom(4096)
                os.pwrite(fd, x, 10 * MiB + 123)
                model[10 * MiB + 123:10 * MiB + 123 + 4096] = x
        os.fsync(fd)
    finally:
        os.close(fd)
    grown = _stripe_bytes(c) - before
    for i in range(c.servers):
        c.kill_server(i)
    for i in range(c.servers):
        c.start_server(i)
    assert H.read_file(p(d, "f")) == model
    wait_for_pfs(os.path.join(shared, "stream", "f"), bytes(model))
    # Without the bypass every byte would be in a stripe file (the cache is 1 GiB).
    assert grown < total // 4, f"{grown} bytes of stripe files for a {total}-byte stream"


def test_an_open_file_keeps_its_data_after_its_last_name_goes(cache):
    """DataWarp: 'if the file is open, the invalidate and removal is deferred until the
    last close' (issue 30, item 7): reads of bytes never cached, writes, fsync and close
    all work; the name is gone at once; nothing is left on the PFS after the close."""
    c, shared = cache
    d = fresh(shared, "openunlink")
    data = os.urandom(3 * MiB + 5)
    H.write_file(os.path.join(d, "f"), data)
    m = p(c.mnt, "openunlink")
    fd = os.open(p(m, "f"), os.O_RDWR)
    try:
        os.unlink(p(m, "f"))
        assert os.listdir(m) == []
        assert not os.path.exists(p(m, "f"))
        assert os.fstat(fd).st_nlink == 0
        # Bytes never read before come from the PFS file, which still exists.
        assert os.pread(fd, len(data), 0) == data
        os.pwrite(fd, b"w" * 4096, MiB)
        os.fsync(fd)
        assert os.pread(fd, 4096, MiB) == b"w" * 4096
        # A new file of the same name is another file.
        H.write_file(p(m, "f"), b"new")
        assert os.pread(fd, 3, 0) == data[:3]
    finally:
        os.close(fd)
    assert H.read_file(p(m, "f")) == b"new"
    # The hidden name goes with the last close.
    deadline = time.monotonic() + 5
    while sorted(os.listdir(d)) != ["f"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sorted(os.listdir(d)) == ["f"]
    wait_for_pfs(os.path.join(d, "f"), b"new")

    # The temporary-file pattern: create, unlink, write, fsync, read back, close.
    fd = os.open(p(m, "tmp"), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.unlink(p(m, "tmp"))
        blob = os.urandom(MiB + 17)
        assert os.write(fd, blob) == len(blob)
        os.fsync(fd)
        assert os.pread(fd, len(blob), 0) == blob
    finally:
        os.close(fd)

    # A rename over an open file: the reader keeps reading the file it opened.
    old = os.urandom(2 * MiB)
    H.write_file(os.path.join(d, "b"), old)
    H.write_file(os.path.join(d, "a"), b"replacement")
    fd = os.open(p(m, "b"), os.O_RDONLY)
    try:
        os.rename(p(m, "a"), p(m, "b"))
        assert os.fstat(fd).st_nlink == 0
        assert os.pread(fd, len(old), 0) == old
    finally:
        os.close(fd)
    assert H.read_file(p(m, "b")) == b"replacement"
    deadline = time.monotonic() + 5
    while sorted(os.listdir(d)) != ["b", "f"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sorted(os.listdir(d)) == ["b", "f"]
    # The server's names for such files cannot be made or seen through the mount.
    assert_errno(errno.EPERM, H.write_file, p(m, ".spillway-unlinked-1"), b"x")


def test_cluster_down_writes_the_cache_behind_or_refuses(spillway_bin, pfs):
    """`spillway cluster down` of a cache (issue 30, item 8): every byte written through
    the mount reaches the PFS before the servers go; while it cannot (the PFS read-only)
    the command fails saying so, the servers keep the data, and a later `down` ends it."""
    import subprocess

    d = os.path.join(pfs, "down")
    os.mkdir(d)
    c = H.Cluster(spillway_bin, "cachedown", servers=2, capacity="512M", stripe_size="64K")
    tun = os.path.join(c.dir, "tunables")
    with open(tun, "w") as f:
        f.write(f"pfs_roots = {pfs}\n")
    try:
        c.up(extra=["--cache-pfs", d, "--tunables", tun])
        data = os.urandom(10 * MiB + 3)
        H.write_file(p(c.mnt, "copied"), data)
        subprocess.run(["sync", "-f", p(c.mnt, "copied")], check=True)
        H.run_cli(spillway_bin, ["cluster", "down", "--dir", c.dir])
        assert H.read_file(os.path.join(d, "copied")) == data
        assert not os.path.exists(c.dir)

        c = H.Cluster(spillway_bin, "cachedown", servers=2, capacity="512M", stripe_size="64K")
        with open(os.path.join(c.dir, "tunables"), "w") as f:
            f.write(f"pfs_roots = {pfs}\n")
        c.up(extra=["--cache-pfs", d, "--tunables", os.path.join(c.dir, "tunables")])
        late = os.urandom(3 * MiB + 1)
        H.write_file(p(c.mnt, "late"), late)
        subprocess.run(["mount", "-o", "remount,ro", pfs], check=True)
        try:
            r = H.run_cli(spillway_bin, ["cluster", "down", "--dir", c.dir], check=False)
            assert r.returncode != 0
            assert "could not be written" in r.stderr, r.stderr
            assert os.path.exists(c.dir)
        finally:
            subprocess.run(["mount", "-o", "remount,rw", pfs], check=True)
        deadline = time.monotonic() + 90
        while True:
            r = H.run_cli(spillway_bin, ["cluster", "down", "--dir", c.dir], check=False)
            if r.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert r.returncode == 0, r.stderr
        assert H.read_file(os.path.join(d, "late")) == late
    finally:
        c.teardown()


def test_pfs_changes_seen_by_size_and_change_time(cache):
    """Issue 30, item 9: a PFS file that grows under a reader holding it open reads its
    new bytes (not zeros) once the new size shows; a rewrite of the same size whose
    mtime was put back is seen at the next open (its ctime moved)."""
    c, shared = cache
    d = fresh(shared, "coherence2")
    m = p(c.mnt, "coherence2")
    first = os.urandom(100_000)
    H.write_file(os.path.join(d, "grows"), first)
    fd = os.open(p(m, "grows"), os.O_RDONLY)
    try:
        assert os.pread(fd, len(first) + 4096, 0) == first
        more = os.urandom(300_000)
        with open(os.path.join(d, "grows"), "ab") as f:
            f.write(more)
        time.sleep(1.3)  # the attribute lifetime: the new size shows
        assert os.fstat(fd).st_size == len(first) + len(more)
        assert os.pread(fd, len(more), len(first)) == more
    finally:
        os.close(fd)

    old = os.urandom(64 * 1024)
    H.write_file(os.path.join(d, "same"), old)
    st = os.stat(os.path.join(d, "same"))
    assert H.read_file(p(m, "same")) == old
    new = os.urandom(64 * 1024)
    H.write_file(os.path.join(d, "same"), new)
    os.utime(os.path.join(d, "same"), ns=(st.st_atime_ns, st.st_mtime_ns))
    time.sleep(1.3)
    assert H.read_file(p(m, "same")) == new


# ---- a cache much smaller than what is written (issue 30, item 10)


def _pattern(seed, n):
    """n repeatable pseudo-random bytes (made a MiB at a time: randbytes is limited)."""
    r = random.Random(seed)
    return b"".join(r.randbytes(min(MiB, n - k)) for k in range(0, n, MiB))


def _write_counting(path, seed, total, size):
    """Write `total` bytes of `_pattern(seed, total)` to a new file at `path` in
    `size`-byte write(2) calls, none retried; the calls that returned short, as
    (offset, asked, returned), and the seconds it took."""
    data = _pattern(seed, total)
    short = []
    t0 = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for off in range(0, total, size):
            chunk = data[off:off + size]
            n = os.write(fd, chunk)
            if n != len(chunk):
                short.append((off, len(chunk), n))
        os.fsync(fd)
    finally:
        os.close(fd)
    return short, time.monotonic() - t0


def _sha_of(data):
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _pfs_sha(path):
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MiB), b""):
            h.update(block)
    return h.hexdigest()


def _wait_for_pfs_sha(path, size, sha, timeout=120.0):
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        if os.path.exists(path) and os.path.getsize(path) == size:
            got = _pfs_sha(path)
            if got == sha:
                return
        time.sleep(0.5)
    have = os.path.getsize(path) if os.path.exists(path) else "missing"
    raise AssertionError(f"{path}: the PFS never held the {size} bytes written (size {have})")


@pytest.fixture(scope="module")
def small_cache(request, spillway_bin, pfs):
    """(cluster, cached PFS directory): a 64 MiB cache (two fragments of 32 MiB) of
    `pfs/small`, made with no tunables file: `cluster up --cache-pfs` names the
    directory in the servers' pfs_roots itself."""
    small = os.path.join(pfs, "small")
    os.mkdir(small)
    os.chmod(small, 0o1777)
    c = H.Cluster(spillway_bin, "cachesmall", servers=2, capacity="64M", stripe_size="1M")
    failed_before = request.session.testsfailed
    try:
        c.up(extra=["--cache-pfs", small])
        yield c, small
    finally:
        logs = H.kept_logs_dir(c.dir) if request.session.testsfailed > failed_before else None
        c.teardown(keep_logs_to=logs)


def test_a_cache_smaller_than_the_writes_never_answers_a_short_write(small_cache, users):
    """300 MiB in 1 MiB writes, then 96 MiB in 8 KiB writes, by a user, through a
    64 MiB cache: every write(2) returns its full count (the servers make room by
    evicting and writing behind instead of answering what fit), a read through the
    mount while the cache is full of unwritten data gets its bytes (not ENOSPC), and
    the PFS ends byte-identical. Before: the write that found a fragment nearly full
    was answered with the part that fit, or ENOSPC, and applications do not retry
    short writes."""
    c, small = small_cache
    u1, _ = users
    big, little = 300 * MiB, 96 * MiB
    short, took = u1.run(_write_counting, p(c.mnt, "big.dat"), 10, big, MiB)
    assert short == [], f"{len(short)} short writes of 1 MiB (first: {short[:3]})"
    short, _ = u1.run(_write_counting, p(c.mnt, "little.dat"), 11, little, 8192)
    assert short == [], f"{len(short)} short writes of 8 KiB (first: {short[:3]})"
    # Through the mount, and on the PFS once written behind, as the user wrote them.
    assert _pfs_sha(p(c.mnt, "little.dat")) == _sha_of(_pattern(11, little))
    _wait_for_pfs_sha(os.path.join(small, "big.dat"), big, _sha_of(_pattern(10, big)))
    _wait_for_pfs_sha(os.path.join(small, "little.dat"), little, _sha_of(_pattern(11, little)))
    assert os.stat(os.path.join(small, "big.dat")).st_uid == u1.uid
    # `df` counts what is not yet on the PFS, not the clean copies (room for writes).
    deadline = time.monotonic() + SETTLE
    while True:
        st = os.statvfs(c.mnt)
        if st.f_bfree == st.f_blocks or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert st.f_bfree == st.f_blocks, "df shows the clean cached bytes as used"


# ---- `spillway cluster up --cache-pfs` and the directive's cache policies


def _server_cache_configs(c):
    """Every fragment's cache.json under the cluster's servers."""
    import glob
    import json

    found = glob.glob(os.path.join(c.dir, "servers", "*", "**", "cache.json"), recursive=True)
    return [json.load(open(f)) for f in sorted(found)]


def test_cluster_up_takes_the_directive_s_cache_policies(spillway_bin, pfs, users, request):
    """`cluster up --cache-pfs DIR` with no tunables file (DIR goes into the servers'
    pfs_roots by itself) and the directive's policy keys as options: every server
    holds them, and sync_on_close=yes makes close return with the file on the PFS.
    Bad values and policies without --cache-pfs are refused before anything starts."""
    d = os.path.join(pfs, "policies")
    os.mkdir(d)
    os.chmod(d, 0o1777)
    c = H.Cluster(spillway_bin, "cachepol", servers=2, capacity="256M", stripe_size="64K")
    bad = [
        (["--cache-pfs", d, "--sync-on-close", "maybe"], "is not yes or no"),
        (["--cache-pfs", d, "--read-ahead", "2G"], "more than 1GiB"),
        (["--cache-pfs", d, "--modified-threshold", "lots"], "--modified-threshold"),
        (["--sync-to-pfs", "yes"], "--cache-pfs"),
    ]
    for extra, says in bad:
        r = H.run_cli(spillway_bin, c.up_args() + extra, timeout=120, check=False)
        assert r.returncode != 0 and says in r.stderr, (extra, r.stderr)
        assert not os.path.ismount(c.mnt)
    failed_before = request.session.testsfailed
    try:
        c.up(extra=[
            "--cache-pfs", d, "--sync-on-close", "yes", "--sync-to-pfs", "yes",
            "--modified-threshold", "1M", "--read-ahead", "2M",
        ])
        confs = _server_cache_configs(c)
        assert len(confs) == 2
        for conf in confs:
            assert (conf["pfs_dir"], conf["sync_on_close"], conf["sync_to_pfs"]) == (d, True, True)
            assert (conf["modified_threshold"], conf["read_ahead"]) == (MiB, 2 * MiB)
        # sync_on_close: on the PFS when close returns, no waiting.
        u1, _ = users
        want = _pattern(12, 3 * MiB + 5)
        u1.run(H.write_file, p(c.mnt, "closed.dat"), want, 0o644)
        with open(os.path.join(d, "closed.dat"), "rb") as f:
            assert f.read() == want
        # A resumed `up` keeps the policies; other ones are refused, saying why.
        r = H.run_cli(spillway_bin, c.up_args() + ["--cache-pfs", d, "--sync-on-close", "no"],
                      timeout=120, check=False)
        assert r.returncode != 0 and "keeps the cache policies" in r.stderr, r.stderr
    finally:
        logs = H.kept_logs_dir(c.dir) if request.session.testsfailed > failed_before else None
        c.teardown(keep_logs_to=logs)
