//! Waiting for SIGTERM/SIGINT. The signals are blocked in the calling thread before any
//! other thread exists (threads inherit the mask), then taken synchronously with
//! sigwait: no handler runs in signal context, so shutdown is ordinary code.

use std::mem::MaybeUninit;

pub(crate) struct TermSignals {
    set: libc::sigset_t,
}

impl TermSignals {
    /// Block SIGTERM and SIGINT in this thread (and every thread it starts later).
    pub(crate) fn block() -> Result<TermSignals, String> {
        let mut set = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the set before anything reads it; the
        // pointers passed are valid for the duration of each call.
        let set = unsafe {
            if libc::sigemptyset(set.as_mut_ptr()) != 0 {
                return Err("sigemptyset failed".into());
            }
            let mut set = set.assume_init();
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if rc != 0 {
                return Err(format!(
                    "cannot block signals: {}",
                    std::io::Error::from_raw_os_error(rc)
                ));
            }
            set
        };
        Ok(TermSignals { set })
    }

    /// Wait for one of the signals; returns its number.
    pub(crate) fn wait(&self) -> i32 {
        loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: `self.set` is an initialised sigset and `sig` a valid out pointer.
            let rc = unsafe { libc::sigwait(&self.set, &mut sig) };
            if rc == 0 {
                return sig;
            }
        }
    }
}
