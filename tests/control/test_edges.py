"""Issue 15, item 5: sizes and edges users trip over, with real processes.

* One size parser: `G`/`GiB` are 2^30 and `GB` 10^9 for `spillway cluster up`,
  `spillway local up` and `spillway setstripe` alike (docs/cli.md, "Sizes").
* A job asking for more than its pool holds in total is refused at submit by
  `dw_wlm_cli --function job_process` (exit 1, a message naming the line and the pool)
  and by `spillway run` (nothing created), as is a `#BB create_persistent` too big for
  any pool; one that fits is accepted.
* `datawarp.h` compiles alone (gcc -std=c99 -Wall -Werror, and g++), giving off_t,
  size_t and ssize_t as Cray's does.
* `dw_wait_file_stage` on the stage-in of a 2.5 GiB file, under a SIGALRM every 50 ms:
  the handler runs at (about) every alarm and the wait restarts (returns 0 once the
  stage is done, never -EINTR); a SIGKILLed waiter is gone within 0.5 s.
* `spillway stripes FILE | head -1` (16,384 rows) ends quietly: no panic text.
* `spillway cluster down` with a process holding an unflushed file open on the mount
  fails at once naming the process and stops nothing; `--force` flushes the file and
  takes the cluster down (the data is there after `cluster up` again).
* `spillway run` rides out a manager restart during the job: its post-run finds the
  manager down, retries with backoff, and the job (its stage-in checked by the script)
  completes and is torn down.
* A failed stage names its instance path as the script wrote it
  (`$DW_JOB_STRIPED/...`), not as an instance path (`/...`)."""

import json
import os
import re
import subprocess
import tempfile
import threading
import time

import pytest

import spwhelpers as H
from sitehelpers import running_site

pytestmark = pytest.mark.spillway_only

GB = 10**9
GiB = 1 << 30
NODE = "compute0"
REPO = H.REPO


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def site(spillway_bin, munged, _local_base, users):
    """2 servers of 3GB each (3 * 10^9 bytes), granularity 1GB: a pool of 6 * 10^9."""
    with running_site(spillway_bin, _local_base, munged, prefix="edges-", pfs_users=users, servers=2,
                      server_capacity="3GB", granularity="1GB", node=NODE) as s:
        yield s


@pytest.fixture(scope="module")
def wlm(spillway_bin, site):
    exe = os.path.join(os.path.dirname(spillway_bin), "dw_wlm_cli")
    env = dict(os.environ, SPILLWAY_CONFIG=site.config)

    def call(*args):
        r = subprocess.run([exe, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env=env, timeout=60)
        return r.returncode, r.stdout

    return call


def script_file(dirname, text):
    fd, p = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=dirname)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(p, 0o644)
    return p


def run_job(site, spillway_bin, user, path, cwd, timeout=240):
    env = dict(os.environ, SPILLWAY_CONFIG=site.config)
    return subprocess.run([spillway_bin, "run", "--user", user.name, "--nodes", NODE, "--chdir", cwd,
                           path], capture_output=True, text=True, env=env, timeout=timeout)


def user_dir(site, user, name):
    d = os.path.join(site.pfs, user.name, name)
    os.makedirs(d)
    os.chown(d, user.uid, user.gid)
    return d


