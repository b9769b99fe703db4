//! Logging that can fail without taking anything down.
//!
//! Every daemon (storage server, FUSE client, manager, agent) logs to stderr, which is
//! a file: often on the very disk that fills up. Rust's `eprintln!`/`println!` panic
//! when their write fails, and tracing-subscriber's fmt layer reports a failed write
//! with `eprintln!` — so a full disk made whichever thread logged panic: a server's
//! connection thread (its client's calls then timed out until a restart), the FUSE
//! client's session (the mount went ENOTCONN). Here a log line that cannot be written
//! is dropped and counted, never an error or a panic, and the next line that can be
//! written is preceded by a note saying how many were lost and why.
//!
//! * `init` — the one logging setup of every daemon.
//! * `Lossy` — the writer (any `Write` behind it; stderr for the daemons).
//! * `stderr_line` — a message to stderr that never panics, for `eprintln!`'s uses.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;

/// What a `Lossy` writer lost, shared by the writers it makes.
#[derive(Default, Debug)]
pub struct Losses {
    /// Lines dropped since the last note.
    lines: AtomicU64,
    /// The errno of the last failed write (0: none known).
    errno: AtomicI32,
    /// The last failed write had written part of its line: the note starts on a new line.
    torn: AtomicBool,
    /// Lines dropped since the start (never reset; for tests and status).
    total: AtomicU64,
}

impl Losses {
    /// Lines dropped since the process started.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

/// A `MakeWriter` (and plain writer factory) whose writers never fail: `open` makes the
/// underlying writer for each log line.
#[derive(Clone)]
pub struct Lossy<F> {
    open: F,
    losses: Arc<Losses>,
}

impl Lossy<fn() -> io::Stderr> {
    /// Lines to this process's stderr.
    pub fn stderr() -> Lossy<fn() -> io::Stderr> {
        Lossy::new(io::stderr as fn() -> io::Stderr)
    }
}

impl<F, W> Lossy<F>
where
    F: Fn() -> W,
    W: Write,
{
    pub fn new(open: F) -> Lossy<F> {
        Lossy {
            open,
            losses: Arc::new(Losses::default()),
        }
    }

    pub fn losses(&self) -> Arc<Losses> {
        self.losses.clone()
    }

    /// A writer for one line (tracing's fmt layer writes each event with one
    /// `write_all` of the whole formatted line).
    pub fn line(&self) -> Line<W> {
        Line {
            out: (self.open)(),
            losses: self.losses.clone(),
        }
    }
}

impl<'a, F, W> tracing_subscriber::fmt::MakeWriter<'a> for Lossy<F>
where
    F: Fn() -> W + 'static,
    W: Write + 'a,
{
    type Writer = Line<W>;

    fn make_writer(&'a self) -> Line<W> {
        self.line()
    }
}

/// One line's writer: every write "succeeds"; what could not be written is counted.
pub struct Line<W> {
    out: W,
    losses: Arc<Losses>,
}

/// Write all of `buf`; on failure, how much of it was written and the error.
fn write_counted<W: Write>(out: &mut W, buf: &[u8]) -> Result<(), (usize, io::Error)> {
    let mut done = 0;
    while done < buf.len() {
        match out.write(&buf[done..]) {
            Ok(0) => return Err((done, io::ErrorKind::WriteZero.into())),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((done, e)),
        }
    }
    Ok(())
}

impl<W: Write> Line<W> {
    fn lost(&self, written: usize, e: &io::Error) {
        self.losses.lines.fetch_add(1, Ordering::Relaxed);
        self.losses.total.fetch_add(1, Ordering::Relaxed);
        self.losses
            .errno
            .store(e.raw_os_error().unwrap_or(0), Ordering::Relaxed);
        self.losses.torn.store(written > 0, Ordering::Relaxed);
    }

    /// Tell, before the next line, how many lines were lost. False if even that fails.
    fn note_losses(&mut self) -> bool {
        let lost = self.losses.lines.load(Ordering::Relaxed);
        if lost == 0 {
            return true;
        }
        let errno = self.losses.errno.load(Ordering::Relaxed);
        let why = if errno != 0 {
            io::Error::from_raw_os_error(errno).to_string()
        } else {
            "write failed".to_string()
        };
        let start = if self.losses.torn.load(Ordering::Relaxed) {
            "\n"
        } else {
            ""
        };
        let note =
            format!("{start}[log: {lost} line(s) could not be written ({why}) and were dropped]\n");
        match write_counted(&mut self.out, note.as_bytes()) {
            Ok(()) => {
                // Lines lost by other threads meanwhile stay counted for the next note.
                self.losses.lines.fetch_sub(lost, Ordering::Relaxed);
                self.losses.torn.store(false, Ordering::Relaxed);
                true
            }
            Err((n, e)) => {
                self.lost(n, &e);
                false
            }
        }
    }
}

impl<W: Write> Write for Line<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.note_losses() {
            if let Err((n, e)) = write_counted(&mut self.out, buf) {
                self.lost(n, &e);
            }
        }
        // Consumed either way: the caller must never see a log failure.
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = self.out.flush();
        Ok(())
    }
}

