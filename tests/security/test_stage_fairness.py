"""Issue 30, item 3 (one user's list stages stalled every user's stages) and the last
point of item 5 (a list stage over 2 MiB got "Broken pipe" instead of the 413), against
a real local site (manager over HTTPS with MUNGE, a storage server, a PFS root) and real
unprivileged users: spwtest (A) and spwtest2 (B), each with an instance of their own.

* B posts large list stages (15,000 pairs each, as many as a 2 MiB body holds with
  these paths) on B's instance; A's one-file stage on A's instance, posted right after,
  completes while B's are still being started and run, and A's reads answer. Before:
  the manager minted each stage's ticket in its dispatch round, with a cover of the
  paths quadratic in their number (minutes for one such list), and the round waited for
  every start: A's stage stayed queued for minutes.
* B's unended stages name at most `max_stage_pairs_per_user` pairs together (default
  100,000): the seventh list of 15,000 is refused with 409 naming the limit (before,
  only stages were counted: 10,000 of them).
* `dwcli stage in --list` with a list over 2 MiB: every try gets the 413 and its
  message, never "Broken pipe" (the manager now reads the refused body to its end
  before it answers); so does a raw HTTP client.
"""

import json
import os
import shutil
import subprocess
import time

import pytest

import spwhelpers as H
from sitehelpers import running_site

GiB = 1 << 30
MiB = 1 << 20
PAIRS = 15_000


@pytest.fixture(scope="module")
def fair(spillway_bin, munged, _local_base, users):
    a, b = users
    with running_site(spillway_bin, _local_base, munged, prefix="fair-", pfs_users=(a, b),
                      servers=1, log_tail=5000) as site:
        insts = {}
        for u in (a, b):
            s = site.api("POST", "/dw/v1/sessions", {"token": f"fair-{u.name}", "owner": u.uid,
                                                     "client_nodes": []})
            i = site.api("POST", "/dw/v1/instances", {"session": s["id"], "capacity": GiB})
            site.wait_state("instances", i["id"], timeout=60)
            insts[u.name] = i["id"]
        yield site, a, b, insts


@pytest.fixture(scope="module")
def dwcli(fair):
    """dwcli copied next to the site (users may not enter the checkout)."""
    site = fair[0]
    src = os.path.join(H.REPO, "target", "release", "dwcli")
    if not os.access(src, os.X_OK):
        r = subprocess.run(["cargo", "build", "--release", "-p", "spillway-dwtools"],
                           cwd=H.REPO, capture_output=True, text=True, timeout=3600)
        assert r.returncode == 0, r.stderr[-4000:]
    dst = os.path.join(site.base, "bin-fair", "dwcli")
    os.makedirs(os.path.dirname(dst), mode=0o755, exist_ok=True)
    shutil.copy(src, dst)
    os.chmod(dst, 0o755)
    return dst


def big_list(site, user, inst, tag, n=PAIRS, **extra):
    """A list stage of `n` pairs (sources in the user's PFS directory) as `user`."""
    pfs = os.path.join(site.pfs, user.name, tag)
    direction = extra.pop("direction", "in")
    pairs = [(f"{pfs}/f{k:05d}", f"/{tag}/f{k:05d}") for k in range(n)]
    if direction == "out":
        pairs = [(d, s) for s, d in pairs]
    body = {"instance": inst, "direction": direction, "type": "list",
            "pairs": [{"source": s, "destination": d} for s, d in pairs], **extra}
    assert len(json.dumps(body)) < 2 * MiB  # the case is about the pairs, not the body limit
    return site.request("POST", "/dw/v1/stages", body, as_user=user.name)


def unended(site, inst, user):
    return [s for s in site.api("GET", f"/dw/v1/stages?instance={inst}", as_user=user.name)["stages"]
            if s["state"] in ("queued", "running", "deferred")]


