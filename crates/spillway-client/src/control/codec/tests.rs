//! The codec against its contract: the ioctl number gcc computes for libdatawarp,
//! every operation decoded, malformed messages refused, answers that always fit, and
//! (proptest) arbitrary bytes never making it panic.

use super::*;
use crate::control::paths::MAX_PATH;
use proptest::prelude::*;

pub(crate) fn msg(fields: &[&str]) -> Vec<u8> {
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
