/* libdatawarp's stage calls on a cache instance: refused at the call.
 * usage: dw_cache FILE_IN_THE_MOUNT PFS_FILE
 * Prints each call's return value. */
#include "dwtest.h"

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s FILE_IN_THE_MOUNT PFS_FILE\n", argv[0]);
        return 2;
    }
    printf("stage_in rc=%d\n", dw_stage_file_in(argv[1], argv[2]));
    printf("stage_out rc=%d\n", dw_stage_file_out(argv[1], argv[2], DW_STAGE_IMMEDIATE));
    return 0;
}
