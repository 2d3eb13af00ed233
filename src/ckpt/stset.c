/*
 * Streaming safetensors sets (stset.h): the hub split, the headers and every tensor's place
 * are fixed at open, bytes arrive by pwrite in any order, commit puts the files in place.
 * Invariant: every new file is complete (fsynced, renamed) before the index naming it is
 * written, and stale files of an earlier save are deleted only after both.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fs.h"
#include "ckpt/stset.h"
#include "ckpt/verify.h"
#include "core/internal.h"

/* Is `name` "<prefix>-NNNNN-of-NNNNN.safetensors"? */
static int is_shard_name(const char *name, const char *prefix)
{
    size_t pl = strlen(prefix);
    if (strncmp(name, prefix, pl) != 0) {
        return 0;
    }
    const char *p = name + pl;
    static const char pattern[] = "-#####-of-#####.safetensors";
    for (size_t i = 0; i < sizeof pattern - 1; i++) {
        if (pattern[i] == '#' ? !isdigit((unsigned char)p[i]) : p[i] != pattern[i]) {
            return 0;
        }
    }
    return p[sizeof pattern - 1] == '\0';
}

/* Deletes files of an earlier save that the new one does not contain. */
static accel_status remove_stale(const char *dir, const char *prefix, char **keep, size_t n_keep,
                                 int sharded)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        return accel__seterr(NULL, ACCEL_EIO, "cannot list %s: %s", dir, strerror(errno));
    }
    char single[300], index[320];
    snprintf(single, sizeof single, "%s.safetensors", prefix);
    snprintf(index, sizeof index, "%s.safetensors.index.json", prefix);
    accel_status st = ACCEL_OK;
    for (struct dirent *e; st == ACCEL_OK && (e = readdir(d)) != NULL;) {
        int stale = 0;
        if (is_shard_name(e->d_name, prefix)) {
            stale = 1;
            for (size_t i = 0; i < n_keep; i++) {
                stale &= strcmp(keep[i], e->d_name) != 0;
            }
        } else if (sharded) {
            /* A leftover single file would shadow the shards for loaders that look for it
             * first (transformers does). */
            stale = strcmp(e->d_name, single) == 0;
        } else {
            stale = strcmp(e->d_name, index) == 0;
        }
        if (stale) {
            char *p = accel__path_join(dir, e->d_name);
            st = p ? accel__rmtree(p) : ACCEL_ENOMEM;
            accel__free(p);
        }
    }
    closedir(d);
    return st;
}

static accel_status write_index(const char *dir, const char *prefix,
                                const accel_named_tensor *tensors, const size_t *shard_of, size_t n,
                                char **files, uint64_t total)
{
    json_t *root = json_object(), *meta = json_object(), *map = json_object();
    if (!root || !meta || !map) {
        json_decref(root);
        json_decref(meta);
        json_decref(map);
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    for (size_t i = 0; i < n; i++) {
        json_object_set_new(map, tensors[i].name, json_string(files[shard_of[i]]));
    }
    json_object_set_new(root, "metadata", meta);
    json_object_set_new(root, "weight_map", map);
    /* Python's json.dumps(indent=2, sort_keys=True) + "\n", as save_model writes it. */
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    char name[320];
    snprintf(name, sizeof name, "%s.safetensors.index.json", prefix);
    char *path = accel__path_join(dir, name);
    size_t tl = text ? strlen(text) : 0;
    char *buf = text ? accel__malloc(tl + 2) : NULL;
    accel_status st = (text && path && buf) ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "oom");
    if (st == ACCEL_OK) {
        memcpy(buf, text, tl);
        buf[tl] = '\n';
        st = accel__write_file_atomic(path, buf, tl + 1);
    }
    free(text);
    accel__free(buf);
    accel__free(path);
    return st;
}

/*
 * huggingface_hub's split, in the given tensor order: a tensor larger than the limit becomes a
 * shard of its own at once; otherwise the open shard is closed (numbered) when adding the
 * tensor would overflow it. Shard numbers follow the order shards are closed. Returns the
 * number of shards (at least 1: an empty set still writes one empty file).
 */
