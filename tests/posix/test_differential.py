"""Randomized differential test: the same operations on a Spillway mount and on a local
directory must give the same results, errno for errno, and leave identical trees.

A hypothesis RuleBasedStateMachine picks operations (open with flags, write/pwrite at
offsets incl. sparse ones and across stripe boundaries, read, truncate/ftruncate, unlink,
mkdir, rmdir, rename, link, symlink, chmod, utime, set/remove/get/list xattrs, fsync,
close, stat, readdir) over a small pool of names in a few directories, applies each to
both trees and compares. At the end of every run all descriptors are closed and the trees
are compared byte for byte: names, types, sizes, modes, owners, nlink (non-directories),
symlink targets, contents, user.* xattrs and which names are hard links of each other.
Not compared: st_ino/st_dev, atime, block counts, directory sizes and link counts, and
mtimes (except right after an explicit utime, where the value set must read back).

Reproducible: the run is seeded (SPILLWAY_DIFF_SEED, default 20240601; "random" picks and
prints one). Size: SPILLWAY_DIFF_EXAMPLES (default 40) runs of SPILLWAY_DIFF_STEPS
(default 60) steps. SPILLWAY_DIFF_SHRINK=0 skips shrinking a failure (faster report).
"""

import errno
import os
import random
import stat

import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

import spwhelpers as H

# 64 KiB stripes: the small offsets below then cross many stripe boundaries.
CLUSTER_OPTS = {"servers": 2, "capacity": "4G", "stripe_size": "64K"}

EXAMPLES = int(os.environ.get("SPILLWAY_DIFF_EXAMPLES", "40"))
STEPS = int(os.environ.get("SPILLWAY_DIFF_STEPS", "60"))
SEED_ENV = os.environ.get("SPILLWAY_DIFF_SEED", "20240601")
SHRINK = os.environ.get("SPILLWAY_DIFF_SHRINK", "1") not in ("0", "")

# The pool of names. Directories among them exist only once mkdir made them.
PATHS = ["a", "b", "d1", "d2", "d1/a", "d1/b", "d1/e", "d1/e/a", "d2/a"]
LINK_TARGETS = ["a", "b", "d1", "d1/a", "e/a", "../a", "missing", "d2/../a", "a/x"]
ACCESS = [os.O_RDWR, os.O_RDWR, os.O_WRONLY, os.O_RDONLY]
EXTRA_FLAGS = [os.O_CREAT, os.O_EXCL, os.O_TRUNC, os.O_APPEND, os.O_NOFOLLOW, os.O_DIRECTORY]
MODES = [0o644, 0o600, 0o755, 0o000, 0o444, 0o4755, 0o2755, 0o1777, 0o700]
OFFSETS = [0, 1, 100, 4095, 4096, 65535, 65536, 131062, 200_000, 1 << 20, (8 << 20) - 5]
SIZES = [0, 1, 100, 4096, 65536, 70_000, 200_000]
XNAMES = ["user.a", "user.b"]
TIMES = [0, 1, 999_999_999, 1_000_000_000, 1_234_567_890_123_456_789, 1_700_000_000_000_000_001]
MAX_HANDLES = 6

offsets = st.one_of(st.sampled_from(OFFSETS), st.integers(0, 300_000))
sizes = st.one_of(st.sampled_from(SIZES), st.integers(0, 300_000))
paths = st.sampled_from(PATHS)
# payloads: small literal bytes, or (seed, length) expanded to a larger pseudo-random block
payloads = st.one_of(
    st.binary(min_size=1, max_size=64),
    st.tuples(st.integers(0, 2**32 - 1), st.sampled_from([4096, 65536, 65537, 150_000])),
)


def expand(payload):
    if isinstance(payload, bytes):
        return payload
    s, n = payload
    return random.Random(s).randbytes(n)


def outcome(fn):
    """Normalize: ('ok', value) or ('err', errno name such as 'ENOENT')."""
    try:
        return ("ok", fn())
    except OSError as e:
        return ("err", errno.errorcode.get(e.errno, str(e.errno)))


def stat_view(st_, with_size=True):
    v = {"type": stat.S_IFMT(st_.st_mode), "mode": oct(stat.S_IMODE(st_.st_mode))}
    if not stat.S_ISDIR(st_.st_mode):
        v["nlink"] = st_.st_nlink
        if with_size:
            v["size"] = st_.st_size
    return v


