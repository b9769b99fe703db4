"""A local Spillway site (`spillway local up`): manager, storage servers and an agent as
real processes, HTTPS with the site CA, MUNGE from the session's private munged.

    site = LocalSite(binary, directory, munged, servers=3, pfs_roots=["/pfs"])
    site.up()
    site.api("POST", "/dw/v1/sessions", {...})            # as root (admin)
    site.api("GET", "/dw/v1/sessions", as_user="spwtest")  # as that user
    site.kill("server1"); site.start("server1"); site.down()

    with running_site(binary, parent, munged, servers=2) as site:  # a module's fixture
        yield site

Also the manager's documented REST shapes (docs/openapi.json) and `conforms`, which
checks an answer against one of them.
"""

import contextlib
import json
import os
import re
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import spwhelpers as H

SITE_LOGS = ("manager", "agent", "server0")


def site_dirs(parent, prefix, users):
    """A fresh 0755 directory below `parent` holding `pfs/` (a PFS root, 0755, with a
    0755 directory of each user's own, `pfs/<name>`) and `site/` (for a LocalSite):
    (base, pfs, site)."""
    base = tempfile.mkdtemp(prefix=prefix, dir=parent)
    os.chmod(base, 0o755)
    pfs, site = os.path.join(base, "pfs"), os.path.join(base, "site")
    for d in (pfs, site):
        os.mkdir(d)
        os.chmod(d, 0o755)
    for u in users:
        d = os.path.join(pfs, u.name)
        os.mkdir(d)
        os.chown(d, u.uid, u.gid)
        os.chmod(d, 0o755)
    return base, pfs, site


