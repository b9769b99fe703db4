"""Staging, the manager's side (docs/staging.md), with real processes: a local site
(`spillway local up --pfs-root ...`: manager over HTTPS with the private munged, storage
servers, agent).

What needs no copying server: validation, permissions, deferred stage-outs (revoke,
activate, survive a manager restart), counts and the `?wait=` long polls, concurrency,
teardown (deferred stage-outs activated first and the fragments held while one is
pending; `hurry` dropping them, logged). End to end, with the servers' stage engine:
data staged in and out and compared, a file the owner may not read failing with
errno 13, a server killed mid-stage (the stage fails, a retry succeeds), a teardown
that waits for a running stage-out."""

import json
import os
import re
import shutil
import signal
import time

import pytest

from sitehelpers import conforms, running_site, schema_ref

GiB = 1 << 30


@pytest.fixture(scope="module")
def site(spillway_bin, munged, _local_base, pfs):
    with running_site(spillway_bin, _local_base, munged, servers=2, pfs_roots=[pfs]) as s:
        yield s


_n = [0]


def owned_instance(site, owner, capacity=GiB, nodes=None):
    """A persistent session of `owner` with one instance (built); (session, instance)."""
    _n[0] += 1
    s = site.api("POST", "/dw/v1/sessions", {"token": f"st{_n[0]}", "owner": owner,
                                             "client_nodes": nodes or []})
    i = site.api("POST", "/dw/v1/instances", {"session": s["id"], "capacity": capacity})
    site.wait_state("instances", i["id"])
    return s, i


def stage(site, inst, direction, kind, source="", destination="", as_user=None, **extra):
    body = {"instance": inst, "direction": direction, "type": kind, **extra}
    if source or destination:
        body.update({"source": source, "destination": destination})
    return site.request("POST", "/dw/v1/stages", body, as_user=as_user)


def counts(site, inst, path, scope="file", as_user=None):
    from urllib.parse import quote
    status, c = site.request("GET", f"/dw/v1/instances/{inst}/stage_counts?path={quote(path)}&scope={scope}",
                             as_user=as_user)
    assert status == 200, c
    return c


def destroy(site, sess):
    site.request("DELETE", f"/dw/v1/sessions/{sess}")
    site.wait_gone("sessions", sess, timeout=40)


def engine_available(site, pfs):
    """Whether the servers run stages (the stage engine is on this branch)."""
    s, i = owned_instance(site, 0)
    try:
        src = os.path.join(pfs, "probe")
        with open(src, "w") as f:
            f.write("probe")
        st, o = stage(site, i["id"], "in", "file", src, "/probe")
        assert st == 201, o
        o = site.api("GET", f"/dw/v1/stages/{o['id']}?wait=30")
        return not (o["state"] == "failed" and "ENOSYS" in (o["error"] or {}).get("message", ""))
    finally:
        destroy(site, s["id"])


# ------------------------------------------------------------------ tests
def test_site_configuration_and_resources(site, pfs):
    with open(os.path.join(site.dir, "manager.conf")) as f:
        conf = f.read()
    assert f"pfs_roots = {os.path.realpath(pfs)}\n" in conf
    assert "stages" in site.api("GET", "/dw/v1")["resources"]
    doc = site.api("GET", "/dw/v1/openapi.json")
    for p in ["/dw/v1/stages", "/dw/v1/stages/{id}", "/dw/v1/instances/{id}/stage_actions",
              "/dw/v1/instances/{id}/stage_counts", "/dw/v1/instances/{id}/stage_failures",
              "/dw/v1/instances/{id}/stage_concurrency"]:
        assert p in doc["paths"], p


