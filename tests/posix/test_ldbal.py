"""Load-balanced instances (docs/cache.md §6): a real local site (manager, two storage
servers, two compute nodes each with its agent; MUNGE), configurations of access mode
ldbal made with the REST API and mounted by the agents.

The manager gives each node of an activation its replica by rank (`replica_of_rank`,
docs/placement.md): the two nodes read from different servers, which each mount's log
says. So a file read whole through both nodes' mounts proves that both servers hold
all of it, and a server killed under a node's open file shows that node's reads going
on from the other replica.

* scratch: a directory staged in through the REST API lands whole on both servers;
  both nodes read it byte-identical; every change answers EROFS, as the job user and
  as root; killed replica: reads fail over.
* cache: a PFS directory (a loop-mounted XFS owned by the job user) read through both
  nodes (each server fetches from the PFS); EROFS; a killed replica fails over.
* a configuration mixing ldbal with another access mode on one instance is refused.
"""

import errno
import glob
import hashlib
import os
import re
import tempfile
import time

import pytest

import spwhelpers as H
from sitehelpers import running_site

GiB = 1 << 30
MiB = 1 << 20
NODES = ["compute1", "compute0"]


@pytest.fixture(scope="module")
def site(spillway_bin, munged, _local_base, users):
    with running_site(spillway_bin, _local_base, munged, prefix="ldbal-", pfs_users=users[:1],
                      servers=2,
                      node=NODES[0], extra_nodes=NODES[1:],
                      logs=("manager", "agent", "agent-compute0", "server0", "server1"),
                      log_tail=5000) as s:
        yield s


def ldbal_job(site, token, owner, kind="scratch", **extra):
    """A session on both nodes, an instance on both servers and an ldbal configuration:
    (session, instance, configuration)."""
    s = site.api("POST", "/dw/v1/sessions", {"token": token, "owner": owner.uid,
                                             "client_nodes": NODES})
    i = site.api("POST", "/dw/v1/instances", {"session": s["id"], "capacity": 2 * GiB})
    assert i["capacity"]["nodes"] == 2, i
    c = site.api("POST", "/dw/v1/configurations",
                 {"instance": i["id"], "type": kind, "access_mode": "ldbal", **extra})
    assert c["access_mode"] == "ldbal", c
    return s, i, c


def activate(site, s, c):
    """The configuration mounted on both nodes: ({node: mount path}, {node: the server
    it reads from}). The replicas are the manager's assignment, (rank among the sorted
    node names + activation id) mod 2, and each mount's log says it reads from its
    own: the two nodes read from different servers."""
    a = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]})
    site.wait_state("activations", a["id"], timeout=60)
    replica = {n: (sorted(NODES).index(n) + a["id"]) % 2 for n in NODES}
    said = {}
    for path in glob.glob(os.path.join(site.dir, "**", f"activation-{a['id']}.log"),
                          recursive=True):
        for node, server in re.findall(r"node (\S+) reads from server (\d+)", open(path).read()):
            said[node] = int(server)
    assert said == replica, (said, replica)
    assert sorted(replica.values()) == [0, 1]
    return {n: site.node_mount(n, a["mount"]) for n in NODES}, replica


def stage_in(site, instance, owner, src, dst):
    st = site.api("POST", "/dw/v1/stages", {
        "instance": instance, "direction": "in", "type": "directory",
        "source": src, "destination": dst, "owner": owner.uid})
    for _ in range(30):
        got = site.api("GET", f"/dw/v1/stages/{st['id']}?wait=5")
        if got["state"] not in ("queued", "deferred", "running"):
            assert got["state"] == "complete", repr(got)
            return
    raise AssertionError(f"stage {st['id']} did not end")


class Root:
    """Root in this process: no permission check is what stops root's changes."""

    def run(self, fn, *args):
        return fn(*args)


def refused_erofs(user, fn, *args):
    try:
        user.run(fn, *args)
    except OSError as e:
        assert e.errno == errno.EROFS, (fn, args, e)
    else:
        raise AssertionError(f"{fn.__name__}{args} was allowed on a load-balanced instance")


