//! Who is at the other end of a TCP connection, as far as a daemon can fairly tell
//! before authentication, and the caps on connections counted per such peer and in
//! total (issue 14): the manager's front door and the storage servers' handshakes both
//! use these, so that one caller cannot use up everybody's share.
//!
//! A remote peer is its IP address (the whole address, IPv6 included): the daemon
//! cannot see users on another host, so the users of a remote login node share that
//! node's address (size the per-peer cap for it). A peer on the daemon's own host (a
//! loopback source address, or one of the host's own addresses) is *the uid owning the
//! connecting socket* alone, read from the kernel's socket table (`/proc/net/tcp`,
//! `/proc/net/tcp6`: the row whose local end is the peer's address and whose remote end
//! is ours; the same information identd, RFC 1413, serves). Keyed by address, every
//! local user would share `127.0.0.1` and one user holding its share would lock all the
//! others out; keyed by (address, uid), one user could multiply their share by binding
//! other addresses of 127/8 or of the host.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Who a connection counts against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    /// Another host: its address.
    Remote(IpAddr),
    /// This host: the uid owning the connecting socket (`None`: not found, e.g. the
    /// client closed it before it was looked up; those share one share).
    Local(Option<u32>),
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Remote(ip) => write!(f, "{ip}"),
            Peer::Local(Some(uid)) => write!(f, "uid {uid} on this host"),
            Peer::Local(None) => write!(f, "an unknown uid on this host"),
        }
    }
}

// ------------------------------------------------------------------ the socket table

/// One line of `/proc/net/tcp` or `/proc/net/tcp6`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SockEntry {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub state: u8,
    pub uid: u32,
}

/// TCP_TIME_WAIT in `/proc/net/tcp`'s `st` column: a closed socket (owned by uid 0).
const TCP_TIME_WAIT: u8 = 0x06;

/// An IPv4-mapped IPv6 address as its IPv4 form: a dual-stack listener sees a v4
/// peer as mapped, while the peer's own row may be in either table.
fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// `ADDR:PORT` as the kernel prints it: the address as 32-bit words in hex, each in
/// the host's byte order (one word for IPv4, four for IPv6), the port in hex.
fn parse_hex_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |h: &str| u32::from_str_radix(h, 16).ok().map(u32::to_ne_bytes);
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(ip)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[4 * i..4 * i + 4].copy_from_slice(&word(ip.get(8 * i..8 * i + 8)?)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(canonical(SocketAddr::new(ip, port)))
}

/// The sockets of a `/proc/net/tcp` or `/proc/net/tcp6` text (lines that do not parse
/// are skipped: the header, and anything a future kernel adds).
pub fn parse_proc_net_tcp(text: &str) -> Vec<SockEntry> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid
            if f.len() < 8 || !f[0].ends_with(':') {
                return None;
            }
            Some(SockEntry {
                local: parse_hex_addr(f[1])?,
                remote: parse_hex_addr(f[2])?,
                state: u8::from_str_radix(f[3], 16).ok()?,
                uid: f[7].parse().ok()?,
            })
        })
        .collect()
}

/// The uid owning the client end of a connection from `peer` to `ours`: the live
/// socket whose local address is the peer's and whose remote address is ours (not the
/// daemon's own accepted socket, which is the other way round).
pub fn owner_uid(entries: &[SockEntry], peer: SocketAddr, ours: SocketAddr) -> Option<u32> {
    let (peer, ours) = (canonical(peer), canonical(ours));
    entries
        .iter()
        .find(|e| e.local == peer && e.remote == ours && e.state != TCP_TIME_WAIT)
        .map(|e| e.uid)
}

fn read_proc_sockets() -> Vec<SockEntry> {
    let mut out = Vec::new();
    for p in ["/proc/net/tcp", "/proc/net/tcp6"] {
        match std::fs::read_to_string(p) {
            Ok(t) => out.extend(parse_proc_net_tcp(&t)),
            // No IPv6 on this host: nothing to find there.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::debug!("cannot read {p}: {e}"),
        }
    }
    out
}

