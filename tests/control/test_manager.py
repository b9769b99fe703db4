"""The control plane end to end: a real manager (HTTPS, SQLite, MUNGE from a private
munged), real storage servers and a real agent mounting with the FUSE client.

Covers issue 3's list: pool -> nodes -> persistent instance -> activation -> I/O through
the mount -> deactivate -> destroy; drained and dead servers avoided; a manager restarted
mid-reconcile reaching the goal; non-admins denied; forged and replayed credentials
refused; bad requests answered 4xx; a failed mount reported."""

import contextlib
import errno
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time

import pytest

import spwhelpers as H
from sitehelpers import conforms, openapi_document, running_site, schema_ref
from wirehelpers import ROLE_CLIENT, capability_fields, hello_errno

GiB = 1 << 30


@pytest.fixture
def site_factory(spillway_bin, munged, _local_base):
    """site_factory(**kw) -> a started LocalSite of its own, taken down after the test."""
    with contextlib.ExitStack() as sites:
        yield lambda **kw: sites.enter_context(running_site(spillway_bin, _local_base, munged, **kw))


@pytest.fixture(scope="module")
def site(spillway_bin, munged, _local_base):
    with running_site(spillway_bin, _local_base, munged, servers=3) as s:
        yield s


def nodes_of(site, inst):
    frags = site.api("GET", "/dw/v1/fragments")["fragments"]
    return sorted(f["node"] for f in frags if f["links"]["instance"] == inst)


def test_whole_path_from_pool_to_destroy(site_factory, user):
    site = site_factory(bare=True, servers=2)
    st = site.state()
    pool = site.api("POST", "/dw/v1/pools", {"id": "ssd", "granularity": GiB})
    assert pool == {"id": "ssd", "units": "bytes", "granularity": GiB, "quantity": 0, "free": 0}
    for s in st["servers"]:
        site.api("POST", "/dw/v1/nodes", {"id": s["name"], "address": s["listen"], "pool": "ssd",
                                          "capacity": 4 * GiB})
    site.wait(lambda: site.api("GET", "/dw/v1/pools/ssd")["quantity"] == 8, "nodes online")

    s = site.api("POST", "/dw/v1/sessions",
                 {"token": "refdb", "owner": user.uid, "client_nodes": ["compute0"]})
    i = site.api("POST", "/dw/v1/instances", {"session": s["id"], "capacity": 3 * GiB - 1, "pool": "ssd"})
    assert i["capacity"] == {"bytes": 3 * GiB, "nodes": 2}
    assert i["public"] is True and i["owner"] == user.uid
    c = site.api("POST", "/dw/v1/configurations",
                 {"instance": i["id"], "type": "scratch", "access_mode": "stripe",
                  "root_permissions": 0o750})
    a = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]})
    mnt = a["mount"]
    assert mnt.startswith(os.path.join(site.dir, "mounts") + "/")
    site.wait_state("activations", a["id"])
    assert H.is_mounted(mnt)

    # The root belongs to the owner, with the configuration's permissions.
    sb = os.stat(mnt)
    assert (sb.st_uid, sb.st_gid, stat.S_IMODE(sb.st_mode)) == (user.uid, user.gid, 0o750)

    def write_and_read():
        p = os.path.join(mnt, "owned")
        with open(p, "wb") as f:
            f.write(b"x" * (3 << 20))
        with open(p, "rb") as f:
            return len(f.read())

    assert user.run(write_and_read) == 3 << 20
    assert os.stat(os.path.join(mnt, "owned")).st_uid == user.uid
    # Servers hold the fragments, one each.
    assert nodes_of(site, i["id"]) == ["server0", "server1"]
    assert site.api("GET", "/dw/v1/pools/ssd")["free"] == 5

    # Deactivate: unmounted, the instance stays.
    site.api("DELETE", f"/dw/v1/activations/{a['id']}")
    site.wait_gone("activations", a["id"])
    assert not H.is_mounted(mnt)
    assert site.api("GET", f"/dw/v1/instances/{i['id']}")["state"]["actualized"]

    # Destroy: everything goes, the servers' fragments too.
    site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
    site.wait_gone("sessions", s["id"])
    assert site.api("GET", "/dw/v1/instances")["instances"] == []
    assert site.api("GET", "/dw/v1/fragments")["fragments"] == []
    for srv in st["servers"]:
        assert os.listdir(os.path.join(srv["root"], "fragments")) == []
    assert site.api("GET", "/dw/v1/pools/ssd")["free"] == 8


