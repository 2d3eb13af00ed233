/*
 * Helper for tests/ckpt/test_sharded_state.sh: a model-like object whose weights are sharded
 * over the processes as ZeRO shards them (src/train/flat.h geometry, each process holding only
 * its pieces), saved and loaded through the state protocol, with a registered object holding
 * the "generation" the weights were filled for. Parameters have odd sizes and buckets hold one
 * to a few parameters.
 *   shard_probe save DIR STAGE GEN     fill generation GEN, save_state DIR
 *   shard_probe load DIR STAGE         load_state DIR, check the weights, print the generation
 *   shard_probe loop PROJECT STAGE     save generations 1, 2, ... with automatic naming and
 *                                      total_limit 2 until killed; prints "saved G" after each
 *   shard_probe newest PROJECT STAGE   load the newest checkpoint, check, print the generation
 * STAGE 0: every process holds every weight (saved whole by the main process); 1: sharded.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/state.h"
#include "core/internal.h"
#include "train/flat.h"

#define N_PARAMS 5
static const char *const names[N_PARAMS] = {"embed.weight", "h.0.w", "h.0.b", "h.1.w", "head"};
static const int64_t shapes[N_PARAMS][2] = {{7, 5}, {13, 1}, {1, 1}, {3, 11}, {33, 1}};
static const int ndims[N_PARAMS] = {2, 1, 1, 2, 1};

typedef struct probe_model {
    accel__object obj;
    int sharded, rank;
    accel__flat flat;
    size_t offset[N_PARAMS];
    int bucket[N_PARAMS];
    size_t numel[N_PARAMS];
    float *buf; /* the shard (sharded) or every weight (flat layout) */
} probe_model;

static int64_t gen_saved; /* the registered object */

/* The part of parameter i this process holds: element offset in the parameter, count, and
 * where it is in buf. */
static int64_t part(const probe_model *m, int i, int64_t *count, size_t *at)
{
    if (!m->sharded) {
        *count = (int64_t)m->numel[i];
        *at = m->offset[i];
        return 0;
    }
    size_t off, cnt;
    accel__flat_piece(&m->flat, m->bucket[i], m->rank, &off, &cnt);
    size_t lo = off > m->offset[i] ? off : m->offset[i];
    size_t hi = off + cnt < m->offset[i] + m->numel[i] ? off + cnt : m->offset[i] + m->numel[i];
    *count = lo < hi ? (int64_t)(hi - lo) : 0;
    int r;
    accel__flat_to_shard(&m->flat, lo < hi ? lo : off, &r, at);
    return lo < hi ? (int64_t)(lo - m->offset[i]) : 0;
}

static float value(int64_t gen, int i, int64_t e)
{
    return (float)(gen * 100000 + i * 1000 + e);
}

static accel__state_piece whole_of(int i, int64_t offset)
{
    accel__state_piece w = {ndims[i], {shapes[i][0], shapes[i][1]}, offset};
    return w;
}

static accel_status probe_save(accel__object *self, accel__state_writer *w)
{
    probe_model *m = (probe_model *)self;
    for (int i = 0; i < N_PARAMS; i++) {
        int64_t cnt;
        size_t at;
        int64_t e0 = part(m, i, &cnt, &at);
        accel__state_piece whole = whole_of(i, e0);
        accel_tensor v = accel_tensor_view(m->buf + at, ACCEL_F32, 1, (int64_t[]){cnt});
        ACCEL_TRY(accel__state_put_piece(w, names[i], v, &whole));
    }
    return ACCEL_OK;
}

static accel_status probe_load(accel__object *self, accel__state_reader *r)
{
    probe_model *m = (probe_model *)self;
    for (int i = 0; i < N_PARAMS; i++) {
        int64_t cnt;
        size_t at;
        int64_t e0 = part(m, i, &cnt, &at);
        accel__state_piece whole = whole_of(i, e0);
        accel_tensor v = accel_tensor_view(m->buf + at, ACCEL_F32, 1, (int64_t[]){cnt});
        ACCEL_TRY(accel__state_get_piece(r, names[i], v, &whole));
    }
    return ACCEL_OK;
}

static const accel__object_class probe_class = {
    .state_save = probe_save,
    .state_load = probe_load,
    .name = "model",
    .store = ACCEL__STORE_TENSORS,
    .format = "pt",
};

