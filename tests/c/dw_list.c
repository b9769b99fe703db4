/* NERSC's list test: a list of PFS files into a DW directory and back out.
 * usage: dw_list DW_DIRECTORY PFS_DESTINATION_DIR PFS_FILE... */
#include "dwtest.h"

#include <libgen.h>

int main(int argc, char **argv)
{
    int i, n = argc - 3;
    const char **in, **dw;

    if (argc < 4) {
        fprintf(stderr, "usage: %s DW_DIRECTORY PFS_DESTINATION_DIR PFS_FILE...\n", argv[0]);
        return 2;
    }
    in = calloc((size_t)n + 1, sizeof(char *));
    dw = calloc((size_t)n + 1, sizeof(char *));
    if (!in || !dw)
        return 1;
    for (i = 0; i < n; i++) {
        char *copy = strdup(argv[3 + i]), *p;
        size_t len;
        if (!copy)
            return 1;
        len = strlen(argv[1]) + strlen(basename(copy)) + 2;
        p = malloc(len);
        if (!p)
            return 1;
        snprintf(p, len, "%s/%s", argv[1], basename(copy));
        free(copy);
        in[i] = argv[3 + i];
        dw[i] = p;
    }
    CHECK(dw_stage_list_in(argv[1], in));
    CHECK(dw_wait_list_stage(dw));
    query_list("in", dw);
    CHECK(dw_stage_list_out(dw, argv[2], DW_STAGE_IMMEDIATE));
    CHECK(dw_wait_list_stage(dw));
    query_list("out", dw);
    for (i = 0; i < n; i++)
        free((char *)dw[i]);
    free(dw);
    free(in);
    return 0;
}
