/*
 * Crash-safe files and checkpoint folders (see atomic.h for the protocol).
 *
 * Invariant: at every instant a complete checkpoint folder is either fully present under its
 * final name with a valid marker, or not present under that name at all. Nothing is deleted
 * before its replacement is durable (renamed and the parent fsynced).
 */
#include "ckpt/atomic.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fs.h"
#include "core/internal.h"

/* ---- checkpoint folders ---- */

/* "<parent>/.<name><suffix>" for a sibling of `dir`. */
static char *hidden_sibling(const char *dir, const char *suffix)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') {
        n--; /* "ckpt/" names the same folder as "ckpt" */
    }
    size_t cut = n;
    while (cut > 0 && dir[cut - 1] != '/') {
        cut--;
    }
    size_t total = n + strlen(suffix) + 2;
    char *p = accel__malloc(total);
    if (p == NULL) {
        accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
        return NULL;
    }
    snprintf(p, total, "%.*s.%.*s%s", (int)cut, dir, (int)(n - cut), dir + cut, suffix);
    return p;
}

accel_status accel__stage_init(accel__stage *s, const char *final_dir)
{
    s->final_dir = s->stage_dir = s->lock_path = NULL;
    memset(&s->lock, 0, sizeof s->lock);
    if (!accel__path_names_entry(final_dir)) {
        /* "", ".", ".." or "/": the staging sibling would be "..partial" in the working
         * folder, and no rename could put it in place. */
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "checkpoint folder \"%s\" names no folder that can be created "
                             "(give a path that ends in a name)",
                             final_dir);
    }
    s->final_dir = accel__strdup(final_dir);
    s->stage_dir = hidden_sibling(final_dir, ".partial");
    s->lock_path = hidden_sibling(final_dir, ".lock");
    if (s->final_dir == NULL || s->stage_dir == NULL || s->lock_path == NULL) {
        accel__stage_release(s);
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    return ACCEL_OK;
}

void accel__stage_release(accel__stage *s)
{
    accel__stage_unlock(s);
    accel__free(s->final_dir);
    accel__free(s->stage_dir);
    accel__free(s->lock_path);
    s->final_dir = s->stage_dir = s->lock_path = NULL;
}

/* ---- the save lock ---- */

accel_status accel__stage_lock(accel__stage *s)
{
    if (s->lock.held) {
        return ACCEL_OK;
    }
    /* The parent folder must exist to hold the lock file; the staging folder needs it too. */
    const char *slash = strrchr(s->lock_path, '/');
    if (slash != NULL && slash != s->lock_path) {
        char *parent = accel__strdup(s->lock_path);
        if (parent == NULL) {
            return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
        }
        parent[slash - s->lock_path] = '\0';
        accel_status st = accel__mkdirs(parent);
        accel__free(parent);
        ACCEL_TRY(st);
    }
    return accel__lockfile_take_named(&s->lock, s->lock_path,
                                      ": two jobs must not save into the same folder: give each "
                                      "job its own project_dir or checkpoint folder",
                                      "checkpoint folder %s is being saved by another process",
                                      s->final_dir);
}

void accel__stage_unlock(accel__stage *s)
{
    accel__lockfile_release(&s->lock);
}

accel_status accel__stage_create(const accel__stage *s)
{
    if (accel__is_dir(s->stage_dir)) {
        /* Under the save lock nobody else is building it: an interrupted save's leftover. */
        accel__log(NULL, ACCEL__LOG_WARN,
                   "removing %s, left by an interrupted save of %s (a killed process or "
                   "machine)",
                   s->stage_dir, s->final_dir);
    }
    ACCEL_TRY(accel__rmtree(s->stage_dir));
    /* The parent exists: accel__stage_lock made it to hold the lock file. */
    if (mkdir(s->stage_dir, 0777) != 0) {
        return accel__seterr(NULL, ACCEL_EIO, "cannot create the staging folder %s: %s",
                             s->stage_dir, strerror(errno));
    }
    return accel__fsync_parent(s->stage_dir);
}

void accel__stage_discard(const accel__stage *s)
{
    (void)accel__rmtree(s->stage_dir);
}

