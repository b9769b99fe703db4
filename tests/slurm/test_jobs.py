"""Job scripts without Slurm (docs/jobs.md), with real processes: a local site
(`spillway local up --pfs-root ...`), `spillway run` and `dw_wlm_cli` called with
Slurm 22.05's exact argv, in the order Slurm calls them.

`spillway run`: a job staging a directory in, computing on it in the instance and
staging results out, as an unprivileged user: the results on the PFS with their
contents and ownership, every phase printed in order, nothing left behind; a bad
script refused with a message per wrong line and nothing created; a failing stage-in
ending in a hurried teardown.

`dw_wlm_cli`: the polls print one JSON object with integer numbers and nothing else;
setup makes the session visible at once; paths writes NAME=value/ lines; teardown is
idempotent; stage-outs registered at setup are run by a teardown without data_out,
and dropped (and said so) by one with --hurry; create_persistent, a job using the
persistent instance through persistentdw, and its teardown."""

import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from sitehelpers import LocalSite, running_site

NODE = "compute0"


@pytest.fixture(scope="module")
def site(spillway_bin, munged, _local_base, pfs):
    with running_site(spillway_bin, _local_base, munged, servers=2, pfs_roots=[pfs], node=NODE) as s:
        yield s


@pytest.fixture(scope="module")
def wlm(spillway_bin, site):
    """dw_wlm_cli with its argv after argv[0]; (exit status, output) with stdout and
    stderr merged, as Slurm reads them."""
    exe = os.path.join(os.path.dirname(spillway_bin), "dw_wlm_cli")
    env = dict(os.environ, SPILLWAY_CONFIG=site.config)

    def call(*args, check=None):
        r = subprocess.run([exe, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env=env, timeout=300)
        if check is not None:
            assert r.returncode == check, f"{args}: exit {r.returncode}: {r.stdout}"
        return r.returncode, r.stdout

    return call


def user_dir(pfs, user, name):
    d = os.path.join(pfs, name)
    os.makedirs(d)
    os.chown(d, user.uid, user.gid)
    return d


def write_tree(root, user, n=20):
    files = {}
    for i in range(n):
        rel = f"d{i % 3}/f{i}"
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        data = os.urandom(1000 + i * 3001)
        with open(p, "wb") as f:
            f.write(data)
        files[rel] = data
    for dirpath, dirs, fnames in os.walk(root):
        for x in dirs + fnames:
            os.chown(os.path.join(dirpath, x), user.uid, user.gid)
    return files


def run_job(site, spillway_bin, user, script_text, cwd, *extra):
    path = os.path.join(cwd, "job.sh")
    with open(path, "w") as f:
        f.write(script_text)
    env = dict(os.environ, SPILLWAY_CONFIG=site.config)
    return subprocess.run([spillway_bin, "run", "--user", user.name, "--nodes", NODE, "--chdir", cwd,
                           *extra, path], capture_output=True, text=True, env=env, timeout=300)


def nothing_left(site):
    assert site.api("GET", "/dw/v1/sessions")["sessions"] == []
    assert site.api("GET", "/dw/v1/activations")["activations"] == []
    assert site.api("GET", "/dw/v1/fragments")["fragments"] == []
    mounts = open("/proc/self/mounts").read()
    assert site.dir not in mounts, mounts


def test_spillway_run_stages_in_computes_and_stages_out(site, spillway_bin, pfs, user):
    base = user_dir(pfs, user, "run1")
    files = write_tree(os.path.join(base, "in"), user)
    script = f"""#!/bin/bash
#SBATCH -N 1
#DW jobdw type=scratch access_mode=striped capacity=1GiB pool=wlm_pool
#DW stage_in type=directory source={base}/in destination=$DW_JOB_STRIPED/in
set -e
echo "user=$(id -un) striped=$DW_JOB_STRIPED"
mkdir $DW_JOB_STRIPED/out
(cd $DW_JOB_STRIPED/in && find . -type f | LC_ALL=C sort | xargs sha256sum) > $DW_JOB_STRIPED/out/sums
echo done > $DW_JOB_STRIPED/out/status
#DW stage_out type=directory source=$DW_JOB_STRIPED/out destination={base}/out
"""
    r = run_job(site, spillway_bin, user, script, base)
    assert r.returncode == 0, r.stdout + r.stderr
    phases = re.findall(r"^==> (\S+)", r.stdout, re.M)
    assert phases == ["validate", "setup", "stage", "paths", "pre-run", "run", "post-run", "stage", "teardown"], r.stdout
    m = re.search(r"user=(\S+) striped=(\S+)", r.stdout)
    assert m and m.group(1) == user.name, r.stdout
    assert m.group(2).endswith("_striped_scratch/"), "DataWarp's trailing /"
    out = os.path.join(base, "out")
    sums = open(os.path.join(out, "sums")).read().splitlines()
    import hashlib
    want = [f"{hashlib.sha256(files[rel]).hexdigest()}  ./{rel}" for rel in sorted(files)]
    assert sums == want
    for p in (out, os.path.join(out, "sums"), os.path.join(out, "status")):
        st = os.stat(p)
        assert (st.st_uid, st.st_gid) == (user.uid, user.gid), p
    nothing_left(site)


def test_a_bad_script_is_refused_line_by_line_and_creates_nothing(site, spillway_bin, pfs, user):
    base = user_dir(pfs, user, "bad")
    script = """#!/bin/bash
#DW jobdw capacity=3.5TB
#DW stage_in type=file destination=$DW_JOB_STRIPED/x
#DW jobdw type=cache access_mode=private pfs=/x capacity=1GiB
#BB create_persistent name=1db capacity=1GiB
echo never
"""
    r = run_job(site, spillway_bin, user, script, base)
    assert r.returncode != 0
    err = r.stderr
    for line, what in [(2, "decimal"), (3, "missing source="), (4, "not possible on a cache"),
                       (5, "starts with a digit")]:
        assert re.search(rf"line {line}: .*{re.escape(what)}", err), err
    assert "never" not in r.stdout
    nothing_left(site)


def test_a_failing_stage_in_ends_in_a_hurried_teardown(site, spillway_bin, pfs, user):
    base = user_dir(pfs, user, "failin")
    script = f"""#!/bin/bash
#DW jobdw capacity=1GiB
#DW stage_in type=file source={base}/missing destination=$DW_JOB_STRIPED/x
echo never
"""
    r = run_job(site, spillway_bin, user, script, base)
    assert r.returncode != 0
    assert "line 3: stage_in" in r.stdout and "missing" in r.stdout, r.stdout
    assert "==> teardown" in r.stdout and "never" not in r.stdout
    nothing_left(site)


# --------------------------------------------------------------------- dw_wlm_cli


def test_polls_print_one_strict_json_object(wlm, site):
    for fn, key in [("pools", "pools"), ("show_instances", "instances"), ("show_sessions", "sessions"),
                    ("show_configurations", "configurations")]:
        status, out = wlm("--function", fn, check=0)
        doc = json.loads(out)
        assert list(doc) == [key], out
        assert "'" not in out
    pools = json.loads(wlm("--function", "pools")[1])["pools"]
    assert pools and all(type(p[k]) is int for p in pools for k in ("granularity", "quantity", "free"))


def job_files(pfs, user, name, text):
    d = user_dir(pfs, user, name)
    script = os.path.join(d, "script")
    with open(script, "w") as f:
        f.write(text + "\0")  # Slurm stores the script with its NUL
    return d, script


def test_the_datawarp_lifecycle_with_slurms_argv(wlm, site, pfs, user, as_user):
    token = "4242"
    d, script = job_files(pfs, user, "job4242", "")
    with open(os.path.join(d, "input"), "wb") as f:
        f.write(os.urandom(300_000))
    os.chown(os.path.join(d, "input"), user.uid, user.gid)
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N 1
#DW jobdw type=scratch access_mode=striped capacity=1GiB pool=wlm_pool
#DW stage_in type=file source={d}/input destination=$DW_JOB_STRIPED/input
#DW stage_out type=file source=$DW_JOB_STRIPED/output destination={d}/output
srun ./app
\0""")
    nodes = os.path.join(d, "client_nids")
    with open(nodes, "w") as f:
        f.write(f"{NODE}\n")
    pathfile = os.path.join(d, "path")

    wlm("--function", "job_process", "--job", script, check=0)
    wlm("--function", "setup", "--token", token, "--caller", "SLURM", "--user", str(user.uid),
        "--groupid", str(user.gid), "--capacity", "wlm_pool:1GiB", "--job", script,
        "--nodehostnamefile", nodes, check=0)
    # Visible to Slurm's next poll at once.
    sessions = json.loads(wlm("--function", "show_sessions", check=0)[1])["sessions"]
    mine = [s for s in sessions if s["token"] == token]
    assert len(mine) == 1 and mine[0]["owner"] == user.uid and type(mine[0]["id"]) is int
    assert mine[0]["created"] > 1_600_000_000
    wlm("--function", "data_in", "--token", token, "--job", script, check=0)
    status, out = wlm("--function", "real_size", "--token", token, check=0)
    assert json.loads(out) == {"token": token, "capacity": 1 << 30, "units": "bytes"}
    # Slurm's own order for paths: --job before --token.
    wlm("--function", "paths", "--job", script, "--token", token, "--pathfile", pathfile, check=0)
    lines = open(pathfile).read().split("\n")
    assert lines[-1] == "" and all(lines[:-1]), "no blank line"
    env = dict(line.split("=", 1) for line in lines[:-1])
    mnt = env["DW_JOB_STRIPED"]
    assert mnt.endswith("/")
    wlm("--function", "pre_run", "--token", token, "--job", script, "--nodehostnamefile", nodes, check=0)
    got = as_user(user.uid, user.gid, lambda: open(mnt + "input", "rb").read())
    assert got == open(os.path.join(d, "input"), "rb").read()
    as_user(user.uid, user.gid, lambda: open(mnt + "output", "w").write("result\n"))
    wlm("--function", "post_run", "--token", token, "--job", script, check=0)
    assert mnt.rstrip("/") not in open("/proc/self/mounts").read()
    wlm("--function", "data_out", "--token", token, "--job", script, check=0)
    assert open(os.path.join(d, "output")).read() == "result\n"
    assert os.stat(os.path.join(d, "output")).st_uid == user.uid
    wlm("--function", "teardown", "--token", token, "--job", script, check=0)
    nothing_left(site)
    # Repeated (Slurm retries teardown forever): still success.
    status, out = wlm("--function", "teardown", "--token", token, "--job", script, "--hurry", check=0)
    assert "token not found" in out
    # data_in/data_out of a job without a session: Slurm's success words.
    assert "No matching session" in wlm("--function", "data_out", "--token", token, "--job", script, check=0)[1]


def test_owed_stage_outs_run_at_teardown_and_hurry_drops_them_loudly(wlm, site, pfs, user, as_user):
    for token, hurry in (("5001", False), ("5002", True)):
        d, script = job_files(pfs, user, f"owed{token}", "")
        with open(script, "w") as f:
            f.write(f"""#!/bin/bash
#DW jobdw capacity=1GiB
#DW stage_out type=file source=$DW_JOB_STRIPED/r destination={d}/r
""")
        nodes = os.path.join(d, "nodes")
        with open(nodes, "w") as f:
            f.write(f"{NODE}\n")
        wlm("--function", "setup", "--token", token, "--caller", "SLURM", "--user", str(user.uid),
            "--groupid", str(user.gid), "--capacity", "wlm_pool:1GiB", "--job", script, check=0)
        wlm("--function", "data_in", "--token", token, "--job", script, check=0)
        wlm("--function", "paths", "--job", script, "--token", token, "--pathfile", os.path.join(d, "p"), check=0)
        mnt = open(os.path.join(d, "p")).read().split("=", 1)[1].strip()
        wlm("--function", "pre_run", "--token", token, "--job", script, "--nodehostnamefile", nodes, check=0)
        as_user(user.uid, user.gid, lambda: open(mnt + "r", "w").write(token))
        wlm("--function", "post_run", "--token", token, "--job", script, check=0)
        args = ["--function", "teardown", "--token", token, "--job", script] + (["--hurry"] if hurry else [])
        status, out = wlm(*args, check=0)
        if hurry:
            assert "dropped" in out and "did NOT reach the PFS" in out, out
            assert not os.path.exists(os.path.join(d, "r"))
        else:
            assert open(os.path.join(d, "r")).read() == token
    nothing_left(site)


def test_persistent_instance_created_used_and_destroyed(wlm, site, pfs, user, as_user):
    status, out = wlm("--function", "create_persistent", "-c", "CLI", "-t", "jobsdb", "-u", str(user.uid),
                      "-C", "wlm_pool:1073741824", "-a", "striped", "-T", "scratch", check=0)
    assert "created" in out
    sessions = json.loads(wlm("--function", "show_sessions")[1])["sessions"]
    assert [s["owner"] for s in sessions if s["token"] == "jobsdb"] == [user.uid]
    d, script = job_files(pfs, user, "pjob", "")
    with open(os.path.join(d, "db"), "w") as f:
        f.write("reference data\n")
    os.chown(os.path.join(d, "db"), user.uid, user.gid)
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#DW persistentdw name=jobsdb
#DW stage_in type=file source={d}/db destination=$DW_PERSISTENT_STRIPED_jobsdb/db
""")
    nodes = os.path.join(d, "nodes")
    with open(nodes, "w") as f:
        f.write(f"{NODE}\n")
    token = "6001"
    wlm("--function", "job_process", "--job", script, check=0)
    # Only persistentdw: Slurm passes capacity 0.
    wlm("--function", "setup", "--token", token, "--caller", "SLURM", "--user", str(user.uid),
        "--groupid", str(user.gid), "--capacity", "wlm_pool:0", "--job", script, check=0)
    wlm("--function", "data_in", "--token", token, "--job", script, check=0)
    pf = os.path.join(d, "p")
    wlm("--function", "paths", "--job", script, "--token", token, "--pathfile", pf, check=0)
    k, v = open(pf).read().strip().split("=", 1)
    assert k == "DW_PERSISTENT_STRIPED_jobsdb" and v.endswith("/")
    wlm("--function", "pre_run", "--token", token, "--job", script, "--nodehostnamefile", nodes, check=0)
    assert as_user(user.uid, user.gid, lambda: open(v + "db").read()) == "reference data\n"
    wlm("--function", "post_run", "--token", token, "--job", script, check=0)
    wlm("--function", "data_out", "--token", token, "--job", script, check=0)
    wlm("--function", "teardown", "--token", token, "--job", script, check=0)
    # The persistent instance outlives the job ...
    sessions = json.loads(wlm("--function", "show_sessions")[1])["sessions"]
    assert [s["token"] for s in sessions] == ["jobsdb"]
    # ... until a #BB destroy_persistent job tears it down.
    status, out = wlm("--function", "teardown", "--token", "jobsdb", "--job", script, check=0)
    nothing_left(site)


