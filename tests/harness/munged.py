"""A private munged for the tests (see docs/auth.md, "MUNGE").

    m = start_munged(directory)      # real /usr/sbin/munged, own key and socket
    cred = m.munge(b"payload")       # what `munge` prints, made as the caller (or `as_uid`)
    status, info = m.unmunge(cred)   # 0 and {"UID": 0, "GID": 0, "PAYLOAD": b"payload"}
    m.stop()                         # also at exit of a `with start_munged(...) as m:` block

What munged 0.5.x needs here (it checks at start and refuses to run otherwise; --force
turns the refusals into warnings and is passed anyway, see below):
  * the key file owned by the daemon's uid, readable by nobody else (0600): written here
    as 128 random bytes, what `mungekey -c` makes;
  * the socket's directory and every directory above it executable by all (clients of any
    uid must reach the socket): the directory is set to 0755. pytest's tmp_path lies under
    a 0700 directory: munged then still starts (--force) but only root can use it, so
    tests with unprivileged callers should use a directory under /tmp (the session
    fixture `munged` in conftest.py does);
  * no directory on those paths writable by group or others without the sticky bit.
Running as root is fine: munged does not insist on a `munge` user. --force also replaces
a socket left by a SIGKILLed daemon; since it would take a socket over from a live daemon
too, start_munged refuses a directory whose socket still answers.

munged runs in the foreground (-F) as our child, logging to <dir>/munged.log.
"""

import os
import re
import signal
import socket
import subprocess
import time

MUNGED = os.environ.get("SPILLWAY_MUNGED") or ("/usr/sbin/munged" if os.path.exists("/usr/sbin/munged") else "munged")
START_TIMEOUT = 15.0
STOP_TIMEOUT = 5.0


class MungedError(Exception):
    pass


class PrivateMunged:
    """A running munged of our own. Use start_munged(); stop() is idempotent."""

    def __init__(self, directory):
        self.dir = os.path.abspath(directory)
        self.socket = os.path.join(self.dir, "munge.socket")
        self.key_file = os.path.join(self.dir, "munge.key")
        self.log_file = os.path.join(self.dir, "munged.log")
        self.proc = None

    # ------------------------------------------------------------------ lifecycle

    def _start(self):
        # --force (below) makes munged take over a socket even from a live daemon, which
        # would then run on unreachable: refuse a second one in the same place. A socket
        # nobody answers on is a crashed run's leftover, which --force replaces.
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(self.socket)
        except OSError:
            pass
        else:
            raise MungedError(f"a munged already answers on {self.socket}")
        finally:
            probe.close()
        os.makedirs(self.dir, exist_ok=True)
        os.chmod(self.dir, 0o755)
        try:
            os.unlink(self.key_file)  # leftover of an earlier run: recreated with 0600
        except FileNotFoundError:
            pass
        fd = os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, os.urandom(128))
        finally:
            os.close(fd)
        with open(self.log_file, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    MUNGED,
                    "--foreground",
                    "--force",
                    f"--socket={self.socket}",
                    f"--key-file={self.key_file}",
                    f"--log-file={self.log_file}",
                    f"--pid-file={os.path.join(self.dir, 'munged.pid')}",
                    f"--seed-file={os.path.join(self.dir, 'munged.seed')}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            # Ready once it makes a credential (the socket appearing is not enough).
            r = subprocess.run(["munge", "-n", "--socket", self.socket], capture_output=True)
            if r.returncode == 0:
                return self
            if self.proc.poll() is not None:
                self._fail(f"munged exited with status {self.proc.returncode}")
            if time.monotonic() > deadline:
                self._fail(f"munged not ready after {START_TIMEOUT} s: {r.stderr.decode(errors='replace').strip()}")
            time.sleep(0.02)

    def _fail(self, what):
        self.stop()
        try:
            with open(self.log_file, errors="replace") as f:
                log = f.read()
        except OSError:
            log = ""
        raise MungedError(f"private munged in {self.dir}: {what}; its log:\n{log}")

    @property
    def pid(self):
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def stop(self):
        """SIGTERM (munged removes its socket and saves its seed), SIGKILL after
        STOP_TIMEOUT; reaps it. Its files stay in the directory."""
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------------ clients

    def munge(self, payload=b"", ttl=None, as_user=None, as_uid=None, as_gid=None):
        """A credential from this munged, made with the `munge` command line by the caller,
        by the user named `as_user` (runuser), or by uid/gid `as_uid`/`as_gid` (setpriv:
        the ids need no /etc/passwd entry). Both of the latter need root. `payload` (bytes
        or str) goes in through stdin."""
        if isinstance(payload, str):
            payload = payload.encode()
        cmd = ["munge", "--socket", self.socket]
        if not payload:
            cmd.append("--no-input")
        if ttl is not None:
            cmd += ["--ttl", str(ttl)]
        if as_user is not None:
            cmd = ["runuser", "-u", as_user, "--", *cmd]
        elif as_uid is not None:
            gid = as_gid if as_gid is not None else as_uid
            cmd = ["setpriv", f"--reuid={as_uid}", f"--regid={gid}", "--clear-groups", *cmd]
        r = subprocess.run(cmd, input=payload, capture_output=True)
        if r.returncode != 0:
            raise MungedError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.decode(errors='replace').strip()}")
        return r.stdout.decode().strip()

    def unmunge(self, cred):
        """(status, info) from `unmunge`: status is its exit code, the munge_err_t (0 valid,
        8 bad format, 14 invalid, 15 expired, 16 rewound, 17 replayed, ...); info has "UID"
        and "GID" (ints) and "PAYLOAD" (bytes) when munged decoded the credential, which
        it also does for expired, rewound and replayed ones. Decoding consumes it: a
        second unmunge of the same credential is a replay."""
        if isinstance(cred, str):
            cred = cred.encode()
        # Metadata to stderr, payload to stdout: one decode gives both.
        r = subprocess.run(
            ["unmunge", "--socket", self.socket, "--keys=UID,GID", "--numeric", "--metadata=/dev/stderr", "--output=/dev/stdout"],
            input=cred,
            capture_output=True,
        )
        info = {}
        for line in r.stderr.decode(errors="replace").splitlines():
            m = re.fullmatch(r"(UID|GID):\s+(\d+)\s*", line)
            if m:
                info[m.group(1)] = int(m.group(2))
        if info:
            info["PAYLOAD"] = r.stdout
        return r.returncode, info


def start_munged(directory):
    """Start a private munged in `directory` (created if missing, set to 0755); returns a
    PrivateMunged with .socket, .stop(), .munge(), .unmunge(). Raises MungedError with
    munged's log if it does not come up."""
    return PrivateMunged(directory)._start()
