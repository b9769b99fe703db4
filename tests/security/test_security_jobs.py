"""Security of the job tools (issue 14, items 3, 4 and the job tools' part of 6), each
attack made by a real unprivileged user against a real local site (`spillway local up`)
and, for dw_wlm_cli's owner check, a real slurmctld (tests/harness/slurm.py).

* `spillway run` run by root for spwtest: while the job starts, spwtest races (inotify,
  bounded) to swap the job's private directory and plant `script` as a symlink to a
  root-only file: that file stays root's, mode and content unchanged.
* A job script that is a symlink to a root-only file, or a root-only 0600 script: refused,
  the content never reaches the job or the output.
* `#BB destroy_persistent name=<spwtest2's instance>` in spwtest's job: refused through
  `spillway run` (also with `--token <that name>`) and through `dw_wlm_cli teardown` with
  Slurm's argv for a real pending job of spwtest; spwtest2's instance and its data
  survive; a `create_persistent` of the same name for spwtest is refused; spwtest2's own
  destroy still works.
* `dw_wlm_cli --job /dev/zero`, a FIFO, node lists from devices, 10 MB values: refused at
  once with a short message, in bounded memory (under a 256 MiB address-space cap).
"""

import ctypes
import os
import resource
import select
import shutil
import stat
import struct
import subprocess
import tempfile
import threading
import time

import pytest

from sitehelpers import running_site

NODE = "compute0"
SECRET = "spillway-secret-7f3c9a"


@pytest.fixture(scope="module")
def site(spillway_bin, munged, _local_base, pfs):
    with running_site(spillway_bin, _local_base, munged, servers=2, pfs_roots=[pfs], node=NODE) as s:
        yield s


def wlm_exe(spillway_bin):
    return os.path.join(os.path.dirname(spillway_bin), "dw_wlm_cli")


def wlm(spillway_bin, site, *args, env=None):
    e = dict(env or os.environ, SPILLWAY_CONFIG=site.config)
    r = subprocess.run([wlm_exe(spillway_bin), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env=e, timeout=300)
    return r.returncode, r.stdout


def run_job(site, spillway_bin, user, path, cwd, *extra, timeout=300):
    env = dict(os.environ, SPILLWAY_CONFIG=site.config)
    return subprocess.run([spillway_bin, "run", "--user", user.name, "--nodes", NODE, "--chdir", cwd,
                           *extra, path], capture_output=True, text=True, env=env, timeout=timeout)


def user_dir(pfs, user, name):
    d = os.path.join(pfs, name)
    os.makedirs(d)
    os.chown(d, user.uid, user.gid)
    return d


def write(path, text, mode=0o644, owner=None):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    if owner is not None:
        os.chown(path, owner.uid, owner.gid)
    return path


def root_secret(d, name="secret"):
    """A root-only 0600 file that is also a valid job script printing the secret."""
    return write(os.path.join(d, name), f"#!/bin/sh\necho {SECRET}\n", mode=0o600)


def intact(path, content):
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode), path
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600), \
        f"{path}: owner {st.st_uid}:{st.st_gid} mode {stat.S_IMODE(st.st_mode):o}"
    assert open(path).read() == content


# ------------------------------------------------------------------ item 3: spillway run

IN_CREATE = 0x100