def test_bad_requests_are_400_with_a_message(site, pfs):
    s, i = owned_instance(site, 0)
    inst = i["id"]
    src = os.path.join(pfs, "f")
    try:
        cases = [
            ({"instance": inst, "direction": "in", "type": "file", "source": src, "destination": "/f",
              "bogus": 1}, "unknown field"),
            ({"instance": inst, "direction": "in", "type": "file", "source": "/etc/passwd",
              "destination": "/f"}, "PFS roots"),
            ({"instance": inst, "direction": "in", "type": "file", "source": src + "/../../etc/passwd",
              "destination": "/f"}, ".."),
            ({"instance": inst, "direction": "in", "type": "file", "source": "rel/path",
              "destination": "/f"}, "absolute"),
            ({"instance": inst, "direction": "in", "type": "file", "source": src,
              "destination": "f"}, "absolute"),
            ({"instance": inst, "direction": "in", "type": "file", "source": src,
              "destination": "/"}, "root"),
            ({"instance": inst, "direction": "in", "type": "file", "source": src, "destination": "/f",
              "when": "job_end"}, "stage-outs only"),
            ({"instance": inst, "direction": "in", "type": "file"}, "source and a destination"),
            ({"instance": inst, "direction": "in", "type": "file", "source": src, "destination": "/f",
              "pairs": [{"source": src, "destination": "/g"}]}, "pairs"),
            ({"instance": inst, "direction": "in", "type": "list", "pairs": []}, "at least one pair"),
            ({"instance": inst, "direction": "in", "type": "list", "source": src, "destination": "/f",
              "pairs": [{"source": src, "destination": "/g"}]}, "pairs only"),
            ({"instance": inst, "direction": "sideways", "type": "file", "source": src,
              "destination": "/f"}, "unknown variant"),
            ({"instance": -1, "direction": "in", "type": "file", "source": src,
              "destination": "/f"}, "invalid"),
        ]
        for body, word in cases:
            status, out = site.request("POST", "/dw/v1/stages", body)
            assert status == 400, (body, status, out)
            assert word in out["error"], (body, out)
        status, out = site.request("POST", "/dw/v1/stages", {"instance": inst, "direction": "in",
                                                             "type": "fil", "source": src,
                                                             "destination": "/f"})
        assert status == 400 and out["choices"] == ["file", "directory", "list"], out
        status, out = site.request("GET", "/dw/v1/stages?state=bogus")
        assert status == 400 and "queued" in out["choices"], out
        status, out = site.request("GET", "/dw/v1/stages/1?wait=61")
        assert status == 400 and "60" in out["error"], out
        status, out = site.request("GET", f"/dw/v1/instances/{inst}/stage_counts")
        assert status == 400, out
        status, out = site.request("GET", f"/dw/v1/instances/{inst}/stage_failures?limit=0")
        assert status == 400, out
        status, out = site.request("PATCH", "/dw/v1/stages/1", {"action": "explode"})
        assert status == 400 and out["choices"] == ["terminate", "revoke", "activate"], out
        status, out = site.request("PUT", f"/dw/v1/instances/{inst}/stage_concurrency", {"value": -1})
        assert status == 400, out
        status, out = site.request("DELETE", f"/dw/v1/instances/{inst}?hurry=maybe")
        assert status == 400, out
        # Not found.
        status, out = stage(site, 999999, "in", "file", src, "/f")
        assert status == 404 and "no instance 999999" in out["error"], out
        assert site.request("GET", "/dw/v1/stages/999999")[0] == 404
        assert site.request("GET", "/dw/v1/instances/999999/stage_counts?path=/")[0] == 404
    finally:
        destroy(site, s["id"])


def test_owner_and_admin_permissions(site, pfs, user, user2):
    s, i = owned_instance(site, user.uid)
    inst = i["id"]
    out_path = os.path.join(pfs, "perm-out")
    try:
        # The owner stages (as themselves); another user may not, nor name another owner.
        status, mine = stage(site, inst, "out", "file", "/a", out_path, as_user=user.name, when="job_end")
        assert status == 201, mine
        assert mine["owner"] == user.uid and mine["state"] == "deferred" and mine["session"] == s["id"]
        conforms(mine, schema_ref("Stage"))
        status, out = stage(site, inst, "out", "file", "/b", out_path, as_user=user2.name, when="job_end")
        assert status == 403, out
        status, out = stage(site, inst, "out", "file", "/b", out_path, as_user=user.name, when="job_end",
                            owner=user2.uid)
        assert status == 403 and "admins" in out["error"], out
        # Naming oneself is allowed (it is the default anyway).
        status, out = stage(site, inst, "out", "file", "/b2", out_path, as_user=user.name, when="job_end",
                            owner=user.uid)
        assert status == 201, out
        # An admin stages as the owner (how the FUSE client and dw_wlm_cli act).
        status, theirs = stage(site, inst, "out", "file", "/c", out_path, when="job_end", owner=user.uid)
        assert status == 201 and theirs["owner"] == user.uid, theirs
        status, rootly = stage(site, inst, "out", "file", "/d", out_path, when="job_end")
        assert status == 201 and rootly["owner"] == 0, rootly
        # Seeing and changing.
        for who, expect in [(user.name, 200), (user2.name, 404), (None, 200)]:
            assert site.request("GET", f"/dw/v1/stages/{theirs['id']}", as_user=who)[0] == expect, who
        assert site.request("PATCH", f"/dw/v1/stages/{mine['id']}", {"action": "revoke"},
                            as_user=user2.name)[0] == 404
        listed = {x["id"] for x in site.api("GET", "/dw/v1/stages", as_user=user.name)["stages"]}
        assert {mine["id"], theirs["id"], rootly["id"]} <= listed  # the session's stages
        assert site.api("GET", "/dw/v1/stages", as_user=user2.name)["stages"] == []
        assert {x["id"] for x in site.api("GET", f"/dw/v1/stages?instance={inst}")["stages"]} == listed
        assert [x["id"] for x in site.api("GET", f"/dw/v1/stages?session={s['id']}&state=deferred",
                                          as_user=user.name)["stages"]] == sorted(listed)
        # Per-instance calls: the instance's owner or an admin.
        for method, path, body in [
            ("GET", f"/dw/v1/instances/{inst}/stage_counts?path=/a", None),
            ("GET", f"/dw/v1/instances/{inst}/stage_failures", None),
            ("PUT", f"/dw/v1/instances/{inst}/stage_concurrency", {"value": 2}),
            ("POST", f"/dw/v1/instances/{inst}/stage_actions", {"action": "revoke", "path": "/a",
                                                                "scope": "file"}),
            ("DELETE", f"/dw/v1/instances/{inst}?hurry=true", None),
        ]:
            status, out = site.request(method, path, body, as_user=user2.name)
            assert status == 403, (method, path, status, out)
        assert site.request("PATCH", f"/dw/v1/stages/{mine['id']}", {"action": "revoke"},
                            as_user=user.name)[0] == 200
        # No credential: 401, as everywhere.
        assert site.request("GET", "/dw/v1/stages", cred=False)[0] == 401
    finally:
        destroy(site, s["id"])


