/* One shared file written by every rank and read back by the others, through ROMIO
 * (MPI-IO), with ranks launched MPMD on several mounts of one instance (issue 31).
 *
 *   mpi_shared PATH MODE BLOCK ROUNDS CHECK
 *
 * PATH: the shared file as this rank's mount names it. MODE: "indep" (MPI_File_write_at)
 * or "coll" (MPI_File_write_at_all). Rank 0 creates the file (MPI_MODE_CREATE: ROMIO
 * stats the path on every rank, rank 0 creates it, then every rank opens it). In each
 * round every rank writes BLOCK bytes of a pattern at block (round * size + rank), then
 * makes them visible as CHECK says, and reads every rank's block written so far,
 * checking each byte:
 *   "reopen": MPI_File_close, a barrier, MPI_File_open again (close-to-open);
 *   "sync":   MPI_File_sync, a barrier, MPI_File_sync, through the open file (the MPI
 *             standard's sync-barrier-sync).
 * Prints "ok" on rank 0 when all ranks agree; exits 1 on the first wrong byte (with
 * where). */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char pattern(long long round, int rank, long long i)
{
    uint64_t x = (uint64_t)round * 1000003u + (uint64_t)rank * 7919u + (uint64_t)i;
    x ^= x >> 13;
    x *= 0x9E3779B97F4A7C15ull;
    return (unsigned char)(x >> 56);
}

static void fail(const char *what, int err)
{
    char msg[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(err, msg, &n);
    fprintf(stderr, "%s: %s\n", what, msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 6) {
        if (rank == 0)
            fprintf(stderr, "usage: mpi_shared PATH indep|coll BLOCK ROUNDS reopen|sync\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int reopen = strcmp(argv[5], "reopen") == 0;
    const char *path = argv[1];
    int coll = strcmp(argv[2], "coll") == 0;
    long long block = atoll(argv[3]);
    int rounds = atoi(argv[4]);
    unsigned char *buf = malloc(block), *got = malloc(block);
    if (!buf || !got || block <= 0 || rounds <= 0)
        MPI_Abort(MPI_COMM_WORLD, 2);

    MPI_File fh;
    int err = MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_CREATE | MPI_MODE_RDWR,
                            MPI_INFO_NULL, &fh);
    if (err != MPI_SUCCESS)
        fail("MPI_File_open", err);
    int bad = 0;
    for (int r = 0; r < rounds && !bad; r++) {
        for (long long i = 0; i < block; i++)
            buf[i] = pattern(r, rank, i);
        MPI_Offset at = ((MPI_Offset)r * size + rank) * block;
        MPI_Status st;
        err = coll ? MPI_File_write_at_all(fh, at, buf, (int)block, MPI_BYTE, &st)
                   : MPI_File_write_at(fh, at, buf, (int)block, MPI_BYTE, &st);
        if (err != MPI_SUCCESS)
            fail("write", err);
        if (reopen) {
            MPI_File_close(&fh);
            MPI_Barrier(MPI_COMM_WORLD);
            err = MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_RDWR, MPI_INFO_NULL, &fh);
            if (err != MPI_SUCCESS)
                fail("MPI_File_open again", err);
        } else {
            MPI_File_sync(fh);
            MPI_Barrier(MPI_COMM_WORLD);
            MPI_File_sync(fh);
        }
        /* Every block written so far, every rank's. */
        for (int rr = 0; rr <= r && !bad; rr++) {
            for (int k = 0; k < size && !bad; k++) {
                MPI_Offset o = ((MPI_Offset)rr * size + k) * block;
                memset(got, 0xA5, block);
                err = coll ? MPI_File_read_at_all(fh, o, got, (int)block, MPI_BYTE, &st)
                           : MPI_File_read_at(fh, o, got, (int)block, MPI_BYTE, &st);
                if (err != MPI_SUCCESS)
                    fail("read", err);
                for (long long i = 0; i < block; i++) {
                    if (got[i] != pattern(rr, k, i)) {
                        fprintf(stderr,
                                "rank %d: round %d, rank %d's block at %lld, byte %lld: "
                                "%02x, not %02x\n",
                                rank, rr, k, (long long)o, i, got[i], pattern(rr, k, i));
                        bad = 1;
                        break;
                    }
                }
            }
        }
        int any = 0;
        MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        bad = any;
    }
    MPI_File_close(&fh);
    if (rank == 0 && !bad)
        printf("ok\n");
    MPI_Finalize();
    return bad ? 1 : 0;
}