def test_load_balanced_job_and_persistent_instances(site, spillway_bin, pfs, user):
    """`#DW jobdw access_mode=ldbal` staged in through $DW_JOB_LDBAL and read by the
    job, which cannot change it (EROFS); a job making a load-balanced persistent
    instance with `#BB create_persistent access=ldbal`, a second job staging into it
    through $DW_PERSISTENT_LDBAL_<name> and reading it, a third destroying it."""
    base = user_dir(pfs, user, "ldbal")
    files = write_tree(os.path.join(base, "in"), user, n=6)
    script = f"""#!/bin/bash
#DW jobdw access_mode=ldbal capacity=1GiB pool=wlm_pool
#DW stage_in type=directory source={base}/in destination=$DW_JOB_LDBAL/in
#DW stage_out type=directory source=$DW_JOB_LDBAL/in destination={base}/back
#BB create_persistent name=ldref capacity=1GiB access=ldbal
set -u
echo "ldbal=$DW_JOB_LDBAL"
(cd $DW_JOB_LDBAL/in && find . -type f | LC_ALL=C sort | xargs sha256sum) > {base}/sums
if ( echo x > $DW_JOB_LDBAL/in/new ) 2> {base}/write.err; then echo "write allowed"; exit 3; fi
echo done
"""
    r = run_job(site, spillway_bin, user, script, base)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"ldbal=/\S+_ldbal_scratch/", r.stdout), r.stdout
    import hashlib
    want = [f"{hashlib.sha256(files[rel]).hexdigest()}  ./{rel}" for rel in sorted(files)]
    assert open(os.path.join(base, "sums")).read().splitlines() == want
    assert "Read-only file system" in open(os.path.join(base, "write.err")).read()
    # What was staged in stages out again (from one replica).
    for rel, data in files.items():
        assert open(os.path.join(base, "back", rel), "rb").read() == data, rel
    confs = site.api("GET", "/dw/v1/configurations")["configurations"]
    assert [(c["type"], c["access_mode"]) for c in confs] == [("scratch", "ldbal")], confs

    use = f"""#!/bin/bash
#DW persistentdw name=ldref
#DW stage_in type=file source={base}/in/d0/f0 destination=$DW_PERSISTENT_LDBAL_ldref/f0
set -eu
echo "path=$DW_PERSISTENT_LDBAL_ldref"
sha256sum $DW_PERSISTENT_LDBAL_ldref/f0 | cut -c1-64
"""
    r = run_job(site, spillway_bin, user, use, base)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"path=/\S+/ldref_\S+_ldbal_scratch/", r.stdout), r.stdout
    assert hashlib.sha256(files["d0/f0"]).hexdigest() in r.stdout, r.stdout

    r = run_job(site, spillway_bin, user, "#!/bin/bash\n#BB destroy_persistent name=ldref\ntrue\n", base)
    assert r.returncode == 0, r.stdout + r.stderr
    nothing_left(site)