def test_requests_that_cannot_fit_fail_at_once_saying_what_is_free(site):
    s = site.api("POST", "/dw/v1/sessions", {"token": "toobig", "client_nodes": []})
    try:
        status, out = site.request("POST", "/dw/v1/instances", {"session": s["id"], "capacity": 1000 * GiB})
        assert status == 409
        assert "24GiB free" in out["error"], out
    finally:
        site.api("DELETE", f"/dw/v1/sessions/{s['id']}")


def test_policies_spread_or_pack(site):
    s = site.api("POST", "/dw/v1/sessions", {"token": "policies", "client_nodes": []})
    try:
        wide = site.api("POST", "/dw/v1/instances", {"session": s["id"], "capacity": 3 * GiB,
                                                     "policy": "bandwidth"})
        narrow = site.api("POST", "/dw/v1/instances", {"session": s["id"], "capacity": 3 * GiB,
                                                       "policy": "isolation"})
        assert wide["capacity"]["nodes"] == 3
        assert narrow["capacity"]["nodes"] == 1
        status, out = site.request("POST", "/dw/v1/instances", {"session": s["id"], "capacity": 1,
                                                                "policy": "fastest"})
        assert status == 400 and out["choices"] == ["bandwidth", "isolation"]
    finally:
        site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
        site.wait_gone("sessions", s["id"])


def test_drained_node_is_avoided(site):
    site.api("PATCH", "/dw/v1/nodes/server1", {"drain": True})
    s = site.api("POST", "/dw/v1/sessions", {"token": "drained", "client_nodes": []})
    try:
        i = site.api("POST", "/dw/v1/instances", {"session": s["id"], "capacity": 6 * GiB})
        assert "server1" not in nodes_of(site, i["id"])
        assert len(nodes_of(site, i["id"])) == 2
        assert site.api("GET", "/dw/v1/nodes/server1")["drain"] is True
    finally:
        site.api("PATCH", "/dw/v1/nodes/server1", {"drain": False})
        site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
        site.wait_gone("sessions", s["id"])


def test_dead_server_is_marked_offline_and_avoided(site_factory):
    site = site_factory(servers=3)
    site.kill("server2")
    site.wait(lambda: not site.api("GET", "/dw/v1/nodes/server2")["online"], "server2 offline")
    assert site.api("GET", "/dw/v1/pools/wlm_pool")["quantity"] == 16
    s, i, c = site.persistent("afterdeath", 4 * GiB)
    assert "server2" not in nodes_of(site, i["id"])
    site.wait_state("instances", i["id"])
    # Back: online again, used again.
    site.start("server2")
    site.wait(lambda: site.api("GET", "/dw/v1/nodes/server2")["online"], "server2 online")
    assert site.api("GET", "/dw/v1/pools/wlm_pool")["quantity"] == 24


def test_instance_on_a_failed_server_is_not_intact(site_factory):
    site = site_factory(servers=2)
    s, i, c = site.persistent("fragile", 2 * GiB)
    site.wait_state("instances", i["id"])
    site.kill("server1")
    site.wait(lambda: not site.api("GET", f"/dw/v1/instances/{i['id']}")["intact"], "not intact")


