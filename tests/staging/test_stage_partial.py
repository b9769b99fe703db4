"""Stages that stop part-way (issue 15, item 3), on a real local site with a PFS root:
a stage-out writes each file under a hidden temporary beside its destination and
renames it into place only once complete and durable, so a destination is its old
file, absent, or the complete copy; a stage terminated (manager API, libdatawarp) or
dropped by a hurried teardown leaves no temporary; the outcome is visible: the stage's
state and error (`dwstat stages`), `dw_wlm_cli --function teardown` failing once (so
Slurm marks the job) and `token not found` after, and libdatawarp's dw_wait/dw_query
answering about the terminated stage (rc 0, nothing complete) instead of -EINVAL.

The servers copy in 1 MiB ranges, one in flight (server.tunables), so that a stage of a
few hundred MiB runs long enough to be stopped part-way."""

import hashlib
import os
import re
import signal
import subprocess
import threading
import tempfile
import time
import types

import pytest

import spwhelpers as H
from sitehelpers import running_site

MiB = 1 << 20
GiB = 1 << 30
BIG = 384 * MiB
TEMP = re.compile(r"^\..*\.spillway-\d+-\d+$")


def _mkdirs(paths):
    for p in paths:
        os.makedirs(p, exist_ok=True)


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def _write_big(path, size, seed):
    """`size` bytes of a pattern that differs per MiB (and per seed); its sha256."""
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for k in range(size // MiB):
            block = (seed.to_bytes(4, "little") + k.to_bytes(4, "little")) * (MiB // 8)
            f.write(block)
            h.update(block)
    return h.hexdigest()


def sha(path):
    return H.sha256_file(path)


def temporaries(d):
    return [n for n in os.listdir(d) if TEMP.match(n)]


@pytest.fixture(scope="module")
def site(spillway_bin, munged, _local_base, users):
    user, user2 = users
    with running_site(spillway_bin, _local_base, munged, prefix="partial-", pfs_users=(user, user2),
                      servers=2, logs=("manager", "agent", "server0", "server1"), log_tail=5000) as s:
        # Small ranges, one at a time: a stage of BIG bytes takes seconds, not a blink.
        s.add_server_tunables("stage_range = 1048576\nstage_ranges_in_flight = 1\n")
        sess, inst, conf = s.persistent("partial", 4 * GiB, owner=user.uid)
        a = s.api("POST", "/dw/v1/activations", {"session": sess["id"], "configuration": conf["id"]})
        s.wait_state("activations", a["id"], timeout=60)
        yield types.SimpleNamespace(site=s, mnt=a["mount"], pfs=s.pfs, instance=inst["id"], user=user,
                                    bindir=os.path.dirname(spillway_bin), base=s.base)


_n = [0]


@pytest.fixture
def work(site, request):
    """(instance directory, PFS directory) of this test, new, owned by spwtest."""
    _n[0] += 1
    name = re.sub(r"[^A-Za-z0-9_]+", "_", request.node.name)[:40] + f"-{_n[0]}"
    d, p = os.path.join(site.mnt, name), os.path.join(site.pfs, site.user.name, name)
    site.user.run(_mkdirs, [d, p])
    return d, p


def stage_out(site, src, dst, instance=None):
    return site.site.api("POST", "/dw/v1/stages", {
        "instance": instance or site.instance, "direction": "out", "type": "file",
        "source": src, "destination": dst, "owner": site.user.uid})


def get(site, sid, wait=0):
    return site.site.api("GET", f"/dw/v1/stages/{sid}" + (f"?wait={wait}" if wait else ""))


def wait_ended(site, sid, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = get(site, sid, wait=5)
        if s["state"] not in ("queued", "deferred", "running"):
            return s
    raise AssertionError(f"stage {sid} did not end: {get(site, sid)}")


def server_pid(site, name):
    return next(x["pid"] for x in site.site.state()["servers"] if x["name"] == name)


class Frozen:
    """The stage's coordinator, stopped (SIGSTOP) as soon as the copy of `dst` has
    begun (its temporary exists; or, for a stage that writes in place, `dst` has its
    new size): the stage is certainly stopped part-way, and a terminate or a hurried
    teardown reaches it while it copies. `thaw()` (SIGCONT) lets it go on."""

    def __init__(self, site, sid, dst, size, timeout=60):
        d, name = os.path.split(dst)
        deadline = time.monotonic() + timeout
        while True:
            try:
                began = any(t[1:].startswith(name + ".spillway-") for t in temporaries(d)) or \
                    os.stat(dst).st_size == size
            except FileNotFoundError:
                began = False
            if began:
                break
            assert time.monotonic() < deadline, f"stage {sid} did not start copying: {get(site, sid)}"
            time.sleep(0.002)
        st = get(site, sid)
        assert st["state"] == "running", f"the stage ended before it could be stopped: {st}"
        self.pid = server_pid(site, st["server"])
        os.kill(self.pid, signal.SIGSTOP)
        self.thawed = False

    def thaw(self):
        if not self.thawed:
            os.kill(self.pid, signal.SIGCONT)
            self.thawed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.thaw()

def test_a_complete_stage_out_is_renamed_into_place(site, work):
    d, p = work
    data = os.urandom(3 * MiB + 4321)
    site.user.run(_write, os.path.join(d, "in.dat"), data)
    dst = os.path.join(p, "out.dat")
    s = wait_ended(site, stage_out(site, d[len(site.mnt):] + "/in.dat", dst)["id"])
    assert s["state"] == "complete", s
    st = os.stat(dst)
    assert st.st_uid == site.user.uid and st.st_size == len(data)
    with open(dst, "rb") as f:
        assert f.read() == data
    assert temporaries(p) == []


def test_a_terminated_stage_out_leaves_the_old_file_and_no_temporary(site, work):
    d, p = work
    src = os.path.join(d, "big.dat")
    site.user.run(_write_big, src, BIG, 1)
    dst = os.path.join(p, "big.dat")
    site.user.run(_write, dst, b"the old content\n")
    sid = stage_out(site, src[len(site.mnt):], dst)["id"]
    with Frozen(site, sid, dst, BIG) as frozen:
        # Part-way: the temporary is there, the destination still the old file.
        assert len(temporaries(p)) == 1, os.listdir(p)
        with open(dst, "rb") as f:
            assert f.read() == b"the old content\n"
        site.site.api("PATCH", f"/dw/v1/stages/{sid}", {"action": "terminate"})
        time.sleep(2)  # the cancel reaches the coordinator (the watcher polls each second)
        frozen.thaw()
        s = wait_ended(site, sid)
    assert s["state"] == "terminated" and s["bytes_done"] < BIG, s
    assert "not put in place" in s["error"]["message"], s
    with open(dst, "rb") as f:
        assert f.read() == b"the old content\n", "a terminated stage-out changed its destination"
    assert temporaries(p) == [], os.listdir(p)
    # Asked through the API: the path's latest stage was terminated (started, no counts).
    c = site.site.api("GET", f"/dw/v1/instances/{site.instance}/stage_counts?path="
                      f"{src[len(site.mnt):]}&scope=file")
    assert c == {"complete": 0, "pending": 0, "deferred": 0, "failed": 0, "started": True}, c
    # A stage-out to a new name that is terminated leaves nothing at all.
    new = os.path.join(p, "new.dat")
    sid = stage_out(site, src[len(site.mnt):], new)["id"]
    with Frozen(site, sid, new, BIG) as frozen:
        site.site.api("PATCH", f"/dw/v1/stages/{sid}", {"action": "terminate"})
        time.sleep(2)
        frozen.thaw()
        assert wait_ended(site, sid)["state"] == "terminated"
    assert not os.path.exists(new) and temporaries(p) == [], os.listdir(p)


def test_a_hurried_teardown_drops_the_stage_out_and_says_so(site, work):
    """A job's session (numeric token) torn down with --hurry while its stage-out copies:
    the destination is untouched and no temporary stays; dw_wlm_cli's teardown fails
    once (Slurm then sets the job's Reason=BurstBufferOperation with this text), and its
    retry finds no session (`token not found`, success); `dwstat stages` shows the stage
    dropped and why."""
    d, p = work
    s = site.site
    token = str(7_000_000 + os.getpid() % 100_000)
    sess, inst, conf = s.persistent(token, 2 * GiB, owner=site.user.uid)
    a = s.api("POST", "/dw/v1/activations", {"session": sess["id"], "configuration": conf["id"]})
    s.wait_state("activations", a["id"], timeout=60)
    src = os.path.join(a["mount"], "big.dat")
    site.user.run(_write_big, src, BIG, 2)
    dst = os.path.join(p, "job-out.dat")
    site.user.run(_write, dst, b"yesterday's result\n")
    sid = stage_out(site, "/big.dat", dst, instance=inst["id"])["id"]
    env = dict(os.environ, SPILLWAY_CONFIG=s.config)
    stub = os.path.join(site.base, "teardown-script")
    with open(stub, "w") as f:
        f.write("#!/bin/bash\nexit 0\n")
    wlm = [os.path.join(site.bindir, "dw_wlm_cli"), "--function", "teardown", "--token", token,
           "--job", stub, "--hurry"]
    with Frozen(site, sid, dst, BIG) as frozen:
        # The teardown drops the stage at once and waits for the coordinator to confirm
        # its cancel, which it does once it runs again.
        threading.Timer(3, frozen.thaw).start()
        r = subprocess.run(wlm, capture_output=True, text=True, env=env, timeout=300)
    out = r.stdout
    assert r.returncode == 1, (r.returncode, out, r.stderr)
    assert r.stderr == "", "dw_wlm_cli writes only to stdout (Slurm merges both)"
    assert f"session {sess['id']} torn down" in out, out
    assert f"stage-out {sid} " in out and "dropped by a hurried teardown while copying" in out, out
    assert "did not complete" in out, out
    # Slurm's success strings must not appear in a failure.
    assert "token not found" not in out and "No matching session" not in out, out
    # Slurm retries a failed teardown: the session is gone, so that one succeeds.
    r2 = subprocess.run(wlm, capture_output=True, text=True, env=env, timeout=120)
    assert r2.returncode == 0 and "token not found" in r2.stdout, r2
    st = wait_ended(site, sid)
    assert st["state"] == "dropped" and st["error"]["errno"] == 125, st
    # The destination is as it was, and nothing else is left beside it.
    with open(dst, "rb") as f:
        assert f.read() == b"yesterday's result\n"
    assert temporaries(p) == [], os.listdir(p)
    dwstat = subprocess.run([os.path.join(site.bindir, "dwstat"), "stages"], capture_output=True,
                            text=True, env=env, timeout=60)
    assert dwstat.returncode == 0, dwstat
    row = [line.split() for line in dwstat.stdout.splitlines() if line.split()[:1] == [str(sid)]]
    assert row and "dropped" in row[0], dwstat.stdout
    assert re.search(rf"^stage {sid} dropped: .*ECANCELED: dropped by a hurried teardown while "
                     r"copying", dwstat.stdout, re.M), dwstat.stdout


def _build(site, name):
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "cray-datawarp"],
                           capture_output=True, text=True)
    if flags.returncode != 0:
        pytest.fail("pkg-config does not know cray-datawarp: run scripts/setup.sh", pytrace=False)
    out = tempfile.mkdtemp(prefix="dwc-", dir=site.base)
    os.chmod(out, 0o755)
    exe = os.path.join(out, name)
    r = subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-o", exe,
                        os.path.join(H.C_DIR, name + ".c"), *flags.stdout.split()],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return exe