# ------------------------------------------------------------------ sizes
def test_sizes_are_read_alike_by_local_up_cluster_up_and_setstripe(site, clusters):
    # local up --server-capacity 3GB --granularity 1GB: decimal units.
    nodes = site.api("GET", "/dw/v1/nodes")["nodes"]
    assert sorted(n["capacity"] for n in nodes) == [3 * GB, 3 * GB], nodes
    pools = site.api("GET", "/dw/v1/pools")["pools"]
    assert pools[0]["granularity"] == GB and pools[0]["quantity"] == 6, pools
    # cluster up --capacity 4GB --stripe-size 1024KB: the same meaning.
    c = clusters(servers=2, capacity="4GB", stripe_size="1024KB")
    with open(os.path.join(c.dir, "cluster.json")) as f:
        st = json.load(f)
    assert st["capacity"] == 4 * GB, st
    assert st["stripe_size"] == 1_024_000, st
    # G and GiB are binary everywhere.
    c2 = clusters(servers=1, capacity="1G", stripe_size="64K")
    with open(os.path.join(c2.dir, "cluster.json")) as f:
        st2 = json.load(f)
    assert (st2["capacity"], st2["stripe_size"]) == (GiB, 64 << 10), st2
    # setstripe --size 4096KB is 4,096,000 bytes (a multiple of 4 KiB), 64K is 65,536.
    for size, want in (("4096KB", 4_096_000), ("64K", 65536), ("1MiB", 1 << 20)):
        p = os.path.join(c.mnt, f"striped-{size}")
        open(p, "wb").close()
        r = subprocess.run([c.binary, "setstripe", p, "--size", size], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert int(os.getxattr(p, "user.spillway.stripe_size")) == want, size
    # What no tool accepts, each says why, naming the option.
    p = os.path.join(c.mnt, "striped-bad")
    open(p, "wb").close()
    for bad, why in (("1.5M", "decimal"), ("4X", "unknown size unit"), ("-4K", "not a size")):
        r = subprocess.run([c.binary, "setstripe", p, f"--size={bad}"], capture_output=True, text=True)
        assert r.returncode != 0 and "--size" in r.stderr and why in r.stderr, (bad, r.stderr)


# ------------------------------------------------------------------ impossible requests
def test_job_process_refuses_more_than_the_pool_holds(site, wlm, spillway_bin, user, _local_base):
    d = tempfile.mkdtemp(dir=_local_base)
    os.chmod(d, 0o755)
    big = script_file(d, "#!/bin/bash\n#SBATCH -N 1\n#DW jobdw type=scratch capacity=7GB pool=wlm_pool\nhostname\n")
    rc, out = wlm("--function", "job_process", "--job", big)
    assert rc == 1, out
    assert "line 3: #DW jobdw: capacity" in out and "more than pool wlm_pool holds in total" in out, out
    assert "6000000000" in out or "5.59GiB" in out, out
    # 6GiB = 6.44 * 10^9 bytes: more than 6GB; 6GB itself fits, and so does 5GiB.
    rc, out = wlm("--function", "job_process", "--job",
                  script_file(d, "#!/bin/bash\n#DW jobdw capacity=6GiB\n"))
    assert rc == 1 and "more than any pool holds" in out, out
    for ok in ("6GB", "5GiB", "1GiB"):
        rc, out = wlm("--function", "job_process", "--job",
                      script_file(d, f"#!/bin/bash\n#DW jobdw capacity={ok} pool=wlm_pool\n"))
        assert rc == 0 and out == "", (ok, out)
    # A persistent create bigger than the pool; a pool that does not exist.
    rc, out = wlm("--function", "job_process", "--job",
                  script_file(d, "#!/bin/bash\n#BB create_persistent name=huge capacity=10TB access=striped type=scratch\n"))
    assert rc == 1 and "#BB create_persistent name=huge" in out, out
    rc, out = wlm("--function", "job_process", "--job",
                  script_file(d, "#!/bin/bash\n#DW jobdw capacity=1GiB pool=nosuch\n"))
    assert rc == 1 and "no such pool (pools: wlm_pool)" in out, out
    # spillway run refuses it before creating anything.
    r = run_job(site, spillway_bin, user, big, d)
    assert r.returncode != 0
    assert "more than pool wlm_pool holds in total" in r.stderr, r.stdout + r.stderr
    assert "==> setup" not in r.stdout, r.stdout
    assert site.api("GET", "/dw/v1/sessions")["sessions"] == []


# ------------------------------------------------------------------ datawarp.h
ALONE = r"""
#include <datawarp.h>
static int use(off_t o, size_t s, ssize_t z, uint64_t k) { return (int)(o + (off_t)s + z + (ssize_t)k); }
int main(void) { (void)dw_wait_file_stage; return use(0, 0, 0, 0); }
"""


def test_datawarp_h_compiles_alone(tmp_path):
    src = tmp_path / "alone.c"
    src.write_text(ALONE)
    inc = os.path.join(REPO, "libdatawarp")
    for argv in (["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror"], ["g++", "-Wall", "-Werror", "-x", "c++"]):
        r = subprocess.run([*argv, "-I", inc, "-c", str(src), "-o", str(tmp_path / "alone.o")],
                           capture_output=True, text=True)
        assert r.returncode == 0, f"{argv[0]}: {r.stderr}"


# ------------------------------------------------------------------ dw_wait and signals
WAITER = r"""
#define _GNU_SOURCE
#include <datawarp.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static volatile sig_atomic_t alarms;
static void on_alarm(int s) { (void)s; alarms++; }

static double now(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    int r;
    if (argc == 4 && strcmp(argv[1], "in") == 0) {
        r = dw_stage_file_in(argv[2], argv[3]);
        printf("stage rc=%d\n", r);
        return r != 0;
    }
    if (argc == 3 && strcmp(argv[1], "alarm") == 0) {
        struct sigaction sa; struct itimerval it; double t0, t1;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_alarm;  /* no SA_RESTART: the library must restart by itself */
        sigaction(SIGALRM, &sa, NULL);
        memset(&it, 0, sizeof it);
        it.it_interval.tv_usec = it.it_value.tv_usec = 50000;
        setitimer(ITIMER_REAL, &it, NULL);
        t0 = now();
        r = dw_wait_file_stage(argv[2]);
        t1 = now();
        memset(&it, 0, sizeof it);
        setitimer(ITIMER_REAL, &it, NULL);
        printf("wait rc=%d alarms=%d elapsed=%.3f\n", r, (int)alarms, t1 - t0);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "plain") == 0) {
        printf("waiting\n");
        fflush(stdout);
        r = dw_wait_file_stage(argv[2]);
        printf("wait rc=%d\n", r);
        return 0;
    }
    return 2;
}
"""


@pytest.fixture(scope="module")
def waiter(_local_base):
    """The waiter program, built against this checkout's libdatawarp (built here)."""
    d = tempfile.mkdtemp(prefix="dwedge-", dir=_local_base)
    os.chmod(d, 0o755)
    lib = os.path.join(d, "libdatawarp.so.1")
    r = subprocess.run(["gcc", "-std=c99", "-O2", "-fPIC", "-shared", "-Wl,-soname,libdatawarp.so.1",
                        "-o", lib, os.path.join(REPO, "libdatawarp", "datawarp.c"), "-pthread"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    os.symlink("libdatawarp.so.1", os.path.join(d, "libdatawarp.so"))
    src = os.path.join(d, "waiter.c")
    with open(src, "w") as f:
        f.write(WAITER)
    exe = os.path.join(d, "waiter")
    r = subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", "-I", os.path.join(REPO, "libdatawarp"),
                        "-o", exe, src, "-L", d, "-ldatawarp", f"-Wl,-rpath,{d}"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return exe


def _as(user):
    def drop():
        os.setgroups([user.gid])
        os.setgid(user.gid)
        os.setuid(user.uid)
    return drop


def test_dw_wait_lets_signals_through_and_dies_at_once(site, waiter, user):
    s, i, c = site.persistent("edgewait", 3 * GB, owner=user.uid)
    a = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]})
    site.wait_state("activations", a["id"], timeout=60)
    mnt = a["mount"]
    src = os.path.join(user_dir(site, user, "wait"), "big")
    with open(src, "wb") as f:
        f.truncate(5 << 29)  # 2.5 GiB: a stage of a few seconds
    os.chown(src, user.uid, user.gid)
    dst = os.path.join(mnt, "big")
    try:
        r = subprocess.run([waiter, "in", dst, src], capture_output=True, text=True, preexec_fn=_as(user),
                           timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        alarm = subprocess.Popen([waiter, "alarm", dst], stdout=subprocess.PIPE, text=True,
                                 preexec_fn=_as(user))
        plain = subprocess.Popen([waiter, "plain", dst], stdout=subprocess.PIPE, text=True,
                                 preexec_fn=_as(user))
        assert plain.stdout.readline().strip() == "waiting"
        time.sleep(0.8)
        assert plain.poll() is None, "the stage is pending: the waiter must still wait"
        t0 = time.monotonic()
        plain.kill()
        plain.wait(timeout=30)
        killed_after = time.monotonic() - t0
        out, _ = alarm.communicate(timeout=300)
        assert killed_after < 0.5, f"a SIGKILLed waiter took {killed_after:.2f} s to die"
        m = re.search(r"wait rc=(-?\d+) alarms=(\d+) elapsed=([\d.]+)", out)
        assert m, out
        rc, alarms, elapsed = int(m.group(1)), int(m.group(2)), float(m.group(3))
        assert rc == 0, f"dw_wait_file_stage restarts after signals (DataWarp: signals do not interrupt it): {out}"
        assert elapsed > 1.0, f"the stage ended too soon to judge: {out}"
        # One alarm each 50 ms; handlers run while the library sleeps between polls.
        assert alarms >= 0.6 * elapsed / 0.05, f"only {alarms} SIGALRMs delivered in {elapsed:.2f} s"
    finally:
        site.request("DELETE", f"/dw/v1/sessions/{s['id']}?hurry=true")
        site.wait_gone("sessions", s["id"], timeout=60)


# ------------------------------------------------------------------ broken pipes
def test_stripes_into_head_ends_quietly(clusters):
    c = clusters(servers=1, capacity="1G", stripe_size="64K")
    p = os.path.join(c.mnt, "sparse")
    with open(p, "wb") as f:
        f.truncate(1 << 30)  # 16,384 stripes of 64 KiB: far more than a pipe holds
    for argv in ([c.binary, "stripes", p], [c.binary, "stripes", p, "--json"],
                 [c.binary, "cluster", "status", "--dir", c.dir]):
        r = subprocess.run(f"{' '.join(argv)} | head -c 20", shell=True, capture_output=True, text=True,
                           timeout=60)
        assert "panic" not in r.stderr and "Broken pipe" not in r.stderr, (argv, r.stderr)
        assert r.stdout, argv


def test_dwstat_and_dwcli_into_head_end_quietly(site, spillway_bin):
    bindir = os.path.dirname(spillway_bin)
    env = dict(os.environ, SPILLWAY_CONFIG=site.config)
    for argv in (["dwstat", "most"], ["dwcli", "ls", "nodes"], ["dw_wlm_cli", "--function", "pools"]):
        r = subprocess.run(f"{os.path.join(bindir, argv[0])} {' '.join(argv[1:])} | head -c 1",
                           shell=True, capture_output=True, text=True, env=env, timeout=60)
        assert "panic" not in r.stderr, (argv, r.stderr)


# ------------------------------------------------------------------ cluster down, busy
HOLDER = r"""
import os, sys, time
fd = os.open(os.environ["HELD"], os.O_WRONLY | os.O_CREAT, 0o644)
data = bytes(range(256)) * 4096 * 4          # 4 MiB, never fsync'ed nor closed
os.write(fd, data)
print("written", flush=True)
time.sleep(600)
"""


def test_cluster_down_with_a_busy_mount_fails_naming_the_holder(spillway_bin):
    c = H.Cluster(spillway_bin, "edges-busy", servers=1, capacity="256M")
    holder = None
    try:
        c.up()
        held = os.path.join(c.mnt, "held.bin")
        holder = subprocess.Popen(["python3", "-c", HOLDER], stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, HELD=held))
        assert holder.stdout.readline().strip() == "written"
        t0 = time.monotonic()
        r = c.down(check=False)
        took = time.monotonic() - t0
        assert r.returncode != 0, "cluster down must refuse a busy mount"
        assert f"pid {holder.pid} (python3)" in r.stderr and "held.bin" in r.stderr, r.stderr
        assert "--force" in r.stderr, r.stderr
        assert took < 5, f"cluster down took {took:.1f} s"
        assert H.is_mounted(c.mnt) and holder.poll() is None, "nothing was stopped"
        # --force flushes what the holder wrote, then takes everything down, fast.
        t0 = time.monotonic()
        r = c.down(check=False, extra=["--force", "--keep-data"])
        took = time.monotonic() - t0
        assert r.returncode == 0, r.stderr
        assert str(holder.pid) in r.stderr and "flushed" in r.stderr, r.stderr
        assert took < 10, f"cluster down --force took {took:.1f} s"
        holder.kill()
        holder.wait()
        mounts, pids = c.leftovers()
        assert not mounts and not pids, (mounts, pids)
        c.up()
        with open(held, "rb") as f:
            assert f.read() == bytes(range(256)) * 4096 * 4, "the holder's writes were flushed"
    finally:
        if holder and holder.poll() is None:
            holder.kill()
            holder.wait()
        c.teardown()


