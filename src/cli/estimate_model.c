/*
 * What `accel estimate-memory` reads: a model's parameter count and units (estimate.h) from a
 * Hugging Face config.json (GPT-2 or Llama-style fields, counted as the causal-LM model:
 * GPT2LMHeadModel / LlamaForCausalLM), from safetensors headers (exact for any architecture;
 * the tensor data is never read), or from GPT flags. Every error names the file and the field
 * or tensor at fault; nothing here guesses silently.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "base/base.h"
#include "base/ytree.h"
#include "estimate.h"

#define ERR_PREFIX "accel estimate-memory: error: "

static int fail(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs(ERR_PREFIX, stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return -1;
}

/* Counts saturate at UINT64_MAX instead of wrapping: a config with absurd fields (n_embd 2^30)
 * used to wrap into a small, plausible and wrong total. check_size refuses what saturated. */
static uint64_t sat_add(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

/* At most 2^56 parameters: their bytes (up to ~20 per parameter in training) fit in 64 bits.
 * More layers than MAX_LAYERS are refused before the units are made (one unit per layer: 2^30
 * layers took minutes and tens of GB). */
#define MAX_NUMEL (1ULL << 56)
#define MAX_LAYERS (1ULL << 20)

static int check_size(const cli_mem_model *m, const char *what)
{
    if (m->numel > MAX_NUMEL) {
        return fail("%s: the model would have more than 2^56 parameters, more than this command "
                    "can count (is a dimension far too large?)",
                    what);
    }
    return 0;
}

void cli_mem_free(cli_mem_model *m)
{
    for (int i = 0; i < m->n_units; i++) {
        accel__free(m->units[i].name);
    }
    accel__free(m->units);
    accel__free(m->slots);
    memset(m, 0, sizeof(*m));
}

/* The slot of `name` in m->slots: the one holding it, or the empty one where it goes. */
static int *name_slot(const cli_mem_model *m, const char *name)
{
    size_t mask = (size_t)m->n_slots - 1;
    size_t i = (size_t)accel__fnv1a_str(name) & mask;
    while (m->slots[i] != 0 && strcmp(m->units[m->slots[i] - 1].name, name) != 0) {
        i = (i + 1) & mask;
    }
    return &m->slots[i];
}

/* Keeps the hash at most half full; -1 when out of memory. */
static int grow_slots(cli_mem_model *m)
{
    if (2 * (m->n_units + 1) <= m->n_slots) {
        return 0;
    }
    int n = m->n_slots ? 2 * m->n_slots : 256;
    int *old = m->slots;
    m->slots = accel__calloc((size_t)n, sizeof(int));
    if (m->slots == NULL) {
        m->slots = old;
        return fail("out of memory");
    }
    m->n_slots = n;
    for (int u = 0; u < m->n_units; u++) {
        *name_slot(m, m->units[u].name) = u + 1;
    }
    accel__free(old);
    return 0;
}

/* Adds numel to the unit called `name`, creating it at the end when new. The names are
 * hashed: a scan of every earlier unit made a file of 200,000 differently named tensors (or
 * 2^20 layers) quadratic, minutes. */
static int add_unit(cli_mem_model *m, const char *name, uint64_t numel)
{
    if (grow_slots(m) != 0) {
        return -1;
    }
    int *slot = name_slot(m, name);
    if (*slot != 0) {
        cli_mem_unit *u = &m->units[*slot - 1];
        u->numel = sat_add(u->numel, numel);
        m->numel = sat_add(m->numel, numel);
        return 0;
    }
    if (m->n_units == m->cap_units) {
        int cap = m->cap_units ? 2 * m->cap_units : 64;
        cli_mem_unit *u = accel__realloc(m->units, (size_t)cap * sizeof(*u));
        if (u == NULL) {
            return fail("out of memory");
        }
        m->units = u;
        m->cap_units = cap;
    }
    char *copy = accel__strdup(name);
    if (copy == NULL) {
        return fail("out of memory");
    }
    m->units[m->n_units++] = (cli_mem_unit){copy, numel};
    *slot = m->n_units;
    m->numel = sat_add(m->numel, numel);
    return 0;
}

/* A unit named by a format. */
static int add_unitf(cli_mem_model *m, uint64_t numel, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int add_unitf(cli_mem_model *m, uint64_t numel, const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    return add_unit(m, name, numel);
}

/* A unit named after its position in a layer list ("model.layers.3") is a block. */
static int is_block(const char *unit)
{
    const char *last = strrchr(unit, '.');
    last = last ? last + 1 : unit;
    return last[0] != '\0' && strspn(last, "0123456789") == strlen(last);
}

/* The largest unit, and what ZeRO-3 holds gathered at once: the units of stage 3
 * (src/train/zero3.c: each block alone, runs of other consecutive units together: GPT-2's
 * [wte, wpe], h.0 ... h.11, [ln_f]), at most three adjacent ones resident (the one in use, the
 * one before it, the prefetched next). */
static void finish(cli_mem_model *m)
{
    m->largest = 0;
    for (int i = 1; i < m->n_units; i++) {
        if (m->units[i].numel > m->units[m->largest].numel) {
            m->largest = i;
        }
    }
    uint64_t run[3] = {0, 0, 0}; /* the last three stage-3 units, newest last */
    m->gather_numel = 0;
    for (int i = 0; i < m->n_units; i++) {
        if (i > 0 && (is_block(m->units[i].name) || is_block(m->units[i - 1].name))) {
            run[0] = run[1]; /* a new unit starts */
            run[1] = run[2];
            run[2] = 0;
        }
        run[2] += m->units[i].numel;
        uint64_t sum = run[0] + run[1] + run[2];
        m->gather_numel = sum > m->gather_numel ? sum : m->gather_numel;
    }
}

/* ------------------------------------------------------------------ GPT-2 and nn_gpt */

typedef struct gpt2_dims {
    uint64_t layers, width, vocab, positions, inner;
    int tied;
} gpt2_dims;

/* GPT2LMHeadModel's parameters (nn_gpt's are the same with inner = 4 x width): per block two
 * LayerNorms, c_attn [C, 3C] + bias, c_proj [C, C] + bias, c_fc [C, I] + bias, c_proj [I, C]
 * + bias. */
static int gpt2_units(cli_mem_model *m, const gpt2_dims *d)
{
    uint64_t c = d->width, i = d->inner;
    ACCEL_ASSERT(d->layers <= MAX_LAYERS); /* checked by both callers, naming flag or field */
    /* 4c + (3c^2 + 3c) + (c^2 + c) + (ci + i) + (ic + c), saturating. */
    uint64_t block =
        sat_add(sat_add(sat_mul(4, sat_mul(c, c)), sat_mul(2, sat_mul(c, i))), sat_add(9 * c, i));
    int rc = add_unitf(m, sat_mul(d->vocab, c), "transformer.wte");
    rc = rc ? rc : add_unitf(m, sat_mul(d->positions, c), "transformer.wpe");
    for (uint64_t l = 0; rc == 0 && l < d->layers; l++) {
        rc = add_unitf(m, block, "transformer.h.%llu", (unsigned long long)l);
    }
    rc = rc ? rc : add_unitf(m, 2 * c, "transformer.ln_f");
    if (rc == 0 && !d->tied) {
        rc = add_unitf(m, sat_mul(d->vocab, c), "lm_head");
    }
    return rc;
}

int cli_mem_from_gpt(cli_mem_model *m, const cli_mem_gpt *g)
{
    memset(m, 0, sizeof(*m));
    const struct {
        const char *flag;
        int64_t v;
    } dims[] = {{"--n_layer", g->n_layer},
                {"--n_embd", g->n_embd},
                {"--n_head", g->n_head},
                {"--vocab_size", g->vocab_size},
                {"--n_positions", g->n_positions}};
    for (size_t k = 0; k < sizeof(dims) / sizeof(dims[0]); k++) {
        if (dims[k].v < 1 || dims[k].v > (1 << 30)) {
            return fail("%s must be an integer in [1, 2^30], not %lld", dims[k].flag,
                        (long long)dims[k].v);
        }
    }
    if ((uint64_t)g->n_layer > MAX_LAYERS) {
        return fail("--n_layer must be an integer in [1, 2^20], not %lld", (long long)g->n_layer);
    }
    if (g->n_embd % g->n_head != 0) {
        return fail("--n_embd %lld is not a multiple of --n_head %lld", (long long)g->n_embd,
                    (long long)g->n_head);
    }
    gpt2_dims d = {(uint64_t)g->n_layer,     (uint64_t)g->n_embd,     (uint64_t)g->vocab_size,
                   (uint64_t)g->n_positions, 4 * (uint64_t)g->n_embd, g->tied};
    snprintf(m->what, sizeof(m->what),
             "GPT (nn_gpt layout) from flags: %lld layers, width %lld, %lld heads, vocabulary "
             "%lld, %lld positions, %s embeddings",
             (long long)g->n_layer, (long long)g->n_embd, (long long)g->n_head,
             (long long)g->vocab_size, (long long)g->n_positions, g->tied ? "tied" : "untied");
    if (gpt2_units(m, &d) != 0 || check_size(m, "the GPT of the flags") != 0) {
        cli_mem_free(m);
        return -1;
    }
    finish(m);
    return 0;
}

/* ------------------------------------------------------------------ config.json */

/* Reads a positive integer field of the config. Absent or null: *out = dflt when dflt > 0,
 * else an error naming the field (`need` says which fields the kind of config needs). */
static int cfg_int(const accel__ynode *root, const char *path, const char *key, uint64_t dflt,
                   const char *need, uint64_t *out)
{
    const accel__ynode *v = accel__ynode_get(root, key);
    if (v == NULL || (v->kind == ACCEL__Y_SCALAR && accel__yscalar_is_null(v))) {
        if (dflt > 0) {
            *out = dflt;
            return 0;
        }
        return fail("%s: field '%s' is missing (%s)", path, key, need);
    }
    char *end = NULL;
    long long x = 0;
    if (v->kind == ACCEL__Y_SCALAR && !v->quoted) {
        x = strtoll(v->text, &end, 10);
    }
    if (end == NULL || end == v->text || *end != '\0' || x < 1 || x > (1LL << 30)) {
        return fail("%s, line %d: field '%s' must be an integer in [1, 2^30], not %s", path,
                    v->line, key, v->kind == ACCEL__Y_SCALAR ? v->text : "a list or mapping");
    }
    *out = (uint64_t)x;
    return 0;
}

/* Reads a boolean field (absent or null: dflt). */
static int cfg_bool(const accel__ynode *root, const char *path, const char *key, int dflt, int *out)
{
    const accel__ynode *v = accel__ynode_get(root, key);
    if (v == NULL || (v->kind == ACCEL__Y_SCALAR && accel__yscalar_is_null(v))) {
        *out = dflt;
        return 0;
    }
    if (v->kind == ACCEL__Y_SCALAR && !v->quoted && strcmp(v->text, "true") == 0) {
        *out = 1;
    } else if (v->kind == ACCEL__Y_SCALAR && !v->quoted && strcmp(v->text, "false") == 0) {
        *out = 0;
    } else {
        return fail("%s, line %d: field '%s' must be true or false, not %s", path, v->line, key,
                    v->kind == ACCEL__Y_SCALAR ? v->text : "a list or mapping");
    }
    return 0;
}

static const char *const gpt2_need = "a GPT-2 config needs n_embd, n_layer, n_head, vocab_size "
                                     "and n_positions";

static int from_gpt2_config(cli_mem_model *m, const accel__ynode *root, const char *path)
{
    gpt2_dims d;
    uint64_t heads = 0, ctx = 0;
    if (cfg_int(root, path, "n_embd", 0, gpt2_need, &d.width) ||
        cfg_int(root, path, "n_layer", 0, gpt2_need, &d.layers) ||
        cfg_int(root, path, "n_head", 0, gpt2_need, &heads) ||
        cfg_int(root, path, "vocab_size", 0, gpt2_need, &d.vocab)) {
        return -1;
    }
    /* n_ctx is the older name of n_positions. */
    if (accel__ynode_get(root, "n_positions") == NULL &&
        cfg_int(root, path, "n_ctx", 0, gpt2_need, &ctx) != 0) {
        return -1;
    }
    if (cfg_int(root, path, "n_positions", ctx, gpt2_need, &d.positions) ||
        cfg_int(root, path, "n_inner", 4 * d.width, gpt2_need, &d.inner) ||
        cfg_bool(root, path, "tie_word_embeddings", 1, &d.tied)) {
        return -1;
    }
    if (d.layers > MAX_LAYERS) {
        return fail("%s: n_layer %llu: more than %llu is not a model this command counts", path,
                    (unsigned long long)d.layers, (unsigned long long)MAX_LAYERS);
    }
    if (d.width % heads != 0) {
        return fail("%s: n_embd %llu is not a multiple of n_head %llu", path,
                    (unsigned long long)d.width, (unsigned long long)heads);
    }
    snprintf(m->what, sizeof(m->what),
             "GPT-2 config %s (GPT2LMHeadModel): %llu layers, width %llu, %llu heads, "
             "vocabulary %llu, %llu positions, %s embeddings",
             path, (unsigned long long)d.layers, (unsigned long long)d.width,
             (unsigned long long)heads, (unsigned long long)d.vocab,
             (unsigned long long)d.positions, d.tied ? "tied" : "untied");
    return gpt2_units(m, &d);
}

static const char *const llama_need = "a Llama-style config needs hidden_size, "
                                      "num_hidden_layers, intermediate_size, num_attention_heads "
                                      "and vocab_size";

/* LlamaForCausalLM (and Mistral, Qwen2: the same layout, Qwen2 with q/k/v biases): per layer
 * q/k/v/o projections (k and v over num_key_value_heads), gate/up/down MLP, two RMSNorms. */
static int from_llama_config(cli_mem_model *m, const accel__ynode *root, const char *path,
                             const char *model_type)
{
    uint64_t h, layers, inter, heads, kv, vocab, head_dim;
    int tied, attn_bias, mlp_bias;
    if (cfg_int(root, path, "hidden_size", 0, llama_need, &h) ||
        cfg_int(root, path, "num_hidden_layers", 0, llama_need, &layers) ||
        cfg_int(root, path, "intermediate_size", 0, llama_need, &inter) ||
        cfg_int(root, path, "num_attention_heads", 0, llama_need, &heads) ||
        cfg_int(root, path, "vocab_size", 0, llama_need, &vocab) ||
        cfg_int(root, path, "num_key_value_heads", heads, llama_need, &kv) ||
        cfg_int(root, path, "head_dim", h / heads > 0 ? h / heads : 1, llama_need, &head_dim) ||
        cfg_bool(root, path, "tie_word_embeddings", 0, &tied) ||
        cfg_bool(root, path, "attention_bias", 0, &attn_bias) ||
        cfg_bool(root, path, "mlp_bias", 0, &mlp_bias)) {
        return -1;
    }
    if (accel__ynode_get(root, "head_dim") == NULL && h % heads != 0) {
        return fail("%s: hidden_size %llu is not a multiple of num_attention_heads %llu (and "
                    "there is no head_dim)",
                    path, (unsigned long long)h, (unsigned long long)heads);
    }
    if (heads % kv != 0) {
        return fail("%s: num_attention_heads %llu is not a multiple of num_key_value_heads %llu",
                    path, (unsigned long long)heads, (unsigned long long)kv);
    }
    if (layers > MAX_LAYERS) {
        return fail("%s: num_hidden_layers %llu: more than %llu is not a model this command "
                    "counts",
                    path, (unsigned long long)layers, (unsigned long long)MAX_LAYERS);
    }
    int qkv_bias = attn_bias || strcmp(model_type, "qwen2") == 0;
    uint64_t q = sat_mul(heads, head_dim), k = sat_mul(kv, head_dim);
    /* h*q + 2*h*k + q*h (+ biases), saturating. */
    uint64_t attn = sat_add(sat_mul(2, sat_mul(h, q)), sat_mul(2, sat_mul(h, k)));
    attn = sat_add(attn, qkv_bias ? sat_add(q, sat_mul(2, k)) : 0);
    attn = sat_add(attn, attn_bias ? h : 0);
    uint64_t mlp = sat_add(sat_mul(3, sat_mul(h, inter)), mlp_bias ? 2 * inter + h : 0);
    uint64_t layer = sat_add(sat_add(attn, mlp), 2 * h);
    snprintf(m->what, sizeof(m->what),
             "Llama-style config %s (%s): %llu layers, hidden %llu, intermediate %llu, %llu "
             "heads (%llu key/value), vocabulary %llu, %s embeddings",
             path, model_type[0] ? model_type : "no model_type", (unsigned long long)layers,
             (unsigned long long)h, (unsigned long long)inter, (unsigned long long)heads,
             (unsigned long long)kv, (unsigned long long)vocab, tied ? "tied" : "untied");
    int rc = add_unitf(m, sat_mul(vocab, h), "model.embed_tokens");
    for (uint64_t l = 0; rc == 0 && l < layers; l++) {
        rc = add_unitf(m, layer, "model.layers.%llu", (unsigned long long)l);
    }
    rc = rc ? rc : add_unitf(m, h, "model.norm");
    if (rc == 0 && !tied) {
        rc = add_unitf(m, sat_mul(vocab, h), "lm_head");
    }
    return rc;
}

static int from_config(cli_mem_model *m, const accel__ynode *root, const char *path)
{
    const accel__ynode *mt = accel__ynode_get(root, "model_type");
    const char *type = mt != NULL && mt->kind == ACCEL__Y_SCALAR ? mt->text : "";
    if (strcmp(type, "gpt2") == 0 || (type[0] == '\0' && accel__ynode_get(root, "n_embd"))) {
        return from_gpt2_config(m, root, path);
    }
    static const char *const llama_types[] = {"llama", "mistral", "qwen2"};
    for (size_t i = 0; i < sizeof(llama_types) / sizeof(llama_types[0]); i++) {
        if (strcmp(type, llama_types[i]) == 0) {
            return from_llama_config(m, root, path, type);
        }
    }
    if (type[0] == '\0' && accel__ynode_get(root, "hidden_size") != NULL) {
        return from_llama_config(m, root, path, type);
    }
    if (type[0] != '\0') {
        return fail("%s, line %d: model_type '%s' is not one this command counts from a config "
                    "(gpt2, llama, mistral, qwen2); give the model's safetensors file or index "
                    "instead (exact for any architecture)",
                    path, mt->line, type);
    }
    return fail("%s: not a model config (no model_type, n_embd or hidden_size field) nor a "
                "safetensors index (no weight_map field)",
                path);
}

/* ------------------------------------------------------------------ safetensors */

/* The unit of a tensor: the name up to and including its first all-digit component (a block
 * of a layer list: "model.layers.3"), else its module (the name without the last component). */
static void unit_of(const char *tensor, char *out, size_t nbytes)
{
    const char *p = tensor;
    while (*p != '\0') {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        size_t digits = strspn(p, "0123456789");
        if (n > 0 && digits == n && dot != NULL) {
            snprintf(out, nbytes, "%.*s", (int)(p + n - tensor), tensor);
            return;
        }
        if (dot == NULL) {
            break;
        }
        p = dot + 1;
    }
    const char *last = strrchr(tensor, '.');
    snprintf(out, nbytes, "%.*s", last ? (int)(last - tensor) : (int)strlen(tensor), tensor);
}

/* Counts tensor i of an open file into its unit. */
static int count_tensor(cli_mem_model *m, const accel_safetensors *st, size_t i)
{
    accel_tensor t;
    if (accel_safetensors_tensor(st, i, &t) != ACCEL_OK) {
        return fail("%s", accel_last_error(NULL));
    }
    char unit[512];
    unit_of(accel_safetensors_name(st, i), unit, sizeof(unit));
    return add_unit(m, unit, (uint64_t)accel_tensor_numel(&t));
}

static int open_safetensors(accel_safetensors **st, const char *path)
{
    if (accel_safetensors_open(st, path) != ACCEL_OK) {
        return fail("%s", accel_last_error(NULL));
    }
    return 0;
}

static int from_safetensors(cli_mem_model *m, const char *path)
{
    accel_safetensors *st = NULL;
    if (open_safetensors(&st, path) != 0) {
        return -1;
    }
    size_t n = accel_safetensors_count(st);
    int rc = n == 0 ? fail("%s: the file holds no tensor", path) : 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        rc = count_tensor(m, st, i);
    }
    snprintf(m->what, sizeof(m->what), "safetensors file %s: %zu tensors", path, n);
    accel_safetensors_close(st);
    return rc;
}

/* The open shards of an index, each opened once (weight_map lists tensors by name, so the
 * shards of consecutive tensors alternate). */
typedef struct shard_set {
    int n, cap;
    struct {
        const char *name; /* borrowed from the index's tree */
        accel_safetensors *file;
    } * items;
} shard_set;

static accel_safetensors *shard_get(shard_set *set, const char *index_path, int dir_len,
                                    const char *name, const char *tensor)
{
    for (int i = 0; i < set->n; i++) {
        if (strcmp(set->items[i].name, name) == 0) {
            return set->items[i].file;
        }
    }
    if (set->n == set->cap) {
        int cap = set->cap ? 2 * set->cap : 16;
        void *items = accel__realloc(set->items, (size_t)cap * sizeof(*set->items));
        if (items == NULL) {
            fail("out of memory");
            return NULL;
        }
        set->items = items;
        set->cap = cap;
    }
    char shard[4096];
    snprintf(shard, sizeof(shard), "%.*s%s", dir_len, index_path, name);
    accel_safetensors *st = NULL;
    if (open_safetensors(&st, shard) != 0) {
        fprintf(stderr, ERR_PREFIX "(the shard of '%s' in %s)\n", tensor, index_path);
        return NULL;
    }
    set->items[set->n].name = name;
    set->items[set->n++].file = st;
    return st;
}

/* A sharded checkpoint: the index's weight_map names every tensor and its shard (a file in the
 * index's folder); the shards' headers give the shapes. */
static int from_index(cli_mem_model *m, const accel__ynode *root, const char *path)
{
    const accel__ynode *wm = accel__ynode_get(root, "weight_map");
    if (wm == NULL || wm->kind != ACCEL__Y_MAP || wm->n == 0) {
        return fail("%s%s%d: field 'weight_map' must be a non-empty mapping of tensor names to "
                    "shard files",
                    path, wm ? ", line " : "", wm ? wm->line : 0);
    }
    const char *slash = strrchr(path, '/');
    int dir_len = slash ? (int)(slash - path + 1) : 0;
    shard_set set = {0};
    int rc = 0;
    for (int i = 0; rc == 0 && i < wm->n; i++) {
        const accel__ynode *file = wm->items[i];
        if (file->kind != ACCEL__Y_SCALAR || file->text[0] == '\0' || strchr(file->text, '/')) {
            rc = fail("%s, line %d: weight_map['%s'] must name a shard file in the index's "
                      "folder",
                      path, file->line, wm->keys[i]);
            break;
        }
        accel_safetensors *st = shard_get(&set, path, dir_len, file->text, wm->keys[i]);
        long k = st != NULL ? accel_safetensors_find(st, wm->keys[i]) : -1;
        if (st != NULL && k < 0) {
            rc = fail("%s, line %d: tensor '%s' is not in its shard %s", path, file->line,
                      wm->keys[i], file->text);
        }
        rc = st == NULL ? -1 : rc == 0 ? count_tensor(m, st, (size_t)k) : rc;
    }
    snprintf(m->what, sizeof(m->what), "safetensors index %s: %d tensors in %d shards", path, wm->n,
             set.n);
    for (int i = 0; i < set.n; i++) {
        accel_safetensors_close(set.items[i].file);
    }
    accel__free(set.items);
    return rc;
}

/* ------------------------------------------------------------------ dispatch */

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int from_json_file(cli_mem_model *m, const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return fail("%s: cannot open: %s", path, strerror(errno));
    }
    accel__ynode *root = NULL;
    accel_status st = accel__ytree_parse(f, path, &root);
    fclose(f);
    if (st != ACCEL_OK) {
        return fail("%s", accel_last_error(NULL));
    }
    int rc;
    if (root->kind != ACCEL__Y_MAP) {
        rc = fail("%s: the file is not a JSON object", path);
    } else if (accel__ynode_get(root, "weight_map") != NULL) {
        rc = from_index(m, root, path);
    } else {
        rc = from_config(m, root, path);
    }
    accel__ynode_free(root);
    return rc;
}