def test_deferred_stage_outs_revoke_activate_and_counts(site, pfs):
    s, i = owned_instance(site, 0)
    inst = i["id"]
    dst = os.path.join(pfs, "deferred")
    try:
        status, a = stage(site, inst, "out", "file", "/out/a", dst + "-a", when="job_end")
        assert status == 201 and a["state"] == "deferred" and a["when"] == "job_end", a
        assert a["enumerated"] is False and a["server"] is None and a["error"] is None
        # Counted as one deferred for the path and for any tree containing it.
        assert counts(site, inst, "/out/a") == {"complete": 0, "pending": 0, "deferred": 1, "failed": 0,
                                                "started": True}
        assert counts(site, inst, "/out", "tree")["deferred"] == 1
        assert counts(site, inst, "/", "tree")["deferred"] == 1
        assert counts(site, inst, "/out/b") == {"complete": 0, "pending": 0, "deferred": 0, "failed": 0,
                                                "started": False}
        # One pending or deferred stage per file.
        status, out = stage(site, inst, "out", "file", "/out/a", dst + "-x")
        assert status == 409 and "/out/a" in out["error"], out
        # A directory stage-out of its parent covers it too, as one deferred.
        status, d = stage(site, inst, "out", "directory", "/out", dst, when="job_end")
        assert status == 201, d
        assert counts(site, inst, "/out/zzz")["deferred"] == 1
        assert counts(site, inst, "/", "tree")["deferred"] == 2
        # revoke: only deferred; then gone from the counts.
        r = site.api("PATCH", f"/dw/v1/stages/{a['id']}", {"action": "revoke"})
        assert r["state"] == "revoked" and r["finished"] > 0
        status, out = site.request("PATCH", f"/dw/v1/stages/{a['id']}", {"action": "revoke"})
        assert status == 409 and "deferred" in out["error"], out
        status, out = site.request("PATCH", f"/dw/v1/stages/{a['id']}", {"action": "terminate"})
        assert status == 409 and "ended" in out["error"], out
        assert counts(site, inst, "/out", "tree")["deferred"] == 1  # the directory stage
        # Path actions: revoke by tree, then nothing left to act on.
        res = site.api("POST", f"/dw/v1/instances/{inst}/stage_actions",
                       {"action": "revoke", "path": "/", "scope": "tree"})
        assert res == {"stages": [d["id"]]}
        status, out = site.request("POST", f"/dw/v1/instances/{inst}/stage_actions",
                                   {"action": "revoke", "path": "/", "scope": "tree"})
        assert status == 404, out
        assert counts(site, inst, "/", "tree")["started"] is False
        # terminate of a deferred stage ends it at once.
        status, t = stage(site, inst, "out", "file", "/out/t", dst + "-t", when="job_end")
        t = site.api("PATCH", f"/dw/v1/stages/{t['id']}", {"action": "terminate"})
        assert t["state"] == "terminated"
        # activate: queued at once; then it runs (here the file does not exist in the
        # instance, or the servers have no stage engine yet: either way it fails, with
        # a reason naming the file or the server).
        status, x = stage(site, inst, "out", "file", "/missing", dst + "-m", when="job_end")
        res = site.api("POST", f"/dw/v1/instances/{inst}/stage_actions",
                       {"action": "activate", "path": "/missing", "scope": "file"})
        assert res == {"stages": [x["id"]]}
        x = site.api("GET", f"/dw/v1/stages/{x['id']}?wait=30")
        assert x["state"] == "failed", x
        assert x["error"]["errno"] > 0 and x["error"]["message"], x
        assert x["server"] in ("server0", "server1") and x["finished"] >= x["created"]
        conforms(x, schema_ref("Stage"))
        f = site.api("GET", f"/dw/v1/instances/{inst}/stage_failures")
        conforms(f, schema_ref("StageFailures"))
        # The answers' shapes.
        conforms(site.api("GET", "/dw/v1/stages"), {"type": "object", "properties": {
            "stages": {"type": "array", "items": schema_ref("Stage")}}, "required": ["stages"]})
        conforms(counts(site, inst, "/"), schema_ref("StageCounts"))
    finally:
        destroy(site, s["id"])


