/*
 * accel_merge_weights: a save_state folder's model weights consolidated offline into what
 * accel_save_model writes. The output's files, headers and tensor places are fixed up front
 * (stset.c), then every saved piece is copied from its mapped shard to its place: memory use
 * is independent of the model's size. Invariant: the checkpoint is verified before any byte
 * is read, and removed (when asked) only after the output is durably in place.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/fs.h"
#include "ckpt/state.h"
#include "ckpt/stset.h"
#include "ckpt/verify.h"

typedef struct piece_ctx {
    accel__stset *set;
    size_t tensor;
    size_t elem_nbytes;
} piece_ctx;

static accel_status put_piece(void *ctx, int64_t offset, const void *data, int64_t count)
{
    const piece_ctx *x = ctx;
    return accel__stset_write(x->set, x->tensor, (uint64_t)offset * x->elem_nbytes, data,
                              (size_t)count * x->elem_nbytes);
}

/* From a sharded model: in the order the model put its parameters (registration order, as
 * accel_save_model splits shards). */
static accel_status merge_sharded(const char *dir, const accel__ckpt_marker *marker,
                                  const char *out, uint64_t max)
{
    accel__state_file f;
    memset(&f, 0, sizeof(f));
    accel_status st = accel__state_shard_open(&f, dir, "model", NULL, marker);
    size_t n = st == ACCEL_OK ? accel__state_shard_n_tensors(f.sh) : 0;
    accel_named_tensor *ts = accel__calloc(n + 1, sizeof(*ts));
    if (st == ACCEL_OK && ts == NULL) {
        st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    for (size_t i = 0; st == ACCEL_OK && i < n; i++) {
        ts[i] = accel__state_shard_desc(f.sh, i);
    }
    accel__stset *set = NULL;
    const accel_kv meta[] = {{"format", "pt"}};
    if (st == ACCEL_OK) {
        st = accel__stset_open(&set, out, "model", ts, n, meta, 1, max);
    }
    for (size_t i = 0; st == ACCEL_OK && i < n; i++) {
        piece_ctx x = {set, i, accel_dtype_nbytes(ts[i].tensor.dtype)};
        st = accel__state_shard_pieces(f.sh, i, put_piece, &x);
    }
    if (set != NULL) {
        st = st == ACCEL_OK ? accel__stset_commit(set) : (accel__stset_abort(set), st);
    }
    accel__free(ts);
    accel__state_file_close(&f);
    return st;
}

/* From a model saved whole (stage 0): its tensors in file order, copied from the mapping. */
static accel_status merge_whole(const char *dir, const char *out, uint64_t max)
{
    char *path = accel__path_join(dir, "model.safetensors");
    accel_safetensors *src = NULL;
    accel_status st = path ? accel_safetensors_open(&src, path) : ACCEL_ENOMEM;
    accel__free(path);
    size_t n = st == ACCEL_OK ? accel_safetensors_count(src) : 0;
    accel_named_tensor *ts = accel__calloc(n + 1, sizeof(*ts));
    if (st == ACCEL_OK && ts == NULL) {
        st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    for (size_t i = 0; st == ACCEL_OK && i < n; i++) {
        ts[i].name = accel_safetensors_name(src, i);
        st = accel_safetensors_tensor(src, i, &ts[i].tensor);
    }
    if (st == ACCEL_OK) {
        const accel_kv meta[] = {{"format", "pt"}};
        st = accel_save_sharded(out, "model", ts, n, meta, 1, max);
    }
    accel__free(ts);
    accel_safetensors_close(src);
    return st;
}

/* `path` resolved; a path that does not exist yet resolves through its parent folder. */
static int resolve(const char *path, char *out)
{
    if (realpath(path, out) != NULL) {
        return 1;
    }
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", path);
    size_t n = strlen(parent);
    while (n > 1 && parent[n - 1] == '/') {
        parent[--n] = '\0';
    }
    char *slash = strrchr(parent, '/');
    const char *base = slash ? slash + 1 : parent, *folder = ".";
    if (slash == parent) {
        folder = "/";
    } else if (slash != NULL) {
        *slash = '\0';
        folder = parent;
    }
    char dir[PATH_MAX];
    if (realpath(folder, dir) == NULL) {
        return 0;
    }
    return snprintf(out, PATH_MAX, "%s/%s", dir, base) < PATH_MAX;
}

/* 1 when `inner` is `outer` or lies inside it. */
static int inside(const char *outer, const char *inner)
{
    char a[PATH_MAX], b[PATH_MAX];
    if (!resolve(outer, a) || !resolve(inner, b)) {
        return 0;
    }
    size_t n = strlen(a);
    return strncmp(a, b, n) == 0 && (b[n] == '\0' || b[n] == '/');
}

accel_status accel_merge_weights(const char *checkpoint_dir, const char *output_dir,
                                 const char *max_shard_size, int flags)
{
    static const char *who = "accel_merge_weights";
    if (checkpoint_dir == NULL || output_dir == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: %s is NULL", who,
                             checkpoint_dir ? "output_dir" : "checkpoint_dir");
    }
    if (flags & ACCEL_MERGE_UNSAFE_SERIALIZATION) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "%s: --unsafe_serialization asks for pytorch_model.bin, a torch "
                             "pickle, which accel does not write; without the flag the output "
                             "is model.safetensors, which PyTorch and transformers load",
                             who);
    }
    uint64_t max = 0;
    ACCEL_TRY(accel_parse_size(max_shard_size ? max_shard_size : "10GB", &max));
    struct stat sb;
    if (stat(checkpoint_dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        /* "does not exist" would send the user looking for a file that is right there. */
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: checkpoint folder %s is %s, not a folder",
                             who, checkpoint_dir, accel__file_kind(sb.st_mode));
    }
    if (!accel__is_dir(checkpoint_dir)) {
        return accel__seterr(NULL, ACCEL_ENOTFOUND, "%s: checkpoint folder %s does not exist", who,
                             checkpoint_dir);
    }
    accel__ckpt_marker marker;
    memset(&marker, 0, sizeof(marker));
    accel_status st = accel__ckpt_verify(checkpoint_dir, 0, 1, &marker);
    accel__state_info info;
    if (st == ACCEL_OK) {
        st = accel__state_info_read(checkpoint_dir, &info);
    }
    if (st == ACCEL_OK && info.n[ACCEL__OBJ_MODEL] < 1) {
        st = accel__seterr(NULL, ACCEL_EINVAL, "%s: checkpoint %s holds no model", who,
                           checkpoint_dir);
    }
    if (st == ACCEL_OK && (flags & ACCEL_MERGE_REMOVE_CHECKPOINT_DIR) &&
        inside(checkpoint_dir, output_dir)) {
        st = accel__seterr(NULL, ACCEL_EINVAL,
                           "%s: the output %s lies inside the checkpoint %s, which "
                           "--remove_checkpoint_dir would delete",
                           who, output_dir, checkpoint_dir);
    }
    if (st == ACCEL_OK) {
        if (accel__ckpt_marker_find(&marker, "model.index.json") != NULL) {
            st = merge_sharded(checkpoint_dir, &marker, output_dir, max);
        } else if (accel__ckpt_marker_find(&marker, "model.safetensors") != NULL) {
            st = merge_whole(checkpoint_dir, output_dir, max);
        } else {
            st = accel__seterr(NULL, ACCEL_ECORRUPT,
                               "%s: checkpoint %s lists neither model.index.json nor "
                               "model.safetensors",
                               who, checkpoint_dir);
        }
    }
    accel__ckpt_marker_release(&marker);
    /* The output is fsynced and renamed into place (and its folder fsynced) by now. */
    if (st == ACCEL_OK && (flags & ACCEL_MERGE_REMOVE_CHECKPOINT_DIR)) {
        st = accel__rmtree(checkpoint_dir);
        if (st == ACCEL_OK) {
            st = accel__fsync_parent(checkpoint_dir);
        }
    }
    return st;
}
