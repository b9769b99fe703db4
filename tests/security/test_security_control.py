"""Issue 14, item 6 (smaller leaks), against a real local site (manager over HTTPS with
MUNGE, a storage server, an agent mounting with the FUSE client, a PFS root):

* control requests through a mount (libdatawarp's ioctl channel) follow the API's
  ownership rules: spwtest, through the mount of spwtest2's persistent instance (root
  permissions 0777), cannot set its stage concurrency, post stages on it, read its
  counts, wait, terminate or walk its failures (the API's errno: EACCES for a visible
  instance) and nothing changes; spwtest2 and root through the same mount still can;
* the act-as header (`X-Spillway-As-Uid`) is for admins: from a user it is refused with
  403 and changes nothing; an admin acting as a user gets exactly that user's answers;
* an object a user may not see answers 404 with the text of a missing id, for every
  resource kind and verb; a 403 on a visible object names no uid;
* a 1 MB bad token, path, id, query value or header comes back as a short 4xx;
* (issue 14, item "starving the service") a user's sessions and unended stages are
  bounded by max_sessions_per_user / max_stages_per_user (409 beyond), admins are not.

Raw ioctls as in test_libdatawarp.py / test_private.py (`struct spillway_ioc`)."""

import errno
import json
import os
import re
import sqlite3
import types

import pytest

from ctlhelpers import control_call
from sitehelpers import running_site

GiB = 1 << 30
MiB = 1 << 20
ACT_AS = "X-Spillway-As-Uid"


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def sec(spillway_bin, munged, _local_base, users):
    """A site with a PFS root; spwtest2's persistent instance mounted with root
    permissions 0777 (so spwtest can reach the mount), and spwtest2's private (job)
    session with an instance, a configuration, an activation and a stage (not mounted)."""
    a, b = users
    with running_site(spillway_bin, _local_base, munged, prefix="secctl-", pfs_users=(a, b),
                      servers=1, log_tail=5000) as site:
        pfs = site.pfs
        s = site.api("POST", "/dw/v1/sessions", {"token": "bpersist", "owner": b.uid,
                                                 "client_nodes": [site.node]})
        i = site.api("POST", "/dw/v1/instances", {"session": s["id"], "capacity": GiB})
        assert i["public"] is True
        c = site.api("POST", "/dw/v1/configurations",
                     {"instance": i["id"], "type": "scratch", "access_mode": "stripe",
                      "root_permissions": 0o777})
        act = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]})
        site.wait_state("activations", act["id"], timeout=60)
        # spwtest2's private objects: a job session (numeric token: private instance).
        ps = site.api("POST", "/dw/v1/sessions", {"token": "4242", "owner": b.uid, "client_nodes": []})
        pi = site.api("POST", "/dw/v1/instances", {"session": ps["id"], "capacity": GiB})
        assert pi["public"] is False
        pc = site.api("POST", "/dw/v1/configurations",
                      {"instance": pi["id"], "type": "scratch", "access_mode": "stripe"})
        pa = site.api("POST", "/dw/v1/activations", {"session": ps["id"], "configuration": pc["id"]})
        pst = site.api("POST", "/dw/v1/stages",
                       {"instance": pi["id"], "direction": "out", "type": "file", "source": "/r",
                        "destination": os.path.join(pfs, b.name, "r"), "when": "job_end",
                        "owner": b.uid})
        frag = [f for f in site.api("GET", "/dw/v1/fragments")["fragments"]
                if f["links"]["instance"] == pi["id"]][0]
        yield types.SimpleNamespace(
            site=site, a=a, b=b, pfs=pfs, mnt=act["mount"], session=s["id"], instance=i["id"],
            configuration=c["id"], activation=act["id"],
            private=dict(session=ps["id"], instance=pi["id"], configuration=pc["id"],
                         activation=pa["id"], stage=pst["id"], fragment=frag["id"]))


# --------------------------------------------------------------------------- helpers