def test_long_polls_answer_at_the_end_or_when_time_is_up(site, pfs):
    s, i = owned_instance(site, 0)
    inst = i["id"]
    try:
        status, a = stage(site, inst, "out", "file", "/w", os.path.join(pfs, "w"), when="job_end")
        t0 = time.monotonic()
        o = site.api("GET", f"/dw/v1/stages/{a['id']}?wait=2")
        assert o["state"] == "deferred" and time.monotonic() - t0 >= 1.8
        # pending is 0 (the stage is deferred): at once.
        t0 = time.monotonic()
        c = site.api("GET", f"/dw/v1/instances/{inst}/stage_counts?path=/w&scope=file&wait=20")
        assert c["deferred"] == 1 and time.monotonic() - t0 < 5
        # A revoke during the wait ends it early.
        import threading
        threading.Timer(1.0, lambda: site.api("PATCH", f"/dw/v1/stages/{a['id']}",
                                              {"action": "revoke"})).start()
        t0 = time.monotonic()
        o = site.api("GET", f"/dw/v1/stages/{a['id']}?wait=20")
        assert o["state"] == "revoked" and time.monotonic() - t0 < 10
    finally:
        destroy(site, s["id"])


def test_concurrency_is_clamped_to_the_site_range(site, user):
    s, i = owned_instance(site, user.uid)
    try:
        path = f"/dw/v1/instances/{i['id']}/stage_concurrency"
        assert site.api("PUT", path, {"value": 0}, as_user=user.name) == {"stage_concurrency": 1}
        assert site.api("PUT", path, {"value": 1000}) == {"stage_concurrency": 64}
        assert site.api("PUT", path, {"value": 3}) == {"stage_concurrency": 3}
        assert site.request("PUT", path, {"value": 3, "x": 1})[0] == 400
        assert site.request("PUT", "/dw/v1/instances/999999/stage_concurrency", {"value": 3})[0] == 404
    finally:
        destroy(site, s["id"])


def test_deferred_stage_survives_a_manager_restart(site, pfs):
    s, i = owned_instance(site, 0)
    try:
        status, a = stage(site, i["id"], "out", "directory", "/", pfs, when="job_end")
        assert status == 201
        site.kill("manager")
        site.start("manager")
        o = site.api("GET", f"/dw/v1/stages/{a['id']}")
        assert o == a
    finally:
        destroy(site, s["id"])


def server_of(site, inst):
    frags = [f for f in site.api("GET", "/dw/v1/fragments")["fragments"] if f["links"]["instance"] == inst]
    assert len(frags) == 1
    return frags[0]["node"]


def test_teardown_activates_deferred_stage_outs_and_holds_the_fragments(site, pfs):
    """Destroy: the deferred stage-out is activated; while it cannot run (its only
    server is down) the instance's fragment is not destroyed; new stages are refused;
    stage-ins are terminated. Once the server is back the stage runs and ends (here
    failed: the file is not in the instance, or the servers have no engine yet), and
    the teardown completes."""
    s, i = owned_instance(site, 0)
    inst = i["id"]
    node = server_of(site, inst)
    status, out = stage(site, inst, "out", "file", "/result", os.path.join(pfs, "result"), when="job_end")
    assert status == 201
    site.kill(node)
    try:
        site.wait(lambda: not site.api("GET", f"/dw/v1/nodes/{node}")["online"], f"{node} offline")
        status, sin = stage(site, inst, "in", "file", os.path.join(pfs, "x"), "/x")
        assert status == 201 and sin["state"] == "queued", sin
        site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
        site.wait(lambda: site.api("GET", f"/dw/v1/stages/{out['id']}")["state"] == "queued",
                  "the deferred stage-out activated")
        assert site.api("GET", f"/dw/v1/stages/{sin['id']}")["state"] == "terminated"
        time.sleep(2)
        inst_now = site.api("GET", f"/dw/v1/instances/{inst}")
        assert inst_now["state"]["goal"] == "destroy"
        frag = [f for f in site.api("GET", "/dw/v1/fragments")["fragments"] if f["links"]["instance"] == inst]
        assert frag and frag[0]["state"]["goal"] == "create", frag
        status, o = stage(site, inst, "out", "file", "/late", os.path.join(pfs, "late"))
        assert status == 409 and "being destroyed" in o["error"], o
    finally:
        site.start(node)
    o = site.api("GET", f"/dw/v1/stages/{out['id']}?wait=40")
    assert o["state"] in ("failed", "complete"), o
    site.wait_gone("sessions", s["id"], timeout=40)
    # The stage's record outlives the instance.
    assert site.api("GET", f"/dw/v1/stages/{out['id']}")["state"] == o["state"]


