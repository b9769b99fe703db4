//! Running a command in the background the Unix way: fork before any thread exists,
//! the child starts a new session with its output in a log file, and the parent waits
//! on a pipe until the child says it is ready (or why it failed).

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;

/// What the child uses to report readiness.
pub struct Ready {
    pipe: Option<std::fs::File>,
}

impl Ready {
    pub fn ok(&mut self) {
        if let Some(mut p) = self.pipe.take() {
            let _ = p.write_all(b"ok\n");
        }
    }
}

/// Fork. In the parent: wait for the child's word and exit with it. In the child:
/// return the readiness handle, detached from the terminal, output to `log`.
pub fn daemonize(log: &Path) -> Result<Ready, String> {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid 2-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the fds were just created and are owned here only.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("cannot open log {}: {e}", log.display()))?;
    // SAFETY: called before this process starts any thread.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid > 0 {
        drop(wr);
        let mut msg = String::new();
        let _ = std::fs::File::from(rd).read_to_string(&mut msg);
        if msg.trim() == "ok" {
            std::process::exit(0);
        }
        if msg.is_empty() {
            msg = format!("the background process exited early; see {}", log.display());
        }
        eprintln!("spillway: {}", msg.trim());
        std::process::exit(1);
    }
    drop(rd);
    // SAFETY: plain syscalls on fds we own.
    unsafe {
        libc::setsid();
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
        }
        use std::os::fd::AsRawFd;
        libc::dup2(logf.as_raw_fd(), 1);
        libc::dup2(logf.as_raw_fd(), 2);
    }
    Ok(Ready {
        pipe: Some(std::fs::File::from(wr)),
    })
}