def test_private_access_gives_each_node_its_own_namespace(spillway_bin, munged, _local_base, pfs, user):
    """access_mode=striped,private on two compute nodes (a second agent on this machine):
    DW_JOB_PRIVATE and DW_JOB_STRIPED both set; what the script writes to the private
    mount lands in this node's own namespace, seen through the striped mount."""
    d = tempfile.mkdtemp(prefix="site2-", dir=_local_base)
    os.chmod(d, 0o755)
    s = LocalSite(spillway_bin, d, munged, servers=2, pfs_roots=[pfs], node=NODE,
                  extra_nodes=["compute1"])
    s.up()
    try:
        base = user_dir(pfs, user, "private")
        script = f"""#!/bin/bash
#DW jobdw type=scratch access_mode=striped,private capacity=1GiB
#DW stage_out type=directory source=$DW_JOB_STRIPED/.spillway-private destination={base}/private
set -e
echo "private=$DW_JOB_PRIVATE striped=$DW_JOB_STRIPED"
echo mine > $DW_JOB_PRIVATE/note
test ! -e $DW_JOB_STRIPED/note
"""
        path = os.path.join(base, "job.sh")
        with open(path, "w") as f:
            f.write(script)
        env = dict(os.environ, SPILLWAY_CONFIG=s.config)
        r = subprocess.run([spillway_bin, "run", "--user", user.name, "--nodes", f"{NODE},compute1",
                            "--chdir", base, path], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        m = re.search(r"private=(\S+) striped=(\S+)", r.stdout)
        assert m and m.group(1).endswith("_private_scratch/") and m.group(2).endswith("_striped_scratch/"), r.stdout
        assert "mounted 2 instance(s) on 2 node(s)" in r.stdout, r.stdout
        # The script ran on this node (compute0): its note is in compute0's namespace;
        # compute1's namespace exists (mounted there) and is empty.
        assert open(os.path.join(base, "private", NODE, "note")).read() == "mine\n"
        assert os.listdir(os.path.join(base, "private", "compute1")) == []
        nothing_left(s)
    finally:
        s.down()
        shutil.rmtree(d, ignore_errors=True)


def test_a_job_cannot_stage_another_users_private_file(site, spillway_bin, pfs, user, user2):
    """Stages run as the job's owner: a job of spwtest naming spwtest2's 0600 file (in a
    directory spwtest may search) fails in stage-in with EACCES, and the job never runs."""
    other = os.path.join(pfs, "other")
    os.mkdir(other)
    os.chmod(other, 0o755)
    secret = os.path.join(other, "secret")
    with open(secret, "w") as f:
        f.write("not for spwtest\n")
    os.chown(secret, user2.uid, user2.gid)
    os.chmod(secret, 0o600)
    base = user_dir(pfs, user, "thief")
    script = f"""#!/bin/bash
#DW jobdw capacity=1GiB
#DW stage_in type=file source={secret} destination=$DW_JOB_STRIPED/loot
cat $DW_JOB_STRIPED/loot
"""
    r = run_job(site, spillway_bin, user, script, base)
    assert r.returncode != 0
    assert "line 3: stage_in" in r.stdout and "ermission denied" in r.stdout, r.stdout
    assert "not for spwtest" not in r.stdout + r.stderr
    nothing_left(site)