def test_teardown_with_hurry_drops_pending_stage_outs_and_says_so(site, pfs):
    s, i = owned_instance(site, 0)
    inst = i["id"]
    node = server_of(site, inst)
    ids = []
    for n in range(2):
        status, o = stage(site, inst, "out", "file", f"/r{n}", os.path.join(pfs, f"r{n}"), when="job_end")
        assert status == 201
        ids.append(o["id"])
    site.kill(node)
    try:
        site.wait(lambda: not site.api("GET", f"/dw/v1/nodes/{node}")["online"], f"{node} offline")
        # Activated now: stays queued (no server to run it).
        site.api("PATCH", f"/dw/v1/stages/{ids[0]}", {"action": "activate"})
        status, out = site.request("DELETE", f"/dw/v1/sessions/{s['id']}?hurry=true")
        assert status == 202, out
        assert out["dropped_stages"] == ids
        conforms(out, schema_ref("SessionDestroyed"))
        for x in ids:
            o = site.api("GET", f"/dw/v1/stages/{x}")
            assert o["state"] == "dropped" and o["finished"] > 0
        log = site.log("manager")
        for x in ids:
            assert f"stage-out {x} dropped" in log and "WARN" in log, log[-2000:]
        # Repeating the hurry (Slurm retries teardown) drops nothing more.
        status, out = site.request("DELETE", f"/dw/v1/sessions/{s['id']}?hurry=true")
        assert status == 202 and out["dropped_stages"] == [], out
        # Without hurry the answer is as before.
        status, out = site.request("DELETE", f"/dw/v1/sessions/{s['id']}")
        assert status == 202 and "dropped_stages" not in out
    finally:
        site.start(node)
    site.wait_gone("sessions", s["id"], timeout=40)


def test_instance_delete_with_hurry(site, pfs):
    s, i = owned_instance(site, 0)
    inst = i["id"]
    status, o = stage(site, inst, "out", "file", "/q", os.path.join(pfs, "q"), when="job_end")
    status, out = site.request("DELETE", f"/dw/v1/instances/{inst}?hurry=true")
    assert status == 202 and out["dropped_stages"] == [o["id"]], out
    conforms(out, schema_ref("InstanceDestroyed"))
    site.wait_gone("instances", inst, timeout=40)
    destroy(site, s["id"])


# ------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def engine(site, pfs):
    assert engine_available(site, pfs), "the servers answer ENOSYS to stage requests"


def sha(path):
    import hashlib
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def user_dir(pfs, user, name):
    d = os.path.join(pfs, name)
    os.makedirs(d, exist_ok=True)
    os.chown(d, user.uid, user.gid)
    return d


def user_file(path, user, data, mode=0o640):
    with open(path, "wb") as f:
        f.write(data)
    os.chown(path, user.uid, user.gid)
    os.chmod(path, mode)


def run_stage(site, inst, direction, kind, source="", destination="", as_user=None, **extra):
    status, o = stage(site, inst, direction, kind, source, destination, as_user=as_user, **extra)
    assert status == 201, o
    return site.api("GET", f"/dw/v1/stages/{o['id']}?wait=60", as_user=as_user)


def test_file_staged_in_and_out_keeps_its_bytes_and_mode(site, pfs, engine, user):
    s, i = owned_instance(site, user.uid)
    inst = i["id"]
    d = user_dir(pfs, user, "roundtrip")
    data = os.urandom((5 << 20) + 12345)
    user_file(os.path.join(d, "input"), user, data, 0o751)
    try:
        o = run_stage(site, inst, "in", "file", os.path.join(d, "input"), "/data", as_user=user.name)
        assert o["state"] == "complete", o
        assert (o["files_total"], o["files_done"], o["files_failed"]) == (1, 1, 0)
        assert o["bytes_done"] == len(data) and o["enumerated"] is True and o["error"] is None
        assert counts(site, inst, "/data", as_user=user.name) == {
            "complete": 1, "pending": 0, "deferred": 0, "failed": 0, "started": True}
        conforms(o, schema_ref("Stage"))
        o = run_stage(site, inst, "out", "file", "/data", os.path.join(d, "output"), as_user=user.name)
        assert o["state"] == "complete", o
        out = os.path.join(d, "output")
        assert sha(out) == sha(os.path.join(d, "input"))
        st = os.stat(out)
        assert (st.st_uid, st.st_mode & 0o7777) == (user.uid, 0o751)
        assert site.api("GET", f"/dw/v1/instances/{inst}/stage_failures")["failures"] == []
    finally:
        destroy(site, s["id"])


