"""Real applications on the mount: tar + make + gcc, the sqlite3 shell, git."""

import os
import shutil
import subprocess
import tarfile
import textwrap
import time

import pytest

import spwhelpers as H

CLUSTER_OPTS = {"servers": 2, "capacity": "4G"}


def run(cmd, cwd, env=None, check=True, timeout=600, input=None):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, input=input)
    if check and r.returncode != 0:
        raise AssertionError(f"{cmd} exited {r.returncode}\nstdout: {r.stdout[-3000:]}\nstderr: {r.stderr[-3000:]}")
    return r


def need(tool):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")


# ---------------------------------------------------------------------------- make + gcc

PROJECT = {
    "Makefile": """\
        CC ?= gcc
        CFLAGS ?= -O2 -Wall -Werror
        OBJS = main.o greet.o sum.o table.o

        app: $(OBJS)
        \t$(CC) $(CFLAGS) -o $@ $(OBJS)

        %.o: %.c common.h
        \t$(CC) $(CFLAGS) -c -o $@ $<

        clean:
        \trm -f app $(OBJS)

        .PHONY: clean
        """,
    "common.h": """\
        #ifndef COMMON_H
        #define COMMON_H
        const char *greeting(void);
        long sum_to(long n);
        unsigned table_checksum(void);
        #endif
        """,
    "main.c": """\
        #include <stdio.h>
        #include "common.h"
        int main(void) {
            printf("%s\\n", greeting());
            printf("sum=%ld\\n", sum_to(1000));
            printf("table=%u\\n", table_checksum());
            return 0;
        }
        """,
    "greet.c": """\
        #include "common.h"
        const char *greeting(void) { return "hello from spillway"; }
        """,
    "sum.c": """\
        #include "common.h"
        long sum_to(long n) { long s = 0; for (long i = 1; i <= n; i++) s += i; return s; }
        """,
}


def _table_c():
    # a larger generated source file (a few hundred KiB of object code input)
    rows = ",\n".join(f"    {(i * 2654435761) % 4294967291}u" for i in range(20000))
    return (
        '#include "common.h"\n'
        f"static const unsigned table[] = {{\n{rows}\n}};\n"
        "unsigned table_checksum(void) {\n"
        "    unsigned h = 0;\n"
        "    for (unsigned i = 0; i < sizeof table / sizeof table[0]; i++) h = h * 31u + table[i];\n"
        "    return h;\n"
        "}\n"
    )


def _expected_checksum():
    h = 0
    for i in range(20000):
        h = (h * 31 + (i * 2654435761) % 4294967291) & 0xFFFFFFFF
    return h


@pytest.mark.timeout(600)
def test_untar_make_and_run(fs_root, local_dir):
    need("gcc")
    need("make")
    src = os.path.join(local_dir, "proj")
    os.mkdir(src)
    for name, text in PROJECT.items():
        with open(os.path.join(src, name), "w") as f:
            f.write(textwrap.dedent(text))
    with open(os.path.join(src, "table.c"), "w") as f:
        f.write(_table_c())
    tarball = os.path.join(local_dir, "proj.tar.gz")
    with tarfile.open(tarball, "w:gz") as t:
        t.add(src, arcname="proj")

    run(["tar", "xzf", tarball], cwd=fs_root)
    proj = os.path.join(fs_root, "proj")
    assert sorted(os.listdir(proj)) == sorted(list(PROJECT) + ["table.c"])
    for name in PROJECT:
        assert H.read_file(os.path.join(proj, name)) == H.read_file(os.path.join(src, name))

    run(["make", "-j2"], cwd=proj)
    out = run(["./app"], cwd=proj).stdout
    assert out == f"hello from spillway\nsum=500500\ntable={_expected_checksum()}\n", out
    assert run(["make", "-q"], cwd=proj, check=False).returncode == 0, "make thinks a fresh build is out of date"

    time.sleep(1.1)  # make compares mtimes
    with open(os.path.join(proj, "greet.c"), "w") as f:
        f.write('#include "common.h"\nconst char *greeting(void) { return "rebuilt"; }\n')
    assert run(["make", "-q"], cwd=proj, check=False).returncode == 1, "make missed a changed source"
    log = run(["make"], cwd=proj).stdout
    assert "greet.c" in log and "sum.c" not in log and "table.c" not in log, f"unexpected rebuild set:\n{log}"
    assert run(["./app"], cwd=proj).stdout.startswith("rebuilt\n")

    # tar the tree back out and compare
    out_tar = os.path.join(local_dir, "back.tar")
    run(["tar", "cf", out_tar, "proj"], cwd=fs_root)
    with tarfile.open(out_tar) as t:
        names = {m.name for m in t.getmembers()}
    assert {"proj/app", "proj/main.o", "proj/table.c", "proj/Makefile"} <= names
    run(["make", "clean"], cwd=proj)
    assert "app" not in os.listdir(proj)


# ---------------------------------------------------------------------------- sqlite3


