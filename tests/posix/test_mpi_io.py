"""MPI-IO through ROMIO (Debian's MPICH) on one instance mounted three times, as ranks
of one job on three compute nodes share a checkpoint (issue 31; docs/data-plane.md,
"Consistency"). The programs are the project's own, in tests/c/, built here with
mpicc and launched MPMD: `mpirun -n 2 prog M1/f ... : -n 1 prog M2/f ... : -n 1 prog
M3/f ...`, so ranks on different mounts write one file at once.

* `mpi_shared`: rank 0 creates the file that every rank then opens (ROMIO stats the
  path on every rank first: a miss another mount just filled must not stick); each
  rank writes its blocks (independent and collective, 1 MiB and 47 KiB), closes, and
  after a barrier every rank reopens the file and checks every rank's bytes.
* `mpi_shared ... sync`: the same, but every rank keeps the file open and makes the
  blocks visible with MPI's sync-barrier-sync. ROMIO's MPI_File_sync skips the fsync
  when its rank wrote nothing since the last one, so the reading rank's second sync
  reaches no file system: exact only because each writer's sync returns once the homes
  told the other mounts to drop their cached pages (notices).
* `mpi_sieve`: interleaved pieces through a strided file view, so that ROMIO writes
  with data sieving (lock, read, patch, write back, unlock) from every mount; rank 0
  checks every byte after the others closed. Exact only if the locks carry the data.
"""

import os
import shutil
import subprocess

import pytest

import spwhelpers as H

pytestmark = [
    pytest.mark.spillway_only,
    pytest.mark.skipif(shutil.which("mpicc") is None or shutil.which("mpirun") is None,
                       reason="needs MPICH (mpicc, mpirun: Debian's mpich, libmpich-dev)"),
]

CLUSTER_OPTS = {"servers": 3, "capacity": "4G", "stripe_size": "64K"}


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    out = tmp_path_factory.mktemp("mpi")
    built = {}
    for name in ("mpi_shared", "mpi_sieve"):
        exe = str(out / name)
        subprocess.run(["mpicc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", exe,
                        os.path.join(H.C_DIR, name + ".c")], check=True)
        built[name] = exe
    return built


@pytest.fixture(scope="module")
def three(cluster):
    """The cluster's mount and two more mounts of the same instance."""
    extra = [os.path.join(cluster.dir, f"mnt-mpi{k}") for k in (2, 3)]
    for mp in extra:
        cluster.mount(mp)
    yield [cluster.mnt] + extra
    for mp in extra:
        try:
            cluster.umount(mp)
        except Exception as e:  # the cluster teardown cleans up and reports leftovers
            print(f"umount {mp}: {e}")


def mpmd(exe, mounts, name, *args, ranks=(2, 1, 1), timeout=240):
    """Run `exe` with ranks spread over `mounts` (2 + 1 + 1 by default), each naming the
    shared file `name` through its own mount."""
    # Hydra's fork launcher: every rank on this host, no ssh.
    cmd = ["mpirun", "-launcher", "fork"]
    for k, (mp, n) in enumerate(zip(mounts, ranks)):
        if k:
            cmd.append(":")
        cmd += ["-n", str(n), exe, os.path.join(mp, name), *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (
        f"{' '.join(cmd)}\nexit {r.returncode}\nstdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-3000:]}")


@pytest.mark.parametrize("mode", ["indep", "coll"])
@pytest.mark.parametrize("block", [1 << 20, 47 * 1024], ids=["1MiB", "47KiB"])
def test_ranks_on_three_mounts_write_one_file_and_read_each_others_blocks(programs, three, mode, block):
    d = f"shared-{mode}-{block}"
    os.mkdir(os.path.join(three[0], d))
    mpmd(programs["mpi_shared"], three, f"{d}/f", mode, block, 3, "reopen")


@pytest.mark.parametrize("mode", ["indep", "coll"])
@pytest.mark.parametrize("block", [1 << 20, 47 * 1024], ids=["1MiB", "47KiB"])
def test_sync_barrier_sync_shows_every_rank_s_blocks_through_files_kept_open(programs, three, mode, block):
    d = f"sync-{mode}-{block}"
    os.mkdir(os.path.join(three[0], d))
    mpmd(programs["mpi_shared"], three, f"{d}/f", mode, block, 4, "sync")


@pytest.mark.parametrize("piece", [1000, 4096 + 7])
def test_data_sieving_from_three_mounts_loses_no_rank_s_piece(programs, three, piece):
    d = f"sieve-{piece}"
    os.mkdir(os.path.join(three[0], d))
    for k in range(3):
        mpmd(programs["mpi_sieve"], three, f"{d}/f{k}", piece, 120)
