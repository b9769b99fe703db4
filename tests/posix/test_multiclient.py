"""Two client mounts of one instance (`spillway mount --instance DIR/instance.json MNT2`):
close-to-open coherency, name visibility within the attribute timeout, concurrent creates
from both mounts into one shared directory, and their spread over the servers."""

import errno
import mmap
import os
import shutil
import subprocess
import time

import pytest

import spwhelpers as H
from spwhelpers import MiB

pytestmark = pytest.mark.spillway_only

CLUSTER_OPTS = {"servers": 3, "capacity": "4G"}
ATTR_TIMEOUT = 2.0  # names and attributes must show up on the other mount within this


@pytest.fixture
def pair(mounts, request):
    """(dir on mount A, the same dir on mount B)."""
    a_root, b_root = mounts
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)[:60] + f"-{time.monotonic_ns()}"
    a, b = os.path.join(a_root, name), os.path.join(b_root, name)
    os.mkdir(a)
    assert H.poll(lambda: os.path.isdir(b), timeout=ATTR_TIMEOUT), "new directory not visible on mount B"
    yield a, b
    shutil.rmtree(a, ignore_errors=True)


def j(*a):
    return os.path.join(*a)


def test_second_mount_is_a_mount(mounts, cluster):
    a, b = mounts
    assert H.is_mounted(b)
    sa, sb = os.statvfs(a), os.statvfs(b)
    assert sa.f_blocks * sa.f_frsize == sb.f_blocks * sb.f_frsize == cluster.capacity()


def test_mounts_get_the_readahead_window(mounts):
    """The kernel caps a FUSE mount's readahead at 128 KiB whatever the file system
    negotiates; the client sets its device's window to max_readahead (16 MiB)."""
    for mp in mounts:
        dev = os.stat(mp).st_dev
        knob = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
        with open(knob) as f:
            assert int(f.read()) == 16384, knob


def test_close_to_open_basic(pair):
    a, b = pair
    data = os.urandom(5 * MiB + 123)
    H.write_file(j(a, "f"), data)
    got = H.read_file(j(b, "f"))
    assert len(got) == len(data), f"B read {len(got)} bytes of {len(data)} right after A's close"
    assert got == data
    fd = os.open(j(b, "f"), os.O_RDONLY)
    assert os.fstat(fd).st_size == len(data), "after open, B's size must be exact"
    os.close(fd)


def test_close_to_open_after_append_truncate_rewrite(pair):
    a, b = pair
    v1 = os.urandom(MiB)
    H.write_file(j(a, "f"), v1)
    assert H.read_file(j(b, "f")) == v1  # B now has v1 cached

    extra = os.urandom(100_000)
    fd = os.open(j(a, "f"), os.O_WRONLY | os.O_APPEND)
    os.write(fd, extra)
    os.close(fd)
    assert H.read_file(j(b, "f")) == v1 + extra, "B must see A's append after A closed"

    v3 = b"short now\n" * 30
    H.write_file(j(a, "f"), v3)  # O_TRUNC + rewrite, smaller
    got = H.read_file(j(b, "f"))
    assert got == v3, f"B read {len(got)} bytes (expected {len(v3)}) after A truncated and rewrote"

    v4 = bytes(x ^ 0xFF for x in v3)  # same size, different bytes
    fd = os.open(j(a, "f"), os.O_WRONLY)
    os.pwrite(fd, v4, 0)
    os.close(fd)
    assert H.read_file(j(b, "f")) == v4, "same-size rewrite must not be served from B's stale cache"

    fd = os.open(j(a, "f"), os.O_WRONLY)
    os.ftruncate(fd, 7)
    os.close(fd)
    fd = os.open(j(b, "f"), os.O_RDONLY)
    assert os.fstat(fd).st_size == 7
    assert os.read(fd, 100) == v4[:7]
    os.close(fd)


def test_close_to_open_fsync_without_close(pair):
    """fsync is the other point where data is guaranteed on the servers."""
    a, b = pair
    data = os.urandom(2 * MiB)
    fd = os.open(j(a, "f"), os.O_WRONLY | os.O_CREAT, 0o644)
    H.pwrite_all(fd, data, 0)
    os.fsync(fd)
    assert H.read_file(j(b, "f")) == data
    os.close(fd)


def test_unlinked_and_recreated_file_seen_by_open(pair):
    """A unlinks and recreates a name B has opened before: B's next open gets the new file
    (close-to-open: an open sees what the servers hold at open time)."""
    a, b = pair
    H.write_file(j(a, "f"), b"old contents")
    assert H.read_file(j(b, "f")) == b"old contents"
    os.unlink(j(a, "f"))
    H.write_file(j(a, "f"), b"brand new")
    assert H.read_file(j(b, "f")) == b"brand new"