def test_manager_restarted_mid_reconcile_reaches_the_goal(site_factory):
    site = site_factory(servers=2)
    # server1 stops answering: the instance's fragment there cannot be built yet.
    site.kill("server1")
    s, i, c = site.persistent("resumed", 2 * GiB)
    assert nodes_of(site, i["id"]) == ["server0", "server1"]
    time.sleep(1.5)
    inst = site.api("GET", f"/dw/v1/instances/{i['id']}")
    assert inst["state"]["actualized"] is False and inst["state"]["fuse_blown"] is False
    # The manager dies mid-way; the server comes back; a new manager finishes the job.
    site.kill("manager")
    site.start("server1")
    site.start("manager")
    site.wait_state("instances", i["id"])
    a = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]})
    site.wait_state("activations", a["id"])
    # Nothing duplicated: one fragment per server, one instance.
    assert len(site.api("GET", "/dw/v1/fragments")["fragments"]) == 2
    assert len(site.api("GET", "/dw/v1/instances")["instances"]) == 1
    for srv in site.state()["servers"]:
        assert os.listdir(os.path.join(srv["root"], "fragments")) == [str(i["id"])]
    # And a destroy started before a restart finishes after it.
    site.kill("agent")
    site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
    site.kill("manager")
    site.start("manager")
    site.start("agent")
    site.wait_gone("sessions", s["id"])
    assert not H.is_mounted(a["mount"])
    for srv in site.state()["servers"]:
        assert os.listdir(os.path.join(srv["root"], "fragments")) == []


def test_agent_restart_keeps_mounts_and_finishes_unmounts(site_factory):
    site = site_factory(servers=1)
    s, i, c = site.persistent("agentrestart", GiB)
    a = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]})
    site.wait_state("activations", a["id"])
    site.kill("agent")
    site.start("agent")
    time.sleep(1)
    assert H.is_mounted(a["mount"])
    site.api("DELETE", f"/dw/v1/activations/{a['id']}")
    site.wait_gone("activations", a["id"])
    assert not H.is_mounted(a["mount"])


def test_replacing_the_binary_under_a_running_site_keeps_mounting(spillway_bin, munged, _local_base):
    """Issue 30, item 5: an upgrade replaces `spillway` under a running site (a new file
    renamed over the old, as `install` does). New activations must still mount: the
    agent used to run /proc/self/exe, which then names "spillway (deleted)", and every
    mount failed with "No such file or directory"."""
    bindir = tempfile.mkdtemp(prefix="upgrade-bin-", dir=_local_base)
    os.chmod(bindir, 0o755)
    exe = os.path.join(bindir, "spillway")
    shutil.copy2(spillway_bin, exe)
    try:
        with running_site(exe, _local_base, munged, servers=1) as site:
            s, i, c = site.persistent("upgrade", GiB)
            a = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]})
            site.wait_state("activations", a["id"])
            assert H.is_mounted(a["mount"])
            # The upgrade: a new file beside it, renamed over it.
            fresh = os.path.join(bindir, ".spillway.new")
            shutil.copy2(spillway_bin, fresh)
            os.rename(fresh, exe)
            agent = [p for p in H.pids_mentioning(site.dir) if b"agent" in H.cmdline(p)]
            assert agent and all(os.readlink(f"/proc/{p}/exe").endswith("(deleted)") for p in agent), (
                "the running agent's binary was replaced")
            s2, i2, c2 = site.persistent("upgrade2", GiB)
            a2 = site.api("POST", "/dw/v1/activations", {"session": s2["id"], "configuration": c2["id"]})
            o = site.wait_state("activations", a2["id"], timeout=30)
            assert o["nodes"][0]["status"] == "mounted", o
            assert H.is_mounted(a2["mount"])
            H.write_file(os.path.join(a2["mount"], "after-upgrade"), b"mounted by the new binary")
            assert H.read_file(os.path.join(a2["mount"], "after-upgrade")) == b"mounted by the new binary"
            for act in (a, a2):
                site.api("DELETE", f"/dw/v1/activations/{act['id']}")
                site.wait_gone("activations", act["id"])
    finally:
        shutil.rmtree(bindir, ignore_errors=True)


