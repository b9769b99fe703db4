"""dwstat and dwcli against a real local site (`spillway local up`): a real manager over
HTTPS with MUNGE from the session's private munged, real storage servers and a real
agent. Nothing is mocked: every table is the manager's answer as the commands print it.

Covers: pool -> nodes -> session -> instance -> configuration -> activation through dwcli
with the spec's examples, I/O through the mount, every dwstat table and `most`, --json,
drain/undrain, rm of everything, a failed mount shown by `dwstat activations`, errors
(manager refusals exit 1 with `dwcli: <message>`, bad usage exit 2, non-admins, an
unreachable manager) and `dwstat sessions` under 100 ms with 1,000 sessions.

Binaries: $SPILLWAY_DWTOOLS_DIR/{dwstat,dwcli}, else target/release, built with
`cargo build --release -p spillway-dwtools` when missing."""

import json
import os
import shutil
import socket
import subprocess
import time

import pytest

import spwhelpers as H
from sitehelpers import running_site

GiB = 1 << 30


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tools(spillway_bin):
    """{"dwstat": path, "dwcli": path}; skips the module when `spillway local` is missing."""
    r = subprocess.run([spillway_bin, "local", "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("`spillway local` is not available in this build: no site to test dwstat/dwcli against")
    d = os.environ.get("SPILLWAY_DWTOOLS_DIR") or os.path.join(H.REPO, "target", "release")
    paths = {name: os.path.join(d, name) for name in ("dwstat", "dwcli")}
    if not all(os.access(p, os.X_OK) for p in paths.values()) and not os.environ.get("SPILLWAY_DWTOOLS_DIR"):
        b = subprocess.run(["cargo", "build", "--release", "-p", "spillway-dwtools"],
                           cwd=H.REPO, capture_output=True, text=True, timeout=3600)
        if b.returncode != 0:
            pytest.fail("cargo build --release -p spillway-dwtools failed:\n" + b.stderr[-4000:],
                        pytrace=False)
    for p in paths.values():
        if not os.access(p, os.X_OK):
            pytest.fail(f"{p} not found", pytrace=False)
    return paths


@pytest.fixture
def bare_site(tools, spillway_bin, munged, _local_base):
    """A site with no pool and no nodes registered: dwcli does that."""
    with running_site(spillway_bin, _local_base, munged, prefix="dwsite-", bare=True, servers=2) as s:
        yield s


@pytest.fixture
def site(tools, spillway_bin, munged, _local_base):
    """A ready site: pool wlm_pool (1 GiB granules), one 8 GiB server, agent on compute0."""
    with running_site(spillway_bin, _local_base, munged, prefix="dwsite-", servers=1) as s:
        yield s


class Tools:
    """Runs dwstat/dwcli with a site's client configuration."""

    def __init__(self, tools, site):
        self.tools = tools
        self.site = site

    def user_copy(self, prog):
        """The binary copied next to the site (whose parent is 0755): the checkout may lie
        below a directory other users cannot enter (CI's clone in a 0700 mktemp dir)."""
        d = os.path.join(os.path.dirname(self.site.dir), "bin")
        os.makedirs(d, mode=0o755, exist_ok=True)
        dst = os.path.join(d, prog)
        if not os.path.exists(dst):
            shutil.copy(self.tools[prog], dst + ".tmp")
            os.chmod(dst + ".tmp", 0o755)
            os.replace(dst + ".tmp", dst)
        return dst

    def run(self, prog, *args, check=True, config=None, user=None):
        exe = self.tools[prog] if user is None else self.user_copy(prog)
        cmd = [exe, "--config", config or self.site.config, *map(str, args)]
        if user is not None:
            cmd = ["runuser", "-u", user, "--", *cmd]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)}: exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}")
        return r

    def stat(self, *args, **kw):
        return self.run("dwstat", *args, **kw).stdout

    def cli(self, *args, **kw):
        return self.run("dwcli", *args, **kw).stdout

    def rows(self, table):
        """dwstat TABLE as a list of dicts keyed by the header (table lines only)."""
        lines = self.stat(table).splitlines()
        header = lines[0].split()
        return [dict(zip(header, line.split())) for line in lines[1:]
                if len(line.split()) == len(header) and not line.startswith(("activation ", "node "))]

    def created_id(self, out, kind):
        words = out.split()
        assert words[:2] == ["created", kind], out
        return words[2]