def concurrency_of(sec):
    """The instance's recorded stage concurrency (None: the site default), read from the
    manager's database."""
    db = os.path.join(sec.site.dir, "manager", "manager.db")
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        row = con.execute("SELECT concurrency FROM stage_limits WHERE instance = ?",
                          (sec.instance,)).fetchone()
    finally:
        con.close()
    return row[0] if row else None


def stages_of(sec):
    return sorted((s["id"], s["state"], s["owner"])
                  for s in sec.site.api("GET", f"/dw/v1/stages?instance={sec.instance}")["stages"])


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def _all_requests(mnt, pfs_src):
    """Every control request through the mount, as whoever runs this: {name: (rc, fields)}."""
    out = {}
    out["concurrency"] = control_call(mnt, "concurrency", "1")
    out["stage"] = control_call(mnt, "stage", "in", "file", "immediate", pfs_src, "/planted")
    out["stage_out"] = control_call(mnt, "stage", "out", "file", "job_end", "/aout", pfs_src + ".out")
    out["counts"] = control_call(mnt, "counts", "tree", "/")
    out["wait"] = control_call(mnt, "wait", "tree", "/", "0")
    out["terminate"] = control_call(mnt, "action", "terminate", "tree", "/")
    out["revoke"] = control_call(mnt, "action", "revoke", "tree", "/")
    out["failures"] = control_call(mnt, "failures", "")
    return out


# --------------------------------------------------------------------------- the mount


def test_control_requests_through_a_mount_follow_the_apis_ownership(sec):
    site, a, b = sec.site, sec.a, sec.b
    # spwtest2 (the owner) sets a concurrency and leaves a failed stage and a deferred one.
    assert site.api("PUT", f"/dw/v1/instances/{sec.instance}/stage_concurrency", {"value": 3},
                    as_user=b.name)["stage_concurrency"] == 3
    bsrc = os.path.join(sec.pfs, b.name, "in.dat")
    b.run(_write, bsrc, os.urandom(4096))
    rc, f = b.run(control_call, sec.mnt, "stage", "in", "file", "immediate",
                 os.path.join(sec.pfs, b.name, "missing"), "/bfailed")
    assert rc == 0, f
    rc, f = b.run(control_call, sec.mnt, "stage", "out", "file", "job_end", "/bdeferred",
                 os.path.join(sec.pfs, b.name, "out.dat"))
    assert rc == 0, f
    site.wait(lambda: any(s[1] == "failed" for s in stages_of(sec)), "the failed stage")
    before = stages_of(sec)
    assert concurrency_of(sec) == 3

    # spwtest through the same mount: every request refused as the API refuses it
    # (spwtest2's persistent instance is visible to spwtest: 403, EACCES).
    asrc = os.path.join(sec.pfs, a.name, "a.dat")
    a.run(_write, asrc, b"a's data")
    res = a.run(_all_requests, sec.mnt, asrc)
    for name, (rc, fields) in res.items():
        assert rc == -errno.EACCES, (name, rc, fields)
        assert str(b.uid) not in " ".join(fields), (name, fields)
    # The REST API answers spwtest the same.
    status, _ = site.request("PUT", f"/dw/v1/instances/{sec.instance}/stage_concurrency",
                             {"value": 1}, as_user=a.name)
    assert status == 403
    # Nothing changed.
    assert concurrency_of(sec) == 3
    assert stages_of(sec) == before

    # The owner through the same mount still can.
    rc, f = b.run(control_call, sec.mnt, "concurrency", "2")
    assert (rc, f) == (0, ["2"]), f
    assert concurrency_of(sec) == 2
    rc, f = b.run(control_call, sec.mnt, "counts", "tree", "/")
    assert rc == 0 and int(f[1]) == 0 and int(f[2]) == 1 and int(f[3]) == 1, f
    rc, f = b.run(control_call, sec.mnt, "failures", "")
    assert rc == 0 and "/bfailed" in f, f
    rc, f = b.run(control_call, sec.mnt, "stage", "in", "file", "immediate", bsrc, "/bin.dat")
    assert rc == 0, f
    rc, f = b.run(control_call, sec.mnt, "wait", "file", "/bin.dat", "10000")
    assert rc in (0, -errno.EAGAIN), f
    rc, f = b.run(control_call, sec.mnt, "action", "revoke", "file", "/bdeferred")
    assert (rc, f) == (0, ["1"]), f
    # Root (an admin) through the mount still can, too.
    rc, f = control_call(sec.mnt, "concurrency", "4")
    assert (rc, f) == (0, ["4"]), f
    assert concurrency_of(sec) == 4
    rc, f = control_call(sec.mnt, "counts", "tree", "/")
    assert rc == 0, f
    rc, f = control_call(sec.mnt, "action", "terminate", "file", "/bfailed")
    assert rc == 0, f