/// Set up this process's logging: `filter` (tracing directives, e.g. `info` or
/// `info,fuser=warn`) to stderr through a `Lossy` writer, colours only on a terminal.
/// Err: the filter does not parse. A second call in one process changes nothing.
pub fn init(filter: &str) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).map_err(|e| e.to_string())?;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(Lossy::stderr())
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        // The writer never fails; and if it did, this would eprintln! (and panic).
        .log_internal_errors(false)
        .try_init();
    Ok(())
}

/// `msg` and a newline to stderr; a failure is ignored (`eprintln!` would panic).
pub fn stderr_line(msg: &str) {
    let mut line = Vec::with_capacity(msg.len() + 1);
    line.extend_from_slice(msg.as_bytes());
    line.push(b'\n');
    let _ = io::stderr().lock().write_all(&line);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A writer into a shared buffer that fails (ENOSPC) while `full` is set, after
    /// accepting `partial` bytes of the failing write.
    #[derive(Clone, Default)]
    struct Disk {
        data: Arc<Mutex<Vec<u8>>>,
        full: Arc<AtomicBool>,
        partial: usize,
    }

    impl Write for Disk {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.full.load(Ordering::SeqCst) {
                let n = self.partial.min(buf.len());
                if n > 0 {
                    self.data.lock().unwrap().extend_from_slice(&buf[..n]);
                    self.partial = 0;
                    return Ok(n);
                }
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.data.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn text(d: &Disk) -> String {
        String::from_utf8(d.data.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn a_failing_log_drops_and_counts_lines_then_says_so() {
        let disk = Disk::default();
        let d2 = disk.clone();
        let lossy = Lossy::new(move || d2.clone());
        lossy.line().write_all(b"one\n").unwrap();
        disk.full.store(true, Ordering::SeqCst);
        for _ in 0..3 {
            // Never an error: write_all would turn one into a panic upstream.
            lossy.line().write_all(b"lost\n").unwrap();
            lossy.line().flush().unwrap();
        }
        assert_eq!(lossy.losses().total(), 3);
        disk.full.store(false, Ordering::SeqCst);
        lossy.line().write_all(b"two\n").unwrap();
        let t = text(&disk);
        assert!(
            t.starts_with("one\n[log: 3 line(s) could not be written ("),
            "{t}"
        );
        assert!(t.contains("No space left on device"), "{t}");
        assert!(t.ends_with("dropped]\ntwo\n"), "{t}");
        assert!(!t.contains("lost"), "{t}");
        // Said once.
        lossy.line().write_all(b"three\n").unwrap();
        assert!(text(&disk).ends_with("dropped]\ntwo\nthree\n"));
    }

    #[test]
    fn a_torn_line_is_ended_before_the_note() {
        let disk = Disk {
            partial: 3,
            ..Disk::default()
        };
        disk.full.store(true, Ordering::SeqCst);
        let d2 = disk.clone();
        let lossy = Lossy::new(move || d2.clone());
        lossy.line().write_all(b"abcdef\n").unwrap();
        disk.full.store(false, Ordering::SeqCst);
        lossy.line().write_all(b"next\n").unwrap();
        let t = text(&disk);
        assert!(t.starts_with("abc\n[log: 1 line(s)"), "{t}");
        assert!(t.ends_with("]\nnext\n"), "{t}");
    }

    #[test]
    fn tracing_events_through_a_full_log_never_panic() {
        let disk = Disk::default();
        disk.full.store(true, Ordering::SeqCst);
        let d2 = disk.clone();
        let lossy = Lossy::new(move || d2.clone());
        let losses = lossy.losses();
        let sub = tracing_subscriber::fmt()
            .with_writer(lossy)
            .with_ansi(false)
            // tracing-subscriber's default: it would eprintln! (and panic) on a
            // writer's error; this writer has none to report.
            .log_internal_errors(true)
            .finish();
        tracing::subscriber::with_default(sub, || {
            for i in 0..10 {
                tracing::error!("event {i}");
            }
        });
        assert_eq!(losses.total(), 10);
        assert!(text(&disk).is_empty());
    }
}