def test_failed_mount_is_reported_not_hidden(site_factory, tmp_path):
    site = site_factory(servers=1)
    s, i, c = site.persistent("badmount", GiB)
    # A regular file where the mount point should be: the agent cannot mount there.
    blocker = os.path.join(site.dir, "mounts", "blocker")
    with open(blocker, "w") as f:
        f.write("not a directory\n")
    a = site.api("POST", "/dw/v1/activations",
                 {"session": s["id"], "configuration": c["id"], "mount": blocker + "/inner"})

    def failed():
        o = site.api("GET", f"/dw/v1/activations/{a['id']}")
        n = o["nodes"][0]
        return n["status"] == "failed" and n["error"] and o

    o = site.wait(failed, "the failure to be reported")
    assert "blocker" in o["nodes"][0]["error"]
    assert o["state"]["actualized"] is False


def test_non_admins_are_denied_admin_calls_and_others_objects(site, user, user2):
    # Admin calls.
    for method, path, body in [
        ("POST", "/dw/v1/pools", {"id": "mine", "granularity": GiB}),
        ("PATCH", "/dw/v1/nodes/server0", {"drain": True}),
        ("DELETE", "/dw/v1/nodes/server0", None),
        ("POST", "/dw/v1/nodes", {"id": "rogue", "address": "127.0.0.1:1"}),
        ("GET", "/dw/v1/agents/compute0/work", None),
    ]:
        status, out = site.request(method, path, body, as_user=user.name)
        assert status == 403, (method, path, status, out)
    assert site.api("GET", "/dw/v1/nodes/server0")["drain"] is False

    # A user creates their own session; a session for someone else is refused.
    mine = site.api("POST", "/dw/v1/sessions", {"token": "usersession", "client_nodes": []},
                    as_user=user.name)
    assert mine["owner"] == user.uid
    status, _ = site.request("POST", "/dw/v1/sessions", {"token": "forother", "owner": 0},
                             as_user=user.name)
    assert status == 403
    status, _ = site.request("POST", "/dw/v1/sessions", {"token": "12345"}, as_user=user.name)
    assert status == 403, "numeric tokens are for jobs"
    priv = site.api("POST", "/dw/v1/instances", {"session": mine["id"], "capacity": GiB,
                                                 "public": False}, as_user=user.name)
    try:
        # Another user sees neither the session nor its private instance, and cannot
        # destroy or use them.
        other = [x["id"] for x in site.api("GET", "/dw/v1/sessions", as_user=user2.name)["sessions"]]
        assert mine["id"] not in other
        assert site.request("GET", f"/dw/v1/sessions/{mine['id']}", as_user=user2.name)[0] == 404
        assert site.request("GET", f"/dw/v1/instances/{priv['id']}", as_user=user2.name)[0] == 404
        # (an object a user may not see answers 404, exactly as a missing one).
        status, out = site.request("DELETE", f"/dw/v1/sessions/{mine['id']}", as_user=user2.name)
        assert (status, out["error"]) == (404, f"no session {mine['id']}"), out
        status, out = site.request("POST", "/dw/v1/instances", {"session": mine["id"], "capacity": 1},
                                   as_user=user2.name)
        assert (status, out["error"]) == (404, f"no session {mine['id']}"), out
        # The admin sees everything; the owner sees their own.
        assert any(x["id"] == mine["id"] for x in site.api("GET", "/dw/v1/sessions")["sessions"])
        assert site.api("GET", f"/dw/v1/instances/{priv['id']}", as_user=user.name)["public"] is False
        # Persistent (public) instances are visible to everyone.
        s2, pub, _ = site.persistent("publicone", GiB, owner=0, nodes=[])
        try:
            seen = [x["id"] for x in site.api("GET", "/dw/v1/instances", as_user=user2.name)["instances"]]
            assert pub["id"] in seen and priv["id"] not in seen
        finally:
            site.api("DELETE", f"/dw/v1/sessions/{s2['id']}")
    finally:
        site.api("DELETE", f"/dw/v1/sessions/{mine['id']}", as_user=user.name)
        site.wait_gone("sessions", mine["id"])


