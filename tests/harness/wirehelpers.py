"""Raw data-plane wire pieces for tests that talk to storage servers without the client:
a Hello frame (docs/wire-protocol.md) and the fields of a version-1 client capability.

Used by the POSIX suite (a `spillway cluster` client's capability) and by the control
plane's tests (the capability the manager issues to an agent), so the byte layouts are
written down once here."""

import socket
import struct

HELLO_OP, ROLE_CLIENT, ROLE_PEER = 1, 1, 2


def hello_errno(addr, role, instance, credential):
    """Connect to a server and send a Hello as its first frame (docs/wire-protocol.md);
    the errno of the reply, 0 when a session was granted."""
    host, port = addr.rsplit(":", 1)
    body = struct.pack("<HHBQI", 1, 1, role, instance, len(credential)) + credential
    body += struct.pack("<I", 4) + b"test"
    frame = struct.pack("<IBBHQI", 16 + len(body), 1, 0, HELLO_OP, 0, 5000) + body
    with socket.create_connection((host.strip("[]"), int(port)), timeout=10) as s:
        s.sendall(frame)
        head = b""
        while len(head) < 20:
            chunk = s.recv(20 - len(head))
            if not chunk:
                raise ConnectionError(f"{addr} closed the connection without a reply")
            head += chunk
    return struct.unpack("<IBBHQI", head)[5]


def capability_fields(cap):
    """(instance, expires, node, [addresses]) of a version-1 capability."""
    assert cap[:5] == b"SPWC\x01", f"not a capability: {cap[:5]!r}"
    instance, expires = struct.unpack_from("<QQ", cap, 5)
    n = cap[21]
    node = cap[22 : 22 + n].decode()
    pos, addrs = 23 + n, []
    for _ in range(cap[22 + n]):
        family = cap[pos]
        size = {4: 4, 6: 16}[family]
        addrs.append(socket.inet_ntop(socket.AF_INET if family == 4 else socket.AF_INET6, cap[pos + 1 : pos + 1 + size]))
        pos += 1 + size
    assert pos == len(cap) - 32, "the tag is the last 32 bytes"
    return instance, expires, node, addrs
