"""The Slurm fixture (tests/harness/slurm.py, tests/harness/slurmfixtures.py): Debian's real slurmctld and
slurmd run a batch job as an unprivileged user, and drive both burst-buffer plugins:
`burst_buffer/datawarp` against a recording stand-in for dw_wlm_cli (the argv of every
call, in order, and the uid it ran as), `burst_buffer/lua` against a recording
burst_buffer.lua. No Spillway involved: this pins down what Slurm itself does (spec
docs: datawarp-compat.md sections 1, 2 and 8)."""

import json
import os
import pwd
import shutil
import tempfile
import time

import pytest

import slurm as S
import spwhelpers as H

pytestmark = pytest.mark.slurm

GiB = 1 << 30
POOL = "wlm_pool"


# --------------------------------------------------------------------------- stand-ins

# A recording dw_wlm_cli. Slurm runs it as SlurmUser without a shell, argv[0] always
# "dw_wlm_cli", stdout and stderr merged into what it parses: so it prints nothing but
# the answer, and records to its log (one JSON line per call) instead.
DW_WLM_CLI = r'''#!/usr/bin/python3 -I
import json, os, sys, time
LOG = @LOG@
MOUNTS = @MOUNTS@
POOL = @POOL@

def opt(name):
    a = sys.argv
    return a[a.index(name) + 1] if name in a[:-1] else None

rec = {"t": time.time(), "uid": os.getuid(), "gid": os.getgid(), "argv": sys.argv}
out, rc = "", 0
try:
    fn = opt("--function")
    job = opt("--job")
    if job:
        try:
            with open(job, "rb") as f:
                data = f.read()
            rec["job_file"] = {"size": len(data), "ends_with_nul": data.endswith(b"\0"),
                               "head": data[:12].decode(errors="replace")}
        except OSError as e:
            rec["job_file"] = {"error": e.strerror}
    nodes = opt("--nodehostnamefile")
    if nodes:
        try:
            with open(nodes) as f:
                rec["nodehostnamefile"] = f.read()
        except OSError as e:
            rec["nodehostnamefile"] = {"error": e.strerror}
    if fn == "pools":
        out = json.dumps({"pools": [{"id": POOL, "units": "bytes", "granularity": 1 << 30,
                                     "quantity": 100, "free": 100}]})
    elif fn in ("show_instances", "show_sessions", "show_configurations"):
        out = json.dumps({fn[len("show_"):]: []})
    elif fn == "real_size":
        out = json.dumps({"token": opt("--token"), "capacity": 1 << 30, "units": "bytes"})
    elif fn == "paths":
        with open(opt("--pathfile"), "w") as f:
            f.write("DW_JOB_STRIPED=%s/%s_striped_scratch/\n" % (MOUNTS, opt("--token")))
    elif fn == "create_persistent":
        out = "created persistent session %s" % opt("-t")
except Exception as e:  # recorded, never printed: the output is the answer
    rec["error"] = repr(e)
    rc = 1
with open(LOG, "a") as f:
    f.write(json.dumps(rec) + "\n")
sys.stdout.write(out)
sys.exit(rc)
'''

