//! This machine as the commands see it: its host name (its name as a compute node)
//! and a free TCP port on loopback for a process about to be started.

/// This machine's host name (its name as a compute node).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// A TCP port on 127.0.0.1 that nothing listens on now.
pub fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}
