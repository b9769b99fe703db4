"""Cache configurations through the management service (docs/cache.md): a real local
site (manager, two storage servers, an agent; MUNGE), a cache configuration made with
the REST API, mounted by the agent, torn down by deleting the session.

The PFS is a loop-mounted XFS inside the site's PFS root, owned by the job user. A
teardown writes every dirty byte to the PFS before the instance goes, and refuses to go
while it cannot (the PFS remounted read-only): no data is dropped silently."""

import os
import subprocess
import tempfile
import time

import pytest

import spwhelpers as H
from sitehelpers import running_site

GiB = 1 << 30
MiB = 1 << 20


@pytest.fixture(scope="module")
def site(spillway_bin, munged, _local_base):
    with running_site(spillway_bin, _local_base, munged, prefix="cache-", pfs_users=(), servers=2,
                      logs=("manager", "agent", "server0", "server1"), log_tail=5000) as s:
        yield s


@pytest.fixture(scope="module")
def pfs(site, users):
    """A loop XFS mounted at <site PFS root>/xfs, its root owned by the first test user."""
    img = tempfile.mktemp(prefix="cachepfs-", suffix=".img", dir=site.base)
    with H.loop_xfs(os.path.join(site.pfs, "xfs"), img) as mnt:
        os.chown(mnt, users[0].uid, users[0].gid)
        yield mnt


def cache_job(site, token, owner, pfs_dir, **policy):
    """A session, instance and cache configuration, activated on the site's node: (session,
    configuration, mount path)."""
    s = site.api("POST", "/dw/v1/sessions", {"token": token, "owner": owner.uid,
                                             "client_nodes": [site.node]})
    i = site.api("POST", "/dw/v1/instances", {"session": s["id"], "capacity": GiB})
    c = site.api("POST", "/dw/v1/configurations",
                 {"instance": i["id"], "type": "cache", "access_mode": "stripe", "pfs": pfs_dir,
                  **policy})
    a = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]})
    site.wait_state("activations", a["id"], timeout=60)
    c["_instance"] = i["id"]
    return s, c, site.node_mount(site.node, a["mount"])


def test_a_cache_configuration_shows_and_writes_behind_to_its_directory(site, pfs, users):
    user = users[0]
    d = os.path.join(pfs, "job1")
    user.run(os.mkdir, d)
    user.run(H.write_file, os.path.join(d, "input"), b"from the PFS\n")
    s, c, mnt = cache_job(site, "7001", user, d, sync_on_close=True)
    got = site.api("GET", f"/dw/v1/configurations/{c['id']}")
    assert (got["type"], got["pfs"], got["sync_on_close"], got["read_ahead"]) == \
        ("cache", d, True, 16 * MiB)
    assert user.run(H.read_file, os.path.join(mnt, "input")) == b"from the PFS\n"
    data = os.urandom(3 * MiB)
    user.run(H.write_file, os.path.join(mnt, "output"), data)
    # sync_on_close: the close returned once the bytes were on the PFS.
    assert H.read_file(os.path.join(d, "output")) == data
    st = os.stat(os.path.join(d, "output"))
    assert (st.st_uid, st.st_gid) == (user.uid, user.gid)
    site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
    site.wait_gone("sessions", s["id"], timeout=90)
    # Gone only once every byte reached the PFS.
    assert H.read_file(os.path.join(d, "output")) == data


def test_sync_to_pfs_makes_fsync_and_fdatasync_reach_the_pfs(site, pfs, users):
    """DataWarp's sync_to_pfs (issue 30, item 6): with it on, fsync and fdatasync return
    once the file's changes are on the PFS, the file still open."""
    user = users[0]
    d = os.path.join(pfs, "job_sync")
    user.run(os.mkdir, d)
    s, c, mnt = cache_job(site, "7003", user, d, sync_to_pfs=True)
    assert site.api("GET", f"/dw/v1/configurations/{c['id']}")["sync_to_pfs"] is True

    def write_and_sync(path, data, sync):
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            os.write(fd, data)
            sync(fd)
            # Still open: what the PFS holds now is what the sync put there.
            with open(os.path.join(d, os.path.basename(path)), "rb") as f:
                return f.read()
        finally:
            os.close(fd)

    for name, sync in (("fsynced", os.fsync), ("fdatasynced", os.fdatasync)):
        data = os.urandom(3 * MiB + 11)
        assert user.run(write_and_sync, os.path.join(mnt, name), data, sync) == data, name
    site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
    site.wait_gone("sessions", s["id"], timeout=90)


def test_stages_on_a_cache_are_refused_at_the_call(site, pfs, users, _local_base):
    """Issue 30, item 11: a cache instance is not staged; a stage asked of one fails at
    the call (REST 400 naming why; libdatawarp -EINVAL), not accepted and failed later."""
    user = users[0]
    d = os.path.join(pfs, "job_stage")
    user.run(os.mkdir, d)
    user.run(H.write_file, os.path.join(d, "in"), b"pfs bytes")
    s, c, mnt = cache_job(site, "7004", user, d)
    inst = c["_instance"]
    status, body = site.request("POST", "/dw/v1/stages", {
        "instance": inst, "type": "file", "direction": "in",
        "source": os.path.join(d, "in"), "destination": "/copy"})
    assert status == 400, (status, body)
    assert "is a cache of" in str(body)
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "cray-datawarp"],
                           capture_output=True, text=True, check=True).stdout.split()
    exe = os.path.join(tempfile.mkdtemp(prefix="dwcache-", dir=_local_base), "dw_cache")
    os.chmod(os.path.dirname(exe), 0o755)
    subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-o", exe,
                    os.path.join(H.C_DIR, "dw_cache.c"), *flags], check=True)
    out = user.run(lambda: subprocess.run([exe, os.path.join(mnt, "in"), os.path.join(d, "out")],
                                          capture_output=True, text=True, timeout=60).stdout)
    import errno as errno_mod
    assert f"stage_in rc=-{errno_mod.EINVAL}" in out, out
    assert f"stage_out rc=-{errno_mod.EINVAL}" in out, out
    assert all(st.get("instance") != inst for st in site.api("GET", "/dw/v1/stages")["stages"])
    site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
    site.wait_gone("sessions", s["id"], timeout=90)


