"""A real Slurm 22.05 site on this machine for the tests: Debian's slurmctld and slurmd as
our children, one node (this host), one partition, the session's private munged.

    site = SlurmSite(directory, munged.socket, burst_buffer="datawarp",
                     burst_buffer_conf="GetSysState=/path/to/dw_wlm_cli\\n")
    with site:                                   # start() ... stop()
        job = site.submit("#!/bin/bash\\necho hi\\n", "spwtest", cwd=workdir)
        rec = site.wait_job(job)                 # {"JobState": "COMPLETED", ...}
        site.show_burst(); site.log("slurmctld")

The fixtures (`slurm_sites`, `slurm_site`) are in slurmfixtures.py; tests using them are
skipped when the Slurm binaries are missing (`slurm_missing()` says why).

Layout of `directory` (made 0755: the SlurmUser and the test users must traverse it):
    etc/      slurm.conf, plugstack.conf (empty), burst_buffer.conf, burst_buffer.lua
    state/    StateSaveLocation, owned by SlurmUser (slurmctld writes it after dropping
              root; the burst-buffer tool, which runs as SlurmUser, reads the job scripts
              in it and writes the `paths` pathfile there)
    spool/    SlurmdSpoolDir (slurmd runs as root)
    log/      slurmctld.log, slurmd.log (+ *.out: the daemons' own stdout/stderr, where
              errors before the log file is opened end up); owned by SlurmUser
    run/      pid files; owned by SlurmUser

The slurm.conf written, and why each non-default setting is there:
    ClusterName=spw<random>        unique per site: two test sessions can run side by side
    SlurmctldHost=<host>(127.0.0.1), NodeName=<host> NodeAddr=127.0.0.1
                                   this host's short name (what slurmd calls itself), but
                                   reached over loopback whatever the name resolves to
    SlurmctldPort, SlurmdPort      free TCP ports picked at construction (not 6817/6818,
                                   which a system Slurm or another session may use)
    SlurmUser=slurm                the Debian package's user: slurmctld drops root and runs
                                   the burst-buffer tools (dw_wlm_cli, the lua hooks) as it,
                                   as on a real site
    AuthType=auth/munge, CredType=cred/munge, AuthInfo=socket=<path>
                                   daemons and clients (which read the same file through
                                   SLURM_CONF) use the session's private munged
    StateSaveLocation, SlurmdSpoolDir, *LogFile, *PidFile   all under `directory`
    PlugStackConfig=etc/plugstack.conf   empty: nothing from /etc/slurm leaks in
    SlurmdUser=root                slurmd must start job steps as the job's user
    ProctrackType=proctrack/linuxproc, TaskPlugin=task/none, JobAcctGatherType=none
                                   no cgroups: on this machine (gVisor, cgroup v1 mounts)
                                   slurmd starts with proctrack/cgroup but every batch step
                                   aborts ("cgroup namespace 'freezer' not mounted"), and
                                   two sessions' slurmds must not share one hierarchy
    SwitchType=switch/none, MpiDefault=none   nothing to set up between nodes (slurmd
                                   still logs errors about the PMIx plugins it cannot
                                   load; harmless)
    AccountingStorageType=accounting_storage/none, JobCompType=jobcomp/none
                                   no slurmdbd
    SelectType=select/cons_tres with CR_CPU  several one-CPU jobs share the node
    CPUs, Boards, Sockets, Cores, Threads, RealMemory  as `slurmd -C` reports them (a node
                                   claiming more than it has is drained)
    SchedulerParameters=bf_interval=1,bf_resolution=1,sched_interval=2
                                   burst-buffer jobs move in about a second per step: the
                                   scheduler starts stage-in (setup) when it first tests
                                   the job, and a job whose stage-in finished is started
                                   by the next backfill cycle (default every 30 s) or main
                                   cycle (default every 60 s). Measured for a small
                                   `#DW jobdw` job: submit -> setup 0.2-0.9 s, submit ->
                                   buffer torn down 1.2-2.2 s (defaults: 0.4-3 s and
                                   3.6-6.4 s). bf_resolution=1 plans start times to the
                                   second instead of the minute.
    ReturnToService=2              the node is usable as soon as slurmd registers
    KillWait=2, InactiveLimit=0, MinJobAge=600  quick kills; finished job records kept
                                   long enough to be inspected
    MailProg=/bin/true             no mail
    SlurmctldDebug=debug, SlurmdDebug=debug, DebugFlags=BurstBuffer
                                   the logs show every burst-buffer call, its argv as Slurm
                                   built it (argv[0] "dw_wlm_cli") and its answer
    BurstBufferType=burst_buffer/<datawarp|lua>  when asked for; burst_buffer.conf and
                                   burst_buffer.lua go next to slurm.conf, where the
                                   plugins look for them

What the burst-buffer tools see: they run as SlurmUser (never root) with slurmctld's
environment; the job script they are given is <state>/hash.<id%10>/job.<id>/script (mode
0700 in 0700 directories owned by SlurmUser), the batch script as stored, which ends with
a NUL byte. Both plugins refuse burst-buffer jobs of root: submit as a test user.

Processes: slurmctld -D and slurmd -D run in their own process groups with
SPILLWAY_SLURM_SITE=<directory> in their environment; everything they start inherits it
(slurmstepd, slurmscriptd, the dw_wlm_cli calls) and so do the jobs submitted through
`submit()`/`run()`. stop() SIGTERMs the daemons, SIGKILLs them after a grace period, then
kills every process still carrying this site's SPILLWAY_SLURM_SITE, and their descendants
(slurmd does not take its job steps along when it exits: a running job's slurmstepd and
the job's processes are killed here).
"""

