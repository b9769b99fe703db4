"""Fixtures of the Spillway integration tests. See tests/README.md.

Modes
  SPILLWAY_TEST_TARGET=local  every `fs_root` is a fresh tmp directory on the local file
                              system; tests marked `spillway_only` are skipped.
  (default)                   `fs_root` is a fresh subdirectory of a module-scoped Spillway
                              cluster (`spillway cluster up`), torn down at module end.

A module chooses its cluster's shape with a module-level dict, e.g.
    CLUSTER_OPTS = {"servers": 3, "stripe_size": "64K"}
and can ask for more clusters through the `clusters` fixture: `clusters(capacity="64M")`.
"""

import os
import re
import shutil
import signal
import tempfile

import pytest

import munged as munged_helper
import spwhelpers as H

# The Slurm fixtures (slurm_sites, slurm_site) and the `slurm` marker: tests/harness/slurmfixtures.py
pytest_plugins = ["slurmfixtures"]

DEFAULT_TEST_TIMEOUT = int(os.environ.get("SPILLWAY_TEST_TIMEOUT", "300"))

try:
    import pytest_timeout  # noqa: F401

    HAVE_TIMEOUT_PLUGIN = True
except ImportError:
    HAVE_TIMEOUT_PLUGIN = False


def pytest_configure(config):
    config.addinivalue_line("markers", "spillway_only: needs a real Spillway cluster; skipped when SPILLWAY_TEST_TARGET=local")
    config.addinivalue_line("markers", "needs_root: needs to run as root (creates users, changes credentials)")
    if not HAVE_TIMEOUT_PLUGIN:
        config.addinivalue_line("markers", "timeout(seconds): per-test time limit (SIGALRM fallback)")
    os.umask(0o022)  # mode expectations below assume it


def pytest_collection_modifyitems(config, items):
    for item in items:
        if H.LOCAL and item.get_closest_marker("spillway_only"):
            item.add_marker(pytest.mark.skip(reason="Spillway-only (SPILLWAY_TEST_TARGET=local)"))
        if item.get_closest_marker("needs_root") and os.geteuid() != 0:
            item.add_marker(pytest.mark.skip(reason="needs root"))
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TEST_TIMEOUT))


@pytest.fixture(autouse=True)
def _alarm_timeout(request):
    """Per-test time limit when pytest-timeout is not installed (SIGALRM in the main thread)."""
    if HAVE_TIMEOUT_PLUGIN:
        yield
        return
    m = request.node.get_closest_marker("timeout")
    secs = int(m.args[0]) if m and m.args else DEFAULT_TEST_TIMEOUT

    def on_alarm(signum, frame):
        raise TimeoutError(f"test exceeded its {secs} s limit")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(secs)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# --------------------------------------------------------------------------- users


@pytest.fixture(scope="session")
def users():
    """(spwtest, spwtest2): two unprivileged users, created if missing; removed at the end
    (by the last of several concurrent sessions) if this harness created them."""
    if os.geteuid() != 0:
        pytest.skip("creating test users needs root")
    lease = H.UsersLease()
    u1 = H.ensure_user("spwtest")
    u2 = H.ensure_user("spwtest2")
    yield u1, u2
    lease.release([u2, u1])


@pytest.fixture(scope="session")
def user(users):
    return users[0]


@pytest.fixture(scope="session")
def user2(users):
    return users[1]


@pytest.fixture
def as_user():
    """as_user(uid, gid, fn, *args) -> fn's result, run in a forked child with those ids."""
    return H.as_user


# --------------------------------------------------------------------------- MUNGE


@pytest.fixture(scope="session")
def munged():
    """A private munged for the session (tests/harness/munged.py): own key and socket in a 0755
    directory under /tmp, so that any uid can reach it; .socket, .munge(), .unmunge()."""
    d = tempfile.mkdtemp(prefix=H.BASE_PREFIX + "munged-")
    try:
        m = munged_helper.start_munged(d)
    except Exception as e:
        shutil.rmtree(d, ignore_errors=True)
        pytest.fail(str(e), pytrace=False)
    yield m
    m.stop()
    if not H.KEEP:
        shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------- clusters