def no_changes(user, mnt, existing):
    """Every kind of change through `mnt` answers EROFS, to the owner and to root."""
    for who in (user, Root()):
        refused_erofs(who, H.write_file, os.path.join(mnt, "new"), b"x")
        refused_erofs(who, os.mkdir, os.path.join(mnt, "newdir"))
        refused_erofs(who, os.unlink, existing)
        refused_erofs(who, os.truncate, existing, 0)
        refused_erofs(who, os.chmod, existing, 0o600)
        refused_erofs(who, os.rename, existing, existing + ".moved")
        refused_erofs(who, os.symlink, "x", os.path.join(mnt, "link"))
        refused_erofs(who, os.setxattr, existing, "user.k", b"v")


def read_after_killing(site, mnts, replica, rel, want):
    """Open `rel` through the mount of the node whose replica does not hold the file's
    inode (its metadata must stay reachable: only data is replicated), kill that
    replica, then read the file whole: the reads go on from the other replica, within
    seconds (a read gives a dead replica `replica_failover`, 1 s, not the 30 s
    reconnect window)."""
    home = os.stat(os.path.join(mnts[NODES[0]], rel)).st_ino >> 48
    victim = 1 - home
    node = next(n for n in NODES if replica[n] == victim)
    fd = os.open(os.path.join(mnts[node], rel), os.O_RDONLY)
    try:
        site.kill(f"server{victim}")
        t0 = time.monotonic()
        got = bytearray()
        while True:
            b = os.read(fd, 4 * MiB)
            if not b:
                break
            got += b
        took = time.monotonic() - t0
    finally:
        os.close(fd)
        site.start(f"server{victim}")
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(want).hexdigest()
    # Every read in flight at the kill fails over together (Endpoint::failing_over),
    # not one reconnect window after another.
    assert took < 25, f"reading {rel} after its replica died took {took:.1f} s"
    # The mount said where it went (its log is the activation's, below the site).
    logs = "".join(open(p, errors="replace").read()
                   for p in glob.glob(os.path.join(site.dir, "**", "activation-*.log"),
                                      recursive=True))
    assert f"from replica {victim} " in logs and "trying the next" in logs, logs[-3000:]


def test_a_staged_in_directory_is_on_every_replica_and_read_only(site, users):
    user = users[0]
    src = os.path.join(site.pfs, user.name, "ref1")
    user.run(os.makedirs, os.path.join(src, "sub"))
    files = {
        "big": os.urandom(1),  # several stripes
        "small": os.urandom(5000),
        "sub/other": os.urandom(1),
        "sub/never-read-before": os.urandom(17 * MiB + 7),
    }
    for name, data in files.items():
        user.run(H.write_file, os.path.join(src, name), data)
    s, i, c = ldbal_job(site, "9101", user)
    try:
        stage_in(site, i["id"], user, src, "/ref")
        mnts, replica = activate(site, s, c)
        # df shows one replica's room: every server holds every byte.
        st = os.statvfs(mnts["compute1"])
        assert st.f_blocks * st.f_frsize == i["capacity"]["bytes"] // 2, (st, i["capacity"])
        # Each node reads from its own replica: both hold every byte.
        for node, mnt in mnts.items():
            for name, data in files.items():
                if name == "sub/never-read-before":
                    continue
                got = user.run(H.read_file, os.path.join(mnt, "ref", name))
                assert got == data, f"{name} through {node} (server {replica[node]})"
        no_changes(user, mnts["compute1"], os.path.join(mnts["compute1"], "ref", "small"))
        # A node goes on reading from the other replica when its own dies under its
        # open file.
        read_after_killing(site, mnts, replica, "ref/sub/never-read-before",
                           files["sub/never-read-before"])
    finally:
        site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
        site.wait_gone("sessions", s["id"], timeout=120)


@pytest.fixture(scope="module")
def pfs_xfs(site, users):
    """A loop XFS mounted at <site PFS root>/xfs, its root owned by the first test user."""
    img = tempfile.mktemp(prefix="ldbalpfs-", suffix=".img", dir=site.base)
    with H.loop_xfs(os.path.join(site.pfs, "xfs"), img) as mnt:
        os.chown(mnt, users[0].uid, users[0].gid)
        yield mnt


