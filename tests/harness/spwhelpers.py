"""Shared helpers of the Spillway integration tests (imported by conftest.py and the tests).

Nothing here is a test. The pieces:
  * mode detection (SPILLWAY_TEST_TARGET=local runs everything against a plain tmp dir);
  * `Cluster`: drives `spillway cluster up/down/kill-server/start-server`, second mounts
    and `spillway stripes`, and cleans up after itself even when the binary misbehaves;
  * `as_user`: run a function in a forked child as another uid/gid, results and OSErrors
    come back to the parent through a pipe;
  * the POSIX tests' vocabulary: `assert_errno`, `p`, `create_file`;
  * fixture plumbing: `started_once` (clusters and Slurm sites started on first use in a
    module), `force_rmtree`, `kept_logs_dir`;
  * small utilities: sizes, checksums, polling, pipes, tree snapshots.

Lives in tests/harness/ (on pytest's `pythonpath`, see tests/pytest.ini); the benchmarks
put that folder on sys.path themselves.
"""

import contextlib
import errno
import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import stat
import subprocess
import time
import traceback

# tests/harness/spwhelpers.py: the suite is tests/, the checkout above it.
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
# The C test programs of libdatawarp (tests/c/), built by the tests that run them.
C_DIR = os.path.join(TESTS, "c")
LOCAL = os.environ.get("SPILLWAY_TEST_TARGET", "").strip().lower() == "local"
BASE_PREFIX = "/tmp/spillway-tests-"
KEEP = os.environ.get("SPILLWAY_TEST_KEEP", "") not in ("", "0")

MiB = 1 << 20
GiB = 1 << 30


# --------------------------------------------------------------------------- sizes


def parse_size(text, binary=True):
    """'64K' -> 65536, '1G' -> 2**30 (binary=False: powers of 1000)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(i?B?)\s*", str(text), re.I)
    if not m:
        raise ValueError(f"bad size {text!r}")
    n, unit = int(m.group(1)), m.group(2).upper()
    base = 1024 if binary else 1000
    return n * base ** " KMGT".index(unit or " ")


# --------------------------------------------------------------------------- files


def sha256_file(path, bufsize=MiB):
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(bufsize)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def write_file(path, data, mode=0o644, fsync=False):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path):
    with open(path, "rb", buffering=0) as f:
        return f.read()


def pread_all(fd, size, offset=0):
    """pread until `size` bytes or EOF (a single pread may legally return short)."""
    out = bytearray()
    while len(out) < size:
        b = os.pread(fd, size - len(out), offset + len(out))
        if not b:
            break
        out += b
    return bytes(out)


def pwrite_all(fd, data, offset):
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def drop_file_cache(path):
    """Ask the kernel to forget a file's cached pages, so that a read goes to the servers."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def errno_of(fn, *args, **kwargs):
    """Run fn; return 0 on success or the errno of the OSError it raised."""
    try:
        fn(*args, **kwargs)
    except OSError as e:
        return e.errno
    return 0


def ename(code):
    return errno.errorcode.get(code, str(code)) if code else "OK"


def assert_errno(expected, fn, *args, **kwargs):
    """fn(*args) must fail with errno `expected` (an int or a tuple of allowed ints)."""
    allowed = expected if isinstance(expected, tuple) else (expected,)
    try:
        fn(*args, **kwargs)
    except OSError as e:
        assert e.errno in allowed, (
            f"{getattr(fn, '__name__', fn)}{args}: expected {'/'.join(ename(a) for a in allowed)}, "
            f"got {ename(e.errno)} ({e})"
        )
        return e
    raise AssertionError(
        f"{getattr(fn, '__name__', fn)}{args}: expected {'/'.join(ename(a) for a in allowed)}, but it succeeded"
    )


def p(root, *names):
    """os.path.join, short for the many paths the POSIX tests build."""
    return os.path.join(root, *names)