# A recording burst_buffer.lua (Lua 5.1, Slurm 22.05 signatures): every hook appends its
# name and arguments, tab-separated, to the log; paths writes the job's variable.
BURST_BUFFER_LUA = r'''
local LOG = @LOG@
local MOUNTS = @MOUNTS@
local POOL = @POOL@

local function record(name, ...)
    local id = io.popen("id -u")
    local uid = id:read("*l")
    id:close()
    local f = io.open(LOG, "a")
    local parts = {name .. "@" .. uid}
    for i = 1, select("#", ...) do
        parts[#parts + 1] = tostring(select(i, ...))
    end
    f:write(table.concat(parts, "\t") .. "\n")
    f:close()
end

function slurm_bb_job_process(job_script)
    record("job_process", job_script)
    return slurm.SUCCESS
end

function slurm_bb_pools()
    record("pools")
    return slurm.SUCCESS, '{"pools":[{"id":"' .. POOL .. '","quantity":100,"granularity":1073741824,"free":100}]}'
end

function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script)
    record("setup", job_id, uid, gid, pool, bb_size, job_script)
    return slurm.SUCCESS
end

function slurm_bb_data_in(job_id, job_script)
    record("data_in", job_id, job_script)
    return slurm.SUCCESS
end

function slurm_bb_real_size(job_id)
    record("real_size", job_id)
    return slurm.SUCCESS, "1073741824"
end

function slurm_bb_paths(job_id, job_script, path_file)
    record("paths", job_id, job_script, path_file)
    local f = io.open(path_file, "w")
    f:write("DW_JOB_STRIPED=" .. MOUNTS .. "/" .. job_id .. "_lua/\n")
    f:close()
    return slurm.SUCCESS
end

function slurm_bb_pre_run(job_id, job_script)
    record("pre_run", job_id, job_script)
    return slurm.SUCCESS
end

function slurm_bb_post_run(job_id, job_script)
    record("post_run", job_id, job_script)
    return slurm.SUCCESS
end

function slurm_bb_data_out(job_id, job_script)
    record("data_out", job_id, job_script)
    return slurm.SUCCESS
end

function slurm_bb_job_teardown(job_id, job_script, hurry)
    record("teardown", job_id, job_script, hurry)
    return slurm.SUCCESS
end

function slurm_bb_get_status(...)
    record("get_status", ...)
    return slurm.SUCCESS, "spillway test status"
end
'''


def fill(template, **values):
    for k, v in values.items():
        template = template.replace(f"@{k}@", json.dumps(v))  # a valid Python and Lua string
    return template


@pytest.fixture(scope="module")
def tool_dir():
    """A directory every user can traverse, for stand-ins and their logs (written by the
    slurm user)."""
    d = tempfile.mkdtemp(prefix=H.BASE_PREFIX + "slurmtools-")
    os.chmod(d, 0o755)
    yield d
    if not H.KEEP:
        shutil.rmtree(d, ignore_errors=True)


def slurm_writable(path):
    """An empty file the slurm user may append to."""
    pw = pwd.getpwnam("slurm")
    with open(path, "w"):
        pass
    os.chown(path, pw.pw_uid, pw.pw_gid)
    os.chmod(path, 0o644)
    return path


@pytest.fixture(scope="module")
def dw_site(slurm_sites, tool_dir):
    """A site with burst_buffer/datawarp whose GetSysState is the recording stand-in;
    site.calls(token) -> the recorded calls for that token (job id or persistent name)."""
    log = slurm_writable(os.path.join(tool_dir, "dw_wlm_cli.log"))
    tool = os.path.join(tool_dir, "dw_wlm_cli")
    with open(tool, "w") as f:
        f.write(fill(DW_WLM_CLI, LOG=log, MOUNTS=os.path.join(tool_dir, "mounts"), POOL=POOL))
    os.chmod(tool, 0o755)
    conf = (f"GetSysState={tool}\n"
            f"DefaultPool={POOL}\n"
            "Flags=EnablePersistent\n"
            "ValidateTimeout=5\nOtherTimeout=30\nStageInTimeout=30\nStageOutTimeout=30\n")
    site = slurm_sites(burst_buffer="datawarp", burst_buffer_conf=conf)
    site.tool, site.tool_log = tool, log
    return site


def dw_calls(site, token=None):
    """Recorded dw_wlm_cli calls (dicts), those naming `token` only if given."""
    with open(site.tool_log) as f:
        calls = [json.loads(line) for line in f if line.strip()]
    if token is None:
        return calls
    token = str(token)
    return [c for c in calls if any(a == token for a in c["argv"]) or
            any(a.endswith(f"/job.{token}/script") for a in c["argv"])]


def fn_of(call):
    a = call["argv"]
    return a[a.index("--function") + 1]


def wait_for(fn, what, timeout=30, interval=0.1):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# --------------------------------------------------------------------------- tests


def test_plain_batch_job_runs_as_the_user(slurm_site, user):
    site = slurm_site
    print(f"\n[timing] plain site start {site.timings['start']:.2f} s")
    wd = site.user_dir(user, "plain")
    t0 = time.monotonic()
    job = site.submit("#!/bin/bash\necho \"hello from $(id -un) in $SLURM_JOB_ID\"\n", user.name, cwd=wd)
    rec = site.wait_job(job, timeout=30)
    print(f"[timing] plain job submit -> COMPLETED {time.monotonic() - t0:.2f} s")
    assert rec["JobState"] == "COMPLETED", rec
    assert rec["UserId"] == f"{user.name}({user.uid})"
    out = os.path.join(wd, f"slurm-{job}.out")
    assert H.read_file(out).decode() == f"hello from {user.name} in {job}\n"
    st = os.stat(out)
    assert (st.st_uid, st.st_gid) == (user.uid, user.gid)


