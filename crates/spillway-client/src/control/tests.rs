use super::*;
use proptest::prelude::*;
use std::sync::Mutex;

fn msg(fields: &[&str]) -> Vec<u8> {
    let refs: Vec<&[u8]> = fields.iter().map(|f| f.as_bytes()).collect();
    let mut m = join_fields(&refs).unwrap();
    m.resize(IOC_LEN, 0);
    m
}

#[test]
fn the_ioctl_number_is_linuxs() {
    // _IOWR('S', 0x57, 16380) as gcc computes it for libdatawarp.
    assert_eq!(SPILLWAY_IOC_CALL, 0xfffc_5357);
    assert_eq!(IOC_LEN, 16380);
}

#[test]
fn decodes_every_operation() {
    assert_eq!(
        decode_request(&msg(&[
            "stage",
            "in",
            "file",
            "immediate",
            "/pfs/a",
            "//x//y/"
        ])),
        Ok(Request::Stage {
            direction: Direction::In,
            kind: StageKind::File,
            when: When::Immediate,
            pairs: vec![("/pfs/a".into(), "/x/y".into())],
        })
    );
    assert_eq!(
        decode_request(&msg(&[
            "stage", "out", "list", "job_end", "/a", "/pfs/a", "/b", "/pfs/b"
        ])),
        Ok(Request::Stage {
            direction: Direction::Out,
            kind: StageKind::List,
            when: When::JobEnd,
            pairs: vec![
                ("/a".into(), "/pfs/a".into()),
                ("/b".into(), "/pfs/b".into())
            ],
        })
    );
    assert_eq!(
        decode_request(&msg(&["counts", "tree", "/"])),
        Ok(Request::Counts {
            scope: Scope::Tree,
            path: "/".into()
        })
    );
    assert_eq!(
        decode_request(&msg(&["wait", "file", "/f", "10000"])),
        Ok(Request::Wait {
            scope: Scope::File,
            path: "/f".into(),
            timeout_ms: 10000
        })
    );
    assert_eq!(
        decode_request(&msg(&["action", "revoke", "tree", "/d"])),
        Ok(Request::Action {
            action: Action::Revoke,
            scope: Scope::Tree,
            path: "/d".into()
        })
    );
    assert_eq!(
        decode_request(&msg(&["concurrency", "4"])),
        Ok(Request::Concurrency { value: 4 })
    );
    assert_eq!(
        decode_request(&msg(&["failures", ""])),
        Ok(Request::Failures {
            after: String::new()
        })
    );
    assert_eq!(
        decode_request(&msg(&["accounting"])),
        Ok(Request::Accounting)
    );
}

