/*
 * libdatawarp for Spillway: the DataWarp C API on top of the FUSE client's control
 * channel (docs/staging.md, "Control channel"; docs/libdatawarp.md).
 *
 * A caller's path is mapped to its Spillway mount (realpath, then the longest mount
 * point of /proc/self/mountinfo that holds it, which must be of type fuse.spillway)
 * and to the instance path below it; the request goes to the mount's client as
 * ioctl(SPILLWAY_IOC_CALL) on the mount root, and the client carries it to the
 * manager with the caller's uid as the kernel gave it.
 *
 * Thread safety: there is no global state. Every call works on its own allocations;
 * a failed-stage handle has its own lock.
 */
#define _GNU_SOURCE

#include "datawarp.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ the channel */

#define SPW_BUF_LEN 16376

struct spillway_ioc {
    uint32_t len;
    char buf[SPW_BUF_LEN];
}; /* 16380 bytes */

#define SPILLWAY_IOC_CALL _IOWR('S', 0x57, struct spillway_ioc)

/* C99's static assertion: the struct is exactly what the client expects. */
typedef char spw_ioc_size_check[(sizeof(struct spillway_ioc) == 16380) ? 1 : -1];

#define SPW_FSTYPE "fuse.spillway"
/* A wait never parks in the client (a FUSE request the kernel lets no signal
 * through until it is answered: fuser does not take interrupts): each ioctl asks
 * whether anything is still pending and is answered at once ("0" ms), and between
 * them the caller sleeps in nanosleep, where a caught signal's handler runs at once
 * and a fatal one ends the process at once. The pause grows from SPW_POLL_FIRST_MS to
 * SPW_POLL_MAX_MS: a stage's end is seen within SPW_POLL_MAX_MS, one manager request
 * each time at most. */
#define SPW_WAIT_MS "0"
#define SPW_POLL_FIRST_MS 10
#define SPW_POLL_MAX_MS 250
#define SPW_XATTR_SIZE "user.spillway.stripe_size"
#define SPW_XATTR_WIDTH "user.spillway.stripe_width"
#define SPW_XATTR_LAYOUT "user.spillway.layout"
#define SPW_XATTR_SYNC "user.spillway.sync"

/* A request being built, then its answer. */
struct dw_msg {
    struct spillway_ioc ioc;
    int overflow;  /* a field did not fit */
    int result;    /* the answer's result: 0 or a negative errno */
    int nfields;   /* answer fields after the result */
    char **fields; /* pointers into ioc.buf */
};

static struct dw_msg *msg_new(void)
{
    return calloc(1, sizeof(struct dw_msg));
}

static void msg_free(struct dw_msg *m)
{
    if (m) {
        free(m->fields);
        free(m);
    }
}

static void msg_reset(struct dw_msg *m)
{
    free(m->fields);
    memset(m, 0, sizeof(*m));
}

/* Append one field (with its NUL). */
static void msg_add(struct dw_msg *m, const char *s)
{
    size_t n = strlen(s) + 1;
    if (m->overflow || n > SPW_BUF_LEN - m->ioc.len) {
        m->overflow = 1;
        return;
    }
    memcpy(m->ioc.buf + m->ioc.len, s, n);
    m->ioc.len += (uint32_t)n;
}

/* Room left for fields. */
static size_t msg_room(const struct dw_msg *m)
{
    return SPW_BUF_LEN - m->ioc.len;
}

static void debug_message(const struct dw_msg *m)
{
    if (m->result < 0 && m->nfields > 0 && getenv("LIBDATAWARP_DEBUG"))
        fprintf(stderr, "libdatawarp: %s (%s)\n", m->fields[0], strerror(-m->result));
}

/* Split the answer in place. 0, or -EPROTO for an answer that is not one. */
static int msg_parse(struct dw_msg *m)
{
    uint32_t len = m->ioc.len, i;
    int n = 0, k = 0;
    char *end;
    long r;

    if (len == 0 || len > SPW_BUF_LEN || m->ioc.buf[len - 1] != '\0')
        return -EPROTO;
    for (i = 0; i < len; i++)
        if (m->ioc.buf[i] == '\0')
            n++;
    m->fields = calloc((size_t)n, sizeof(char *));
    if (!m->fields)
        return -ENOMEM;
    for (i = 0; i < len; i += (uint32_t)strlen(m->ioc.buf + i) + 1)
        m->fields[k++] = m->ioc.buf + i;
    errno = 0;
    r = strtol(m->fields[0], &end, 10);
    if (errno || *end || end == m->fields[0] || r > 0 || r < -4095)
        return -EPROTO;
    m->result = (int)r;
    /* fields[0] was the result: shift the rest down. */
    memmove(m->fields, m->fields + 1, (size_t)(n - 1) * sizeof(char *));
    m->nfields = n - 1;
    return 0;
}