def test_directory_and_list_stages(site, pfs, engine, user):
    s, i = owned_instance(site, user.uid)
    inst = i["id"]
    d = user_dir(pfs, user, "tree")
    src = os.path.join(d, "src")
    os.makedirs(os.path.join(src, "sub", "deeper"))
    files = {"a": os.urandom(1000), "sub/b": os.urandom(70000), "sub/deeper/c": b"",
             "sub/deeper/d": os.urandom(3 << 20)}
    for rel, data in files.items():
        user_file(os.path.join(src, rel), user, data)
    for dirpath, _, _ in os.walk(src):
        os.chown(dirpath, user.uid, user.gid)
    back = user_dir(pfs, user, "tree/back")
    try:
        # The instance's destination directory must exist: stage a directory into the root.
        o = run_stage(site, inst, "in", "directory", src, "/", as_user=user.name)
        assert o["state"] == "complete", o
        assert o["files_total"] == len(files) and o["bytes_done"] == sum(map(len, files.values()))
        c = counts(site, inst, "/sub", "tree", as_user=user.name)
        assert (c["complete"], c["pending"], c["failed"]) == (3, 0, 0), c
        o = run_stage(site, inst, "out", "directory", "/", back, as_user=user.name)
        assert o["state"] == "complete", o
        for rel in files:
            assert sha(os.path.join(back, rel)) == sha(os.path.join(src, rel)), rel
        # A list: pairs of files.
        lst = user_dir(pfs, user, "tree/list")
        pairs = [{"source": "/a", "destination": os.path.join(lst, "a1")},
                 {"source": "/sub/deeper/d", "destination": os.path.join(lst, "d1")}]
        o = run_stage(site, inst, "out", "list", pairs=pairs, as_user=user.name)
        assert o["state"] == "complete" and o["files_total"] == 2, o
        assert sha(os.path.join(lst, "d1")) == sha(os.path.join(src, "sub/deeper/d"))
    finally:
        destroy(site, s["id"])


def test_a_file_the_owner_may_not_read_fails_with_eacces(site, pfs, engine, user):
    s, i = owned_instance(site, user.uid)
    inst = i["id"]
    d = user_dir(pfs, user, "secret")
    p = os.path.join(d, "root-only")
    with open(p, "wb") as f:
        f.write(b"x" * 100)
    os.chmod(p, 0o600)  # root's
    try:
        o = run_stage(site, inst, "in", "file", p, "/stolen", as_user=user.name)
        assert o["state"] == "failed", o
        assert o["error"]["errno"] == 13, o
        assert o["error"]["message"], o
        f = site.api("GET", f"/dw/v1/instances/{inst}/stage_failures", as_user=user.name)
        assert [(x["path"], x["errno"], x["stage"]) for x in f["failures"]] == [("/stolen", 13, o["id"])], f
        assert f["more"] is False
        c = counts(site, inst, "/stolen", as_user=user.name)
        assert (c["failed"], c["started"]) == (1, True)
        # A terminate of the path clears the failure.
        res = site.api("POST", f"/dw/v1/instances/{inst}/stage_actions",
                       {"action": "terminate", "path": "/stolen", "scope": "file"}, as_user=user.name)
        assert res == {"stages": [o["id"]]}
        # No longer failed; the path's latest stage is the terminated one (issue 15:
        # dw_query answers about it instead of -EINVAL).
        c = counts(site, inst, "/stolen", as_user=user.name)
        assert (c["failed"], c["complete"], c["pending"], c["started"]) == (0, 0, 0, True), c
    finally:
        destroy(site, s["id"])


def test_teardown_runs_the_deferred_stage_out_before_destroying(site, pfs, engine, user):
    s, i = owned_instance(site, user.uid)
    inst = i["id"]
    d = user_dir(pfs, user, "jobend")
    data = os.urandom(2 << 20)
    user_file(os.path.join(d, "in"), user, data)
    o = run_stage(site, inst, "in", "file", os.path.join(d, "in"), "/result", as_user=user.name)
    assert o["state"] == "complete", o
    status, out = stage(site, inst, "out", "file", "/result", os.path.join(d, "out"), as_user=user.name,
                        when="job_end")
    assert status == 201 and out["state"] == "deferred"
    time.sleep(1.5)
    assert not os.path.exists(os.path.join(d, "out"))
    site.api("DELETE", f"/dw/v1/sessions/{s['id']}", as_user=user.name)
    o = site.api("GET", f"/dw/v1/stages/{out['id']}?wait=60")
    assert o["state"] == "complete", o
    site.wait_gone("sessions", s["id"], timeout=40)
    assert sha(os.path.join(d, "out")) == sha(os.path.join(d, "in"))


def big_file(path, user, size):
    """`size` bytes of incompressible data (one random MiB repeated), owned by `user`."""
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(size >> 20):
            f.write(block)
    os.chown(path, user.uid, user.gid)


def wait_running(site, stage_id, timeout=60):
    def running():
        o = site.api("GET", f"/dw/v1/stages/{stage_id}")
        assert o["state"] in ("queued", "running"), f"the stage ended before it could be interrupted: {o}"
        return o["state"] == "running" and o
    return site.wait(running, f"stage {stage_id} running", timeout=timeout, interval=0.02)