# --------------------------------------------------------------------------- act-as


def test_act_as_is_for_admins(sec):
    site, a, b = sec.site, sec.a, sec.b
    put = f"/dw/v1/instances/{sec.instance}/stage_concurrency"
    before = (concurrency_of(sec), stages_of(sec))
    # A user naming another uid: 403, whatever the request, and nothing changes.
    for method, path, body in [
        ("PUT", put, {"value": 1}),
        ("GET", "/dw/v1/sessions", None),
        ("POST", "/dw/v1/stages", {"instance": sec.instance, "direction": "in", "type": "file",
                                   "source": os.path.join(sec.pfs, b.name, "x"),
                                   "destination": "/x"}),
        ("DELETE", f"/dw/v1/sessions/{sec.session}", None),
    ]:
        for target in (b.uid, 0):
            status, out = site.request(method, path, body, as_user=a.name,
                                       headers={ACT_AS: str(target)})
            assert status == 403, (method, path, target, status, out)
            assert "admin" in out["error"] and str(b.uid) not in out["error"], out
    assert (concurrency_of(sec), stages_of(sec)) == before
    assert site.api("GET", f"/dw/v1/sessions/{sec.session}")["state"]["goal"] == "create"
    # Naming oneself changes nothing.
    status, out = site.request("GET", "/dw/v1/sessions", as_user=a.name, headers={ACT_AS: str(a.uid)})
    assert status == 200, out
    # A malformed value: 400, the value not echoed whole.
    for bad in ("abc", "-1", "4294967296", "1" * 5000):
        status, out = site.request("GET", "/dw/v1/sessions", headers={ACT_AS: bad})
        assert status == 400 and len(json.dumps(out)) < 1024, (bad[:20], status, out)
    # An admin acting as spwtest gets spwtest's answers; as spwtest2, spwtest2's.
    status, out = site.request("PUT", put, {"value": 1}, headers={ACT_AS: str(a.uid)})
    assert status == 403, out
    status, _ = site.request("GET", f"/dw/v1/sessions/{sec.private['session']}",
                             headers={ACT_AS: str(a.uid)})
    assert status == 404
    mine = site.api("GET", "/dw/v1/sessions", as_user=a.name)["sessions"]
    status, out = site.request("GET", "/dw/v1/sessions", headers={ACT_AS: str(a.uid)})
    assert status == 200 and out["sessions"] == mine
    status, out = site.request("PUT", put, {"value": 5}, headers={ACT_AS: str(b.uid)})
    assert status == 200, out
    assert concurrency_of(sec) == out["stage_concurrency"]
    # Acting as a user is not an admin; acting as root is.
    status, out = site.request("POST", "/dw/v1/pools", {"id": "nope", "granularity": GiB},
                               headers={ACT_AS: str(a.uid)})
    assert status == 403, out
    status, out = site.request("GET", f"/dw/v1/sessions/{sec.private['session']}",
                               headers={ACT_AS: "0"})
    assert status == 200, out


# --------------------------------------------------------------------------- 404 rule


def _shape(status, out, ident):
    return status, re.sub(rf"\b{ident}\b", "N", out.get("error", ""))


