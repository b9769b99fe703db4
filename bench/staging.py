"""Staging throughput on a local site (manager, 2 servers; real HTTPS, MUNGE, SQLite),
against `cp -a` of the same data on this machine, measured in the same run.

  large file   one file of BENCH_STAGE_BIG_MIB (4096) MiB
  small files  BENCH_STAGE_FILES (5000) files of 64 KiB in one directory

Each copy starts with the page cache dropped (the source is read from the disk) and
ends when the data is durable:

  cp -a       `cp -a SRC DST` followed by `sync -f DST` (a copy that is not on the disk
              has not done what a stage does: every stage fsyncs its destination
              before it counts as complete). The time without the sync is printed too.
  stage       POST /dw/v1/stages, then GET /dw/v1/stages/{id}?wait= until it ends.

The ratio is cp's time over the stage's (above 1: the stage is faster); the median of
BENCH_REPS (3) runs of each. The copies are checked byte for byte afterwards.
Prints one line per figure and, with BENCH_RESULTS set, appends rows for bench/all.sh.
"""

import filecmp
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

REPS = int(os.environ.get("BENCH_REPS", "3"))
BIG_MIB = int(os.environ.get("BENCH_STAGE_BIG_MIB", "4096"))
FILES = int(os.environ.get("BENCH_STAGE_FILES", "5000"))
BIN = os.path.join(HERE, "..", "target", "release")


class SystemMunge:
    socket = os.environ.get("BENCH_MUNGE_SOCKET", "/run/munge/munge.socket.2")

    def munge(self, as_user=None):
        return subprocess.run(["munge", "-n", "--socket", self.socket], check=True,
                              capture_output=True, text=True).stdout.strip()


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def cp_a(src, dst):
    """(seconds of cp -a, seconds of cp -a + sync -f), from a cold cache."""
    if os.path.lexists(dst):
        shutil.rmtree(dst) if os.path.isdir(dst) and not os.path.islink(dst) else os.unlink(dst)
    drop_caches()
    t0 = time.monotonic()
    subprocess.run(["cp", "-a", src, dst], check=True)
    plain = time.monotonic() - t0
    subprocess.run(["sync", "-f", dst], check=True)
    return plain, time.monotonic() - t0


def stage(site, instance, direction, kind, source, destination):
    """Seconds from the POST to the stage's end (which must be `complete`)."""
    drop_caches()
    t0 = time.monotonic()
    s = site.api("POST", "/dw/v1/stages", {"instance": instance, "direction": direction,
                                           "type": kind, "source": source,
                                           "destination": destination})
    while s["state"] not in ("complete", "failed", "terminated", "revoked", "dropped"):
        s = site.api("GET", f"/dw/v1/stages/{s['id']}?wait=30")
    took = time.monotonic() - t0
    if s["state"] != "complete":
        raise RuntimeError(f"stage {s['id']} ended {s['state']}: {s.get('error')}")
    return took


def same_tree(a, b):
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.diff_files or cmp.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    return not mismatch and not errors


def row(figure, cp_plain, cp_sync, sw, target):
    ratio = cp_sync / sw
    verdict = "PASS" if ratio >= target else "FAIL"
    print(f"{figure:<34} cp -a {cp_plain:.2f} s (+sync {cp_sync:.2f} s) | stage {sw:.2f} s | "
          f"ratio {ratio:.2f}x (vs cp without sync {cp_plain / sw:.2f}x) | target >= {target:g}x {verdict}")
    out = os.environ.get("BENCH_RESULTS")
    if out:
        with open(out, "a") as f:
            f.write(f"{figure}\ts\t{cp_sync:.2f}\t{sw:.2f}\t{ratio:.2f}\t{target:g}\t{verdict}\n")
    return verdict