class DiffMachine(RuleBasedStateMachine):
    BASES = None  # (spillway base, local base), set by the test
    counter = 0  # runs started
    calls = 0  # operations compared

    def __init__(self):
        super().__init__()
        DiffMachine.counter += 1
        n = DiffMachine.counter
        self.exdirs = [os.path.join(b, f"ex{n}") for b in self.BASES]
        self.roots = [os.path.join(e, "t") for e in self.exdirs]
        for r in self.roots:
            os.makedirs(r)
        self.handles = []  # [(fd_spillway, fd_local, description)]

    # ------------------------------------------------------------------ plumbing
    def both(self, desc, fn):
        """fn(side) runs on side 0 (Spillway) and 1 (local); outcomes must be equal."""
        type(self).calls += 1
        a = outcome(lambda: fn(0))
        b = outcome(lambda: fn(1))
        assert a == b, f"{desc}: spillway -> {a!r}, local -> {b!r}"
        return a

    def path(self, side, rel):
        return os.path.join(self.roots[side], rel)

    def inherent_difference(self, op, path):
        """Whether `op` on `path` would meet a documented difference of the file system
        under test, so the run leaves it out (a subclass's: the cache's)."""
        return False

    def handle(self, i):
        return self.handles[i % len(self.handles)]

    # ------------------------------------------------------------------ descriptors
    @initialize(populate=st.booleans(), data=payloads)
    def start(self, populate, data):
        """Half of the runs start from a small tree, so that fewer operations hit ENOENT."""
        if not populate:
            return
        data = expand(data)
        for d in ("d1", "d2", "d1/e"):
            self.both(f"mkdir({d!r})", lambda s: os.mkdir(self.path(s, d)))
        for f in ("a", "d1/a"):
            self.both(f"create({f!r}, {len(data)} bytes)", lambda s: H.write_file(self.path(s, f), data))

    @rule(path=paths, data=payloads)
    def create_file(self, path, data):
        data = expand(data)
        self.both(f"create({path!r}, {len(data)} bytes)", lambda s: H.write_file(self.path(s, path), data))

    @rule(path=paths, off=offsets, data=payloads)
    def write_at_path(self, path, off, data):
        """open(O_WRONLY) an existing file, pwrite at an offset (often past EOF), close."""
        data = expand(data)

        def op(side):
            fd = os.open(self.path(side, path), os.O_WRONLY)
            try:
                return os.pwrite(fd, data, off)
            finally:
                os.close(fd)

        self.both(f"write_at_path({path!r}, {len(data)} bytes, {off})", op)

    @precondition(lambda self: len(self.handles) < MAX_HANDLES)
    @rule(path=paths, acc=st.sampled_from(ACCESS),
          extra=st.one_of(
              st.sampled_from([[os.O_CREAT], [os.O_CREAT, os.O_TRUNC], [os.O_CREAT, os.O_APPEND], []]),
              st.lists(st.sampled_from(EXTRA_FLAGS), max_size=3, unique=True)),
          mode=st.sampled_from([0o644, 0o600, 0o755, 0o444]))
    def open_(self, path, acc, extra, mode):
        flags = acc
        for f in extra:
            flags |= f
        fds = [None, None]

        def op(side):
            fds[side] = os.open(self.path(side, path), flags, mode)
            return True

        try:
            res = self.both(f"open({path!r}, {flags:#o}, {mode:#o})", op)
        except AssertionError:
            for fd in fds:
                if fd is not None:
                    os.close(fd)
            raise
        if res[0] == "ok":
            self.handles.append((fds[0], fds[1], f"{path}:{flags:#o}"))

    @precondition(lambda self: len(self.handles) < MAX_HANDLES)
    @rule(path=paths, append=st.booleans())
    def open_existing(self, path, append):
        self.open_(path, os.O_RDWR, [os.O_APPEND] if append else [], 0o644)

    @precondition(lambda self: self.handles)
    @rule(h=st.integers(0, 99), off=offsets, data=payloads)
    def seek_write(self, h, off, data):
        hd = self.handle(h)
        data = expand(data)

        def op(side):
            os.lseek(hd[side], off, os.SEEK_SET)
            n = os.write(hd[side], data)
            return n, os.lseek(hd[side], 0, os.SEEK_CUR)

        self.both(f"write({hd[2]}, at {off}, {len(data)} bytes)", op)

    @precondition(lambda self: self.handles)
    @rule(h=st.integers(0, 99), off=offsets, data=payloads)
    def pwrite(self, h, off, data):
        hd = self.handle(h)
        data = expand(data)
        self.both(f"pwrite({hd[2]}, {len(data)} bytes, {off})", lambda s: os.pwrite(hd[s], data, off))

    @precondition(lambda self: self.handles)
    @rule(h=st.integers(0, 99), off=offsets, n=sizes)
    def pread(self, h, off, n):
        hd = self.handle(h)
        self.both(f"pread({hd[2]}, {n}, {off})", lambda s: H.pread_all(hd[s], n, off))

    @precondition(lambda self: self.handles)
    @rule(h=st.integers(0, 99), size=sizes)
    def ftruncate(self, h, size):
        hd = self.handle(h)
        self.both(f"ftruncate({hd[2]}, {size})", lambda s: os.ftruncate(hd[s], size))

    @precondition(lambda self: self.handles)
    @rule(h=st.integers(0, 99), data=st.booleans())
    def fsync(self, h, data):
        hd = self.handle(h)
        fn = os.fdatasync if data else os.fsync
        self.both(f"{fn.__name__}({hd[2]})", lambda s: fn(hd[s]))

    @precondition(lambda self: self.handles)
    @rule(h=st.integers(0, 99))
    def fstat(self, h):
        hd = self.handle(h)
        self.both(f"fstat({hd[2]})", lambda s: stat_view(os.fstat(hd[s])))

    @precondition(lambda self: self.handles)
    @rule(h=st.integers(0, 99))
    def close(self, h):
        hd = self.handles.pop(h % len(self.handles))
        self.both(f"close({hd[2]})", lambda s: os.close(hd[s]))

    # ------------------------------------------------------------------ names
    @rule(path=paths, size=sizes)
    def truncate(self, path, size):
        self.both(f"truncate({path!r}, {size})", lambda s: os.truncate(self.path(s, path), size))

    @rule(path=paths)
    def unlink(self, path):
        self.both(f"unlink({path!r})", lambda s: os.unlink(self.path(s, path)))

    @rule(path=paths, mode=st.sampled_from([0o755, 0o700, 0o777, 0o2775]))
    def mkdir(self, path, mode):
        self.both(f"mkdir({path!r}, {mode:#o})", lambda s: os.mkdir(self.path(s, path), mode))

    @rule(path=paths)
    def rmdir(self, path):
        if self.inherent_difference("rmdir", path):
            return
        self.both(f"rmdir({path!r})", lambda s: os.rmdir(self.path(s, path)))

    @rule(src=paths, dst=paths)
    def rename(self, src, dst):
        if self.inherent_difference("rename", dst):
            return
        self.both(f"rename({src!r}, {dst!r})", lambda s: os.rename(self.path(s, src), self.path(s, dst)))

    @rule(src=paths, dst=paths, follow=st.booleans())
    def link(self, src, dst, follow):
        self.both(f"link({src!r}, {dst!r}, follow={follow})",
                  lambda s: os.link(self.path(s, src), self.path(s, dst), follow_symlinks=follow))

    @rule(dest=st.sampled_from(LINK_TARGETS), path=paths)
    def symlink(self, dest, path):
        self.both(f"symlink({dest!r}, {path!r})", lambda s: os.symlink(dest, self.path(s, path)))

    @rule(path=paths, mode=st.sampled_from(MODES))
    def chmod(self, path, mode):
        self.both(f"chmod({path!r}, {mode:#o})", lambda s: os.chmod(self.path(s, path), mode))

    @rule(path=paths, at=st.sampled_from(TIMES), mt=st.sampled_from(TIMES), follow=st.booleans())
    def utime(self, path, at, mt, follow):
        def op(side):
            p = self.path(side, path)
            os.utime(p, ns=(at, mt), follow_symlinks=follow)
            # atime is not compared: the path walk itself may update it (relatime, e.g.
            # through a symlink that is a hard link of the one just changed)
            return os.stat(p, follow_symlinks=follow).st_mtime_ns == mt

        r = self.both(f"utime({path!r}, ns=({at}, {mt}), follow={follow})", op)
        assert r[0] != "ok" or r[1] is True, f"utime did not read back: {r}"

    @rule(path=paths, name=st.sampled_from(XNAMES), value=st.binary(max_size=100),
          flags=st.sampled_from([0, os.XATTR_CREATE, os.XATTR_REPLACE]), follow=st.booleans())
    def setxattr(self, path, name, value, flags, follow):
        self.both(f"setxattr({path!r}, {name}, {value!r}, {flags}, follow={follow})",
                  lambda s: os.setxattr(self.path(s, path), name, value, flags, follow_symlinks=follow))

    @rule(path=paths, name=st.sampled_from(XNAMES))
    def removexattr(self, path, name):
        self.both(f"removexattr({path!r}, {name})", lambda s: os.removexattr(self.path(s, path), name))

    @rule(path=paths, name=st.sampled_from(XNAMES))
    def getxattr(self, path, name):
        self.both(f"getxattr({path!r}, {name})", lambda s: os.getxattr(self.path(s, path), name))

    @rule(path=paths)
    def listxattr(self, path):
        self.both(f"listxattr({path!r})",
                  lambda s: sorted(x for x in os.listxattr(self.path(s, path)) if x.startswith("user.")))

    @rule(path=paths, follow=st.booleans())
    def stat_(self, path, follow):
        self.both(f"stat({path!r}, follow={follow})",
                  lambda s: stat_view(os.stat(self.path(s, path), follow_symlinks=follow)))

    @rule(path=paths)
    def readlink(self, path):
        self.both(f"readlink({path!r})", lambda s: os.readlink(self.path(s, path)))

    @rule(path=st.sampled_from(["", "d1", "d2", "d1/e", "a"]))
    def listdir(self, path):
        self.both(f"listdir({path!r})", lambda s: sorted(os.listdir(self.path(s, path))))

    @rule(path=paths, n=sizes)
    def read_whole(self, path, n):
        def op(side):
            fd = os.open(self.path(side, path), os.O_RDONLY)
            try:
                return H.pread_all(fd, n, 0)
            finally:
                os.close(fd)

        self.both(f"read({path!r}, {n})", op)

    # ------------------------------------------------------------------ end of a run
    def teardown(self):
        errors = []
        for hd in self.handles:
            a = outcome(lambda: os.close(hd[0]))
            b = outcome(lambda: os.close(hd[1]))
            if a != b:
                errors.append(f"close({hd[2]}): spillway {a} local {b}")
        self.handles = []
        try:
            if not errors:
                sa = H.snapshot_tree(self.roots[0])
                sb = H.snapshot_tree(self.roots[1])
                errors += H.diff_snapshots(sa, sb)
            if not errors:
                errors += self.more_checks(sb)
        finally:
            for e in self.exdirs:
                H.force_rmtree(e)
        assert not errors, "trees differ after the run:\n" + "\n".join(errors)

    def more_checks(self, local_snapshot):
        """Further differences at the end of a run, once every descriptor is closed and
        the trees agreed (a subclass's: the cache's PFS directory)."""
        return []


