/*
 * gpt: a byte-level GPT trained on a text corpus, data-parallel.
 *
 *     accel launch --num_processes 2 build/examples/gpt
 *     make demo     (bf16, accumulation, TensorBoard, checkpoints; stopped halfway, resumed)
 *     build/examples/gpt --steps 50 --log_with jsonl --project_dir runs
 *     build/examples/gpt --data shakespeare.txt --layers 6 --width 192 --context 256
 *     build/examples/gpt --checkpoint_every 100 --project_dir runs        (then add --resume)
 *     build/examples/gpt --device cuda --mixed_precision bf16 --layers 12 --width 768 \
 *         --heads 12 --context 1024 --vocab 50304 --batch 16       (GPT-2 124M's shape on a GPU)
 *
 * By default the corpus is accel's own source and documentation (src/, include/, docs/ of the
 * project, found from the executable's or the current directory), so there is nothing to
 * download; --data names a file or a folder (read recursively) instead. Every byte is a token
 * (vocabulary 256, or --vocab, padded: the extra rows are never a target). The model is GPT-2
 * (pre-LayerNorm blocks, tied embeddings by default) from the nn toolkit, trained with AdamW,
 * linear warmup then cosine decay, gradient clipping at 1.0 and optional gradient accumulation,
 * dropout and mixed precision. The main process shows a progress bar, prints a line with loss,
 * learning rate, gradient norm and tokens/s every --log_every steps, logs the same values to
 * the trackers named by --log_with, and finally samples some text. --checkpoint_every saves the
 * whole training state (automatic naming under project_dir/checkpoints) and --resume continues
 * bit-identically from the newest checkpoint (accel_options.resume_from_checkpoint = "latest":
 * accel_prepare loads it, so the same command restarted by `accel launch --max_restarts N` after a
 * failure goes on from there).
 * --save_dir writes model.safetensors plus a transformers config.json, so the folder loads
 * with GPT2LMHeadModel.from_pretrained. --device cuda trains on the process's GPU (the default
 * where accel runs on one): the model's weights, gradients and optimizer state in GPU memory,
 * the nn ctx on the same GPU (docs/cuda.md).
 */
#define _DEFAULT_SOURCE /* scandir, PATH_MAX under -std=c11 */

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <accel/accel.h>
#include <accel/nn.h>

#include "args.h"

/* ------------------------------------------------------------------------ command line */

typedef struct args {
    int layers, width, heads, context, vocab, batch, steps, warmup, accum, seed, log_every, sample;
    int tied, checkpoint_every, total_limit, stop_at, resume, recompute;
    double lr, dropout;
    const char *data, *mixed_precision, *log_with, *project_dir, *save_dir, *activation, *device;
} args;

static const char usage[] =
    "usage: gpt [options]\n"
    "  --data PATH              text file or folder (default: the project's src, include, docs)\n"
    "  --layers N --width N --heads N --context N      model (default 4, 128, 4, 128)\n"
    "  --vocab N                vocabulary size, >= 256 (bytes; more rows pad it, as GPT-2\n"
    "                           124M's 50304; default 256)\n"
    "  --device D               cpu or cuda (default: cuda where accel runs on a GPU)\n"
    "  --tied 0|1               lm_head shares the token embedding (default 1)\n"
    "  --activation A           gelu_new (tanh form, GPT-2's; default) or gelu (exact erf)\n"
    "  --dropout X              embedding, attention and residual dropout (default 0)\n"
    "  --recompute 0|1          recompute each block's activations in backward instead of\n"
    "                           keeping them (gradient checkpointing: less memory, one more\n"
    "                           forward; same losses; default 0)\n"
    "  --batch N                sequences per process per micro-step (default 8)\n"
    "  --steps N                optimizer steps (default 1000)\n"
    "  --lr X --warmup N        peak learning rate and warmup steps (default 2e-3, steps/20)\n"
    "  --accum N                gradient accumulation steps (default 1)\n"
    "  --mixed_precision P      no | fp16 | bf16 | fp8 (fp8: a GPU with fp8 support; default:\n"
    "                           accel's configuration)\n"
    "  --seed N                 model init, dropout and data order (default 1337)\n"
    "  --log_with LIST          trackers: tensorboard,jsonl,csv,mlflow or all (default none)\n"
    "  --project_dir DIR        where trackers and checkpoints write (default runs when needed)\n"
    "  --log_every N            steps between log lines (default 50)\n"
    "  --sample N               bytes of text generated at the end (default 300)\n"
    "  --checkpoint_every N     save_state every N steps to DIR/checkpoints/checkpoint_<i>\n"
    "  --total_limit N          keep only the newest N checkpoints (default all)\n"
    "  --resume                 continue from the newest checkpoint in DIR/checkpoints\n"
    "  --stop_at N              stop after step N of the --steps schedule (an interruption)\n"
    "  --save_dir DIR           save the trained weights as DIR/model.safetensors and a\n"
    "                           transformers DIR/config.json (GPT2LMHeadModel)\n"
    "  --help                   this list\n";

