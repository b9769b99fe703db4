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