def create_file(path, data=b"", mode=0o644):
    """Create `path` exclusively (O_EXCL) with `data` and `mode` (less the umask)."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, mode)
    os.write(fd, data)
    os.close(fd)


LOGS_DIR = "/tmp/spillway-tests-logs"  # where a failed module's logs are kept


def kept_logs_dir(d):
    """Where the logs of the cluster or site in directory `d` are kept after a failure."""
    return os.path.join(LOGS_DIR, os.path.basename(d))


def started_once(cache, key, make, start, what):
    """cache[key]: made by make() and started by start(obj) on its first use in a module.
    It is registered before it starts, so that the module's teardown stops it even when
    starting fails half-way; a failed start fails this test and every later one asking
    for the same key (`what` names it in the message)."""
    import pytest  # only the fixtures call this; the benchmarks import this module too

    if key not in cache:
        obj = cache[key] = make()
        try:
            start(obj)
        except Exception as e:
            obj.start_error = e
        if getattr(obj, "start_error", None):
            pytest.fail(f"{what} failed: {obj.start_error}", pytrace=False)
    obj = cache[key]
    if getattr(obj, "start_error", None):
        pytest.fail(f"{what} failed earlier in this module: {obj.start_error}", pytrace=False)
    return obj


def force_rmtree(d):
    """Remove the tree `d` that tests may have chmod'ed to 0000/0555: every directory is
    made 0755 first; errors are ignored."""
    for dirpath, dirnames, _ in os.walk(d):
        for n in dirnames:
            try:
                os.chmod(os.path.join(dirpath, n), 0o755)
            except OSError:
                pass
    shutil.rmtree(d, ignore_errors=True)


def read_to_eof(fd):
    """Everything readable from the pipe (or file) `fd` until EOF; closes it."""
    data = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    return data


def poll(fn, timeout=2.0, interval=0.05):
    """Call fn until it returns a truthy value or timeout passes; return the last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)


# --------------------------------------------------------------------------- users


