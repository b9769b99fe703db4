//! The descriptor limit of a daemon (issue 14): every connection costs a descriptor,
//! and systemd's soft default of 1,024 is far below its hard limit, so the manager and
//! the storage servers take all the system allows at start; and the errors that mean
//! this process or host, not a peer, is out of descriptors or memory.

/// Raise the soft RLIMIT_NOFILE to the hard limit (bounded by `fs.nr_open`, which an
/// unlimited hard limit cannot exceed). Returns the soft limit in force afterwards.
// rlim_t is u32 on some 32-bit targets: the casts are not idle there.
#[allow(clippy::unnecessary_cast)]
pub fn raise_nofile_limit() -> Result<u64, String> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own and pass by pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return Err(format!(
            "getrlimit(RLIMIT_NOFILE): {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut want = rl.rlim_max;
    if want == libc::RLIM_INFINITY {
        want = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<libc::rlim_t>().ok())
            .unwrap_or(1 << 20);
    }
    if rl.rlim_cur >= want {
        return Ok(rl.rlim_cur as u64);
    }
    let new = libc::rlimit {
        rlim_cur: want,
        rlim_max: rl.rlim_max,
    };
    // SAFETY: setrlimit only reads the struct we pass.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } != 0 {
        return Err(format!(
            "setrlimit(RLIMIT_NOFILE, {want}): {} (staying at {})",
            std::io::Error::last_os_error(),
            rl.rlim_cur
        ));
    }
    Ok(want as u64)
}

/// The current soft RLIMIT_NOFILE (1,024, the usual default, when it cannot be read).
// rlim_t is u32 on some 32-bit targets: the casts are not idle there.
#[allow(clippy::unnecessary_cast)]
pub fn nofile_limit() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own and pass by pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return 1024;
    }
    rl.rlim_cur as u64
}

/// Raise the soft limit as `raise_nofile_limit` does and say so in the log (`who`
/// names the daemon); on failure the limit stays as it was, which is logged too.
/// Returns the soft limit in force.
pub fn raise_nofile_limit_logged(who: &str) -> u64 {
    match raise_nofile_limit() {
        Ok(n) => {
            tracing::info!(
                descriptors = n,
                "{who}: descriptor limit raised to the hard limit"
            );
            n
        }
        Err(e) => {
            let n = nofile_limit();
            tracing::warn!(
                descriptors = n,
                "{who}: cannot raise the descriptor limit: {e}"
            );
            n
        }
    }
}

/// Errors that mean this process or host is out of a resource (not the peer's doing).
pub fn is_resource_exhaustion(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::unnecessary_cast)]
    fn raises_the_soft_limit_to_the_hard_one() {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we own.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) }, 0);
        if rl.rlim_max == libc::RLIM_INFINITY {
            return; // the nr_open case; not set up here
        }
        // Half the hard limit: far above what the other tests use meanwhile.
        let low = libc::rlimit {
            rlim_cur: rl.rlim_max / 2,
            rlim_max: rl.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) }, 0);
        assert_eq!(nofile_limit(), rl.rlim_max as u64 / 2);
        assert_eq!(raise_nofile_limit(), Ok(rl.rlim_max as u64));
        assert_eq!(nofile_limit(), rl.rlim_max as u64);
        // Already at the hard limit: nothing to do.
        assert_eq!(raise_nofile_limit_logged("test"), rl.rlim_max as u64);
    }

    #[test]
    fn resource_errors() {
        for e in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            assert!(is_resource_exhaustion(&std::io::Error::from_raw_os_error(
                e
            )));
        }
        assert!(!is_resource_exhaustion(&std::io::Error::from_raw_os_error(
            libc::ECONNREFUSED
        )));
    }
}
