"""Secrets and metadata at rest (issue 14, item 2; docs/security.md): on a running local
site with a PFS root, a mounted instance and a stage that ran, every state directory
is 0700 and every file in it 0600 or stricter (the manager's state dir with manager.db
and its WAL, every server root with admin.key, fragment.json, meta.sqlite and the
stripes, the agent's state dir with its descriptors, the TLS keys), and an unprivileged
user can open none of them. An older site's 0644/0755 modes are repaired when the
daemons start again. What users need (spillway.conf, the CA certificate, the mount)
stays reachable.

And the reproduction's second half, over the real wire against the real servers: even
with an instance secret in hand (read here as root, standing for a leak), a peer's
`StageFiles` asking for `/etc/shadow` as uid 0 gets nothing without a ticket the
manager signed, and a ticket the holder signs itself reaches nothing outside the
servers' own PFS roots: no `shadow` entry appears in the mounted instance."""

import hashlib
import hmac
import json
import os
import socket
import stat
import struct
import time

import pytest

import spwhelpers as H
from sitehelpers import running_site

GiB = 1 << 30


@pytest.fixture(scope="module")
def site(spillway_bin, munged, _local_base, pfs):
    with running_site(spillway_bin, _local_base, munged, servers=2, pfs_roots=[pfs]) as s:
        yield s


@pytest.fixture(scope="module")
def busy_site(site, user, pfs):
    """The site with everything that leaves state: a user's instance, mounted, a file
    written through the mount, a stage-in that ran on the servers."""
    s = site.api("POST", "/dw/v1/sessions",
                 {"token": "secrets", "owner": user.uid, "client_nodes": [site.node]})
    i = site.api("POST", "/dw/v1/instances", {"session": s["id"], "capacity": GiB})
    c = site.api("POST", "/dw/v1/configurations",
                 {"instance": i["id"], "type": "scratch", "access_mode": "stripe"})
    a = site.api("POST", "/dw/v1/activations", {"session": s["id"], "configuration": c["id"]})
    site.wait_state("activations", a["id"], timeout=30)
    mnt = a["mount"]
    assert H.is_mounted(mnt)

    def write():
        with open(os.path.join(mnt, "through-the-mount"), "wb") as f:
            f.write(b"x" * 4096)

    user.run(write)
    src = os.path.join(pfs, "secrets-src")
    with open(src, "wb") as f:
        f.write(b"staged" * 1000)
    os.chown(src, user.uid, user.gid)
    st = site.api("POST", "/dw/v1/stages",
                  {"instance": i["id"], "direction": "in", "type": "file",
                   "source": src, "destination": "/staged", "owner": user.uid})
    site.wait(lambda: site.api("GET", f"/dw/v1/stages/{st['id']}")["state"]
              in ("complete", "failed"), "the stage to end", timeout=30)
    assert site.api("GET", f"/dw/v1/stages/{st['id']}")["state"] == "complete"
    site.busy = {"instance": i["id"], "mount": mnt}
    yield site
    site.request("DELETE", f"/dw/v1/sessions/{s['id']}?hurry=true")
    site.wait_gone("sessions", s["id"], timeout=40)


def private_trees(site):
    """Every directory that holds secrets or metadata."""
    servers = os.path.join(site.dir, "servers")
    return ([os.path.join(site.dir, "manager"), servers, os.path.join(site.dir, "agent"),
             os.path.join(site.dir, "logs")]
            + [os.path.join(servers, n) for n in sorted(os.listdir(servers))])


def tls_keys(site):
    return [os.path.join(site.dir, "tls", k) for k in ("manager.key", "ca.key")]


def walk(top):
    """(path, lstat) of top and everything below it."""
    yield top, os.lstat(top)
    for d, dirs, files in os.walk(top):
        for n in dirs + files:
            p = os.path.join(d, n)
            yield p, os.lstat(p)