#[test]
fn refuses_malformed_messages() {
    let bad: &[&[&str]] = &[
        &["nope"],
        &["stage", "in", "file", "immediate", "/pfs/a"],
        &["stage", "in", "file", "job_end", "/pfs/a", "/x"], // job_end only for out
        &["stage", "in", "file", "immediate", "/pfs/a", "x"], // relative instance path
        &["stage", "in", "file", "immediate", "/pfs/a", "/x/../y"],
        &["stage", "in", "file", "immediate", "", "/x"],
        &["stage", "in", "file", "immediate", "/a", "/x", "/b", "/y"],
        &["stage", "out", "list", "immediate", "/a", "/pfs/a", "/b"],
        &["stage", "sideways", "file", "immediate", "/a", "/b"],
        &["counts", "file"],
        &["counts", "branch", "/x"],
        &["wait", "file", "/f", "10001"],
        &["wait", "file", "/f", "+5"],
        &["wait", "file", "/f", "-1"],
        &["wait", "file", "/f", ""],
        &["wait", "file", "/f", "99999999999"],
        &["action", "explode", "file", "/x"],
        &["concurrency", "4294967296"],
        &["concurrency"],
        &["failures", "relative"],
        &["accounting", "extra"],
    ];
    for f in bad {
        assert_eq!(
            decode_request(&msg(f)),
            Err(Errno(libc::EINVAL)),
            "{f:?} should be refused"
        );
    }
    // Framing: too short, len 0, len past the buffer, no final NUL, non-UTF-8 paths.
    assert!(decode_request(&[1, 0]).is_err());
    let mut m = msg(&["accounting"]);
    m[..4].copy_from_slice(&0u32.to_ne_bytes());
    assert_eq!(decode_request(&m), Err(Errno(libc::EINVAL)));
    m[..4].copy_from_slice(&(IOC_BUF_LEN as u32 + 1).to_ne_bytes());
    assert_eq!(decode_request(&m), Err(Errno(libc::EINVAL)));
    let mut m = msg(&["accounting"]);
    m[..4].copy_from_slice(&10u32.to_ne_bytes()); // "accounting" without its NUL
    assert_eq!(decode_request(&m), Err(Errno(libc::EINVAL)));
    let m = join_fields(&[b"counts", b"file", b"/\xff"]).unwrap();
    assert_eq!(decode_request(&m), Err(Errno(libc::EINVAL)));
    // A path longer than MAX_PATH.
    let long = format!("/{}", "a".repeat(MAX_PATH));
    assert_eq!(
        decode_request(&msg(&["counts", "file", &long])),
        Err(Errno(libc::ENAMETOOLONG))
    );
    // Longer than the buffer cannot even be built.
    let huge = "/".repeat(IOC_BUF_LEN);
    assert_eq!(
        join_fields(&[b"counts", b"file", huge.as_bytes()]),
        Err(Errno(libc::E2BIG))
    );
}

#[test]
fn answers_round_trip_and_always_fit() {
    let a = Answer::ok(vec![b"1".to_vec(), b"/x".to_vec(), b"-2".to_vec()]);
    let m = a.encode();
    assert!(m.len() <= IOC_LEN);
    assert_eq!(Answer::decode(&m), Ok(a));
    let e = Answer::err(Errno(libc::EACCES), "no");
    assert_eq!(
        Answer::decode(&e.encode()),
        Ok(Answer {
            result: -13,
            fields: vec![b"no".to_vec()]
        })
    );
    // A long error message is cut; a long result becomes E2BIG; NULs never leak.
    let e = Answer::err(Errno(libc::EIO), "x".repeat(3 * IOC_BUF_LEN));
    let d = Answer::decode(&e.encode()).unwrap();
    assert_eq!(d.result, -5);
    assert_eq!(d.fields.len(), 1);
    let big = Answer::ok(vec![vec![b'y'; IOC_BUF_LEN]]);
    assert_eq!(Answer::decode(&big.encode()).unwrap().result, -libc::E2BIG);
    let nul = Answer::err(Errno(libc::EIO), "a\0b");
    assert_eq!(
        Answer::decode(&nul.encode()).unwrap().fields,
        vec![b"a?b".to_vec()]
    );
}

