//! A mount's client process (`spillway mount ... --pidfile FILE`): recognised by its
//! command line, and stopped once its mount is gone, through a pidfd so that a reused
//! pid is never signalled.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long an unmounted client gets to exit on its own before SIGTERM.
const CLIENT_EXIT_WAIT: Duration = Duration::from_secs(15);

/// Stop the FUSE client whose pid `pidfile` holds (a file in a root-only directory, so
/// its content is trusted) once it is verified to be that mount's client: a
/// `spillway mount` writing that very pidfile. It normally exits by itself once its
/// mount is gone; it gets CLIENT_EXIT_WAIT, then SIGTERM, then SIGKILL.
pub fn stop_client(pidfile: &Path) -> Result<(), String> {
    let pid = match std::fs::read_to_string(pidfile) {
        Ok(s) => s.trim().parse::<i32>().ok().filter(|p| *p > 0),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("{}: {e}", pidfile.display())),
    };
    let Some(pid) = pid else {
        let _ = std::fs::remove_file(pidfile);
        return Ok(());
    };
    // A pidfd pins the process: the checks and signals below reach the same one even
    // if the pid were reused.
    // SAFETY: pidfd_open(pid, 0) has no memory arguments.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if raw < 0 {
        // ESRCH: already gone.
        let _ = std::fs::remove_file(pidfile);
        return Ok(());
    }
    // SAFETY: the kernel just returned this fd to us.
    let pidfd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
    if !is_client_of(pid, pidfile) {
        tracing::warn!(
            pid,
            "{}: the process is not this mount's client: not stopped",
            pidfile.display()
        );
        let _ = std::fs::remove_file(pidfile);
        return Ok(());
    }
    let signal = |sig: i32| {
        // SAFETY: pidfd_send_signal with a valid pidfd and no siginfo.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    };
    let exited = |wait: Duration| {
        let mut p = libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut p, 1, left.as_millis().min(60_000) as i32) };
            if r > 0 {
                return true;
            }
            if r == 0 || Instant::now() >= deadline {
                return false;
            }
        }
    };
    if !exited(CLIENT_EXIT_WAIT) {
        signal(libc::SIGTERM);
        if !exited(Duration::from_secs(10)) {
            signal(libc::SIGKILL);
            if !exited(Duration::from_secs(10)) {
                return Err(format!(
                    "client {pid} of {} does not exit",
                    pidfile.display()
                ));
            }
        }
    }
    // A child of ours (spillway cluster's foreground mounts are not) would stay a zombie.
    // SAFETY: waitpid with WNOHANG; harmless if it is not our child.
    unsafe {
        let mut st = 0;
        libc::waitpid(pid, &mut st, libc::WNOHANG);
    }
    let _ = std::fs::remove_file(pidfile);
    Ok(())
}

/// Whether process `pid` is `spillway mount ... --pidfile <pidfile> ...`.
pub fn is_client_of(pid: i32, pidfile: &Path) -> bool {
    let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
    let want = pidfile.as_os_str().as_bytes();
    args.get(1) == Some(&&b"mount"[..])
        && args
            .windows(2)
            .any(|w| w[0] == b"--pidfile" && w[1] == want)
}
