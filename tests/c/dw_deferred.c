/* NERSC's deferred test: stage out at job end, revoke, defer again, activate, wait.
 * usage: dw_deferred DW_FILE PFS_DESTINATION */
#include "dwtest.h"

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s DW_FILE PFS_DESTINATION\n", argv[0]);
        return 2;
    }
    CHECK(dw_stage_file_out(argv[1], argv[2], DW_STAGE_AT_JOB_END));
    query_file("deferred", argv[1]);
    CHECK(dw_stage_file_out(argv[1], NULL, DW_REVOKE_STAGE_AT_JOB_END));
    query_file("revoked", argv[1]);
    CHECK(dw_stage_file_out(argv[1], argv[2], DW_STAGE_AT_JOB_END));
    query_file("deferred-again", argv[1]);
    CHECK(dw_stage_file_out(argv[1], NULL, DW_ACTIVATE_DEFERRED_STAGE));
    CHECK(dw_wait_file_stage(argv[1]));
    query_file("activated", argv[1]);
    return 0;
}
