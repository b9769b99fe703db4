"""DataWarp's private access mode (DW_JOB_PRIVATE) on a real local site: a manager, two
storage servers and two agents on this machine, `compute0` and `compute1` (`spillway
local up --extra-node compute1`; compute1 mounts below DIR/nodes/compute1).

One job instance carries a striped and a private configuration, both activated on both
nodes. Each node's private mount shows its own directory of the instance,
`/.spillway-private/<node>`, created at the first mount with the owner, group and mode
of the instance's root; the striped mount shows the whole instance, private directories
included (docs/control-plane.md, "Private mode")."""

import errno
import json
import os
import stat
import subprocess
import time
import types

import pytest

import spwhelpers as H
from ctlhelpers import ioctl_msg, ioctl_raw
from sitehelpers import running_site

GiB = 1 << 30
MiB = 1 << 20
PRIVATE = ".spillway-private"
NODES = ["compute0", "compute1"]


@pytest.fixture(scope="module")
def site(spillway_bin, munged, _local_base):
    with running_site(spillway_bin, _local_base, munged, prefix="private-", pfs_users=(), servers=2,
                      node=NODES[0], extra_nodes=NODES[1:],
                      logs=("manager", "agent", "agent-compute1", "server0"), log_tail=5000) as s:
        yield s


@pytest.fixture(scope="module")
def job(site, users):
    """A job's instance (numeric token) owned by spwtest, with a striped and a private
    configuration activated on both nodes. {node: (striped mount, private mount)}."""
    user = users[0]
    s = site.api("POST", "/dw/v1/sessions", {"token": "4711", "owner": user.uid,
                                             "client_nodes": NODES})
    i = site.api("POST", "/dw/v1/instances", {"session": s["id"], "capacity": 2 * GiB})
    assert i["capacity"]["nodes"] == 2
    confs = {}
    for mode in ("stripe", "private"):
        confs[mode] = site.api("POST", "/dw/v1/configurations",
                               {"instance": i["id"], "type": "scratch", "access_mode": mode,
                                "root_permissions": 0o750})
    assert confs["private"]["access_mode"] == "private"
    acts = {m: site.api("POST", "/dw/v1/activations",
                        {"session": s["id"], "configuration": c["id"]})
            for m, c in confs.items()}
    try:
        for a in acts.values():
            site.wait_state("activations", a["id"], timeout=60)
    except Exception:
        for name in ("manager", "agent", "agent-compute1"):
            print(f"--- {name} log\n{site.log(name)[-5000:]}")
        raise
    mounts = {n: (site.node_mount(n, acts["stripe"]["mount"]),
                  site.node_mount(n, acts["private"]["mount"])) for n in NODES}
    for n, (striped, private) in mounts.items():
        assert H.is_mounted(striped), (n, striped)
        assert H.is_mounted(private), (n, private)
    yield types_ns(session=s, instance=i, confs=confs, acts=acts, mounts=mounts, user=user)
    site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
    site.wait_gone("sessions", s["id"], timeout=60)
    for striped, private in mounts.values():
        assert not H.is_mounted(striped) and not H.is_mounted(private)


def types_ns(**kw):
    return types.SimpleNamespace(**kw)


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def test_each_node_sees_only_its_own_namespace(job):
    user = job.user
    striped0, priv0 = job.mounts["compute0"]
    striped1, priv1 = job.mounts["compute1"]
    user.run(write, os.path.join(priv0, "from0"), b"zero\n")
    user.run(write, os.path.join(priv1, "from1"), b"one\n")
    user.run(write, os.path.join(striped0, "shared"), b"everyone\n")

    # Through the private mounts: each node its own files, nothing of the instance root.
    assert sorted(os.listdir(priv0)) == ["from0"]
    assert sorted(os.listdir(priv1)) == ["from1"]
    assert not os.path.exists(os.path.join(priv1, "from0"))
    assert not os.path.exists(os.path.join(priv0, "from1"))
    assert not os.path.exists(os.path.join(priv0, PRIVATE))
    # Through either node's striped mount: the whole instance, private directories too.
    for striped in (striped0, striped1):
        assert sorted(os.listdir(striped)) == [PRIVATE, "shared"]
        assert sorted(os.listdir(os.path.join(striped, PRIVATE))) == NODES
        assert read(os.path.join(striped, PRIVATE, "compute0", "from0")) == b"zero\n"
        assert read(os.path.join(striped, PRIVATE, "compute1", "from1")) == b"one\n"
        assert not os.path.exists(os.path.join(striped, "from0"))
    # And back: a file put in a node's directory through the striped mount shows in
    # that node's private mount (once the kernel's negative entry, if any, expired).
    user.run(write, os.path.join(striped1, PRIVATE, "compute0", "via-striped"), b"s\n")
    assert user.run(read, os.path.join(priv0, "via-striped")) == b"s\n"