@pytest.mark.timeout(900)
@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_sqlite_2000_transactions(fs_root, journal):
    need("sqlite3")
    db = os.path.join(fs_root, "test.db")
    script = [f"PRAGMA journal_mode={journal};", "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL);"]
    for i in range(1, 2001):
        script.append(f"BEGIN; INSERT INTO t(id, v) VALUES({i}, '{'v' * (i % 200)}-{i}'); COMMIT;")
    t0 = time.monotonic()
    r = run(["sqlite3", "-bail", db], cwd=fs_root, input="\n".join(script) + "\n")
    elapsed = time.monotonic() - t0
    print(f"\n2,000 transactions ({journal}): {elapsed:.1f} s")
    assert journal in r.stdout.lower()
    r = run(["sqlite3", db, "PRAGMA integrity_check; SELECT count(*), sum(id) FROM t;"], cwd=fs_root)
    assert r.stdout.split() == ["ok", "2000|2001000"], r.stdout
    # a second connection in another process sees the same data
    r = run(["sqlite3", db, "SELECT v FROM t WHERE id = 1999;"], cwd=fs_root)
    assert r.stdout.strip() == "v" * (1999 % 200) + "-1999"


@pytest.mark.timeout(600)
def test_sqlite_concurrent_writers(fs_root):
    """Two sqlite3 processes inserting into one database: needs working fcntl locks."""
    need("sqlite3")
    db = os.path.join(fs_root, "shared.db")
    run(["sqlite3", db, "CREATE TABLE t(who TEXT, n INTEGER);"], cwd=fs_root)
    procs = []
    for who in ("a", "b"):
        script = ".timeout 30000\n" + "".join(
            f"BEGIN IMMEDIATE; INSERT INTO t VALUES('{who}', {i}); COMMIT;\n" for i in range(300)
        )
        p = subprocess.Popen(["sqlite3", "-bail", db], cwd=fs_root, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append((p, script))
    outs = [p.communicate(s, timeout=500) for p, s in procs]
    for (p, _), (o, e) in zip(procs, outs):
        assert p.returncode == 0, f"sqlite3 writer failed: {e}"
    r = run(["sqlite3", db, "PRAGMA integrity_check; SELECT who, count(*), sum(n) FROM t GROUP BY who;"],
            cwd=fs_root)
    assert r.stdout.split() == ["ok", "a|300|44850", "b|300|44850"], r.stdout


# ---------------------------------------------------------------------------- git


@pytest.mark.timeout(600)
def test_git_init_commit_fsck(fs_root, local_dir):
    need("git")
    home = os.path.join(local_dir, "home")
    os.mkdir(home)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "Spill Way", "GIT_AUTHOR_EMAIL": "t@example.org",
        "GIT_COMMITTER_NAME": "Spill Way", "GIT_COMMITTER_EMAIL": "t@example.org",
        "LC_ALL": "C",
    }
    repo = os.path.join(fs_root, "repo")
    os.mkdir(repo)
    run(["git", "init", "-q", "-b", "main"], cwd=repo, env=env)
    os.makedirs(os.path.join(repo, "src", "deep"))
    files = {
        "README": b"spillway test repo\n",
        "src/a.txt": b"alpha\n" * 1000,
        "src/deep/b.bin": os.urandom(300_000),
        "run.sh": b"#!/bin/sh\necho run\n",
    }
    for name, data in files.items():
        H.write_file(os.path.join(repo, name), data)
    os.chmod(os.path.join(repo, "run.sh"), 0o755)
    run(["git", "add", "-A"], cwd=repo, env=env)
    run(["git", "commit", "-q", "-m", "first"], cwd=repo, env=env)
    with open(os.path.join(repo, "src/a.txt"), "ab") as f:
        f.write(b"beta\n")
    run(["git", "mv", "README", "README.md"], cwd=repo, env=env)
    run(["git", "commit", "-q", "-a", "-m", "second"], cwd=repo, env=env)
    run(["git", "fsck", "--full", "--strict"], cwd=repo, env=env)
    assert run(["git", "rev-list", "--count", "HEAD"], cwd=repo, env=env).stdout.strip() == "2"
    assert run(["git", "status", "--porcelain"], cwd=repo, env=env).stdout == ""
    run(["git", "gc", "-q"], cwd=repo, env=env)
    run(["git", "fsck", "--full", "--strict"], cwd=repo, env=env)
    clone = os.path.join(fs_root, "clone")
    run(["git", "clone", "-q", repo, clone], cwd=fs_root, env=env)
    assert H.read_file(os.path.join(clone, "src/deep/b.bin")) == files["src/deep/b.bin"]
    assert H.read_file(os.path.join(clone, "src/a.txt")) == b"alpha\n" * 1000 + b"beta\n"
    assert os.stat(os.path.join(clone, "run.sh")).st_mode & 0o111
    assert run(["./run.sh"], cwd=clone, env=env).stdout == "run\n"
