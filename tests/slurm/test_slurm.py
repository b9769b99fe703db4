"""Spillway driven by Debian's real Slurm 22.05 (docs/jobs.md): slurmctld and slurmd
(tests/harness/slurm.py) with `burst_buffer/datawarp` pointed at Spillway's dw_wlm_cli, a local
Spillway site (manager, 2 servers, an agent for this host), jobs submitted with sbatch
as an unprivileged user:

* jobdw + stage_in + stage_out: the output on the PFS with its contents and ownership;
* `#BB create_persistent` in a -N0 job, a job using it through persistentdw, a job
  destroying it, `scontrol show burst` reporting the pool's space throughout;
* a bad directive refused by sbatch with Spillway's message;
* scancel during stage-in and during the run: no mount, fragment or session left;
* a job asking for more than the pool has free waits (BurstBufferResources) and starts
  when space frees up;
* the main job again through `burst_buffer/lua` with the shipped slurm/burst_buffer.lua.
"""

import hashlib
import os
import re
import socket

import pytest

import slurm as S
import spwhelpers as H
from sitehelpers import running_site

pytestmark = pytest.mark.slurm

GiB = 1 << 30
HOST = socket.gethostname().split(".")[0]


@pytest.fixture(scope="module")
def spw(spillway_bin, munged, _local_base, pfs, users):
    """The Spillway site; the SlurmUser's group are its admins (dw_wlm_cli runs as it)."""
    with running_site(spillway_bin, _local_base, munged, servers=2, server_capacity="8GiB",
                      pfs_roots=[pfs], node=HOST, admin_group=S.slurm_user_group()) as s:
        yield s


def datawarp_conf(tools):
    return (f"GetSysState={tools}/dw_wlm_cli\nGetSysStatus={tools}/dwstat\n"
            "Flags=EnablePersistent\nDefaultPool=wlm_pool\nValidateTimeout=5\nOtherTimeout=300\n")


@pytest.fixture(scope="module")
def slurm(slurm_sites, spw, tools):
    return slurm_sites(burst_buffer="datawarp", burst_buffer_conf=datawarp_conf(tools),
                       extra_env=(("SPILLWAY_CONFIG", spw.config),))


def user_pfs_dir(pfs, user, name):
    d = os.path.join(pfs, name)
    os.mkdir(d)
    os.chown(d, user.uid, user.gid)
    return d


def nothing_left(spw, timeout=60):
    """No session, activation or fragment in the manager, no mount of the site."""
    def clean():
        return (spw.api("GET", "/dw/v1/sessions")["sessions"] == [] and
                spw.api("GET", "/dw/v1/activations")["activations"] == [] and
                spw.api("GET", "/dw/v1/fragments")["fragments"] == [] and
                spw.dir not in open("/proc/self/mounts").read())
    spw.wait(clean, "no session, activation, fragment or mount left", timeout=timeout)


def main_job(base, name="main"):
    return f"""#!/bin/bash
#SBATCH -N 1 -o {base}/{name}.out
#DW jobdw type=scratch access_mode=striped capacity=1GiB pool=wlm_pool
#DW stage_in type=directory source={base}/in destination=$DW_JOB_STRIPED/in
set -e
echo "striped=$DW_JOB_STRIPED"
mkdir $DW_JOB_STRIPED/out
cat $DW_JOB_STRIPED/in/* | sha256sum > $DW_JOB_STRIPED/out/sum
#DW stage_out type=directory source=$DW_JOB_STRIPED/out destination={base}/out
"""


def make_input(base, user):
    os.mkdir(os.path.join(base, "in"))
    data = b""
    for i in range(5):
        chunk = os.urandom(200_000 + i)
        with open(os.path.join(base, "in", f"f{i}"), "wb") as f:
            f.write(chunk)
        data += chunk
    for root, dirs, files in os.walk(base):
        for x in dirs + files:
            os.chown(os.path.join(root, x), user.uid, user.gid)
    return hashlib.sha256(data).hexdigest()


def check_main_job_output(base, user, want, name="main"):
    out = os.path.join(base, "out", "sum")
    assert open(out).read().split()[0] == want
    for p in (os.path.join(base, "out"), out):
        st = os.stat(p)
        assert (st.st_uid, st.st_gid) == (user.uid, user.gid), p
    log = open(os.path.join(base, f"{name}.out")).read()
    assert re.search(r"striped=\S+_striped_scratch/$", log, re.M), log