def main():
    work = os.environ.get("BENCH_WORK", "/var/tmp/spillway-bench")
    os.makedirs(work, exist_ok=True)
    d = tempfile.mkdtemp(prefix="stage-", dir=work)
    os.chmod(d, 0o755)
    pfs = os.path.join(d, "pfs")
    os.makedirs(pfs)
    site = LocalSite(os.path.join(BIN, "spillway"), os.path.join(d, "site"), SystemMunge(),
                     servers=2, server_capacity="64GiB", granularity="1GiB", node="benchnode",
                     pfs_roots=[pfs])
    verdicts = []
    try:
        # ---- the data, on the PFS
        big = os.path.join(pfs, "big.bin")
        chunk = os.urandom(8 << 20)
        with open(big, "wb") as f:
            for _ in range(BIG_MIB // 8):
                f.write(chunk)
        # The files sit in smallset/small: a directory stage of smallset into the
        # instance root makes /small there (a directory stage copies into a directory
        # that exists, and the root is the one an instance starts with). Each run
        # renames it first (small0, small1, ...), so every stage-in makes a new
        # directory, as every cp -a does.
        smallset = os.path.join(pfs, "smallset")
        small = os.path.join(smallset, "small")
        os.makedirs(small)
        for n in range(FILES):
            with open(os.path.join(small, f"f{n:05d}"), "wb") as f:
                f.write(os.urandom(64 << 10))
        subprocess.run(["sync"], check=True)
        site.up()
        size = max(16 << 30, 2 * (BIG_MIB << 20) + 2 * FILES * (64 << 10))
        s, i, c = site.persistent("stagebench", size)
        site.wait_state("instances", i["id"], timeout=60)
        inst = i["id"]

        results = {k: [] for k in ("big_cp", "big_cps", "big_in", "big_out",
                                   "small_cp", "small_cps", "small_in", "small_out")}
        for rep in range(REPS):
            p, ps = cp_a(big, os.path.join(pfs, "cp-big.bin"))
            results["big_cp"].append(p)
            results["big_cps"].append(ps)
            results["big_in"].append(stage(site, inst, "in", "file", big, f"/big{rep}.bin"))
            out = os.path.join(pfs, f"out-big{rep}.bin")
            results["big_out"].append(stage(site, inst, "out", "file", f"/big{rep}.bin", out))
            if not filecmp.cmp(big, out, shallow=False):
                raise RuntimeError("the large file came back different")
            os.unlink(out)

            # A fresh destination each time, as cp -a's: the set's directory is renamed
            # (instantly) so that each stage-in makes a new directory in the instance.
            fresh = os.path.join(smallset, f"small{rep}")
            os.rename(small, fresh)
            small = fresh
            p, ps = cp_a(small, os.path.join(pfs, "cp-small"))
            results["small_cp"].append(p)
            results["small_cps"].append(ps)
            results["small_in"].append(stage(site, inst, "in", "directory", smallset, "/"))
            out = os.path.join(pfs, f"out-small{rep}")
            os.makedirs(out)
            results["small_out"].append(stage(site, inst, "out", "directory", f"/small{rep}", out))
            if not same_tree(small, out):
                raise RuntimeError("the small files came back different")
            shutil.rmtree(out)
            print(f"run {rep + 1}: " + "  ".join(f"{k} {v[-1]:.2f}" for k, v in results.items()),
                  file=sys.stderr, flush=True)
        m = {k: statistics.median(v) for k, v in results.items()}
        verdicts.append(row(f"stage in, 1 x {BIG_MIB} MiB", m["big_cp"], m["big_cps"], m["big_in"], 1.0))
        verdicts.append(row(f"stage out, 1 x {BIG_MIB} MiB", m["big_cp"], m["big_cps"], m["big_out"], 1.0))
        verdicts.append(row(f"stage in, {FILES} x 64 KiB", m["small_cp"], m["small_cps"], m["small_in"], 1.5))
        verdicts.append(row(f"stage out, {FILES} x 64 KiB", m["small_cp"], m["small_cps"], m["small_out"], 1.5))
    finally:
        site.down()
        shutil.rmtree(d, ignore_errors=True)
    return 2 if "FAIL" in verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
