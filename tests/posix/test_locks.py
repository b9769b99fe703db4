"""Locks and O_CREAT between two mounts of one instance (issue 15, item 4): fcntl byte
ranges, F_GETLK, F_SETLKW waits (and their signals), flock, locks dropped when the
holder closes, exits, is killed or its client dies; open(O_CREAT) of a name the other
mount created (races, cached negative lookups, `>>`, permissions, O_TRUNC, directories,
symlinks)."""

import errno
import fcntl
import multiprocessing
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time

import pytest

import spwhelpers as H

pytestmark = pytest.mark.spillway_only

CLUSTER_OPTS = {"servers": 3, "capacity": "1G"}
CONFLICT = (errno.EAGAIN, errno.EACCES)
FLOCK_FMT = "hhqqi4x"  # struct flock on x86_64/aarch64 Linux

HOLDER = r"""
import fcntl, os, sys, time
path, how, kind, start, length = sys.argv[1:6]
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
k = {"ex": fcntl.LOCK_EX, "sh": fcntl.LOCK_SH}[kind]
if how == "flock":
    fcntl.flock(fd, k | fcntl.LOCK_NB)
else:
    fcntl.lockf(fd, k | fcntl.LOCK_NB, int(length), int(start))
print("locked", flush=True)
line = sys.stdin.readline()
if line.strip() == "unlock":
    if how == "flock":
        fcntl.flock(fd, fcntl.LOCK_UN)
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN, int(length), int(start))
    print("unlocked", flush=True)
    sys.stdin.readline()
"""