@pytest.mark.timeout(300)
def test_a_job_stages_in_computes_and_stages_out(slurm, spw, pfs, user):
    base = user_pfs_dir(pfs, user, "main")
    want = make_input(base, user)
    job = slurm.submit(main_job(base), user.name, cwd=base)
    rec = slurm.wait_job(job, timeout=120, burst_buffer_done=True)
    assert rec["JobState"] == "COMPLETED", rec
    check_main_job_output(base, user, want)
    nothing_left(spw)


def burst_line(slurm):
    text = slurm.show_burst()
    m = re.search(r"TotalSpace=(\S+) FreeSpace=(\S+) UsedSpace=(\S+)", text)
    assert m, text
    return m.groups(), text


@pytest.mark.timeout(300)
def test_persistent_instance_created_used_and_destroyed(slurm, spw, pfs, user):
    base = user_pfs_dir(pfs, user, "persist")
    with open(os.path.join(base, "ref"), "w") as f:
        f.write("reference\n")
    os.chown(os.path.join(base, "ref"), user.uid, user.gid)
    (total, free, used), text = burst_line(slurm)
    assert (total, used) == ("16GiB", "0"), text

    create = f"""#!/bin/bash
#SBATCH -N 0 -o {base}/create.out
#BB create_persistent name=spwdb capacity=2GiB access=striped type=scratch
"""
    job = slurm.submit(create, user.name, cwd=base)
    slurm.wait_job(job, timeout=120, burst_buffer_done=True)
    sessions = spw.api("GET", "/dw/v1/sessions")["sessions"]
    assert [(s["token"], s["owner"]) for s in sessions] == [("spwdb", user.uid)]
    spw.wait(lambda: burst_line(slurm)[0] == ("16GiB", "14GiB", "2GiB"), "2GiB used", timeout=60)
    assert re.search(r"Name=spwdb .*Size=2GiB", slurm.show_burst()), slurm.show_burst()

    use = f"""#!/bin/bash
#SBATCH -N 1 -o {base}/use.out
#DW persistentdw name=spwdb
#DW stage_in type=file source={base}/ref destination=$DW_PERSISTENT_STRIPED_spwdb/ref
cat $DW_PERSISTENT_STRIPED_spwdb/ref
echo more > $DW_PERSISTENT_STRIPED_spwdb/written_by_job
"""
    job = slurm.submit(use, user.name, cwd=base)
    rec = slurm.wait_job(job, timeout=120, burst_buffer_done=True)
    assert rec["JobState"] == "COMPLETED", rec
    assert open(os.path.join(base, "use.out")).read().strip() == "reference"
    # The job's own mounts are gone, the persistent instance stays.
    assert spw.api("GET", "/dw/v1/activations")["activations"] == []
    assert [s["token"] for s in spw.api("GET", "/dw/v1/sessions")["sessions"]] == ["spwdb"]
    assert burst_line(slurm)[0][2] == "2GiB"

    destroy = f"""#!/bin/bash
#SBATCH -N 0 -o {base}/destroy.out
#BB destroy_persistent name=spwdb
"""
    job = slurm.submit(destroy, user.name, cwd=base)
    slurm.wait_job(job, timeout=120, burst_buffer_done=True)
    nothing_left(spw)
    spw.wait(lambda: burst_line(slurm)[0] == ("16GiB", "16GiB", "0"), "the space freed", timeout=90)


def test_a_bad_directive_is_refused_at_submit_with_spillways_message(slurm, spw, pfs, user):
    base = user_pfs_dir(pfs, user, "bad")
    bad = """#!/bin/bash
#DW jobdw type=scratch capacity=1GiB colour=blue
#DW stage_in type=file destination=$DW_JOB_STRIPED/x
true
"""
    r = slurm.submit(bad, user.name, cwd=base, check=False)
    assert r.returncode != 0
    err = r.stderr
    assert 'line 2: jobdw: unknown key "colour"' in err, err
    assert "line 3: stage_in: missing source=" in err, err
    assert spw.api("GET", "/dw/v1/sessions")["sessions"] == []