def test_hidden_objects_answer_exactly_as_missing_ones(sec):
    site, a = sec.site, sec.a
    p = sec.private
    missing = 999_999
    kinds = {
        "sessions": p["session"], "instances": p["instance"], "configurations": p["configuration"],
        "activations": p["activation"], "fragments": p["fragment"], "stages": p["stage"],
    }
    mine = site.api("POST", "/dw/v1/sessions", {"token": "amine", "client_nodes": []}, as_user=a.name)
    try:
        calls = []
        for kind, ident in kinds.items():
            calls.append(("GET", f"/dw/v1/{kind}/{{}}", None, ident))
        calls += [
            ("PATCH", "/dw/v1/sessions/{}", {"client_nodes": []}, p["session"]),
            ("DELETE", "/dw/v1/sessions/{}", None, p["session"]),
            ("DELETE", "/dw/v1/sessions/{}?hurry=true", None, p["session"]),
            ("DELETE", "/dw/v1/instances/{}", None, p["instance"]),
            ("DELETE", "/dw/v1/instances/{}?hurry=true", None, p["instance"]),
            ("DELETE", "/dw/v1/configurations/{}", None, p["configuration"]),
            ("DELETE", "/dw/v1/activations/{}", None, p["activation"]),
            ("PATCH", "/dw/v1/stages/{}", {"action": "revoke"}, p["stage"]),
            ("GET", "/dw/v1/instances/{}/stage_counts?path=/r", None, p["instance"]),
            ("GET", "/dw/v1/instances/{}/stage_failures", None, p["instance"]),
            ("PUT", "/dw/v1/instances/{}/stage_concurrency", {"value": 1}, p["instance"]),
            ("POST", "/dw/v1/instances/{}/stage_actions",
             {"action": "revoke", "path": "/r", "scope": "file"}, p["instance"]),
        ]
        # Creates naming another user's hidden object in the body.
        body_calls = [
            ("/dw/v1/instances", lambda x: {"session": x, "capacity": GiB}, p["session"]),
            ("/dw/v1/configurations",
             lambda x: {"instance": x, "type": "scratch", "access_mode": "stripe"}, p["instance"]),
            ("/dw/v1/activations", lambda x: {"session": mine["id"], "configuration": x},
             p["configuration"]),
            ("/dw/v1/stages", lambda x: {"instance": x, "direction": "in", "type": "file",
                                         "source": os.path.join(sec.pfs, a.name, "f"),
                                         "destination": "/f"}, p["instance"]),
        ]
        for method, path, body, ident in calls:
            hidden = site.request(method, path.format(ident), body, as_user=a.name)
            gone = site.request(method, path.format(missing), body, as_user=a.name)
            assert hidden[0] == 404, (method, path, hidden)
            assert _shape(*hidden, ident) == _shape(*gone, missing), (method, path, hidden, gone)
            assert str(sec.b.uid) not in hidden[1]["error"], hidden
        for path, make, ident in body_calls:
            hidden = site.request("POST", path, make(ident), as_user=a.name)
            gone = site.request("POST", path, make(missing), as_user=a.name)
            assert hidden[0] == 404, (path, hidden)
            assert _shape(*hidden, ident) == _shape(*gone, missing), (path, hidden, gone)
        # Nothing of spwtest2's changed.
        assert site.api("GET", f"/dw/v1/sessions/{p['session']}")["state"]["goal"] == "create"
        assert site.api("GET", f"/dw/v1/stages/{p['stage']}")["state"] == "deferred"
        # Visible but not theirs (the persistent instance and its session): 403 without
        # naming a uid; 409 for a token in use without naming its owner.
        for method, path in [("DELETE", f"/dw/v1/sessions/{sec.session}"),
                             ("DELETE", f"/dw/v1/instances/{sec.instance}"),
                             ("DELETE", f"/dw/v1/configurations/{sec.configuration}"),
                             ("GET", f"/dw/v1/instances/{sec.instance}/stage_failures")]:
            status, out = site.request(method, path, as_user=a.name)
            assert status == 403 and not re.search(r"uid|\b%d\b" % sec.b.uid, out["error"]), out
        status, out = site.request("POST", "/dw/v1/sessions", {"token": "bpersist"}, as_user=a.name)
        assert status == 409 and str(sec.b.uid) not in out["error"], out
        # An activation is its owner's alone.
        status, out = site.request("GET", f"/dw/v1/activations/{sec.activation}", as_user=a.name)
        assert _shape(status, out, sec.activation) == (404, "no activation N")
    finally:
        site.api("DELETE", f"/dw/v1/sessions/{mine['id']}", as_user=a.name)


