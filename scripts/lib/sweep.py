#!/usr/bin/python3
"""Find and clean up what a Spillway script run left behind: processes and mounts.

Used by scripts/*.sh and bench/*.sh; precise on purpose, so that a cleanup never touches
processes or mounts of another run on the same machine:

  sweep.py kill-tagged TAG          kill processes whose environment holds
                                    SPILLWAY_RUN_TAG=TAG (every process a script started
                                    inherits it), except this process and its ancestors
  sweep.py kill-exe-under DIR       kill processes whose executable lies under DIR
                                    (e.g. REPO/target: binaries of this checkout)
  sweep.py procs TEXT               list processes whose command line contains TEXT
  sweep.py tagged TAG               list processes carrying SPILLWAY_RUN_TAG=TAG (but
                                    this process and its ancestors)
  sweep.py mounts PREFIX...         list mount points under the prefixes (deepest first)
  sweep.py unmount [--stale-only] PREFIX...
                                    unmount everything under the prefixes, deepest first
                                    (fusermount3 -u, then umount, then umount -l);
                                    --stale-only: only FUSE mounts whose daemon is gone
                                    (stat fails with ENOTCONN)

Exit status: 0 on success; for `procs`, `tagged` and `mounts`, 1 when something was found.
"""
import errno
import os
import signal
import subprocess
import sys
import time


def ancestors():
    pids = set()
    pid = os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    pids.add(1)
    return pids


def all_pids():
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def environ_has(pid, needle):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:
        return False


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def exe(pid):
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def is_kernel_thread(pid):
    return cmdline(pid) == ""


def kill(pids, grace=5.0):
    pids = set(pids)
    if not pids:
        return
    for pid in sorted(pids):
        print(f"sweep: stopping pid {pid}: {cmdline(pid)[:160]}", file=sys.stderr)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        pids = {p for p in pids if os.path.exists(f"/proc/{p}") and not is_zombie(p)}
        if not pids:
            return
        time.sleep(0.1)
    for pid in pids:
        print(f"sweep: killing pid {pid} (did not stop on SIGTERM)", file=sys.stderr)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def is_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def unescape(path):
    # /proc/mounts escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and i + 4 <= len(path) and path[i + 1 : i + 4].isdigit():
            out.append(chr(int(path[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def under(path, prefix):
    prefix = prefix.rstrip("/")
    # A prefix ending in '*' matches any path starting with the text before it.
    if prefix.endswith("*"):
        return path.startswith(prefix[:-1])
    return path == prefix or path.startswith(prefix + "/")


def mounts(prefixes):
    found = []
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            mnt, fstype = unescape(fields[1]), fields[2]
            if any(under(mnt, p) for p in prefixes):
                found.append((mnt, fstype))
    found.sort(key=lambda m: m[0].count("/"), reverse=True)
    return found


def stale(mnt):
    try:
        os.stat(mnt)
        return False
    except OSError as e:
        return e.errno == errno.ENOTCONN


def unmount(prefixes, stale_only):
    failed = 0
    for mnt, fstype in mounts(prefixes):
        is_fuse = fstype.startswith("fuse")
        if stale_only and not (is_fuse and stale(mnt)):
            continue
        attempts = []
        if is_fuse:
            attempts.append(["fusermount3", "-u", "-z", mnt] if stale(mnt) else ["fusermount3", "-u", mnt])
        attempts += [["umount", mnt], ["umount", "-l", mnt]]
        for cmd in attempts:
            r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode == 0:
                print(f"sweep: unmounted {mnt} ({fstype}) with {' '.join(cmd[:-1])}", file=sys.stderr)
                break
        else:
            print(f"sweep: could not unmount {mnt}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = argv[1], argv[2:]
    if cmd == "kill-tagged" and len(args) == 1:
        needle = f"SPILLWAY_RUN_TAG={args[0]}".encode()
        skip = ancestors()
        kill(p for p in all_pids() if p not in skip and environ_has(p, needle))
        return 0
    if cmd == "kill-exe-under" and len(args) == 1:
        skip = ancestors()
        root = os.path.realpath(args[0])
        kill(p for p in all_pids() if p not in skip and under(exe(p).removesuffix(" (deleted)"), root))
        return 0
    if cmd == "procs" and len(args) == 1:
        skip = ancestors()
        hits = [(p, cmdline(p)) for p in all_pids() if p not in skip and args[0] in cmdline(p)]
        for pid, line in hits:
            print(f"{pid} {line}")
        return 1 if hits else 0
    if cmd == "tagged" and len(args) == 1:
        needle = f"SPILLWAY_RUN_TAG={args[0]}".encode()
        skip = ancestors()
        hits = [p for p in all_pids() if p not in skip and environ_has(p, needle)]
        for pid in hits:
            print(f"{pid} {cmdline(pid)}")
        return 1 if hits else 0
    if cmd == "mounts" and args:
        found = mounts(args)
        for mnt, fstype in found:
            print(f"{mnt} {fstype}")
        return 1 if found else 0
    if cmd == "unmount" and args:
        stale_only = args[0] == "--stale-only"
        if stale_only:
            args = args[1:]
        return unmount(args, stale_only)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