def race_private_dirs(target, deadline, stop):
    """As the job's user: watch /tmp (and try /run/spillway-run) for `spillway run`'s
    private directories; when one appears and its `script` exists, swap the directory for
    one of ours holding `script` -> target (root then chowns the symlink's target if it
    acts by path). Returns (directories seen, swaps made)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    watched = {}
    for parent in ("/tmp", "/run/spillway-run"):
        wd = libc.inotify_add_watch(fd, parent.encode(), IN_CREATE)
        if wd >= 0:
            watched[wd] = parent
    seen = swaps = 0
    while time.monotonic() < deadline and not os.path.exists(stop):
        # The new parent is not listable by users; keep trying to reach into it.
        try:
            for name in os.listdir("/run/spillway-run"):
                d = os.path.join("/run/spillway-run", name)
                try:
                    os.rename(d, d + ".moved")
                except OSError:
                    pass
        except OSError:
            pass
        if not select.select([fd], [], [], 0.05)[0]:
            continue
        try:
            buf = os.read(fd, 65536)
        except BlockingIOError:
            continue
        i = 0
        while i + 16 <= len(buf):
            wd, mask, _cookie, n = struct.unpack_from("iIII", buf, i)
            name = buf[i + 16:i + 16 + n].rstrip(b"\0").decode(errors="replace")
            i += 16 + n
            parent = watched.get(wd)
            if parent is None or not (name.startswith("spillway-run-") or name.startswith("job-")):
                continue
            seen += 1
            d = os.path.join(parent, name)
            # Spin until root has made the script (the window before its chown).
            spin_end = time.monotonic() + 1.0
            while time.monotonic() < spin_end and not os.path.lexists(os.path.join(d, "script")):
                pass
            try:
                os.rename(d, d + ".moved")
                os.mkdir(d)
                os.symlink(target, os.path.join(d, "script"))
                swaps += 1
            except OSError:
                pass
    os.close(fd)
    return seen, swaps


@pytest.mark.timeout(120)
def test_the_private_dir_race_cannot_take_a_root_file(site, spillway_bin, pfs, user, as_user, _local_base):
    base = user_dir(pfs, user, "race")
    secret_dir = tempfile.mkdtemp(prefix="rootonly-", dir=_local_base)
    os.chmod(secret_dir, 0o755)
    target = root_secret(secret_dir)
    content = open(target).read()
    # A large script (under Slurm's 4 MiB) keeps root writing its copy for a while: the
    # widest window a path-based chown after the write would leave.
    job = write(os.path.join(base, "job.sh"),
                "#!/bin/sh\n" + ("# " + "x" * 998 + "\n") * 3500 + "exit 0\n", owner=user)
    stop = os.path.join(_local_base, "race-stop")
    deadline = time.monotonic() + 40
    result = {}

    def attack():
        result["r"] = as_user(user.uid, user.gid, race_private_dirs, target, deadline, stop)

    t = threading.Thread(target=attack)
    t.start()
    time.sleep(0.3)
    runs = 0
    try:
        # Bounded: at most 25 jobs or 25 s; stop at the first loss.
        end = time.monotonic() + 25
        while runs < 25 and time.monotonic() < end:
            r = run_job(site, spillway_bin, user, job, base, timeout=60)
            runs += 1
            if os.lstat(target).st_uid != 0:
                break
            assert r.returncode == 0, r.stdout + r.stderr
    finally:
        open(stop, "w").close()
        t.join()
        for name in os.listdir("/tmp"):
            if name.startswith("spillway-run-"):
                shutil.rmtree(os.path.join("/tmp", name), ignore_errors=True)
    intact(target, content)
    seen, swaps = result["r"]
    print(f"{runs} jobs; the attacker saw {seen} private directories and swapped {swaps}")
    assert swaps == 0, f"{swaps} swaps of a private directory in {runs} jobs ({seen} seen)"
    # The parent: root's, not writable by users, not a symlink; nothing left in it.
    st = os.lstat("/run/spillway-run")
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and st.st_mode & 0o022 == 0


def test_a_script_the_user_may_not_read_is_refused(site, spillway_bin, pfs, user, _local_base):
    base = user_dir(pfs, user, "unreadable")
    secret_dir = tempfile.mkdtemp(prefix="rootonly-", dir=_local_base)
    os.chmod(secret_dir, 0o755)
    target = root_secret(secret_dir)
    link = os.path.join(base, "job.sh")
    os.symlink(target, link)
    os.lchown(link, user.uid, user.gid)
    for script in (link, target):
        r = run_job(site, spillway_bin, user, script, base)
        out = r.stdout + r.stderr
        assert r.returncode != 0, out
        assert SECRET not in out, out
        assert "Permission denied" in out and user.name in out, out
        assert "==> setup" not in out, out
    # A device or a FIFO is no script: refused at once, nothing read.
    fifo = os.path.join(base, "fifo")
    os.mkfifo(fifo)
    os.chown(fifo, user.uid, user.gid)
    for script, why in (("/dev/zero", "is a device"), (fifo, "is a FIFO")):
        r = run_job(site, spillway_bin, user, script, base, timeout=20)
        assert r.returncode != 0 and why in r.stdout + r.stderr, r.stdout + r.stderr
    assert site.api("GET", "/dw/v1/sessions")["sessions"] == []


# ------------------------------------------------------------------ item 4: destroy

def persistent_with_data(site, spillway_bin, pfs, owner, name):
    """`name`, a persistent instance of `owner` (dw_wlm_cli create_persistent as Slurm
    runs it), holding a file written by a job of the owner."""
    code, out = wlm(spillway_bin, site, "--function", "create_persistent", "-c", "CLI", "-t", name,
                    "-u", str(owner.uid), "-C", "wlm_pool:1073741824", "-a", "striped", "-T", "scratch")
    assert code == 0 and "created" in out, out
    d = user_dir(pfs, owner, f"{name}-w")
    job = write(os.path.join(d, "w.sh"), f"""#!/bin/sh
