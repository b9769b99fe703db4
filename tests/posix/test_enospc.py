"""ENOSPC never leaves bytes that were not stored (issue 15 item 1; docs/data-plane.md
"Space grants"). A small instance (64 MiB over 2 servers) is filled by real writers on
two mounts: write(2) itself fails with ENOSPC (a short count first where a part fits),
close and fsync then succeed, the size is what write() accepted, and every client, the
writer after close and reopen too, reads exactly those bytes, never a NUL tail."""

import errno
import os
import subprocess
import threading

import pytest

import spwhelpers as H
from spwhelpers import MiB

pytestmark = pytest.mark.spillway_only

CLUSTER_OPTS = {"servers": 2, "capacity": "64M"}


def free_bytes(mnt):
    st = os.statvfs(mnt)
    return st.f_bavail * st.f_frsize


@pytest.fixture
def dirs(mounts, cluster, request):
    """(a dir on mount A, the same on mount B) of an empty instance; emptied after."""
    a_root, b_root = mounts
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)[:50]
    a, b = os.path.join(a_root, name), os.path.join(b_root, name)
    os.mkdir(a)
    os.chmod(a, 0o777)
    yield a, b
    subprocess.run(["rm", "-rf", a], check=False)
    # Unlinked files' stripes are purged by their homes: wait until the space is back.
    cap = cluster.capacity()
    assert H.poll(lambda: free_bytes(a_root) >= cap - 2 * MiB, timeout=20), "space not freed"


def stream_until_full(path, data, limit):
    """Write `data` in 1 MiB writes until write(2) fails. Returns (bytes accepted, the
    error). fsync and close must then succeed: nothing accepted may fail later."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    done, err = 0, None
    try:
        while done < limit:
            try:
                n = os.write(fd, data[done : done + MiB])
            except OSError as e:
                err = e
                break
            assert n > 0
            done += n
        os.fsync(fd)
    finally:
        os.close(fd)
    return done, err


def fill(d, cap):
    """Fill the instance with files until new files get no byte in: both servers full."""
    blob = os.urandom(2 * cap)
    misses, k, total = 0, 0, 0
    while misses < 8:
        done, err = stream_until_full(os.path.join(d, f"fill{k}"), blob, 2 * cap)
        assert err is not None and err.errno == errno.ENOSPC, err
        total += done
        misses = misses + 1 if done == 0 else 0
        k += 1
        assert k < 64, "the instance never filled"
    assert total <= cap
    return k


def test_write_itself_fails_and_every_client_reads_what_was_accepted(dirs, cluster):
    a, b = dirs
    cap = cluster.capacity()
    data = os.urandom(2 * cap)
    path = os.path.join(a, "stream")
    done, err = stream_until_full(path, data, 2 * cap)
    assert err is not None, f"{done} bytes accepted on a {cap}-byte instance without ENOSPC"
    assert err.errno == errno.ENOSPC, f"write(2) failed with {H.ename(err.errno)}"
    assert 0 < done <= cap
    # The size is what write() accepted, on both mounts.
    assert os.stat(path).st_size == done
    other = os.path.join(b, "stream")
    assert os.stat(other).st_size == done
    with open(other, "rb") as f:
        got = f.read()
    assert len(got) == done and got == data[:done], "mount B reads other bytes than were accepted"
    # The writer's own page cache, after close and reopen: the same bytes.
    with open(path, "rb") as f:
        mine = f.read()
    assert mine == data[:done], "the writer reads other bytes than were accepted"
    # The servers hold no more than the instance's capacity.
    stored = sum(n for _, _, _, n in cluster.stripes(path))
    assert stored == done


def test_echo_on_a_full_instance_fails_and_leaves_no_nul_bytes(dirs, cluster, user):
    a, b = dirs
    fill(a, cluster.capacity())
    target = os.path.join(a, "f")
    # bash: its echo names the errno (dash's says "I/O error" whatever it was).
    r = H.as_user(user.uid, user.gid, subprocess.run, ["bash", "-c", f"echo test > {target}"], capture_output=True)
    assert r.returncode != 0, "echo into a full instance exited 0"
    assert b"No space left on device" in r.stderr, r.stderr
    with open(target, "rb") as f:
        assert f.read() == b""
    assert os.stat(target).st_size == 0
    with open(os.path.join(b, "f"), "rb") as f:
        assert f.read() == b"", "mount B sees bytes that were never stored"


def test_overwrite_inside_existing_data_on_a_full_instance_succeeds(dirs, cluster):
    a, b = dirs
    fill(a, cluster.capacity())
    path = os.path.join(a, "fill0")
    size = os.stat(path).st_size
    assert size >= 2 * MiB
    new = os.urandom(64 * 1024)
    fd = os.open(path, os.O_WRONLY)
    try:
        assert os.pwrite(fd, new, MiB) == len(new)
        os.fsync(fd)
    finally:
        os.close(fd)
    with open(os.path.join(b, "fill0"), "rb") as f:
        f.seek(MiB)
        assert f.read(len(new)) == new
    assert os.stat(path).st_size == size
    # Growing the file is refused at write(2).
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        with pytest.raises(OSError) as e:
            os.write(fd, b"x" * 4096)
        assert e.value.errno == errno.ENOSPC
    finally:
        os.close(fd)
    assert os.stat(path).st_size == size


def test_two_clients_competing_for_the_last_space_lose_nothing(dirs, cluster):
    a, b = dirs
    cap = cluster.capacity()
    data = [os.urandom(cap), os.urandom(cap)]
    paths = [os.path.join(a, "one"), os.path.join(b, "two")]
    results = [None, None]

    def writer(i):
        try:
            results[i] = stream_until_full(paths[i], data[i], cap)
        except OSError as e:  # a late error (fsync, close) fails the test below
            results[i] = e

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    accepted = 0
    for i, r in enumerate(results):
        assert isinstance(r, tuple), f"writer {i}: an accepted write failed later: {r!r}"
        done, err = r
        assert err is not None and err.errno == errno.ENOSPC, f"writer {i}: {err!r}"
        accepted += done
        # Read through the other mount: exactly what this writer's write() accepted.
        other = os.path.join(b if i == 0 else a, os.path.basename(paths[i]))
        assert os.stat(other).st_size == done
        with open(other, "rb") as f:
            assert f.read() == data[i][:done], f"writer {i}: other bytes than accepted"
    assert 0 < accepted <= cap
