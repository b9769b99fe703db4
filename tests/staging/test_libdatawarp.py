"""libdatawarp (the DataWarp C API) against a real local site: C programs from tests/c/,
compiled with `pkg-config --cflags --libs cray-datawarp` against the INSTALLED header
and library (scripts/setup.sh installs them), run as the unprivileged user spwtest on an
instance it owns, with a PFS directory the site's manager lists in `pfs_roots`.

Follows NERSC's BB-unit-tests/datawarpAPI procedure (docs/libdatawarp.md): a file in,
wait, query (`complete=%d pending=%d deferred=%d failed=%d`), out, wait, query, checksums
compared; a directory of 5,000 small files in and out; deferred out -> revoke -> defer
again -> activate -> wait; a list in and out; terminating the stage of a 2 GiB file
part of the way through; the failed-stage walk after stages from a missing and an
unreadable source (-ENOENT, -EACCES per file) and from another user's 0600 file; stripe
get/set; the MDS path; accounting JSON; the errno rules; malformed ioctls answered, not
fatal; a mount without a manager answers ENOTSUP."""

import errno
import inspect
import json
import os
import re
import struct
import subprocess
import tempfile
import types

import pytest

import spwhelpers as H
from ctlhelpers import ioctl_msg, ioctl_raw
from sitehelpers import LocalSite, running_site

GiB = 1 << 30
MiB = 1 << 20
PROGRAMS = ["dw_file", "dw_dir", "dw_deferred", "dw_list", "dw_terminate", "dw_failed", "dw_misc"]

COUNTS = re.compile(r"^(\S+) rc=(-?\d+) complete=(-?\d+) pending=(-?\d+) deferred=(-?\d+) "
                    r"failed=(-?\d+)$", re.M)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def programs(_local_base):
    """{name: path} of the test programs, built against the installed libdatawarp."""
    if subprocess.run(["pkg-config", "--exists", "cray-datawarp"]).returncode != 0:
        pytest.fail("pkg-config does not know cray-datawarp: run scripts/setup.sh, which builds "
                    "and installs libdatawarp", pytrace=False)
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "cray-datawarp"],
                           capture_output=True, text=True, check=True).stdout.split()
    incdir = subprocess.run(["pkg-config", "--variable=includedir", "cray-datawarp"],
                            capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(incdir, "datawarp.h"), "rb") as a, \
            open(os.path.join(H.REPO, "libdatawarp", "datawarp.h"), "rb") as b:
        if a.read() != b.read():
            pytest.fail(f"{incdir}/datawarp.h is not this checkout's: run scripts/setup.sh",
                        pytrace=False)
    out = tempfile.mkdtemp(prefix="dwc-", dir=_local_base)
    os.chmod(out, 0o755)
    paths = {}
    for p in PROGRAMS:
        exe = os.path.join(out, p)
        r = subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-o", exe,
                            os.path.join(H.C_DIR, p + ".c"), *flags],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"gcc {p}.c failed:\n{r.stderr}", pytrace=False)
        paths[p] = exe
    return paths


@pytest.fixture(scope="module")
def dw(spillway_bin, munged, _local_base, programs, users):
    """A site with a PFS root, and a persistent instance owned by spwtest, mounted."""
    if "pfs_roots" not in inspect.signature(LocalSite.__init__).parameters:
        pytest.skip("LocalSite has no pfs_roots yet (the manager's stage API is not merged)")
    user, user2 = users
    with running_site(spillway_bin, _local_base, munged, prefix="dwlib-", pfs_users=(user, user2),
                      servers=2, logs=("manager", "agent", "server0", "server1"), log_tail=5000) as site:
        pfs = site.pfs
        s, i, c = site.persistent("dwlib", 6 * GiB, owner=user.uid)
        a = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]})
        site.wait_state("activations", a["id"], timeout=60)
        yield types.SimpleNamespace(site=site, mnt=a["mount"], pfs=pfs, instance=i["id"],
                                    user=user, user2=user2, programs=programs)


_n = [0]


@pytest.fixture
def work(dw, request):
    """(dw directory, pfs directory) of this test, both new and owned by spwtest."""
    _n[0] += 1
    name = re.sub(r"[^A-Za-z0-9_]+", "_", request.node.name)[:40] + f"-{_n[0]}"
    d = os.path.join(dw.mnt, name)
    p = os.path.join(dw.pfs, dw.user.name, name)
    dw.user.run(_mkdirs, [d, p])
    return d, p