def test_forged_and_replayed_credentials_are_refused(site, munged, tmp_path):
    status, out = site.request("GET", "/dw/v1/pools", cred=False)
    assert status == 401 and "Authorization" in out["error"]
    status, out = site.request("GET", "/dw/v1/pools", cred="MUNGE:AwQFAAD7forged:")
    assert status == 401
    cred = site.cred()
    assert site.request("GET", "/dw/v1/pools", cred=cred)[0] == 200
    status, out = site.request("GET", "/dw/v1/pools", cred=cred)
    assert status == 401 and "Replayed" in out["error"], out
    # A credential from another MUNGE realm (a second munged with its own key).
    import munged as munged_helper

    d = tempfile.mkdtemp(prefix="spillway-tests-munged2-")
    os.chmod(d, 0o755)
    try:
        with munged_helper.start_munged(d) as other:
            status, out = site.request("GET", "/dw/v1/pools", cred=other.munge())
            assert status == 401, out
    finally:
        shutil.rmtree(d, ignore_errors=True)
    # Tampered: one character in the middle changed.
    c = site.cred()
    mid = len(c) // 2
    bad = c[:mid] + ("A" if c[mid] != "A" else "B") + c[mid + 1:]
    assert site.request("GET", "/dw/v1/pools", cred=bad)[0] == 401


def test_bad_requests_get_4xx_with_a_message(site):
    cases = [
        ("POST", "/dw/v1/pools", b"{not json"),
        ("POST", "/dw/v1/pools", json.dumps({"id": "p", "granularity": 1, "extra": 1}).encode()),
        ("POST", "/dw/v1/pools", json.dumps({"id": "p", "granularity": -1}).encode()),
        ("POST", "/dw/v1/pools", json.dumps({"id": "../x", "granularity": 1}).encode()),
        ("POST", "/dw/v1/pools", json.dumps({"id": "p", "granularity": 0}).encode()),
        ("POST", "/dw/v1/sessions", json.dumps({"token": ""}).encode()),
        ("POST", "/dw/v1/sessions", json.dumps({"token": "x" * 100}).encode()),
        ("POST", "/dw/v1/instances", json.dumps({"session": 999999, "capacity": 1}).encode()),
        ("POST", "/dw/v1/instances", json.dumps({"session": "one", "capacity": 1}).encode()),
        ("POST", "/dw/v1/instances", json.dumps({"session": 1, "capacity": 1.5}).encode()),
        ("POST", "/dw/v1/configurations",
         json.dumps({"instance": 1, "type": "scratch", "access_mode": "sideways"}).encode()),
        ("POST", "/dw/v1/activations",
         json.dumps({"session": 1, "configuration": 1, "mount": "relative/path"}).encode()),
        ("GET", "/dw/v1/sessions/abc", None),
        ("GET", "/dw/v1/sessions/99999999999999999999999", None),
        ("DELETE", "/dw/v1/instances/424242", None),
        ("GET", "/dw/v1/nothing", None),
        ("PATCH", "/dw/v1/nodes/server0", json.dumps({"pool": "nosuchpool"}).encode()),
        ("POST", "/dw/v1/nodes", json.dumps({"id": "n", "address": "nohostport"}).encode()),
    ]
    for method, path, raw in cases:
        status, out = site.request(method, path, raw=raw)
        assert 400 <= status < 500, (method, path, raw, status, out)
        assert isinstance(out, dict) and out.get("error"), (method, path, out)