@pytest.mark.timeout(300)
def test_scancel_during_stage_in_and_during_the_run_leaves_nothing(slurm, spw, pfs, user):
    base = user_pfs_dir(pfs, user, "cancel")
    big = os.path.join(base, "big")
    with open(big, "wb") as f:
        f.truncate(0)
        block = os.urandom(1 << 20)
        for _ in range(3 * 1024):
            f.write(block)
    os.chown(big, user.uid, user.gid)
    slow = f"""#!/bin/bash
#SBATCH -N 1 -o {base}/slow.out
#DW jobdw capacity=4GiB
#DW stage_in type=file source={big} destination=$DW_JOB_STRIPED/big
echo never
"""
    job = slurm.submit(slow, user.name, cwd=base)
    spw.wait(lambda: any(s["state"] == "running" for s in spw.api("GET", "/dw/v1/stages")["stages"]),
             "the stage-in running", timeout=60, interval=0.05)
    slurm.cancel(job, as_user=user.name)
    slurm.wait_job(job, states=("CANCELLED",), timeout=120, burst_buffer_done=True)
    nothing_left(spw)

    running = f"""#!/bin/bash
#SBATCH -N 1 -o {base}/run.out
#DW jobdw capacity=1GiB
echo started; sleep 300
"""
    job = slurm.submit(running, user.name, cwd=base)
    slurm.wait_job(job, states=("RUNNING",), timeout=60)
    spw.wait(lambda: os.path.exists(os.path.join(base, "run.out")) and
             "started" in open(os.path.join(base, "run.out")).read(), "the job running", timeout=60)
    assert spw.api("GET", "/dw/v1/activations")["activations"], "mounted while it runs"
    slurm.cancel(job, as_user=user.name)
    slurm.wait_job(job, states=("CANCELLED",), timeout=120, burst_buffer_done=True)
    nothing_left(spw)


@pytest.mark.timeout(300)
def test_a_job_wanting_more_than_is_free_waits_then_runs(slurm, spw, pfs, user):
    base = user_pfs_dir(pfs, user, "wait")
    flag = os.path.join(base, "go")
    holder = f"""#!/bin/bash
#SBATCH -N 1 -o {base}/holder.out
#DW jobdw capacity=12GiB
while [ ! -e {flag} ]; do sleep 0.2; done
"""
    waiter = f"""#!/bin/bash
#SBATCH -N 1 -o {base}/waiter.out
#DW jobdw capacity=8GiB
echo ran
"""
    first = slurm.submit(holder, user.name, cwd=base)
    slurm.wait_job(first, states=("RUNNING",), timeout=60)
    second = slurm.submit(waiter, user.name, cwd=base)
    spw.wait(lambda: slurm.show_job(second).get("Reason") == "BurstBufferResources",
             "the second job waiting for burst-buffer space", timeout=60)
    assert slurm.show_job(second)["JobState"] == "PENDING"
    open(flag, "w").close()
    slurm.wait_job(first, timeout=120, burst_buffer_done=True)
    rec = slurm.wait_job(second, timeout=180, burst_buffer_done=True)
    assert rec["JobState"] == "COMPLETED", rec
    assert open(os.path.join(base, "waiter.out")).read().strip() == "ran"
    nothing_left(spw)


@pytest.mark.timeout(300)
def test_the_main_job_through_burst_buffer_lua(slurm_sites, spw, pfs, user, tools):
    lua = open(os.path.join(H.REPO, "slurm", "burst_buffer.lua")).read()
    lua, n = re.subn(r'^local DW_WLM_CLI = ".*"$', f'local DW_WLM_CLI = "{tools}/dw_wlm_cli"', lua, flags=re.M)
    assert n == 1
    lua = re.sub(r'^local DWSTAT = ".*"$', f'local DWSTAT = "{tools}/dwstat"', lua, flags=re.M)
    conf = open(os.path.join(H.REPO, "slurm", "burst_buffer.conf.lua.example")).read()
    site = slurm_sites(burst_buffer="lua", burst_buffer_conf=conf, lua_script=lua,
                       extra_env=(("SPILLWAY_CONFIG", spw.config),))
    base = user_pfs_dir(pfs, user, "lua")
    want = make_input(base, user)
    job = site.submit(main_job(base, "luamain"), user.name, cwd=base)
    rec = site.wait_job(job, timeout=120, burst_buffer_done=True)
    assert rec["JobState"] == "COMPLETED", (rec, site.log("slurmctld")[-3000:])
    check_main_job_output(base, user, want, name="luamain")
    nothing_left(spw)
