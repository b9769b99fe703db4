/* A stage-out terminated part-way, as libdatawarp reports it (tests/staging/test_stage_partial.py):
 * a first stage-out of DW_FILE completes; a second one is terminated once it runs;
 * wait and query must then answer about the terminated stage (started: rc 0, nothing
 * complete, pending, deferred or failed), neither -EINVAL nor the first stage's
 * "complete".
 * usage: dw_partial DW_FILE PFS_FILE DELAY_MS */
#include "dwtest.h"

int main(int argc, char **argv)
{
    int rc;

    if (argc != 4) {
        fprintf(stderr, "usage: %s DW_FILE PFS_FILE DELAY_MS\n", argv[0]);
        return 2;
    }
    CHECK(dw_stage_file_out(argv[1], argv[2], DW_STAGE_IMMEDIATE));
    printf("first-wait rc=%d\n", dw_wait_file_stage(argv[1]));
    query_file("first", argv[1]);
    CHECK(dw_stage_file_out(argv[1], argv[2], DW_STAGE_IMMEDIATE));
    sleep_ms(atol(argv[3]));
    query_file("running", argv[1]);
    rc = dw_terminate_file_stage(argv[1]);
    printf("terminate rc=%d\n", rc);
    fflush(stdout);
    CHECK(rc);
    printf("wait rc=%d\n", dw_wait_file_stage(argv[1]));
    query_file("terminated", argv[1]);
    return 0;
}
