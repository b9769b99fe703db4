/* NERSC's directory test: a tree in, wait, query; out, wait, query.
 * usage: dw_dir DW_DIRECTORY PFS_SOURCE_DIR PFS_DESTINATION_DIR */
#include "dwtest.h"

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s DW_DIRECTORY PFS_SOURCE_DIR PFS_DESTINATION_DIR\n", argv[0]);
        return 2;
    }
    CHECK(dw_stage_directory_in(argv[1], argv[2]));
    CHECK(dw_wait_directory_stage(argv[1]));
    query_dir("in", argv[1]);
    CHECK(dw_stage_directory_out(argv[1], argv[3], DW_STAGE_IMMEDIATE));
    CHECK(dw_wait_directory_stage(argv[1]));
    query_dir("out", argv[1]);
    return 0;
}
