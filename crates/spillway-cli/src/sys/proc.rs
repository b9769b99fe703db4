//! Processes by pid: whether one is alive (a zombie is not), stopping one, starting
//! a `spillway` daemon detached from the terminal with its output in a log file, and
//! the path this program was installed at.

use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The path of this program's binary, as installed, for a long-running process to
/// start more of itself with. Taken once at start: after an upgrade replaces the file
/// (a new file renamed over it, as `install` does), `/proc/self/exe` names the old,
/// deleted one ("... (deleted)", which exec cannot find) while the path taken at start
/// names the new binary.
pub fn installed_exe() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the path of this program: {e}"))?;
    // Replaced already before we looked: the path it was installed at is the same.
    match exe.to_str().and_then(|s| s.strip_suffix(" (deleted)")) {
        Some(installed) => Ok(PathBuf::from(installed)),
        None => Ok(exe),
    }
}

/// Whether process `pid` exists and has not exited (zombies count as gone).
pub fn alive(pid: i32) -> bool {
    // A zombie child of ours still "exists": reap it first.
    // SAFETY: waitpid with WNOHANG on a pid; harmless if it is not our child.
    unsafe {
        let mut st = 0;
        libc::waitpid(pid, &mut st, libc::WNOHANG);
    }
    // SAFETY: signal 0 only checks existence.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    // An exited process that is not our child stays a zombie until its parent (often
    // init) reaps it: it is gone for our purposes.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z') | Some('X') | None)
}

/// Send `first` to `pid`, give it 10 s to exit, then SIGKILL it and wait until it is gone.
pub fn stop_pid(pid: i32, first: i32) {
    stop_pid_within(pid, first, Duration::from_secs(10));
}

/// Send `first` to `pid`, give it `grace` to exit, then SIGKILL it and wait until it is
/// gone.
pub fn stop_pid_within(pid: i32, first: i32, grace: Duration) {
    // SAFETY: plain kill(2).
    unsafe { libc::kill(pid, first) };
    let deadline = Instant::now() + grace;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if alive(pid) {
        // SAFETY: plain kill(2).
        unsafe { libc::kill(pid, libc::SIGKILL) };
        while alive(pid) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Start `cmd` in a session of its own (detached from our terminal), stdin from
/// /dev/null, stdout and stderr appended to `log`, which is created 0600 (logs name
/// users' files and stages: root's alone). Returns the pid; `what` names the process
/// in the error.
pub fn spawn_detached(mut cmd: Command, log: &Path, what: &str) -> Result<i32, String> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from our terminal.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {what}: {e}"))?;
    Ok(child.id() as i32)
}
