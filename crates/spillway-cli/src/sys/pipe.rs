//! A closed stdout (`spillway stripes FILE | head -1`) ends a one-shot command quietly,
//! as it ends `ls` or `cat`: never a panic of `println!` on EPIPE.
//!
//! Rust's runtime ignores SIGPIPE, so a write to a closed pipe fails with EPIPE and
//! `println!` panics. One-shot commands (`stripes`, `setstripe`, `cluster`, `local`,
//! `tls`, `umount`) get the default action back and end on the signal, as Unix tools
//! do. Daemons (`server`, `mount`, `manager`, `agent`) keep it ignored: a peer closing
//! a socket must never kill them. `spillway run` keeps it ignored too and writes its
//! progress with [`say!`], which drops output nobody reads: dying half-way would leave
//! the job's session, instance and owed stage-outs behind.

/// Restore SIGPIPE's default action (terminate) for this process.
pub fn default_sigpipe() {
    // SAFETY: signal(2) with a valid signal number and SIG_DFL; no handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// `println!` that drops the line when stdout is closed or failing, instead of
/// panicking (for `spillway run`, whose job must go on to its teardown).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, $($arg)*);
    }};
}
