//! This machine as the commands see it: its host name (its name as a compute node)
//! and a free TCP port on loopback for a process about to be started.

/// This machine's host name (its name as a compute node).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// A TCP port on 127.0.0.1 that nothing listens on now, and that this process has not
/// handed out before. The probe's socket is closed at once, so the kernel may offer the
/// same port to the next probe: a `local up` then gave its manager the port its first
/// server had just taken ("Address already in use"), so ports already given are skipped.
pub fn free_port() -> Result<u16, String> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..64 {
        let l =
            std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
        let port = l
            .local_addr()
            .map(|a| a.port())
            .map_err(|e| e.to_string())?;
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
    }
    Err("no free port: the kernel kept offering ports already given".into())
}

#[cfg(test)]
mod tests {
    /// Ports handed out by one process are distinct, even when the kernel offers a closed
    /// probe's port again (2,000 bare probes here gave 130 repeats).
    #[test]
    fn free_ports_are_never_given_twice() {
        let ports: Vec<u16> = (0..2000).map(|_| super::free_port().unwrap()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len());
    }
}