/* Reads the command line into *a. Returns ARGS_GO_ON, or the exit status (0 after --help, 2
 * after a bad command line, which is named). */
static int parse_args(int argc, char **argv, args *a)
{
    *a = (args){.layers = 4,
                .width = 128,
                .heads = 4,
                .context = 128,
                .vocab = 256,
                .batch = 8,
                .steps = 1000,
                .warmup = -1,
                .accum = 1,
                .seed = 1337,
                .log_every = 50,
                .sample = 300,
                .tied = 1,
                .lr = 2e-3,
                .activation = "gelu_new"};
    const arg_opt opts[] = {
        {"--layers", ARG_INT, &a->layers, 1, 1024},
        {"--width", ARG_INT, &a->width, 1, 65536},
        {"--heads", ARG_INT, &a->heads, 1, 65536},
        {"--context", ARG_INT, &a->context, 2, 1 << 20},
        {"--vocab", ARG_INT, &a->vocab, 256, 1 << 24},
        {"--batch", ARG_INT, &a->batch, 1, 1 << 20},
        {"--steps", ARG_INT, &a->steps, 1, INT_MAX},
        {"--warmup", ARG_INT, &a->warmup, 0, INT_MAX},
        {"--accum", ARG_INT, &a->accum, 1, 1 << 20},
        {"--seed", ARG_INT, &a->seed, 0, INT_MAX},
        {"--log_every", ARG_INT, &a->log_every, 1, INT_MAX},
        {"--sample", ARG_INT, &a->sample, 0, 1 << 20},
        {"--tied", ARG_INT, &a->tied, 0, 1},
        {"--checkpoint_every", ARG_INT, &a->checkpoint_every, 0, INT_MAX},
        {"--total_limit", ARG_INT, &a->total_limit, 0, INT_MAX},
        {"--stop_at", ARG_INT, &a->stop_at, 0, INT_MAX},
        {"--recompute", ARG_INT, &a->recompute, 0, 1},
        {"--resume", ARG_SWITCH, &a->resume, 0, 0},
        {"--data", ARG_STR, &a->data, 0, 0},
        {"--log_with", ARG_STR, &a->log_with, 0, 0},
        {"--project_dir", ARG_STR, &a->project_dir, 0, 0},
        {"--save_dir", ARG_STR, &a->save_dir, 0, 0},
        {"--mixed_precision", ARG_STR, &a->mixed_precision, 0, 0},
        {"--activation", ARG_STR, &a->activation, 0, 0},
        {"--device", ARG_STR, &a->device, 0, 0},
        {"--lr", ARG_REAL, &a->lr, 1e-9, 10},
        {"--dropout", ARG_REAL, &a->dropout, 0, 1},
    };
    int status = args_parse("gpt", usage, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv);
    if (status != ARGS_GO_ON) {
        return status;
    }
    if (a->warmup < 0) {
        a->warmup = a->steps / 20;
    }
    const char *act = a->activation, *dev = a->device;
    const char *bad =
        a->width % a->heads != 0                           ? "--width must be a multiple of --heads"
        : a->dropout >= 1                                  ? "--dropout must be below 1"
        : a->warmup > a->steps                             ? "--warmup must not exceed --steps"
        : a->stop_at > a->steps                            ? "--stop_at must not exceed --steps"
        : strcmp(act, "gelu") && strcmp(act, "gelu_new")   ? "--activation must be gelu or gelu_new"
        : dev && strcmp(dev, "cpu") && strcmp(dev, "cuda") ? "--device must be cpu or cuda"
                                                           : NULL;
    if (bad != NULL) {
        return args_fail("gpt", usage, "%s", bad);
    }
    return ARGS_GO_ON;
}

/* ------------------------------------------------------------------------ the corpus */

typedef struct corpus {
    unsigned char *bytes;
    size_t n, cap;
} corpus;

/* Appends the regular file `path`; on failure says why on stderr and returns -1. */
static int append_file(corpus *c, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "gpt: cannot read %s: %s\n", path, strerror(errno));
        return -1;
    }
    for (;;) {
        if (c->cap - c->n < 65536) {
            size_t cap = c->cap ? 2 * c->cap : 1 << 20;
            unsigned char *b = realloc(c->bytes, cap);
            if (b == NULL) {
                fprintf(stderr, "gpt: out of memory reading %s (%zu bytes so far)\n", path, c->n);
                fclose(f);
                return -1;
            }
            c->bytes = b;
            c->cap = cap;
        }
        size_t got = fread(c->bytes + c->n, 1, c->cap - c->n, f);
        c->n += got;
        if (got == 0) {
            break;
        }
    }
    int bad = ferror(f); /* a read error is not the end of the file: say so */
    fclose(f);
    if (bad) {
        fprintf(stderr, "gpt: cannot read %s: a read error\n", path);
        return -1;
    }
    return 0;
}