/// This host's addresses (every interface's), IPv4-mapped ones in their IPv4 form.
fn host_addresses() -> std::io::Result<HashSet<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list that is freed below, once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = HashSet::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, not freed yet.
        let ifa = unsafe { &*p };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr whose family field is valid.
            let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            if family == libc::AF_INET {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                out.insert(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                ))));
            } else if family == libc::AF_INET6 {
                // SAFETY: an AF_INET6 address is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                out.insert(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)).to_canonical());
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// How long this host's address list is trusted (interfaces change rarely).
const HOST_ADDRS_TTL: Duration = Duration::from_secs(10);
/// How long a socket-table snapshot may answer for a connection found in it. A
/// connection not in the snapshot makes a fresh one, so connections accepted in a
/// burst (all already in the table when the first is looked up) share one read.
const SOCKS_TTL: Duration = Duration::from_secs(1);

/// Finds who a new connection counts against, caching this host's addresses and the
/// socket table between connections. Owned by the accept loop.
pub struct PeerLookup {
    host: HashSet<IpAddr>,
    host_read: Option<Instant>,
    socks: Vec<SockEntry>,
    socks_read: Option<Instant>,
}

impl Default for PeerLookup {
    fn default() -> PeerLookup {
        PeerLookup::new()
    }
}

impl PeerLookup {
    pub fn new() -> PeerLookup {
        PeerLookup {
            host: HashSet::new(),
            host_read: None,
            socks: Vec::new(),
            socks_read: None,
        }
    }

    fn on_this_host(&mut self, ip: IpAddr, now: Instant) -> bool {
        if ip.is_loopback() {
            return true;
        }
        if self
            .host_read
            .is_none_or(|t| now.duration_since(t) > HOST_ADDRS_TTL)
        {
            match host_addresses() {
                Ok(h) => self.host = h,
                Err(e) => tracing::debug!("cannot list this host's addresses: {e}"),
            }
            self.host_read = Some(now);
        }
        self.host.contains(&ip)
    }

    /// The peer of a connection accepted on `ours` from `peer`.
    pub fn peer_of(&mut self, peer: SocketAddr, ours: SocketAddr) -> Peer {
        let now = Instant::now();
        let ip = peer.ip().to_canonical();
        if !self.on_this_host(ip, now) {
            return Peer::Remote(ip);
        }
        if self
            .socks_read
            .is_some_and(|t| now.duration_since(t) <= SOCKS_TTL)
        {
            if let Some(uid) = owner_uid(&self.socks, peer, ours) {
                return Peer::Local(Some(uid));
            }
        }
        self.socks = read_proc_sockets();
        self.socks_read = Some(Instant::now());
        Peer::Local(owner_uid(&self.socks, peer, ours))
    }
}

// ------------------------------------------------------------------ caps

/// Why a connection was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The total cap is reached.
    Total,
    /// This peer holds its share.
    Peer,
}

#[derive(Default)]
struct Counts {
    total: usize,
    by_peer: HashMap<Peer, usize>,
}

struct Shared {
    max_total: usize,
    max_per_peer: usize,
    local_root_total_only: bool,
    counts: Mutex<Counts>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Connections counted per peer and in total, with a cap on each: `admit` hands out
/// a ticket that gives its place back when dropped. Clones share the counts.
#[derive(Clone)]
pub struct PeerLimits(Arc<Shared>);

/// One admitted connection's place; dropping it frees the place.
pub struct Admitted {
    limits: Arc<Shared>,
    peer: Peer,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut c = self.limits.lock();
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.by_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                c.by_peer.remove(&self.peer);
            }
        }
    }
}

impl PeerLimits {
    /// At most `max_total` connections in all and `max_per_peer` from one peer.
    pub fn new(max_total: usize, max_per_peer: usize) -> PeerLimits {
        PeerLimits(Arc::new(Shared {
            max_total,
            max_per_peer,
            local_root_total_only: false,
            counts: Mutex::default(),
        }))
    }

    /// The same, but root on this host (`Peer::Local(Some(0))`) counts only against
    /// the total: for the storage servers, whose root callers on their own host are
    /// the daemons themselves (mounts, peer servers, the manager) and trusted anyway.
    /// Not for the manager, whose privileged callers (agents, Slurm) are admins by
    /// group, not necessarily root, and get a share like everyone.
    pub fn local_root_counts_only_in_total(max_total: usize, max_per_peer: usize) -> PeerLimits {
        PeerLimits(Arc::new(Shared {
            max_total,
            max_per_peer,
            local_root_total_only: true,
            counts: Mutex::default(),
        }))
    }

    pub fn max_total(&self) -> usize {
        self.0.max_total
    }

    pub fn max_per_peer(&self) -> usize {
        self.0.max_per_peer
    }

