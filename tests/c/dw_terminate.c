/* NERSC's terminate test: stop the stage of a large file part of the way through.
 * usage: dw_terminate DW_FILE PFS_SOURCE DELAY_MS */
#include "dwtest.h"

int main(int argc, char **argv)
{
    int rc;

    if (argc != 4) {
        fprintf(stderr, "usage: %s DW_FILE PFS_SOURCE DELAY_MS\n", argv[0]);
        return 2;
    }
    CHECK(dw_stage_file_in(argv[1], argv[2]));
    sleep_ms(atol(argv[3]));
    query_file("running", argv[1]);
    rc = dw_terminate_file_stage(argv[1]);
    printf("terminate rc=%d\n", rc);
    CHECK(rc);
    /* Nothing pending any more; the records may be gone with the stage (-EINVAL). */
    printf("wait rc=%d\n", dw_wait_file_stage(argv[1]));
    query_file("terminated", argv[1]);
    return 0;
}