/* Send the built request through `fd` (a descriptor on the mount) and parse the
 * answer. Returns the answer's result, or a negative errno of the ioctl itself. */
static int msg_call_fd(struct dw_msg *m, int fd)
{
    int r;

    if (m->overflow)
        return -E2BIG;
    do {
        r = ioctl(fd, SPILLWAY_IOC_CALL, &m->ioc);
    } while (r < 0 && errno == EINTR);
    if (r < 0)
        return errno == ENOTTY ? -ENOTSUP : -errno;
    r = msg_parse(m);
    if (r < 0)
        return r;
    debug_message(m);
    return m->result;
}

/* The same through the mount root. */
static int msg_call(struct dw_msg *m, const char *mount)
{
    int fd, r;

    do {
        fd = open(mount, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return -errno;
    r = msg_call_fd(m, fd);
    close(fd);
    return r;
}

/* A decimal answer field as an int (clamped). */
static int field_int(const struct dw_msg *m, int i, long *out)
{
    char *end;
    long v;

    if (i >= m->nfields)
        return -EPROTO;
    errno = 0;
    v = strtol(m->fields[i], &end, 10);
    if (errno || *end || end == m->fields[i])
        return -EPROTO;
    *out = v;
    return 0;
}

static int clamp_int(long v)
{
    return v > INT_MAX ? INT_MAX : v < INT_MIN ? INT_MIN : (int)v;
}

/* ------------------------------------------------------------------ mounts */

/* mountinfo writes space, tab, newline and backslash as \ooo. In place. */
static void unescape_octal(char *s)
{
    char *w = s;
    while (*s) {
        if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
            s[3] >= '0' && s[3] <= '7') {
            *w++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
            s += 4;
        } else {
            *w++ = *s++;
        }
    }
    *w = '\0';
}

/* One line of mountinfo: its mount point, device and type, pointing into `line`. */
static int mountinfo_fields(char *line, char **mnt, char **dev, char **fstype)
{
    char *save = NULL, *tok;
    int i = 0, after_dash = 0;

    *mnt = *dev = *fstype = NULL;
    for (tok = strtok_r(line, " \n", &save); tok; tok = strtok_r(NULL, " \n", &save), i++) {
        if (i == 2)
            *dev = tok;
        else if (i == 4)
            *mnt = tok;
        else if (i > 5 && !after_dash && strcmp(tok, "-") == 0)
            after_dash = 1;
        else if (after_dash) {
            *fstype = tok;
            break;
        }
    }
    if (!*mnt || !*dev || !*fstype)
        return -1;
    unescape_octal(*mnt);
    return 0;
}

/* Does mount point `mnt` hold the absolute path `path`? */
static int holds(const char *mnt, const char *path)
{
    size_t n = strlen(mnt);
    if (strcmp(mnt, "/") == 0)
        return 1;
    return strncmp(path, mnt, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/*
 * The mount holding `path` (canonical, absolute): the longest mount point that holds
 * it (the later of equal ones: a mount over another). *mount gets a malloc'd copy when
 * it is a Spillway mount. 0, -EINVAL when the path is not on Spillway, or -errno.
 */
static int find_mount(const char *path, char **mount)
{
    FILE *f;
    char *line = NULL, *mnt, *dev, *fstype;
    size_t cap = 0, best_len = 0;
    int best_spw = 0, found = 0;
    char *best = NULL;

    *mount = NULL;
    f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return -errno;
    while (getline(&line, &cap, f) >= 0) {
        size_t n;
        if (mountinfo_fields(line, &mnt, &dev, &fstype) < 0 || !holds(mnt, path))
            continue;
        n = strlen(mnt);
        if (found && n < best_len)
            continue;
        free(best);
        best = strdup(mnt);
        if (!best) {
            free(line);
            fclose(f);
            return -ENOMEM;
        }
        best_len = n;
        best_spw = strcmp(fstype, SPW_FSTYPE) == 0;
        found = 1;
    }
    free(line);
    fclose(f);
    if (!found || !best_spw) {
        free(best);
        return -EINVAL;
    }
    *mount = best;
    return 0;
}

/* Is the open descriptor `fd` on a Spillway mount? 0 yes, -EINVAL no, -errno. */
static int fd_on_spillway(int fd)
{
    struct stat st;
    FILE *f;
    char *line = NULL, *mnt, *dev, *fstype, want[64];
    size_t cap = 0;
    int r = -EINVAL;

    if (fstat(fd, &st) < 0)
        return -errno;
    snprintf(want, sizeof(want), "%u:%u", major(st.st_dev), minor(st.st_dev));
    f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return -errno;
    while (getline(&line, &cap, f) >= 0) {
        if (mountinfo_fields(line, &mnt, &dev, &fstype) == 0 && strcmp(dev, want) == 0)
            r = strcmp(fstype, SPW_FSTYPE) == 0 ? 0 : -EINVAL;
    }
    free(line);
    fclose(f);
    return r;
}

/* A caller's path on a Spillway mount. */
struct dw_target {
    char *mount; /* the mount point */
    char *ipath; /* the instance path: "/" or "/a/b" */
    char *full;  /* the canonical path (its last name not followed in RESOLVE_LEAF) */
};

/* How `resolve` treats the last name of a path. */
enum resolve_mode {
    RESOLVE_EXISTING, /* the path must exist; symlinks are followed all the way */
    RESOLVE_LEAF      /* the parent must exist; the last name is taken as it is */
};

static void target_free(struct dw_target *t)
{
    free(t->mount);
    free(t->ipath);
    free(t->full);
    t->mount = t->ipath = t->full = NULL;
}

/* Does the path itself exist (as named: a dangling symlink counts)? */
static int target_exists(const struct dw_target *t)
{
    struct stat st;
    return lstat(t->full, &st) == 0;
}

static char *join2(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    int slash = !(na > 0 && a[na - 1] == '/');
    char *s = malloc(na + nb + 2);
    if (!s)
        return NULL;
    memcpy(s, a, na);
    if (slash)
        s[na++] = '/';
    memcpy(s + na, b, nb + 1);
    return s;
}

/* The last component of `path`, malloc'd; NULL with errno EINVAL when there is none
 * (`/`, `.`, `..`, empty) or the path ends with a slash. */
static char *last_component(const char *path)
{
    size_t n = strlen(path);
    const char *start;
    char *s;

    start = path + n;
    while (start > path && start[-1] != '/')
        start--;
    n = (size_t)(path + n - start);
    if (n == 0 || (n == 1 && start[0] == '.') || (n == 2 && start[0] == '.' && start[1] == '.')) {
        errno = EINVAL;
        return NULL;
    }
    s = malloc(n + 1);
    if (!s)
        return NULL;
    memcpy(s, start, n);
    s[n] = '\0';
    return s;
}

/* realpath of the directory part of `path` (`.` when there is none). */
static char *real_parent(const char *path)
{
    char *copy = strdup(path), *slash, *r;
    int e;

    if (!copy)
        return NULL;
    slash = strrchr(copy, '/');
    if (!slash) {
        free(copy);
        return realpath(".", NULL);
    }
    if (slash == copy)
        slash[1] = '\0';
    else
        *slash = '\0';
    r = realpath(copy, NULL);
    e = errno;
    free(copy);
    errno = e;
    return r;
}

/*
 * Map a caller's path to its mount and instance path.
 *
 * RESOLVE_LEAF does not look the last name up: a file a stage is about to create must
 * not be looked up before it exists, or the kernel would remember that it does not
 * (for the mount's entry lifetime) after the servers have created it.
 */
static int resolve(const char *path, enum resolve_mode mode, struct dw_target *t)
{
    char *full = NULL, *rest, *base;
    int r;

    memset(t, 0, sizeof(*t));
    if (!path || !*path)
        return -EINVAL;
    base = mode == RESOLVE_LEAF ? last_component(path) : NULL;
    if (base) {
        char *parent = real_parent(path);
        if (!parent) {
            r = -errno;
            free(base);
            return r;
        }
        full = join2(parent, base);
        free(parent);
        free(base);
        if (!full)
            return -ENOMEM;
    } else {
        /* RESOLVE_EXISTING, or a path without a last name (`/`, `..`, `dir/`). */
        full = realpath(path, NULL);
        if (!full)
            return -errno;
    }
    r = find_mount(full, &t->mount);
    if (r < 0) {
        free(full);
        return r;
    }
    rest = full + (strcmp(t->mount, "/") == 0 ? 0 : strlen(t->mount));
    t->ipath = strdup(*rest ? rest : "/");
    t->full = full;
    if (!t->ipath) {
        target_free(t);
        return -ENOMEM;
    }
    return 0;
}

/* A PFS path made absolute (relative to the working directory), not resolved: the
 * servers resolve it beneath the PFS roots, and a missing source is the stage's
 * failure to record, not this call's. */
static char *pfs_absolute(const char *p)
{
    char *cwd, *s;

    if (!p || !*p) {
        errno = EINVAL;
        return NULL;
    }
    if (p[0] == '/')
        return strdup(p);
    cwd = getcwd(NULL, 0);
    if (!cwd)
        return NULL;
    s = join2(cwd, p);
    free(cwd);
    return s;
}

/* ------------------------------------------------------------------ operations */

static const char *when_of(enum dw_stage_type t)
{
    return t == DW_STAGE_AT_JOB_END ? "job_end" : "immediate";
}

/* One request of fixed fields on the mount of `mount`; the answer in *out if asked. */
static int simple_call(const char *mount, const char **fields, int n, struct dw_msg **out)
{
    struct dw_msg *m = msg_new();
    int i, r;

    if (!m)
        return -ENOMEM;
    for (i = 0; i < n; i++)
        msg_add(m, fields[i]);
    r = msg_call(m, mount);
    if (out && r == 0)
        *out = m;
    else
        msg_free(m);
    return r;
}

int dw_set_stage_concurrency(const char *dw_instance_path, unsigned int concurrent_stages)
{
    struct dw_target t;
    char n[32];
    const char *f[2];
    int r = resolve(dw_instance_path, RESOLVE_EXISTING, &t);

    if (r < 0)
        return r;
    snprintf(n, sizeof(n), "%u", concurrent_stages);
    f[0] = "concurrency";
    f[1] = n;
    r = simple_call(t.mount, f, 2, NULL);
    target_free(&t);
    return r;
}

/* A file or directory stage. `dw` is the DW side, `pfs` the PFS side. */
static int stage_one(const char *dir, const char *type, const char *dw, enum resolve_mode dw_mode,
                     const char *pfs, enum dw_stage_type when)
{
    struct dw_target t;
    char *p;
    const char *f[6];
    int r;

    if (!pfs)
        return -EINVAL;
    r = resolve(dw, dw_mode, &t);
    if (r < 0)
        return r;
    p = pfs_absolute(pfs);
    if (!p) {
        r = errno == EINVAL ? -EINVAL : -ENOMEM;
        target_free(&t);
        return r;
    }
    f[0] = "stage";
    f[1] = dir;
    f[2] = type;
    f[3] = when_of(when);
    if (strcmp(dir, "in") == 0) {
        f[4] = p;
        f[5] = t.ipath;
    } else {
        f[4] = t.ipath;
        f[5] = p;
    }
    r = simple_call(t.mount, f, 6, NULL);
    free(p);
    target_free(&t);
    return r;
}

/* revoke or activate the deferred stage(s) of one DW path. */
static int act_one(const char *action, const char *scope, const char *dw, enum resolve_mode mode)
{
    struct dw_target t;
    const char *f[4];
    int r = resolve(dw, mode, &t);

    if (r < 0)
        return r;
    f[0] = "action";
    f[1] = action;
    f[2] = scope;
    f[3] = t.ipath;
    r = simple_call(t.mount, f, 4, NULL);
    /* No stage there: a path that is not there either is ENOENT, else EINVAL. */
    if (r == -ENOENT && target_exists(&t))
        r = -EINVAL;
    target_free(&t);
    return r;
}

int dw_stage_file_in(const char *dw_file_path, const char *pfs_file_path)
{
    return stage_one("in", "file", dw_file_path, RESOLVE_LEAF, pfs_file_path, DW_STAGE_IMMEDIATE);
}

int dw_stage_directory_in(const char *dw_directory, const char *pfs_directory)
{
    return stage_one("in", "directory", dw_directory, RESOLVE_EXISTING, pfs_directory, DW_STAGE_IMMEDIATE);
}

int dw_stage_file_out(const char *dw_file_path, const char *pfs_file_path,
                      enum dw_stage_type stage_type)
{
    switch (stage_type) {
    case DW_STAGE_IMMEDIATE:
    case DW_STAGE_AT_JOB_END:
        return stage_one("out", "file", dw_file_path, RESOLVE_EXISTING, pfs_file_path, stage_type);
    case DW_REVOKE_STAGE_AT_JOB_END:
        return act_one("revoke", "file", dw_file_path, RESOLVE_LEAF);
    case DW_ACTIVATE_DEFERRED_STAGE:
        return act_one("activate", "file", dw_file_path, RESOLVE_LEAF);
    }
    return -EINVAL;
}

int dw_stage_directory_out(const char *dw_directory, const char *pfs_directory,
                           enum dw_stage_type stage_type)
{
    switch (stage_type) {
    case DW_STAGE_IMMEDIATE:
    case DW_STAGE_AT_JOB_END:
        return stage_one("out", "directory", dw_directory, RESOLVE_EXISTING, pfs_directory, stage_type);
    case DW_REVOKE_STAGE_AT_JOB_END:
        return act_one("revoke", "tree", dw_directory, RESOLVE_EXISTING);
    case DW_ACTIVATE_DEFERRED_STAGE:
        return act_one("activate", "tree", dw_directory, RESOLVE_EXISTING);
    }
    return -EINVAL;
}

/*
 * A list stage: pairs of (source, destination) for one mount, as few requests as the
 * message size allows (a list too long for one message becomes several stages).
 */
struct list_builder {
    struct dw_msg *m;
    const char *mount;
    const char *head[4];
    int pairs;
};

static int list_flush(struct list_builder *b)
{
    int r;
    if (b->pairs == 0)
        return 0;
    r = msg_call(b->m, b->mount);
    b->pairs = 0;
    msg_reset(b->m);
    return r;
}

static int list_add(struct list_builder *b, const char *src, const char *dst)
{
    int i, r;
    size_t need = strlen(src) + strlen(dst) + 2;

    if (b->pairs > 0 && need > msg_room(b->m)) {
        r = list_flush(b);
        if (r < 0)
            return r;
    }
    if (b->pairs == 0)
        for (i = 0; i < 4; i++)
            msg_add(b->m, b->head[i]);
    if (need > msg_room(b->m))
        return -ENAMETOOLONG;
    msg_add(b->m, src);
    msg_add(b->m, dst);
    b->pairs++;
    return 0;
}

int dw_stage_list_in(const char *dw_directory, const char **pfs_list)
{
    struct dw_target t;
    struct list_builder b;
    int r, i;

    if (!pfs_list || !pfs_list[0])
        return -EINVAL;
    r = resolve(dw_directory, RESOLVE_EXISTING, &t);
    if (r < 0)
        return r;
    memset(&b, 0, sizeof(b));
    b.m = msg_new();
    if (!b.m) {
        target_free(&t);
        return -ENOMEM;
    }
    b.mount = t.mount;
    b.head[0] = "stage";
    b.head[1] = "in";
    b.head[2] = "list";
    b.head[3] = "immediate";
    for (i = 0; pfs_list[i] && r == 0; i++) {
        char *src = pfs_absolute(pfs_list[i]), *base = NULL, *dst = NULL;
        if (src)
            base = last_component(src);
        if (base)
            dst = join2(t.ipath, base);
        if (!dst)
            r = errno == EINVAL ? -EINVAL : -ENOMEM;
        else
            r = list_add(&b, src, dst);
        free(src);
        free(base);
        free(dst);
    }
    if (r == 0)
        r = list_flush(&b);
    msg_free(b.m);
    target_free(&t);
    return r;
}

/* Apply `fn` to every path of a NULL-terminated list; the first error, after all. */
static int each(const char **list, int (*fn)(const char *))
{
    int i, r, first = 0;
    if (!list || !list[0])
        return -EINVAL;
    for (i = 0; list[i]; i++) {
        r = fn(list[i]);
        if (r < 0 && first == 0)
            first = r;
    }
    return first;
}

static int revoke_file(const char *p)
{
    return act_one("revoke", "file", p, RESOLVE_LEAF);
}

static int activate_file(const char *p)
{
    return act_one("activate", "file", p, RESOLVE_LEAF);
}

int dw_stage_list_out(const char **dw_list, const char *pfs_directory,
                      enum dw_stage_type stage_type)
{
    struct dw_target t;
    struct list_builder b;
    char *mount = NULL, *pdir;
    int r = 0, i;

    if (stage_type == DW_REVOKE_STAGE_AT_JOB_END)
        return each(dw_list, revoke_file);
    if (stage_type == DW_ACTIVATE_DEFERRED_STAGE)
        return each(dw_list, activate_file);
    if (stage_type != DW_STAGE_IMMEDIATE && stage_type != DW_STAGE_AT_JOB_END)
        return -EINVAL;
    if (!dw_list || !dw_list[0] || !pfs_directory)
        return -EINVAL;
    pdir = pfs_absolute(pfs_directory);
    if (!pdir)
        return errno == EINVAL ? -EINVAL : -ENOMEM;
    memset(&b, 0, sizeof(b));
    b.m = msg_new();
    if (!b.m) {
        free(pdir);
        return -ENOMEM;
    }
    b.head[0] = "stage";
    b.head[1] = "out";
    b.head[2] = "list";
    b.head[3] = when_of(stage_type);
    for (i = 0; dw_list[i] && r == 0; i++) {
        char *base = NULL, *dst = NULL;
        r = resolve(dw_list[i], RESOLVE_EXISTING, &t);
        if (r < 0)
            break;
        if (!mount) {
            mount = t.mount;
            t.mount = NULL;
            b.mount = mount;
        } else if (strcmp(mount, t.mount) != 0) {
            r = -EXDEV; /* one list, one instance */
        }
        if (r == 0) {
            base = last_component(t.ipath);
            dst = base ? join2(pdir, base) : NULL;
            if (!dst)
                r = errno == EINVAL ? -EINVAL : -ENOMEM;
            else
                r = list_add(&b, t.ipath, dst);
        }
        free(base);
        free(dst);
        target_free(&t);
    }
    if (r == 0)
        r = list_flush(&b);
    msg_free(b.m);
    free(mount);
    free(pdir);
    return r;
}

/* ------------------------------------------------------------------ query, wait, terminate */

struct counts {
    long complete, pending, deferred, failed;
};

static int counts_of(const char *path, const char *scope, enum resolve_mode mode, struct counts *c)
{
    struct dw_target t;
    struct dw_msg *m = NULL;
    const char *f[3];
    long started = 0;
    int r = resolve(path, mode, &t);

    if (r < 0)
        return r;
    f[0] = "counts";
    f[1] = scope;
    f[2] = t.ipath;
    r = simple_call(t.mount, f, 3, &m);
    if (r == 0) {
        if (field_int(m, 0, &c->complete) < 0 || field_int(m, 1, &c->pending) < 0 ||
            field_int(m, 2, &c->deferred) < 0 || field_int(m, 3, &c->failed) < 0 ||
            field_int(m, 4, &started) < 0)
            r = -EPROTO;
        else if (!started)
            r = target_exists(&t) ? -EINVAL : -ENOENT; /* no stage ever started there */
    }
    msg_free(m);
    target_free(&t);
    return r;
}

static void put_counts(const struct counts *c, int *complete, int *pending, int *deferred,
                       int *failed)
{
    if (complete)
        *complete = clamp_int(c->complete);
    if (pending)
        *pending = clamp_int(c->pending);
    if (deferred)
        *deferred = clamp_int(c->deferred);
    if (failed)
        *failed = clamp_int(c->failed);
}

int dw_query_file_stage(const char *dw_file_path, int *complete, int *pending, int *deferred,
                        int *failed)
{
    struct counts c;
    int r = counts_of(dw_file_path, "file", RESOLVE_LEAF, &c);
    if (r == 0)
        put_counts(&c, complete, pending, deferred, failed);
    return r;
}

int dw_query_directory_stage(const char *dw_directory_path, int *complete, int *pending,
                             int *deferred, int *failed)
{
    struct counts c;
    int r = counts_of(dw_directory_path, "tree", RESOLVE_EXISTING, &c);
    if (r == 0)
        put_counts(&c, complete, pending, deferred, failed);
    return r;
}

int dw_query_list_stage(const char **dw_list_path, int *complete, int *pending, int *deferred,
                        int *failed)
{
    struct counts sum = {0, 0, 0, 0}, c;
    int i, r;

    if (!dw_list_path || !dw_list_path[0])
        return -EINVAL;
    for (i = 0; dw_list_path[i]; i++) {
        r = counts_of(dw_list_path[i], "file", RESOLVE_LEAF, &c);
        if (r < 0)
            return r;
        sum.complete += c.complete;
        sum.pending += c.pending;
        sum.deferred += c.deferred;
        sum.failed += c.failed;
    }
    put_counts(&sum, complete, pending, deferred, failed);
    return 0;
}

/* Sleep `ms` in all. A caught signal's handler runs when the signal comes (nanosleep
 * returns EINTR after it); the sleep then goes on for what is left. */
static void pause_ms(long ms)
{
    struct timespec ts, rem;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;
    while (nanosleep(&ts, &rem) < 0 && errno == EINTR)
        ts = rem;
}

/* Wait until nothing is pending at `path`. Signals do not interrupt it (DataWarp's
 * rule): their handlers run while it sleeps between polls (SPW_WAIT_MS), and it goes on. */
static int wait_path(const char *path, const char *scope, enum resolve_mode mode)
{
    struct dw_target t;
    const char *f[4];
    long pause = SPW_POLL_FIRST_MS;
    int r = resolve(path, mode, &t);

    if (r < 0)
        return r;
    f[0] = "wait";
    f[1] = scope;
    f[2] = t.ipath;
    f[3] = SPW_WAIT_MS;
    for (;;) {
        r = simple_call(t.mount, f, 4, NULL);
        if (r != -EAGAIN && r != -EINTR)
            break;
        /* Still pending (or the client is busy): sleep where signals reach us. */
        pause_ms(pause);
        pause = pause * 2 > SPW_POLL_MAX_MS ? SPW_POLL_MAX_MS : pause * 2;
    }
    if (r == -EINVAL && !target_exists(&t))
        r = -ENOENT;
    target_free(&t);
    return r;
}

int dw_wait_file_stage(const char *dw_file_path)
{
    return wait_path(dw_file_path, "file", RESOLVE_LEAF);
}

int dw_wait_directory_stage(const char *dw_directory_path)
{
    return wait_path(dw_directory_path, "tree", RESOLVE_EXISTING);
}

static int wait_file(const char *p)
{
    return dw_wait_file_stage(p);
}

int dw_wait_list_stage(const char **dw_list)
{
    int i, r;
    if (!dw_list || !dw_list[0])
        return -EINVAL;
    for (i = 0; dw_list[i]; i++) {
        r = wait_file(dw_list[i]);
        if (r < 0)
            return r;
    }
    return 0;
}

int dw_terminate_file_stage(const char *dw_file_path)
{
    return act_one("terminate", "file", dw_file_path, RESOLVE_LEAF);
}

int dw_terminate_directory_stage(const char *dw_directory_path)
{
    return act_one("terminate", "tree", dw_directory_path, RESOLVE_EXISTING);
}

static int terminate_file(const char *p)
{
    return dw_terminate_file_stage(p);
}

int dw_terminate_list_stage(const char **dw_list)
{
    return each(dw_list, terminate_file);
}

/* ------------------------------------------------------------------ failed stages */

struct dw_failed_stage_state {
    pthread_mutex_t lock;
    char *mount;
    struct dw_msg *page; /* the last answer: more, then (path, errno) pairs */
    int next;            /* index of the next pair's path in page->fields */
    int more;            /* the manager holds more after this page */
    char *cursor;        /* the last path of the page (the next page's `after`) */
};

static int fetch_page(dw_failed_stage_t *h)
{
    struct dw_msg *m;
    const char *f[2];
    long more;
    int r;

    f[0] = "failures";
    f[1] = h->cursor ? h->cursor : "";
    m = NULL;
    r = simple_call(h->mount, f, 2, &m);
    if (r < 0)
        return r;
    if (field_int(m, 0, &more) < 0 || (m->nfields - 1) % 2 != 0) {
        msg_free(m);
        return -EPROTO;
    }
    msg_free(h->page);
    h->page = m;
    h->more = more != 0;
    h->next = 1;
    if (m->nfields > 1) {
        char *c = strdup(m->fields[m->nfields - 2]);
        if (!c)
            return -ENOMEM;
        free(h->cursor);
        h->cursor = c;
    }
    return 0;
}

static void failed_free(dw_failed_stage_t *h)
{
    pthread_mutex_destroy(&h->lock);
    msg_free(h->page);
    free(h->mount);
    free(h->cursor);
    free(h);
}

int dw_open_failed_stage(const char *dw_instance_path, dw_failed_stage_t **handle)
{
    struct dw_target t;
    dw_failed_stage_t *h;
    int r;

    if (!handle)
        return -EINVAL;
    *handle = NULL;
    r = resolve(dw_instance_path, RESOLVE_EXISTING, &t);
    if (r < 0)
        return r;
    h = calloc(1, sizeof(*h));
    if (!h) {
        target_free(&t);
        return -ENOMEM;
    }
    if (pthread_mutex_init(&h->lock, NULL) != 0) {
        free(h);
        target_free(&t);
        return -ENOMEM;
    }
    h->mount = t.mount;
    t.mount = NULL;
    target_free(&t);
    r = fetch_page(h);
    if (r < 0) {
        failed_free(h);
        return r;
    }
    *handle = h;
    return 0;
}

int dw_read_failed_stage(dw_failed_stage_t *handle, char *path, int path_size, int *ret_errno)
{
    const char *ip;
    long e;
    size_t n, nm;
    int r;

    if (!handle || !path || path_size <= 0 || !ret_errno)
        return -EINVAL;
    pthread_mutex_lock(&handle->lock);
    while (handle->next >= handle->page->nfields) {
        if (!handle->more) {
            pthread_mutex_unlock(&handle->lock);
            return 0;
        }
        r = fetch_page(handle);
        if (r < 0) {
            pthread_mutex_unlock(&handle->lock);
            return r;
        }
        if (handle->page->nfields <= 1 && handle->more) {
            /* An empty page that claims more would never end: treat it as the end. */
            handle->more = 0;
        }
    }
    ip = handle->page->fields[handle->next];
    if (field_int(handle->page, handle->next + 1, &e) < 0) {
        pthread_mutex_unlock(&handle->lock);
        return -EPROTO;
    }
    /* The path as the caller sees it: the mount point, then the instance path. */
    nm = strcmp(handle->mount, "/") == 0 ? 0 : strlen(handle->mount);
    n = nm + (strcmp(ip, "/") == 0 && nm > 0 ? 0 : strlen(ip));
    if (n + 1 > (size_t)path_size || n > INT_MAX) {
        pthread_mutex_unlock(&handle->lock);
        return -ERANGE; /* nothing consumed: call again with a larger buffer */
    }
    memcpy(path, handle->mount, nm);
    memcpy(path + nm, ip, n - nm);
    path[n] = '\0';
    *ret_errno = clamp_int(e < 0 ? e : -e);
    handle->next += 2;
    pthread_mutex_unlock(&handle->lock);
    return (int)n;
}

int dw_close_failed_stage(dw_failed_stage_t *handle)
{
    if (!handle)
        return -EINVAL;
    failed_free(handle);
    return 0;
}

/* ------------------------------------------------------------------ stripes */

static int get_xattr_text(int fd, const char *name, char *buf, size_t cap)
{
    ssize_t n = fgetxattr(fd, name, buf, cap - 1);
    if (n < 0)
        return errno == ERANGE ? -EPROTO : -errno;
    buf[n] = '\0';
    return 0;
}

static int get_xattr_num(int fd, const char *name, long *out)
{
    char buf[64], *end;
    int r = get_xattr_text(fd, name, buf, sizeof(buf));
    if (r < 0)
        return r;
    errno = 0;
    *out = strtol(buf, &end, 10);
    if (errno || end == buf)
        return -EPROTO;
    return 0;
}

/* The integer after `"key":` in a flat JSON object; -1 if missing. */
static long json_int(const char *json, const char *key)
{
    char pat[64];
    const char *p;
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    p = strstr(json, pat);
    if (!p)
        return -1;
    p += strlen(pat);
    while (*p == ' ')
        p++;
    if (*p < '0' || *p > '9')
        return -1;
    return strtol(p, NULL, 10);
}

int dw_get_stripe_configuration(int fd, int *stripe_size, int *stripe_width,
                                int *starting_index)
{
    long size, width, start;
    char *layout;
    ssize_t n;
    int r = fd_on_spillway(fd);

    if (r < 0)
        return r;
    r = get_xattr_num(fd, SPW_XATTR_SIZE, &size);
    if (r == 0)
        r = get_xattr_num(fd, SPW_XATTR_WIDTH, &width);
    if (r < 0)
        return r;
    n = fgetxattr(fd, SPW_XATTR_LAYOUT, NULL, 0);
    if (n < 0)
        return -errno;
    layout = malloc((size_t)n + 1);
    if (!layout)
        return -ENOMEM;
    n = fgetxattr(fd, SPW_XATTR_LAYOUT, layout, (size_t)n);
    if (n < 0) {
        r = -errno;
        free(layout);
        return r;
    }
    layout[n] = '\0';
    start = json_int(layout, "start");
    /* Width 0 is "every server": the layout says how many that is. */
    if (width <= 0)
        width = json_int(layout, "stripe_width");
    if (size <= 0)
        size = json_int(layout, "stripe_size");
    free(layout);
    if (start < 0 || width <= 0 || size <= 0)
        return -EPROTO;
    if (stripe_size)
        *stripe_size = clamp_int(size);
    if (stripe_width)
        *stripe_width = clamp_int(width);
    if (starting_index)
        *starting_index = clamp_int(start);
    return 0;
}

int dw_set_stripe_configuration(int fd, int stripe_size, int stripe_width)
{
    char buf[32];
    int r;

    if (stripe_size <= 0 || stripe_size % 4096 != 0 || stripe_width < 1)
        return -EINVAL;
    r = fd_on_spillway(fd);
    if (r < 0)
        return r;
    snprintf(buf, sizeof(buf), "%d", stripe_size);
    if (fsetxattr(fd, SPW_XATTR_SIZE, buf, strlen(buf), 0) < 0)
        return -errno;
    snprintf(buf, sizeof(buf), "%d", stripe_width);
    if (fsetxattr(fd, SPW_XATTR_WIDTH, buf, strlen(buf), 0) < 0)
        return -errno;
    return 0;
}

/* ------------------------------------------------------------------ the rest */

char *dw_get_mds_path(const char *dw_root, uint64_t key)
{
    struct dw_target t;
    char *s;
    int r;

    (void)key; /* every server holds metadata already: names are spread by hash */
    r = resolve(dw_root, RESOLVE_EXISTING, &t);
    if (r < 0) {
        errno = -r;
        return NULL;
    }
    target_free(&t);
    s = strdup(dw_root);
    if (!s)
        errno = ENOMEM;
    return s;
}

char *dw_get_accounting_data_json(const char *path, int *ecode)
{
    struct dw_target t;
    struct dw_msg *m;
    char *json = NULL;
    int fd, r;

    r = resolve(path, RESOLVE_EXISTING, &t);
    if (r < 0)
        goto out;
    m = msg_new();
    if (!m) {
        r = -ENOMEM;
        target_free(&t);
        goto out;
    }
    msg_add(m, "accounting");
    /* On the path itself: its stripe geometry goes into the answer. A path the
     * caller cannot open reports the mount root's. */
    fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd >= 0) {
        r = msg_call_fd(m, fd);
        close(fd);
    } else {
        r = msg_call(m, t.mount);
    }
    target_free(&t);
    if (r == 0) {
        if (m->nfields < 1)
            r = -EPROTO;
        else if (!(json = strdup(m->fields[0])))
            r = -ENOMEM;
    }
    msg_free(m);
out:
    if (ecode)
        *ecode = r;
    return json;
}

int dw_wait_sync_complete(int fd)
{
    int r = fd_on_spillway(fd);

    if (r < 0)
        return r;
    /* The mount answers this virtual attribute once the file's changes are on the
     * PFS (a cache instance's; docs/cache.md); a scratch instance has no cache to
     * write back and answers EOPNOTSUPP. */
    if (fsetxattr(fd, SPW_XATTR_SYNC, "1", 1, 0) < 0)
        return errno == EOPNOTSUPP ? -ENOTSUP : -errno;
    return 0;
}