# --------------------------------------------------------------------------- bounds


def test_huge_inputs_come_back_short(sec):
    site, a = sec.site, sec.a
    big = "x" * MiB

    def short(status, out, what):
        text = json.dumps(out)
        assert 400 <= status < 500, (what, status, text[:300])
        assert len(text) < 1024, (what, len(text), text[:300])

    short(*site.request("POST", "/dw/v1/sessions", {"token": big}, as_user=a.name), "token")
    short(*site.request("POST", "/dw/v1/sessions", {"token": "ok1", "creator": big}, as_user=a.name),
          "creator")
    short(*site.request("POST", "/dw/v1/stages",
                        {"instance": sec.instance, "direction": "in", "type": "file",
                         "source": big, "destination": "/x"}, as_user=a.name), "PFS path")
    short(*site.request("POST", "/dw/v1/stages",
                        {"instance": sec.instance, "direction": "in", "type": "file",
                         "source": "/" + big, "destination": "/x"}, as_user=a.name), "long path")
    short(*site.request("POST", "/dw/v1/configurations",
                        {"instance": sec.instance, "type": big, "access_mode": "stripe"},
                        as_user=a.name), "enum value")
    short(*site.request("POST", "/dw/v1/sessions", {"token": "ok2", big: 1}, as_user=a.name),
          "unknown field")
    short(*site.request("POST", "/dw/v1/instances",
                        {"session": sec.session, "capacity": 1, "label": big}), "label")
    # Over the body limit (2 MiB): 413, short, every time. The manager reads the
    # refused body to its end before it answers (it used to close with the rest unread,
    # and the client saw its send cut instead of the answer).
    for _ in range(3):
        answer = site.request("POST", "/dw/v1/sessions",
                              raw=b'{"token": "' + b"y" * (3 * MiB) + b'"}', as_user=a.name)
        short(*answer, "3 MiB body")
        assert answer[0] == 413, answer
    # In the URL: a path segment and a query value (as large as the HTTP server takes a
    # head; beyond that it refuses the head itself).
    seg = "z" * (200 << 10)
    short(*site.request("GET", f"/dw/v1/sessions/{seg}", as_user=a.name), "id")
    short(*site.request("GET", f"/dw/v1/pools/{seg}", as_user=a.name), "pool id")
    short(*site.request("GET", f"/dw/v1/stages?state={seg}", as_user=a.name), "query value")
    short(*site.request("GET", f"/dw/v1/stages?{seg}=1", as_user=a.name), "query name")
    short(*site.request("GET", f"/dw/v1/{seg}", as_user=a.name), "resource")
    short(*site.request("GET", f"/dw/v1/instances/{sec.instance}/stage_counts?path={seg}",
                        as_user=sec.b.name), "counts path")
    short(*site.request("GET", "/dw/v1/sessions", headers={"Authorization": "MUNGE cred=" + seg}),
          "credential")
    try:
        r = site.request("GET", f"/dw/v1/sessions/{big}", as_user=a.name)
    except OSError:
        r = None  # the server refused the head (connection closed): nothing echoed
    if r is not None:
        short(*r, "1 MB URL")


# --------------------------------------------------------------------------- per-user limits

SESSIONS_PER_USER = 3
STAGES_PER_USER = 2