    /// Admit a connection from `peer`, or say which cap it is over.
    pub fn admit(&self, peer: Peer) -> Result<Admitted, Refusal> {
        let mut c = self.0.lock();
        if c.total >= self.0.max_total {
            return Err(Refusal::Total);
        }
        let uncapped = self.0.local_root_total_only && peer == Peer::Local(Some(0));
        let n = c.by_peer.entry(peer).or_insert(0);
        if *n >= self.0.max_per_peer && !uncapped {
            return Err(Refusal::Peer);
        }
        *n += 1;
        c.total += 1;
        Ok(Admitted {
            limits: self.0.clone(),
            peer,
        })
    }

    /// Connections admitted and not yet dropped (all peers).
    pub fn open(&self) -> usize {
        self.0.lock().total
    }

    /// Connections admitted from `peer` and not yet dropped.
    pub fn open_from(&self, peer: &Peer) -> usize {
        self.0.lock().by_peer.get(peer).copied().unwrap_or(0)
    }

    /// Peers with a connection admitted (the map never grows with peers gone).
    pub fn peers(&self) -> usize {
        self.0.lock().by_peer.len()
    }
}

/// Lets an event be logged at most once per period, counting what it kept quiet (a
/// flood of refused connections must not flood the log too).
pub struct Throttle {
    period: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    pub fn new(period: Duration) -> Throttle {
        Throttle {
            period,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(number suppressed since the last one)` when this event may be logged.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|l| now.duration_since(l) < self.period)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex4(ip: [u8; 4]) -> String {
        format!("{:08X}", u32::from_ne_bytes(ip))
    }

    fn hex6(ip: Ipv6Addr) -> String {
        let o = ip.octets();
        (0..4)
            .map(|i| {
                let w = [o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]];
                format!("{:08X}", u32::from_ne_bytes(w))
            })
            .collect()
    }

    #[test]
    fn parses_proc_net_tcp() {
        let text = format!(
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
             \x20  0: {}:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 100 1 0 100 0 0 10 0\n\
             \x20  1: {}:D431 {}:1F90 01 00000000:00000000 00:00000000 00000000  1003        0 101 1 0 20 4 30 10 -1\n\
             \x20  2: {}:D432 {}:1F90 06 00000000:00000000 03:00000F9E 00000000     0        0 0 3 0\n\
             \x20  3: {}:1F90 {}:D431 01 00000000:00000000 00:00000000 00000000     0        0 102 1 0 20 4 30 10 -1\n\
             garbage line\n",
            hex4([127, 0, 0, 1]),
            hex4([127, 0, 0, 1]),
            hex4([127, 0, 0, 1]),
            hex4([10, 1, 2, 3]),
            hex4([127, 0, 0, 1]),
            hex4([127, 0, 0, 1]),
            hex4([127, 0, 0, 1]),
        );
        let e = parse_proc_net_tcp(&text);
        assert_eq!(e.len(), 4);
        assert_eq!(e[0].local, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(e[0].state, 0x0A);
        assert_eq!(e[1].remote, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(e[1].uid, 1003);
        assert_eq!(e[2].local, "10.1.2.3:54322".parse().unwrap());
        let ours: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let client: SocketAddr = "127.0.0.1:54321".parse().unwrap();
        assert_eq!(owner_uid(&e, client, ours), Some(1003));
        // The daemon's own accepted socket (local = ours) is root's and not the client's.
        assert_eq!(owner_uid(&e, ours, client), Some(0));
        assert_eq!(owner_uid(&e, "0.0.0.0:0".parse().unwrap(), ours), None);
        // A closed (TIME_WAIT) socket belongs to no one.
        assert_eq!(owner_uid(&e, "10.1.2.3:54322".parse().unwrap(), ours), None);
    }

    #[test]
    fn parses_proc_net_tcp6_and_mapped_addresses() {
        let ours6: Ipv6Addr = "fd00::5".parse().unwrap();
        let peer6: Ipv6Addr = "fd00::7".parse().unwrap();
        let mapped: Ipv6Addr = Ipv4Addr::new(127, 0, 0, 1).to_ipv6_mapped();
        let text = format!(
            "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
             \x20  0: {}:C000 {}:20FB 01 00000000:00000000 00:00000000 00000000  1004        0 7 1\n\
             \x20  1: {}:C001 {}:20FB 01 00000000:00000000 00:00000000 00000000  1005        0 8 1\n",
            hex6(peer6),
            hex6(ours6),
            hex6(mapped),
            hex6(mapped),
        );
        let e = parse_proc_net_tcp(&text);
        assert_eq!(e.len(), 2);
        assert_eq!(
            owner_uid(
                &e,
                SocketAddr::new(peer6.into(), 0xC000),
                SocketAddr::new(ours6.into(), 8443)
            ),
            Some(1004)
        );
        // An IPv4-mapped address matches its IPv4 form, either way round.
        assert_eq!(
            owner_uid(
                &e,
                "127.0.0.1:49153".parse().unwrap(),
                SocketAddr::new(mapped.into(), 8443)
            ),
            Some(1005)
        );
        assert_eq!(parse_hex_addr("0100007F"), None);
        assert_eq!(parse_hex_addr("0100007:0050"), None);
        assert_eq!(parse_hex_addr("ZZ00007F:0050"), None);
    }

    #[test]
    fn garbage_rows_give_no_answer() {
        for t in [
            "",
            "header only\n",
            "header\n 0: zz:zz 0100007F:20FB 01 a b c x\n",
            "header\n 0: 0100007F 0100007F:20FB\n",
            "header\n 0: 0100007F:C350 0100007F:20FB 01 a b c notanumber\n",
        ] {
            assert_eq!(parse_proc_net_tcp(t), Vec::new(), "{t:?}");
        }
    }

    #[test]
    fn finds_its_own_socket_in_proc() {
        // A real connection of this process: its client end carries our uid.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, peer) = l.accept().unwrap();
        let mut lookup = PeerLookup::new();
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        assert_eq!(peer, c.local_addr().unwrap());
        assert_eq!(
            lookup.peer_of(peer, l.local_addr().unwrap()),
            Peer::Local(Some(uid))
        );
        assert_eq!(
            lookup.peer_of("192.0.2.1:5".parse().unwrap(), l.local_addr().unwrap()),
            Peer::Remote("192.0.2.1".parse().unwrap())
        );
        // A v4-mapped loopback peer is this host; remote IPv6 peers keep their whole
        // address.
        assert!(lookup.on_this_host(
            "::ffff:127.0.0.1".parse::<IpAddr>().unwrap().to_canonical(),
            Instant::now()
        ));
        assert_eq!(
            lookup.peer_of(
                "[2001:db8::7]:5".parse().unwrap(),
                "[::1]:9".parse().unwrap()
            ),
            Peer::Remote("2001:db8::7".parse().unwrap())
        );
    }

    #[test]
    fn caps_per_peer_and_in_all() {
        let caps = PeerLimits::new(5, 2);
        let a = Peer::Local(Some(1003));
        let b = Peer::Local(Some(1004));
        let r = Peer::Remote("192.0.2.9".parse().unwrap());
        let a1 = caps.admit(a).unwrap();
        let a2 = caps.admit(a).unwrap();
        assert_eq!(caps.admit(a).err(), Some(Refusal::Peer));
        let _b1 = caps.admit(b).unwrap();
        let _r1 = caps.admit(r).unwrap();
        let _r2 = caps.admit(r).unwrap();
        assert_eq!(caps.open(), 5);
        // Every cap full: even a fresh peer waits.
        assert_eq!(caps.admit(Peer::Local(None)).err(), Some(Refusal::Total));
        drop(a1);
        assert_eq!(caps.open_from(&a), 1);
        let _a3 = caps.admit(a).unwrap();
        drop(a2);
        drop(_a3);
        assert_eq!(caps.open_from(&a), 0);
        // A peer without connections leaves no entry behind.
        assert_eq!(caps.peers(), 2);
        assert_eq!(caps.open(), 3);
    }

    #[test]
    fn local_root_counts_only_in_the_total_when_asked() {
        let root = Peer::Local(Some(0));
        let capped = PeerLimits::new(4, 1);
        let _c = capped.admit(root).unwrap();
        assert_eq!(capped.admit(root).err(), Some(Refusal::Peer));
        let servers = PeerLimits::local_root_counts_only_in_total(3, 1);
        let held: Vec<Admitted> = (0..3).map(|_| servers.admit(root).unwrap()).collect();
        assert_eq!(servers.admit(root).err(), Some(Refusal::Total));
        drop(held);
        // Root elsewhere is an address like any other.
        let remote_root = Peer::Remote("192.0.2.9".parse().unwrap());
        let _r = servers.admit(remote_root).unwrap();
        assert_eq!(servers.admit(remote_root).err(), Some(Refusal::Peer));
    }

    #[test]
    fn throttle_counts_what_it_keeps_quiet() {
        let mut t = Throttle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(t.allow(t0), Some(0));
        assert_eq!(t.allow(t0 + Duration::from_secs(1)), None);
        assert_eq!(t.allow(t0 + Duration::from_secs(2)), None);
        assert_eq!(t.allow(t0 + Duration::from_secs(11)), Some(2));
    }
}
