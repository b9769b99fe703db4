"""Run examples/job.sh.in through real Slurm (scripts/demo-slurm.sh): Debian's slurmctld
and slurmd (the tests' SlurmSite, tests/harness/slurm.py: own slurm.conf, ports and state under
DIR) with burst_buffer/datawarp pointed at the installed dw_wlm_cli, the job submitted
with sbatch as USER, what Slurm shows while it runs, its output.

    python3 scripts/lib/slurm_demo.py DIR SPILLWAY_CONFIG USER JOB_SCRIPT
"""

import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "harness"))

import slurm as S  # noqa: E402

BURST_BUFFER_CONF = """GetSysState=/usr/local/bin/dw_wlm_cli
GetSysStatus=/usr/local/bin/dwstat
Flags=EnablePersistent
ValidateTimeout=5
"""


def say(text):
    print(f"    {text}", flush=True)


def show(cmd, text):
    say(f"$ {cmd}")
    for line in text.rstrip().splitlines():
        print(f"      {line}", flush=True)


def main():
    directory, config, user, script = sys.argv[1:5]
    why = S.slurm_missing()
    if why:
        sys.exit(f"Slurm is not usable here: {why}")
    site = S.SlurmSite(directory, "/run/munge/munge.socket.2", burst_buffer="datawarp",
                       burst_buffer_conf=BURST_BUFFER_CONF, extra_env={"SPILLWAY_CONFIG": config})
    with site:
        say(f"slurmctld and slurmd up (slurm.conf: {site.conf}), BurstBufferType=burst_buffer/datawarp,"
            " GetSysState=/usr/local/bin/dw_wlm_cli")
        show("scontrol show burst", site.show_burst())
        text = open(script).read()
        say(f"$ sbatch {script}   (as {user})")
        job = site.submit(text, user, cwd=os.path.dirname(script))
        say(f"job {job} submitted")
        seen = set()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            rec = site.show_job(job)
            state = (rec.get("JobState"), rec.get("BurstBufferState"), rec.get("Reason"))
            if state not in seen:
                seen.add(state)
                say(f"JobState={state[0]} BurstBufferState={state[1]} Reason={state[2]}")
                if state[0] == "RUNNING":
                    show("scontrol show burst", site.show_burst())
            if rec.get("JobState") in S.FINAL_STATES and site._bb_done(rec):
                break
            time.sleep(0.2)
        rec = site.show_job(job)
        out = os.path.join(os.path.dirname(script), f"job-{job}.out")
        show(f"cat {out}", open(out).read() if os.path.exists(out) else "(no output file)")
        if rec.get("JobState") != "COMPLETED":
            show("slurmctld log (end)", site.log("slurmctld")[-4000:])
            sys.exit(f"job {job} ended {rec.get('JobState')}")
        show("scontrol show burst   (after the job)", site.show_burst())


if __name__ == "__main__":
    main()