class Holder:
    """A process on one mount holding a lock until told otherwise."""

    def __init__(self, path, how="fcntl", kind="ex", start=0, length=0):
        self.p = subprocess.Popen(
            [sys.executable, "-c", HOLDER, path, how, kind, str(start), str(length)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        assert line.strip() == "locked", f"holder could not lock {path}: {line!r}"

    def unlock(self):
        self.p.stdin.write("unlock\n")
        self.p.stdin.flush()
        assert self.p.stdout.readline().strip() == "unlocked"

    def exit(self):
        self.p.stdin.close()
        self.p.wait(timeout=10)

    def kill(self):
        self.p.kill()
        self.p.wait(timeout=10)


@pytest.fixture
def pair(mounts, request):
    """(dir on mount A, the same dir on mount B), mode 0777."""
    a_root, b_root = mounts
    name = request.node.name.replace("[", "_").replace("]", "")[:50] + f"-{time.monotonic_ns()}"
    a, b = os.path.join(a_root, name), os.path.join(b_root, name)
    os.mkdir(a)
    os.chmod(a, 0o777)
    assert H.poll(lambda: os.path.isdir(b), timeout=3), "new directory not visible on mount B"
    yield a, b
    shutil.rmtree(a, ignore_errors=True)


def try_lockf(path, kind, length, start):
    """Non-blocking lockf from this process on `path`: 'ok' or the errno."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.lockf(fd, kind | fcntl.LOCK_NB, length, start)
        fcntl.lockf(fd, fcntl.LOCK_UN, length, start)
        return "ok"
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)


def try_flock(path, kind):
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
        return "ok"
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)


def test_fcntl_ranges_conflict_across_mounts(pair):
    a, b = pair
    fa, fb = os.path.join(a, "f"), os.path.join(b, "f")
    w = Holder(fa, "fcntl", "ex", 0, 100)  # bytes 0..99
    r = Holder(fa, "fcntl", "sh", 1000, 100)  # bytes 1000..1099
    try:
        assert H.poll(lambda: os.path.exists(fb), timeout=3)
        assert try_lockf(fb, fcntl.LOCK_EX, 50, 50) in CONFLICT
        assert try_lockf(fb, fcntl.LOCK_SH, 1, 99) in CONFLICT
        assert try_lockf(fb, fcntl.LOCK_EX, 100, 100) == "ok", "disjoint range"
        assert try_lockf(fb, fcntl.LOCK_SH, 10, 1050) == "ok", "read locks share"
        assert try_lockf(fb, fcntl.LOCK_EX, 10, 1050) in CONFLICT
        # F_GETLK from B names A's lock and its holder (on this node: its pid).
        fd = os.open(fb, os.O_RDWR)
        try:
            res = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(FLOCK_FMT, fcntl.F_WRLCK, os.SEEK_SET, 10, 5, 0))
            l_type, _, l_start, l_len, l_pid = struct.unpack(FLOCK_FMT, res)
            assert (l_type, l_start, l_len, l_pid) == (fcntl.F_WRLCK, 0, 100, w.p.pid)
            res = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(FLOCK_FMT, fcntl.F_WRLCK, os.SEEK_SET, 500, 10, 0))
            assert struct.unpack(FLOCK_FMT, res)[0] == fcntl.F_UNLCK
        finally:
            os.close(fd)
        # Unlocking a sub-range of A's lock frees just that part.
        w.unlock()
        assert try_lockf(fb, fcntl.LOCK_EX, 100, 0) == "ok"
    finally:
        w.kill()
        r.kill()


def test_setlkw_waits_until_the_holder_unlocks(pair):
    a, b = pair
    w = Holder(os.path.join(a, "f"), "fcntl", "ex", 0, 0)
    fd = os.open(os.path.join(b, "f"), os.O_RDWR)
    got = []
    t = threading.Thread(target=lambda: (fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0), got.append(time.monotonic())))
    try:
        t.start()
        time.sleep(0.8)
        assert not got, "F_SETLKW on B went through while A holds the lock"
        released = time.monotonic()
        w.unlock()
        t.join(timeout=5)
        assert got, "F_SETLKW on B did not proceed after A unlocked"
        assert got[0] - released < 1.0
    finally:
        w.kill()
        t.join(timeout=5)
        os.close(fd)


def _blocked_waiter(path, q):
    def on_alarm(*_):
        raise TimeoutError("alarm")

    signal.signal(signal.SIGALRM, on_alarm)
    fd = os.open(path, os.O_RDWR)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    t = time.monotonic()
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        q.put(("locked", time.monotonic() - t))
    except TimeoutError:
        q.put(("interrupted", time.monotonic() - t))


def test_setlkw_is_interrupted_by_signals(pair):
    """A signal ends a blocked F_SETLKW (its handler runs, EINTR), and SIGKILL kills a
    blocked waiter at once rather than leaving it unkillable until the lock frees."""
    a, b = pair
    w = Holder(os.path.join(a, "f"), "fcntl", "ex", 0, 0)
    ctx = multiprocessing.get_context("fork")
    try:
        q = ctx.Queue()
        p = ctx.Process(target=_blocked_waiter, args=(os.path.join(b, "f"), q))
        p.start()
        what, took = q.get(timeout=10)
        p.join(timeout=5)
        assert what == "interrupted" and took < 2.0, (what, took)
        waiter = subprocess.Popen([sys.executable, "-c",
                                   "import fcntl,os,sys; fd=os.open(sys.argv[1], os.O_RDWR); fcntl.lockf(fd, fcntl.LOCK_EX)",
                                   os.path.join(b, "f")])
        time.sleep(0.5)
        assert waiter.poll() is None, "the waiter should be blocked"
        t = time.monotonic()
        waiter.kill()
        waiter.wait(timeout=10)
        assert time.monotonic() - t < 2.0
    finally:
        w.kill()


@pytest.mark.parametrize("end", ["exit", "kill"])
def test_locks_go_when_the_holder_exits_or_is_killed(pair, end):
    a, b = pair
    for how in ("fcntl", "flock"):
        f = f"{how}-{end}"
        w = Holder(os.path.join(a, f), how, "ex", 0, 0)
        fb = os.path.join(b, f)
        probe = (lambda: try_lockf(fb, fcntl.LOCK_EX, 0, 0)) if how == "fcntl" else (lambda: try_flock(fb, fcntl.LOCK_EX))
        assert probe() in CONFLICT + (errno.EWOULDBLOCK,)
        w.exit() if end == "exit" else w.kill()
        assert H.poll(lambda: probe() == "ok", timeout=2.0), f"{how} lock outlived its holder ({end})"


def test_flock_across_mounts(pair):
    a, b = pair
    fa, fb = os.path.join(a, "f"), os.path.join(b, "f")
    w = Holder(fa, "flock", "ex")
    try:
        assert try_flock(fb, fcntl.LOCK_EX) == errno.EWOULDBLOCK
        assert try_flock(fb, fcntl.LOCK_SH) == errno.EWOULDBLOCK
        # flock and fcntl locks live apart, as on Linux.
        assert try_lockf(fb, fcntl.LOCK_EX, 0, 0) == "ok"
        w.unlock()
        assert try_flock(fb, fcntl.LOCK_EX) == "ok"
    finally:
        w.kill()
    s = Holder(fa, "flock", "sh")
    try:
        assert try_flock(fb, fcntl.LOCK_SH) == "ok", "shared flocks share"
        assert try_flock(fb, fcntl.LOCK_EX) == errno.EWOULDBLOCK
    finally:
        s.kill()


def test_a_killed_clients_locks_go(cluster, pair):
    """SIGKILL of a mount's client process: its connections close and the homes drop
    its locks at once (the lease bound, 30 s, is for a client machine that vanishes)."""
    a, b = pair
    mp3 = os.path.join(cluster.dir, "mnt3")
    cluster.mount(mp3)
    name = os.path.basename(a)
    w = None
    try:
        w = Holder(os.path.join(mp3, name, "f"), "fcntl", "ex", 0, 0)
        fb = os.path.join(b, "f")
        assert try_lockf(fb, fcntl.LOCK_EX, 0, 0) in CONFLICT
        clients = [p for p in H.pids_mentioning(mp3) if p != w.p.pid]
        assert clients, "no client process for the third mount"
        for p in clients:
            os.kill(p, signal.SIGKILL)
        t = time.monotonic()
        assert H.poll(lambda: try_lockf(fb, fcntl.LOCK_EX, 0, 0) == "ok", timeout=5.0)
        print(f"lock free {time.monotonic() - t:.2f} s after the client was killed")
    finally:
        if w:
            w.kill()
        subprocess.run(["umount", "-l", mp3], capture_output=True)


def test_locks_node_keeps_locks_in_the_kernel(cluster, pair):
    """`locks = node` (a client tunable, like Lustre's localflock): that mount's locks
    are its node kernel's, not enforced against other mounts, and cost no round trip."""
    a, b = pair
    mp = os.path.join(cluster.dir, "mnt-nodelocks")
    os.makedirs(mp, exist_ok=True)
    tun = os.path.join(cluster.dir, "nodelocks.tunables")
    with open(tun, "w") as f:
        f.write("locks = node\n")
    H.run_cli(cluster.binary, ["mount", "--instance", cluster.instance_path, "--tunables", tun, mp],
              timeout=120)
    w = None
    try:
        w = Holder(os.path.join(a, "f"), "fcntl", "ex", 0, 0)
        assert try_lockf(os.path.join(b, "f"), fcntl.LOCK_EX, 0, 0) in CONFLICT
        assert try_lockf(os.path.join(mp, os.path.basename(a), "f"), fcntl.LOCK_EX, 0, 0) == "ok"
    finally:
        if w:
            w.kill()
        H.run_cli(cluster.binary, ["umount", mp], timeout=120)


# ----------------------------------------------------------------- open(O_CREAT)


def _creator(d, names, barrier, q):
    errs = []
    for n in names:
        try:
            barrier.wait(timeout=30)
        except Exception:
            pass
        try:
            fd = os.open(os.path.join(d, n), os.O_CREAT | os.O_WRONLY, 0o644)
            os.close(fd)
        except OSError as e:
            errs.append((n, e.errno))
    q.put(errs)


def test_concurrent_o_creat_from_two_mounts(pair):
    a, b = pair
    names = [f"n{i}" for i in range(200)]
    ctx = multiprocessing.get_context("fork")
    barrier, q = ctx.Barrier(2), ctx.Queue()
    ps = [ctx.Process(target=_creator, args=(d, names, barrier, q)) for d in (a, b)]
    for p in ps:
        p.start()
    errs = q.get(timeout=120) + q.get(timeout=120)
    for p in ps:
        p.join(timeout=10)
    assert errs == [], f"{len(errs)} failed opens, e.g. {errs[:5]}"
    assert sorted(os.listdir(a)) == sorted(names)


@pytest.fixture(scope="module")
def negmount(cluster):
    """A mount whose kernel keeps misses (`negative_ttl_ms`, 0 by default): there the
    kernel sends CREATE for a name it believes absent that another mount made meanwhile
    (fs/existing.rs), which these tests are about."""
    mp = os.path.join(cluster.dir, "mnt-neg")
    tun = os.path.join(cluster.dir, "neg.tunables")
    with open(tun, "w") as f:
        f.write("negative_ttl_ms = 60000\n")
    cluster.mount(mp, tunables=tun)
    yield mp
    try:
        cluster.umount(mp)
    except Exception as e:  # the cluster teardown cleans up and reports leftovers
        print(f"umount {mp}: {e}")


@pytest.fixture
def negpair(pair, negmount, mounts):
    """(dir on mount A, the same dir on the mount that keeps misses)."""
    a, b = pair
    nb = os.path.join(negmount, os.path.relpath(b, mounts[1]))
    assert H.poll(lambda: os.path.isdir(nb), timeout=3)
    return a, nb


def negative(path):
    """Look `path` up and find it missing: the kernel caches the miss (on `negmount`)."""
    with pytest.raises(FileNotFoundError):
        os.stat(path)


def test_o_creat_after_a_cached_negative_lookup(negpair):
    a, b = negpair
    for i in range(10):
        negative(os.path.join(b, f"f{i}"))
        H.write_file(os.path.join(a, f"f{i}"), b"from A\n")
        fd = os.open(os.path.join(b, f"f{i}"), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            assert os.read(fd, 100) == b"from A\n", "B opened another file than A's"
        finally:
            os.close(fd)


def test_append_to_a_shared_log_from_both_mounts(negpair):
    a, b = negpair
    for i in range(5):
        la, lb = os.path.join(a, f"log{i}"), os.path.join(b, f"log{i}")
        negative(lb)
        subprocess.run(["sh", "-c", f"echo A >> {la}"], check=True)
        subprocess.run(["sh", "-c", f"echo B >> {lb}"], check=True)
        with open(la) as f:
            assert f.read() == "A\nB\n"


def test_o_creat_trunc_truncates_the_other_mounts_file(negpair):
    a, b = negpair
    negative(os.path.join(b, "t"))
    H.write_file(os.path.join(a, "t"), b"x" * 100000)
    fd = os.open(os.path.join(b, "t"), os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    try:
        assert os.fstat(fd).st_size == 0
        os.write(fd, b"new")
    finally:
        os.close(fd)
    assert H.read_file(os.path.join(a, "t")) == b"new"


def test_o_creat_checks_permissions_of_the_existing_file(negpair, user, as_user):
    a, b = negpair
    for i, (mode, flags, want) in enumerate([
        (0o644, os.O_CREAT | os.O_WRONLY, errno.EACCES),
        (0o644, os.O_CREAT | os.O_RDONLY | os.O_TRUNC, errno.EACCES),
        (0o600, os.O_CREAT | os.O_RDONLY, errno.EACCES),
        (0o644, os.O_CREAT | os.O_RDONLY, "ok"),
        (0o666, os.O_CREAT | os.O_WRONLY, "ok"),
    ]):
        fb = os.path.join(b, f"p{i}")
        negative(fb)  # cached for every process of mount B
        H.write_file(os.path.join(a, f"p{i}"), b"root's")
        os.chmod(os.path.join(a, f"p{i}"), mode)

        def try_open(path=fb, flags=flags):
            try:
                os.close(os.open(path, flags, 0o644))
                return "ok"
            except OSError as e:
                return e.errno

        assert user.run(try_open) == want, (oct(mode), flags)
    assert H.read_file(os.path.join(a, "p1")) == b"root's", "a refused O_TRUNC truncated"


def test_o_creat_of_a_directory_or_a_symlink_made_elsewhere(negpair):
    a, b = negpair
    negative(os.path.join(b, "d"))
    os.mkdir(os.path.join(a, "d"))
    with pytest.raises(IsADirectoryError):
        os.open(os.path.join(b, "d"), os.O_CREAT | os.O_WRONLY, 0o644)
    negative(os.path.join(b, "s"))
    os.symlink("target", os.path.join(a, "s"))
    fd = os.open(os.path.join(b, "s"), os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"through the link")
    os.close(fd)
    assert H.read_file(os.path.join(a, "target")) == b"through the link"
    assert os.path.islink(os.path.join(a, "s"))


# =========================================================================== blocked waiters: a cap per user

WAITERS_PER_UID = 64  # the client tunable lock_waiters_per_uid's default


def client_pid(mnt):
    """The FUSE client process serving mount point `mnt` (not another mount's)."""
    pids = [p for p in H.pids_mentioning(mnt)
            if b"mount" in H.cmdline(p) and mnt.encode() in H.cmdline(p)]
    assert len(pids) == 1, (mnt, pids)
    return pids[0]


def threads_of(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("Threads:"))


def flock_waiters(path, n):
    """As the calling user: n threads, each with its own open file description, wait
    for an exclusive flock on `path` (blocking), hold it for a moment and drop it.
    Each thread's outcome: 'granted' or the errno's name."""
    results = [None] * n

    def one(i):
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as e:
            results[i] = errno.errorcode[e.errno]
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            results[i] = "granted"
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError as e:
            results[i] = errno.errorcode[e.errno]
        finally:
            os.close(fd)

    ts = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return results


def test_blocked_waiters_are_capped_per_user_and_cost_no_thread_each(cluster, fresh_dir, user, user2, as_user):
    """Attack (issue 30, item 4): one user starts many blocked flock waiters on a file
    root holds. Past the cap (64 per uid in a mount) they get ENOLCK at once; the root
    client's thread count stays bounded (it grew by one thread per waiter: 400 waiters,
    from 16 to 417 threads); another user's waiter is still served meanwhile; once the
    holder releases, every admitted waiter proceeds."""
    d = fresh_dir(cluster)
    os.chmod(d, 0o777)
    f, g = os.path.join(d, "f"), os.path.join(d, "g")
    for path in (f, g):
        H.create_file(path, b"", mode=0o666)
        os.chmod(path, 0o666)
    pid = client_pid(cluster.mnt)
    hf, hg = Holder(f, "flock"), Holder(g, "flock")
    try:
        base = threads_of(pid)
        n = WAITERS_PER_UID + 36
        out = {}
        flood = threading.Thread(target=lambda: out.update(r=as_user(user.uid, user.gid, flock_waiters, f, n)))
        flood.start()
        # Let every waiter reach the client (blocked or refused), watching the threads.
        most = base
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            most = max(most, threads_of(pid))
            time.sleep(0.05)
        # One waiting thread per server of the instance at most (3 here).
        assert most <= base + CLUSTER_OPTS["servers"], (
            f"the client grew from {base} to {most} threads for {n} blocked waiters")
        # Another user's waiter on another file is served while the first user's wait.
        other = {}
        t2 = threading.Thread(target=lambda: other.update(r=as_user(user2.uid, user2.gid, flock_waiters, g, 1)))
        t2.start()
        time.sleep(0.5)
        hg.unlock()
        t2.join(20)
        assert other.get("r") == ["granted"], other
        # The holder lets go: each admitted waiter gets the lock in turn.
        hf.unlock()
        flood.join(120)
        assert not flood.is_alive(), "the admitted waiters did not all proceed"
        results = out["r"]
        assert results.count("ENOLCK") == n - WAITERS_PER_UID, results
        assert results.count("granted") == WAITERS_PER_UID, results
        assert threads_of(pid) <= base + CLUSTER_OPTS["servers"]
    finally:
        hf.kill()
        hg.kill()
