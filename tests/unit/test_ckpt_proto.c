/*
 * The state protocol (core/state_proto.h) through save_state / load_state, with an object of
 * a class written here (as a new kind of object would be): a shared part in a .safetensors
 * (tensors of several dtypes, every kind of JSON value in its metadata, nested objects and
 * arrays) and a per-process part in a .json.
 *  - round trip: every value comes back bit for bit, the files are where the class says, the
 *    metadata keeps the order values were put in;
 *  - a piece of a saved tensor loads into a shard-sized buffer; a piece that no other process
 *    completes is refused at save (tests/ckpt/test_sharded_state.sh saves real shards);
 *  - every refusal names the folder, the file and the tensor (both shapes) or the key path,
 *    and modifies nothing (the staged apply never runs, no tensor is copied);
 *  - a writer misused by its object (a key put twice, a tensor in a JSON part, a container
 *    left open) fails the save naming the file;
 *  - device memory is refused (ACCEL_EUNSUPPORTED) on both sides, before any byte moves.
 */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "ckpt/state.h"

/* How the probe's load behaves (each a mistake or a damage the protocol must catch). */
enum {
    LOAD_ALL,       /* reads everything */
    LOAD_SHAPE,     /* expects "w" with another shape */
    LOAD_MISSING,   /* asks for a tensor that was never saved */
    LOAD_UNREAD,    /* leaves "ids" unread */
    LOAD_RANGE,     /* expects "i" in [0, 10] */
    LOAD_PATH,      /* asks for a key missing inside a nested array element */
    LOAD_TYPE,      /* reads a string as an integer */
    LOAD_PIECE,     /* loads elements 2..4 of "w" as a shard */
    LOAD_MISMATCH,  /* refuses the value "b" as not fitting the live object */
    LOAD_DEVICE     /* loads "w" into (what claims to be) GPU memory */
};
/* How its save misbehaves. */
enum { SAVE_OK, SAVE_TWICE, SAVE_TENSOR_IN_JSON, SAVE_OPEN, SAVE_PIECE, SAVE_DEVICE };

static int load_mode, save_mode;

typedef struct probe {
    accel__object obj;
    float w[6];
    int64_t ids[4];
    uint16_t h[5]; /* BF16 bits */
    /* JSON values */
    int64_t i_min, i_max;
    double f[3], arr[3], lr[2];
    int b;
    char s[32];
    uint64_t u, gen[ACCEL_RNG_STATE_WORDS];
    int64_t inner_x;
    int64_t rank; /* the per-process part */
    int applied;  /* the staged apply ran */
    float shard[3];
} probe;

/* A view; "on a GPU" that no machine has when the mode asks (never dereferenced: refused
 * before any copy, whatever the build). */
static accel_tensor view(void *p, accel_dtype dt, int ndim, const int64_t *shape)
{
    accel_tensor t = accel_tensor_view(p, dt, ndim, shape);
    if (save_mode == SAVE_DEVICE || load_mode == LOAD_DEVICE) {
        t.device = (accel_device){ACCEL_DEVICE_CUDA, 99};
    }
    return t;
}

