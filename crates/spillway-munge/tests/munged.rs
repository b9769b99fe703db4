//! spillway-munge against real munged daemons (PrivateMunged): no mocks.
//!
//! Needs Debian's `munge` package (munged, munge) and libmunge; scripts/setup.sh
//! installs them. The test of an unprivileged caller needs root (setpriv).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use spillway_munge::testing::PrivateMunged;
use spillway_munge::{Munge, MungeError, MAX_CRED_LEN};

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("spillway-munge-test-")
        .tempdir()
        .expect("create a temporary directory")
}

fn start(dir: &Path) -> PrivateMunged {
    match PrivateMunged::start(dir) {
        Ok(m) => m,
        Err(e) => panic!("cannot start a private munged: {e}"),
    }
}

/// `munge -n --socket S ARGS...` run through `prefix` (e.g. setpriv), its credential.
fn munge_cli(prefix: &[&str], socket: &Path, args: &[&str]) -> String {
    let (program, rest) = match prefix.split_first() {
        Some((p, rest)) => (*p, rest.to_vec()),
        None => ("munge", Vec::new()),
    };
    let mut cmd = Command::new(program);
    cmd.args(&rest);
    if !prefix.is_empty() {
        cmd.arg("munge");
    }
    let out = cmd
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run munge");
    assert!(
        out.status.success(),
        "munge {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("munge prints ASCII")
        .trim_end()
        .to_string()
}

fn euid_egid() -> (u32, u32) {
    // SAFETY: geteuid/getegid cannot fail and touch no memory.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

#[test]
fn round_trip_gives_our_ids_and_payload() {
    let dir = tempdir();
    let d = start(dir.path());
    let m = d.munge();
    let (uid, gid) = euid_egid();

    let payload = b"job 42\0binary \xff payload";
    let cred = m.encode(payload).expect("encode");
    assert!(
        cred.starts_with("MUNGE:") && cred.ends_with(':'),
        "not munge's armor: {cred}"
    );
    let c = m.decode(&cred).expect("decode");
    assert_eq!((c.uid, c.gid), (uid, gid));
    assert_eq!(c.payload, payload);

    // No payload: what `munge -n` makes.
    let c = m.decode(&m.encode(b"").expect("encode")).expect("decode");
    assert_eq!((c.uid, c.gid, c.payload.len()), (uid, gid, 0));

    // The largest payload encode takes still decodes.
    let big = vec![0x5a; spillway_munge::MAX_PAYLOAD_LEN];
    let cred = m.encode(&big).expect("encode the largest payload");
    assert!(cred.len() <= MAX_CRED_LEN);
    assert_eq!(m.decode(&cred).expect("decode").payload, big);
}

#[test]
fn credential_from_the_munge_cli_decodes() {
    let dir = tempdir();
    let d = start(dir.path());
    let cred = munge_cli(&[], d.socket(), &["-s", "from the cli"]);
    let c = d.munge().decode(&cred).expect("decode munge's credential");
    assert_eq!(c.payload, b"from the cli");
    assert_eq!((c.uid, c.gid), euid_egid());
    // The same credential with the newline `munge` prints, as a careless caller passes it.
    let cred = munge_cli(&[], d.socket(), &["-n"]);
    d.munge()
        .decode(&format!("{cred}\n"))
        .expect("trailing newline");
}

#[test]
fn second_decode_is_replayed() {
    let dir = tempdir();
    let d = start(dir.path());
    let m = d.munge();
    let cred = m.encode(b"once").expect("encode");
    m.decode(&cred).expect("first decode");
    let e = m.decode(&cred).expect_err("second decode must be refused");
    assert_eq!(e, MungeError::Replayed);
    assert_eq!(e.code(), 17);
    assert_eq!(e.to_string(), "Replayed credential");
    // Through another Munge value (another context) too: munged keeps the replay cache.
    assert_eq!(
        Munge::new(Some(d.socket().to_path_buf())).decode(&cred),
        Err(MungeError::Replayed)
    );
}

#[test]
fn tampered_credential_is_invalid() {
    let dir = tempdir();
    let d = start(dir.path());
    let m = d.munge();
    let cred = m.encode(b"payload").expect("encode");
    let mut bytes = cred.clone().into_bytes();
    let mid = bytes.len() / 2;
    // Another base64 character, so that the armor still parses and the MAC is what fails.
    bytes[mid] = if bytes[mid] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(bytes).expect("ASCII");
    assert_ne!(tampered, cred);
    let e = m
        .decode(&tampered)
        .expect_err("tampered credential accepted");
    assert_eq!(e, MungeError::Invalid);
    assert_eq!(e.code(), 14);
    // The untouched one is still good (the tampered decode did not consume it).
    m.decode(&cred).expect("original still valid");
}

#[test]
fn garbage_is_refused() {
    let dir = tempdir();
    let d = start(dir.path());
    let m = d.munge();
    let good = m.encode(b"").expect("encode");
    let truncated = &good[..good.len() / 2];
    let cases: Vec<&[u8]> = vec![
        b"",
        b"hello",
        b"MUNGE:",
        b"MUNGE::",
        b"MUNGE:!!!!:",
        b"MUNGE:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA:",
        truncated.as_bytes(),
        b"MUNGE:abc\0def:",
        b"\0",
        b"MUNGE:\xff\xfe\xfd:",
        b"\xc3\x28",
    ];
    for c in cases {
        match m.decode_bytes(c) {
            Ok(cred) => panic!("{c:?} accepted as {cred:?}"),
            Err(MungeError::BadCred) => {}
            // Armor around bytes that do not start with a valid version number: munged
            // says so (EMUNGE_BAD_VERSION), still a refusal.
            Err(e @ MungeError::Other { code: 9, .. }) => assert!(e.is_refusal()),
            Err(e) => panic!("{c:?}: expected a malformed-credential refusal, got {e:?} ({e})"),
        }
    }
    let huge = format!("MUNGE:{}:", "A".repeat(MAX_CRED_LEN));
    assert_eq!(m.decode(&huge), Err(MungeError::BadCred));
    let with_nul = format!("{}\0{}", &good[..10], &good[10..]);
    assert_eq!(m.decode(&with_nul), Err(MungeError::BadCred));
    // After all that, munged still works.
    m.decode(&good).expect("munged still answers");
}

#[test]
fn credential_of_another_key_is_invalid() {
    let (dir_a, dir_b) = (tempdir(), tempdir());
    let (a, b) = (start(dir_a.path()), start(dir_b.path()));
    let cred = a.munge().encode(b"for a").expect("encode with a");
    assert_eq!(b.munge().decode(&cred), Err(MungeError::Invalid));
    // Refused by b, so never seen by a: a still accepts it once.
    assert_eq!(
        a.munge().decode(&cred).expect("a decodes").payload,
        b"for a"
    );
}

#[test]
fn munged_not_running_is_a_socket_error() {
    let dir = tempdir();
    let missing = Munge::new(Some(dir.path().join("no-such.socket")));
    for r in [
        missing.encode(b"").map(drop),
        missing.decode("MUNGE:x:").map(drop),
    ] {
        match r {
            Err(e @ MungeError::Socket { .. }) => {
                assert_eq!(e.code(), 6);
                assert!(
                    e.to_string().starts_with("Socket communication error"),
                    "{e}"
                );
                assert!(e.to_string().contains("no-such.socket"), "{e}");
            }
            other => panic!("expected a Socket error, got {other:?}"),
        }
    }

    // A daemon that was running and stopped: same answer.
    let mut d = start(dir.path());
    let m = d.munge();
    let cred = m.encode(b"").expect("encode");
    d.stop();
    assert!(matches!(m.decode(&cred), Err(MungeError::Socket { .. })));
    assert!(matches!(m.encode(b""), Err(MungeError::Socket { .. })));
}

#[test]
fn killed_munged_leaves_a_socket_that_refuses() {
    // SIGKILL leaves the socket file behind: libmunge then retries for a while (about
    // 2 s) before it gives up, still with a Socket error.
    let dir = tempdir();
    let d = start(dir.path());
    let pid = libc::pid_t::try_from(d.pid().expect("running")).expect("pid fits");
    // SAFETY: kill(2) of our own child, still unreaped (PrivateMunged reaps it on drop).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        d.socket().exists(),
        "munged removed its socket despite SIGKILL"
    );
    assert!(matches!(
        d.munge().encode(b""),
        Err(MungeError::Socket { .. })
    ));
}

#[test]
fn expired_credential_is_refused() {
    let dir = tempdir();
    let d = start(dir.path());
    // TTL 1 s: munged refuses it once its clock is past encode time + 1 s, which 2 s of
    // sleep guarantees whatever the fraction of the second it was made in.
    let cred = munge_cli(&[], d.socket(), &["-n", "-t", "1"]);
    std::thread::sleep(Duration::from_millis(2100));
    let e = d
        .munge()
        .decode(&cred)
        .expect_err("expired credential accepted");
    assert_eq!(e, MungeError::Expired);
    assert_eq!(e.code(), 15);
}

#[test]
fn credential_of_an_unprivileged_user_carries_its_uid() {
    if euid_egid().0 != 0 {
        eprintln!("skipped: needs root to run munge as another uid");
        return;
    }
    let dir = tempdir();
    let d = start(dir.path());
    // A uid/gid that need not exist in /etc/passwd: munged takes the ids from the
    // socket peer (SO_PEERCRED), so any uid works, and no test user has to be created
    // (or removed, or shared with the pytest suite's spwtest).
    let (uid, gid) = (64_321u32, 64_322u32);
    let reuid = format!("--reuid={uid}");
    let regid = format!("--regid={gid}");
    let prefix = ["setpriv", &reuid, &regid, "--clear-groups"];
    let cred = munge_cli(&prefix, d.socket(), &["-s", "from a user"]);
    let c = d.munge().decode(&cred).expect("decode");
    assert_eq!((c.uid, c.gid), (uid, gid));
    assert_eq!(c.payload, b"from a user");
}

#[test]
fn concurrent_calls_from_many_threads() {
    let dir = tempdir();
    let d = start(dir.path());
    let m = d.munge();
    let (uid, gid) = euid_egid();
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let m = m.clone();
            s.spawn(move || {
                for i in 0..50u8 {
                    let payload = [t, i];
                    let cred = m.encode(&payload).expect("encode");
                    let c = m.decode(&cred).expect("decode");
                    assert_eq!(
                        (c.uid, c.gid, c.payload.as_slice()),
                        (uid, gid, &payload[..])
                    );
                    assert_eq!(m.decode(&cred), Err(MungeError::Replayed));
                }
            });
        }
    });
}

