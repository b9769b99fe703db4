"""Raw requests on the control channel of a Spillway mount: the `spillway_ioc` ioctl that
libdatawarp makes on a directory of the mount (docs/libdatawarp.md; the C side is
`libdatawarp/datawarp.c`). A request is a length-prefixed list of NUL-terminated fields;
the answer comes back in the same buffer, its first field the result code.

Used by the libdatawarp, private-mode and control-security tests, which send malformed or
foreign requests the C library would never build."""

import fcntl
import os
import struct

SPILLWAY_IOC_CALL = 0xFFFC5357  # _IOWR('S', 0x57, struct spillway_ioc), 16380 bytes
IOC_LEN = 16380


def ioctl_msg(*fields):
    """The request body of byte-string `fields`: u32 length, then each field and a NUL."""
    body = b"".join(f + b"\0" for f in fields)
    return struct.pack("=I", len(body)) + body


def ioctl_raw(path, payload, cmd=SPILLWAY_IOC_CALL):
    """Send `payload` (up to IOC_LEN bytes) on the directory `path`; the answer's fields as
    byte strings, the result code first."""
    buf = bytearray(IOC_LEN)
    buf[:len(payload)] = payload
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, cmd, buf)
    finally:
        os.close(fd)
    (n,) = struct.unpack("=I", buf[:4])
    return bytes(buf[4:4 + n]).split(b"\0")[:-1]


def control_call(path, *fields):
    """One request of text `fields` on the directory `path`: (result, [answer fields])."""
    out = ioctl_raw(path, ioctl_msg(*(f.encode() for f in fields)))
    return int(out[0]), [f.decode(errors="replace") for f in out[1:]]