/* Appends `path`: a file, or every file below a folder in name order (hidden ones skipped).
 * Only regular files are read: a device or a pipe (/dev/zero, a FIFO) may never end. */
static int append_path(corpus *c, const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "gpt: cannot read %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (S_ISREG(st.st_mode)) {
        return append_file(c, path);
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "gpt: %s is neither a regular file nor a folder\n", path);
        return -1;
    }
    struct dirent **names;
    int n = scandir(path, &names, NULL, alphasort), rc = 0;
    if (n < 0) {
        fprintf(stderr, "gpt: cannot list %s: %s\n", path, strerror(errno));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char sub[PATH_MAX];
        if (names[i]->d_name[0] != '.' && rc == 0) {
            if (snprintf(sub, sizeof sub, "%s/%s", path, names[i]->d_name) >= (int)sizeof sub) {
                fprintf(stderr, "gpt: a path below %s is too long (a link loop?)\n", path);
                rc = -1;
            } else {
                rc = append_path(c, sub);
            }
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

/* The project root: the folder holding include/accel/accel.h, looked for above the
 * executable (build/examples/gpt) and above the current directory. */
static int find_project_root(char *root, size_t cap)
{
    char exe[PATH_MAX] = "";
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[len > 0 ? len : 0] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash != NULL) {
        *slash = '\0'; /* the executable's folder */
    }
    const char *bases[] = {exe, "."};
    for (int b = 0; b < 2; b++) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", bases[b]);
        for (int up = 0; up < 4; up++) {
            char probe[PATH_MAX + 32];
            snprintf(probe, sizeof probe, "%s/include/accel/accel.h", dir);
            if (access(probe, R_OK) == 0) {
                snprintf(root, cap, "%s", dir);
                return 0;
            }
            size_t l = strlen(dir);
            if (l + 4 >= sizeof dir) {
                break;
            }
            memcpy(dir + l, "/..", 4);
        }
    }
    return -1;
}

/* The dataset: window i = tokens [i*T, i*T + T) as "input", shifted by one as "target". The
 * windows are views into the corpus (int32 tokens), so `get` copies nothing. */
typedef struct windows {
    int32_t *tokens;
    int64_t n_tokens, context;
} windows;

static int64_t windows_len(void *ctx)
{
    windows *w = ctx;
    return (w->n_tokens - 1) / w->context;
}

static accel_status windows_get(void *ctx, int64_t i, accel_sample *out)
{
    windows *w = ctx;
    out->n_fields = 2;
    out->name[0] = "input";
    out->field[0] = accel_tensor_view(w->tokens + i * w->context, ACCEL_I32, 1, &w->context);
    out->name[1] = "target";
    out->field[1] = accel_tensor_view(w->tokens + i * w->context + 1, ACCEL_I32, 1, &w->context);
    return ACCEL_OK;
}

/* ------------------------------------------------------------------------ sampling */

/* Generates n bytes after `prompt` (temperature 0.8) and prints them, on the calling process.
 * Only the 256 byte logits are drawn from (a padded vocabulary's other rows are not bytes). */
