"""Issue 14, item 1: where root mounts. Against a real local site (manager over HTTPS
with MUNGE, storage servers, an agent mounting with the FUSE client) and real
unprivileged users (spwtest, spwtest2):

* a user's activation naming `mount` is refused (REST and `dwcli`), even below the
  mount root; the default path still works;
* the reproduction: a user's 0777 instance activated, a symlink planted in it, then
  activations at or through it: refused by the manager (nested in a live activation),
  and paths the manager accepts from an admin but that cross a symlink, a user-owned
  directory or another mount fail at the agent (`failed`, with the reason), with
  nothing mounted over the target;
* equal, nested and parent mount points of live activations refused, by component;
* every mount is `nosuid,nodev`;
* one mount and one FUSE process per activation however often the agent passes, and
  nothing (mount, process, directory) after its removal.
"""

import os
import shutil
import subprocess
import time

import pytest

import spwhelpers as H
from sitehelpers import running_site

GiB = 1 << 30


@pytest.fixture(scope="module")
def site(spillway_bin, munged, _local_base):
    with running_site(spillway_bin, _local_base, munged, servers=1) as s:
        yield s


@pytest.fixture(scope="module")
def dwcli(site):
    """dwcli copied next to the site (users may not enter the checkout), built if missing."""
    src = os.path.join(H.REPO, "target", "release", "dwcli")
    if not os.access(src, os.X_OK):
        b = subprocess.run(["cargo", "build", "--release", "-p", "spillway-dwtools"],
                           cwd=H.REPO, capture_output=True, text=True, timeout=3600)
        assert b.returncode == 0, b.stderr[-4000:]
    dst = os.path.join(os.path.dirname(site.dir), "bin-mounts", "dwcli")
    os.makedirs(os.path.dirname(dst), mode=0o755, exist_ok=True)
    shutil.copy(src, dst)
    os.chmod(dst, 0o755)
    return dst


def mount_root(site):
    return os.path.join(os.path.realpath(site.dir), "mounts")


def mountinfo():
    """[(mount id, mount point, options, fstype, source)] of this namespace."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            l, r = left.split(), right.split()
            out.append((int(l[0]), l[4].replace("\\040", " "), l[5], r[0], r[1]))
    return out


def mounts_at(path):
    return [m for m in mountinfo() if m[1] == path]


def fuse_clients(activation_id):
    """Pids of `spillway mount` processes serving this activation (by its descriptor)."""
    want = f"activation-{activation_id}.json".encode()
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if len(args) > 1 and args[1] == b"mount" and any(a.endswith(want) for a in args):
            try:
                with open(f"/proc/{p}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                        continue
            except OSError:
                continue
            pids.append(int(p))
    return pids


def user_objects(site, user, token, perms=0o755, n_conf=1):
    """A user's own session on this node, an instance and configurations."""
    s = site.api("POST", "/dw/v1/sessions", {"token": token, "client_nodes": [site.node]},
                 as_user=user.name)
    i = site.api("POST", "/dw/v1/instances", {"session": s["id"], "capacity": GiB},
                 as_user=user.name)
    cs = [site.api("POST", "/dw/v1/configurations",
                   {"instance": i["id"], "type": "scratch", "access_mode": "stripe",
                    "root_permissions": perms}, as_user=user.name)
          for _ in range(n_conf)]
    return s, i, cs


def admin_objects(site, token, n_conf):
    s, i, c = site.persistent(token, GiB)
    cs = [c] + [site.api("POST", "/dw/v1/configurations",
                         {"instance": i["id"], "type": "scratch", "access_mode": "stripe"})
                for _ in range(n_conf - 1)]
    return s, i, cs


def wait_failed(site, aid):
    def failed():
        o = site.api("GET", f"/dw/v1/activations/{aid}")
        n = o["nodes"][0]
        return n["status"] == "failed" and n["error"] and o
    return site.wait(failed, f"activation {aid} reported failed")["nodes"][0]["error"]


def drop(site, s):
    site.api("DELETE", f"/dw/v1/sessions/{s['id']}")
    site.wait_gone("sessions", s["id"], timeout=40)


