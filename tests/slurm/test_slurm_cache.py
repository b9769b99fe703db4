"""A cache instance (docs/cache.md) through Debian's real Slurm 22.05, with each of its
burst-buffer plugins: `burst_buffer/datawarp` pointed at Spillway's dw_wlm_cli, and
`burst_buffer/lua` with the shipped slurm/burst_buffer.lua. A local Spillway site
(manager, 2 servers, an agent for this host) whose servers' `pfs_roots` hold the
module's PFS directory; jobs submitted with sbatch by an unprivileged user.

The job script has a single `#DW jobdw type=cache access_mode=striped pfs=DIR` line and
no stage lines. The job checks it got `DW_JOB_STRIPED_CACHE` and `DW_JOB_STRIPED_CACHED`
(one path), reads a PFS file through the cache, writes a new file, overwrites part of a
nested PFS file and creates a file in a new nested directory, and ends at once: its
writes are usually still dirty (younger than write-behind's 5 s) when Slurm tears the
buffer down, and the teardown writes every dirty byte before the instance goes. Once
Slurm shows the buffer torn down, the PFS directory holds every byte the job wrote
(checked against the checksums the job computed), the files are the user's, no other
name appeared, and the manager holds no session, activation or fragment."""

import hashlib
import os
import re
import socket

import pytest

import slurm as S
import spwhelpers as H
from sitehelpers import running_site

pytestmark = pytest.mark.slurm

MiB = 1 << 20
HOST = socket.gethostname().split(".")[0]


@pytest.fixture(scope="module")
def spw(spillway_bin, munged, _local_base, pfs, users):
    """The Spillway site; `pfs` is its servers' PFS root (`pfs_roots`), so a cache of a
    directory below it may be made; the SlurmUser's group are its admins (dw_wlm_cli
    runs as it)."""
    with running_site(spillway_bin, _local_base, munged, servers=2, server_capacity="8GiB",
                      pfs_roots=[pfs], node=HOST, admin_group=S.slurm_user_group()) as s:
        yield s


def datawarp_site(slurm_sites, spw, tools):
    conf = (f"GetSysState={tools}/dw_wlm_cli\nGetSysStatus={tools}/dwstat\n"
            "Flags=EnablePersistent\nDefaultPool=wlm_pool\nValidateTimeout=5\nOtherTimeout=300\n")
    return slurm_sites(burst_buffer="datawarp", burst_buffer_conf=conf,
                       extra_env=(("SPILLWAY_CONFIG", spw.config),))


def lua_site(slurm_sites, spw, tools):
    lua = open(os.path.join(H.REPO, "slurm", "burst_buffer.lua")).read()
    lua, n = re.subn(r'^local DW_WLM_CLI = ".*"$', f'local DW_WLM_CLI = "{tools}/dw_wlm_cli"', lua,
                     flags=re.M)
    assert n == 1
    lua = re.sub(r'^local DWSTAT = ".*"$', f'local DWSTAT = "{tools}/dwstat"', lua, flags=re.M)
    conf = open(os.path.join(H.REPO, "slurm", "burst_buffer.conf.lua.example")).read()
    return slurm_sites(burst_buffer="lua", burst_buffer_conf=conf, lua_script=lua,
                       extra_env=(("SPILLWAY_CONFIG", spw.config),))


def nothing_left(spw, timeout=60):
    """No session, activation or fragment in the manager, no mount of the site."""
    def clean():
        return (spw.api("GET", "/dw/v1/sessions")["sessions"] == [] and
                spw.api("GET", "/dw/v1/activations")["activations"] == [] and
                spw.api("GET", "/dw/v1/fragments")["fragments"] == [] and
                spw.dir not in open("/proc/self/mounts").read())
    spw.wait(clean, "no session, activation, fragment or mount left", timeout=timeout)


def sha(data):
    return hashlib.sha256(data).hexdigest()


def user_file(path, data, user):
    with open(path, "wb") as f:
        f.write(data)
    os.chown(path, user.uid, user.gid)


def tree(top):
    """Every name below `top`, relative, sorted."""
    out = []
    for root, dirs, files in os.walk(top):
        out += [os.path.relpath(os.path.join(root, x), top) for x in dirs + files]
    return sorted(out)