#[test]
fn instance_paths_are_normalized() {
    assert_eq!(instance_path(b"/").unwrap(), "/");
    assert_eq!(instance_path(b"///").unwrap(), "/");
    assert_eq!(instance_path(b"/a//b/").unwrap(), "/a/b");
    assert!(instance_path(b"/a/./b").is_err());
    assert!(instance_path(b"a").is_err());
    assert!(instance_path(b"").is_err());
    assert_eq!(query_escape("/a b&c=d%"), "/a%20b%26c%3Dd%25");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Any bytes at all: decoding answers or refuses, never panics.
    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..IOC_LEN + 16)) {
        let _ = decode_request(&bytes);
        let _ = Answer::decode(&bytes);
    }

    /// Arbitrary fields under a valid frame: decoding never panics, and whatever
    /// decodes encodes back to a message that decodes to the same request.
    #[test]
    fn decoded_requests_round_trip(
        fields in proptest::collection::vec(
            prop_oneof![
                Just(b"stage".to_vec()), Just(b"counts".to_vec()), Just(b"wait".to_vec()),
                Just(b"action".to_vec()), Just(b"failures".to_vec()), Just(b"in".to_vec()),
                Just(b"out".to_vec()), Just(b"file".to_vec()), Just(b"tree".to_vec()),
                Just(b"list".to_vec()), Just(b"immediate".to_vec()), Just(b"job_end".to_vec()),
                Just(b"terminate".to_vec()), Just(b"100".to_vec()), Just(b"/a/b".to_vec()),
                Just(b"".to_vec()), Just(b"concurrency".to_vec()), Just(b"accounting".to_vec()),
                proptest::collection::vec(1u8..=255, 0..40),
            ],
            0..10),
        len_delta in -3i64..3,
    ) {
        let refs: Vec<&[u8]> = fields.iter().map(Vec::as_slice).collect();
        if let Ok(mut m) = join_fields(&refs) {
            m.resize(IOC_LEN, 0);
            if let Ok(r) = decode_request(&m) {
                let again = encode_request(&r).unwrap();
                prop_assert_eq!(decode_request(&again), Ok(r));
            }
            // A wrong length never panics either.
            let len = u32::from_ne_bytes([m[0], m[1], m[2], m[3]]) as i64 + len_delta;
            m[..4].copy_from_slice(&(len.max(0) as u32).to_ne_bytes());
            let _ = decode_request(&m);
        }
    }

    /// Answers: whatever goes in, the message fits the buffer and decodes.
    #[test]
    fn answers_always_decode(
        result in -200i32..=0,
        fields in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..3000), 0..12),
    ) {
        let m = Answer { result, fields }.encode();
        prop_assert!(m.len() <= IOC_LEN);
        prop_assert!(Answer::decode(&m).is_ok());
    }
}

// ---------------------------------------------------------------------- with a fake manager

type Script = Box<dyn Fn(&str, &str, &Value) -> Result<Value, ApiError> + Send + Sync>;

/// Records the calls (and the uid each acts as) and answers from a script.
struct Fake {
    calls: Mutex<Vec<(String, String, Value)>>,
    uids: Mutex<Vec<u32>>,
    answer: Script,
}

impl Rest for Arc<Fake> {
    fn get(&self, uid: u32, path: &str) -> Result<Value, ApiError> {
        self.uids.lock().unwrap().push(uid);
        self.calls
            .lock()
            .unwrap()
            .push(("GET".into(), path.into(), Value::Null));
        (self.answer)("GET", path, &Value::Null)
    }
    fn send(&self, uid: u32, method: &str, path: &str, body: &Value) -> Result<Value, ApiError> {
        self.uids.lock().unwrap().push(uid);
        self.calls
            .lock()
            .unwrap()
            .push((method.into(), path.into(), body.clone()));
        (self.answer)(method, path, body)
    }
}

fn instance() -> Arc<Instance> {
    let desc = spillway_types::InstanceDescriptor {
        instance: 7,
        servers: vec!["127.0.0.1:1".into()],
        capacity: 1 << 30,
        stripe_size: 1 << 20,
        credential: "00".into(),
    };
    Arc::new(Instance::new(
        desc,
        &spillway_types::Tunables::default(),
        "test",
    ))
}

fn control(
    answer: impl Fn(&str, &str, &Value) -> Result<Value, ApiError> + Send + Sync + 'static,
) -> (Control, Arc<Fake>) {
    let fake = Arc::new(Fake {
        calls: Mutex::new(Vec::new()),
        uids: Mutex::new(Vec::new()),
        answer: Box::new(answer),
    });
    (Control::new(instance(), Some(Box::new(fake.clone()))), fake)
}

fn status(status: u16) -> ApiError {
    ApiError::Status {
        status,
        message: format!("HTTP {status}"),
        choices: None,
    }
}

const ROOT: InodeNo = spillway_types::ROOT_INODE;