def as_user(uid, gid, fn, *args, groups=None, **kwargs):
    """Run fn(*args, **kwargs) in a forked child with the given credentials.

    The child drops to (uid, gid) with supplementary groups `groups` (default: just gid).
    Its return value (must pickle) is returned; an exception it raises is raised here:
    OSErrors keep their type and errno; anything else comes back as ChildError carrying
    the child's traceback.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        status = 0
        try:
            os.close(r)
            try:
                os.setgroups(list(groups) if groups is not None else [gid])
                os.setgid(gid)
                os.setuid(uid)
                res = ("ok", fn(*args, **kwargs))
            except OSError as e:
                res = ("oserror", (type(e), e.errno, e.strerror, e.filename, traceback.format_exc()))
            except BaseException:
                res = ("exc", traceback.format_exc())
            try:
                data = pickle.dumps(res)
            except Exception:
                data = pickle.dumps(("exc", "result does not pickle: " + repr(res)))
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(w)
    data = read_to_eof(r)
    _, st = os.waitpid(pid, 0)
    if not data:
        raise ChildError(f"child as uid {uid} died without a result (wait status {st})")
    kind, val = pickle.loads(data)
    if kind == "ok":
        return val
    if kind == "oserror":
        etype, eno, strerror, filename, tb = val
        exc = etype(eno, strerror, filename) if filename is not None else etype(eno, strerror)
        exc.child_traceback = tb
        raise exc
    raise ChildError(val)


class ChildError(Exception):
    pass


class TestUser:
    def __init__(self, name, uid, gid, created):
        self.name, self.uid, self.gid, self.created = name, uid, gid, created

    def run(self, fn, *args, **kwargs):
        return as_user(self.uid, self.gid, fn, *args, **kwargs)

    def errno(self, fn, *args, **kwargs):
        """Run fn as this user; 0 if it succeeded, else the errno it failed with."""
        try:
            self.run(fn, *args, **kwargs)
        except OSError as e:
            return e.errno
        return 0

    def __repr__(self):
        return f"<user {self.name} {self.uid}:{self.gid}>"


USER_MARK = "spillway-tests"  # GECOS of users this harness creates (and may delete)
USERS_LOCK = "/run/spillway-tests-users.lock"


def ensure_user(name):
    import pwd

    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        r = subprocess.run(
            ["useradd", "-M", "-U", "-c", USER_MARK, "-s", "/usr/sbin/nologin", "-d", "/nonexistent", name],
            capture_output=True, text=True,
        )
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            raise RuntimeError(f"useradd {name} failed: {r.stderr}")
    return TestUser(name, pw.pw_uid, pw.pw_gid, pw.pw_gecos == USER_MARK)


class UsersLease:
    """Sessions running at the same time share the test users: each holds a shared flock
    on USERS_LOCK while it runs; the last one out (it gets the lock exclusively) deletes
    the users this harness created."""

    def __init__(self):
        self.fd = os.open(USERS_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        import fcntl

        fcntl.flock(self.fd, fcntl.LOCK_SH)

    def release(self, users):
        import fcntl

        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)  # another session still uses them
            return
        try:
            for u in users:
                if u.created:
                    subprocess.run(["userdel", u.name], capture_output=True)
                    subprocess.run(["groupdel", u.name], capture_output=True)
        finally:
            os.close(self.fd)


# --------------------------------------------------------------------------- processes/mounts


def have_loop(mkfs="mkfs.ext4"):
    """Root, losetup, `mkfs` and a free loop device: what a test of a loop-mounted file
    system needs (it skips cleanly without them)."""
    if os.geteuid() != 0 or not shutil.which("losetup") or not shutil.which(mkfs):
        return False
    r = subprocess.run(["losetup", "-f"], capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip().startswith("/dev/loop")


@contextlib.contextmanager
def loop_xfs(mnt, img, size="512M"):
    """A fresh XFS of `size` in the image file `img`, loop-mounted on the new directory
    `mnt` (0755 root's): a PFS stand-in. Skips the test without root, losetup,
    mkfs.xfs or a free loop device. Unmounted (remounted read-write first, in case a
    test made it read-only; lazily if busy) and the image removed at the end."""
    if not have_loop("mkfs.xfs"):
        import pytest
        pytest.skip("needs root, losetup, mkfs.xfs and a free loop device")
    os.mkdir(mnt)
    subprocess.run(["truncate", "-s", size, img], check=True)
    try:
        subprocess.run(["mkfs.xfs", "-q", "-f", img], check=True)
        r = subprocess.run(["mount", "-o", "loop", img, mnt], capture_output=True, text=True)
        if r.returncode != 0:
            import pytest
            pytest.skip(f"cannot loop-mount an XFS here: {r.stderr.strip()}")
        os.chmod(mnt, 0o755)
        try:
            yield mnt
        finally:
            subprocess.run(["mount", "-o", "remount,rw", mnt], capture_output=True)
            if subprocess.run(["umount", mnt], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", mnt], capture_output=True)
    finally:
        os.unlink(img)


def mounts_under(path):
    """Mount points at or below path (from /proc/self/mountinfo)."""
    path = os.path.realpath(path)
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp == path or mp.startswith(path + "/"):
                out.append(mp)
    return out


def is_mounted(path):
    """path is a mount point (by /proc/self/mountinfo; os.path.ismount misses bind mounts)."""
    return os.path.realpath(path) in mounts_under(path)


def pids_mentioning(text):
    """Pids of processes whose command line contains text (never our own)."""
    me = os.getpid()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            out.append(int(d))
    return out


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def netns_of(pid):
    return os.readlink(f"/proc/{pid}/ns/net")


# --------------------------------------------------------------------------- the binary


def find_binary(build=True):
    path = os.environ.get("SPILLWAY_BIN") or os.path.join(REPO, "target/release/spillway")
    if not os.access(path, os.X_OK) and build and not os.environ.get("SPILLWAY_BIN"):
        r = subprocess.run(
            ["cargo", "build", "--release", "-p", "spillway-cli"],
            cwd=REPO, capture_output=True, text=True, timeout=3600,
        )
        if r.returncode != 0:
            raise RuntimeError("cargo build --release -p spillway-cli failed:\n" + r.stderr[-4000:])
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"spillway binary not found at {path}")
    return path


def run_cli(binary, args, timeout=180, check=True):
    r = subprocess.run([binary] + [str(a) for a in args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise CliError(args, r)
    return r


class CliError(Exception):
    def __init__(self, args, r):
        self.result = r
        super().__init__(
            f"`spillway {' '.join(map(str, args))}` exited {r.returncode}\n"
            f"stdout: {r.stdout[-3000:]}\nstderr: {r.stderr[-3000:]}"
        )


def help_mentions(binary, args, word):
    r = run_cli(binary, list(args) + ["--help"], timeout=30, check=False)
    return word in (r.stdout + r.stderr)


STRIPE_RE = re.compile(r"^stripe\s+(\d+)\s+server\s+(\d+)\s+(\S+)\s+bytes\s+(\d+)\s*$")


class Cluster:
    """One `spillway cluster` under /tmp/spillway-tests-<name>-<random suffix>."""

    def __init__(self, binary, name, servers=2, capacity="4G", stripe_size=None, netns=False):
        import tempfile

        self.binary = binary
        self.servers = servers
        self.capacity_arg = capacity
        self.stripe_size_arg = stripe_size
        self.netns = netns
        self.dir = tempfile.mkdtemp(prefix=f"{BASE_PREFIX}{name}-")
        os.chmod(self.dir, 0o755)  # the unprivileged test users must traverse it
        self.mnt = os.path.join(self.dir, "mnt")
        self.extra_mounts = []
        self.up_output = None

    # -- lifecycle
    def up_args(self):
        a = ["cluster", "up", "--dir", self.dir, "--servers", self.servers, "--capacity", self.capacity_arg]
        if self.stripe_size_arg:
            a += ["--stripe-size", self.stripe_size_arg]
        if self.netns:
            a += ["--netns"]
        return a

    def up(self, extra=()):
        r = run_cli(self.binary, self.up_args() + list(extra), timeout=300)
        self.up_output = r.stdout
        printed = [l.strip() for l in r.stdout.splitlines() if l.strip()]
        if not is_mounted(self.mnt):
            raise RuntimeError(
                f"`spillway cluster up` exited 0 but {self.mnt} is not a mount point\n"
                f"stdout: {r.stdout}\nstderr: {r.stderr}"
            )
        if not any(self.mnt in l or os.path.realpath(self.mnt) in l for l in printed):
            raise RuntimeError(f"`spillway cluster up` should print the mount path {self.mnt}, printed {printed!r}")
        return r

    def down(self, check=True, extra=()):
        if KEEP and "--keep-data" not in extra and help_mentions(self.binary, ["cluster", "down"], "--keep-data"):
            extra = list(extra) + ["--keep-data"]
        return run_cli(self.binary, ["cluster", "down", "--dir", self.dir] + list(extra), timeout=300, check=check)

    def kill_server(self, index, sig="KILL"):
        return run_cli(self.binary, ["cluster", "kill-server", "--dir", self.dir, "--index", index, "--signal", sig])

    def start_server(self, index):
        return run_cli(self.binary, ["cluster", "start-server", "--dir", self.dir, "--index", index])

    def mount(self, mountpoint, tunables=None):
        """Another mount of the instance; `tunables`: a path to the mount's tunables file."""
        os.makedirs(mountpoint, exist_ok=True)
        self.extra_mounts.append(mountpoint)
        extra = ["--tunables", tunables] if tunables else []
        run_cli(self.binary, ["mount", "--instance", self.instance_path, *extra, mountpoint], timeout=120)
        if not is_mounted(mountpoint):
            raise RuntimeError(f"`spillway mount` returned but {mountpoint} is not mounted")
        return mountpoint

    def umount(self, mountpoint):
        run_cli(self.binary, ["umount", mountpoint], timeout=120)

    def status_json(self):
        """`spillway cluster status --dir DIR --json` if the binary has it, else None."""
        r = run_cli(self.binary, ["cluster", "status", "--dir", self.dir, "--json"], timeout=60, check=False)
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    def leftovers(self):
        """(mounts, pids) still belonging to this cluster."""
        return mounts_under(self.dir), pids_mentioning(self.dir)

    def teardown(self, keep_logs_to=None):
        """`cluster down`, then make sure nothing is left even if that failed. Returns a
        list of problems found (empty when `cluster down` did its job)."""
        problems = []
        if keep_logs_to and os.path.isdir(os.path.join(self.dir, "logs")):
            # before `cluster down`, which removes the cluster directory
            shutil.copytree(os.path.join(self.dir, "logs"), keep_logs_to, dirs_exist_ok=True)
        try:
            r = self.down(check=False)
            if r.returncode != 0 and "is busy" in r.stderr:
                # A process (often this one: a file a test left open) holds the mount:
                # `cluster down` names it and stops nothing; take it down anyway.
                print(f"\n[spillway] {self.dir}: {r.stderr.strip()}\n[spillway] retrying with --force")
                r = self.down(check=False, extra=["--force"])
            if r.returncode != 0:
                problems.append(f"cluster down exited {r.returncode}: {r.stderr[-2000:]}")
        except Exception as e:  # timeout etc.
            problems.append(f"cluster down failed: {e!r}")
        for mp in self.extra_mounts:
            if is_mounted(mp):
                subprocess.run([self.binary, "umount", mp], capture_output=True, timeout=60)
        mounts, pids = self.leftovers()
        if mounts:
            problems.append(f"still mounted after cluster down: {mounts}")
            for mp in sorted(mounts, key=len, reverse=True):
                subprocess.run(["fusermount3", "-uz", mp], capture_output=True)
                if is_mounted(mp):
                    subprocess.run(["umount", "-l", mp], capture_output=True)
        if pids:
            problems.append(
                "still running after cluster down: "
                + "; ".join(f"{p}: {b' '.join(cmdline(p))[:200].decode(errors='replace')}" for p in pids)
            )
            for p in pids:  # processes this cluster started, by pid
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if not KEEP and not mounts_under(self.dir):
            shutil.rmtree(self.dir, ignore_errors=True)
        return problems

    # -- introspection
    @property
    def instance_path(self):
        return os.path.join(self.dir, "instance.json")

    def instance(self):
        with open(self.instance_path) as f:
            return json.load(f)

    def capacity(self):
        return int(self.instance()["capacity"])

    def stripes(self, path):
        """[(k, server_index, addr, bytes)] from `spillway stripes PATH`."""
        r = run_cli(self.binary, ["stripes", path], timeout=60)
        out = []
        for line in r.stdout.splitlines():
            if not line.strip():
                continue
            m = STRIPE_RE.match(line.strip())
            if not m:
                raise AssertionError(f"`spillway stripes` printed an unexpected line: {line!r}")
            out.append((int(m.group(1)), int(m.group(2)), m.group(3), int(m.group(4))))
        return out

    def server_root(self, k):
        return os.path.join(self.dir, "servers", f"s{k}")

    def server_pids(self):
        """{index: [pids]} of the storage server processes, found through their roots on
        the command line (or `cluster status --json` pids when present)."""
        out = {}
        for k in range(self.servers):
            root = self.server_root(k)
            pids = []
            for p in pids_mentioning(root):
                args = [a.decode(errors="replace") for a in cmdline(p)]
                # the root must be an argument of its own (not a prefix of s10 etc.)
                if any(a.rstrip("/") == root or a.endswith("=" + root) for a in args):
                    pids.append(p)
            out[k] = pids
        if all(out.values()):
            return out
        st = self.status_json()
        if st:
            servers = st.get("servers") if isinstance(st, dict) else st
            for i, s in enumerate(servers or []):
                if isinstance(s, dict) and s.get("pid"):
                    out[int(s.get("index", i))] = [int(s["pid"])]
        return out


# --------------------------------------------------------------------------- tree snapshots


def list_xattrs(path, follow=False):
    try:
        names = os.listxattr(path, follow_symlinks=follow)
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EPERM):
            return {}
        raise
    out = {}
    for n in sorted(names):
        if not n.startswith("user."):
            continue  # security.* / system.* differ between file systems
        out[n] = os.getxattr(path, n, follow_symlinks=follow)
    return out