def test_capability_and_descriptor_stay_root_only(site_factory, user):
    site = site_factory(servers=1)
    s, i, c = site.persistent("secretive", GiB, owner=user.uid)
    a = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]})
    site.wait_state("activations", a["id"])
    agent_dir = os.path.join(site.dir, "agent")
    desc = os.path.join(agent_dir, f"activation-{a['id']}.json")
    assert stat.S_IMODE(os.stat(agent_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(desc).st_mode) == 0o600
    assert user.errno(lambda: open(desc).read()) == 13
    # The descriptor is not in the API answers either.
    assert "credential" not in json.dumps(site.api("GET", f"/dw/v1/activations/{a['id']}"))
    assert "secret" not in json.dumps(site.api("GET", f"/dw/v1/instances/{i['id']}"))


def test_openapi_document_is_served_and_matches_the_repo(site):
    status, doc = site.request("GET", "/dw/v1/openapi.json")
    assert status == 200
    assert doc == openapi_document()
    for path in ["/dw/v1/pools", "/dw/v1/nodes/{id}", "/dw/v1/sessions", "/dw/v1/instances/{id}",
                 "/dw/v1/fragments", "/dw/v1/configurations", "/dw/v1/activations/{id}"]:
        assert path in doc["paths"], path


def test_answers_have_the_documented_shapes(site):
    s, i, c = site.persistent("shapes", 1, nodes=["compute0"])
    a = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]})
    site.wait_state("activations", a["id"])
    try:
        for name, schema in [("pools", "Pool"), ("nodes", "Node"), ("sessions", "Session"),
                             ("instances", "Instance"), ("fragments", "Fragment"),
                             ("configurations", "Configuration"), ("activations", "Activation")]:
            listed = site.api("GET", f"/dw/v1/{name}")
            assert list(listed) == [name], "one top-level key, as Slurm reads it"
            assert listed[name], name
            for o in listed[name]:
                conforms(o, schema_ref(schema), name)
    finally:
        site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
        site.wait_gone("sessions", s["id"])


def test_servers_take_only_the_capability_the_manager_issued(site_factory, user):
    """The agent's descriptor holds a capability for (instance, node, expiry) bound to the
    node's address; servers accept it for its instance only, and nothing else."""
    site = site_factory(servers=2)
    caps = {}
    for token in ("capa", "capb"):
        s, i, c = site.persistent(token, GiB)
        a = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]})
        site.wait_state("activations", a["id"])
        with open(os.path.join(site.dir, "agent", f"activation-{a['id']}.json")) as f:
            d = json.load(f)
        caps[token] = (d, bytes.fromhex(d["credential"]))
    (da, ca), (db, cb) = caps["capa"], caps["capb"]
    instance, expires, node, addrs = capability_fields(ca)
    assert (instance, node, addrs) == (da["instance"], "compute0", ["127.0.0.1"])
    assert time.time() + 12 * 3600 <= expires <= time.time() + 86400 + 60, "half to all of a day"
    server = da["servers"][0]
    assert hello_errno(server, ROLE_CLIENT, da["instance"], ca) == 0
    assert hello_errno(server, ROLE_CLIENT, da["instance"], cb) == errno.EACCES, "another instance's"
    assert hello_errno(server, ROLE_CLIENT, da["instance"], ca[:-1] + bytes([ca[-1] ^ 1])) == errno.EACCES
    assert hello_errno(server, ROLE_CLIENT, da["instance"], b"") == errno.EACCES
    assert user.run(hello_errno, server, ROLE_CLIENT, da["instance"], b"") == errno.EACCES


def test_members_of_the_admin_group_are_admins(site_factory, user2):
    """admin_group in manager.conf: its members may do what root may."""
    site = site_factory(servers=1)
    group = "spwtest-admins"
    subprocess.run(["groupadd", "-f", group], check=True)
    subprocess.run(["gpasswd", "-a", user2.name, group], check=True, capture_output=True)
    try:
        assert site.request("POST", "/dw/v1/pools", {"id": "grp", "granularity": GiB}, as_user=user2.name)[0] == 403
        with open(os.path.join(site.dir, "manager.conf"), "a") as f:
            f.write(f"admin_group = {group}\n")
        site.kill("manager", signal="TERM")
        site.start("manager")
        status, out = site.request("POST", "/dw/v1/pools", {"id": "grp", "granularity": GiB}, as_user=user2.name)
        assert status == 201, out
        assert site.request("PATCH", "/dw/v1/nodes/server0", {"drain": True}, as_user=user2.name)[0] == 200
    finally:
        subprocess.run(["gpasswd", "-d", user2.name, group], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)