def cache_job(base, data, name, pool):
    """The job script: one jobdw line of type cache over `data`, no stage lines. It
    prints the checksums of what it read and wrote, and ends without waiting for
    anything to reach the PFS."""
    return f"""#!/bin/bash
#SBATCH -N 1 -o {base}/{name}.out
#DW jobdw type=cache access_mode=striped pfs={data} capacity=1GiB{pool}
set -eu
echo "cache=$DW_JOB_STRIPED_CACHE"
echo "cached=$DW_JOB_STRIPED_CACHED"
if [ -z "$DW_JOB_STRIPED_CACHE" ] || [ "$DW_JOB_STRIPED_CACHE" != "$DW_JOB_STRIPED_CACHED" ]; then
    echo "DW_JOB_STRIPED_CACHE and DW_JOB_STRIPED_CACHED differ"; exit 3
fi
C=$DW_JOB_STRIPED_CACHE
sum() {{ sha256sum "$1" | cut -c1-64; }}
echo "input=$(sum "$C/input")"
head -c {7 * MiB + 3} /dev/urandom > "$C/made"
sum "$C/made" > "$C/made.sha256"
echo "made=$(cat "$C/made.sha256")"
# Part of a nested PFS file, read through the cache first, then overwritten in place.
echo "notes-before=$(sum "$C/sub/notes.bin")"
dd if=/dev/urandom of="$C/sub/notes.bin" bs=4096 seek=300 count=3 conv=notrunc status=none
echo "notes=$(sum "$C/sub/notes.bin")"
mkdir -p "$C/sub/deeper"
echo "made by job $SLURM_JOB_ID" > "$C/sub/deeper/new.txt"
echo "new=$(sum "$C/sub/deeper/new.txt")"
echo done
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("plugin", ["datawarp", "lua"])
def test_a_cache_job_reads_and_writes_its_pfs_directory_through_slurm(
        plugin, slurm_sites, spw, pfs, user, tools):
    site = (datawarp_site if plugin == "datawarp" else lua_site)(slurm_sites, spw, tools)
    base = os.path.join(pfs, f"cache-{plugin}")
    data = os.path.join(base, "data")
    for d in (base, data, os.path.join(data, "sub")):
        os.mkdir(d)
        os.chown(d, user.uid, user.gid)
    inp = os.urandom(5 * MiB + 123)
    user_file(os.path.join(data, "input"), inp, user)
    notes = os.urandom(2 * MiB + 7)
    user_file(os.path.join(data, "sub", "notes.bin"), notes, user)

    # burst_buffer/lua: a capacity= needs a pool= (slurm/burst_buffer.lua's header);
    # burst_buffer/datawarp takes its DefaultPool.
    pool = " pool=wlm_pool" if plugin == "lua" else ""
    job = site.submit(cache_job(base, data, plugin, pool), user.name, cwd=base)
    rec = site.wait_job(job, timeout=180, burst_buffer_done=True)
    assert rec["JobState"] == "COMPLETED", (rec, site.log("slurmctld")[-3000:])
    log = open(os.path.join(base, f"{plugin}.out")).read()
    out = dict(line.split("=", 1) for line in log.splitlines() if "=" in line)
    assert log.rstrip().endswith("done"), log

    # The variables: both set, one path, the job's cache mount.
    assert out["cache"] == out["cached"], log
    assert re.fullmatch(r"/\S+_striped_cache/?", out["cache"]), log
    # The input read through the cache is the PFS's.
    assert out["input"] == sha(inp), log
    assert out["notes-before"] == sha(notes), log

    # Slurm tore the buffer down: everything the job wrote is on the PFS already.
    made = H.read_file(os.path.join(data, "made"))
    assert len(made) == 7 * MiB + 3
    assert sha(made) == out["made"], log
    assert H.read_file(os.path.join(data, "made.sha256")).decode().strip() == out["made"]
    got = H.read_file(os.path.join(data, "sub", "notes.bin"))
    assert sha(got) == out["notes"], log
    assert len(got) == len(notes)
    lo, hi = 300 * 4096, 303 * 4096
    assert got[:lo] == notes[:lo] and got[hi:] == notes[hi:], "bytes outside the overwrite changed"
    assert got[lo:hi] != notes[lo:hi]
    new = H.read_file(os.path.join(data, "sub", "deeper", "new.txt"))
    assert new == f"made by job {job}\n".encode() and sha(new) == out["new"], log
    assert H.read_file(os.path.join(data, "input")) == inp

    # Made through the cache: the user's on the PFS; nothing else appeared.
    for name in ("made", "made.sha256", "sub/notes.bin", "sub/deeper", "sub/deeper/new.txt"):
        st = os.stat(os.path.join(data, name))
        assert (st.st_uid, st.st_gid) == (user.uid, user.gid), name
    assert tree(data) == ["input", "made", "made.sha256", "sub", "sub/deeper",
                          "sub/deeper/new.txt", "sub/notes.bin"]
    nothing_left(spw)


@pytest.mark.timeout(400)
def test_a_persistent_cache_made_by_slurm_takes_its_directory_from_the_job_script(
        slurm_sites, spw, pfs, user, tools):
    """`#BB create_persistent ... type=cache pfs=DIR` through burst_buffer/datawarp.
    Slurm's create_persistent passes no directory (spec §1.3): it makes the instance,
    and the creating job's setup, which gets the script, makes the cache configuration
    (docs/cache.md, "Persistent cache instances through Slurm"). A second job reads
    and writes the PFS directory through `$DW_PERSISTENT_STRIPED_CACHE_<name>`; the
    destroying job's teardown writes what it wrote to the PFS."""
    site = datawarp_site(slurm_sites, spw, tools)
    base = os.path.join(pfs, "pcache")
    data = os.path.join(base, "data")
    for d in (base, data):
        os.mkdir(d)
        os.chown(d, user.uid, user.gid)
    inp = os.urandom(3 * MiB + 5)
    user_file(os.path.join(data, "input"), inp, user)

    create = f"""#!/bin/bash
#SBATCH -N 0 -o {base}/create.out
#BB create_persistent name=spwpc capacity=1GiB access=striped type=cache pfs={data} read_ahead=4MiB
"""
    job = site.submit(create, user.name, cwd=base)
    rec = site.wait_job(job, timeout=120, burst_buffer_done=True)
    assert rec["JobState"] == "COMPLETED", (rec, site.log("slurmctld")[-3000:])
    confs = spw.api("GET", "/dw/v1/configurations")["configurations"]
    assert [(c["type"], c["access_mode"], c.get("pfs"), c.get("read_ahead")) for c in confs] == \
        [("cache", "stripe", data, 4 * MiB)], confs

    use = f"""#!/bin/bash
#SBATCH -N 1 -o {base}/use.out
#DW persistentdw name=spwpc
set -eu
C=$DW_PERSISTENT_STRIPED_CACHE_spwpc
echo "path=$C"
echo "input=$(sha256sum "$C/input" | cut -c1-64)"
head -c {2 * MiB + 9} /dev/urandom > "$C/made"
echo "made=$(sha256sum "$C/made" | cut -c1-64)"
echo done
"""
    job = site.submit(use, user.name, cwd=base)
    rec = site.wait_job(job, timeout=180, burst_buffer_done=True)
    assert rec["JobState"] == "COMPLETED", (rec, site.log("slurmctld")[-3000:])
    log = open(os.path.join(base, "use.out")).read()
    out = dict(line.split("=", 1) for line in log.splitlines() if "=" in line)
    assert log.rstrip().endswith("done"), log
    assert re.fullmatch(r"/\S+/spwpc_\d+_striped_cache/?", out["path"]), log
    assert out["input"] == sha(inp), log

    destroy = f"""#!/bin/bash
#SBATCH -N 0 -o {base}/destroy.out
#BB destroy_persistent name=spwpc
"""
    job = site.submit(destroy, user.name, cwd=base)
    site.wait_job(job, timeout=180, burst_buffer_done=True)
    nothing_left(spw, timeout=120)
    made = H.read_file(os.path.join(data, "made"))
    assert sha(made) == out["made"] and len(made) == 2 * MiB + 9
    st = os.stat(os.path.join(data, "made"))
    assert (st.st_uid, st.st_gid) == (user.uid, user.gid)
    assert tree(data) == ["input", "made"]