@pytest.mark.timeout(300)
def test_a_coordinator_cut_off_mid_stage_is_told_to_stop_when_it_answers_again(site, pfs, engine, user):
    """A coordinator that stops answering (SIGSTOP: alive, as behind a partition) for
    longer than node_timeout loses its stage: the manager records it failed, naming the
    server. When the server answers again it must not go on copying a stage the manager
    gave up on (a retry would race it for the destination): the manager tells it to
    stop, and the stage ends there terminated."""
    s, i = owned_instance(site, user.uid, capacity=2 * GiB)
    inst = i["id"]
    d = user_dir(pfs, user, "cut-off")
    src = os.path.join(d, "big")
    big_file(src, user, GiB)
    status, o = stage(site, inst, "in", "file", src, "/big", as_user=user.name)
    assert status == 201, o
    running = wait_running(site, o["id"])
    node = running["server"]
    pid = next(p["pid"] for p in site.state()["servers"] if p["name"] == node)
    os.kill(pid, signal.SIGSTOP)
    try:
        o = site.api("GET", f"/dw/v1/stages/{o['id']}?wait=60", as_user=user.name)
        assert o["state"] == "failed", o
        assert node in o["error"]["message"], o
    finally:
        os.kill(pid, signal.SIGCONT)
    ended = re.compile(rf"stage ended stage={o['id']} state=(\d)")
    m = site.wait(lambda: ended.search(site.log(node)), f"stage {o['id']} ended on {node}", timeout=60)
    assert m.group(1) == "4", f"the cut-off server ended the stage with state {m.group(1)}, not terminated"
    site.api("DELETE", f"/dw/v1/sessions/{s['id']}", as_user=user.name)
    site.wait_gone("sessions", s["id"], timeout=40)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("victim", ["coordinator", "peer"])
def test_a_server_killed_mid_stage_fails_the_stage_loudly_and_a_retry_succeeds(site, pfs, engine, user, victim):
    """Two servers hold the instance's stripes. Killing the coordinating server (the
    manager loses its heartbeats) or the other one (the coordinator's copy requests to
    it fail) while a 1 GiB file is being staged in ends the stage `failed`, with an
    error that says what broke; nothing reports complete. With the server back, the
    same stage runs to completion and the bytes match."""
    s, i = owned_instance(site, user.uid, capacity=2 * GiB)
    inst = i["id"]
    frags = [f["node"] for f in site.api("GET", "/dw/v1/fragments")["fragments"]
             if f["links"]["instance"] == inst]
    assert len(frags) == 2, frags
    d = user_dir(pfs, user, f"killed-{victim}")
    src = os.path.join(d, "big")
    big_file(src, user, GiB)
    try:
        status, o = stage(site, inst, "in", "file", src, "/big", as_user=user.name)
        assert status == 201, o
        running = wait_running(site, o["id"])
        coordinator = running["server"]
        assert coordinator in frags, running
        node = coordinator if victim == "coordinator" else next(n for n in frags if n != coordinator)
        site.kill(node)
        try:
            # A dead peer is given the endpoint's reconnect window (30 s) to come back.
            o = site.api("GET", f"/dw/v1/stages/{o['id']}?wait=60", as_user=user.name)
            assert o["state"] == "failed", o
            assert o["error"] and o["error"]["message"], o
            if victim == "coordinator":
                assert node in o["error"]["message"], o
            assert o["files_done"] == 0, o
        finally:
            site.start(node)
        site.wait(lambda: site.api("GET", f"/dw/v1/nodes/{node}")["online"], f"{node} back online", timeout=30)
        o = run_stage(site, inst, "in", "file", src, "/big", as_user=user.name)
        assert o["state"] == "complete", o
        assert (o["files_done"], o["bytes_done"]) == (1, GiB), o
        back = os.path.join(d, "back")
        o = run_stage(site, inst, "out", "file", "/big", back, as_user=user.name)
        assert o["state"] == "complete", o
        assert sha(back) == sha(src)
    finally:
        destroy(site, s["id"])
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.timeout(600)
def test_teardown_waits_for_a_running_stage_out_and_the_data_arrives(site, pfs, engine, user):
    """A job's teardown comes while its stage-out is still copying: the destroy is
    accepted, the fragments stay until the copy is done, and the PFS file is whole."""
    s, i = owned_instance(site, user.uid, capacity=2 * GiB)
    inst = i["id"]
    d = user_dir(pfs, user, "teardown-running")
    src = os.path.join(d, "in")
    big_file(src, user, GiB)
    try:
        o = run_stage(site, inst, "in", "file", src, "/result", as_user=user.name)
        assert o["state"] == "complete", o
        status, out = stage(site, inst, "out", "file", "/result", os.path.join(d, "out"), as_user=user.name)
        assert status == 201, out
        wait_running(site, out["id"])
        site.api("DELETE", f"/dw/v1/sessions/{s['id']}", as_user=user.name)
        o = site.api("GET", f"/dw/v1/stages/{out['id']}")
        if o["state"] == "running":
            frags = [f for f in site.api("GET", "/dw/v1/fragments")["fragments"]
                     if f["links"]["instance"] == inst]
            assert frags and all(f["state"]["goal"] == "create" for f in frags), frags
        o = site.api("GET", f"/dw/v1/stages/{out['id']}?wait=60")
        assert o["state"] == "complete", o
        site.wait_gone("sessions", s["id"], timeout=60)
        assert sha(os.path.join(d, "out")) == sha(src)
    finally:
        site.request("DELETE", f"/dw/v1/sessions/{s['id']}")
        site.wait_gone("sessions", s["id"], timeout=60)
        shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------ the command line
