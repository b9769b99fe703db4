/* NERSC's file test: stage in, wait, query; stage out, wait, query.
 * usage: dw_file DW_FILE PFS_SOURCE PFS_DESTINATION */
#include "dwtest.h"

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s DW_FILE PFS_SOURCE PFS_DESTINATION\n", argv[0]);
        return 2;
    }
    CHECK(dw_stage_file_in(argv[1], argv[2]));
    CHECK(dw_wait_file_stage(argv[1]));
    query_file("in", argv[1]);
    CHECK(dw_stage_file_out(argv[1], argv[3], DW_STAGE_IMMEDIATE));
    CHECK(dw_wait_file_stage(argv[1]));
    query_file("out", argv[1]);
    return 0;
}