def end_all(site, inst, user):
    for s in unended(site, inst, user):
        action = "revoke" if s["state"] == "deferred" else "terminate"
        site.request("PATCH", f"/dw/v1/stages/{s['id']}", {"action": action}, as_user=user.name)
    site.wait(lambda: not unended(site, inst, user), f"{user.name}'s stages ended", timeout=60)


def test_one_users_list_stages_do_not_hold_anothers(fair):
    site, a, b, insts = fair
    src = os.path.join(site.pfs, a.name, "one.dat")
    a.run(lambda p: open(p, "wb").write(os.urandom(4096)), src)
    try:
        posted = []
        t0 = time.monotonic()
        for k in range(6):
            status, out = big_list(site, b, insts[b.name], f"b{k}")
            assert status == 201, out
            posted.append(out["id"])
        print(f"B's 6 lists of {PAIRS} pairs posted in {time.monotonic() - t0:.1f} s")
        t0 = time.monotonic()
        status, mine = site.request("POST", "/dw/v1/stages",
                                    {"instance": insts[a.name], "direction": "in", "type": "file",
                                     "source": src, "destination": "/one.dat"}, as_user=a.name)
        assert status == 201, mine
        # A's reads answer meanwhile (dwstat's list, and counts of A's instance).
        status, _ = site.request("GET", "/dw/v1/stages", as_user=a.name)
        assert status == 200
        done = site.api("GET", f"/dw/v1/stages/{mine['id']}?wait=30", as_user=a.name)
        took = time.monotonic() - t0
        assert done["state"] == "complete", (done, took)
        print(f"A's one-file stage complete {took:.1f} s after B's 6 lists of {PAIRS} pairs")
        # B's own lists start too (their tickets are minted in a fraction of a second).
        site.wait(lambda: all(site.api("GET", f"/dw/v1/stages/{i}")["state"] != "queued"
                              for i in posted[:4]),
                  "B's first lists started", timeout=30)
    finally:
        end_all(site, insts[b.name], b)


def test_a_users_queued_pairs_are_bounded(fair):
    site, a, b, insts = fair
    try:
        # Deferred stage-outs: they stay unended, whatever the servers do.
        for k in range(6):
            status, out = big_list(site, b, insts[b.name], f"d{k}", direction="out",
                                   when="job_end")
            assert status == 201, out
        status, out = big_list(site, b, insts[b.name], "d6", direction="out", when="job_end")
        assert status == 409, out
        assert "max_stage_pairs_per_user is 100000" in out["error"], out
        assert "90000 files" in out["error"], out
        # Another user's count is their own.
        status, out = big_list(site, a, insts[a.name], "a0", direction="out", when="job_end")
        assert status == 201, out
    finally:
        end_all(site, insts[b.name], b)
        end_all(site, insts[a.name], a)


def test_a_list_over_the_body_limit_gets_the_413_not_a_broken_pipe(fair, dwcli):
    site, a, b, insts = fair
    lst = os.path.join(site.pfs, b.name, "huge.list")
    pfs = os.path.join(site.pfs, b.name, "huge")
    text = "".join(f"{pfs}/file-{k:06d} /huge/file-{k:06d}\n" for k in range(40_000))
    b.run(lambda p, t: open(p, "w").write(t), lst, text)
    assert len(text) > 3 * MiB
    for _ in range(5):
        r = subprocess.run(["runuser", "-u", b.name, "--", dwcli, "--config", site.config,
                            "stage", "in", "--instance", str(insts[b.name]), "--list", lst],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0, r
        assert "larger than 2097152 bytes" in r.stderr, (r.returncode, r.stderr)
        assert "Broken pipe" not in r.stderr and "reset" not in r.stderr.lower(), r.stderr
    # A raw client: the answer, every time, and the connection may be kept.
    for _ in range(5):
        status, out = site.request("POST", "/dw/v1/sessions",
                                   raw=b'{"token": "' + b"y" * (3 * MiB) + b'"}', as_user=a.name)
        assert status == 413 and "larger than 2097152 bytes" in out["error"], (status, out)
    assert not unended(site, insts[b.name], b)