static accel_status probe_save(accel__object *self, accel__state_writer *w)
{
    probe *p = (probe *)self;
    if (accel__state_writer_part(w) == ACCEL__STATE_RANK) {
        if (save_mode == SAVE_TENSOR_IN_JSON) {
            return accel__state_put_tensor(w, "w", view(p->w, ACCEL_F32, 1, (int64_t[]){6}));
        }
        return accel__state_put_i64(w, "rank", p->rank);
    }
    ACCEL_TRY(accel__state_put_tensor(w, "w", view(p->w, ACCEL_F32, 2, (int64_t[]){2, 3})));
    ACCEL_TRY(accel__state_put_tensor(w, "ids", view(p->ids, ACCEL_I64, 1, (int64_t[]){4})));
    ACCEL_TRY(accel__state_put_tensor(w, "h", view(p->h, ACCEL_BF16, 1, (int64_t[]){5})));
    if (save_mode == SAVE_PIECE) {
        accel__state_piece whole = {1, {12}, 6};
        return accel__state_put_piece(w, "big", view(p->w, ACCEL_F32, 1, (int64_t[]){6}), &whole);
    }
    ACCEL_TRY(accel__state_put_i64(w, "i", p->i_min));
    ACCEL_TRY(accel__state_put_i64(w, "j", p->i_max));
    ACCEL_TRY(accel__state_put_f64(w, "f0", p->f[0]));
    ACCEL_TRY(accel__state_put_f64(w, "f1", p->f[1]));
    ACCEL_TRY(accel__state_put_f64(w, "f2", p->f[2]));
    ACCEL_TRY(accel__state_put_bool(w, "b", p->b));
    ACCEL_TRY(accel__state_put_str(w, "s", p->s));
    ACCEL_TRY(accel__state_put_u64(w, "u", p->u));
    ACCEL_TRY(accel__state_put_gen(w, "gen", p->gen));
    ACCEL_TRY(accel__state_put_f64s(w, "arr", p->arr, 3));
    ACCEL_TRY(accel__state_begin(w, "groups", 1));
    for (int g = 0; g < 2; g++) {
        ACCEL_TRY(accel__state_begin(w, NULL, 0));
        ACCEL_TRY(accel__state_put_f64(w, "lr", p->lr[g]));
        ACCEL_TRY(accel__state_end(w));
    }
    ACCEL_TRY(accel__state_end(w));
    ACCEL_TRY(accel__state_begin(w, "inner", 0));
    ACCEL_TRY(accel__state_put_i64(w, "x", p->inner_x));
    if (save_mode == SAVE_TWICE) {
        ACCEL_TRY(accel__state_put_i64(w, "x", p->inner_x));
    }
    if (save_mode == SAVE_OPEN) {
        return ACCEL_OK; /* "inner" left open */
    }
    return accel__state_end(w);
}

/* The JSON values of the shared part, staged, then copied into the probe. */
typedef struct probe_staged {
    int64_t i_min, i_max, inner_x, rank;
    double f[3], arr[3], lr[2];
    int b;
    char s[32];
    uint64_t u, gen[ACCEL_RNG_STATE_WORDS];
    int rank_part;
} probe_staged;

static void probe_apply(accel__object *self, void *data)
{
    probe *p = (probe *)self;
    const probe_staged *s = data;
    if (s->rank_part) {
        p->rank = s->rank;
    } else {
        p->i_min = s->i_min;
        p->i_max = s->i_max;
        p->inner_x = s->inner_x;
        memcpy(p->f, s->f, sizeof p->f);
        memcpy(p->arr, s->arr, sizeof p->arr);
        memcpy(p->lr, s->lr, sizeof p->lr);
        p->b = s->b;
        memcpy(p->s, s->s, sizeof p->s);
        p->u = s->u;
        memcpy(p->gen, s->gen, sizeof p->gen);
    }
    p->applied++;
}

static accel_status load_values(accel__state_reader *r, probe_staged *s)
{
    const char *str;
    ACCEL_TRY(accel__state_get_i64(r, "i", INT64_MIN, INT64_MAX, &s->i_min));
    ACCEL_TRY(accel__state_get_i64(r, "j", INT64_MIN, INT64_MAX, &s->i_max));
    ACCEL_TRY(accel__state_get_f64(r, "f0", -1e308, 1e308, &s->f[0]));
    ACCEL_TRY(accel__state_get_f64(r, "f1", -1e308, 1e308, &s->f[1]));
    ACCEL_TRY(accel__state_get_f64(r, "f2", -1e308, 1e308, &s->f[2]));
    ACCEL_TRY(accel__state_get_bool(r, "b", &s->b));
    ACCEL_TRY(accel__state_get_str(r, "s", &str));
    snprintf(s->s, sizeof s->s, "%s", str);
    ACCEL_TRY(accel__state_get_u64(r, "u", &s->u));
    ACCEL_TRY(accel__state_get_gen(r, "gen", s->gen));
    ACCEL_TRY(accel__state_get_f64s(r, "arr", -10, 10, s->arr, 3));
    for (size_t g = 0; g < 2; g++) {
        ACCEL_TRY(accel__state_enter_item(r, "groups", g));
        ACCEL_TRY(accel__state_get_f64(r, load_mode == LOAD_PATH && g == 1 ? "momentum" : "lr",
                                       0, 1, &s->lr[g]));
        accel__state_leave(r);
    }
    ACCEL_TRY(accel__state_enter(r, "inner"));
    ACCEL_TRY(accel__state_get_i64(r, "x", 0, 100, &s->inner_x));
    accel__state_leave(r);
    CHECK(!accel__state_has(r, "x") && accel__state_has(r, "inner"));
    return ACCEL_OK;
}