#[test]
fn default_socket_is_libmunges() {
    // Munge::new(None) must reach the system munged if one runs; without one it must
    // fail as a Socket error, not otherwise.
    let m = Munge::new(None);
    assert_eq!(m.socket(), None);
    match m.encode(b"") {
        Ok(cred) => {
            let c = m
                .decode(&cred)
                .expect("system munged decodes its own credential");
            assert_eq!((c.uid, c.gid), euid_egid());
        }
        Err(MungeError::Socket { detail }) => {
            eprintln!("no system munged ({detail}): checked the error only");
        }
        Err(e) => panic!("unexpected error from the default socket: {e:?}"),
    }
}

#[test]
fn stop_is_idempotent_and_drop_stops() {
    let dir = tempdir();
    let pid;
    {
        let mut d = start(dir.path());
        pid = libc::pid_t::try_from(d.pid().expect("running")).expect("pid fits");
        d.stop();
        d.stop();
        assert_eq!(d.pid(), None);
    }
    // Reaped: the pid is gone (or, rarely, reused by an unrelated process, which is not
    // our munged: checked through its command line).
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains("munged"),
        "munged {pid} still running"
    );
    let socket = dir.path().join("munge.socket");
    {
        let d = start(dir.path());
        assert_eq!(d.socket(), socket);
    }
    assert!(
        !socket.exists(),
        "munged left its socket after a clean stop"
    );
}

#[test]
fn start_refuses_a_live_socket_and_reports_munged_log() {
    let dir = tempdir();
    let d = start(dir.path());
    let e = PrivateMunged::start(dir.path()).expect_err("second munged on a live socket");
    assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
    // The first one was not disturbed.
    let m = d.munge();
    m.decode(&m.encode(b"").expect("encode")).expect("decode");

    // A socket path longer than sun_path (108 bytes): munged itself refuses, and the
    // error carries its log.
    let long = dir.path().join("x".repeat(110));
    let e = PrivateMunged::start(&long).expect_err("munged with too long a socket path");
    assert!(e.to_string().contains("maximum length"), "{e}");
}