@pytest.fixture(scope="module")
def dwcli():
    import spwhelpers as H
    d = os.environ.get("SPILLWAY_DWTOOLS_DIR") or os.path.join(H.REPO, "target", "release")
    paths = {n: os.path.join(d, n) for n in ("dwcli", "dwstat")}
    for p in paths.values():
        if not os.access(p, os.X_OK):
            pytest.skip(f"{p} not built (cargo build --release -p spillway-dwtools)")
    return paths


def tool(site, paths, prog, *args, cwd=None):
    import subprocess
    env = {**os.environ, "SPILLWAY_CONFIG": site.config}
    return subprocess.run([paths[prog], *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def test_dwcli_stage_commands_and_exit_statuses(site, pfs, dwcli):
    s, i = owned_instance(site, 0)
    inst = str(i["id"])
    try:
        # Usage errors exit 3 (every `dwcli stage` error does).
        r = tool(site, dwcli, "dwcli", "stage", "in", "--instance", inst, "/a", "/b")
        assert r.returncode == 3, r
        r = tool(site, dwcli, "dwcli", "stage", "in", "--instance", inst, "--file", "/etc/passwd", "/p")
        assert r.returncode == 3 and "PFS roots" in r.stderr, r
        # Deferred, status, revoke: a revoked stage waits out as 2.
        r = tool(site, dwcli, "dwcli", "stage", "out", "--instance", inst, "--file", "/r", pfs + "/r", "--defer")
        assert r.returncode == 0 and r.stdout.startswith("created stage "), r
        sid = r.stdout.split()[2]
        assert "state=deferred" in r.stdout
        r = tool(site, dwcli, "dwcli", "stage", "status", sid)
        assert r.returncode == 0 and r.stdout.splitlines()[0].split()[:6] == \
            ["stage", "inst", "owner", "dir", "type", "state"], r
        assert r.stdout.splitlines()[1].split()[5] == "deferred"
        r = tool(site, dwcli, "dwstat", "stages")
        assert r.returncode == 0 and any(l.split()[0] == sid for l in r.stdout.splitlines()[1:]), r
        r = tool(site, dwcli, "dwcli", "stage", "wait", sid, "--timeout", "1")
        assert r.returncode == 3 and "has not ended" in r.stderr, r
        r = tool(site, dwcli, "dwcli", "stage", "revoke", sid)
        assert r.returncode == 0 and r.stdout == f"revoke stage {sid} state=revoked\n", r
        r = tool(site, dwcli, "dwcli", "stage", "wait", sid)
        assert r.returncode == 2 and "revoked" in r.stdout, r
        r = tool(site, dwcli, "dwcli", "stage", "revoke", sid)
        assert r.returncode == 3 and "deferred" in r.stderr, r
        # A failure: each failed file printed with its errno name; exit 1.
        r = tool(site, dwcli, "dwcli", "stage", "out", "--instance", inst, "--file", "/nothing-here",
                 pfs + "/n", "--wait")
        assert r.returncode == 1, r
        assert "/nothing-here: E" in r.stdout, r
        # A list (relative PFS paths are taken from the current directory) with --wait:
        # plain progress lines off a terminal, exit 0.
        with open(os.path.join(pfs, "l1"), "w") as f:
            f.write("one")
        with open(os.path.join(pfs, "l2"), "w") as f:
            f.write("two")
        lst = os.path.join(pfs, "pairs.txt")
        with open(lst, "w") as f:
            f.write("# a list\nl1 /l1\n\n./l2   /l2  # second\n")
        r = tool(site, dwcli, "dwcli", "stage", "in", "--instance", inst, "--list", lst, "--wait", cwd=pfs)
        assert r.returncode == 0, r
        assert r.stdout.splitlines()[-1].endswith("complete: files 2/2 bytes 6B/6B"), r
        r = tool(site, dwcli, "dwcli", "--json", "stage", "status", "--instance", inst)
        assert r.returncode == 0 and len(json.loads(r.stdout)["stages"]) == 3, r
    finally:
        destroy(site, s["id"])