static accel_status probe_load(accel__object *self, accel__state_reader *r)
{
    probe *p = (probe *)self;
    probe_staged *s = accel__state_stage(r, sizeof(*s), probe_apply);
    if (s == NULL) {
        return ACCEL_ENOMEM;
    }
    if (accel__state_reader_part(r) == ACCEL__STATE_RANK) {
        s->rank_part = 1;
        CHECK(accel__state_saved_processes(r) == 1 && accel__state_index(r) == 0);
        return accel__state_get_i64(r, "rank", 0, 0, &s->rank);
    }
    if (load_mode == LOAD_PIECE) {
        accel__state_piece whole = {2, {2, 3}, 2};
        ACCEL_TRY(accel__state_get_piece(r, "w", view(p->shard, ACCEL_F32, 1, (int64_t[]){3}),
                                         &whole));
    } else {
        int64_t shape[2] = {2, 3};
        if (load_mode == LOAD_SHAPE) {
            shape[0] = 3, shape[1] = 2;
        }
        ACCEL_TRY(accel__state_get_tensor(r, "w", view(p->w, ACCEL_F32, 2, shape)));
    }
    if (load_mode == LOAD_MISSING) {
        ACCEL_TRY(accel__state_get_tensor(r, "nope", view(p->w, ACCEL_F32, 1, (int64_t[]){6})));
    }
    if (load_mode != LOAD_UNREAD) {
        ACCEL_TRY(accel__state_get_tensor(r, "ids", view(p->ids, ACCEL_I64, 1, (int64_t[]){4})));
    }
    ACCEL_TRY(accel__state_get_tensor(r, "h", view(p->h, ACCEL_BF16, 1, (int64_t[]){5})));
    if (load_mode == LOAD_RANGE) {
        int64_t i;
        return accel__state_get_i64(r, "i", 0, 10, &i);
    }
    if (load_mode == LOAD_TYPE) {
        int64_t i;
        return accel__state_get_i64(r, "s", 0, 10, &i);
    }
    ACCEL_TRY(load_values(r, s));
    if (load_mode == LOAD_MISMATCH) {
        return accel__state_fail(r, ACCEL_EINVAL, "b is %d, the live probe needs %d", s->b, !s->b);
    }
    return ACCEL_OK;
}

static const accel__object_class probe_class = {
    .state_save = probe_save,
    .state_load = probe_load,
    .name = "probe",
    .store = ACCEL__STORE_TENSORS,
    .format = "probe-format",
    .numbered_from_0 = 1,
    .rank_name = "probe_rank",
    .rank_store = ACCEL__STORE_JSON,
    .rank_key = "probes",
};