#[test]
fn stage_names_the_kernels_uid_as_owner() {
    let (c, fake) = control(|_, _, _| Ok(json!({"id": 42})));
    let req = decode_request(&msg(&["stage", "in", "file", "immediate", "/pfs/a", "/x"])).unwrap();
    let a = c.handle(1000, ROOT, &req);
    assert_eq!(a, Answer::ok(vec![b"42".to_vec()]));
    let calls = fake.calls.lock().unwrap();
    let (m, p, body) = &calls[0];
    assert_eq!((m.as_str(), p.as_str()), ("POST", "/dw/v1/stages"));
    assert_eq!(body["owner"], 1000);
    assert_eq!(body["instance"], 7);
    assert_eq!(body["source"], "/pfs/a");
    assert_eq!(body["destination"], "/x");
    assert_eq!(body["type"], "file");
    assert_eq!(body["pairs"], json!([]));
}

#[test]
fn lists_go_as_pairs() {
    let (c, fake) = control(|_, _, _| Ok(json!({"id": 1})));
    let req = decode_request(&msg(&[
        "stage", "out", "list", "job_end", "/a", "/pfs/a", "/b", "/pfs/b",
    ]))
    .unwrap();
    c.handle(5, ROOT, &req);
    let body = &fake.calls.lock().unwrap()[0].2;
    assert_eq!(body["source"], "");
    assert_eq!(body["when"], "job_end");
    assert_eq!(
        body["pairs"],
        json!([{"source": "/a", "destination": "/pfs/a"}, {"source": "/b", "destination": "/pfs/b"}])
    );
}

#[test]
fn http_errors_map_to_errnos() {
    for (code, errno) in [
        (400, libc::EINVAL),
        (401, libc::EACCES),
        (403, libc::EACCES),
        (404, libc::ENOENT),
        (409, libc::EBUSY),
        (500, libc::EIO),
        (502, libc::EIO),
    ] {
        let (c, _) = control(move |_, _, _| Err(status(code)));
        let a = c.handle(1, ROOT, &Request::Concurrency { value: 3 });
        assert_eq!(a.result, -errno, "HTTP {code}");
    }
    let (c, _) = control(|_, _, _| {
        Err(ApiError::Unreachable {
            url: "https://x".into(),
            detail: "refused".into(),
        })
    });
    assert_eq!(
        c.handle(1, ROOT, &Request::Concurrency { value: 3 }).result,
        -libc::EHOSTUNREACH
    );
    // A mount without a manager.
    let c = Control::new(instance(), None);
    assert_eq!(
        c.handle(1, ROOT, &Request::Concurrency { value: 3 }).result,
        -libc::ENOTSUP
    );
}

#[test]
fn counts_and_wait() {
    let (c, fake) = control(|_, p, _| {
        Ok(if p.contains("/x") {
            json!({"complete": 1, "pending": 0, "deferred": 0, "failed": 0, "started": true})
        } else if p.contains("/busy") {
            json!({"complete": 0, "pending": 3, "deferred": 0, "failed": 0, "started": true})
        } else {
            json!({"complete": 0, "pending": 0, "deferred": 0, "failed": 0, "started": false})
        })
    });
    let a = c.handle(
        1,
        ROOT,
        &Request::Counts {
            scope: Scope::File,
            path: "/x y".into(),
        },
    );
    assert_eq!(
        a.fields,
        vec![
            b"1".to_vec(),
            b"0".to_vec(),
            b"0".to_vec(),
            b"0".to_vec(),
            b"1".to_vec()
        ]
    );
    assert_eq!(
        fake.calls.lock().unwrap()[0].1,
        "/dw/v1/instances/7/stage_counts?path=/x%20y&scope=file"
    );
    let w = |path: &str, ms| {
        c.handle(
            1,
            ROOT,
            &Request::Wait {
                scope: Scope::Tree,
                path: path.into(),
                timeout_ms: ms,
            },
        )
    };
    assert_eq!(w("/x", 10000), Answer::ok(vec![b"0".to_vec()]));
    assert!(fake.calls.lock().unwrap()[1]
        .1
        .ends_with("&scope=tree&wait=10"));
    assert_eq!(w("/busy", 1).result, -libc::EAGAIN);
    assert!(fake.calls.lock().unwrap()[2].1.ends_with("&wait=1"));
    assert_eq!(w("/never", 0).result, -libc::EINVAL);
}