static void sample_text(nn_ctx *g, const nn_gpt *m, const char *prompt, int n, int context,
                        uint64_t seed)
{
    int V = nn_gpt_get_config(m)->vocab_size;
    int32_t *ids = malloc((size_t)context * sizeof(int32_t));
    float *p = malloc(256 * sizeof(float));
    float *all = malloc((size_t)context * V * sizeof(float)); /* the logits, on the host */
    if (ids == NULL || p == NULL || all == NULL) {
        free(ids);
        free(p);
        free(all);
        return;
    }
    int t = 0;
    for (; prompt[t] && t < context; t++) {
        ids[t] = (unsigned char)prompt[t];
    }
    int prev_grad = nn_ctx_set_grad_enabled(g, 0), prev_train = nn_ctx_set_training(g, 0);
    printf("---- sample ----\n%s", prompt);
    for (int k = 0; k < n; k++) {
        nn_tensor *logits = NULL;
        if (nn_gpt_forward(g, m, ids, NULL, 1, t, &logits, NULL) != ACCEL_OK ||
            nn_tensor_to_host(logits, all) != ACCEL_OK) {
            break;
        }
        const float *last = all + (int64_t)(t - 1) * V;
        double mx = last[0], sum = 0.0;
        for (int v = 1; v < 256; v++) {
            mx = last[v] > mx ? last[v] : mx;
        }
        for (int v = 0; v < 256; v++) {
            p[v] = (float)exp((last[v] - mx) / 0.8);
            sum += p[v];
        }
        seed = seed * 6364136223846793005ull + 1442695040888963407ull; /* LCG for one draw */
        double u = (double)(seed >> 11) * 0x1.0p-53 * sum;
        int next = 255;
        for (int v = 0; v < 256; v++) {
            if ((u -= p[v]) < 0) {
                next = v;
                break;
            }
        }
        putchar(next == '\n' || next == '\t' || (next >= 32 && next < 127) ? next : '?');
        if (t == context) { /* slide the window */
            memmove(ids, ids + 1, (size_t)(context - 1) * sizeof(int32_t));
            t--;
        }
        ids[t++] = next;
        nn_ctx_reset(g);
    }
    printf("\n----------------\n");
    fflush(stdout);
    nn_ctx_set_grad_enabled(g, prev_grad);
    nn_ctx_set_training(g, prev_train);
    free(ids);
    free(p);
    free(all);
}

/* ------------------------------------------------------------------------ saving */

/* The line `  "key": x,` of a float field, x in the shortest %g form that reads back as the
 * same float (1e-05 rather than 9.99999975e-06), and 0.0, not 0 (a float in GPT2Config). */
static void print_float(FILE *f, const char *key, float x)
{
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)x);
        if ((float)strtod(buf, NULL) == x) {
            break;
        }
    }
    fprintf(f, "  \"%s\": %s%s,\n", key, buf, strpbrk(buf, ".e") ? "" : ".0");
}

/*
 * Writes dir/config.json as transformers' GPT2Config reads it, so that dir (with the
 * model.safetensors accel_save_model wrote) loads with GPT2LMHeadModel.from_pretrained(dir).
 * The fields that change the forward pass are the ones nn computes with: the GELU form
 * (nn_gelu's approximate flag: "gelu" is the exact erf form, "gelu_new" the tanh one), the
 * LayerNorm epsilon, tied or separate lm_head, 1/sqrt(head_dim) attention scaling, n_inner 4C.
 * A byte vocabulary has no special tokens, so bos/eos are null (GPT-2's 50256 would be out of
 * range). Written to a temporary file and renamed: a reader never sees half a config.
 */
static int write_hf_config(const char *dir, const nn_gpt_config *c)
{
    char path[PATH_MAX], tmp[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        return -1;
    }
    const char *act = c->act == NN_ACT_GELU ? "gelu" : "gelu_new";
    fprintf(f, "{\n  \"activation_function\": \"%s\",\n", act);
    fprintf(f, "  \"architectures\": [\"GPT2LMHeadModel\"],\n");
    print_float(f, "attn_pdrop", c->dropout);
    fprintf(f, "  \"bos_token_id\": null,\n");
    print_float(f, "embd_pdrop", c->dropout);
    fprintf(f, "  \"eos_token_id\": null,\n  \"initializer_range\": 0.02,\n");
    print_float(f, "layer_norm_epsilon", c->ln_eps);
    fprintf(f, "  \"model_type\": \"gpt2\",\n  \"n_ctx\": %d,\n  \"n_embd\": %d,\n", c->block_size,
            c->n_embd);
    fprintf(f, "  \"n_head\": %d,\n  \"n_inner\": null,\n  \"n_layer\": %d,\n", c->n_head,
            c->n_layer);
    fprintf(f, "  \"n_positions\": %d,\n  \"reorder_and_upcast_attn\": false,\n", c->block_size);
    print_float(f, "resid_pdrop", c->dropout);
    fprintf(f, "  \"scale_attn_by_inverse_layer_idx\": false,\n");
    fprintf(f, "  \"scale_attn_weights\": true,\n  \"tie_word_embeddings\": %s,\n",
            c->tied ? "true" : "false");
    fprintf(f, "  \"torch_dtype\": \"float32\",\n  \"use_cache\": true,\n");
    fprintf(f, "  \"vocab_size\": %d\n}\n", c->vocab_size);
    int bad = ferror(f) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        remove(tmp);
        return -1;
    }
    return 0;
}

/*
 * What the loop itself must carry across a checkpoint, registered with
 * accel_register_for_checkpointing (Accelerate's custom objects): the step count, the loss
 * window of the next log line, and the dropout step counter of the nn ctx (nn_ctx_step), so
 * a resumed run draws the same dropout masks and prints the same numbers. Saved as raw bytes:
 * a checkpoint is read back by the same program on the same machine.
 */