def test_sessions_and_stages_per_user_are_bounded(sec):
    """Issue 14's "no way to starve the service": the manager restarted with
    max_sessions_per_user = 3 and max_stages_per_user = 2. spwtest creates 3 sessions,
    the 4th is refused (409 naming the limit), and a burst of 8 parallel creates after
    they are gone lets exactly 3 through (the count is in the insert's transaction);
    spwtest2 (who holds 2 sessions Slurm-style, made by root) still creates one. Stages
    not yet ended count (deferred ones here), a list stage once; root (the SlurmUser's
    role) is not limited, even staging as spwtest. Runs last: it leaves the manager with
    the small limits until the module's site goes down."""
    import concurrent.futures

    site, a, b = sec.site, sec.a, sec.b
    with open(os.path.join(site.dir, "manager.conf"), "a") as f:
        f.write(f"max_sessions_per_user = {SESSIONS_PER_USER}\n"
                f"max_stages_per_user = {STAGES_PER_USER}\n")
    site.kill("manager", "TERM")
    site.start("manager")
    site.wait(lambda: site.request("GET", "/dw/v1/nodes")[0] == 200
              and all(n["online"] for n in site.api("GET", "/dw/v1/nodes")["nodes"]),
              "the manager answering with its server online", timeout=30)

    def mine(user):
        return [s for s in site.api("GET", "/dw/v1/sessions", as_user=user.name)["sessions"]
                if s["owner"] == user.uid]

    def create(user, token):
        return site.request("POST", "/dw/v1/sessions", {"token": token, "client_nodes": []},
                            as_user=user.name)

    def destroy_all(user):
        for s in mine(user):
            site.request("DELETE", f"/dw/v1/sessions/{s['id']}?hurry=true", as_user=user.name)
        site.wait(lambda: not mine(user), f"{user.name}'s sessions gone", timeout=30)

    destroy_all(a)  # an earlier test's session, if its teardown is still under way
    try:
        made = []
        for n in range(SESSIONS_PER_USER):
            status, out = create(a, f"lim{n}")
            assert status == 201, out
            made.append(out["id"])
        status, out = create(a, "lim-over")
        assert status == 409 and "max_sessions_per_user is 3" in out["error"], (status, out)
        assert len(mine(a)) == SESSIONS_PER_USER
        # Another user has their own count (spwtest2 holds 2 made for them by root,
        # which count as theirs).
        assert len(mine(b)) < SESSIONS_PER_USER, mine(b)
        status, out = create(b, "blim")
        assert status == 201, out
        site.api("DELETE", f"/dw/v1/sessions/{out['id']}", as_user=b.name)

        # Stages: 2 deferred stage-outs on spwtest's instance; the 3rd is refused.
        inst = site.api("POST", "/dw/v1/instances", {"session": made[0], "capacity": GiB},
                        as_user=a.name)
        pfs_a = os.path.join(sec.pfs, a.name)

        def stage_out(name, user, **extra):
            body = {"instance": inst["id"], "direction": "out", "type": "file",
                    "source": f"/{name}", "destination": os.path.join(pfs_a, name),
                    "when": "job_end", **extra}
            return site.request("POST", "/dw/v1/stages", body, as_user=user)

        status, out = site.request("POST", "/dw/v1/stages", {
            "instance": inst["id"], "direction": "out", "type": "list", "when": "job_end",
            "pairs": [{"source": f"/l{k}", "destination": os.path.join(pfs_a, f"l{k}")}
                      for k in range(50)]}, as_user=a.name)
        assert status == 201, out  # 50 files, one stage
        status, out = stage_out("s1", user=a.name)
        assert status == 201, out
        status, out = stage_out("s2", user=a.name)
        assert status == 409 and "max_stages_per_user is 2" in out["error"], (status, out)
        # Root is not limited, even staging as spwtest.
        status, out = stage_out("s2", user=None, owner=a.uid)
        assert status == 201 and out["owner"] == a.uid, out
        assert stage_out("s3", user=a.name)[0] == 409

        # Sessions being destroyed count until they are gone; then a burst of parallel
        # creates gets exactly the limit through.
        destroy_all(a)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda n: create(a, f"burst{n}"), range(8)))
        statuses = sorted(s for s, _ in results)
        assert statuses == [201] * SESSIONS_PER_USER + [409] * (8 - SESSIONS_PER_USER), results
        assert len(mine(a)) == SESSIONS_PER_USER
    finally:
        destroy_all(a)