/// Every request acts as the caller (the manager then authorises it as that user's own
/// call); actions go through stage_actions for everyone.
#[test]
fn every_call_acts_as_the_caller() {
    let (c, fake) = control(|m, p, _| match (m, p) {
        ("POST", p) if p.ends_with("/stage_actions") => Ok(json!({"stages": [1, 2]})),
        ("POST", _) => Ok(json!({"id": 9})),
        ("PUT", _) => Ok(json!({"stage_concurrency": 2})),
        ("GET", p) if p.contains("stage_failures") => Ok(json!({"failures": [], "more": false})),
        _ => Ok(json!({"complete": 1, "pending": 0, "deferred": 0, "failed": 0, "started": true})),
    });
    let act = |uid, action, scope, path: &str| {
        c.handle(
            uid,
            ROOT,
            &Request::Action {
                action,
                scope,
                path: path.into(),
            },
        )
    };
    assert_eq!(
        act(0, Action::Terminate, Scope::File, "/d/f"),
        Answer::ok(vec![b"2".to_vec()])
    );
    assert_eq!(
        act(1000, Action::Revoke, Scope::Tree, "/d"),
        Answer::ok(vec![b"2".to_vec()])
    );
    let stage = decode_request(&msg(&["stage", "in", "file", "immediate", "/pfs/a", "/x"]));
    assert_eq!(c.handle(1001, ROOT, &stage.unwrap()).result, 0);
    assert_eq!(
        c.handle(1002, ROOT, &Request::Concurrency { value: 2 })
            .result,
        0
    );
    let counts = Request::Counts {
        scope: Scope::File,
        path: "/x".into(),
    };
    assert_eq!(c.handle(1003, ROOT, &counts).result, 0);
    let failures = Request::Failures {
        after: String::new(),
    };
    assert_eq!(c.handle(1004, ROOT, &failures).result, 0);
    assert_eq!(
        *fake.uids.lock().unwrap(),
        vec![0, 1000, 1001, 1002, 1003, 1004]
    );
    let calls = fake.calls.lock().unwrap();
    assert_eq!(calls[0].1, "/dw/v1/instances/7/stage_actions");
    assert_eq!(
        calls[1].2,
        json!({"action": "revoke", "path": "/d", "scope": "tree"})
    );
    assert_eq!(calls[2].2["owner"], 1001);
}

/// What the manager refuses the caller comes back as the API's errno: 403 (an
/// instance the caller may see but not change) EACCES, 404 (one they may not see, or
/// no stage there) ENOENT.
#[test]
fn refusals_as_the_caller_keep_the_apis_errno() {
    for (code, errno) in [(403, libc::EACCES), (404, libc::ENOENT)] {
        let (c, _) = control(move |_, _, _| Err(status(code)));
        for req in [
            Request::Concurrency { value: 1 },
            Request::Counts {
                scope: Scope::Tree,
                path: "/".into(),
            },
            Request::Action {
                action: Action::Terminate,
                scope: Scope::Tree,
                path: "/".into(),
            },
            Request::Failures {
                after: String::new(),
            },
        ] {
            assert_eq!(c.handle(1000, ROOT, &req).result, -errno, "{code} {req:?}");
        }
    }
}

