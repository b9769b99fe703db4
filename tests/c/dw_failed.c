/* Stages that fail, then the failed-stage walk over the instance.
 * usage: dw_failed DW_DIRECTORY NAME PFS_SOURCE [NAME PFS_SOURCE]...
 * Stages each PFS_SOURCE into DW_DIRECTORY/NAME, waits, queries, then prints every
 * failed stage of the instance as `failed path=P errno=E`. */
#include "dwtest.h"

int main(int argc, char **argv)
{
    dw_failed_stage_t *h;
    char path[4096], small[4];
    int i, n, e;

    if (argc < 4 || (argc - 2) % 2 != 0) {
        fprintf(stderr, "usage: %s DW_DIRECTORY NAME PFS_SOURCE...\n", argv[0]);
        return 2;
    }
    for (i = 2; i < argc; i += 2) {
        snprintf(path, sizeof(path), "%s/%s", argv[1], argv[i]);
        CHECK(dw_stage_file_in(path, argv[i + 1]));
    }
    for (i = 2; i < argc; i += 2) {
        snprintf(path, sizeof(path), "%s/%s", argv[1], argv[i]);
        CHECK(dw_wait_file_stage(path));
        query_file(argv[i], path);
    }
    CHECK(dw_open_failed_stage(argv[1], &h));
    /* Too small a buffer: -ERANGE, and the entry is not lost. */
    n = dw_read_failed_stage(h, small, (int)sizeof(small), &e);
    printf("small rc=%d\n", n);
    while ((n = dw_read_failed_stage(h, path, (int)sizeof(path), &e)) > 0)
        printf("failed path=%s errno=%d len=%d\n", path, e, n);
    CHECK(n);
    CHECK(dw_close_failed_stage(h));
    printf("walk done\n");
    return 0;
}