def test_cluster_up_tunables_reach_servers_and_mount_and_typos_fail_first(spillway_bin, tmp_path):
    """`spillway cluster up --tunables FILE`: a typo in the file fails `up` naming the
    line, with nothing started; a good file is handed to every server and the mount
    (and kept for a later `up`), and the instance works under it."""
    bad = tmp_path / "bad.tunables"
    bad.write_text("direct_write_min = 0\nmax_readahed = 65536\n")
    c = H.Cluster(spillway_bin, "edges-tun", servers=2, capacity="256M")
    try:
        r = H.run_cli(spillway_bin, c.up_args() + ["--tunables", str(bad)], check=False)
        assert r.returncode != 0 and "line 2" in r.stderr and "max_readahed" in r.stderr, r.stderr
        mounts, pids = c.leftovers()
        assert not mounts and not pids, (mounts, pids)
        good = tmp_path / "good.tunables"
        good.write_text("direct_write_min = 0  # every write buffered\nmax_readahead = 65536\n")
        c.up(extra=["--tunables", str(good)])
        def with_tunables():
            found = []
            for pid in H.pids_mentioning(c.dir):
                try:
                    argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
                except OSError:
                    continue
                if b"--tunables" in argv:
                    found.append((argv[1].decode(), argv[argv.index(b"--tunables") + 1].decode()))
            return found
        found = with_tunables()
        assert sorted(k for k, _ in found) == ["mount", "server", "server"], found
        assert all(v == str(good) for _, v in found), found
        data = os.urandom(3 << 20)
        H.write_file(os.path.join(c.mnt, "t.bin"), data, fsync=True)
        assert H.read_file(os.path.join(c.mnt, "t.bin")) == data
        # Kept across a down --keep-data and up.
        c.down(extra=["--keep-data"])
        c.up()
        found = with_tunables()
        assert sorted(k for k, _ in found) == ["mount", "server", "server"], found
        assert H.read_file(os.path.join(c.mnt, "t.bin")) == data
    finally:
        c.teardown()