def _run(argv, timeout):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def test_libdatawarp_wait_and_query_report_a_terminated_stage(site, work):
    """dw_stage_file_out completes once; a second one of the same file is terminated;
    dw_wait_file_stage returns 0 and dw_query_file_stage answers rc 0 with every count
    0 (the terminated stage: not -EINVAL, not the first stage's complete=1); the PFS file
    is still the first, complete copy."""
    exe = _build(site, "dw_partial")
    d, p = work
    f = os.path.join(d, "f.dat")
    # Big enough, and the terminate soon enough, that the second stage-out is still
    # running when it comes: 128 MiB and 200 ms let a fast disk finish it first (the
    # terminate then met a done stage: -EINVAL).
    digest = site.user.run(_write_big, f, 512 * MiB, 3)
    dst = os.path.join(p, "f.dat")
    rc, out, err = site.user.run(_run, [exe, f, dst, "30"], 120)
    assert rc == 0, (out, err)
    assert "first-wait rc=0" in out and "first rc=0 complete=1 pending=0 deferred=0 failed=0" in out, out
    assert "terminate rc=0" in out, out
    assert re.search(r"^wait rc=0$", out, re.M), out
    assert "terminated rc=0 complete=0 pending=0 deferred=0 failed=0" in out, out
    assert sha(dst) == digest, "the terminated stage-out replaced the complete copy"
    assert temporaries(p) == [], os.listdir(p)