@pytest.mark.timeout(500)
def test_another_users_job_attaching_a_persistent_cache_gets_no_more_than_the_pfs_gives(
        slurm_sites, spw, pfs, users, tools):
    """Issue 30, item 1, through Slurm: A makes a persistent cache of a directory under
    A's 0700 `priv/` (its files 0644: protected on the PFS only by `priv/`). B's own job
    attaches it with `#DW persistentdw` and is refused everything the PFS refuses B: the
    listing, the read, the stat and a create in a 0777 directory below. A's job, run the
    same way, reads the secret. Without the gate B's job read it (the mount's root is the
    cached directory, whose modes let anybody through)."""
    a, b = users
    site = datawarp_site(slurm_sites, spw, tools)
    home = os.path.join(pfs, "pc-A")
    priv = os.path.join(home, "priv")
    data = os.path.join(priv, "data")
    drop = os.path.join(data, "drop")
    os.makedirs(drop)
    for d, mode in ((home, 0o755), (priv, 0o700), (data, 0o755), (drop, 0o777)):
        os.chown(d, a.uid, a.gid)
        os.chmod(d, mode)
    user_file(os.path.join(data, "secret.txt"), b"A's secret\n", a)
    os.chmod(os.path.join(data, "secret.txt"), 0o644)
    # Job outputs where each user may write them.
    outs = os.path.join(pfs, "pc-out")
    os.mkdir(outs)
    os.chmod(outs, 0o1777)

    create = f"""#!/bin/bash
#SBATCH -N 0 -o {outs}/create.out
#BB create_persistent name=spwsec capacity=1GiB access=striped type=cache pfs={data}
"""
    job = site.submit(create, a.name, cwd=outs)
    rec = site.wait_job(job, timeout=120, burst_buffer_done=True)
    assert rec["JobState"] == "COMPLETED", (rec, site.log("slurmctld")[-3000:])

    def probe(who):
        return f"""#!/bin/bash
#SBATCH -N 1 -o {outs}/{who}.out
#DW persistentdw name=spwsec
C=$DW_PERSISTENT_STRIPED_CACHE_spwsec
echo "path=$C"
try() {{ if out=$("$@" 2>&1); then echo "ok $out"; else echo "refused $out"; fi; }}
echo "cat=$(try cat "$C/secret.txt")"
echo "ls=$(try ls "$C")"
echo "stat=$(try stat -c %s "$C/secret.txt")"
echo "create=$(try touch "$C/drop/{who}")"
echo done
"""

    def run(user, who):
        job = site.submit(probe(who), user.name, cwd=outs)
        rec = site.wait_job(job, timeout=180, burst_buffer_done=True)
        assert rec["JobState"] == "COMPLETED", (rec, site.log("slurmctld")[-3000:])
        log = open(os.path.join(outs, f"{who}.out")).read()
        assert log.rstrip().endswith("done"), log
        return log, dict(line.split("=", 1) for line in log.splitlines() if "=" in line)

    # On the PFS itself B is refused at priv/.
    assert H.as_user(b.uid, b.gid, os.access, os.path.join(data, "secret.txt"), os.R_OK) is False
    log, out = run(b, "B")
    assert out["path"].strip(), log
    for what in ("cat", "ls", "stat", "create"):
        assert out[what].startswith("refused") and "Permission denied" in out[what], (what, log)
    assert "A's secret" not in log
    assert not os.path.exists(os.path.join(drop, "B"))
    log, out = run(a, "A")
    assert out["cat"] == "ok A's secret", log
    assert out["create"].startswith("ok"), log

    destroy = f"""#!/bin/bash
#SBATCH -N 0 -o {outs}/destroy.out
#BB destroy_persistent name=spwsec
"""
    job = site.submit(destroy, a.name, cwd=outs)
    site.wait_job(job, timeout=180, burst_buffer_done=True)
    nothing_left(spw, timeout=120)
    assert os.path.exists(os.path.join(drop, "A"))
