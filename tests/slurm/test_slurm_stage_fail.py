"""A job's stage-out stopped part-way, as Debian's real Slurm 22.05 shows it (docs/jobs.md,
"When a stage-out does not complete"): `burst_buffer/datawarp` driving Spillway's
dw_wlm_cli, a local Spillway site with a PFS root, a job of the unprivileged spwtest.

The job writes a 384 MiB result and ends; its `#DW stage_out` runs in `data_out`. Once
the copy has begun (its temporary exists beside the destination) the stage's
coordinator is stopped (SIGSTOP) and `scancel --hurry` drops the stage-out; the
coordinator is let go a few seconds later. Slurm then shows the job with
`Reason=BurstBufferOperation` and the stage's own account of what it left in the reason
text and SystemComment, its buffer is released, and the PFS destination is still the
file that was there before (no partial copy, no temporary)."""

import os
import re
import signal
import socket
import time

import pytest

import slurm as S
from sitehelpers import running_site

pytestmark = pytest.mark.slurm

HOST = socket.gethostname().split(".")[0]
TEMP = re.compile(r"^\..*\.spillway-\d+-\d+$")


@pytest.fixture(scope="module")
def spw(spillway_bin, munged, _local_base, pfs, users):
    with running_site(spillway_bin, _local_base, munged, servers=2, server_capacity="8GiB",
                      pfs_roots=[pfs], node=HOST, admin_group=S.slurm_user_group()) as s:
        # Small ranges, one at a time: the copy is still under way when the cancel lands.
        s.add_server_tunables("stage_range = 1048576\nstage_ranges_in_flight = 1\n")
        yield s


@pytest.fixture(scope="module")
def slurm(slurm_sites, spw, tools):
    conf = (f"GetSysState={tools}/dw_wlm_cli\nGetSysStatus={tools}/dwstat\n"
            "DefaultPool=wlm_pool\nValidateTimeout=5\nOtherTimeout=300\n")
    return slurm_sites(burst_buffer="datawarp", burst_buffer_conf=conf,
                       extra_env=(("SPILLWAY_CONFIG", spw.config),))


def server_pid(spw, name):
    return next(x["pid"] for x in spw.state()["servers"] if x["name"] == name)


@pytest.mark.timeout(240)
def test_a_stage_out_dropped_by_scancel_hurry_marks_the_job_and_leaves_the_old_file(
        slurm, spw, pfs, user):
    base = os.path.join(pfs, "hurry")
    os.mkdir(base)
    os.chown(base, user.uid, user.gid)
    dst = os.path.join(base, "result.dat")
    with open(dst, "wb") as f:
        f.write(b"yesterday's result\n")
    os.chown(dst, user.uid, user.gid)
    job = slurm.submit(f"""#!/bin/bash
#SBATCH -N 1 -o {base}/job.out
#DW jobdw capacity=1GiB
#DW stage_out type=file source=$DW_JOB_STRIPED/result.dat destination={dst}
dd if=/dev/urandom of=$DW_JOB_STRIPED/result.dat bs=1M count=384 status=none
""", user.name, cwd=base)

    # The stage-out has begun copying: stop its coordinator there.
    def began():
        return [n for n in os.listdir(base) if TEMP.match(n)]
    spw.wait(began, "the stage-out's temporary", timeout=120, interval=0.002)
    stage = next(s for s in spw.api("GET", "/dw/v1/stages")["stages"] if s["destination"] == dst)
    assert stage["state"] == "running", stage
    pid = server_pid(spw, stage["server"])
    os.kill(pid, signal.SIGSTOP)
    try:
        slurm.cancel(job, as_user=user.name, hurry=True)
        time.sleep(3)
    finally:
        os.kill(pid, signal.SIGCONT)
    rec = slurm.wait_job(job, states=("COMPLETED",), timeout=120, burst_buffer_done=True)

    print("the job as Slurm shows it:", rec)
    st = spw.api("GET", f"/dw/v1/stages/{stage['id']}")
    assert st["state"] == "dropped", st
    # What Slurm shows (FAIL_BURST_BUFFER_OP): the reason text (scontrol writes its
    # spaces as `_`) and the system comment carry the stage's own words, from data_out
    # (which saw its stage dropped) or the teardown (which found the stage-out lost).
    reason, comment = rec.get("Reason", ""), rec.get("SystemComment", "")
    assert reason.startswith("burst_buffer/datawarp:"), rec
    assert "dropped_by_a_hurried_teardown_while_copying" in reason, rec
    assert "dropped by a hurried teardown while copying" in comment, rec
    # The PFS: the old file, nothing beside it.
    with open(dst, "rb") as f:
        assert f.read() == b"yesterday's result\n", "a dropped stage-out changed its destination"
    assert [n for n in os.listdir(base) if TEMP.match(n)] == [], os.listdir(base)