#DW persistentdw name={name}
echo precious > $DW_PERSISTENT_STRIPED_{name}/data
""", owner=owner)
    r = run_job(site, spillway_bin, owner, job, d)
    assert r.returncode == 0, r.stdout + r.stderr


def data_of(site, spillway_bin, pfs, owner, name, tag):
    d = user_dir(pfs, owner, f"{name}-r{tag}")
    job = write(os.path.join(d, "r.sh"), f"""#!/bin/sh
#DW persistentdw name={name}
cat $DW_PERSISTENT_STRIPED_{name}/data
""", owner=owner)
    r = run_job(site, spillway_bin, owner, job, d)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def live(site, name):
    return [s for s in site.api("GET", "/dw/v1/sessions")["sessions"] if s["token"] == name]


@pytest.mark.timeout(240)
def test_only_the_owner_destroys_a_persistent_instance(site, spillway_bin, pfs, user, user2, slurm_site):
    name = "secpdb2"
    persistent_with_data(site, spillway_bin, pfs, user2, name)
    [s] = live(site, name)
    assert s["owner"] == user2.uid
    frags = len(site.api("GET", "/dw/v1/fragments")["fragments"])

    # spillway run, root running spwtest's job: the job's user is who acts.
    base = user_dir(pfs, user, "destroyer")
    job = write(os.path.join(base, "d.sh"), f"#!/bin/sh\n#BB destroy_persistent name={name}\necho ran\n",
                owner=user)
    r = run_job(site, spillway_bin, user, job, base)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "belongs to another user" in out, out
    refusal = [line for line in out.splitlines() if "belongs to another user" in line][0]
    assert f"uid {user2.uid}" not in refusal, "the owner is not revealed"
    # ... and naming it as the job's own token: setup refused, no teardown of it.
    plain = write(os.path.join(base, "p.sh"), "#!/bin/sh\necho ran\n", owner=user)
    r = run_job(site, spillway_bin, user, plain, base, "--token", name)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "another user's session" in out, out
    assert live(site, name) and live(site, name)[0]["state"]["goal"] == "create"

    # create_persistent of the same name for spwtest: refused (names are global).
    code, out = wlm(spillway_bin, site, "--function", "create_persistent", "-c", "CLI", "-t", name,
                    "-u", str(user.uid), "-C", "wlm_pool:1073741824")
    assert code != 0 and "taken by another user" in out, out

    # dw_wlm_cli with Slurm's argv for a real pending job of spwtest.
    env = slurm_site.env()
    jobdir = slurm_site.user_dir(user)
    jid = slurm_site.submit("#!/bin/sh\n#BB destroy_persistent name=" + name + "\ntrue\n", user.name,
                            "--hold", cwd=jobdir)
    script = os.path.join(slurm_site.state_dir, f"hash.{jid % 10}", f"job.{jid}", "script")
    assert os.path.exists(script)
    for extra in ([], ["--hurry"]):
        code, out = wlm(spillway_bin, site, "--function", "teardown", "--token", name, "--job", script,
                        *extra, env=env)
        assert code != 0 and "belongs to another user" in out, out
    slurm_site.cancel(jid)

    # Everything of spwtest2's is still there, data included.
    [s2] = live(site, name)
    assert s2["id"] == s["id"] and s2["state"]["goal"] == "create"
    assert len(site.api("GET", "/dw/v1/fragments")["fragments"]) == frags
    assert data_of(site, spillway_bin, pfs, user2, name, 1).count("precious") == 1

    # The owner's own destroy, through the same path: done.
    jid2 = slurm_site.submit("#!/bin/sh\ntrue\n", user2.name, "--hold", cwd=slurm_site.user_dir(user2))
    script2 = os.path.join(slurm_site.state_dir, f"hash.{jid2 % 10}", f"job.{jid2}", "script")
    code, out = wlm(spillway_bin, site, "--function", "teardown", "--token", name, "--job", script2, env=env)
    assert code == 0 and "torn down" in out, out
    slurm_site.cancel(jid2)
    assert live(site, name) == []


def test_a_setup_cannot_configure_another_users_persistent_cache(site, spillway_bin, pfs, user, user2):
    """A persistent cache made through Slurm gets its directory at the creating job's
    setup (docs/cache.md section 10, question 1). Another user's job naming the same
    instance in its own `#BB create_persistent ... type=cache pfs=` line must not give
    it a directory (the servers would open it as the instance's owner): the setup is
    refused and the instance stays without a configuration."""
    name = "secpc1"
    code, out = wlm(spillway_bin, site, "--function", "create_persistent", "-c", "CLI", "-t", name,
                    "-u", str(user2.uid), "-C", "wlm_pool:1073741824", "-a", "striped", "-T", "cache")
    assert code == 0 and "created" in out and "configuration is made at the job's setup" in out, out
    [owned] = live(site, name)
    try:
        d = user_dir(pfs, user, "secpc-mine")
        script = write(os.path.join(d, "j.sh"),
                       f"#!/bin/sh\n#BB create_persistent name={name} capacity=1GiB type=cache pfs={d}\n",
                       owner=user)
        code, out = wlm(spillway_bin, site, "--function", "setup", "--token", "7771", "--caller", "SLURM",
                        "--user", str(user.uid), "--groupid", str(user.gid), "--capacity", "wlm_pool:0",
                        "--job", script)
        assert code != 0 and "no persistent instance of this name and user" in out, out
        confs = site.api("GET", "/dw/v1/configurations")["configurations"]
        inst = site.api("GET", f"/dw/v1/instances/{owned['links']['instances'][0]}")
        assert inst["links"]["configurations"] == [], (inst, confs)
        assert live(site, name)[0]["id"] == owned["id"]
    finally:
        for s in site.api("GET", "/dw/v1/sessions")["sessions"]:
            if s["token"] in (name, "7771"):
                site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
                site.wait_gone("sessions", s["id"], timeout=90)


def test_an_owner_destroys_through_spillway_run(site, spillway_bin, pfs, user2):
    name = "secpdb3"
    persistent_with_data(site, spillway_bin, pfs, user2, name)
    d = user_dir(pfs, user2, "own-destroy")
    job = write(os.path.join(d, "d.sh"), f"#!/bin/sh\n#BB destroy_persistent name={name}\ntrue\n", owner=user2)
    r = run_job(site, spillway_bin, user2, job, d)
    assert r.returncode == 0, r.stdout + r.stderr
    assert live(site, name) == []


# ------------------------------------------------------------------ item 6: bounds

# The memory bound: an address-space cap under which a bounded reader works and an
# unbounded one (of /dev/zero, a 10 MB value) dies. Not ru_maxrss: the kernel carries
# the forking process's high-water mark across exec, so a child of a large pytest
# process shows pytest's RSS.
AS_CAP = 256 << 20


def run_bounded(argv, env, limit_s=20):
    """Run argv with an AS_CAP address-space cap, killed after limit_s; (exit status,
    output, seconds)."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (AS_CAP, AS_CAP))
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                         preexec_fn=cap)
    timer = threading.Timer(limit_s, p.kill)
    timer.start()
    out = p.stdout.read()
    _, status, _ = os.wait4(p.pid, 0)
    timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, out, time.monotonic() - t0