# --------------------------------------------------------------------------- helpers


def _mkdirs(paths):
    for p in paths:
        os.makedirs(p, exist_ok=True)


def _write(path, data, mode=0o644):
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def _run(argv, timeout):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def run(dw, prog, *args, user=None, timeout=600, check=True):
    """Run a test program as spwtest (or `user`); its stdout."""
    argv = [dw.programs[prog], *args]
    rc, out, err = (user or dw.user).run(_run, argv, timeout)
    if check:
        assert rc == 0, f"{' '.join(argv)}: exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
    return out


def counts(out):
    """{label: (rc, complete, pending, deferred, failed)} of a program's report lines."""
    return {m[0]: tuple(int(x) for x in m[1:]) for m in COUNTS.findall(out)}


def sha(path):
    return H.sha256_file(path)


def tree(root):
    """{relative path: (sha256, mode)} of the regular files under root."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = (sha(p), os.stat(p).st_mode & 0o7777)
    return out


def stages(dw):
    return dw.site.api("GET", f"/dw/v1/stages?instance={dw.instance}")["stages"]


# --------------------------------------------------------------------------- tests


def test_file_in_wait_query_out_wait_query(dw, work):
    d, p = work
    src, dst, f = os.path.join(p, "in.dat"), os.path.join(p, "out.dat"), os.path.join(d, "f.dat")
    dw.user.run(_write, src, os.urandom(3 * MiB + 4321), 0o640)
    out = run(dw, "dw_file", f, src, dst)
    c = counts(out)
    assert c["in"] == (0, 1, 0, 0, 0), out
    assert c["out"] == (0, 1, 0, 0, 0), out
    assert sha(src) == sha(f) == sha(dst)
    # Mode kept both ways; every file belongs to the caller.
    for x in (f, dst):
        st = os.stat(x)
        assert (st.st_mode & 0o7777, st.st_uid) == (0o640, dw.user.uid), x
    # The stages were made for the caller's uid (the kernel's, not the message's).
    mine = [s for s in stages(dw) if s["destination"] == f[len(dw.mnt):] or s["source"] == f[len(dw.mnt):]]
    assert len(mine) == 2 and all(s["owner"] == dw.user.uid for s in mine), mine


@pytest.mark.timeout(1200)
def test_directory_of_5000_files_in_and_out(dw, work):
    d, p = work
    src, dst, dwdir = os.path.join(p, "src"), os.path.join(p, "dst"), os.path.join(d, "tree")

    def make():
        for k in range(50):
            sub = os.path.join(src, f"d{k:02}")
            os.makedirs(sub)
            for j in range(100):
                mode = 0o755 if j == 0 else 0o644
                _write(os.path.join(sub, f"f{j:03}"), os.urandom(100 + (k * 100 + j) % 4000), mode)
        os.makedirs(dst)
        os.makedirs(dwdir)

    dw.user.run(make)
    out = run(dw, "dw_dir", dwdir, src, dst, timeout=1100)
    c = counts(out)
    assert c["in"] == (0, 5000, 0, 0, 0), out
    assert c["out"] == (0, 5000, 0, 0, 0), out
    want = tree(src)
    assert len(want) == 5000
    assert tree(dwdir) == want
    assert tree(dst) == want


def test_deferred_out_revoke_defer_activate(dw, work):
    d, p = work
    f, dst = os.path.join(d, "result.dat"), os.path.join(p, "result.dat")
    dw.user.run(_write, f, os.urandom(MiB + 17))
    out = run(dw, "dw_deferred", f, dst)
    c = counts(out)
    assert c["deferred"] == (0, 0, 0, 1, 0), out
    # Revoked: nothing deferred any more (the query may also say no stage is left).
    rc, *rest = c["revoked"]
    assert rc in (0, -errno.EINVAL) and (rc != 0 or rest[2] == 0), out
    assert c["deferred-again"] == (0, 0, 0, 1, 0), out
    assert c["activated"] == (0, 1, 0, 0, 0), out
    assert sha(dst) == sha(f)
    states = sorted(s["state"] for s in stages(dw) if s["source"] == f[len(dw.mnt):])
    assert states == ["complete", "revoked"], states


def test_list_in_and_out(dw, work):
    d, p = work
    srcs = [os.path.join(p, f"l{k}.dat") for k in range(4)]
    outdir = os.path.join(p, "out")

    def make():
        for k, s in enumerate(srcs):
            _write(s, os.urandom(k * 300_000 + 5))
        os.makedirs(outdir)
    dw.user.run(make)
    out = run(dw, "dw_list", d, outdir, *srcs)
    c = counts(out)
    assert c["in"] == (0, 4, 0, 0, 0), out
    assert c["out"] == (0, 4, 0, 0, 0), out
    for s in srcs:
        b = os.path.basename(s)
        assert sha(s) == sha(os.path.join(d, b)) == sha(os.path.join(outdir, b))


@pytest.mark.timeout(900)
def test_terminate_a_2gib_stage_part_way(dw, work):
    d, p = work
    src, f = os.path.join(p, "big.dat"), os.path.join(d, "big.dat")

    def make():
        block = os.urandom(MiB)
        with open(src, "wb") as fh:
            for _ in range(2048):
                fh.write(block)
            # Cold, so that the stage reads it from the disk: from the page cache the
            # servers copy 2 GiB (written direct) in well under the time a terminate
            # takes to reach them, and the stage completes first.
            fh.flush()
            os.fsync(fh.fileno())
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    dw.user.run(make)
    out = run(dw, "dw_terminate", f, src, "100")
    assert "terminate rc=0" in out, out
    c = counts(out)
    rc, complete, pending, deferred, failed = c["terminated"]
    # Terminated: nothing pending and nothing complete (or no record left at all).
    assert rc in (0, -errno.EINVAL) and (rc != 0 or (pending, complete) == (0, 0)), out
    # Waiting after a terminate: nothing is pending (or nothing is left to wait for).
    assert re.search(rf"^wait rc=(0|{-errno.EINVAL})$", out, re.M), out
    # The manager ends a running stage when its coordinator confirms.
    ipath = f[len(dw.mnt):]

    def ended():
        st = [s for s in stages(dw) if s["destination"] == ipath]
        return len(st) == 1 and st[0]["state"] == "terminated" and st[0]
    s = dw.site.wait(ended, "the stage terminated", timeout=60)
    assert s["bytes_done"] < 2 * GiB, s


def _failed_walk(out):
    return {m[0]: int(m[1]) for m in re.findall(r"^failed path=(.*) errno=(-?\d+) len=\d+$", out, re.M)}


def test_failed_stage_walk(dw, work):
    d, p = work
    missing, locked = os.path.join(p, "nope.dat"), os.path.join(p, "locked.dat")
    dw.user.run(_write, locked, b"secret", 0o000)
    out = run(dw, "dw_failed", d, "missing", missing, "locked", locked)
    c = counts(out)
    assert c["missing"] == (0, 0, 0, 0, 1), out
    assert c["locked"] == (0, 0, 0, 0, 1), out
    assert f"small rc={-errno.ERANGE}" in out, out
    walk = _failed_walk(out)
    assert walk[os.path.join(d, "missing")] == -errno.ENOENT, out
    assert walk[os.path.join(d, "locked")] == -errno.EACCES, out
    assert "walk done" in out
    # A failed stage records the file and its reason on the manager too.
    st = [s for s in stages(dw) if s["destination"] == os.path.join(d, "locked")[len(dw.mnt):]]
    assert st and st[0]["state"] == "failed" and st[0]["error"]["errno"] == errno.EACCES, st


def test_another_users_0600_file_is_refused(dw, work):
    d, _ = work
    theirs = os.path.join(dw.pfs, dw.user2.name, "private.dat")
    dw.user2.run(_write, theirs, b"not yours", 0o600)
    out = run(dw, "dw_failed", d, "stolen", theirs)
    assert counts(out)["stolen"] == (0, 0, 0, 0, 1), out
    assert _failed_walk(out)[os.path.join(d, "stolen")] == -errno.EACCES, out
    assert not os.path.exists(os.path.join(d, "stolen")) or os.path.getsize(os.path.join(d, "stolen")) == 0


def test_stripes_mds_accounting_and_errnos(dw, work):
    d, _ = work
    out = run(dw, "dw_misc", d, "/etc/hostname")
    vals = dict(re.findall(r"^(.+?) rc=(-?\d+)$", out, re.M))
    m = re.search(r"^stripe default size=(\d+) width=(\d+) start=(\d+)$", out, re.M)
    assert m and int(m[1]) > 0 and int(m[1]) % 4096 == 0 and int(m[2]) == 2, out
    assert re.search(r"^stripe set size=65536 width=1 start=\d+$", out, re.M), out
    assert vals["stripe bad-size"] == str(-errno.EINVAL)
    assert vals["stripe zero-size"] == str(-errno.EINVAL)
    assert vals["stripe zero-width"] == str(-errno.EINVAL)
    assert vals["stripe bad-fd"] == str(-errno.EBADF)
    assert vals["stripe stdin"] == str(-errno.EINVAL)
    assert vals["sync"] == str(-errno.EOPNOTSUPP), out
    assert f"mds path={d}" in out, out
    assert f"mds other=(null) errno={errno.EINVAL}" in out, out
    assert "accounting ec=0" in out, out
    doc = json.loads(re.search(r"^JSON (.*)$", out, re.M)[1])
    realm = doc["realm"]
    assert realm["realm id"] == dw.instance
    assert realm["server count"] == 2 and realm["namespace count"] == 1
    frag_keys = {"server name", "bytes written", "bytes read", "write limit", "max window write",
                 "cur capacity used", "max capacity used", "lower filesystem capacity",
                 "num files created", "write highwater", "moving avg writes"}
    assert len(realm["fragments"]) == 2
    for fr in realm["fragments"]:
        assert set(fr) == frag_keys
        assert all(isinstance(v, int) for k, v in fr.items() if k != "server name")
        assert fr["lower filesystem capacity"] > 0
    assert sum(fr["bytes written"] for fr in realm["fragments"]) > 0
    ns_keys = {"namespace id", "stripe width", "stripe size", "substripe width", "substripe size",
               "fs bytes read", "fs bytes written", "stage bytes read", "stage bytes written",
               "max offset read", "max offset written", "file size limit", "num files created",
               "num files create threshold"}
    (ns,) = realm["namespaces"]
    assert set(ns) == ns_keys
    assert (ns["stripe size"], ns["stripe width"]) == (65536, 1)
    assert vals["concurrency"] == "0"
    assert vals["query never-staged"] == str(-errno.EINVAL)
    assert vals["query missing"] == str(-errno.ENOENT)
    assert vals["query not-spillway"] == str(-errno.EINVAL)
    assert vals["wait never-staged"] == str(-errno.EINVAL)
    assert vals["stage bad-type"] == str(-errno.EINVAL)


def test_malformed_ioctls_are_answered_and_harmless(dw):
    def probe(mnt):
        out = []
        out.append(ioctl_raw(mnt, struct.pack("=I", 0)))                       # empty
        out.append(ioctl_raw(mnt, struct.pack("=I", 99999)))                   # len past buf
        out.append(ioctl_raw(mnt, struct.pack("=I", 5) + b"count"))           # no NUL
        out.append(ioctl_raw(mnt, ioctl_msg(b"stage", b"in", b"file")))            # too few
        out.append(ioctl_raw(mnt, ioctl_msg(b"wait", b"file", b"/x", b"99999")))   # timeout too long
        out.append(ioctl_raw(mnt, ioctl_msg(b"counts", b"file", b"/a/../b")))
        out.append(ioctl_raw(mnt, ioctl_msg(b"\xff\xfe")))
        try:
            ioctl_raw(mnt, b"", cmd=0xC0045301)
            out.append("no error")
        except OSError as e:
            out.append(e.errno)
        return out

    res = dw.user.run(probe, dw.mnt)
    for r in res[:-1]:
        assert r[0] == str(-errno.EINVAL).encode(), res
    assert res[-1] == errno.ENOTTY, res
    # The client is still serving.
    assert os.path.isdir(dw.mnt) and os.listdir(dw.mnt) is not None
    assert dw.user.run(ioctl_raw, dw.mnt, ioctl_msg(b"concurrency", b"3"))[0] == b"0"


def test_mount_without_a_manager_answers_enotsup(clusters):
    c = clusters(servers=1, capacity="1G")
    assert ioctl_raw(c.mnt, ioctl_msg(b"counts", b"file", b"/"))[0] == str(-errno.EOPNOTSUPP).encode()
    # Accounting needs only the servers.
    r = ioctl_raw(c.mnt, ioctl_msg(b"accounting"))
    assert r[0] == b"0", r
    assert json.loads(r[1])["realm"]["server count"] == 1