import glob
import grp
import os
import pwd
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time

SLURMCTLD = os.environ.get("SPILLWAY_SLURMCTLD") or "/usr/sbin/slurmctld"
SLURMD = os.environ.get("SPILLWAY_SLURMD") or "/usr/sbin/slurmd"
CLIENTS = ("sbatch", "scontrol", "squeue", "scancel", "sinfo")
PLUGINS = ("burst_buffer_datawarp.so", "burst_buffer_lua.so", "proctrack_linuxproc.so", "auth_munge.so")
SITE_ENV = "SPILLWAY_SLURM_SITE"

SCHEDULER_PARAMETERS = "bf_interval=1,bf_resolution=1,sched_interval=2"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0

# JobState values after which a job does not change any more (save its burst-buffer state).
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY")


# errors every start logs, left out of the error summaries: the PMIx MPI plugins that
# Debian builds but cannot load without libpmix, and the state files of a fresh site
NOISE = re.compile(r"pmix|MPI: Cannot create context|state file|NOTE: Trying backup state")


class SlurmError(Exception):
    pass


def slurm_user_group(user="slurm"):
    """The name of the SlurmUser's primary group: a Spillway site's admin_group, so that
    dw_wlm_cli run by slurmctld acts as an admin."""
    return grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name


def slurm_missing():
    """None if the Slurm daemons, plugins and client commands are installed, else why not."""
    missing = [p for p in (SLURMCTLD, SLURMD) if not os.access(p, os.X_OK)]
    missing += [c for c in CLIENTS if shutil.which(c) is None]
    missing += [p for p in PLUGINS if not glob.glob(f"/usr/lib/*/slurm-wlm/{p}") + glob.glob(f"/usr/lib*/slurm/{p}")]
    if missing:
        return ("Slurm not installed (missing: " + ", ".join(missing) +
                "); scripts/setup.sh installs slurmctld slurmd slurm-client slurm-wlm-basic-plugins")
    try:
        pwd.getpwnam("slurm")
    except KeyError:
        return "no user 'slurm' (the Debian slurm packages create it)"
    return None