typedef struct run_state {
    int step, window_steps;
    double window_loss;
    uint64_t dropout_step;
    nn_ctx *g;        /* not saved */
    int batch, accum; /* saved to be compared, not loaded */
} run_state;

/* batch and accum: the loader's position counts batches and the schedule counts steps, so a
 * checkpoint continues only a run with the same ones (a checkpoint written before they were
 * saved lacks them and is not checked). */
typedef struct run_state_bytes {
    int32_t step, window_steps;
    double window_loss;
    uint64_t dropout_step;
    int32_t batch, accum;
} run_state_bytes;

static accel_status run_state_save(void *ctx, accel_state_writer *w)
{
    run_state *r = ctx;
    run_state_bytes b = {r->step, r->window_steps, r->window_loss, nn_ctx_step(r->g),
                         .batch = r->batch, .accum = r->accum};
    return accel_state_write(w, &b, sizeof b);
}

static accel_status run_state_load(void *ctx, const void *data, size_t nbytes)
{
    run_state *r = ctx;
    run_state_bytes b;
    if (nbytes != sizeof b && nbytes != offsetof(run_state_bytes, batch)) {
        return ACCEL_ECORRUPT; /* load_state names the file */
    }
    memcpy(&b, data, nbytes);
    if (nbytes == sizeof b && (b.batch != r->batch || b.accum != r->accum)) {
        fprintf(stderr,
                "gpt: the checkpoint's run had --batch %d --accum %d, this one --batch %d "
                "--accum %d: resume with the same values\n",
                (int)b.batch, (int)b.accum, r->batch, r->accum);
        return ACCEL_EINVAL;
    }
    r->step = b.step;
    r->window_steps = b.window_steps;
    r->window_loss = b.window_loss;
    nn_ctx_set_step(r->g, b.dropout_step);
    return ACCEL_OK;
}

/* FNV-1a over the bytes of every parameter's fp32 master weights (copied to the host from
 * wherever the model is): equal fingerprints mean bit-identical weights (the exact-resume
 * check prints it). */
static unsigned long long weights_fingerprint(const nn_params *params)
{
    unsigned long long h = 1469598103934665603ull;
    for (int i = 0; i < nn_params_count(params); i++) {
        const nn_tensor *t = nn_params_get(params, i);
        size_t nbytes = (size_t)nn_numel(t) * sizeof(float);
        unsigned char *bytes = malloc(nbytes);
        ACCEL_CHECK(bytes ? nn_tensor_to_host(t, (float *)bytes) : ACCEL_ENOMEM);
        for (size_t k = 0; k < nbytes; k++) {
            h = (h ^ bytes[k]) * 1099511628211ull;
        }
        free(bytes);
    }
    return h;
}