def exposed(site):
    """Everything group/world readable, writable or searchable (symlinks aside)."""
    bad = []
    for top in private_trees(site):
        for p, st in walk(top):
            if stat.S_ISLNK(st.st_mode):
                continue
            if st.st_mode & 0o077:
                bad.append(f"{p} {stat.filemode(st.st_mode)} ({oct(stat.S_IMODE(st.st_mode))})")
    for k in tls_keys(site):
        st = os.lstat(k)
        if st.st_mode & 0o077:
            bad.append(f"{k} {oct(stat.S_IMODE(st.st_mode))}")
    return bad


def test_state_is_private_on_a_running_site(busy_site):
    site = busy_site
    # The state that matters is there (otherwise the walk proves nothing).
    names = {os.path.basename(p) for top in private_trees(site) for p, _ in walk(top)}
    for must in ("manager.db", "admin.key", "fragment.json", "meta.sqlite", "stripes"):
        assert must in names, f"{must} not found under the site's state directories"
    assert any(n.startswith("activation-") for n in names), names
    assert exposed(site) == []


def test_a_user_opens_nothing_of_it(busy_site, user):
    site = busy_site
    files, dirs = [], []
    for top in private_trees(site):
        for p, st in walk(top):
            if stat.S_ISREG(st.st_mode):
                files.append(p)
            elif stat.S_ISDIR(st.st_mode):
                dirs.append(p)
    files += tls_keys(site)
    assert len(files) > 10

    def try_all(files, dirs):
        opened = []
        for p in files:
            try:
                os.close(os.open(p, os.O_RDONLY))
                opened.append(p)
            except PermissionError:
                pass
        for d in dirs:
            try:
                os.listdir(d)
                opened.append(d + "/")
            except PermissionError:
                pass
        return opened

    assert user.run(try_all, files, dirs) == []

    # What users need stays theirs to read.
    def read_public():
        for p in ("spillway.conf", "tls/ca.pem"):
            with open(os.path.join(site.dir, p), "rb") as f:
                f.read()
        return True

    assert user.run(read_public)


def test_an_older_sites_modes_are_repaired_at_start(busy_site):
    """Modes an older version left (0755 directories, 0644 files) become private when
    the manager and the servers start again."""
    site = busy_site
    db = os.path.join(site.dir, "manager", "manager.db")
    s0 = os.path.join(site.dir, "servers", "s0")
    frags = os.path.join(s0, "fragments")
    frag = os.path.join(frags, sorted(n for n in os.listdir(frags) if n.isdigit())[0])
    loosened = [(os.path.join(site.dir, "manager"), 0o755), (db, 0o644),
                (s0, 0o755), (frags, 0o755), (frag, 0o755),
                (os.path.join(s0, "admin.key"), 0o644),
                (os.path.join(frag, "fragment.json"), 0o644),
                (os.path.join(frag, "meta.sqlite"), 0o644),
                (os.path.join(frag, "stripes"), 0o755),
                (os.path.join(site.dir, "tls", "manager.key"), 0o644)]
    site.kill("manager", signal="TERM")
    site.kill("server0", signal="TERM")
    for p, m in loosened:
        os.chmod(p, m)
    site.start("server0")
    site.start("manager")
    site.wait(lambda: site.api("GET", "/dw/v1/pools") is not None, "the manager back")
    for p, _ in loosened:
        m = stat.S_IMODE(os.lstat(p).st_mode)
        assert m & 0o077 == 0, f"{p} still {oct(m)} after a restart"


# --------------------------------------------------------------------------- the wire
# docs/wire-protocol.md: frames, Hello, StageFiles (68), stage tickets.

ROLE_PEER = 2
OP_HELLO = 1
OP_STAGE_FILES = 68
ROOT_INODE = 1


def _bytes(b):
    return struct.pack("<I", len(b)) + b