def test_renamed_over_file_seen_by_open(pair):
    """A renames a new file over a name B has opened before (the atomic-replace idiom):
    B's next open gets the new file."""
    a, b = pair
    H.write_file(j(a, "f"), b"old contents")
    assert H.read_file(j(b, "f")) == b"old contents"
    H.write_file(j(a, "tmp"), b"renamed over")
    os.rename(j(a, "tmp"), j(a, "f"))
    assert H.read_file(j(b, "f")) == b"renamed over"


def test_create_and_unlink_visible_within_attr_timeout(pair):
    a, b = pair
    assert os.listdir(b) == []
    assert not os.path.exists(j(b, "new"))  # B caches the negative lookup too
    H.write_file(j(a, "new"), b"x")
    t0 = time.monotonic()
    assert H.poll(lambda: "new" in os.listdir(b), timeout=ATTR_TIMEOUT), "create not visible in B's listdir"
    assert H.poll(lambda: os.path.exists(j(b, "new")), timeout=ATTR_TIMEOUT), "create not visible to B's stat"
    print(f"\nvisible on B after {time.monotonic() - t0:.2f} s")
    os.mkdir(j(a, "sub"))
    assert H.poll(lambda: os.path.isdir(j(b, "sub")), timeout=ATTR_TIMEOUT)
    H.write_file(j(b, "sub", "fromB"), b"B")
    assert H.poll(lambda: os.listdir(j(a, "sub")) == ["fromB"], timeout=ATTR_TIMEOUT)
    assert H.read_file(j(a, "sub", "fromB")) == b"B"
    os.unlink(j(a, "new"))
    assert H.poll(lambda: "new" not in os.listdir(b), timeout=ATTR_TIMEOUT), "unlink not visible in B's listdir"
    assert H.poll(lambda: not os.path.exists(j(b, "new")), timeout=ATTR_TIMEOUT)
    assert H.errno_of(os.open, j(b, "new"), os.O_RDONLY) == errno.ENOENT


