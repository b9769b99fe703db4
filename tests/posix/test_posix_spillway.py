"""Spillway's own contract seen from a mount (tests marked spillway_only): the client
holds a capability, not the instance secret, and servers refuse anything else at the
Hello (tests/harness/wirehelpers.py); ENOSPC at the instance's capacity; statfs.
"""

import errno
import os
import socket
import stat
import time

import pytest

import spwhelpers as H
from spwhelpers import MiB, assert_errno, p
from wirehelpers import ROLE_CLIENT, ROLE_PEER, capability_fields, hello_errno

CLUSTER_OPTS = {"servers": 2, "capacity": "4G"}


# =========================================================================== who may talk to the servers (Spillway)

def _read_text(path):
    with open(path) as f:
        return f.read()


@pytest.mark.spillway_only
def test_clients_hold_a_capability_not_the_instance_secret(cluster, user):
    """`cluster up` keeps the instance secret to itself and hands its client a capability
    bound to the address the client connects from, in a descriptor only root may read;
    servers refuse clients anything else, and a user of the machine gets nothing."""
    desc_path = cluster.instance_path
    secret_path = os.path.join(cluster.dir, "instance.secret")
    for path in (desc_path, secret_path):
        st = os.stat(path)
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, 0), f"{path}: mode {oct(st.st_mode)}, uid {st.st_uid}"
    d = cluster.instance()
    cap = bytes.fromhex(d["credential"])
    secret = bytes.fromhex(_read_text(secret_path).strip())
    assert secret not in cap and secret.hex() not in _read_text(desc_path), "the secret is in the descriptor"
    instance, expires, node, addrs = capability_fields(cap)
    assert instance == d["instance"]
    assert node == socket.gethostname()
    assert expires > time.time() + 9 * 365 * 86400, "a developer cluster's capability lasts years"
    servers = d["servers"]
    for server in servers:
        host, port = server.rsplit(":", 1)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.connect((host, int(port)))  # no packet: only picks the source address
            source = u.getsockname()[0]
        assert addrs == [source], f"capability bound to {addrs}, the client connects from {source}"
        tampered = cap[:-1] + bytes([cap[-1] ^ 1])
        for what, role, cred in [
            ("no credential", ROLE_CLIENT, b""),
            ("the instance secret as a client", ROLE_CLIENT, secret),
            ("a tampered capability", ROLE_CLIENT, tampered),
            ("the capability as a peer", ROLE_PEER, cap),
        ]:
            assert hello_errno(server, role, instance, cred) == errno.EACCES, f"{server}: {what}"
        assert hello_errno(server, ROLE_CLIENT, instance, cap) == 0, f"{server}: the capability"
        assert hello_errno(server, ROLE_PEER, instance, secret) == 0, f"{server}: the secret as a peer"
    # A user of this machine can read neither file and opens no session without them.
    for path in (desc_path, secret_path):
        assert_errno(errno.EACCES, H.as_user, user.uid, user.gid, _read_text, path)
    got = H.as_user(user.uid, user.gid, hello_errno, servers[0], ROLE_CLIENT, instance, b"")
    assert got == errno.EACCES


# =========================================================================== capacity / statfs (Spillway)


@pytest.mark.spillway_only
@pytest.mark.timeout(600)
def test_enospc_at_instance_capacity(fresh_dir, clusters):
    c = clusters(servers=2, capacity="64M")
    cap = c.capacity()
    d = fresh_dir(c)
    path = p(d, "fill")
    chunk = os.urandom(MiB)
    written, err = 0, None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while written < 2 * cap:
            os.write(fd, chunk)
            written += len(chunk)
        os.fsync(fd)
    except OSError as e:
        err = e
    try:
        os.close(fd)
    except OSError as e:
        err = err or e
    assert err is not None, f"wrote {written} bytes (capacity {cap}) without an error"
    assert err.errno == errno.ENOSPC, f"expected ENOSPC, got {H.ename(err.errno)} ({err})"
    assert written <= cap + 64 * MiB, f"{written} bytes accepted by write() on a {cap}-byte instance"
    # and it recovers once the space is freed
    os.unlink(path)
    H.poll(lambda: os.statvfs(c.mnt).f_bavail * os.statvfs(c.mnt).f_frsize >= cap // 2, timeout=10)
    H.write_file(p(d, "after"), os.urandom(8 * MiB), fsync=True)
    assert os.stat(p(d, "after")).st_size == 8 * MiB


@pytest.mark.spillway_only
@pytest.mark.parametrize("servers,capacity", [(2, "256M"), (3, "1G")])
def test_statfs_semantics(fresh_dir, clusters, servers, capacity):
    c = clusters(servers=servers, capacity=capacity)
    cap = c.capacity()
    assert cap in (H.parse_size(capacity), H.parse_size(capacity, binary=False)), f"instance capacity {cap}"
    st = os.statvfs(c.mnt)
    assert st.f_blocks * st.f_frsize == cap, f"f_blocks*f_frsize {st.f_blocks * st.f_frsize} != capacity {cap}"
    assert 0 < st.f_bavail <= st.f_bfree <= st.f_blocks
    assert st.f_namemax == 255
    free0 = st.f_bavail * st.f_frsize
    assert free0 >= cap - 16 * MiB, f"an empty instance reports {free0} of {cap} free"

    d = fresh_dir(c)
    # 6 MiB in one file: one 8 MiB stripe, so all on one server. The fullest fragment lost
    # 6 MiB, and free = servers x that fragment's free, so free drops by servers x 6 MiB.
    H.write_file(p(d, "one"), os.urandom(6 * MiB), fsync=True)
    lines = c.stripes(p(d, "one"))
    assert len(lines) == 1
    frag = cap // c.servers
    used = [0] * c.servers
    for _, server, _, n in lines:
        used[server] += n
    expect = c.servers * (frag - max(used))

    def free():
        s = os.statvfs(c.mnt)
        return s.f_bavail * s.f_frsize

    got = H.poll(lambda: abs(free() - expect) <= 2 * MiB and free(), timeout=5) or free()
    assert abs(got - expect) <= 2 * MiB, (
        f"free {got} after writing 6 MiB to server {lines[0][1]}; expected servers x free of the "
        f"fullest fragment = {expect} (free before: {free0})"
    )
    os.unlink(p(d, "one"))
    got = H.poll(lambda: free() >= free0 - MiB and free(), timeout=10) or free()
    assert got >= free0 - MiB, f"free {got} after unlink, {free0} before the write"