def test_dw_wlm_cli_inputs_are_bounded(site, spillway_bin, pfs, user):
    env = dict(os.environ, SPILLWAY_CONFIG=site.config)
    exe = wlm_exe(spillway_bin)
    d = user_dir(pfs, user, "bounds")
    fifo = os.path.join(d, "fifo")
    os.mkfifo(fifo)
    huge = "9" * (10 << 20)
    big_script = write(os.path.join(d, "big"), f"#!/bin/sh\n#DW jobdw capacity={huge}\n")
    long_line = write(os.path.join(d, "long"), f"#!/bin/sh\n#DW jobdw capacity={'9' * (3 << 20)}\n")
    ok_script = write(os.path.join(d, "ok"), "#!/bin/sh\n#DW jobdw capacity=1GiB\n")
    long_arg = "x" * (100 << 10)  # near Linux's limit on one argument (128 KiB)
    cases = [
        (["--function", "job_process", "--job", "/dev/zero"], "is a device"),
        (["--function", "job_process", "--job", fifo], "is a FIFO"),
        (["--function", "job_process", "--job", big_script], "larger than 4194304 bytes"),
        (["--function", "job_process", "--job", long_line], "longer than"),
        (["--function", "setup", "--token", "77", "--caller", "SLURM", "--user", str(user.uid),
          "--groupid", str(user.gid), "--capacity", "wlm_pool:1GiB", "--job", ok_script,
          "--nodehostnamefile", "/dev/zero"], "is a device"),
        (["--function", "setup", "--token", "77", "--caller", "SLURM", "--user", long_arg,
          "--groupid", "1", "--capacity", "wlm_pool:1GiB", "--job", ok_script], "is not a numeric id"),
        (["--function", "create_persistent", "-c", "CLI", "-t", "n", "-u", "1", "-C", "p:1", "-a", long_arg],
         "striped or ldbal"),
        (["--function", "job_process", "--job", ok_script, long_arg], "unknown option"),
        (["--function", long_arg], "invalid function"),
    ]
    for args, want in cases:
        code, out, secs = run_bounded([exe, *args], env)
        text = out.decode(errors="replace")
        assert code == 1, (args[:2], code, text[:500])
        assert want in text, (args[:2], text[:500])
        assert len(out) < 2000, (args[:2], len(out), text[:300])
        assert secs < 10, (args[:2], secs)
    assert site.api("GET", "/dw/v1/sessions")["sessions"] == []