def run_machine(machine_cls, examples=EXAMPLES, steps=STEPS):
    """Run a DiffMachine class (its BASES set) with the seed, size and phases of the
    environment."""
    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if SHRINK else [])
    if SEED_ENV.lower() == "random":
        s = random.SystemRandom().randrange(2**32)
        print(f"\nSPILLWAY_DIFF_SEED={s}")
    else:
        s = int(SEED_ENV)
    machine = seed(s)(machine_cls)
    # Hypothesis draws a run from a buffer of 8 KiB (engine.BUFFER_SIZE, no setting
    # reaches it): a hundred-odd steps of this machine, after which a run overruns and
    # ends early. Long runs (SPILLWAY_DIFF_STEPS=3000) get a buffer that fits them.
    from hypothesis.internal.conjecture import engine

    old_buffer = engine.BUFFER_SIZE
    engine.BUFFER_SIZE = max(old_buffer, steps * 256)
    runs, calls = machine_cls.counter, machine_cls.calls
    try:
        _run(machine, examples, steps, phases)
    finally:
        engine.BUFFER_SIZE = old_buffer
        print(f"\n{machine_cls.__name__}: {machine_cls.counter - runs} runs, "
              f"{machine_cls.calls - calls} operations compared")


def _run(machine, examples, steps, phases):
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            database=None,
            phases=phases,
            suppress_health_check=list(HealthCheck),
            print_blob=True,
        ),
    )


@pytest.mark.timeout(1800)
def test_differential(fs_root, local_dir):
    DiffMachine.BASES = (fs_root, local_dir)
    run_machine(DiffMachine)