def test_stop_kills_daemons_and_job_steps(munged, user):
    # A site of its own: stopping it must take the running job's slurmstepd and the job's
    # processes with it, also those of a job submitted without our environment.
    d = tempfile.mkdtemp(prefix=H.BASE_PREFIX + "slurm-")
    site = S.SlurmSite(d, munged.socket)
    try:
        with site:
            wd = site.user_dir(user)
            job = site.submit("#!/bin/bash\nsleep 3141 &\nsleep 3142\n", user.name, "--export=PATH", cwd=wd)
            site.wait_job(job, states=("RUNNING",), timeout=30)
            sleepers = wait_for(lambda: len(H.pids_mentioning("sleep 314")) == 2 and H.pids_mentioning("sleep 314"),
                                "the job's two sleeps")
            pids = site.site_pids()
            names = {p: b" ".join(H.cmdline(p)).decode(errors="replace") for p in pids}
            assert set(sleepers) <= set(pids), names
            assert any(n.startswith("slurmstepd: [") for n in names.values()), names
            assert sum(n.startswith(("/usr/sbin/slurmctld", "/usr/sbin/slurmd ")) for n in names.values()) == 2, names
        assert site.site_pids() == []
        assert H.pids_mentioning("sleep 314") == []
        assert not any(os.path.exists(f"/proc/{p}") and H.cmdline(p) and
                       b" ".join(H.cmdline(p)).decode(errors="replace") == n for p, n in names.items())
    finally:
        site.stop()
        if not H.KEEP:
            shutil.rmtree(d, ignore_errors=True)


def test_root_cannot_use_a_burst_buffer(dw_site):
    r = dw_site.submit(f"#!/bin/bash\n#DW jobdw capacity=1GiB pool={POOL}\ntrue\n", "root",
                       check=False)
    assert r.returncode != 0
    assert "burst buffer" in (r.stdout + r.stderr).lower(), r