@pytest.fixture
def dw(tools, request):
    site = request.getfixturevalue("bare_site" if "bare_site" in request.fixturenames else "site")
    return Tools(tools, site)


# --------------------------------------------------------------------------- tests


def test_whole_path_through_dwcli_and_dwstat(bare_site, dw):
    site = bare_site
    # A bare site: every table is its header alone.
    assert dw.stat() == "pool units quantity free gran\n"
    assert dw.stat("sessions") == "sess state token creator owner created expiration nodes\n"

    out = dw.cli("create", "pool", "--name", "ssd", "--granularity", "1GiB")
    assert out == "created pool ssd granularity=1GiB\n"
    for s in site.state()["servers"]:
        out = dw.cli("create", "node", "--name", s["name"], "--address", s["listen"],
                     "--pool", "ssd", "--capacity", "4GiB")
        assert out.startswith(f"created node {s['name']} address={s['listen']} pool=ssd"), out
    site.wait(lambda: [ln.split() for ln in dw.stat().splitlines()[1:]]
              == [["ssd", "bytes", "8GiB", "8GiB", "1GiB"]], "nodes online")
    nodes = dw.rows("nodes")
    assert [(n["node"], n["pool"], n["online"], n["drain"], n["gran"], n["capacity"]) for n in nodes] == [
        ("server0", "ssd", "true", "false", "1GiB", "4GiB"),
        ("server1", "ssd", "true", "false", "1GiB", "4GiB"),
    ]
    assert dw.cli("ls", "nodes") == dw.stat("nodes")

    # The spec's examples, in order.
    sess = dw.created_id(dw.cli("create", "session", "--hosts", site.node, "--owner", "0",
                                "--creator", "CLI", "--token", "refdb"), "session")
    out = dw.cli("create", "instance", "--label", "refdb", "--capacity", "3GiB", "--session", sess,
                 "--pool", "ssd")
    inst = dw.created_id(out, "instance")
    assert out.split()[3:] == ["label=refdb", f"session={sess}", "pool=ssd", "bytes=3GiB", "nodes=2"], out
    conf = dw.created_id(dw.cli("create", "configuration", "--root-permissions", "0755", "--group", "0",
                                "--access-mode", "striped", "--type", "scratch", "--instance", inst),
                         "configuration")
    mount = os.path.join(site.dir, "mounts", "refdb")
    out = dw.cli("create", "activation", "--mount", mount, "--session", sess, "--configuration", conf)
    activ = dw.created_id(out, "activation")
    assert out == f"created activation {activ} session={sess} configuration={conf} mount={mount}\n"

    def mounted():
        rows = [r for r in dw.rows("activations") if r["activ"] == activ]
        return rows and rows[0]["state"] == "CA---" and rows[0]["status"] == "mounted" and rows[0]

    row = site.wait(mounted, "the activation mounted")
    assert (row["sess"], row["conf"], row["nodes"], row["mount"]) == (sess, conf, "1", mount)
    assert H.is_mounted(mount)
    H.write_file(os.path.join(mount, "f"), b"y" * (1 << 20))
    assert os.path.getsize(os.path.join(mount, "f")) == 1 << 20

    # Tables as users script them.
    site.wait(lambda: all(i["state"] == "CA---" for i in dw.rows("instances")), "instance actualized")
    line = [ln for ln in dw.stat("sessions").splitlines() if " refdb " in ln][0].split()
    assert line[:5] == [sess, "CA---", "refdb", "CLI", "0"] and line[6:] == ["never", "1"], line
    line = [ln for ln in dw.stat("instances").splitlines()[1:] if ln.split()[2] == sess][0].split()
    assert line[4] == "2", "5th column = servers"
    assert line[0] == inst and line[3] == "3GiB" and line[7:] == ["true", "refdb", "public", "1"], line
    assert [(c["conf"], c["inst"], c["type"], c["access_type"], c["activs"])
            for c in dw.rows("configurations")] == [(conf, inst, "scratch", "stripe", "1")]
    frags = dw.rows("fragments")
    assert sorted(f["node"] for f in frags) == ["server0", "server1"], frags
    assert sorted(f["capacity"] for f in frags) == ["1GiB", "2GiB"], frags
    assert {(f["inst"], f["gran"], f["state"]) for f in frags} == {(inst, "1GiB", "CA---")}, frags
    assert dw.stat().splitlines()[1].split() == ["ssd", "bytes", "8GiB", "5GiB", "1GiB"]

    most = dw.stat("most")
    assert most.splitlines()[1].split()[0] == "ssd", "line 2 is the default pool's row"
    assert [t.split()[0] for t in most.split("\n\n")] == ["pool", "sess", "inst", "conf", "activ"]
    assert dw.stat("--all", "most") == most

    # --json: the manager's answer, re-indented.
    js = dw.stat("sessions", "--json")
    assert js.startswith('{\n  "sessions": [\n    {\n'), js
    assert json.loads(js) == site.api("GET", "/dw/v1/sessions")
    both = json.loads(dw.stat("most", "--json"))
    assert list(both) == ["pools", "sessions", "instances", "configurations", "activations"]
    assert json.loads(dw.cli("ls", "pools", "--json")) == site.api("GET", "/dw/v1/pools")

    # Drain and undrain.
    assert "drain=true" in dw.cli("update", "node", "--name", "server1", "--drain")
    assert [n["drain"] for n in dw.rows("nodes")] == ["false", "true"]
    assert "drain=false" in dw.cli("update", "node", "--name", "server1", "--no-drain")

    # Take everything down again.
    out = dw.cli("rm", "activation", "--id", activ)
    assert out.startswith(f"destroying activation {activ} state=D"), out
    site.wait(lambda: dw.rows("activations") == [], "activation gone")
    assert not H.is_mounted(mount)
    out = dw.cli("rm", "session", "--id", sess)
    assert out.startswith(f"destroying session {sess} state=D"), out
    site.wait(lambda: dw.stat("sessions").count("\n") == 1, "session gone")
    assert dw.stat("instances").count("\n") == 1
    for s in site.state()["servers"]:
        assert dw.cli("rm", "node", "--name", s["name"]) == f"removed node {s['name']}\n"
    assert dw.cli("rm", "pool", "--name", "ssd") == "removed pool ssd\n"
    assert dw.stat() == "pool units quantity free gran\n"