#define SHARD_PENDING SIZE_MAX
static size_t plan_shards(const accel_named_tensor *tensors, size_t n, uint64_t max,
                          size_t *shard_of, uint64_t *total)
{
    size_t n_shards = 0, open_start = 0;
    uint64_t open_nbytes = 0;
    int open_nonempty = 0;
    *total = 0;
    for (size_t i = 0; i <= n; i++) {
        uint64_t nb = i < n ? accel_tensor_nbytes(&tensors[i].tensor) : 0;
        *total += nb;
        if (i < n && nb > max) {
            shard_of[i] = n_shards++;
            continue;
        }
        if (open_nonempty && (i == n || open_nbytes + nb > max)) {
            for (size_t j = open_start; j < i; j++) {
                if (shard_of[j] == SHARD_PENDING) {
                    shard_of[j] = n_shards;
                }
            }
            n_shards++;
            open_nbytes = 0;
            open_nonempty = 0;
        }
        if (i < n) {
            if (!open_nonempty) {
                open_start = i;
            }
            shard_of[i] = SHARD_PENDING;
            open_nbytes += nb;
            open_nonempty = 1;
        }
    }
    return n_shards ? n_shards : 1;
}

struct accel__stset {
    char *dir;
    char prefix[224];
    const accel_named_tensor *tensors;
    size_t n;
    size_t n_files;
    size_t *file_of; /* per tensor: its file */
    uint64_t *start; /* per tensor: where its bytes start in its file */
    uint64_t total;  /* bytes of tensor data, for the index */
    char **names;    /* per file */
    accel__afile *files;
    accel__lockfile lock; /* "<dir>/.<prefix>.lock", open to commit: one writer of the set */
};

void accel__stset_abort(accel__stset *s)
{
    if (s == NULL) {
        return;
    }
    for (size_t f = 0; f < s->n_files; f++) {
        if (s->files != NULL) {
            accel__afile_abort(&s->files[f]);
        }
        if (s->names != NULL) {
            accel__free(s->names[f]);
        }
    }
    accel__lockfile_release(&s->lock);
    accel__free(s->files);
    accel__free(s->names);
    accel__free(s->file_of);
    accel__free(s->start);
    accel__free(s->dir);
    accel__free(s);
}

/* Opens file f of the set and writes its header. */
static accel_status open_file(accel__stset *s, size_t f, const accel_kv *metadata,
                              size_t n_metadata, accel_named_tensor *sel, size_t *idx)
{
    char name[320];
    if (s->n_files == 1) {
        snprintf(name, sizeof name, "%s.safetensors", s->prefix);
    } else {
        snprintf(name, sizeof name, "%s-%05zu-of-%05zu.safetensors", s->prefix, f + 1, s->n_files);
    }
    s->names[f] = accel__strdup(name);
    char *path = accel__path_join(s->dir, name);
    uint64_t *starts = accel__calloc(s->n + 1, sizeof(uint64_t));
    accel_status st = s->names[f] && path && starts ? ACCEL_OK : ACCEL_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->file_of[i] == f) {
            idx[k] = i;
            sel[k++] = s->tensors[i];
        }
    }
    char *header = NULL;
    size_t hlen = 0;
    if (st == ACCEL_OK) {
        st = accel__safetensors_header(path, sel, k, metadata, n_metadata, &header, &hlen, starts);
    }
    if (st == ACCEL_OK) {
        st = accel__afile_open(&s->files[f], path);
    }
    if (st == ACCEL_OK) {
        st = accel__write_all(s->files[f].fd, header, hlen, path);
        /* The file's final size up front: pieces may arrive in any order. */
        uint64_t end = hlen;
        for (size_t j = 0; j < k; j++) {
            s->start[idx[j]] = starts[j];
            uint64_t e = starts[j] + accel_tensor_nbytes(&sel[j].tensor);
            end = e > end ? e : end;
        }
        if (st == ACCEL_OK && ftruncate(s->files[f].fd, (off_t)end) != 0) {
            st = accel__seterr(NULL, ACCEL_EIO, "%s: %s", path, strerror(errno));
        }
    }
    if (st == ACCEL_ENOMEM) {
        accel__seterr(NULL, st, "out of memory writing %s", name);
    }
    accel__free(header);
    accel__free(starts);
    accel__free(path);
    return st;
}