static void probe_fill(probe *p, int v)
{
    memset((char *)p + sizeof(p->obj), 0, sizeof(*p) - sizeof(p->obj)); /* not the header */
    for (int i = 0; i < 6; i++) {
        p->w[i] = (float)(v * 10 + i) + 0.125f;
    }
    for (int i = 0; i < 4; i++) {
        p->ids[i] = (int64_t)v << (10 * i);
        p->h[i] = (uint16_t)(0x3f80 + v + i);
    }
    p->h[4] = (uint16_t)(0xbf00 + v);
    p->i_min = v ? 5 : INT64_MIN;
    p->i_max = v ? 6 : INT64_MAX;
    p->f[0] = v ? 1 : 0.1;
    p->f[1] = v ? 2 : 1e300;
    p->f[2] = v ? 3 : -0.0;
    p->arr[0] = v, p->arr[1] = -9.5, p->arr[2] = 1.0 / 3;
    p->lr[0] = v ? 0.5 : 1e-3, p->lr[1] = v ? 0.25 : 3e-4;
    p->b = !v;
    snprintf(p->s, sizeof p->s, v ? "other" : "h\xc3\xa9llo \"q\"");
    p->u = v ? 1 : 0xffffffffffffffffull;
    for (int i = 0; i < ACCEL_RNG_STATE_WORDS; i++) {
        p->gen[i] = 0x0123456789abcdefull * (uint64_t)(i + 1 + v);
    }
    p->inner_x = v ? 1 : 42;
}

static int probe_same(const probe *a, const probe *b)
{
    return memcmp(a->w, b->w, sizeof a->w) == 0 && memcmp(a->ids, b->ids, sizeof a->ids) == 0 &&
           memcmp(a->h, b->h, sizeof a->h) == 0 && a->i_min == b->i_min && a->i_max == b->i_max &&
           memcmp(a->f, b->f, sizeof a->f) == 0 && memcmp(a->arr, b->arr, sizeof a->arr) == 0 &&
           memcmp(a->lr, b->lr, sizeof a->lr) == 0 && a->b == b->b && strcmp(a->s, b->s) == 0 &&
           a->u == b->u && memcmp(a->gen, b->gen, sizeof a->gen) == 0 &&
           a->inner_x == b->inner_x && a->rank == b->rank;
}

/* load_state(dir) fails with `want`, its message contains every needle, nothing changed. */
static void refused(accel *acc, probe *p, const char *dir, accel_status want, const char *n1,
                    const char *n2)
{
    probe before = *p;
    accel_status st = accel_load_state(acc, dir);
    const char *msg = accel_last_error(acc);
    CHECK_MSG(st == want && strstr(msg, n1) != NULL && (n2 == NULL || strstr(msg, n2) != NULL),
              "load mode %d: expected %s with \"%s\", got %s: %s", load_mode,
              accel_status_name(want), n1, accel_status_name(st), msg);
    CHECK_MSG(probe_same(p, &before) && p->applied == before.applied,
              "load mode %d: a refused load changed the object", load_mode);
}

