"""Count the requests the kernel sends to one FUSE mount, by opcode, from the kernel's
own `fuse:fuse_request_send` tracepoint, in a tracefs instance of the test's own (so
that nothing else tracing on the machine is disturbed, nor disturbs the count).

    with FuseRequests(mountpoint) as seen:
        ...walk...
    seen.count("FUSE_LOOKUP")

Tests use it to check how many round trips a workload costs where a regression would
show only as time: the requests are what the kernel really sent, not what the client
says it received.
"""

import os
import re
import uuid

TRACEFS = "/sys/kernel/tracing"
EVENT = "events/fuse/fuse_request_send"


def available():
    return os.path.isdir(os.path.join(TRACEFS, EVENT))


def _kernel_dev(st_dev):
    # The tracepoint prints the superblock's dev_t in the kernel's own encoding.
    return (os.major(st_dev) << 20) | os.minor(st_dev)


class FuseRequests:
    def __init__(self, mountpoint):
        self.conn = _kernel_dev(os.stat(mountpoint).st_dev)
        self.inst = os.path.join(TRACEFS, "instances", f"spw-test-{uuid.uuid4().hex[:12]}")
        self.counts = {}

    def _w(self, rel, text):
        with open(os.path.join(self.inst, rel), "w") as f:
            f.write(text)

    def __enter__(self):
        os.mkdir(self.inst)
        try:
            self._w("buffer_size_kb", "8192")
            self._w(os.path.join(EVENT, "filter"), f"connection == {self.conn}")
            self._w(os.path.join(EVENT, "enable"), "1")
        except BaseException:
            os.rmdir(self.inst)
            raise
        return self

    def __exit__(self, *exc):
        try:
            self._w(os.path.join(EVENT, "enable"), "0")
            with open(os.path.join(self.inst, "trace")) as f:
                text = f.read()
        finally:
            os.rmdir(self.inst)
        if "LOST EVENTS" in text:
            raise RuntimeError("the trace buffer overflowed: counts would be short")
        for op in re.findall(r"opcode \d+ \((\w+)\)", text):
            self.counts[op] = self.counts.get(op, 0) + 1
        return False

    def count(self, op):
        return self.counts.get(op, 0)


__all__ = ["FuseRequests", "available"]