accel_status accel__stset_open(accel__stset **out, const char *dir, const char *prefix,
                               const accel_named_tensor *tensors, size_t n,
                               const accel_kv *metadata, size_t n_metadata,
                               uint64_t max_shard_nbytes)
{
    prefix = prefix ? prefix : "model";
    if (prefix[0] == '\0' || strchr(prefix, '/') != NULL || strlen(prefix) > 200) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_save_sharded: bad prefix \"%s\"", prefix);
    }
    ACCEL_TRY(accel__mkdirs(dir));
    accel__stset *s = accel__calloc(1, sizeof(*s));
    if (s == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    snprintf(s->prefix, sizeof s->prefix, "%s", prefix);
    s->tensors = tensors;
    s->n = n;
    s->dir = accel__strdup(dir);
    s->file_of = accel__calloc(n ? n : 1, sizeof(size_t));
    s->start = accel__calloc(n ? n : 1, sizeof(uint64_t));
    accel_named_tensor *sel = accel__calloc(n ? n : 1, sizeof(*sel));
    size_t *idx = accel__calloc(n ? n : 1, sizeof(size_t));
    accel_status st = s->dir && s->file_of && s->start && sel && idx
                          ? ACCEL_OK
                          : accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    if (st == ACCEL_OK) {
        /* Two jobs saving into one folder at once: each one's stale-file removal deleted the
         * other's files (a sharded and a single-file save left neither), or their shards
         * mixed. The second is refused until the first has committed. Taken before anything
         * in the folder is looked at, so what is checked below stays true until the commit. */
        char lock[256];
        snprintf(lock, sizeof lock, ".%s.lock", prefix);
        char *path = accel__path_join(dir, lock);
        st = path ? accel__lockfile_take_named(&s->lock, path,
                                               ": two jobs must not save into the same folder "
                                               "at once: give each job its own",
                                               "%s: %s.safetensors files are being written by "
                                               "another process",
                                               dir, prefix)
                  : accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
        accel__free(path);
    }
    if (st == ACCEL_OK) {
        /* A save_state checkpoint lists its model files in its marker: replacing them (or, for
         * a sharded set, deleting model.safetensors as stale) would leave a checkpoint that no
         * longer verifies. merge-weights into its own checkpoint folder did exactly that. */
        char *marker = accel__path_join(dir, ACCEL__CKPT_MARKER);
        struct stat sb;
        if (marker == NULL) {
            st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
        } else if (lstat(marker, &sb) == 0) {
            st = accel__seterr(NULL, ACCEL_EINVAL,
                               "%s holds a save_state checkpoint (" ACCEL__CKPT_MARKER
                               "): writing %s files there would replace the checkpoint's own; "
                               "write into another folder",
                               dir, prefix);
        }
        accel__free(marker);
    }
    if (st == ACCEL_OK) {
        size_t n_files = plan_shards(tensors, n, max_shard_nbytes ? max_shard_nbytes : UINT64_MAX,
                                     s->file_of, &s->total);
        s->names = accel__calloc(n_files, sizeof(char *));
        s->files = accel__calloc(n_files, sizeof(accel__afile));
        st = s->names && s->files ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "oom");
        for (size_t f = 0; st == ACCEL_OK && f < n_files; f++) {
            s->files[f].fd = -1; /* not open: abort skips it */
        }
        s->n_files = st == ACCEL_OK ? n_files : 0;
        for (size_t f = 0; st == ACCEL_OK && f < n_files; f++) {
            st = open_file(s, f, metadata, n_metadata, sel, idx);
        }
    }
    accel__free(sel);
    accel__free(idx);
    if (st != ACCEL_OK) {
        accel__stset_abort(s);
        return st;
    }
    *out = s;
    return ACCEL_OK;
}

accel_status accel__stset_write(accel__stset *s, size_t i, uint64_t offset, const void *data,
                                size_t nbytes)
{
    accel__afile *f = &s->files[s->file_of[i]];
    ACCEL_ASSERT(offset + nbytes <= accel_tensor_nbytes(&s->tensors[i].tensor));
    const char *p = data;
    off_t at = (off_t)(s->start[i] + offset);
    while (nbytes > 0) {
        ssize_t w = pwrite(f->fd, p, nbytes, at);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return accel__seterr(NULL, ACCEL_EIO, "writing %s: %s", f->path,
                                 w < 0 ? strerror(errno) : "no progress");
        }
        p += w;
        at += w;
        nbytes -= (size_t)w;
    }
    return ACCEL_OK;
}

accel_status accel__stset_commit(accel__stset *s)
{
    accel_status st = ACCEL_OK;
    for (size_t f = 0; st == ACCEL_OK && f < s->n_files; f++) {
        st = accel__afile_commit(&s->files[f]);
    }
    if (st == ACCEL_OK && s->n_files > 1) {
        st = write_index(s->dir, s->prefix, s->tensors, s->file_of, s->n, s->names, s->total);
    }
    if (st == ACCEL_OK) {
        st = remove_stale(s->dir, s->prefix, s->names, s->n_files, s->n_files > 1);
    }
    if (st == ACCEL_OK) {
        st = accel__fsync_dir(s->dir);
    }
    accel__stset_abort(s); /* committed files are released already: only frees */
    return st;
}