/* ------------------------------------------------------------------------ training */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    args a;
    int status = parse_args(argc, argv, &a);
    if (status != ARGS_GO_ON) {
        return status;
    }

    /* Accelerator(gradient_accumulation_steps=..., mixed_precision=..., log_with=...) */
    accel *acc = NULL;
    accel_options o = accel_options_default();
    o.gradient_accumulation_steps = a.accum;
    for (int p = ACCEL_PRECISION_NO; a.mixed_precision && p <= ACCEL_PRECISION_FP8; p++) {
        if (strcmp(a.mixed_precision, accel_precision_name((accel_precision)p)) == 0) {
            o.mixed_precision = (accel_precision)p;
        }
    }
    if (a.mixed_precision && o.mixed_precision == ACCEL_PRECISION_UNSET) {
        return args_fail("gpt", usage, "--mixed_precision must be no, fp16, bf16 or fp8, not %s",
                         a.mixed_precision);
    }
    o.log_with = a.log_with;
    if (a.device && strcmp(a.device, "cpu") == 0) {
        o.cpu = 1; /* the accelerator, and with it the model, on the CPU */
    }
    int checkpointing = a.checkpoint_every > 0 || a.resume;
    o.project_dir = a.project_dir ? a.project_dir : (a.log_with || checkpointing ? "runs" : NULL);
    if (checkpointing) { /* ProjectConfiguration(automatic_checkpoint_naming=True, ...) */
        o.automatic_checkpoint_naming = 1;
        o.total_limit = a.total_limit;
    }
    if (a.resume) {
        o.resume_from_checkpoint = "latest"; /* accel_prepare loads the newest checkpoint */
    }
    /* Every process checks the folders it will write (no collective yet, so all fail alike). */
    if ((a.checkpoint_every > 0 && args_check_dir("gpt", "--project_dir", o.project_dir) != 0) ||
        (a.save_dir && args_check_dir("gpt", "--save_dir", a.save_dir) != 0)) {
        return 1;
    }
    ACCEL_CHECK(accel_init(&acc, &o));
    ACCEL_CHECK(accel_set_seed(acc, (uint64_t)a.seed, 0));
    int nproc = accel_num_processes(acc);
    accel_device device = accel_device_of(acc); /* the model's and the nn ctx's */
    if (a.device && strcmp(a.device, "cuda") == 0 && device.type != ACCEL_DEVICE_CUDA) {
        fprintf(stderr,
                "gpt: --device cuda: accel runs on %s here (a build without CUDA, no usable GPU, "
                "or ACCELERATE_USE_CPU=1; ACCEL_LOG_LEVEL=debug says which)\n",
                accel_device_name(acc));
        return 1;
    }

    /* The corpus, as int32 tokens (bytes). Every process reads it: it is small. */
    corpus c = {0};
    if (a.data && append_path(&c, a.data) != 0) {
        fprintf(stderr, "gpt: --data %s: no corpus\n", a.data);
        return 1;
    }
    if (a.data == NULL) {
        char root[PATH_MAX], dir[PATH_MAX + 16];
        if (find_project_root(root, sizeof root) != 0) {
            fprintf(stderr, "gpt: accel's sources (include/accel/accel.h) are not above the "
                            "executable or the current directory; give a corpus with --data\n");
            return 1;
        }
        const char *parts[] = {"src", "include", "docs"};
        for (int i = 0; i < 3; i++) {
            snprintf(dir, sizeof dir, "%s/%s", root, parts[i]);
            if (append_path(&c, dir) != 0) {
                return 1;
            }
        }
    }
    windows w = {.n_tokens = (int64_t)c.n, .context = a.context};
    w.tokens = malloc((c.n + 1) * sizeof(int32_t));
    ACCEL_CHECK(w.tokens ? ACCEL_OK : ACCEL_ENOMEM);
    for (size_t i = 0; i < c.n; i++) {
        w.tokens[i] = c.bytes[i];
    }
    free(c.bytes);
    if (windows_len(&w) < (int64_t)a.batch * nproc) { /* not one batch for every process */
        fprintf(stderr,
                "gpt: the corpus (%lld bytes, %s) is too small: --batch %d x %d process(es) x "
                "--context %d needs at least %lld bytes\n",
                (long long)w.n_tokens, a.data ? a.data : "the project's sources", a.batch, nproc,
                a.context, (long long)a.batch * nproc * a.context + 1);
        return 1;
    }
    accel_dataset ds = {.ctx = &w, .len = windows_len, .get = windows_get};
    accel_loader_options lo = accel_loader_options_default();
    lo.batch_size = a.batch;
    lo.shuffle = 1;
    lo.drop_last = 1;
    accel_loader *dl;
    ACCEL_CHECK(accel_loader_new(acc, &ds, &lo, &dl));

    /* The model: GPT-2 with byte vocabulary, its parameters in an accel_model. */
    nn_gpt_config cfg = nn_gpt_config_default();
    cfg.n_layer = a.layers;
    cfg.n_head = a.heads;
    cfg.n_embd = a.width;
    cfg.block_size = a.context;
    cfg.vocab_size = a.vocab;
    cfg.tied = a.tied;
    cfg.act = strcmp(a.activation, "gelu") == 0 ? NN_ACT_GELU : NN_ACT_GELU_TANH;
    cfg.dropout = (float)a.dropout;
    accel_model *model = NULL;
    nn_params *params = NULL;
    nn_gpt *gpt = NULL;
    ACCEL_CHECK(accel_model_new(acc, &model));
    ACCEL_CHECK(nn_params_for_model(&params, model));
    ACCEL_CHECK(nn_gpt_declare(&gpt, params, &cfg));
    ACCEL_CHECK(nn_params_bind(params));
    ACCEL_CHECK(nn_params_init(params, (uint64_t)a.seed));
    nn_gpt_set_recompute(gpt, a.recompute);

    accel_adam_options ao = accel_adamw_options_default();
    ao.lr = a.lr;
    ao.beta2 = 0.95;
    ao.weight_decay = 0.1;
    accel_optimizer *opt = accel_adamw(acc, model, &ao);
    ACCEL_CHECK(opt ? ACCEL_OK : accel_last_status(acc));
    ACCEL_CHECK(accel_optimizer_no_decay_group(opt, NULL, NULL)); /* biases, LayerNorms */
    /* A prepared scheduler advances num_processes times per optimizer step (Accelerate counts
     * the schedule in batches of the unsharded loader), so give it its lengths in those units. */
    accel_scheduler *sch =
        accel_cosine_schedule(acc, opt, (long long)a.warmup * nproc, (long long)a.steps * nproc);
    ACCEL_CHECK(sch ? ACCEL_OK : accel_last_status(acc));

    /* The step's arena and tape; its dropout counter is part of the checkpointed run state,
     * registered before accel_prepare, which restores it with everything else on --resume. */
    nn_ctx *g = NULL;
    ACCEL_CHECK(nn_ctx_new(&g));
    ACCEL_CHECK(nn_ctx_set_device(g, device));
    nn_ctx_set_seed(g, (uint64_t)a.seed);
    run_state rs = {.g = g, .batch = a.batch, .accum = a.accum};
    ACCEL_CHECK(accel_register_for_checkpointing(acc, run_state_save, run_state_load, &rs));
    ACCEL_CHECK(accel_prepare(acc, model, opt, sch, dl));
    int resumed = accel_checkpoint_dir(acc) != NULL;
    if (a.accum > accel_loader_len(dl)) { /* every step would end early, at the epoch's end */
        fprintf(stderr, "gpt: --accum %d is more than the %lld batches of an epoch on a process\n",
                a.accum, (long long)accel_loader_len(dl));
        return 1;
    }

    long long tokens_per_step = (long long)a.batch * a.context * a.accum * nproc;
    accel_print(acc,
                "gpt: %lld parameters (%d layers, width %d, %d heads, context %d), corpus %lld "
                "bytes, %d process(es) x batch %d x accumulation %d = %lld tokens/step, "
                "precision %s, on %s\n",
                (long long)nn_params_numel(params), a.layers, a.width, a.heads, a.context,
                (long long)w.n_tokens, nproc, a.batch, a.accum, tokens_per_step,
                accel_precision_name(accel_mixed_precision(acc)), accel_device_name(acc));
    accel_value config[] = {ACCEL_SCALAR("layers", a.layers),
                            ACCEL_SCALAR("width", a.width),
                            ACCEL_SCALAR("heads", a.heads),
                            ACCEL_SCALAR("context", a.context),
                            ACCEL_SCALAR("batch", a.batch),
                            ACCEL_SCALAR("steps", a.steps),
                            ACCEL_SCALAR("lr", a.lr),
                            ACCEL_SCALAR("accum", a.accum),
                            ACCEL_SCALAR("num_processes", nproc)};
    ACCEL_CHECK(accel_init_trackers(acc, "gpt", config, (int)(sizeof config / sizeof config[0])));
    if (resumed) {
        /* accel_prepare loaded the newest valid checkpoint_<i>; the loader continues with the
         * next unseen batch, so the run goes on as if never interrupted. The trackers drop
         * what the interrupted run logged after the checkpoint: the next step logged is
         * rs.step + 1. */
        accel_print(acc, "resumed from %s at step %d\n", accel_checkpoint_dir(acc), rs.step);
        ACCEL_CHECK(accel_trackers_resume(acc, rs.step + 1));
    } else if (a.resume) {
        accel_print(acc, "gpt: no checkpoint in %s/checkpoints yet; starting at step 0\n",
                    o.project_dir);
    }

    accel_progress_options po = accel_progress_options_default();
    po.total = a.steps;
    po.initial = rs.step; /* a resumed run's bar continues where the checkpoint left off */
    po.desc = "train";
    accel_progress *bar;
    ACCEL_CHECK(accel_progress_new(acc, &po, &bar));

    /* The time spent inside accel_loader_next against the whole loop: the loader has no
     * worker threads here, so this is all that sampling, sharding and collating cost. */
    int micro = 0, first_step = rs.step, last_step = a.stop_at > 0 ? a.stop_at : a.steps;
    double step_loss = 0.0, grad_norm = 0.0, t_window = now(), t_wait = 0.0, t_loop = now();
    while (rs.step < last_step) {
        accel_batch *b;
        double t0 = now();
        accel_status st = accel_loader_next(dl, &b);
        t_wait += now() - t0;
        if (st == ACCEL_EOF) {
            continue; /* the next call starts the next epoch */
        }
        ACCEL_CHECK(st);
        const accel_tensor *x = accel_batch_field(b, "input"), *y = accel_batch_field(b, "target");

        ACCEL_CHECK(accel_accumulate(acc, model)); /* with accelerator.accumulate(model): */
        nn_tensor *loss = NULL;
        ACCEL_CHECK(nn_gpt_forward(g, gpt, x->data, y->data, b->rows, a.context, NULL, &loss));
        ACCEL_CHECK(accel_backward(acc, loss));
        step_loss += nn_item(loss);
        nn_ctx_reset(g); /* explicitly, so a checkpoint sees the dropout counter of the next step */
        micro++;
        if (!accel_sync_gradients(acc)) {
            continue; /* accumulating: optimizer, scheduler and zero_grad would be no-ops */
        }
        ACCEL_CHECK(accel_clip_grad_norm(acc, model, 1.0, 2.0, &grad_norm));
        ACCEL_CHECK(accel_optimizer_step(opt));
        ACCEL_CHECK(accel_scheduler_step(sch));
        ACCEL_CHECK(accel_optimizer_zero_grad(opt));
        int step = ++rs.step;
        rs.window_loss += step_loss / micro;
        rs.window_steps++;
        step_loss = 0.0;
        micro = 0;

        if (step % a.log_every == 0 || step == a.steps || step == 1) {
            /* The mean loss of the window over every process (a collective: every process
             * reaches this line at the same step). */
            double loss_mean = rs.window_loss / rs.window_steps;
            ACCEL_CHECK(
                accel_allreduce(acc, &loss_mean, &loss_mean, 1, ACCEL_F64, ACCEL_AVG, NULL));
            double dt = now() - t_window, lr = accel_scheduler_get_last_lr(sch, 0);
            double tok_s = (double)tokens_per_step * rs.window_steps / dt;
            accel_progress_set_field(bar, "loss", loss_mean);
            accel_progress_set_field(bar, "lr", lr);
            accel_print(acc, "step %5d/%d | loss %.4f | lr %.3e | grad norm %.3f | %.0f tok/s\n",
                        step, a.steps, loss_mean, lr, grad_norm, tok_s);
            accel_value v[] = {ACCEL_SCALAR("loss", loss_mean), ACCEL_SCALAR("lr", lr),
                               ACCEL_SCALAR("grad_norm", grad_norm),
                               ACCEL_SCALAR("tokens_per_s", tok_s)};
            ACCEL_CHECK(accel_log(acc, v, 4, step));
            rs.window_loss = 0.0;
            rs.window_steps = 0;
            t_window = now();
        }
        /* After the fields: the line this update may print (the last one, at 100 %) shows the
         * step's loss, and accel_progress_close has nothing newer to print. */
        accel_progress_update(bar, 1);
        if (a.checkpoint_every > 0 && step % a.checkpoint_every == 0) {
            ACCEL_CHECK(accel_save_state(acc, NULL)); /* a collective */
            accel_print(acc, "saved %s\n", accel_checkpoint_dir(acc));
        }
    }
    accel_progress_close(bar);
    t_loop = now() - t_loop;

    /* The largest share of loop time any process spent waiting for data (a collective). */
    double wait[3] = {rs.step > first_step ? t_wait / t_loop : 0.0, t_wait, t_loop};
    ACCEL_CHECK(accel_allreduce(acc, wait, wait, 3, ACCEL_F64, ACCEL_MAX, NULL));
    accel_print(acc,
                "data wait: %.3f%% of step time (%.1f ms in accel_loader_next over %d steps "
                "taking %.2f s; the maxima over processes)\n",
                100.0 * wait[0], 1e3 * wait[1], rs.step - first_step, wait[2]);
    /* Under ZeRO stage 3 every unit gathered first (collective; a no-op otherwise): released
     * units read as zeros on the CPU and are not mapped at all on a GPU. */
    ACCEL_CHECK(accel_model_gather_all(model));
    accel_print(acc, "final step %d | weights fingerprint %016llx\n", rs.step,
                weights_fingerprint(params));
    if (a.log_with) { /* where to look: trackers write under logging_dir (= project_dir) */
        const char *logs = accel_resolved_options(acc)->logging_dir;
        int tb = strstr(a.log_with, "tensorboard") || strstr(a.log_with, "all");
        accel_print(acc, "trackers (%s) wrote under %s%s%s\n", a.log_with, logs,
                    tb ? "; view with: tensorboard --logdir " : "", tb ? logs : "");
    }
    if (accel_checkpoint_dir(acc)) {
        accel_print(acc, "newest checkpoint: %s (continue with --resume)\n",
                    accel_checkpoint_dir(acc));
    }

    if (a.save_dir) {
        ACCEL_CHECK(accel_save_model(acc, model, a.save_dir, NULL)); /* a collective */
        if (accel_is_main_process(acc) && write_hf_config(a.save_dir, nn_gpt_get_config(gpt))) {
            fprintf(stderr, "gpt: cannot write %s/config.json\n", a.save_dir);
            return 1;
        }
        accel_print(acc, "saved %s/model.safetensors and config.json\n", a.save_dir);
    }
    if (a.sample > 0 && accel_is_main_process(acc)) {
        sample_text(g, gpt, "/*\n * ", a.sample, a.context, (uint64_t)a.seed);
    }
    ACCEL_CHECK(accel_end_training(acc));

    nn_ctx_free(g);
    nn_gpt_free(gpt);
    nn_params_free(params);
    accel_free(acc);
    free(w.tokens);
    return 0;
}