def free_port():
    """A TCP port nobody listens on now (Slurm binds INADDR_ANY)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_hardware():
    """{'CPUs': '2', 'Boards': '1', ..., 'RealMemory': '24103'} from `slurmd -C`."""
    r = subprocess.run([SLURMD, "-C"], capture_output=True, text=True, timeout=30)
    first = r.stdout.splitlines()[0] if r.stdout else ""
    fields = dict(kv.split("=", 1) for kv in first.split() if "=" in kv)
    if r.returncode != 0 or "CPUs" not in fields:
        raise SlurmError(f"slurmd -C: exit {r.returncode}: {r.stdout}{r.stderr}")
    fields.pop("NodeName", None)
    return fields


# `scontrol show job -o` keys start upper case (directive text inside BurstBuffer= has
# lower-case keys such as capacity=, which must stay part of the value).
_KEY = re.compile(r"(?:^|(?<=\s))([A-Z][A-Za-z0-9_:/]*)=")


def parse_record(line):
    """One `scontrol show <thing> -o` line -> dict (values may contain spaces)."""
    out = {}
    keys = list(_KEY.finditer(line))
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        out.setdefault(m.group(1), line[m.end():end].strip())
    return out


def _tail(text, lines=40):
    return "\n".join(text.splitlines()[-lines:])


class SlurmSite:
    """One Slurm cluster under `directory` (created if missing). The constructor writes
    the configuration; start() runs the daemons.

    munge_socket          the munged every daemon and client uses (AuthInfo=socket=...)
    burst_buffer          None, "datawarp" or "lua" (BurstBufferType)
    burst_buffer_conf     text of etc/burst_buffer.conf (e.g. GetSysState=..., Directive=DW)
    lua_script            text of etc/burst_buffer.lua (the lua plugin's hooks)
    extra_conf            more slurm.conf lines (a string or a list), before the node and
                          partition lines
    scheduler_parameters  SchedulerParameters value (default SCHEDULER_PARAMETERS; "" for
                          Slurm's defaults)
    extra_env             more environment for the daemons (and so for the burst-buffer
                          tools they run), e.g. SPILLWAY_CONFIG
    """

    def __init__(self, directory, munge_socket, burst_buffer=None, burst_buffer_conf=None,
                 lua_script=None, extra_conf=(), slurm_user="slurm", hostname=None,
                 scheduler_parameters=None, extra_env=None):
        if burst_buffer not in (None, "datawarp", "lua"):
            raise ValueError(f"burst_buffer must be None, 'datawarp' or 'lua', not {burst_buffer!r}")
        self.dir = os.path.abspath(directory)
        self.munge_socket = munge_socket
        self.burst_buffer = burst_buffer
        self.burst_buffer_conf = burst_buffer_conf
        self.lua_script = lua_script
        self.extra_conf = [extra_conf] if isinstance(extra_conf, str) else list(extra_conf)
        self.slurm_user = slurm_user
        self.extra_env = dict(extra_env or {})
        self.scheduler_parameters = SCHEDULER_PARAMETERS if scheduler_parameters is None else scheduler_parameters
        pw = pwd.getpwnam(slurm_user)
        self.slurm_uid, self.slurm_gid = pw.pw_uid, pw.pw_gid
        self.hostname = hostname or socket.gethostname().split(".")[0]
        self.cluster = "spw" + "".join(random.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=8))
        self.ctld_port = free_port()
        self.slurmd_port = free_port()
        while self.slurmd_port == self.ctld_port:
            self.slurmd_port = free_port()
        self.etc = os.path.join(self.dir, "etc")
        self.conf = os.path.join(self.etc, "slurm.conf")
        self.state_dir = os.path.join(self.dir, "state")
        self.spool_dir = os.path.join(self.dir, "spool")
        self.log_dir = os.path.join(self.dir, "log")
        self.run_dir = os.path.join(self.dir, "run")
        self.procs = {}  # "slurmctld"/"slurmd" -> Popen
        self.timings = {}
        self._write_files()

    # ------------------------------------------------------------------ configuration

    def slurm_conf_text(self):
        hw = node_hardware()
        hw_text = " ".join(f"{k}={hw[k]}" for k in
                           ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore",
                            "RealMemory") if k in hw)
        lines = [
            f"# written by tests/harness/slurm.py for {self.dir}",
            f"ClusterName={self.cluster}",
            f"SlurmctldHost={self.hostname}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            f"SlurmUser={self.slurm_user}",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={self.state_dir}",
            f"SlurmdSpoolDir={self.spool_dir}",
            f"SlurmctldLogFile={self.log_dir}/slurmctld.log",
            f"SlurmdLogFile={self.log_dir}/slurmd.log",
            f"SlurmctldPidFile={self.run_dir}/slurmctld.pid",
            f"SlurmdPidFile={self.run_dir}/slurmd.pid",
            f"PlugStackConfig={self.etc}/plugstack.conf",
            "SlurmctldDebug=debug",
            "SlurmdDebug=debug",
            "DebugFlags=BurstBuffer",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
        ]
        if self.scheduler_parameters:
            lines.append(f"SchedulerParameters={self.scheduler_parameters}")
        lines += [
            "ReturnToService=2",
            "KillWait=2",
            "InactiveLimit=0",
            "MinJobAge=600",
            "MailProg=/bin/true",
        ]
        if self.burst_buffer:
            lines.append(f"BurstBufferType=burst_buffer/{self.burst_buffer}")
        lines += self.extra_conf
        lines += [
            f"NodeName={self.hostname} NodeAddr=127.0.0.1 {hw_text} State=UNKNOWN",
            f"PartitionName=debug Nodes={self.hostname} Default=YES MaxTime=INFINITE State=UP",
        ]
        return "\n".join(lines) + "\n"

    def _write_files(self):
        os.makedirs(self.dir, exist_ok=True)
        os.chmod(self.dir, 0o755)
        for d, owner in ((self.etc, None), (self.spool_dir, None), (self.state_dir, "slurm"),
                         (self.log_dir, "slurm"), (self.run_dir, "slurm")):
            os.makedirs(d, exist_ok=True)
            os.chmod(d, 0o755)
            if owner:
                os.chown(d, self.slurm_uid, self.slurm_gid)
        files = {"slurm.conf": self.slurm_conf_text(), "plugstack.conf": ""}
        if self.burst_buffer_conf is not None:
            files["burst_buffer.conf"] = self.burst_buffer_conf
        if self.lua_script is not None:
            files["burst_buffer.lua"] = self.lua_script
        for name, text in files.items():
            p = os.path.join(self.etc, name)
            with open(p, "w") as f:
                f.write(text)
            os.chmod(p, 0o644)

    # ------------------------------------------------------------------ processes

    def daemon_env(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        env["SLURM_CONF"] = self.conf
        env[SITE_ENV] = self.dir
        env.update(self.extra_env)
        return env

    def env(self):
        """Environment for client commands (and, through sbatch's --export=ALL, jobs)."""
        return self.daemon_env()

    def start(self, timeout=START_TIMEOUT):
        """Start slurmctld and slurmd; return once the node is idle (and, with a burst
        buffer, once the plugin has loaded its pools). Raises SlurmError with log tails."""
        t0 = time.monotonic()
        try:
            self._spawn("slurmctld", [SLURMCTLD, "-D", "-f", self.conf])
            self._spawn("slurmd", [SLURMD, "-D", "-f", self.conf, "-N", self.hostname])
            deadline = t0 + timeout
            last = ""
            while True:
                self._check_alive()
                # scontrol retries a refused connection for MessageTimeout: ask only once
                # slurmctld listens, so that a daemon dying at start is noticed at once
                if self._listening(self.ctld_port):
                    try:
                        r = self.run("scontrol", "show", "node", "-o", self.hostname, check=False, timeout=3)
                        last = (r.stdout + r.stderr).strip()
                        state = parse_record(last).get("State", "") if r.returncode == 0 else ""
                    except subprocess.TimeoutExpired:
                        last, state = "scontrol show node timed out", ""
                    if state.split("+")[0] in ("IDLE", "MIXED", "ALLOCATED"):
                        break
                else:
                    last = f"slurmctld not listening on port {self.ctld_port} yet"
                if time.monotonic() > deadline:
                    raise SlurmError(f"node not idle after {timeout:.0f} s: {last}")
                time.sleep(0.1)
            self.timings["node_idle"] = time.monotonic() - t0
            if self.burst_buffer:
                while True:
                    self._check_alive()
                    try:
                        text = self.show_burst(check=False, timeout=3)
                    except subprocess.TimeoutExpired:
                        text = "scontrol show burst timed out"
                    if self._pools_loaded(text):
                        break
                    if time.monotonic() > deadline:
                        raise SlurmError(f"burst_buffer/{self.burst_buffer} has no pools after "
                                         f"{timeout:.0f} s; scontrol show burst:\n{text}")
                    time.sleep(0.1)
            self.timings["start"] = time.monotonic() - t0
        except Exception as e:
            msg = self._diagnostics(str(e))
            # a slurmd without its slurmctld sits out SIGTERM in its registration retries
            self.stop(grace=1)
            raise SlurmError(msg) from None
        return self

    def _check_alive(self):
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise SlurmError(f"{name} exited with status {p.returncode}")

    @staticmethod
    def _listening(port):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    @staticmethod
    def _pools_loaded(text):
        # datawarp shows the default pool on the first line; lua (no DefaultPool) lists
        # every pool as PoolName[i]=... with a TotalSpace each
        return any(v not in ("0", "0B") for v in re.findall(r"TotalSpace=(\S+)", text))

    def _spawn(self, name, argv):
        out = open(os.path.join(self.log_dir, f"{name}.out"), "ab")
        try:
            self.procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                env=self.daemon_env(), start_new_session=True)
        finally:
            out.close()

    def _diagnostics(self, what):
        parts = [f"Slurm site {self.dir}: {what}"]
        for name in ("slurmctld", "slurmd"):
            errors = [l for l in self.log(name).splitlines()
                      if re.search(r"\b(error|fatal):", l) and not NOISE.search(l)]
            if errors:
                parts.append(f"--- last errors in {name}.log\n" + "\n".join(errors[-15:]))
        for name in ("slurmctld", "slurmd"):
            # <name>.out repeats the log (-D copies it to stderr) but also has what the
            # daemon said before it opened its log file
            for suffix in (".log", ".out"):
                text = self._read(os.path.join(self.log_dir, name + suffix))
                if text.strip():
                    parts.append(f"--- tail of {name}{suffix}\n{_tail(text, 25)}")
                    break
        return "\n".join(parts)

    @staticmethod
    def _read(path):
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def site_pids(self):
        """Pids of this site's processes: those carrying its SPILLWAY_SLURM_SITE and all
        their descendants (a job submitted with --export=NONE lacks the variable, its
        slurmstepd has it). Never our own pid."""
        me = os.getpid()
        needle = f"{SITE_ENV}={self.dir}".encode()
        marked, parent = set(), {}
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == me:
                continue
            pid = int(d)
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    parent[pid] = int(f.read().rsplit(b")", 1)[1].split()[1])
                with open(f"/proc/{d}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        marked.add(pid)
            except (OSError, IndexError, ValueError):
                continue
        out = set(marked)
        grew = True
        while grew:
            grew = False
            for pid, ppid in parent.items():
                if ppid in out and pid not in out and pid != me:
                    out.add(pid)
                    grew = True
        return sorted(out)

    def stop(self, grace=STOP_TIMEOUT):
        """SIGTERM both daemons (their process groups), SIGKILL after `grace` seconds,
        reap; then SIGKILL the site's other processes (site_pids(): job steps, jobs, tool
        calls). Returns [(pid, command line)] of those stragglers. Idempotent."""
        procs, self.procs = self.procs, {}
        for p in procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for p in procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        stragglers = []
        for _ in range(20):
            pids = self.site_pids()
            if not pids:
                break
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                except OSError:
                    cmd = "?"
                if pid not in [s[0] for s in stragglers]:
                    stragglers.append((pid, cmd))
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        return stragglers

    def __enter__(self):
        if not self.procs:
            self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------------ clients

    def run(self, cmd, *args, as_user=None, check=True, timeout=60, cwd=None, input=None):
        """A client command (`scontrol`, `sbatch`, ...) against this site, as root or as
        the user named `as_user` (runuser: MUNGE sees that uid). CompletedProcess (text);
        raises SlurmError on a non-zero exit when `check`."""
        argv = [shutil.which(cmd) or cmd, *map(str, args)]
        if as_user is not None:
            argv = ["runuser", "-u", str(as_user), "--", *argv]
        r = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=timeout,
                           cwd=cwd, input=input, stdin=None if input is not None else subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise SlurmError(f"{shlex.join(argv)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
        return r

    def submit(self, script, user, *sbatch_args, cwd=None, check=True):
        """sbatch --parsable the script text (through stdin) as `user` in `cwd`; the job id
        (int). With check=False returns the CompletedProcess instead (to see refusals)."""
        r = self.run("sbatch", "--parsable", *sbatch_args, as_user=user, cwd=cwd, input=script,
                     check=check)
        if not check:
            return r
        return int(r.stdout.strip().split(";")[0])

    def show_job(self, jobid):
        """`scontrol show job -o <id>` as a dict; {} once the job is unknown."""
        r = self.run("scontrol", "show", "job", "-o", jobid, check=False)
        if r.returncode != 0:
            return {}
        return parse_record(r.stdout.strip())

    def wait_job(self, jobid, states=FINAL_STATES, timeout=60, burst_buffer_done=False):
        """Poll until the job's JobState is one of `states` (and with `burst_buffer_done`,
        until its burst buffer is torn down too); the job record. On timeout raises
        SlurmError with the record and the log tails."""
        deadline = time.monotonic() + timeout
        rec = {}
        while True:
            rec = self.show_job(jobid)
            if rec.get("JobState") in states and (not burst_buffer_done or self._bb_done(rec)):
                return rec
            if time.monotonic() > deadline:
                raise SlurmError(self._diagnostics(
                    f"job {jobid} not in {'/'.join(states)} after {timeout} s"
                    f"{' with its burst buffer done' if burst_buffer_done else ''}; its record:\n"
                    + "\n".join(f"  {k}={v}" for k, v in rec.items())))
            time.sleep(0.1)

    @staticmethod
    def _bb_done(rec):
        return rec.get("BurstBufferState", "complete") in ("complete", "") and \
            "STAGE_OUT" not in rec.get("JobState", "")

    def cancel(self, jobid, as_user=None, hurry=False):
        """scancel (as root or `as_user`); `hurry`: --hurry (no stage-out)."""
        return self.run("scancel", *(["--hurry"] if hurry else []), jobid, as_user=as_user)

    def show_burst(self, check=True, timeout=60):
        """Text of `scontrol show burst`."""
        r = self.run("scontrol", "show", "burst", check=check, timeout=timeout)
        return r.stdout + r.stderr

    def user_dir(self, user, name=None):
        """A fresh directory under the site owned by `user` (name or TestUser), 0755: a
        working directory for that user's jobs."""
        pw = pwd.getpwnam(getattr(user, "name", user))
        base = os.path.join(self.dir, "home")
        os.makedirs(base, exist_ok=True)
        os.chmod(base, 0o755)
        d = os.path.join(base, name or pw.pw_name)
        n = 1
        while os.path.exists(d):
            n += 1
            d = os.path.join(base, f"{name or pw.pw_name}.{n}")
        os.mkdir(d, 0o755)
        os.chown(d, pw.pw_uid, pw.pw_gid)
        return d

    def log(self, which="slurmctld"):
        """Text of the slurmctld or slurmd log."""
        return self._read(os.path.join(self.log_dir, f"{which}.log"))