static int exists(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

int main(void)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/accel_test_ckpt_proto_%d", (int)getpid());
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, NULL));
    probe p;
    accel__object_register(acc, &p.obj, ACCEL__OBJ_CUSTOM, &probe_class);
    p.obj.prepared = 1;

    /* Round trip. */
    probe_fill(&p, 0);
    probe saved = p;
    CHECK_OK(acc, accel_save_state(acc, dir));
    CHECK(exists(dir, "probe_0.safetensors") && exists(dir, "probe_rank0.json"));
    char path[512];
    snprintf(path, sizeof path, "%s/probe_0.safetensors", dir);
    accel_safetensors *st;
    CHECK_OK(NULL, accel_safetensors_open(&st, path));
    CHECK(strcmp(accel_safetensors_metadata(st, "format"), "probe-format") == 0);
    const char *meta = accel_safetensors_metadata(st, "accel_probe");
    CHECK_MSG(meta != NULL && strncmp(meta, "{\"i\":-9223372036854775808,\"j\":9223372036854775807,"
                                            "\"f0\":0.10000000000000001,",
                                      72) == 0,
              "%s", meta ? meta : "(no metadata)");
    accel_safetensors_close(st);
    probe_fill(&p, 1);
    p.rank = 7;
    CHECK_OK(acc, accel_load_state(acc, dir));
    CHECK(p.applied == 2); /* the shared and the per-process part */
    p.applied = 0;
    CHECK(probe_same(&p, &saved));

    /* A piece of a saved tensor into a shard-sized buffer: elements 2..4 of w. */
    load_mode = LOAD_PIECE;
    CHECK_OK(acc, accel_load_state(acc, dir));
    CHECK(p.shard[0] == saved.w[2] && p.shard[1] == saved.w[3] && p.shard[2] == saved.w[4]);

    /* Refusals: each names the folder and file and what is wrong; nothing changes. */
    probe_fill(&p, 1);
    char file[300];
    snprintf(file, sizeof file, "checkpoint %s: probe_0.safetensors", dir);
    load_mode = LOAD_SHAPE;
    refused(acc, &p, dir, ACCEL_EINVAL, file,
            "tensor w is F32 [2, 3] in the checkpoint vs F32 [3, 2] in the registered object");
    load_mode = LOAD_MISSING;
    refused(acc, &p, dir, ACCEL_EINVAL, file,
            "has no tensor nope (the live registered object has it)");
    load_mode = LOAD_UNREAD;
    refused(acc, &p, dir, ACCEL_EINVAL, file, "holds tensor ids, which no live object has");
    load_mode = LOAD_RANGE;
    refused(acc, &p, dir, ACCEL_ECORRUPT, "probe_0.safetensors is malformed",
            "accel_probe.i is -9223372036854775808, expected 0 to 10");
    load_mode = LOAD_PATH;
    refused(acc, &p, dir, ACCEL_ECORRUPT, "probe_0.safetensors is malformed",
            "accel_probe.groups[1].momentum is missing");
    load_mode = LOAD_TYPE;
    refused(acc, &p, dir, ACCEL_ECORRUPT, "probe_0.safetensors is malformed",
            "accel_probe.s is not an integer");
    load_mode = LOAD_MISMATCH;
    refused(acc, &p, dir, ACCEL_EINVAL, file, "b is 1, the live probe needs 0");
    load_mode = LOAD_DEVICE;
    refused(acc, &p, dir, ACCEL_EUNSUPPORTED, file, "tensor w: device cuda:99");
    load_mode = LOAD_ALL;

    /* Writers misused: the save fails naming the file; the folder is not replaced. */
    struct {
        int mode;
        accel_status st;
        const char *msg;
    } bad_saves[] = {
        {SAVE_TWICE, ACCEL_EINVAL, "accel_save_state: probe_0.safetensors: JSON key x put twice"},
        {SAVE_TENSOR_IN_JSON, ACCEL_EINVAL,
         "accel_save_state: probe_rank0.json: tensor w: this part of the state holds no tensors"},
        {SAVE_OPEN, ACCEL_EINVAL,
         "accel_save_state: probe_0.safetensors: a state_save left 1 JSON containers open"},
        {SAVE_DEVICE, ACCEL_EUNSUPPORTED,
         "accel_save_state: probe_0.safetensors: tensor w: device cuda:99"}, /* : why */
        {SAVE_PIECE, ACCEL_EINVAL,
         "accel_save_state: probe_0.safetensors: the processes' pieces of tensor big hold 6 "
         "elements of its 12 (each element must be put by exactly one process)"},
    };
    for (size_t i = 0; i < sizeof bad_saves / sizeof bad_saves[0]; i++) {
        save_mode = bad_saves[i].mode;
        if (bad_saves[i].mode == SAVE_DEVICE) { /* the reason depends on the build */
            CHECK(accel_save_state(acc, dir) == bad_saves[i].st);
            const char *want = bad_saves[i].msg;
            CHECK_MSG(strncmp(accel_last_error(acc), want, strlen(want)) == 0, "got \"%s\"",
                      accel_last_error(acc));
        } else {
            CHECK_ERR(acc, accel_save_state(acc, dir), bad_saves[i].st, bad_saves[i].msg);
        }
    }
    save_mode = SAVE_OK;
    probe_fill(&p, 1);
    CHECK_OK(acc, accel_load_state(acc, dir)); /* still the first save */
    CHECK(probe_same(&p, &saved));

    accel__object_unregister(&p.obj);
    accel_free(acc);
    snprintf(path, sizeof path, "rm -rf %s", dir);
    CHECK(system(path) == 0);
    printf("state protocol: round trip, pieces, refusals, misused writers ok\n");
    return 0;
}