def test_a_name_another_mount_just_made_is_found_at_once(pair):
    """Issue 31, item 1: a miss is not remembered (negative_ttl 0), so an open or stat
    right after another mount's create finds the name, as ROMIO's open on every rank
    after rank 0's create needs (it stats the path on every rank first). Before: the
    miss was kept for entry_ttl and the open answered ENOENT for another 1.01 s."""
    a, b = pair
    for k in range(20):
        name = f"x{k}"
        assert H.errno_of(os.stat, j(b, name)) == errno.ENOENT
        fd = os.open(j(a, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
        os.close(fd)
        fd = os.open(j(b, name), os.O_RDWR)  # at once: no wait, no retry
        os.close(fd)
        os.stat(j(b, name))
        # The same with a directory and a path through it.
        assert H.errno_of(os.stat, j(b, f"d{k}", "f")) == errno.ENOENT
        os.mkdir(j(a, f"d{k}"))
        H.write_file(j(a, f"d{k}", "f"), b"f")
        assert H.read_file(j(b, f"d{k}", "f")) == b"f"


def test_walks_see_the_other_mounts_changes_within_attr_timeout(pair):
    """A walk on A (READDIRPLUS, listings read ahead) shows names B created, removed
    and renamed within the attribute timeout: listings read ahead are served only
    while younger than the entry lifetime."""
    a, b = pair
    for i in range(10):
        os.makedirs(j(a, f"d{i}", "sub"))
        H.write_file(j(a, f"d{i}", "f"), b"a")

    def names(root):
        return {os.path.relpath(j(t, n), root) for t, ds, fs in os.walk(root) for n in ds + fs}

    before = names(a)
    assert H.poll(lambda: names(b) == before, timeout=ATTR_TIMEOUT)
    for rnd in range(3):
        names(a)  # A lists, and reads the subdirectories ahead
        H.write_file(j(b, "d3", f"fromB{rnd}"), b"B")
        os.rename(j(b, "d7", "f"), j(b, "d7", f"g{rnd}"))
        os.mkdir(j(b, "d9", "sub", f"x{rnd}"))
        want = names(b)
        assert H.poll(lambda: names(a) == want, timeout=ATTR_TIMEOUT), sorted(names(a) ^ want)
        os.rename(j(b, "d7", f"g{rnd}"), j(b, "d7", "f"))
    # A listing read ahead and left unused past the entry lifetime is not served: B's
    # create made after it shows in A's very next listing.
    os.listdir(a)  # reads d0.. ahead
    time.sleep(1.5)
    H.write_file(j(b, "d2", "late"), b"B")
    assert "late" in os.listdir(j(a, "d2")), "a listing older than the entry lifetime was served"


def test_directory_removed_elsewhere_is_gone_within_attr_timeout(pair):
    """The client answers repeated lookups of a subdirectory from what the server said
    within the entry lifetime (the kernel forces one on every mkdir of an existing
    name): another client's rmdir must still show within that lifetime, and after it
    a mkdir of the name succeeds."""
    a, b = pair
    os.mkdir(j(a, "d"))
    assert H.errno_of(os.mkdir, j(a, "d")) == errno.EEXIST  # answered from the cache
    assert H.poll(lambda: os.path.isdir(j(b, "d")), timeout=ATTR_TIMEOUT)
    os.rmdir(j(b, "d"))
    t0 = time.monotonic()

    def recreated():
        try:
            os.mkdir(j(a, "d"))
            return True
        except FileExistsError:
            return False

    assert H.poll(recreated, timeout=ATTR_TIMEOUT), "B's rmdir not seen by A's mkdir"
    print(f"\nrmdir on B seen by A's mkdir after {time.monotonic() - t0:.2f} s")
    assert H.poll(lambda: os.path.isdir(j(b, "d")), timeout=ATTR_TIMEOUT)


def test_rename_seen_on_other_mount(pair):
    a, b = pair
    os.mkdir(j(a, "d1"))
    H.write_file(j(a, "d1", "f"), b"moving")
    assert H.poll(lambda: os.path.exists(j(b, "d1", "f")), timeout=ATTR_TIMEOUT)
    assert H.read_file(j(b, "d1", "f")) == b"moving"
    os.rename(j(a, "d1", "f"), j(a, "g"))
    assert H.poll(lambda: not os.path.exists(j(b, "d1", "f")) and os.path.exists(j(b, "g")), timeout=ATTR_TIMEOUT)
    assert H.read_file(j(b, "g")) == b"moving"
    os.rename(j(a, "d1"), j(a, "d2"))
    assert H.poll(lambda: sorted(os.listdir(b)) == ["d2", "g"], timeout=ATTR_TIMEOUT), os.listdir(b)
    H.write_file(j(b, "d2", "inB"), b"b")
    assert H.read_file(j(a, "d2", "inB")) == b"b"


def test_mmap_on_a_seen_by_b(pair):
    a, b = pair
    H.write_file(j(a, "f"), bytes(64 * 1024))
    fd = os.open(j(a, "f"), os.O_RDWR)
    m = mmap.mmap(fd, 64 * 1024, mmap.MAP_SHARED)
    m[1000:1010] = b"0123456789"
    m.flush()
    m.close()
    os.close(fd)
    assert H.read_file(j(b, "f"))[1000:1010] == b"0123456789"


def test_permissions_same_on_both_mounts(pair, user):
    a, b = pair
    H.write_file(j(a, "secret"), b"s", mode=0o600)
    os.chmod(j(a, "secret"), 0o600)
    assert H.poll(lambda: os.path.exists(j(b, "secret")), timeout=ATTR_TIMEOUT)
    assert user.errno(os.open, j(b, "secret"), os.O_RDONLY) == errno.EACCES
    os.chown(j(a, "secret"), user.uid, user.gid)
    assert H.poll(lambda: os.stat(j(b, "secret")).st_uid == user.uid, timeout=ATTR_TIMEOUT)
    assert user.run(H.read_file, j(b, "secret")) == b"s"


def _creator(dirpath, tag, n, contended, out_w):
    """Child: create n unique files and race for the contended names; report winners."""
    won = []
    for i in range(n):
        fd = os.open(j(dirpath, f"{tag}-{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, f"{tag}:{i}".encode())
        os.close(fd)
        if i < contended:
            try:
                fd = os.open(j(dirpath, f"c-{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                continue
            os.write(fd, tag.encode())
            os.close(fd)
            won.append(i)
    os.write(out_w, (",".join(map(str, won)) + "\n").encode())


def _server_usage(cluster):
    out = []
    for k in range(cluster.servers):
        r = subprocess.run(["du", "-s", "--inodes", cluster.server_root(k)], capture_output=True, text=True)
        inodes = int(r.stdout.split()[0]) if r.returncode == 0 and r.stdout else -1
        r = subprocess.run(["du", "-sb", cluster.server_root(k)], capture_output=True, text=True)
        size = int(r.stdout.split()[0]) if r.returncode == 0 and r.stdout else -1
        out.append((inodes, size))
    return out


@pytest.mark.timeout(600)
def test_concurrent_creates_from_both_mounts(pair, cluster):
    a, b = pair
    n, contended = 1500, 300
    usage0 = _server_usage(cluster)
    status0 = cluster.status_json()
    children = []
    t0 = time.monotonic()
    for tag, root in (("A", a), ("B", b)):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(r)
                _creator(root, tag, n, contended, w)
            except BaseException as e:
                os.write(w, f"ERROR {e!r}\n".encode())
                code = 1
            os._exit(code)
        os.close(w)
        children.append((tag, pid, r))
    wins = {}
    for tag, pid, r in children:
        data = H.read_to_eof(r)
        _, st = os.waitpid(pid, 0)
        text = data.decode().strip()
        assert os.waitstatus_to_exitcode(st) == 0, f"creator on mount {tag} failed: {text}"
        wins[tag] = set(int(x) for x in text.split(",") if x)
    elapsed = time.monotonic() - t0
    print(f"\n{2 * n + contended} creates from two mounts in {elapsed:.1f} s")

    assert not (wins["A"] & wins["B"]), f"both mounts won O_EXCL for {sorted(wins['A'] & wins['B'])[:10]}"
    assert wins["A"] | wins["B"] == set(range(contended)), "some contended names were created by nobody"
    expected = {f"{t}-{i}" for t in "AB" for i in range(n)} | {f"c-{i}" for i in range(contended)}
    for side, root in (("A", a), ("B", b)):
        names = H.poll(lambda: (lambda l: l if set(l) == expected else None)(os.listdir(root)), timeout=ATTR_TIMEOUT)
        names = names or os.listdir(root)
        assert len(names) == len(set(names)), f"duplicate names in readdir on mount {side}"
        missing, extra = expected - set(names), set(names) - expected
        assert not missing and not extra, f"mount {side}: missing {sorted(missing)[:10]}, extra {sorted(extra)[:10]}"
    for i in range(0, contended, 7):
        winner = "A" if i in wins["A"] else "B"
        assert H.read_file(j(a, f"c-{i}")) == winner.encode()
        assert H.read_file(j(b, f"c-{i}")) == winner.encode()
    for i in range(0, n, 97):
        assert H.read_file(j(b, f"A-{i}")) == f"A:{i}".encode()
        assert H.read_file(j(a, f"B-{i}")) == f"B:{i}".encode()

    # spread over the servers: where the first stripe of a sample of the files lives
    per_server = [0] * cluster.servers
    sample = [f"{t}-{i}" for t in "AB" for i in range(0, n, 50)]
    for name in sample:
        lines = cluster.stripes(j(a, name))
        assert len(lines) == 1, f"{name}: {lines}"
        per_server[lines[0][1]] += 1
    print(f"first stripes of {len(sample)} sampled files per server: {per_server}")
    assert all(c > 0 for c in per_server), f"files not spread over all servers: {per_server}"
    assert max(per_server) <= 0.7 * len(sample), f"placement badly skewed: {per_server}"

    usage1 = _server_usage(cluster)
    print(f"per-server (inodes, bytes) before {usage0} after {usage1}")
    status1 = cluster.status_json()
    if status0 is not None and status1 is not None:
        print(f"cluster status before: {status0}\nafter: {status1}")
        counts = _per_server_counts(status0, status1)
        if counts:
            assert all(d > 0 for d in counts), f"metadata (inodes) not spread over all servers: {counts}"


def _per_server_counts(s0, s1):
    """Per-server growth of an inode/file count in `cluster status --json`, if it has one."""
    def servers(s):
        return s.get("servers") if isinstance(s, dict) else s

    a, b = servers(s0), servers(s1)
    if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b):
        return None
    out = []
    for x, y in zip(a, b):
        if not isinstance(x, dict):
            return None
        key = next((k for k in x if any(w in k.lower() for w in ("inode", "files")) and isinstance(x[k], int)), None)
        if key is None:
            return None
        out.append(y.get(key, 0) - x[key])
    return out


def test_umount_second_mount(cluster):
    mp = os.path.join(cluster.dir, "mnt3")
    cluster.mount(mp)
    H.write_file(os.path.join(mp, "via-mnt3"), b"3")
    cluster.umount(mp)
    assert not H.is_mounted(mp)
    t0 = time.monotonic()
    left = H.poll(lambda: not H.pids_mentioning(mp), timeout=10)
    assert left, f"the client process of an unmounted mount still runs 10 s later: {H.pids_mentioning(mp)}"
    print(f"\nclient process gone {time.monotonic() - t0:.2f} s after `spillway umount` returned")
    assert H.read_file(os.path.join(cluster.mnt, "via-mnt3")) == b"3"
    os.unlink(os.path.join(cluster.mnt, "via-mnt3"))
