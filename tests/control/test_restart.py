"""Server crashes and restarts: data that was closed or fsync'ed survives a SIGKILL of any
server, the existing mount reconnects by itself, and a whole cluster down/up with
--keep-data (if the binary has it) keeps every file."""

import hashlib
import os
import time

import pytest

import spwhelpers as H
from spwhelpers import MiB

pytestmark = pytest.mark.spillway_only

# 1 MiB stripes over 3 servers: every file above 2 MiB has data on every server.
CLUSTER_OPTS = {"servers": 3, "capacity": "4G", "stripe_size": "1M"}


class Corpus:
    """Files with known contents: some closed, some fsync'ed and kept open."""

    def __init__(self, root):
        self.root = root
        self.closed = {}  # path -> sha256
        self.synced = {}  # path -> (fd, data)
        sizes = [0, 1, 4096, 100_000, MiB + 7, 3 * MiB + 11, 10 * MiB]
        for i, n in enumerate(sizes):
            p = os.path.join(root, f"closed-{i}")
            data = os.urandom(n)
            H.write_file(p, data)
            self.closed[p] = hashlib.sha256(data).hexdigest()
        os.mkdir(os.path.join(root, "sub"))
        p = os.path.join(root, "sub", "nested")
        data = os.urandom(2 * MiB + 5)
        H.write_file(p, data)
        self.closed[p] = hashlib.sha256(data).hexdigest()
        for i, n in enumerate([5000, 2 * MiB + 3, 7 * MiB]):
            p = os.path.join(root, f"synced-{i}")
            data = os.urandom(n)
            fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
            H.pwrite_all(fd, data, 0)
            os.fsync(fd)
            self.synced[p] = (fd, data)

    def check(self, when):
        bad = []
        for p, digest in self.closed.items():
            H.drop_file_cache(p)
            try:
                got = H.sha256_file(p)
            except OSError as e:
                bad.append(f"{os.path.basename(p)}: {e}")
                continue
            if got != digest:
                bad.append(f"{os.path.basename(p)}: content differs (size now {os.stat(p).st_size})")
        for p, (fd, data) in self.synced.items():
            try:
                got = H.pread_all(fd, len(data) + 1, 0)
                if got != data:
                    bad.append(f"{os.path.basename(p)} (open fd): {len(got)} bytes, content differs")
                H.drop_file_cache(p)
                if H.read_file(p) != data:
                    bad.append(f"{os.path.basename(p)} (reopened): content differs")
            except OSError as e:
                bad.append(f"{os.path.basename(p)}: {e}")
        assert not bad, f"{when}:\n" + "\n".join(bad)

    def close(self):
        for fd, _ in self.synced.values():
            os.close(fd)
        self.closed.update({p: hashlib.sha256(d).hexdigest() for p, (_, d) in self.synced.items()})
        self.synced = {}


def _wait_gone(pids, timeout=10):
    def gone():
        return all(not os.path.exists(f"/proc/{p}") or _zombie(p) for p in pids)

    return H.poll(gone, timeout=timeout, interval=0.1)


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.timeout(900)
@pytest.mark.parametrize("sig", ["KILL", "TERM"])
def test_kill_each_server_in_turn(fs_root, cluster, sig):
    corpus = Corpus(fs_root)
    corpus.check("before any restart")
    try:
        for k in range(cluster.servers):
            before = cluster.server_pids().get(k, [])
            cluster.kill_server(k, sig)
            if before:
                assert _wait_gone(before), f"server {k} still running after kill-server --signal {sig}"
            cluster.start_server(k)
            after = cluster.server_pids().get(k, [])
            if before:
                assert after and not set(after) & set(before), f"server {k} was not restarted: {before} -> {after}"
            t0 = time.monotonic()
            corpus.check(f"after {sig} and restart of server {k}")
            print(f"\nserver {k}: all files intact {time.monotonic() - t0:.1f} s after restart")
            # and the mount keeps working for new data
            p = os.path.join(fs_root, f"after-restart-{k}")
            data = os.urandom(3 * MiB)
            H.write_file(p, data)
            H.drop_file_cache(p)
            assert H.read_file(p) == data
            corpus.closed[p] = hashlib.sha256(data).hexdigest()
        corpus.close()
        corpus.check("after all restarts, descriptors closed")
    finally:
        for fd, _ in corpus.synced.values():
            try:
                os.close(fd)
            except OSError:
                pass