def test_a_load_balanced_cache_reads_the_pfs_from_every_replica(site, pfs_xfs, users):
    user = users[0]
    d = os.path.join(pfs_xfs, "ref2")
    user.run(os.mkdir, d)
    files = {"a": os.urandom(9 * MiB + 5), "b": os.urandom(4096), "c": os.urandom(12 * MiB)}
    for name, data in files.items():
        user.run(H.write_file, os.path.join(d, name), data)
    s, i, c = ldbal_job(site, "9102", user, kind="cache", pfs=d)
    try:
        mnts, replica = activate(site, s, c)
        for node, mnt in mnts.items():
            assert sorted(os.listdir(mnt)) == sorted(files)
            for name in ("a", "b"):
                got = user.run(H.read_file, os.path.join(mnt, name))
                assert got == files[name], f"{name} through {node} (server {replica[node]})"
        no_changes(user, mnts["compute0"], os.path.join(mnts["compute0"], "a"))
        # Nothing reached the PFS.
        assert sorted(os.listdir(d)) == sorted(files)
        assert H.read_file(os.path.join(d, "a")) == files["a"]
        # The namespace is server 0's, so server 1 dies: compute0's reads move to
        # server 0, which fetches from the PFS itself.
        read_after_killing(site, mnts, replica, "c", files["c"])
    finally:
        site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
        site.wait_gone("sessions", s["id"], timeout=120)


def test_ldbal_does_not_share_an_instance_with_another_access_mode(site, users):
    user = users[0]
    s, i, c = ldbal_job(site, "9103", user)
    try:
        status, o = site.request("POST", "/dw/v1/configurations",
                                 {"instance": i["id"], "type": "scratch", "access_mode": "stripe"})
        assert status == 400 and "load-balanced" in str(o), (status, o)
        status, o = site.request("POST", "/dw/v1/configurations",
                                 {"instance": i["id"], "type": "scratch", "access_mode": "private"})
        assert status == 400, (status, o)
    finally:
        site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
        site.wait_gone("sessions", s["id"], timeout=120)


def test_a_stage_in_beyond_one_replicas_room_fails_and_stores_nothing_silently(
        spillway_bin, munged, _local_base, users):
    """Every server holds every byte, so a load-balanced instance holds one fragment's
    share of its capacity: a stage-in of more is a failed stage (ENOSPC), never one
    reported complete. What the failed copy wrote is freed on every replica (no client
    can remove it: the instance is read-only to them), so a file that fits stages in
    afterwards."""
    user = users[0]
    with running_site(spillway_bin, _local_base, munged, prefix="ldbalfull-", pfs_users=users[:1],
                      servers=2, server_capacity="64MiB", granularity="64MiB",
                      node=NODES[0]) as small:
        src = os.path.join(small.pfs, user.name, "big")
        user.run(os.makedirs, src)
        user.run(H.write_file, os.path.join(src, "big"), os.urandom(100 * MiB))
        ok = os.path.join(small.pfs, user.name, "fits")
        user.run(os.makedirs, ok)
        data = os.urandom(20 * MiB)
        user.run(H.write_file, os.path.join(ok, "fits"), data)
        s = small.api("POST", "/dw/v1/sessions", {"token": "9111", "owner": user.uid,
                                                  "client_nodes": NODES[:1]})
        try:
            i = small.api("POST", "/dw/v1/instances", {"session": s["id"], "capacity": 128 * MiB})
            assert i["capacity"]["nodes"] == 2, i
            small.api("POST", "/dw/v1/configurations",
                      {"instance": i["id"], "type": "scratch", "access_mode": "ldbal"})
            st = small.api("POST", "/dw/v1/stages", {
                "instance": i["id"], "direction": "in", "type": "directory",
                "source": src, "destination": "/big", "owner": user.uid})
            for _ in range(30):
                got = small.api("GET", f"/dw/v1/stages/{st['id']}?wait=5")
                if got["state"] not in ("queued", "deferred", "running"):
                    break
            assert got["state"] == "failed", got
            assert got["error"]["errno"] == errno.ENOSPC and "full" in got["error"]["message"], got
            stage_in(small, i["id"], user, ok, "/fits")
        finally:
            small.api("DELETE", f"/dw/v1/sessions/{s['id']}")
            small.wait_gone("sessions", s["id"], timeout=120)