def snapshot_tree(root):
    """A comparable description of everything below root: per relative path its type, mode,
    size, nlink (non-directories), link target, content hash and user xattrs; plus the
    hard-link structure (which paths share an inode), independent of inode numbers."""
    entries = {}
    inode_groups = {}

    def walk(rel):
        full = os.path.join(root, rel) if rel else root
        for name in sorted(os.listdir(full)):
            r = os.path.join(rel, name) if rel else name
            p = os.path.join(root, r)
            st = os.lstat(p)
            e = {"type": stat.S_IFMT(st.st_mode), "mode": oct(stat.S_IMODE(st.st_mode)),
                 "uid": st.st_uid, "gid": st.st_gid}
            if stat.S_ISLNK(st.st_mode):
                e["target"] = os.readlink(p)
                e["size"] = st.st_size
                e["nlink"] = st.st_nlink
            elif stat.S_ISREG(st.st_mode):
                e["size"] = st.st_size
                e["nlink"] = st.st_nlink
                e["sha256"] = sha256_file(p)
                e["xattrs"] = list_xattrs(p)
            elif stat.S_ISDIR(st.st_mode):
                e["xattrs"] = list_xattrs(p)
            if not stat.S_ISDIR(st.st_mode):
                inode_groups.setdefault((st.st_dev, st.st_ino), []).append(r)
            entries[r] = e
            if stat.S_ISDIR(st.st_mode):
                walk(r)

    walk("")
    links = sorted(tuple(sorted(g)) for g in inode_groups.values() if len(g) > 1)
    return {"entries": entries, "hardlinks": links}


def diff_snapshots(a, b, names=("spillway", "local")):
    """Human-readable list of differences between two snapshots (empty if equal)."""
    out = []
    ea, eb = a["entries"], b["entries"]
    for p in sorted(set(ea) | set(eb)):
        if p not in ea:
            out.append(f"{p}: only in {names[1]}: {eb[p]}")
        elif p not in eb:
            out.append(f"{p}: only in {names[0]}: {ea[p]}")
        elif ea[p] != eb[p]:
            keys = sorted(set(ea[p]) | set(eb[p]))
            d = {k: (ea[p].get(k), eb[p].get(k)) for k in keys if ea[p].get(k) != eb[p].get(k)}
            out.append(f"{p}: differs {d}")
    if a["hardlinks"] != b["hardlinks"]:
        out.append(f"hard-link groups differ: {a['hardlinks']} vs {b['hardlinks']}")
    return out