def test_datawarp_job_phases_and_argv(dw_site, user):
    site = dw_site
    print(f"\n[timing] datawarp site start {site.timings['start']:.2f} s")
    wd = site.user_dir(user, "dw")
    script = ("#!/bin/bash\n"
              "#SBATCH -t 1\n"
              f"#DW jobdw type=scratch access_mode=striped capacity=1GiB pool={POOL}\n"
              "#DW stage_in type=file source=/etc/hostname destination=$DW_JOB_STRIPED/hostname\n"
              f"#DW stage_out type=file source=$DW_JOB_STRIPED/out destination={wd}/out\n"
              "echo \"DW_JOB_STRIPED=$DW_JOB_STRIPED\"\n")
    t_submit = time.time()
    job = site.submit(script, user.name, cwd=wd)
    rec = site.wait_job(job, timeout=60, burst_buffer_done=True)
    t_done = time.time()
    assert rec["JobState"] == "COMPLETED", rec
    print(f"[job] BurstBuffer={rec.get('BurstBuffer')!r} BurstBufferState={rec.get('BurstBufferState')!r}")
    calls = wait_for(lambda: [c for c in dw_calls(site, job) if fn_of(c) == "teardown"] and dw_calls(site, job),
                     "teardown of the job's buffer")
    for c in calls:
        print("[dw_wlm_cli]", c["uid"], " ".join(c["argv"][1:]))
    fns = [fn_of(c) for c in calls]
    assert fns == ["job_process", "setup", "data_in", "real_size", "paths", "pre_run",
                   "post_run", "data_out", "teardown"], fns
    slurm_uid = pwd.getpwnam("slurm").pw_uid
    assert {c["uid"] for c in calls} == {slurm_uid}, "dw_wlm_cli must run as SlurmUser, not root"
    # Slurm execs it with argv[0] "dw_wlm_cli" (its DebugFlags=BurstBuffer log shows the
    # argv it built); the kernel's #! handling hands a script its own path instead.
    assert all(c["argv"][0] == site.tool for c in calls)
    assert f"_log_script_argv: dw_wlm_cli --function setup --token {job} " in site.log("slurmctld")

    by = {fn_of(c): c for c in calls}
    script_path = by["job_process"]["argv"][4]
    assert script_path.endswith(f"/hash.{job % 10}/job.{job}/script"), script_path
    assert script_path.startswith(site.state_dir + "/")
    assert by["job_process"]["job_file"]["head"].startswith("#!/bin/bash")
    setup = by["setup"]["argv"][1:]
    assert setup[:12] == ["--function", "setup", "--token", str(job), "--caller", "SLURM",
                          "--user", str(user.uid), "--groupid", str(user.gid),
                          "--capacity", f"{POOL}:1GiB"], setup
    assert setup[12:14] == ["--job", script_path]
    assert by["data_in"]["argv"][1:] == ["--function", "data_in", "--token", str(job), "--job", script_path]
    assert by["real_size"]["argv"][1:] == ["--function", "real_size", "--token", str(job)]
    path_file = os.path.join(os.path.dirname(script_path), "path")
    assert by["paths"]["argv"][1:] == ["--function", "paths", "--job", script_path, "--token", str(job),
                                       "--pathfile", path_file]
    assert by["pre_run"]["argv"][1:] == ["--function", "pre_run", "--token", str(job), "--job", script_path,
                                         "--nodehostnamefile", os.path.join(os.path.dirname(script_path),
                                                                            "client_nids")]
    assert by["pre_run"]["nodehostnamefile"] == site.hostname + "\n"
    # The script Slurm hands over is the batch script as stored, with a NUL byte at its end.
    assert by["job_process"]["job_file"]["ends_with_nul"] is True
    assert by["post_run"]["argv"][1:] == ["--function", "post_run", "--token", str(job), "--job", script_path]
    assert by["data_out"]["argv"][1:] == ["--function", "data_out", "--token", str(job), "--job", script_path]
    assert by["teardown"]["argv"][1:5] == ["--function", "teardown", "--token", str(job)]

    mounts = os.path.join(os.path.dirname(site.tool_log), "mounts")
    out = H.read_file(os.path.join(wd, f"slurm-{job}.out")).decode()
    assert out == f"DW_JOB_STRIPED={mounts}/{job}_striped_scratch/\n"

    t = {fn_of(c): c["t"] for c in calls}
    print(f"[timing] datawarp job: submit -> setup {t['setup'] - t_submit:.2f} s, "
          f"setup -> paths {t['paths'] - t['setup']:.2f} s, "
          f"submit -> teardown {t['teardown'] - t_submit:.2f} s, "
          f"submit -> burst buffer complete {t_done - t_submit:.2f} s")


def test_datawarp_create_persistent(dw_site, user):
    site = dw_site
    wd = site.user_dir(user, "persist")
    script = ("#!/bin/bash\n"
              "#BB create_persistent name=spwpers capacity=2GiB access=striped type=scratch\n"
              "true\n")
    t_submit = time.time()
    job = site.submit(script, user.name, "-N0", cwd=wd)
    rec = site.wait_job(job, timeout=60, burst_buffer_done=True)
    assert rec["JobState"] == "COMPLETED", rec
    def mine():
        return sorted(dw_calls(site, job) + dw_calls(site, "spwpers"), key=lambda c: c["t"])

    calls = wait_for(lambda: any(fn_of(c) == "teardown" for c in mine()) and mine(), "the -N0 job's teardown")
    for c in calls:
        print("[dw_wlm_cli]", c["uid"], " ".join(c["argv"][1:]))
    # #BB-only jobs get no job_process; the buffer is created before the job's own setup
    # (capacity 0), and a -N0 job ends through a `teardown --hurry`.
    assert [fn_of(c) for c in calls] == ["create_persistent", "setup", "data_in", "teardown"]
    created = calls[0]
    assert created["argv"][1:] == ["--function", "create_persistent", "-c", "CLI", "-t", "spwpers",
                                   "-u", str(user.uid), "-C", f"{POOL}:{2 * GiB}", "-a", "striped",
                                   "-T", "scratch"]
    assert calls[1]["argv"][1:] == ["--function", "setup", "--token", str(job), "--caller", "SLURM",
                                    "--user", str(user.uid), "--groupid", str(user.gid),
                                    "--capacity", f"{POOL}:0", "--job", calls[1]["argv"][-1]]
    assert calls[3]["argv"][-1] == "--hurry"
    assert {c["uid"] for c in calls} == {pwd.getpwnam("slurm").pw_uid}
    # after a create Slurm asks for the sessions (to learn the new one's id)
    everything = dw_calls(site)
    after = everything[everything.index(created) + 1:]
    assert after and fn_of(after[0]) == "show_sessions", [fn_of(c) for c in after]
    burst = site.show_burst()
    print(burst)
    assert "Name=spwpers" in burst
    print(f"[timing] create_persistent job: submit -> create {created['t'] - t_submit:.2f} s")