accel_status accel__stage_commit(const accel__stage *s, const char *extra)
{
    char *text = NULL;
    ACCEL_TRY(accel__ckpt_marker_build(s->stage_dir, extra, &text));
    char *mpath = accel__path_join(s->stage_dir, ACCEL__CKPT_MARKER);
    accel_status st = mpath ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "oom");
    if (st == ACCEL_OK) {
        st = accel__write_file_atomic(mpath, text, strlen(text));
    }
    free(text); /* json_dumps allocates with jansson's allocator (malloc) */
    accel__free(mpath);
    ACCEL_TRY(st);
    ACCEL_TRY(accel__fsync_dir(s->stage_dir));

    if (!accel__is_dir(s->final_dir)) {
        if (rename(s->stage_dir, s->final_dir) != 0) {
            return accel__seterr(NULL, ACCEL_EIO, "cannot rename %s to %s: %s", s->stage_dir,
                                 s->final_dir, strerror(errno));
        }
        return accel__fsync_parent(s->final_dir);
    }
    /* Replacing an older folder: swap the two atomically, so the name never goes missing, then
     * remove the old content (now under the staging name). */
    if (renameat2(AT_FDCWD, s->stage_dir, AT_FDCWD, s->final_dir, RENAME_EXCHANGE) == 0) {
        ACCEL_TRY(accel__fsync_parent(s->final_dir));
        return accel__rmtree(s->stage_dir);
    }
    if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
        return accel__seterr(NULL, ACCEL_EIO, "cannot exchange %s and %s: %s", s->stage_dir,
                             s->final_dir, strerror(errno));
    }
    /* The file system has no exchange: move the old folder aside first. A crash between the
     * two renames leaves the old folder complete under ".<name>.old" and the new one under the
     * staging name; neither is lost. */
    accel__log(NULL, ACCEL__LOG_DEBUG, "renameat2(RENAME_EXCHANGE) unsupported for %s; two renames",
               s->final_dir);
    char *old = hidden_sibling(s->final_dir, ".old");
    if (old == NULL) {
        return ACCEL_ENOMEM;
    }
    st = accel__rmtree(old);
    if (st == ACCEL_OK && rename(s->final_dir, old) != 0) {
        st = accel__seterr(NULL, ACCEL_EIO, "cannot move %s aside: %s", s->final_dir,
                           strerror(errno));
    }
    if (st == ACCEL_OK && rename(s->stage_dir, s->final_dir) != 0) {
        st = accel__seterr(NULL, ACCEL_EIO, "cannot rename %s to %s: %s", s->stage_dir,
                           s->final_dir, strerror(errno));
    }
    if (st == ACCEL_OK) {
        st = accel__fsync_parent(s->final_dir);
    }
    if (st == ACCEL_OK) {
        st = accel__rmtree(old);
    }
    accel__free(old);
    return st;
}