def _call(sock, op, body, ident):
    sock.sendall(struct.pack("<IBBHQI", 16 + len(body), 1, 0, op, ident, 10000) + body)
    head = b""
    while len(head) < 20:
        chunk = sock.recv(20 - len(head))
        assert chunk, "the server closed the connection"
        head += chunk
    length, kind, _, rop, rid, errno_ = struct.unpack("<IBBHQI", head)
    rest = b""
    while len(rest) < length - 16:
        chunk = sock.recv(length - 16 - len(rest))
        assert chunk
        rest += chunk
    assert (kind, rop, rid) == (2, op, ident)
    return errno_, rest


def _ticket(secret, instance, uid, pfs_paths, expires):
    """A stage ticket signed with `secret` (what whoever holds it could make)."""
    def paths(ps):
        return struct.pack("<I", len(ps)) + b"".join(_bytes(p.encode()) for p in ps)
    body = (b"SPWT" + bytes([1]) + struct.pack("<QQIBQ", instance, 1, uid, 0, expires)
            + paths(pfs_paths) + paths(["/"]))
    key = hmac.new(secret, b"spillway stage ticket v1", hashlib.sha256).digest()
    return body + hmac.new(key, body, hashlib.sha256).digest()


def _stage_files(addr, instance, secret, ticket, name, src):
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        hello = (struct.pack("<HHBQ", 1, 1, ROLE_PEER, instance) + _bytes(secret)
                 + _bytes(b"attacker"))
        e, _ = _call(sock, OP_HELLO, hello, 1)
        assert e == 0, f"the peer handshake with the secret failed: errno {e}"
        spec = (struct.pack("<Q", ROOT_INODE) + _bytes(name.encode())
                + struct.pack("<IIHQ", 0, 1 << 20, 0, 0)
                + _bytes(src.encode()) + _bytes(b"/" + name.encode()))
        body = bytes([0]) + _bytes(ticket) + struct.pack("<I", 1) + spec
        e, reply = _call(sock, OP_STAGE_FILES, body, 2)
        if e:
            return e, None
        (n,) = struct.unpack_from("<I", reply, 0)
        assert n == 1
        outcome, err = struct.unpack_from("<Bi", reply, 4)
        return 0, (outcome, err)


def test_a_leaked_secret_still_reads_no_shadow(busy_site, user):
    site = busy_site
    inst = site.busy["instance"]
    servers = os.path.join(site.dir, "servers")
    frag_dir = next(d for d in (os.path.join(servers, n, "fragments", str(inst))
                                for n in sorted(os.listdir(servers))) if os.path.isdir(d))
    # The user cannot even get at the secret...
    assert user.errno(lambda: open(os.path.join(frag_dir, "fragment.json")).read()) in (13,)
    # ...and with it (a leak: read as root here) the servers still stage nothing outside
    # what the manager signed and their own roots.
    with open(os.path.join(frag_dir, "fragment.json")) as f:
        conf = json.load(f)
    secret = bytes.fromhex(conf["credential"])
    far = int(time.time()) + 3600
    attempts = [
        ("no ticket", b""),
        ("a ticket signed with a guessed secret", _ticket(b"guess", inst, 0, ["/"], far)),
        ("an expired ticket", _ticket(secret, inst, 0, ["/"], int(time.time()) - 5)),
        ("a ticket signed with the leaked secret", _ticket(secret, inst, 0, ["/"], far)),
    ]
    for why, ticket in attempts:
        for addr in conf["peers"]:  # every server of the instance
            e, res = _stage_files(addr, inst, secret, ticket, "shadow", "/etc/shadow")
            if ticket and why.endswith("leaked secret"):
                # Genuine (its holder could sign it), but /etc is no PFS root of the
                # servers: the file fails with EACCES where it would have been made,
                # and is left to the long way (untouched) elsewhere.
                assert e == 0, (why, e)
                assert res in ((1, 13), (2, 0)), (why, res)
            else:
                assert e == 13, (why, addr, e, res)
    assert not os.path.exists(os.path.join(site.busy["mount"], "shadow"))
