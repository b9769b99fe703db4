/* N-to-1 shared-file write through MPI-IO, IOR's segmented layout (bench/shared.sh).
 *
 *   mpi_write PATH indep|coll XFER SEGMENTS
 *
 * Every rank writes SEGMENTS transfers of XFER bytes into one file, rank r's transfer
 * of segment s at (s * size + r) * XFER, with MPI_File_write_at (indep) or
 * MPI_File_write_at_all (coll); then MPI_File_sync and MPI_File_close. Rank 0 prints
 * the bytes written by all ranks and the seconds from the barrier before the first
 * write to the end of the close on the slowest rank: "BYTES SECONDS". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 5) {
        if (rank == 0)
            fprintf(stderr, "usage: mpi_write PATH indep|coll XFER SEGMENTS\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int coll = strcmp(argv[2], "coll") == 0;
    long long xfer = atoll(argv[3]);
    long long segments = atoll(argv[4]);
    char *buf = malloc(xfer);
    if (!buf || xfer <= 0 || xfer > (1LL << 30) || segments <= 0)
        MPI_Abort(MPI_COMM_WORLD, 2);
    memset(buf, 'a' + rank % 26, xfer);
    MPI_File fh;
    if (MPI_File_open(MPI_COMM_WORLD, argv[1], MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL,
                      &fh) != MPI_SUCCESS) {
        fprintf(stderr, "rank %d: cannot open %s\n", rank, argv[1]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (long long s = 0; s < segments; s++) {
        MPI_Offset at = ((MPI_Offset)s * size + rank) * xfer;
        MPI_Status st;
        int err = coll ? MPI_File_write_at_all(fh, at, buf, (int)xfer, MPI_BYTE, &st)
                       : MPI_File_write_at(fh, at, buf, (int)xfer, MPI_BYTE, &st);
        if (err != MPI_SUCCESS) {
            fprintf(stderr, "rank %d: write failed\n", rank);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    MPI_File_sync(fh);
    MPI_File_close(&fh);
    double mine = MPI_Wtime() - t0, slowest = 0;
    MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("%lld %.6f\n", xfer * segments * size, slowest);
    free(buf);
    MPI_Finalize();
    return 0;
}
