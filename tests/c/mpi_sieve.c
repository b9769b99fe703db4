/* Interleaved ranks writing one shared file through a strided file view, so that ROMIO
 * writes with data sieving (lock a range, read it, patch this rank's pieces in, write
 * it back, unlock), launched MPMD on several mounts of one instance (issue 31).
 *
 *   mpi_sieve PATH PIECE COUNT
 *
 * Rank k owns pieces k, k+size, k+2*size, ... of PIECE bytes each; every rank writes
 * its COUNT pieces with one independent MPI_File_write through the view
 * (MPI_Type_vector: COUNT blocks of PIECE bytes, stride size*PIECE). Sieving's
 * read-modify-write of a range that holds the others' pieces is exact only if the lock
 * carries the data (an unlock pushes the writer's bytes, a lock drops stale pages).
 * Then every rank closes the file and, after a barrier, rank 0 opens it again and
 * checks every byte. Prints "ok". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char byte_of(int rank, long long piece, long long i)
{
    return (unsigned char)(rank * 37 + piece * 11 + i * 3 + 1);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 4) {
        if (rank == 0)
            fprintf(stderr, "usage: mpi_sieve PATH PIECE COUNT\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *path = argv[1];
    int piece = atoi(argv[2]);
    int count = atoi(argv[3]);
    long long mine = (long long)piece * count;
    unsigned char *buf = malloc(mine);
    if (!buf || piece <= 0 || count <= 0)
        MPI_Abort(MPI_COMM_WORLD, 2);
    for (long long p = 0; p < count; p++)
        for (long long i = 0; i < piece; i++)
            buf[p * piece + i] = byte_of(rank, p, i);

    MPI_File fh;
    int err = MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_CREATE | MPI_MODE_RDWR,
                            MPI_INFO_NULL, &fh);
    if (err != MPI_SUCCESS) {
        fprintf(stderr, "rank %d: MPI_File_open failed\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Datatype filetype;
    MPI_Type_vector(count, piece, piece * size, MPI_BYTE, &filetype);
    MPI_Type_commit(&filetype);
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "romio_ds_write", "enable");
    MPI_File_set_view(fh, (MPI_Offset)rank * piece, MPI_BYTE, filetype, "native", info);
    MPI_Status st;
    err = MPI_File_write(fh, buf, (int)mine, MPI_BYTE, &st);
    if (err != MPI_SUCCESS) {
        fprintf(stderr, "rank %d: MPI_File_write failed\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Type_free(&filetype);
    MPI_File_close(&fh);
    MPI_Barrier(MPI_COMM_WORLD);
    int bad = 0;
    if (rank == 0) {
        long long total = mine * size;
        unsigned char *all = malloc(total);
        MPI_File f0;
        if (!all || MPI_File_open(MPI_COMM_SELF, path, MPI_MODE_RDONLY, MPI_INFO_NULL, &f0) !=
                        MPI_SUCCESS) {
            fprintf(stderr, "rank 0: cannot open the file again\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        MPI_File_read_at(f0, 0, all, (int)total, MPI_BYTE, &st);
        MPI_File_close(&f0);
        for (long long p = 0; p < (long long)count * size && !bad; p++) {
            int owner = (int)(p % size);
            for (long long i = 0; i < piece; i++) {
                unsigned char want = byte_of(owner, p / size, i);
                if (all[p * piece + i] != want) {
                    fprintf(stderr, "piece %lld (rank %d's), byte %lld: %02x, not %02x\n", p,
                            owner, i, all[p * piece + i], want);
                    bad = 1;
                    break;
                }
            }
        }
        if (!bad)
            printf("ok\n");
    }
    MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return bad ? 1 : 0;
}