class ApiError(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


class LocalSite:
    def __init__(self, binary, directory, munged, servers=2, server_capacity="8GiB",
                 granularity="1GiB", node="compute0", bare=False, policy=None, pfs_roots=None,
                 admin_group=None, extra_nodes=None):
        self.bin = binary
        self.dir = directory
        self.munged = munged
        self.servers = servers
        self.server_capacity = server_capacity
        self.granularity = granularity
        self.node = node
        self.bare = bare
        self.policy = policy
        self.pfs_roots = list(pfs_roots or [])  # each passed as --pfs-root
        self.admin_group = admin_group  # manager.conf's admin_group (e.g. the SlurmUser's)
        # More compute nodes on this machine (--extra-node): an agent each, mounting
        # below DIR/nodes/<name> (node_mount gives the path).
        self.extra_nodes = list(extra_nodes or [])
        self.base = directory  # what running_site made for it (with site_dirs: holding pfs/)
        self._ctx = None

    # ------------------------------------------------------------------ processes
    def run(self, *args, check=True, timeout=120):
        r = subprocess.run([self.bin, *args], capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"spillway {' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def up(self):
        args = ["local", "up", "--dir", self.dir, "--servers", str(self.servers),
                "--server-capacity", self.server_capacity, "--granularity", self.granularity,
                "--node", self.node, "--munge-socket", self.munged.socket]
        if self.bare:
            args.append("--bare")
        if self.policy:
            args += ["--policy", self.policy]
        for root in self.pfs_roots:
            args += ["--pfs-root", str(root)]
        if self.admin_group:
            args += ["--admin-group", self.admin_group]
        for n in self.extra_nodes:
            args += ["--extra-node", n]
        self.run(*args)
        return self

    def down(self):
        if os.path.exists(os.path.join(self.dir, "local.json")):
            self.run("local", "down", "--dir", self.dir, check=False)

    def kill(self, what, signal="KILL"):
        self.run("local", "kill", "--dir", self.dir, what, "--signal", signal)

    def start(self, what):
        self.run("local", "start", "--dir", self.dir, what)

    def add_server_tunables(self, text):
        """Append `text` to the servers' server.tunables and restart every server, so
        that they run with it."""
        with open(os.path.join(self.dir, "server.tunables"), "a") as f:
            f.write(text)
        for k in range(self.servers):
            self.kill(f"server{k}")
            self.start(f"server{k}")

    def node_mount(self, node, mount):
        """Where `node`'s agent mounts an activation's `mount` on this machine."""
        if node == self.node:
            return mount
        return os.path.join(os.path.realpath(self.dir), "nodes", node, mount.lstrip("/"))

    def state(self):
        with open(os.path.join(self.dir, "local.json")) as f:
            return json.load(f)

    @property
    def url(self):
        return "https://" + self.state()["manager_listen"]

    @property
    def pfs(self):
        """The first PFS root (--pfs-root), None without one."""
        return self.pfs_roots[0] if self.pfs_roots else None

    @property
    def config(self):
        return os.path.join(self.dir, "spillway.conf")

    def log(self, name):
        try:
            with open(os.path.join(self.dir, "logs", f"{name}.log")) as f:
                return f.read()
        except OSError:
            return ""

    # ------------------------------------------------------------------ the API
    def cred(self, as_user=None):
        return self.munged.munge(as_user=as_user)

    def request(self, method, path, body=None, as_user=None, cred=None, raw=None, headers=None):
        """(status, parsed JSON body) without raising on error statuses."""
        if self._ctx is None:
            self._ctx = ssl.create_default_context(cafile=os.path.join(self.dir, "tls", "ca.pem"))
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        h = {"Content-Type": "application/json"}
        if cred is not False:
            h["Authorization"] = f"MUNGE cred={cred if cred is not None else self.cred(as_user)}"
        h.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
        # A long poll (`?wait=N`) may rightly take N seconds to answer.
        m = re.search(r"[?&]wait=(\d+)", path)
        timeout = 30 + (int(m.group(1)) if m else 0)
        try:
            with urllib.request.urlopen(req, context=self._ctx, timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            text = e.read()
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, {"error": text.decode(errors="replace")}

    def api(self, method, path, body=None, as_user=None):
        status, out = self.request(method, path, body, as_user=as_user)
        if status >= 400:
            raise ApiError(status, out)
        return out

    def wait(self, fn, what, timeout=20.0, interval=0.1):
        """Poll fn() until it returns something truthy."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = fn()
            if last:
                return last
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")

    def wait_state(self, kind, ident, actualized=True, goal="create", timeout=20.0):
        def check():
            status, o = self.request("GET", f"/dw/v1/{kind}/{ident}")
            return status == 200 and o["state"]["goal"] == goal and o["state"]["actualized"] == actualized and o
        return self.wait(check, f"{kind} {ident} {goal}/{actualized}", timeout)

    def wait_gone(self, kind, ident, timeout=20.0):
        return self.wait(lambda: self.request("GET", f"/dw/v1/{kind}/{ident}")[0] == 404,
                         f"{kind} {ident} gone", timeout)

    def persistent(self, token, capacity, owner=0, nodes=None, **extra):
        """session + instance + configuration; returns (session, instance, configuration)."""
        s = self.api("POST", "/dw/v1/sessions", {"token": token, "owner": owner,
                                                 "client_nodes": nodes if nodes is not None else [self.node]})
        i = self.api("POST", "/dw/v1/instances", {"session": s["id"], "capacity": capacity, **extra})
        c = self.api("POST", "/dw/v1/configurations",
                     {"instance": i["id"], "type": "scratch", "access_mode": "stripe"})
        return s, i, c


def print_logs(site, names=SITE_LOGS, tail=None):
    """Print the logs `names` of a site (the last `tail` characters of each)."""
    for name in names:
        text = site.log(name)
        print(f"--- {name} log\n{text[-tail:] if tail else text}")


@contextlib.contextmanager
def running_site(binary, parent, munged, prefix="site-", pfs_users=None, logs=SITE_LOGS,
                 log_tail=None, **kw):
    """A started LocalSite (`**kw` as LocalSite's) in a fresh directory below `parent`,
    0755 so that users reach spillway.conf, the CA and the mounts below it. With
    `pfs_users` (a list, may be empty) the directory is `site_dirs`' layout instead and
    its `pfs/` the site's first PFS root (`site.pfs`). `site.base` is the directory.

    If starting it, or what the `with` body sets up, fails: its logs are printed (the
    last `log_tail` characters of each). Always taken down at the end and its directory
    removed (kept with SPILLWAY_TEST_KEEP=1)."""
    if pfs_users is None:
        base = d = tempfile.mkdtemp(prefix=prefix, dir=parent)
        os.chmod(d, 0o755)
    else:
        base, pfs, d = site_dirs(parent, prefix, pfs_users)
        kw["pfs_roots"] = [pfs, *kw.get("pfs_roots", ())]
    site = LocalSite(binary, d, munged, **kw)
    site.base = base
    try:
        site.up()
        yield site
    except Exception:
        print_logs(site, logs, log_tail)
        raise
    finally:
        site.down()
        if not H.KEEP:
            shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------------- documented shapes

OPENAPI = os.path.join(H.REPO, "docs", "openapi.json")


def openapi_document():
    """docs/openapi.json, the document the manager serves at /dw/v1/openapi.json."""
    with open(OPENAPI) as f:
        return json.load(f)


_SCHEMAS = []  # docs/openapi.json's components.schemas, read on first use


def schema_ref(name):
    """A reference to the documented schema `name`, as `conforms` takes it."""
    return {"$ref": f"#/components/schemas/{name}"}


def conforms(obj, schema, where="answer"):
    """Assert that the JSON value `obj` has the shape `schema` (an OpenAPI schema or a
    reference into docs/openapi.json): no undocumented fields, every required one, the
    documented types and enum values; `where` names the place in a failure."""
    if not _SCHEMAS:
        _SCHEMAS.append(openapi_document()["components"]["schemas"])
    if "$ref" in schema:
        nullable = schema.get("nullable")
        schema = _SCHEMAS[0][schema["$ref"].rsplit("/", 1)[1]]
        if nullable and obj is None:
            return
    t = schema.get("type")
    if obj is None:
        assert schema.get("nullable"), where
        return
    if t == "object" and "properties" in schema:
        assert isinstance(obj, dict), where
        assert set(obj) <= set(schema["properties"]), (where, set(obj) - set(schema["properties"]))
        assert set(schema.get("required", [])) <= set(obj), (where, set(schema["required"]) - set(obj))
        for k, v in obj.items():
            conforms(v, schema["properties"][k], f"{where}.{k}")
    elif t == "array":
        assert isinstance(obj, list), where
        for n, x in enumerate(obj):
            conforms(x, schema["items"], f"{where}[{n}]")
    elif t == "integer":
        assert isinstance(obj, int) and not isinstance(obj, bool), where
    elif t == "boolean":
        assert isinstance(obj, bool), where
    elif t == "string":
        assert isinstance(obj, str), where
        if "enum" in schema:
            assert obj in schema["enum"], (where, obj)