def test_private_root_belongs_to_the_owner_with_the_configurations_mode(job, user2):
    user = job.user
    striped0, priv0 = job.mounts["compute0"]
    root = os.stat(striped0)
    assert (root.st_uid, root.st_gid, stat.S_IMODE(root.st_mode)) == (user.uid, user.gid, 0o750)
    for n in NODES:
        st = os.stat(job.mounts[n][1])
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (user.uid, user.gid, 0o750), n
        assert stat.S_ISDIR(st.st_mode)
        # A mount root is node 1, like the striped mount's; the striped mount shows the
        # same directory under its instance number.
        assert st.st_ino == root.st_ino == 1
        assert os.stat(os.path.join(striped0, PRIVATE, n)).st_ino != 1
    d = os.stat(os.path.join(striped0, PRIVATE))
    assert (d.st_uid, d.st_gid, stat.S_IMODE(d.st_mode)) == (user.uid, user.gid, 0o750)
    # Below the root, numbers are the instance's: one file, one number in both mounts.
    user.run(write, os.path.join(priv0, "numbered"), b"n")
    assert os.stat(os.path.join(priv0, "numbered")).st_ino == \
        os.stat(os.path.join(striped0, PRIVATE, "compute0", "numbered")).st_ino
    # The owner works in it; another user (not in the group) cannot even list it.
    assert "numbered" in user.run(os.listdir, priv0)
    assert user2.errno(os.listdir, priv0) == errno.EACCES