def test_users_never_choose_where_root_mounts(site, user, dwcli):
    m = mount_root(site)
    s, i, (c,) = user_objects(site, user, "usermount")
    try:
        for path in [m + "/batch", m + "/mine", "/etc/cron.d", m]:
            status, out = site.request("POST", "/dw/v1/activations",
                                       {"session": s["id"], "configuration": c["id"], "mount": path},
                                       as_user=user.name)
            assert status == 403, (path, status, out)
            assert "leave `mount` out" in out["error"], out
            assert f"{m}/s{s['id']}-c{c['id']}" in out["error"], out
        r = subprocess.run(["runuser", "-u", user.name, "--", dwcli, "--config", site.config,
                            "create", "activation", "--mount", m + "/batch",
                            "--session", str(s["id"]), "--configuration", str(c["id"])],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "leave `mount` out" in r.stderr, (r.returncode, r.stdout, r.stderr)
        assert not [x for x in site.api("GET", "/dw/v1/activations")["activations"]
                    if x["mount"] == m + "/batch"]
        assert not os.path.exists(m + "/batch") or not mounts_at(m + "/batch")

        # The default still works, as the user.
        a = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]},
                     as_user=user.name)
        assert a["mount"] == f"{m}/s{s['id']}-c{c['id']}"
        site.wait_state("activations", a["id"])
        assert H.is_mounted(a["mount"])
    finally:
        drop(site, s)


def test_a_users_instance_cannot_steer_roots_mounts(site, user, as_user):
    m = mount_root(site)
    # The root-owned directory the attack aims at, with a marker.
    target = os.path.join(site.dir, "target")
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, "marker"), "w") as f:
        f.write("root's\n")
    s, i, (c,) = user_objects(site, user, "pwn", perms=0o777)
    a_s, _, a_cs = admin_objects(site, "pwnadmin", 4)
    try:
        a = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]},
                     as_user=user.name)
        site.wait_state("activations", a["id"])
        mnt = a["mount"]
        # The user plants a symlink to the target in their 0777 instance.
        as_user(user.uid, user.gid, os.symlink, target, os.path.join(mnt, "pwn"))
        assert os.path.islink(os.path.join(mnt, "pwn"))

        # Through the user's live mount: refused by the manager, even for an admin.
        status, out = site.request("POST", "/dw/v1/activations",
                                   {"session": a_s["id"], "configuration": a_cs[0]["id"],
                                    "mount": mnt + "/pwn"})
        assert status == 409 and "inside" in out["error"], (status, out)
        # Above it (the old `--mount $M/batch` covering every job): refused too.
        status, out = site.request("POST", "/dw/v1/activations",
                                   {"session": a_s["id"], "configuration": a_cs[0]["id"],
                                    "mount": m + "/pwnparent"})
        assert status in (200, 201), (status, out)
        drop_a = out
        status, out = site.request("POST", "/dw/v1/activations",
                                   {"session": a_s["id"], "configuration": a_cs[1]["id"],
                                    "mount": m + "/pwnparent/sub"})
        assert status == 409, (status, out)
        site.api("DELETE", f"/dw/v1/activations/{drop_a['id']}")
        site.wait_gone("activations", drop_a["id"])

        # Paths the manager accepts but that cross a symlink, a user-owned directory or
        # another mount: the agent refuses each with the reason, mounting nothing.
        os.symlink(target, os.path.join(m, "alink"))
        userdir = os.path.join(m, "userdir")
        os.mkdir(userdir)
        os.chown(userdir, user.uid, user.gid)
        as_user(user.uid, user.gid, os.symlink, target, os.path.join(userdir, "pwn"))
        other = os.path.join(m, "othermount")
        os.mkdir(other)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "spwtesttmpfs", other], check=True)
        try:
            cases = [(m + "/alink", "symbolic link"),
                     (m + "/userdir/pwn", f"owned by uid {user.uid}"),
                     (other + "/x", "inside another mount")]
            for (path, why), conf in zip(cases, a_cs[1:]):
                act = site.api("POST", "/dw/v1/activations",
                               {"session": a_s["id"], "configuration": conf["id"], "mount": path})
                err = wait_failed(site, act["id"])
                assert why in err, (path, err)
                site.api("DELETE", f"/dw/v1/activations/{act['id']}")
                site.wait_gone("activations", act["id"])
            # Nothing got mounted over the target or below those paths.
            assert not mounts_at(target)
            assert os.listdir(target) == ["marker"]
            assert not [x for x in mountinfo() if x[1].startswith(other + "/")]
            assert os.listdir(other) == []
        finally:
            subprocess.run(["umount", other], check=False)
    finally:
        drop(site, s)
        drop(site, a_s)


