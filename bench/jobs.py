"""Per-job overhead of the burst-buffer phases through real Slurm 22.05 (Debian's
slurmctld and slurmd, burst_buffer/datawarp, Spillway's dw_wlm_cli; a local Spillway
site with 2 servers): BENCH_JOBS (10) jobs, one after the other, each with a 1 GiB job
instance and no staging, submitted as an unprivileged user. Medians of:

  setup -> pre-run done    from the start of `dw_wlm_cli --function setup` to the end of
                           `pre_run` (setup, data_in, real_size, paths, pre_run, and
                           Slurm's own scheduling between them)     Target: < 2 s
  post-run -> teardown     from the start of `post_run` to the end of `teardown`
                           (post_run, data_out, teardown and Slurm between them)
                                                                    Target: < 2 s

GetSysState points at a wrapper that timestamps each call before and after running the
real dw_wlm_cli (two `date` runs, ~2 ms). The floor, measured in the same run: a job
without a burst buffer, submit to end, the time Slurm itself takes to run one job.

Prints one line per figure and, with BENCH_RESULTS set, appends rows for bench/all.sh.
"""

import grp
import os
import pwd
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "harness"))
import slurm as S  # noqa: E402
from sitehelpers import LocalSite  # noqa: E402

JOBS = int(os.environ.get("BENCH_JOBS", "10"))
BIN = os.path.join(HERE, "..", "target", "release")
USER = "spwbench"
MUNGE = os.environ.get("BENCH_MUNGE_SOCKET", "/run/munge/munge.socket.2")

WRAPPER = """#!/bin/sh
# Times one dw_wlm_cli call: function, start, end (epoch seconds). Prints nothing itself.
start=$(date +%s.%N)
@REAL@ "$@"
rc=$?
echo "$2 $start $(date +%s.%N) $rc" >>@LOG@
exit $rc
"""


class SystemMunge:
    socket = MUNGE

    def munge(self, as_user=None):
        return subprocess.run(["munge", "-n", "--socket", MUNGE], check=True,
                              capture_output=True, text=True).stdout.strip()


def row(figure, floor, value, target):
    ratio = value / floor if floor else float("nan")
    verdict = "PASS" if value < target else "FAIL"
    print(f"{figure:<26} floor {floor:.2f} s | spillway {value:.2f} s | ratio {ratio:.2f} | target < {target:g} s {verdict}")
    out = os.environ.get("BENCH_RESULTS")
    if out:
        with open(out, "a") as f:
            f.write(f"{figure}\ts\t{floor:.2f}\t{value:.2f}\t{ratio:.2f}\t< {target:g} s\t{verdict}\n")
    return verdict


def ensure_user():
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-M", "-U", "-c", "spillway bench", "-s", "/usr/sbin/nologin",
                        "-d", "/nonexistent", USER], check=True)
        return pwd.getpwnam(USER)


def main():
    why = S.slurm_missing()
    if why:
        sys.exit(f"Slurm is not usable here: {why}")
    work = os.environ.get("BENCH_WORK", "/var/tmp/spillway-bench")
    os.makedirs(work, exist_ok=True)
    d = tempfile.mkdtemp(prefix="jobs-", dir=work)
    os.chmod(d, 0o755)
    pw = ensure_user()
    host = socket.gethostname().split(".")[0]
    slurm_group = grp.getgrgid(pwd.getpwnam("slurm").pw_gid).gr_name
    site = LocalSite(os.path.join(BIN, "spillway"), os.path.join(d, "site"), SystemMunge(), servers=2,
                     node=host, admin_group=slurm_group)
    os.makedirs(site.dir, mode=0o755)
    tools = os.path.join(d, "bin")
    os.makedirs(tools, mode=0o755)
    real = os.path.join(tools, "dw_wlm_cli.real")
    shutil.copy2(os.path.join(BIN, "dw_wlm_cli"), real)
    log = os.path.join(d, "calls.log")
    open(log, "w").close()
    os.chown(log, pwd.getpwnam("slurm").pw_uid, pwd.getpwnam("slurm").pw_gid)
    wrapper = os.path.join(tools, "dw_wlm_cli")
    with open(wrapper, "w") as f:
        f.write(WRAPPER.replace("@REAL@", real).replace("@LOG@", log))
    for p in (real, wrapper):
        os.chmod(p, 0o755)
    work_dir = os.path.join(d, "home")
    os.makedirs(work_dir, mode=0o755)
    os.chown(work_dir, pw.pw_uid, pw.pw_gid)
    slurm = None
    try:
        site.up()
        slurm = S.SlurmSite(os.path.join(d, "slurm"), MUNGE, burst_buffer="datawarp",
                            burst_buffer_conf=f"GetSysState={wrapper}\nFlags=EnablePersistent\n",
                            extra_env={"SPILLWAY_CONFIG": site.config})
        slurm.start()
        plain, setups, posts, own_in, own_out = [], [], [], [], []
        for i in range(JOBS):
            t0 = time.monotonic()
            job = slurm.submit(f"#!/bin/bash\n#SBATCH -o {work_dir}/plain-%j.out\ntrue\n", USER, cwd=work_dir)
            rec = slurm.wait_job(job, timeout=120)
            assert rec["JobState"] == "COMPLETED", rec
            plain.append(time.monotonic() - t0)

            open(log, "w").close()
            job = slurm.submit(f"#!/bin/bash\n#SBATCH -o {work_dir}/bb-%j.out\n"
                               "#DW jobdw type=scratch access_mode=striped capacity=1GiB pool=wlm_pool\n"
                               "test -d $DW_JOB_STRIPED\n", USER, cwd=work_dir)
            rec = slurm.wait_job(job, timeout=180, burst_buffer_done=True)
            assert rec["JobState"] == "COMPLETED", rec
            calls = {}
            for line in open(log):
                fn, start, end, rc = line.split()
                if fn in ("pools", "show_instances", "show_sessions", "show_configurations"):
                    continue
                assert rc == "0", line
                calls[fn] = (float(start), float(end))
            setups.append(calls["pre_run"][1] - calls["setup"][0])
            posts.append(calls["teardown"][1] - calls["post_run"][0])
            # The tool's own share; the rest is Slurm scheduling between the calls.
            own_in.append(sum(e - s for f, (s, e) in calls.items()
                              if f in ("setup", "data_in", "real_size", "paths", "pre_run")))
            own_out.append(sum(e - s for f, (s, e) in calls.items()
                               if f in ("post_run", "data_out", "teardown")))
            print(f"job {job}: plain {plain[-1]:.2f} s, setup->pre-run {setups[-1]:.2f} s "
                  f"(dw_wlm_cli {own_in[-1]:.2f} s), post-run->teardown {posts[-1]:.2f} s "
                  f"(dw_wlm_cli {own_out[-1]:.2f} s)", file=sys.stderr)
        floor = statistics.median(plain)
        print(f"(medians: dw_wlm_cli itself {statistics.median(own_in):.2f} s of setup -> pre-run, "
              f"{statistics.median(own_out):.2f} s of post-run -> teardown; the rest is Slurm between calls)")
        bad = 0
        bad += row("job setup -> pre-run done", floor, statistics.median(setups), 2.0) != "PASS"
        bad += row("job post-run -> teardown", floor, statistics.median(posts), 2.0) != "PASS"
        return 2 if bad else 0
    finally:
        if slurm is not None:
            slurm.stop()
        site.down()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
