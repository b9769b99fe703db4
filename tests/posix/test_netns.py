"""A cluster whose servers each run in their own network namespace, joined to the root
namespace (where the mount is) by a veth pair: `spillway cluster up --netns`.

Runs the whole POSIX suite (tests/posix/test_posix_*.py) against it (the functions are
imported, so pytest collects them again here, with this module's cluster), a 200 MB
checksum round trip over the veth path, and checks that the servers really are in other namespaces and
that `cluster down` removes them."""

import hashlib
import ipaddress
import os
import subprocess
import tempfile

import pytest

import spwhelpers as H
from spwhelpers import MiB

import test_posix_attrs
import test_posix_dirs
import test_posix_files
import test_posix_io
import test_posix_spillway

# The whole POSIX suite, collected again here against this module's (netns) cluster:
# every test of tests/posix/test_posix_*.py (imported from this folder) runs across the
# veth path as well.
for _posix in (test_posix_files, test_posix_io, test_posix_dirs, test_posix_attrs, test_posix_spillway):
    for _name in dir(_posix):
        _obj = getattr(_posix, _name)
        # The tests, and the modules' own fixtures they use (e.g. striped_root).
        _is_fixture = hasattr(_obj, "_pytestfixturefunction") or type(_obj).__name__ == "FixtureFunctionDefinition"
        if _name.startswith("test_") or _is_fixture:
            assert _name not in globals(), f"{_name} is defined twice in the POSIX suite"
            globals()[_name] = _obj

pytestmark = pytest.mark.spillway_only

CLUSTER_OPTS = {"servers": 2, "capacity": "4G", "netns": True}


def test_servers_run_in_their_own_network_namespaces(cluster):
    mine = H.netns_of(os.getpid())
    pids = cluster.server_pids()
    assert all(pids.get(k) for k in range(cluster.servers)), f"cannot find the server processes: {pids}"
    seen = {}
    for k, plist in pids.items():
        for pid in plist:
            ns = H.netns_of(pid)
            assert ns != mine, f"server {k} (pid {pid}) runs in the root network namespace {ns}"
            seen.setdefault(k, set()).add(ns)
    assert all(len(v) == 1 for v in seen.values()), seen
    all_ns = [next(iter(v)) for v in seen.values()]
    assert len(set(all_ns)) == cluster.servers, f"servers share a network namespace: {seen}"
    assert H.is_mounted(cluster.mnt), "the mount lives in the root namespace"


def test_server_addresses_are_not_loopback(cluster):
    for addr in cluster.instance()["servers"]:
        host = addr.rsplit(":", 1)[0].strip("[]")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            continue  # a name; nothing to check
        assert not ip.is_loopback, f"server address {addr} is loopback: the data path does not cross the veth"


@pytest.mark.timeout(600)
def test_checksum_round_trip_200mb(fs_root):
    path = os.path.join(fs_root, "big")
    size = 200 * 1000 * 1000
    block = os.urandom(4 * MiB)
    h = hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    off, i = 0, 0
    while off < size:
        n = min(len(block), size - off)
        piece = i.to_bytes(8, "little") + block[8:n]
        H.pwrite_all(fd, piece, off)
        h.update(piece)
        off += n
        i += 1
    os.close(fd)
    H.drop_file_cache(path)
    assert os.stat(path).st_size == size
    assert H.sha256_file(path, bufsize=4 * MiB) == h.hexdigest()


def _netns_state():
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show", "type", "veth"], capture_output=True, text=True).stdout
    return (
        {l.split()[0] for l in ns.splitlines() if l.strip()},
        {l.split(":")[1].strip().split("@")[0] for l in links.splitlines() if l.strip()},
    )


@pytest.mark.timeout(300)
def test_cluster_down_removes_namespaces(clusters):
    ns0, veth0 = _netns_state()
    c = clusters(servers=2, capacity="256M", netns=True)
    ns1, veth1 = _netns_state()
    H.write_file(os.path.join(c.mnt, "x"), b"x")
    server_ns = {H.netns_of(p) for plist in c.server_pids().values() for p in plist}
    c.down()
    ns2, veth2 = _netns_state()
    assert not (ns1 - ns0) & ns2, f"named namespaces left after cluster down: {(ns1 - ns0) & ns2}"
    assert not (veth1 - veth0) & veth2, f"veth links left after cluster down: {(veth1 - veth0) & veth2}"
    mounts, pids = c.leftovers()
    assert not mounts and not pids, f"after cluster down: mounts {mounts}, processes {pids}"
    assert server_ns, "could not find the servers' namespaces"


def _subnets_in_use():
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    used = set()
    for word in out.replace("\\", " ").split():
        if word.count(".") == 3 and "/" in word:
            a = word.split("/")[0].split(".")
            if a[0] == "10":
                used.add(int(a[1]))
    return used


@pytest.mark.timeout(300)
def test_netns_cluster_takes_a_subnet_no_one_else_uses(clusters, spillway_bin):
    """Two --netns clusters alive at once must never share a subnet: a client would
    reach the other cluster's server and be refused (CI once failed this way, when the
    subnet was derived from the instance id). Every 10.N subnet but one is taken here by
    a bridge of its own; the new cluster must take the one left."""
    blocker = "spwtestbr"
    subprocess.run(["ip", "link", "del", blocker], capture_output=True)
    used = _subnets_in_use()
    free = [n for n in range(128, 255) if n not in used]
    assert free, f"no free 10.N subnet on this host: {sorted(used)}"
    keep = free[len(free) // 2]
    subprocess.run(["ip", "link", "add", blocker, "type", "bridge"], check=True)
    try:
        batch = "".join(f"addr add 10.{n}.0.1/24 dev {blocker}\n" for n in free if n != keep)
        subprocess.run(["ip", "-batch", "-"], input=batch, text=True, check=True)
        c = clusters(servers=1, capacity="64M", netns=True)
        for addr in c.instance()["servers"]:
            assert addr.startswith(f"10.{keep}.0."), f"server {addr} not in the one free subnet 10.{keep}.0.0/24"
        H.write_file(os.path.join(c.mnt, "y"), b"y")
        assert H.read_file(os.path.join(c.mnt, "y")) == b"y"
        # With none left, `up` says so and leaves nothing behind.
        subprocess.run(["ip", "addr", "add", f"10.{keep}.1.1/24", "dev", blocker], check=True)
        ns0, veth0 = _netns_state()
        with tempfile.TemporaryDirectory(prefix="spillway-netns-full-") as d:
            r = subprocess.run([spillway_bin, "cluster", "up", "--dir", d, "--servers", "1",
                                "--capacity", "64M", "--netns"], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "no free subnet" in r.stderr, (r.returncode, r.stderr)
        assert _netns_state() == (ns0, veth0)
    finally:
        subprocess.run(["ip", "link", "del", blocker], capture_output=True)