def test_session_update_and_json_output(site, dw):
    out = dw.cli("create", "session", "--token", "upd", "--json")
    s = json.loads(out)
    assert s["token"] == "upd" and s["links"]["client_nodes"] == []
    assert out.startswith('{\n  "id": '), "the manager's field order"
    out = dw.cli("update", "session", "--id", s["id"], "--hosts", "compute0,compute9")
    assert out.startswith(f"updated session {s['id']} state=") and out.endswith(" nodes=2\n"), out
    row = [r for r in dw.rows("sessions") if r["sess"] == str(s["id"])][0]
    assert row["nodes"] == "2"
    dw.cli("update", "session", "--id", s["id"], "--hosts", "")
    assert [r for r in dw.rows("sessions") if r["sess"] == str(s["id"])][0]["nodes"] == "0"
    dw.cli("rm", "session", "--id", s["id"])
    site.wait_gone("sessions", s["id"])


def test_a_failed_mount_is_shown_by_dwstat(site, dw):
    s, i, c = site.persistent("badmount", GiB)
    blocker = os.path.join(site.dir, "mounts", "blocker")
    with open(blocker, "w") as f:
        f.write("not a directory\n")
    activ = dw.created_id(dw.cli("create", "activation", "--mount", blocker + "/inner",
                                 "--session", s["id"], "--configuration", c["id"]), "activation")

    def failed():
        out = dw.stat("activations")
        return f"activation {activ} on {site.node}: failed: " in out and out

    out = site.wait(failed, "the failure in dwstat activations")
    row = [r for r in dw.rows("activations") if r["activ"] == activ][0]
    assert row["status"] == "failed" and row["state"][1] == "-", row
    assert "blocker" in out.split(f"activation {activ} on {site.node}: failed: ", 1)[1]