def test_nested_parent_and_equal_mount_points_are_refused(site):
    m = mount_root(site)
    s, _, cs = admin_objects(site, "nested", 5)
    try:
        a = site.api("POST", "/dw/v1/activations",
                     {"session": s["id"], "configuration": cs[0]["id"], "mount": m + "/n/a"})
        for path in [m + "/n/a", m + "/n/a/b", m + "/n", m + "/n/a/b/c"]:
            status, out = site.request("POST", "/dw/v1/activations",
                                       {"session": s["id"], "configuration": cs[1]["id"], "mount": path})
            assert status == 409, (path, status, out)
        # By component: siblings sharing a prefix are fine.
        b = site.api("POST", "/dw/v1/activations",
                     {"session": s["id"], "configuration": cs[1]["id"], "mount": m + "/n/ab"})
        # Not strictly below the mount root, or not normalised: refused.
        for path in [m, os.path.dirname(m) + "/elsewhere", "/etc", m + "/../x", m + "//x", m + "/./x"]:
            status, out = site.request("POST", "/dw/v1/activations",
                                       {"session": s["id"], "configuration": cs[2]["id"], "mount": path})
            assert status == 400, (path, status, out)
        # Once an activation is gone its path is free again, below it too.
        site.wait_state("activations", a["id"])
        site.api("DELETE", f"/dw/v1/activations/{a['id']}")
        site.wait_gone("activations", a["id"])
        site.api("POST", "/dw/v1/activations",
                 {"session": s["id"], "configuration": cs[3]["id"], "mount": m + "/n/a/b"})
        site.wait_state("activations", b["id"])
    finally:
        drop(site, s)


def test_one_mount_and_one_process_nosuid_nodev_and_nothing_left(site, user):
    s, i, cs = user_objects(site, user, "onemount", n_conf=3)
    try:
        a = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": cs[0]["id"]},
                     as_user=user.name)
        site.wait_state("activations", a["id"])
        mnt = a["mount"]
        # Several agent passes: each change to the node's work wakes the agent.
        for c in cs[1:]:
            b = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]},
                         as_user=user.name)
            site.wait_state("activations", b["id"])
            site.api("DELETE", f"/dw/v1/activations/{b['id']}", as_user=user.name)
            site.wait_gone("activations", b["id"])
        time.sleep(2)
        ms = mounts_at(mnt)
        assert len(ms) == 1, ms
        opts = ms[0][2].split(",")
        assert "nosuid" in opts and "nodev" in opts, ms
        assert ms[0][3] == "fuse.spillway" and ms[0][4].startswith("spillway:"), ms
        # Every Spillway mount of this site is nosuid,nodev.
        for x in mountinfo():
            if x[4].startswith("spillway:") and x[1].startswith(os.path.realpath(site.dir) + "/"):
                assert {"nosuid", "nodev"} <= set(x[2].split(",")), x
        assert len(fuse_clients(a["id"])) == 1, fuse_clients(a["id"])

        site.api("DELETE", f"/dw/v1/activations/{a['id']}", as_user=user.name)
        site.wait_gone("activations", a["id"])
        site.wait(lambda: not fuse_clients(a["id"]), "the client to exit", timeout=20)
        assert not mounts_at(mnt)
        assert not os.path.exists(mnt)
    finally:
        drop(site, s)
