//! A private munged for tests (cargo feature `testing`).
//!
//! [`PrivateMunged::start`] runs the real `/usr/sbin/munged` with its own key, socket,
//! pid, log and seed files in a directory of the test's, so that tests neither need nor
//! disturb the system's munged, and can run two daemons with different keys. The daemon
//! is stopped (SIGTERM, then SIGKILL) when the handle drops.
//!
//! What munged 0.5.x needs here (it checks all of this at start and refuses to run
//! otherwise; `--force` turns the refusals into warnings):
//! * the key file owned by the daemon's uid and readable by nobody else (0600);
//! * the socket's directory and every directory above it executable by all, so that
//!   clients of any uid can reach the socket (hence the directory is set to 0755);
//! * no directory on those paths writable by group or others without the sticky bit.
//!
//! Running as root is fine: munged does not insist on a `munge` user.
//! `--force` is passed anyway so that a test directory under an unusual parent (e.g. a
//! 0700 one) still gets a daemon (its socket is then reachable by root only, which is
//! all most tests need), and so that a socket left by a SIGKILLed daemon is replaced.
//! Since `--force` would also take a socket over from a live daemon, `start` refuses a
//! directory whose socket still answers.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Munge, MungeError};

/// How long munged gets to answer its first request after being started.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How long munged gets to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A munged of the test's own; see the module documentation.
#[derive(Debug)]
pub struct PrivateMunged {
    child: Option<Child>,
    dir: PathBuf,
    socket: PathBuf,
    key_file: PathBuf,
    log_file: PathBuf,
}

/// The munged binary: `$SPILLWAY_MUNGED`, else Debian's `/usr/sbin/munged`, else `munged`
/// on PATH.
fn munged_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("SPILLWAY_MUNGED") {
        return PathBuf::from(p);
    }
    let debian = Path::new("/usr/sbin/munged");
    if debian.exists() {
        return debian.to_path_buf();
    }
    PathBuf::from("munged")
}

fn with_path(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

impl PrivateMunged {
    /// Creates `dir` if needed (mode 0755: munged wants its socket directory executable
    /// by all), writes a fresh 1024-bit key there (`munge.key`, 0600) and starts munged
    /// with `munge.socket`, `munged.pid`, `munged.log` and `munged.seed` in `dir`.
    /// Returns once munged answers an encode request; on failure the error carries
    /// munged's log.
    ///
    /// Two daemons started in two directories have different keys: each refuses the
    /// other's credentials. A directory whose daemon still runs is refused
    /// (`AlreadyExists`).
    pub fn start(dir: &Path) -> io::Result<PrivateMunged> {
        fs::create_dir_all(dir).map_err(|e| with_path(e, "create", dir))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
            .map_err(|e| with_path(e, "chmod 0755", dir))?;
        let dir = dir.to_path_buf();
        let socket = dir.join("munge.socket");
        // --force (below) makes munged take over a socket even from a live daemon, which
        // would then run on unreachable: refuse to start a second one in the same place.
        // A socket nobody answers on is a crashed run's leftover, which --force replaces.
        if UnixStream::connect(&socket).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("a munged already answers on {}", socket.display()),
            ));
        }
        let key_file = dir.join("munge.key");
        let log_file = dir.join("munged.log");

        // The key: 128 random bytes, what `mungekey -c` makes by default (munged accepts
        // any file of at least 32 bytes). Written here so that no second tool is needed.
        let mut key = [0u8; 128];
        File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut key))
            .map_err(|e| with_path(e, "read", Path::new("/dev/urandom")))?;
        let _ = fs::remove_file(&key_file); // a leftover of an earlier run; mode 0600 below
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&key_file)
            .and_then(|mut f| f.write_all(&key))
            .map_err(|e| with_path(e, "write", &key_file))?;

        // In the foreground (-F) munged stays our child, so that Drop can stop it and
        // reap it; it then logs to stderr, not to --log-file, hence the redirect.
        let log = File::create(&log_file).map_err(|e| with_path(e, "create", &log_file))?;
        let log_err = log.try_clone()?;
        let binary = munged_binary();
        let child = Command::new(&binary)
            .arg("--foreground")
            .arg("--force")
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--key-file={}", key_file.display()))
            .arg(format!("--log-file={}", log_file.display()))
            .arg(format!("--pid-file={}", dir.join("munged.pid").display()))
            .arg(format!("--seed-file={}", dir.join("munged.seed").display()))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|e| with_path(e, "start", &binary))?;
        let mut me = PrivateMunged {
            child: Some(child),
            dir,
            socket,
            key_file,
            log_file,
        };
        me.wait_ready()?;
        Ok(me)
    }

    /// Polls until munged encodes a credential, it exits, or START_TIMEOUT passes.
    fn wait_ready(&mut self) -> io::Result<()> {
        let munge = self.munge();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let last = match munge.encode(b"") {
                Ok(_) => return Ok(()),
                // The socket is not there yet: munged is still starting.
                Err(e @ MungeError::Socket { .. }) => e,
                Err(e) => return Err(self.fail(&format!("munged answered {e}"))),
            };
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(self.fail(&format!("munged exited ({status})")));
                }
            }
            if Instant::now() >= deadline {
                return Err(self.fail(&format!(
                    "munged not ready after {START_TIMEOUT:?} ({last})"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// An error for a failed start, with munged's log; stops the daemon.
    fn fail(&mut self, what: &str) -> io::Error {
        self.stop();
        let log = fs::read_to_string(&self.log_file).unwrap_or_default();
        io::Error::other(format!(
            "private munged in {}: {what}; its log:\n{log}",
            self.dir.display()
        ))
    }

    /// The daemon's socket (`<dir>/munge.socket`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// A [`Munge`] talking to this daemon.
    pub fn munge(&self) -> Munge {
        Munge::new(Some(self.socket.clone()))
    }

    /// The daemon's key file (`<dir>/munge.key`).
    pub fn key_file(&self) -> &Path {
        &self.key_file
    }

    /// The daemon's log (`<dir>/munged.log`).
    pub fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// The daemon's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the daemon (SIGTERM, SIGKILL after STOP_TIMEOUT) and reaps it; idempotent.
    /// Its files stay in the directory.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        // SIGTERM first: munged then removes its socket and saves its seed.
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: plain kill(2) of our own unreaped child, so the pid is not reused.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for PrivateMunged {
    fn drop(&mut self) {
        self.stop();
    }
}