def test_a_teardown_waits_for_a_pfs_it_cannot_write(site, pfs, users):
    user = users[0]
    d = os.path.join(pfs, "job2")
    user.run(os.mkdir, d)
    s, c, mnt = cache_job(site, "7002", user, d)
    data = os.urandom(2 * MiB + 5)
    user.run(H.write_file, os.path.join(mnt, "late"), data)
    # Before write-behind (it waits 5 s for a file under its threshold).
    subprocess.run(["mount", "-o", "remount,ro", pfs], check=True)
    try:
        site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
        time.sleep(8)
        status, _ = site.request("GET", f"/dw/v1/sessions/{s['id']}")
        assert status == 200, "the session went while its cache still held unwritten bytes"
    finally:
        subprocess.run(["mount", "-o", "remount,rw", pfs], check=True)
    site.wait_gone("sessions", s["id"], timeout=180)
    assert H.read_file(os.path.join(d, "late")) == data


def test_bad_cache_configurations_are_refused(site, pfs, users):
    user = users[0]
    s = site.api("POST", "/dw/v1/sessions", {"token": "7003", "owner": user.uid,
                                             "client_nodes": [site.node]})
    i = site.api("POST", "/dw/v1/instances", {"session": s["id"], "capacity": GiB})
    try:
        def refused(body, why):
            status, o = site.request("POST", "/dw/v1/configurations",
                                     {"instance": i["id"], "access_mode": "stripe", **body})
            assert status == 400 and why in str(o), (body, status, o)

        refused({"type": "cache"}, "needs pfs")
        refused({"type": "cache", "pfs": "relative/dir"}, "absolute path")
        refused({"type": "cache", "pfs": "/a/../b"}, "absolute path")
        refused({"type": "scratch", "pfs": pfs}, "for configurations of type cache")
        refused({"type": "scratch", "sync_on_close": True}, "for configurations of type cache")
        # A cache shows one directory that every node shares: never private.
        status, o = site.request("POST", "/dw/v1/configurations",
                                 {"instance": i["id"], "access_mode": "private", "type": "cache",
                                  "pfs": pfs})
        assert status == 400 and "not possible for a cache" in str(o), o
        # A symlink the owner planted inside a PFS root, pointing out of it: the
        # servers follow links only while they stay beneath the root (openat2
        # RESOLVE_BENEATH), so it is refused like the directory it names.
        link = os.path.join(pfs, "to-etc")
        user.run(os.symlink, "/etc", link)
        c = site.api("POST", "/dw/v1/configurations",
                     {"instance": i["id"], "type": "cache", "access_mode": "stripe",
                      "pfs": link})
        site.wait(lambda: site.api("GET", f"/dw/v1/configurations/{c['id']}")["state"]
                  ["fuse_blown"], "configuration refused", timeout=90)
        assert f"cannot cache {link}" in site.log("manager")
        # Outside the servers' PFS roots: accepted by the manager, refused by every
        # server, and the configuration says why.
        c = site.api("POST", "/dw/v1/configurations",
                     {"instance": i["id"], "type": "cache", "access_mode": "stripe",
                      "pfs": "/etc"})
        site.wait(lambda: site.api("GET", f"/dw/v1/configurations/{c['id']}")["state"]
                  ["fuse_blown"], "configuration refused", timeout=90)
        assert "cannot cache /etc" in site.log("manager")
    finally:
        site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
        site.wait_gone("sessions", s["id"], timeout=90)


def test_a_directory_its_owner_cannot_read_is_refused(site, pfs, users):
    """The servers open the directory as the configuration's owner: a directory of
    another user's that the owner may not read is not cached for them."""
    owner, other = users
    d = os.path.join(pfs, "private-of-u1")
    user_dir = owner.run(os.mkdir, d, 0o700)
    del user_dir
    s = site.api("POST", "/dw/v1/sessions", {"token": "7004", "owner": other.uid,
                                             "client_nodes": [site.node]})
    try:
        i = site.api("POST", "/dw/v1/instances", {"session": s["id"], "capacity": GiB})
        c = site.api("POST", "/dw/v1/configurations",
                     {"instance": i["id"], "type": "cache", "access_mode": "stripe", "pfs": d})
        site.wait(lambda: site.api("GET", f"/dw/v1/configurations/{c['id']}")["state"]
                  ["fuse_blown"], "configuration refused", timeout=90)
        assert f"cannot cache {d}" in site.log("manager")
        assert not site.api("GET", f"/dw/v1/configurations/{c['id']}")["state"]["actualized"]
    finally:
        site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
        site.wait_gone("sessions", s["id"], timeout=90)