int accel__ckpt_parse_name(const char *name, int64_t *n)
{
    static const char prefix[] = "checkpoint_";
    if (strncmp(name, prefix, sizeof prefix - 1) != 0) {
        return 0;
    }
    const char *d = name + sizeof prefix - 1;
    /* No leading zeros: the name must be the one "checkpoint_%lld" produces. */
    if (*d == '\0' || strlen(d) > 18 || (d[0] == '0' && d[1] != '\0')) {
        return 0;
    }
    int64_t v = 0;
    for (; *d; d++) {
        if (*d < '0' || *d > '9') {
            return 0;
        }
        v = v * 10 + (*d - '0');
    }
    *n = v;
    return 1;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The "checkpoint_<n>" folders of base, ascending; only complete ones with complete_only. */
static accel_status list_folders(const char *base, int complete_only, int64_t **iters,
                                 size_t *count)
{
    *iters = NULL;
    *count = 0;
    DIR *d = opendir(base);
    if (d == NULL) {
        return errno == ENOENT
                   ? ACCEL_OK
                   : accel__seterr(NULL, ACCEL_EIO, "cannot list %s: %s", base, strerror(errno));
    }
    size_t n = 0, cap = 0;
    int64_t *v = NULL;
    accel_status st = ACCEL_OK;
    for (struct dirent *e; st == ACCEL_OK && (e = readdir(d)) != NULL;) {
        int64_t it;
        if (!accel__ckpt_parse_name(e->d_name, &it)) {
            continue;
        }
        char *p = accel__path_join(base, e->d_name);
        if (p == NULL) {
            st = ACCEL_ENOMEM;
            break;
        }
        int keep = complete_only ? accel__ckpt_check_complete(p) == ACCEL_OK : accel__is_dir(p);
        accel__free(p);
        if (!keep) {
            continue;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            int64_t *nv = accel__realloc(v, cap * sizeof *v);
            if (nv == NULL) {
                st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory listing %s", base);
                break;
            }
            v = nv;
        }
        v[n++] = it;
    }
    closedir(d);
    if (st != ACCEL_OK) {
        accel__free(v);
        return st;
    }
    if (n > 1) {
        qsort(v, n, sizeof *v, cmp_i64); /* v is NULL when n is 0 */
    }
    *iters = v;
    *count = n;
    return ACCEL_OK;
}

accel_status accel__ckpt_list(const char *base, int64_t **iters, size_t *count)
{
    return list_folders(base, 1, iters, count);
}

accel_status accel__ckpt_list_all(const char *base, int64_t **iters, size_t *count)
{
    return list_folders(base, 0, iters, count);
}

/* Renames `dir` to its hidden ".deleting" sibling (durably), then removes it. */
static accel_status delete_checkpoint(const char *dir)
{
    char *gone = hidden_sibling(dir, ".deleting");
    if (gone == NULL) {
        return ACCEL_ENOMEM;
    }
    accel_status st = accel__rmtree(gone);
    if (st == ACCEL_OK && rename(dir, gone) != 0) {
        if (errno == ENOENT) {
            /* Another job rotating this folder deleted it a moment ago: nothing left to do,
             * and failing here would fail a save whose checkpoint is already in place. */
            accel__free(gone);
            return ACCEL_OK;
        }
        st = accel__seterr(NULL, ACCEL_EIO, "cannot rename %s for deletion: %s", dir,
                           strerror(errno));
    }
    if (st == ACCEL_OK) {
        st = accel__fsync_parent(dir);
    }
    if (st == ACCEL_OK) {
        st = accel__rmtree(gone);
    }
    accel__free(gone);
    return st;
}

accel_status accel__ckpt_rotate(const char *base, int total_limit)
{
    return accel__ckpt_rotate_keep(base, total_limit, -1);
}

accel_status accel__ckpt_rotate_keep(const char *base, int total_limit, int64_t keep)
{
    /* Leftovers of deletions interrupted by a crash are garbage whatever the limit. */
    DIR *d = opendir(base);
    if (d != NULL) {
        accel_status st = ACCEL_OK;
        for (struct dirent *e; st == ACCEL_OK && (e = readdir(d)) != NULL;) {
            size_t n = strlen(e->d_name);
            if (e->d_name[0] == '.' && n > 9 && strcmp(e->d_name + n - 9, ".deleting") == 0) {
                char *p = accel__path_join(base, e->d_name);
                st = p ? accel__rmtree(p) : ACCEL_ENOMEM;
                accel__free(p);
            }
        }
        closedir(d);
        ACCEL_TRY(st);
    }
    if (total_limit <= 0) {
        return ACCEL_OK;
    }
    int64_t *its = NULL;
    size_t n = 0;
    ACCEL_TRY(accel__ckpt_list(base, &its, &n));
    /* The checkpoint just written counts toward the limit but is never a candidate, even when
     * a reset counter gave it a lower number than older ones. */
    size_t w = 0;
    int kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (its[i] == keep) {
            kept = 1;
        } else {
            its[w++] = its[i];
        }
    }
    n = w;
    size_t limit = (size_t)total_limit - (size_t)kept;
    accel_status st = ACCEL_OK;
    /* Oldest first; the loop bound keeps the newest `limit` others (at least the newest one). */
    for (size_t i = 0; st == ACCEL_OK && i + limit < n; i++) {
        char name[48];
        snprintf(name, sizeof name, "checkpoint_%lld", (long long)its[i]);
        char *p = accel__path_join(base, name);
        st = p ? delete_checkpoint(p) : ACCEL_ENOMEM;
        accel__free(p);
    }
    accel__free(its);
    return st;
}