def test_dotdot_stays_inside_and_ls_works(job):
    user = job.user
    _, priv0 = job.mounts["compute0"]
    parent = os.path.dirname(priv0)
    user.run(os.mkdir, os.path.join(priv0, "sub"))
    # `..` of the mount root is the mount point's parent (the kernel's business), never
    # the instance's .spillway-private directory or root.
    r = subprocess.run(["sh", "-c", f'cd "{priv0}" && cd .. && pwd -P && ls -la "{priv0}"'],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == os.path.realpath(parent)
    names = [ln.split()[-1] for ln in lines[2:]]
    assert {".", "..", "sub"} <= set(names), r.stdout
    assert PRIVATE not in names and "compute1" not in names and "shared" not in names
    up = os.stat(os.path.join(priv0, ".."))
    assert (up.st_dev, up.st_ino) == (os.stat(parent).st_dev, os.stat(parent).st_ino)
    assert os.stat(os.path.join(priv0, "sub", "..")).st_ino == os.stat(priv0).st_ino
    assert os.path.realpath(os.path.join(priv0, "sub", "..", "..")) == os.path.realpath(parent)
    # The same as the owner, from inside: `cd ..` twice from sub lands beside the mount.
    r = user.run(subprocess.run, ["sh", "-c", f'cd "{priv0}/sub" && cd ../.. && pwd -P'],
                 capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == os.path.realpath(parent), r


def test_rename_link_and_statfs_inside_a_private_mount(site, job):
    user = job.user
    striped0, priv0 = job.mounts["compute0"]

    def work(root):
        os.mkdir(os.path.join(root, "d"))
        with open(os.path.join(root, "f"), "wb") as f:
            f.write(os.urandom(3 * MiB))
        os.rename(os.path.join(root, "f"), os.path.join(root, "d", "g"))
        os.link(os.path.join(root, "d", "g"), os.path.join(root, "hard"))
        os.rename(os.path.join(root, "d"), os.path.join(root, "e"))
        os.symlink("e/g", os.path.join(root, "soft"))
        # Renaming over the mount root or moving it is refused by the kernel.
        busy = H.errno_of(os.rename, root, root + "-moved")
        return (os.stat(os.path.join(root, "hard")).st_nlink, read(os.path.join(root, "soft")),
                busy)

    nlink, data, busy = user.run(work, priv0)
    assert nlink == 2 and len(data) == 3 * MiB
    assert busy in (errno.EBUSY, errno.EXDEV, errno.EACCES, errno.EPERM)
    mine = os.path.join(striped0, PRIVATE, "compute0")
    assert read(os.path.join(mine, "e", "g")) == data
    assert os.stat(os.path.join(mine, "hard")).st_ino == os.stat(os.path.join(mine, "e", "g")).st_ino
    assert os.readlink(os.path.join(mine, "soft")) == "e/g"
    # statfs is the instance's, whichever mount asks.
    a, b = os.statvfs(priv0), os.statvfs(striped0)
    assert a.f_blocks * a.f_frsize == 2 * GiB
    assert (a.f_blocks, a.f_frsize) == (b.f_blocks, b.f_frsize)
    # Striping is the instance's: a 16 MiB file spreads over both servers.
    big = os.path.join(priv0, "big")
    user.run(write, big, b"\xab" * (16 * MiB))
    r = site.run("stripes", big, "--json")
    stripes = json.loads(r.stdout)["stripes"]
    assert len(stripes) == 2 and {s["server"] for s in stripes if s["bytes"] == 8 * MiB} == {0, 1}, \
        r.stdout


def test_a_second_client_of_one_node_sees_the_same_namespace(site, job, tmp_path):
    """`spillway mount --root-dir` by hand, with the agent's descriptor of compute0."""
    _, priv0 = job.mounts["compute0"]
    desc = os.path.join(site.dir, "agent", f"activation-{job.acts['private']['id']}.json")
    mnt = tmp_path / "again"
    mnt.mkdir()
    site.run("mount", "--instance", desc, "--root-dir", f"/{PRIVATE}/compute0", str(mnt))
    try:
        assert "from0" in os.listdir(mnt)
        assert "from1" not in os.listdir(mnt)
        assert os.stat(mnt).st_ino == os.stat(priv0).st_ino
    finally:
        site.run("umount", str(mnt))
    # A new directory is made on first use (by root here: owned like the instance root).
    site.run("mount", "--instance", desc, "--root-dir", f"/{PRIVATE}/scratch/deeper", str(mnt))
    try:
        st = os.stat(mnt)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (job.user.uid, 0o750)
        assert os.listdir(mnt) == []
    finally:
        site.run("umount", str(mnt))
    striped0 = job.mounts["compute0"][0]
    assert os.path.isdir(os.path.join(striped0, PRIVATE, "scratch", "deeper"))
    # What cannot be a root is refused: a file, and paths that are not plain.
    job.user.run(write, os.path.join(striped0, "plainfile"), b"x")
    r = site.run("mount", "--instance", desc, "--root-dir", "/plainfile", str(mnt), check=False)
    assert r.returncode != 0 and not H.is_mounted(str(mnt))
    for bad in ("relative", "/a/../b", "/."):
        r = site.run("mount", "--instance", desc, "--root-dir", bad, str(mnt), check=False)
        assert r.returncode != 0 and "root directory" in r.stderr, (bad, r.stderr)
    assert not H.is_mounted(str(mnt))


def test_libdatawarp_paths_are_the_mounts(site, job):
    """The control channel takes paths below the mount (what libdatawarp sends) and
    gives failures back the same way: a private mount's requests reach the manager as
    paths below the node's directory."""

    user = job.user
    striped0, priv0 = job.mounts["compute0"]
    src = os.path.join(site.pfs, "in.dat")
    write(src, b"staged through the private mount\n")
    os.chown(src, user.uid, user.gid)

    def stage_and_wait(mnt):
        r = ioctl_raw(mnt, ioctl_msg(b"stage", b"in", b"file", b"immediate", src.encode(), b"/in.dat"))
        assert r[0] == b"0", r
        deadline = time.monotonic() + 60
        while True:
            w = ioctl_raw(mnt, ioctl_msg(b"wait", b"file", b"/in.dat", b"10000"))
            if w[0] == b"0" or time.monotonic() > deadline:
                break
        c = ioctl_raw(mnt, ioctl_msg(b"counts", b"file", b"/in.dat"))
        bad = ioctl_raw(mnt, ioctl_msg(b"stage", b"in", b"file", b"immediate",
                               os.path.join(site.pfs, "missing").encode(), b"/missing.dat"))
        assert bad[0] == b"0", bad
        deadline = time.monotonic() + 60
        while ioctl_raw(mnt, ioctl_msg(b"wait", b"file", b"/missing.dat", b"10000"))[0] == \
                str(-errno.EAGAIN).encode() and time.monotonic() < deadline:
            pass
        return w, c, ioctl_raw(mnt, ioctl_msg(b"failures", b""))

    w, counts, failures = user.run(stage_and_wait, priv0)
    assert w[0] == b"0", w
    assert counts[:2] == [b"0", b"1"], counts  # result, complete=1
    assert read(os.path.join(priv0, "in.dat")) == b"staged through the private mount\n"
    assert read(os.path.join(striped0, PRIVATE, "compute0", "in.dat")) == read(src)
    assert not os.path.exists(os.path.join(striped0, "in.dat"))
    # failures: result 0, more 0, then (mount path, -errno) pairs.
    assert failures[:2] == [b"0", b"0"], failures
    assert failures[2:] == [b"/missing.dat", str(-errno.ENOENT).encode()], failures
    # The other node's private mount knows nothing of it.
    assert user.run(ioctl_raw, job.mounts["compute1"][1], ioctl_msg(b"failures", b""))[:2] == [b"0", b"0"]
    assert len(user.run(ioctl_raw, job.mounts["compute1"][1], ioctl_msg(b"failures", b""))) == 2


def test_private_is_refused_on_persistent_instances(site):
    s = site.api("POST", "/dw/v1/sessions", {"token": "sharedname", "client_nodes": []})
    try:
        i = site.api("POST", "/dw/v1/instances", {"session": s["id"], "capacity": 1})
        status, out = site.request("POST", "/dw/v1/configurations",
                                   {"instance": i["id"], "type": "scratch",
                                    "access_mode": "private"})
        assert status == 400 and "job instances" in out["error"], out
        # Load-balanced replicas are for persistent instances too (docs/cache.md
        # section 6), and then alone on the instance.
        c = site.api("POST", "/dw/v1/configurations",
                     {"instance": i["id"], "type": "scratch", "access_mode": "ldbal"})
        assert c["access_mode"] == "ldbal", c
        status, out = site.request("POST", "/dw/v1/configurations",
                                   {"instance": i["id"], "type": "scratch", "access_mode": "stripe"})
        assert status == 400 and "load-balanced" in out["error"], out
    finally:
        site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
        site.wait_gone("sessions", s["id"])
