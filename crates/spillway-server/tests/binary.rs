//! The `spillway-server` binary: clean exit on SIGTERM/SIGINT, clear failures at start.

mod common;

use common::*;
use spillway_wire::{FragmentListReq, Role};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn server(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_spillway-server"));
    c.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > within {
            let _ = child.kill();
            panic!("server did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn free_addr() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

fn stderr_of(child: Child) -> String {
    String::from_utf8_lossy(&child.wait_with_output().unwrap().stderr).into_owned()
}

#[test]
fn stops_cleanly_on_sigterm_and_sigint() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let addr = free_addr();
        let mut child = server(&[
            "--root",
            root.to_str().unwrap(),
            "--listen",
            &addr,
            "--log-level",
            "info",
        ])
        .spawn()
        .unwrap();
        let up = eventually(Duration::from_secs(20), || {
            root.join("admin.key").exists()
                && endpoint(
                    addr.parse().unwrap(),
                    hello(Role::Admin, 0, &admin_key(&root)),
                )
                .call(&FragmentListReq {})
                .is_ok()
        });
        assert!(up, "server came up");
        // SAFETY: plain kill(2) of the child we spawned.
        assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
        let status = wait_exit(&mut child, Duration::from_secs(20));
        assert!(status.success(), "exit status {status:?}");
        assert!(stderr_of(child).contains("stopped"));
    }
}

#[test]
fn startup_failures_exit_nonzero_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut child = server(&["--root", root.to_str().unwrap(), "--listen", &addr])
        .spawn()
        .unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(20));
    assert!(!status.success());
    assert!(stderr_of(child).contains("cannot listen"));

    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let bad_root = file.join("root");
    let mut child = server(&[
        "--root",
        bad_root.to_str().unwrap(),
        "--listen",
        &free_addr(),
    ])
    .spawn()
    .unwrap();
    assert!(!wait_exit(&mut child, Duration::from_secs(20)).success());
    assert!(stderr_of(child).contains("cannot create storage root"));

    let tunables = dir.path().join("tunables");
    std::fs::write(&tunables, "no_such_knob = 1\n").unwrap();
    let mut child = server(&[
        "--root",
        root.to_str().unwrap(),
        "--listen",
        &free_addr(),
        "--tunables",
        tunables.to_str().unwrap(),
    ])
    .spawn()
    .unwrap();
    assert!(!wait_exit(&mut child, Duration::from_secs(20)).success());
    assert!(stderr_of(child).contains("unknown tunable"));
}