def _in_process(script, *args):
    """Run `script` in a child Python process. Not a thread: this process must hold no
    file of the mount open while it forks `spillway cluster start-server`, or the
    child's close of the inherited descriptor (before its exec) would wait, like any
    close, for the dirty data to reach the server that is down - and the server would
    never be started."""
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


_READ = "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())"
_WRITE = (
    "import hashlib, os, sys\n"
    "data = os.urandom(4 << 20)\n"
    "with open(sys.argv[1], 'wb') as f:\n"
    "    f.write(data)\n"
    "print(hashlib.sha256(data).hexdigest())\n"
)


@pytest.mark.timeout(300)
def test_io_during_outage_completes_after_restart(fs_root, cluster):
    """While a server is down, reads and writes that need it wait (within the reconnect
    window) and complete correctly once it is back."""
    p = os.path.join(fs_root, "f")
    data = os.urandom(6 * MiB)  # 6 stripes over 3 servers
    H.write_file(p, data)
    H.drop_file_cache(p)
    cluster.kill_server(0, "KILL")
    try:
        reader = _in_process(_READ, p)
        writer = _in_process(_WRITE, os.path.join(fs_root, "g"))
        time.sleep(2)
    finally:
        cluster.start_server(0)
    rout, rerr = reader.communicate(timeout=90)
    wout, werr = writer.communicate(timeout=90)
    assert reader.returncode == 0, f"read during the outage failed: {rerr}"
    assert writer.returncode == 0, f"write+close during the outage failed: {werr}"
    assert rout.strip() == hashlib.sha256(data).hexdigest()
    H.drop_file_cache(os.path.join(fs_root, "g"))
    assert hashlib.sha256(H.read_file(os.path.join(fs_root, "g"))).hexdigest() == wout.strip()


@pytest.mark.timeout(600)
def test_cluster_down_up_keep_data(fs_root, cluster):
    """Must run last in this module: it restarts the module's cluster."""
    b = cluster.binary
    if H.help_mentions(b, ["cluster", "down"], "--keep-data"):
        down_extra, up_extra = ["--keep-data"], []
    elif H.help_mentions(b, ["cluster", "up"], "--keep-data"):
        down_extra, up_extra = [], ["--keep-data"]
    else:
        pytest.skip("spillway cluster has no --keep-data")
    corpus = Corpus(fs_root)
    corpus.close()
    corpus.check("before cluster down")
    rel = {os.path.relpath(p, cluster.mnt): d for p, d in corpus.closed.items()}
    cluster.down(extra=down_extra)
    mounts, pids = cluster.leftovers()
    assert not mounts and not pids, f"after cluster down: mounts {mounts}, processes {pids}"
    cluster.up(extra=up_extra)
    for r, digest in rel.items():
        p = os.path.join(cluster.mnt, r)
        assert H.sha256_file(p) == digest, f"{r} changed across cluster down/up --keep-data"


def test_cluster_down_is_idempotent(clusters):
    c = clusters(servers=2, capacity="256M")
    H.write_file(os.path.join(c.mnt, "x"), b"x")
    c.down()
    mounts, pids = c.leftovers()
    assert not mounts, f"still mounted after cluster down: {mounts}"
    assert not pids, f"still running after cluster down: {pids}"
    r = c.down(check=False)
    assert r.returncode == 0, f"second cluster down exited {r.returncode}: {r.stderr}"
    assert c.leftovers() == ([], [])
