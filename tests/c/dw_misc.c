/* Stripes, the MDS path, accounting, concurrency and the error rules.
 * usage: dw_misc DW_DIRECTORY NOT_SPILLWAY_PATH
 * DW_DIRECTORY: an empty directory on the mount, writable by the caller. */
#include "dwtest.h"

#include <fcntl.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    char f[4096], missing[4096], *s;
    int fd, size = 0, width = 0, start = -1, ec = 1, c, p, d, x;

    if (argc != 3) {
        fprintf(stderr, "usage: %s DW_DIRECTORY NOT_SPILLWAY_PATH\n", argv[0]);
        return 2;
    }
    snprintf(f, sizeof(f), "%s/striped", argv[1]);
    snprintf(missing, sizeof(missing), "%s/missing", argv[1]);
    fd = open(f, O_CREAT | O_RDWR | O_TRUNC, 0644);
    if (fd < 0) {
        perror(f);
        return 1;
    }
    CHECK(dw_get_stripe_configuration(fd, &size, &width, &start));
    printf("stripe default size=%d width=%d start=%d\n", size, width, start);
    CHECK(dw_set_stripe_configuration(fd, 65536, 1));
    CHECK(dw_get_stripe_configuration(fd, &size, &width, &start));
    printf("stripe set size=%d width=%d start=%d\n", size, width, start);
    printf("stripe bad-size rc=%d\n", dw_set_stripe_configuration(fd, 1000, 1));
    printf("stripe zero-size rc=%d\n", dw_set_stripe_configuration(fd, 0, 1));
    printf("stripe zero-width rc=%d\n", dw_set_stripe_configuration(fd, 65536, 0));
    printf("stripe bad-fd rc=%d\n", dw_get_stripe_configuration(-1, &size, &width, &start));
    printf("stripe stdin rc=%d\n", dw_get_stripe_configuration(0, &size, &width, &start));
    if (write(fd, "data", 4) != 4)
        return 1;
    printf("sync rc=%d\n", dw_wait_sync_complete(fd));
    close(fd);

    s = dw_get_mds_path(argv[1], 12345);
    printf("mds path=%s\n", s ? s : "(null)");
    free(s);
    errno = 0;
    s = dw_get_mds_path(argv[2], 1);
    printf("mds other=%s errno=%d\n", s ? s : "(null)", errno);
    free(s);

    s = dw_get_accounting_data_json(f, &ec);
    printf("accounting ec=%d\n", ec);
    printf("JSON %s\n", s ? s : "null");
    free(s);

    printf("concurrency rc=%d\n", dw_set_stage_concurrency(argv[1], 2));
    printf("query never-staged rc=%d\n", dw_query_file_stage(f, &c, &p, &d, &x));
    printf("query missing rc=%d\n", dw_query_file_stage(missing, &c, &p, &d, &x));
    printf("query not-spillway rc=%d\n", dw_query_file_stage(argv[2], &c, &p, &d, &x));
    printf("wait never-staged rc=%d\n", dw_wait_file_stage(f));
    printf("stage bad-type rc=%d\n", dw_stage_file_out(f, "/x", (enum dw_stage_type)9));
    return 0;
}
