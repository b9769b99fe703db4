"""The private munged of tests/harness/munged.py (the `munged` fixture): what other tests rely on
when they authenticate with MUNGE. Real munged and the real munge/unmunge commands; no
Spillway cluster. See docs/auth.md, "MUNGE"."""

import os
import tempfile
import time

import pytest

from munged import MungedError, start_munged

# unmunge's exit codes (munge_err_t)
OK, BAD_CRED, INVALID, EXPIRED, REPLAYED = 0, 8, 14, 15, 17


def test_round_trip_as_caller(munged):
    cred = munged.munge(b"job 7\0\xff")
    assert cred.startswith("MUNGE:") and cred.endswith(":")
    status, info = munged.unmunge(cred)
    assert status == OK
    assert (info["UID"], info["GID"]) == (os.geteuid(), os.getegid())
    assert info["PAYLOAD"] == b"job 7\0\xff"


def test_second_decode_is_replayed(munged):
    cred = munged.munge()
    assert munged.unmunge(cred)[0] == OK
    assert munged.unmunge(cred)[0] == REPLAYED


def test_tampered_and_garbage_refused(munged):
    cred = munged.munge(b"x")
    mid = len(cred) // 2
    tampered = cred[:mid] + ("B" if cred[mid] == "A" else "A") + cred[mid + 1 :]
    assert munged.unmunge(tampered) == (INVALID, {})
    assert munged.unmunge("not a credential")[0] == BAD_CRED
    assert munged.unmunge(cred)[0] == OK


@pytest.mark.needs_root
def test_credential_of_an_unprivileged_user(munged, user):
    # runuser by name (the user's own groups) and setpriv by raw ids (no passwd entry):
    # munged reports the socket peer's ids either way.
    status, info = munged.unmunge(munged.munge(b"hi", as_user=user.name))
    assert status == OK
    assert (info["UID"], info["GID"], info["PAYLOAD"]) == (user.uid, user.gid, b"hi")
    status, info = munged.unmunge(munged.munge(as_uid=64321, as_gid=64322))
    assert (status, info["UID"], info["GID"]) == (OK, 64321, 64322)


def test_expired(munged):
    cred = munged.munge(ttl=1)
    time.sleep(2.1)  # past encode time + ttl whatever fraction of a second it was made in
    assert munged.unmunge(cred)[0] == EXPIRED


def test_another_key_refuses_and_stop_cleans_up():
    with tempfile.TemporaryDirectory(prefix="spillway-tests-munged2-") as d:
        other = start_munged(d)
        try:
            assert oct(os.stat(d).st_mode & 0o777) == oct(0o755)
            assert oct(os.stat(other.key_file).st_mode & 0o777) == oct(0o600)
            pid = other.pid
            assert pid is not None
            cred = other.munge()
        finally:
            other.stop()
        other.stop()  # idempotent
        assert other.pid is None
        assert not os.path.exists(other.socket), "munged left its socket after SIGTERM"
        assert not os.path.exists(f"/proc/{pid}") or "munged" not in open(f"/proc/{pid}/cmdline").read()
        with pytest.raises(MungedError, match="exit 6"):
            other.munge()
        # A second daemon in the same directory gets a new key: the old credential is
        # now a stranger's.
        with start_munged(d) as again:
            assert again.unmunge(cred) == (INVALID, {})
            assert again.unmunge(again.munge())[0] == OK


def test_start_refuses_live_socket_and_reports_munged_log(munged):
    with pytest.raises(MungedError, match="already answers"):
        start_munged(munged.dir)
    assert munged.unmunge(munged.munge())[0] == OK  # undisturbed
    # A socket path longer than sun_path (108 bytes): munged itself refuses, and the error
    # carries its log.
    with tempfile.TemporaryDirectory(prefix="spillway-tests-munged3-") as d:
        with pytest.raises(MungedError, match="maximum length"):
            start_munged(os.path.join(d, "x" * 110))
