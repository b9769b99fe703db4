/*
 * datawarp.h: the DataWarp C API (libdatawarp), as implemented by Spillway.
 *
 * Every int function returns 0 (or, where stated, a positive count) on success and a
 * negative errno on failure: use strerror(-ret). Stage operations are asynchronous:
 * the call starts the work, Spillway's storage servers carry it out. What each call
 * does here, and which errno means what: docs/libdatawarp.md.
 *
 * Build against it with `pkg-config --cflags --libs cray-datawarp` (or `datawarp`).
 */
#ifndef _DATAWARP_H
#define _DATAWARP_H

/* As Cray's header: <sys/types.h> (off_t, size_t, ssize_t, uid_t ...) and <stdint.h>
 * (uint64_t), so that a program including only <datawarp.h> has them. */
#include <sys/types.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum dw_stage_type {
    DW_STAGE_IMMEDIATE,         /* 0 */
    DW_STAGE_AT_JOB_END,        /* 1: deferred until the job ends, normally or not */
    DW_REVOKE_STAGE_AT_JOB_END, /* 2: cancel an earlier AT_JOB_END request */
    DW_ACTIVATE_DEFERRED_STAGE  /* 3: turn a deferred request into an immediate one
                                      (the pfs path may be NULL) */
};

/* A walk over an instance's failed stages (opaque). */
typedef struct dw_failed_stage_state dw_failed_stage_t;

int dw_set_stage_concurrency(const char *dw_instance_path, unsigned int concurrent_stages);

int dw_stage_file_in(const char *dw_file_path, const char *pfs_file_path);
int dw_stage_directory_in(const char *dw_directory, const char *pfs_directory);
int dw_stage_list_in(const char *dw_directory, const char **pfs_list);

int dw_stage_file_out(const char *dw_file_path, const char *pfs_file_path,
                      enum dw_stage_type stage_type);
int dw_stage_directory_out(const char *dw_directory, const char *pfs_directory,
                           enum dw_stage_type stage_type);
int dw_stage_list_out(const char **dw_list, const char *pfs_directory,
                      enum dw_stage_type stage_type);

int dw_query_file_stage(const char *dw_file_path, int *complete, int *pending,
                        int *deferred, int *failed);
int dw_query_directory_stage(const char *dw_directory_path, int *complete, int *pending,
                             int *deferred, int *failed);
int dw_query_list_stage(const char **dw_list_path, int *complete, int *pending,
                        int *deferred, int *failed);

/* Block until no stage is pending at the path. Signals do not interrupt the wait (as
 * in DataWarp): a caught signal's handler runs when the signal arrives, then the wait
 * goes on (it is restarted, never -EINTR); a fatal signal ends the process at once. */
int dw_wait_file_stage(const char *dw_file_path);
int dw_wait_directory_stage(const char *dw_directory_path);
int dw_wait_list_stage(const char **dw_list);

int dw_terminate_file_stage(const char *dw_file_path);
int dw_terminate_directory_stage(const char *dw_directory_path);
int dw_terminate_list_stage(const char **dw_list);

int dw_open_failed_stage(const char *dw_instance_path, dw_failed_stage_t **handle);
int dw_read_failed_stage(dw_failed_stage_t *handle, char *path, int path_size,
                         int *ret_errno);
int dw_close_failed_stage(dw_failed_stage_t *handle);

int dw_set_stripe_configuration(int fd, int stripe_size, int stripe_width);
int dw_get_stripe_configuration(int fd, int *stripe_size, int *stripe_width,
                                int *starting_index);

char *dw_get_mds_path(const char *dw_root, uint64_t key);

char *dw_get_accounting_data_json(const char *path, int *ecode);

int dw_wait_sync_complete(int fd);

#ifdef __cplusplus
}
#endif

#endif /* _DATAWARP_H */