#[test]
fn failures_page_and_cursor() {
    let (c, fake) = control(|_, _, _| {
        Ok(json!({"failures": [
            {"path": "/a", "errno": 2, "message": "m", "stage": 1},
            {"path": "/b", "errno": 13, "message": "m", "stage": 1},
        ], "more": false}))
    });
    let a = c.handle(
        1,
        ROOT,
        &Request::Failures {
            after: "/0 0".into(),
        },
    );
    assert_eq!(
        a.fields,
        vec![
            b"0".to_vec(),
            b"/a".to_vec(),
            b"-2".to_vec(),
            b"/b".to_vec(),
            b"-13".to_vec()
        ]
    );
    assert!(fake.calls.lock().unwrap()[0]
        .1
        .contains("stage_failures?after=/0%200&limit="));
    // A page too long for one message is cut, and says there is more.
    let long = format!("/{}", "p".repeat(4000));
    let (c, _) = control(move |_, _, _| {
        let f: Vec<Value> = (0..10)
            .map(|i| json!({"path": format!("{long}{i}"), "errno": 5, "message": "", "stage": 1}))
            .collect();
        Ok(json!({"failures": f, "more": false}))
    });
    let a = c.handle(
        1,
        ROOT,
        &Request::Failures {
            after: String::new(),
        },
    );
    assert_eq!(a.fields[0], b"1");
    assert_eq!(a.fields.len(), 1 + 2 * 4);
    assert!(a.encode().len() <= IOC_LEN);
}

/// A private mount (root.rs): requests carry mount paths, the manager gets instance
/// paths below the node's directory, and failures come back as mount paths, only the
/// mount's own.
#[test]
fn a_private_mount_speaks_mount_paths() {
    let dir = InodeNo((1 << 48) | 9);
    let (c, fake) = control(|m, p, _| {
        Ok(match (m, p) {
            ("POST", _) => json!({"id": 3}),
            ("GET", p) if p.contains("stage_failures") => json!({"failures": [
                {"path": "/.spillway-private/c0/a", "errno": 2, "message": "m", "stage": 1},
                {"path": "/.spillway-private/c0/d/b", "errno": 13, "message": "m", "stage": 1},
                {"path": "/.spillway-private/c0x/z", "errno": 5, "message": "m", "stage": 2},
            ], "more": true}),
            _ => json!({"complete": 1, "pending": 0, "deferred": 0, "failed": 0, "started": true}),
        })
    });
    let c = c.with_root(MountRoot::at(dir, "/.spillway-private/c0"));
    let stage_in = decode_request(&msg(&["stage", "in", "file", "immediate", "/pfs/a", "/x"]));
    assert_eq!(c.handle(1000, dir, &stage_in.unwrap()).result, 0);
    let stage_out = decode_request(&msg(&["stage", "out", "list", "job_end", "/a", "/pfs/a"]));
    assert_eq!(c.handle(1000, dir, &stage_out.unwrap()).result, 0);
    let counts = Request::Counts {
        scope: Scope::Tree,
        path: "/".into(),
    };
    assert_eq!(c.handle(1000, dir, &counts).result, 0);
    let first = c.handle(
        1000,
        dir,
        &Request::Failures {
            after: String::new(),
        },
    );
    // The third failure is another directory's: the walk ends there.
    assert_eq!(
        first.fields,
        vec![
            b"0".to_vec(),
            b"/a".to_vec(),
            b"-2".to_vec(),
            b"/d/b".to_vec(),
            b"-13".to_vec()
        ]
    );
    let next = c.handle(
        1000,
        dir,
        &Request::Failures {
            after: "/d/b".into(),
        },
    );
    assert_eq!(next.result, 0);
    let calls = fake.calls.lock().unwrap();
    assert_eq!(calls[0].2["destination"], "/.spillway-private/c0/x");
    assert_eq!(calls[0].2["source"], "/pfs/a");
    assert_eq!(
        calls[1].2["pairs"],
        json!([{"source": "/.spillway-private/c0/a", "destination": "/pfs/a"}])
    );
    assert!(calls[2]
        .1
        .contains("stage_counts?path=/.spillway-private/c0&scope=tree"));
    assert!(calls[3]
        .1
        .contains("stage_failures?after=/.spillway-private/c0/&limit="));
    assert!(calls[4]
        .1
        .contains("stage_failures?after=/.spillway-private/c0/d/b&limit="));
}
