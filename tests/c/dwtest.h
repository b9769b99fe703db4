/* Shared by the libdatawarp test programs (tests/staging/test_libdatawarp.py runs them). */
#ifndef DWTEST_H
#define DWTEST_H

#define _POSIX_C_SOURCE 200809L

#include <datawarp.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Stop with the call, its line and strerror(-ret) when a call fails. */
#define CHECK(call)                                                                    \
    do {                                                                               \
        int r_ = (call);                                                               \
        if (r_ < 0) {                                                                  \
            fprintf(stderr, "%s:%d: %s = %d (%s)\n", __FILE__, __LINE__, #call, r_,    \
                    strerror(-r_));                                                    \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

/* The NERSC tests' success line, with a label and the query's own result. */
static inline void report(const char *label, int rc, int complete, int pending, int deferred,
                          int failed)
{
    printf("%s rc=%d complete=%d pending=%d deferred=%d failed=%d\n", label, rc, complete,
           pending, deferred, failed);
    fflush(stdout);
}

static inline void query_file(const char *label, const char *path)
{
    int c = -1, p = -1, d = -1, f = -1;
    int rc = dw_query_file_stage(path, &c, &p, &d, &f);
    report(label, rc, c, p, d, f);
}

static inline void query_dir(const char *label, const char *path)
{
    int c = -1, p = -1, d = -1, f = -1;
    int rc = dw_query_directory_stage(path, &c, &p, &d, &f);
    report(label, rc, c, p, d, f);
}

static inline void query_list(const char *label, const char **list)
{
    int c = -1, p = -1, d = -1, f = -1;
    int rc = dw_query_list_stage(list, &c, &p, &d, &f);
    report(label, rc, c, p, d, f);
}

static inline void sleep_ms(long ms)
{
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
}

#endif