# ------------------------------------------------------------------ spillway run, manager restart
def test_spillway_run_rides_out_a_manager_restart(site, spillway_bin, user):
    base = user_dir(site, user, "restart")
    with open(os.path.join(base, "in.dat"), "wb") as f:
        f.write(os.urandom(1 << 20))
    os.chown(os.path.join(base, "in.dat"), user.uid, user.gid)
    marker = os.path.join(base, "running")
    path = script_file(base, f"""#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GB pool=wlm_pool
#DW stage_in type=file source={base}/in.dat destination=$DW_JOB_STRIPED/in.dat
set -e
cmp $DW_JOB_STRIPED/in.dat {base}/in.dat
touch {marker}
sleep 3
""")
    restarted = {}

    def bounce():
        deadline = time.monotonic() + 120
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        site.kill("manager")
        restarted["killed"] = time.monotonic()
        time.sleep(6)  # the script ends meanwhile: post-run finds the manager down
        site.start("manager")
        restarted["started"] = time.monotonic()

    t = threading.Thread(target=bounce)
    t.start()
    try:
        r = run_job(site, spillway_bin, user, path, base)
    finally:
        t.join()
    assert "started" in restarted
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the manager did not answer" in r.stdout, r.stdout
    assert "==> teardown" in r.stdout and "torn down" in r.stdout, r.stdout
    assert site.api("GET", "/dw/v1/sessions")["sessions"] == []


def test_a_failed_stage_names_the_path_as_the_script_wrote_it(site, spillway_bin, user):
    base = user_dir(site, user, "named")
    path = script_file(base, f"""#!/bin/bash
#DW jobdw type=scratch capacity=1GB pool=wlm_pool
#DW stage_out type=file source=$DW_JOB_STRIPED/never-written.dat destination={base}/out.dat
true
""")
    r = run_job(site, spillway_bin, user, path, base)
    text = r.stdout + r.stderr
    assert r.returncode != 0, text
    assert "$DW_JOB_STRIPED/never-written.dat" in text, text
    assert not re.search(r"(?<![\w$}])/never-written\.dat", text.replace(f"{base}/", "")), text
    # What run left for the user to settle (the failed stage-out keeps the session).
    for sess in site.api("GET", "/dw/v1/sessions")["sessions"]:
        site.request("DELETE", f"/dw/v1/sessions/{sess['id']}?hurry=true")
        site.wait_gone("sessions", sess["id"], timeout=60)
