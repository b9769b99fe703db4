"""Control-plane latencies on a local site (manager, 2 servers, agent; real HTTPS, MUNGE,
SQLite, FUSE), each as a median of N runs, with the data-plane floor measured in the
same run:

  create-to-mounted  POST session, instance, configuration, activation -> the mount
                     appears in /proc/self/mounts.   Floor: `spillway mount` of the same
                     kind of instance from its descriptor.        Target: < 1000 ms.
  destroy            DELETE session -> unmounted and the session gone from the API.
                     Floor: `spillway umount` of a mount.          (no target)
  dwstat sessions    with 1,000 sessions in the database.   Floor: `sqlite3` reading the
                     same rows from the manager's database.        Target: < 100 ms.

Prints one line per figure and, with BENCH_RESULTS set, appends tab-separated rows for
bench/all.sh: figure, unit, floor, spillway, ratio (spillway / floor), target, verdict.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "harness"))
from sitehelpers import LocalSite  # noqa: E402

REPS = int(os.environ.get("BENCH_CP_REPS", "20"))
SESSIONS = int(os.environ.get("BENCH_CP_SESSIONS", "1000"))
BIN = os.path.join(HERE, "..", "target", "release")


class SystemMunge:
    socket = os.environ.get("BENCH_MUNGE_SOCKET", "/run/munge/munge.socket.2")

    def munge(self, as_user=None):
        return subprocess.run(["munge", "-n", "--socket", self.socket], check=True,
                              capture_output=True, text=True).stdout.strip()


def mounted(path):
    with open("/proc/self/mounts") as f:
        return any(line.split(" ")[1] == path for line in f)


def wait_until(fn, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return
        time.sleep(0.002)
    raise RuntimeError("timed out")


def ms(x):
    return round(x * 1000, 1)


def row(figure, floor, sw, target):
    ratio = sw / floor if floor else float("nan")
    if target is None:
        verdict, ttext = "INFO", "-"
    else:
        verdict, ttext = ("PASS" if sw < target else "FAIL"), f"< {target:g} ms"
    print(f"{figure:<28} floor {floor:.1f} ms | spillway {sw:.1f} ms | ratio {ratio:.1f} | target {ttext} {verdict}")
    out = os.environ.get("BENCH_RESULTS")
    if out:
        with open(out, "a") as f:
            f.write(f"{figure}\tms\t{floor:.1f}\t{sw:.1f}\t{ratio:.2f}\t{ttext}\t{verdict}\n")
    return verdict


def main():
    work = os.environ.get("BENCH_WORK", "/var/tmp/spillway-bench")
    os.makedirs(work, exist_ok=True)
    d = tempfile.mkdtemp(prefix="cp-", dir=work)
    os.chmod(d, 0o755)
    site = LocalSite(os.path.join(BIN, "spillway"), d, SystemMunge(), servers=2,
                     server_capacity="64GiB", granularity="1GiB", node="benchnode")
    verdicts = []
    try:
        site.up()
        # ---- create-to-mounted and destroy, through the whole control plane
        create, destroy, descs = [], [], []
        for n in range(REPS):
            t0 = time.monotonic()
            s, i, c = site.persistent(f"bench{n}", 2 << 30)
            a = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]})
            wait_until(lambda: mounted(a["mount"]))
            create.append(time.monotonic() - t0)
            with open(os.path.join(d, "agent", f"activation-{a['id']}.json")) as f:
                descs.append(f.read())
            t0 = time.monotonic()
            site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
            wait_until(lambda: not mounted(a["mount"])
                       and site.request("GET", f"/dw/v1/sessions/{s['id']}")[0] == 404)
            destroy.append(time.monotonic() - t0)
        # ---- the floor: mount and unmount an instance directly from its descriptor
        s, i, c = site.persistent("floor", 2 << 30)
        site.wait_state("configurations", c["id"])
        a = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]})
        site.wait_state("activations", a["id"])
        desc = os.path.join(d, "agent", f"activation-{a['id']}.json")
        mnt = os.path.join(d, "floor-mnt")
        os.makedirs(mnt, exist_ok=True)
        fmount, fumount = [], []
        for n in range(REPS):
            t0 = time.monotonic()
            subprocess.run([os.path.join(BIN, "spillway"), "mount", "--instance", desc, mnt,
                            "--log", os.path.join(d, "logs", "floor.log")], check=True)
            fmount.append(time.monotonic() - t0)
            t0 = time.monotonic()
            subprocess.run([os.path.join(BIN, "spillway"), "umount", mnt], check=True)
            wait_until(lambda: not mounted(mnt))
            fumount.append(time.monotonic() - t0)
        verdicts.append(row("create-to-mounted", ms(statistics.median(fmount)), ms(statistics.median(create)), 1000))
        verdicts.append(row("destroy (unmounted, gone)", ms(statistics.median(fumount)), ms(statistics.median(destroy)), None))
        # ---- dwstat sessions with SESSIONS sessions
        for n in range(SESSIONS):
            site.api("POST", "/dw/v1/sessions", {"token": f"{100000 + n}", "owner": 1000 + n % 50,
                                                 "client_nodes": [f"nid{n % 64:05d}"]})
        dwstat = shutil.which("dwstat") or os.path.join(BIN, "dwstat")
        env = dict(os.environ, SPILLWAY_CONFIG=site.config)
        out = subprocess.run([dwstat, "sessions"], env=env, capture_output=True, text=True, check=True).stdout
        assert len(out.splitlines()) >= SESSIONS + 1, out[:500]
        tdw, tsql = [], []
        db = os.path.join(d, "manager", "manager.db")
        for n in range(REPS):
            t0 = time.monotonic()
            subprocess.run([dwstat, "sessions"], env=env, stdout=subprocess.DEVNULL, check=True)
            tdw.append(time.monotonic() - t0)
            t0 = time.monotonic()
            subprocess.run(["sqlite3", db, "SELECT * FROM sessions"], stdout=subprocess.DEVNULL, check=True)
            tsql.append(time.monotonic() - t0)
        verdicts.append(row(f"dwstat sessions ({SESSIONS})", ms(statistics.median(tsql)), ms(statistics.median(tdw)), 100))
    finally:
        site.down()
        shutil.rmtree(d, ignore_errors=True)
    return 2 if "FAIL" in verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