@pytest.fixture(scope="session")
def spillway_bin():
    if H.LOCAL:
        pytest.skip("Spillway-only (SPILLWAY_TEST_TARGET=local)")
    try:
        return H.find_binary(build=True)
    except Exception as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def _local_base():
    base = tempfile.mkdtemp(prefix=H.BASE_PREFIX + "local-")
    os.chmod(base, 0o755)
    yield base
    if not H.KEEP:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def pfs(_local_base):
    """A directory standing for the parallel file system (a local site's --pfs-root):
    0755 under the session's base, one per module."""
    d = tempfile.mkdtemp(prefix="pfs-", dir=_local_base)
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _module_tag(request):
    return re.sub(r"[^A-Za-z0-9]+", "-", request.module.__name__.rsplit(".", 1)[-1])[:30]


@pytest.fixture(scope="module")
def clusters(request, spillway_bin):
    """clusters(**opts) -> a running Cluster with those options, started on first use
    and torn down at the end of the module (even when tests or the start failed)."""
    cache = {}
    failed_before = request.session.testsfailed
    tag = _module_tag(request)

    def get(**opts):
        opts = {**{"servers": 2, "capacity": "4G"}, **opts}
        return H.started_once(cache, tuple(sorted(opts.items())),
                              lambda: H.Cluster(spillway_bin, f"{tag}{len(cache)}", **opts),
                              lambda c: c.up(), "cluster up")

    yield get

    failed = request.session.testsfailed > failed_before
    problems = []
    for c in cache.values():
        logs = None
        if failed or getattr(c, "start_error", None):
            logs = H.kept_logs_dir(c.dir)
        p = c.teardown(keep_logs_to=logs)
        if logs:
            print(f"\n[spillway] logs of {c.dir} kept in {logs}")
        problems += [f"{c.dir}: {x}" for x in p]
    if problems:
        # cleanup itself is done; report the contract violation loudly
        pytest.fail("cluster teardown problems:\n" + "\n".join(problems), pytrace=False)


@pytest.fixture(scope="module")
def cluster(request, clusters):
    """The module's main cluster, shaped by the module's CLUSTER_OPTS."""
    return clusters(**getattr(request.module, "CLUSTER_OPTS", {}))


_counter = [0]


@pytest.fixture(scope="module")
def mounts(cluster):
    """(the cluster's mount, a second mount of the same instance): two clients."""
    mp2 = os.path.join(cluster.dir, "mnt2")
    cluster.mount(mp2)
    yield cluster.mnt, mp2
    try:
        cluster.umount(mp2)
    except Exception as e:  # the cluster teardown cleans up and reports leftovers
        print(f"umount {mp2}: {e}")


def make_test_dir(parent, request):
    _counter[0] += 1
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:80] + f"-{_counter[0]}"
    d = os.path.join(parent, name)
    os.mkdir(d)
    os.chmod(d, 0o755)
    return d


def remove_test_dir(d):
    if not H.KEEP:
        H.force_rmtree(d)  # tests chmod things to 0000 / 0555


@pytest.fixture
def fresh_dir(request):
    """fresh_dir(cluster_or_None) -> a new empty directory on that cluster's mount (or in
    local mode on the local file system), removed after the test."""
    made = []

    def make(c=None):
        if H.LOCAL:
            parent = request.getfixturevalue("_local_base")
        else:
            parent = c.mnt
        d = make_test_dir(parent, request)
        made.append(d)
        return d

    yield make
    for d in made:
        remove_test_dir(d)


@pytest.fixture
def local_dir(request, _local_base):
    """A fresh directory on the local file system (both modes): the reference side of
    differential checks."""
    d = make_test_dir(_local_base, request)
    yield d
    remove_test_dir(d)


@pytest.fixture
def fs_root(request, fresh_dir):
    """A fresh empty directory on the file system under test."""
    if H.LOCAL:
        return fresh_dir()
    return fresh_dir(request.getfixturevalue("cluster"))


@pytest.fixture
def spw(request):
    """The module's Cluster in Spillway mode, None in local mode."""
    if H.LOCAL:
        return None
    return request.getfixturevalue("cluster")