int cli_mem_from_path(cli_mem_model *m, const char *path)
{
    memset(m, 0, sizeof(*m));
    struct stat sb;
    if (stat(path, &sb) != 0) {
        return fail("%s: %s (estimate-memory reads local files: a config.json, a .safetensors "
                    "file, a model.safetensors.index.json or a folder with one; it does not "
                    "download from the Hub)",
                    path, strerror(errno));
    }
    char found[4096];
    if (S_ISDIR(sb.st_mode)) {
        static const char *const names[] = {"model.safetensors.index.json", "model.safetensors",
                                            "config.json"};
        size_t i = 0;
        for (; i < sizeof(names) / sizeof(names[0]); i++) {
            snprintf(found, sizeof(found), "%s/%s", path, names[i]);
            if (access(found, F_OK) == 0) {
                break;
            }
        }
        if (i == sizeof(names) / sizeof(names[0])) {
            return fail("%s: the folder has no model.safetensors.index.json, model.safetensors "
                        "or config.json",
                        path);
        }
        path = found;
    }
    int rc = ends_with(path, ".safetensors") ? from_safetensors(m, path) : from_json_file(m, path);
    if (rc == 0 && m->numel == 0) {
        rc = fail("%s: the model has no parameter", path);
    }
    rc = rc == 0 ? check_size(m, path) : rc;
    if (rc != 0) {
        cli_mem_free(m);
        return -1;
    }
    finish(m);
    return 0;
}