def test_errors_exit_1_with_the_managers_message(site, dw):
    r = dw.run("dwcli", "rm", "pool", "--name", "nosuch", check=False)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.startswith("dwcli: ") and "nosuch" in r.stderr, r.stderr

    s = json.loads(dw.cli("create", "session", "--token", "toobig", "--json"))
    r = dw.run("dwcli", "create", "instance", "--capacity", "1000GiB", "--session", s["id"], check=False)
    assert r.returncode == 1 and r.stderr.startswith("dwcli: ") and "free" in r.stderr, r.stderr
    r = dw.run("dwcli", "create", "instance", "--capacity", "1GiB", "--session", s["id"],
               "--pool", "nosuchpool", check=False)
    assert r.returncode == 1 and "nosuchpool" in r.stderr, r.stderr
    dw.cli("rm", "session", "--id", s["id"])

    r = dw.run("dwstat", "nonsense", check=False)
    assert r.returncode == 2 and r.stdout == ""
    r = dw.run("dwcli", "create", "pool", "--name", "p", "--granularity", "1.5GiB", check=False)
    assert r.returncode == 2 and "decimal" in r.stderr
    r = dw.run("dwcli", "create", "configuration", "--access-mode", "sideways", "--type", "scratch",
               "--instance", "1", check=False)
    assert r.returncode == 2 and "access mode" in r.stderr


def test_non_admins_are_refused_admin_verbs_but_see_tables(site, dw, user):
    for p in (site.config, os.path.join(site.dir, "tls", "ca.pem")):
        if os.stat(p).st_mode & 0o004 == 0:
            pytest.skip(f"{p} is not readable by other users in this site layout")
    r = dw.run("dwcli", "create", "pool", "--name", "mine", "--granularity", "1GiB", check=False,
               user=user.name)
    assert r.returncode == 1 and r.stderr.startswith("dwcli: ") and "admin" in r.stderr, r.stderr
    out = dw.stat("pools", user=user.name)
    assert out.splitlines()[1].split()[0] == "wlm_pool"


def test_unreachable_manager_fails_fast(site, dw, tmp_path):
    conf = tmp_path / "spillway.conf"
    with socket.socket() as sk:  # a port nothing listens on once closed
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    conf.write_text(f"manager_url = https://127.0.0.1:{port}\nca_file = {site.dir}/tls/ca.pem\n")
    t0 = time.monotonic()
    r = dw.run("dwstat", "sessions", config=str(conf), check=False)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("dwstat: cannot reach the manager at https://127.0.0.1:"), r.stderr
    assert time.monotonic() - t0 < 5
    conf.write_text("manager_url = http://nope\nca_file = /x\n")
    r = dw.run("dwstat", config=str(conf), check=False)
    assert r.returncode == 1 and "https://" in r.stderr, r.stderr


@pytest.mark.timeout(600)
def test_dwstat_sessions_under_100ms_with_1000_sessions(site, dw):
    for k in range(1000):
        site.api("POST", "/dw/v1/sessions", {"token": f"perf{k:04d}", "client_nodes": ["compute0"]})
    assert dw.stat("sessions").count("\n") == 1001
    times = []
    for _ in range(7):
        t0 = time.monotonic()
        dw.stat("sessions")
        times.append(time.monotonic() - t0)
    print(f"\ndwstat sessions with 1000 sessions: best {min(times) * 1000:.1f} ms, "
          f"median {sorted(times)[3] * 1000:.1f} ms")
    assert min(times) < 0.1, times