@pytest.fixture(scope="module")
def lua_site(slurm_sites, tool_dir):
    log = slurm_writable(os.path.join(tool_dir, "burst_buffer_lua.log"))
    lua = fill(BURST_BUFFER_LUA, LOG=log, MOUNTS=os.path.join(tool_dir, "luamounts"), POOL=POOL)
    site = slurm_sites(burst_buffer="lua", burst_buffer_conf="Directive=DW\nOtherTimeout=30\n", lua_script=lua)
    site.lua_log = log
    return site


def lua_rows(site):
    """[(hook, uid, [args])] recorded by burst_buffer.lua, in call order."""
    with open(site.lua_log) as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    out = []
    for r in rows:
        hook, uid = r[0].split("@")
        out.append((hook, int(uid), r[1:]))
    return out


def lua_calls(site, job):
    job = str(job)
    return [r for r in lua_rows(site) if r[2] and (r[2][0] == job or r[2][0].endswith(f"/job.{job}/script"))]


def test_lua_job_phases(lua_site, user):
    site = lua_site
    print(f"\n[timing] lua site start {site.timings['start']:.2f} s")
    wd = site.user_dir(user, "lua")
    script = ("#!/bin/bash\n"
              f"#DW jobdw capacity=1GiB pool={POOL}\n"
              "echo \"DW_JOB_STRIPED=$DW_JOB_STRIPED\"\n")
    t_submit = time.monotonic()
    job = site.submit(script, user.name, cwd=wd)
    rec = site.wait_job(job, timeout=60, burst_buffer_done=True)
    t_done = time.monotonic()
    assert rec["JobState"] == "COMPLETED", rec
    rows = wait_for(lambda: any(r[0] == "teardown" for r in lua_calls(site, job)) and lua_calls(site, job),
                    "lua teardown")
    for r in rows:
        print("[lua]", r)
    assert [r[0] for r in rows] == ["job_process", "setup", "data_in", "real_size", "paths", "pre_run",
                                    "post_run", "data_out", "teardown"], rows
    # in slurmctld (job_process, paths) or slurmscriptd (the rest): SlurmUser either way
    assert {r[1] for r in rows} == {pwd.getpwnam("slurm").pw_uid}
    by = {r[0]: r[2] for r in rows}
    script_path = by["job_process"][0]
    assert script_path.startswith(site.state_dir + "/") and script_path.endswith(f"/job.{job}/script")
    assert by["setup"] == [str(job), str(user.uid), str(user.gid), POOL, str(GiB), script_path]
    assert by["data_in"] == [str(job), script_path]
    assert by["real_size"] == [str(job)]
    assert by["paths"] == [str(job), script_path, os.path.join(os.path.dirname(script_path), "path")]
    for hook in ("pre_run", "post_run", "data_out"):
        assert by[hook] == [str(job), script_path], hook
    assert by["teardown"] == [str(job), script_path, "false"]
    assert any(r[0] == "pools" for r in lua_rows(site))
    mounts = os.path.join(os.path.dirname(site.lua_log), "luamounts")
    out = H.read_file(os.path.join(wd, f"slurm-{job}.out")).decode()
    assert out == f"DW_JOB_STRIPED={mounts}/{job}_lua/\n"
    print(f"[timing] lua job: submit -> burst buffer complete {t_done - t_submit:.2f} s")


def test_lua_get_status(lua_site):
    r = lua_site.run("scontrol", "show", "bbstat", "one", "two")
    assert r.stdout.strip() == "spillway test status", r
    assert [row for row in lua_rows(lua_site) if row[0] == "get_status"][-1][2] == ["one", "two"]