static void fill(probe_model *m, int64_t gen)
{
    for (int i = 0; i < N_PARAMS; i++) {
        int64_t cnt;
        size_t at;
        int64_t e0 = part(m, i, &cnt, &at);
        for (int64_t e = 0; e < cnt; e++) {
            m->buf[at + (size_t)e] = value(gen, i, e0 + e);
        }
    }
}

static int check(const probe_model *m, int64_t gen)
{
    for (int i = 0; i < N_PARAMS; i++) {
        int64_t cnt;
        size_t at;
        int64_t e0 = part(m, i, &cnt, &at);
        for (int64_t e = 0; e < cnt; e++) {
            if (m->buf[at + (size_t)e] != value(gen, i, e0 + e)) {
                fprintf(stderr, "shard_probe: rank %d: %s[%lld] is %g, generation %lld wants %g\n",
                        m->rank, names[i], (long long)(e0 + e), m->buf[at + (size_t)e],
                        (long long)gen, value(gen, i, e0 + e));
                return 0;
            }
        }
    }
    return 1;
}

static accel_status gen_save(void *ctx, accel_state_writer *w)
{
    return accel_state_write(w, ctx, sizeof(int64_t));
}

static accel_status gen_load(void *ctx, const void *data, size_t n)
{
    if (n != sizeof(int64_t)) {
        return ACCEL_ECORRUPT;
    }
    memcpy(ctx, data, n);
    return ACCEL_OK;
}

#define TRY(acc, call)                                                                             \
    do {                                                                                           \
        if ((call) != ACCEL_OK) {                                                                  \
            fprintf(stderr, "shard_probe: %s: %s\n", #call, accel_last_error(acc));                \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: shard_probe save|load|loop|newest DIR STAGE [GEN]\n");
        return 2;
    }
    const char *cmd = argv[1], *dir = argv[2];
    int automatic = strcmp(cmd, "loop") == 0 || strcmp(cmd, "newest") == 0;
    accel_options o = accel_options_default();
    if (automatic) {
        o.project_dir = dir;
        o.automatic_checkpoint_naming = 1;
        o.total_limit = 2;
    }
    accel *acc;
    TRY(NULL, accel_init(&acc, &o));
    probe_model m = {.sharded = atoi(argv[3]) > 0, .rank = accel_process_index(acc)};
    int n = m.sharded ? accel_num_processes(acc) : 1;
    accel__flat_param fp[N_PARAMS];
    for (int i = 0; i < N_PARAMS; i++) {
        m.numel[i] = (size_t)(shapes[i][0] * shapes[i][1]);
        fp[i] = (accel__flat_param){m.numel[i], 0};
    }
    TRY(NULL, accel__flat_build(&m.flat, fp, N_PARAMS, 40.0, 96.0, n,
                                m.sharded ? 16 * (size_t)n : 1, m.offset, m.bucket));
    m.buf =
        calloc(m.sharded ? accel__flat_shard_numel(&m.flat) : m.flat.padded_numel, sizeof(float));
    accel__object_register(acc, &m.obj, ACCEL__OBJ_MODEL, &probe_class);
    m.obj.prepared = 1;
    TRY(acc, accel_register_for_checkpointing(acc, gen_save, gen_load, &gen_saved));
    if (strcmp(cmd, "save") == 0 && argc == 5) {
        gen_saved = atoll(argv[4]);
        fill(&m, gen_saved);
        TRY(acc, accel_save_state(acc, dir));
    } else if (strcmp(cmd, "load") == 0 || strcmp(cmd, "newest") == 0) {
        TRY(acc, accel_load_state(acc, automatic ? NULL : dir));
        if (!check(&m, gen_saved)) {
            return 1;
        }
        if (accel_is_main_process(acc)) {
            printf("generation %lld\n", (long long)gen_saved);
        }
    } else if (strcmp(cmd, "loop") == 0) {
        if (accel_load_state(acc, NULL) == ACCEL_OK) {
            if (!check(&m, gen_saved)) {
                return 1;
            }
        }
        for (;;) {
            gen_saved++;
            fill(&m, gen_saved);
            TRY(acc, accel_save_state(acc, NULL));
            if (accel_is_main_process(acc)) {
                printf("saved %lld\n", (long long)gen_saved);
                fflush(stdout);
            }
        }
    } else {
        fprintf(stderr, "shard_probe: unknown command %s\n", cmd);
        return 2;
    }
    accel__object_unregister(&m.obj);
    accel__flat_free(&m.flat);
    free(m.buf);
    accel_free(acc);
    return 0;
}
