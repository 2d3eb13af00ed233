/*
 * gpt: a byte-level GPT trained on a text corpus, data-parallel.
 *
 *     accel launch --num_processes 2 build/examples/gpt                   (what `make demo` runs)
 *     build/examples/gpt --steps 50 --log_with jsonl --project_dir runs
 *     build/examples/gpt --data shakespeare.txt --layers 6 --width 192 --context 256
 *
 * By default the corpus is accel's own source and documentation (src/, include/, docs/ of the
 * project, found from the executable's or the current directory), so there is nothing to
 * download; --data names a file or a folder (read recursively) instead. Every byte is a token
 * (vocabulary 256). The model is GPT-2 (pre-LayerNorm blocks, tied embeddings) from the nn
 * toolkit, trained with AdamW, linear warmup then cosine decay, gradient clipping at 1.0 and
 * optional gradient accumulation and mixed precision. The main process shows a progress bar,
 * prints a line with loss, learning rate, gradient norm and tokens/s every --log_every steps,
 * logs the same values to the trackers named by --log_with, and finally samples some text.
 */
#define _DEFAULT_SOURCE /* scandir, PATH_MAX under -std=c11 */

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <accel/accel.h>
#include <accel/check.h>
#include <accel/data.h>
#include <accel/nn.h>

/* ------------------------------------------------------------------------ command line */

typedef struct args {
    int layers, width, heads, context, batch, steps, warmup, accum, seed, log_every, sample;
    double lr;
    const char *data, *mixed_precision, *log_with, *project_dir, *save_dir;
} args;

static const char usage[] =
    "usage: gpt [options]\n"
    "  --data PATH              text file or folder (default: the project's src, include, docs)\n"
    "  --layers N --width N --heads N --context N      model (default 4, 128, 4, 128)\n"
    "  --batch N                sequences per process per micro-step (default 8)\n"
    "  --steps N                optimizer steps (default 1000)\n"
    "  --lr X --warmup N        peak learning rate and warmup steps (default 2e-3, steps/20)\n"
    "  --accum N                gradient accumulation steps (default 1)\n"
    "  --mixed_precision P      no | fp16 | bf16 (default: accel's configuration)\n"
    "  --seed N                 model init and data order (default 1337)\n"
    "  --log_with LIST          trackers: tensorboard,jsonl,csv,mlflow or all (default none)\n"
    "  --project_dir DIR        where trackers write (default runs when --log_with is given)\n"
    "  --log_every N            steps between log lines (default 50)\n"
    "  --sample N               bytes of text generated at the end (default 300)\n"
    "  --save_dir DIR           save the trained weights as DIR/model.safetensors\n";

static int parse_args(int argc, char **argv, args *a)
{
    *a = (args){.layers = 4,
                .width = 128,
                .heads = 4,
                .context = 128,
                .batch = 8,
                .steps = 1000,
                .warmup = -1,
                .accum = 1,
                .seed = 1337,
                .log_every = 50,
                .sample = 300,
                .lr = 2e-3};
    struct {
        const char *flag;
        int *i;
        const char **s;
    } opts[] = {
        {"--layers", &a->layers, NULL},     {"--width", &a->width, NULL},
        {"--heads", &a->heads, NULL},       {"--context", &a->context, NULL},
        {"--batch", &a->batch, NULL},       {"--steps", &a->steps, NULL},
        {"--warmup", &a->warmup, NULL},     {"--accum", &a->accum, NULL},
        {"--seed", &a->seed, NULL},         {"--log_every", &a->log_every, NULL},
        {"--sample", &a->sample, NULL},     {"--data", NULL, &a->data},
        {"--log_with", NULL, &a->log_with}, {"--project_dir", NULL, &a->project_dir},
        {"--save_dir", NULL, &a->save_dir}, {"--mixed_precision", NULL, &a->mixed_precision}};
    for (int i = 1; i < argc; i += 2) {
        size_t k = 0, n = sizeof opts / sizeof opts[0];
        if (i + 1 < argc && strcmp(argv[i], "--lr") == 0) {
            a->lr = atof(argv[i + 1]);
            continue;
        }
        while (k < n && strcmp(argv[i], opts[k].flag) != 0) {
            k++;
        }
        if (k == n || i + 1 >= argc) {
            return -1;
        }
        if (opts[k].i) {
            *opts[k].i = atoi(argv[i + 1]);
        } else {
            *opts[k].s = argv[i + 1];
        }
    }
    if (a->warmup < 0) {
        a->warmup = a->steps / 20;
    }
    if (a->layers < 1 || a->width < 1 || a->heads < 1 || a->width % a->heads != 0 ||
        a->context < 2 || a->batch < 1 || a->steps < 1 || a->accum < 1 || a->log_every < 1 ||
        a->sample < 0 || !(a->lr > 0)) {
        fprintf(stderr, "gpt: invalid option value (width must be a multiple of heads)\n");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ the corpus */

typedef struct corpus {
    unsigned char *bytes;
    size_t n, cap;
} corpus;

static int append_file(corpus *c, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return -1;
    }
    for (;;) {
        if (c->cap - c->n < 65536) {
            size_t cap = c->cap ? 2 * c->cap : 1 << 20;
            unsigned char *b = realloc(c->bytes, cap);
            if (b == NULL) {
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
    fclose(f);
    return 0;
}

/* Appends `path`: a file, or every file below a folder in name order (hidden ones skipped). */
static int append_path(corpus *c, const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        return append_file(c, path);
    }
    struct dirent **names;
    int n = scandir(path, &names, NULL, alphasort), rc = n < 0 ? -1 : 0;
    for (int i = 0; i < n; i++) {
        char sub[PATH_MAX];
        if (names[i]->d_name[0] != '.' && rc == 0) {
            snprintf(sub, sizeof sub, "%s/%s", path, names[i]->d_name);
            rc = append_path(c, sub);
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

/* Generates n bytes after `prompt` (temperature 0.8) and prints them, on the calling process. */
static void sample_text(nn_ctx *g, const nn_gpt *m, const char *prompt, int n, int context,
                        uint64_t seed)
{
    int32_t *ids = malloc((size_t)context * sizeof(int32_t));
    float *p = malloc(256 * sizeof(float));
    if (ids == NULL || p == NULL) {
        free(ids);
        free(p);
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
        if (nn_gpt_forward(g, m, ids, NULL, 1, t, &logits, NULL) != ACCEL_OK) {
            break;
        }
        const float *last = logits->data + (int64_t)(t - 1) * 256;
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
    if (parse_args(argc, argv, &a) != 0) {
        fputs(usage, stderr);
        return 2;
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
        fprintf(stderr, "gpt: unknown --mixed_precision %s (no, fp16, bf16)\n", a.mixed_precision);
        return 2;
    }
    o.log_with = a.log_with;
    o.project_dir = a.project_dir ? a.project_dir : (a.log_with ? "runs" : NULL);
    ACCEL_CHECK(accel_init(&acc, &o));
    ACCEL_CHECK(accel_set_seed(acc, (uint64_t)a.seed, 0));
    int nproc = accel_num_processes(acc);

    /* The corpus, as int32 tokens (bytes). Every process reads it: it is small. */
    corpus c = {0};
    if (a.data && append_path(&c, a.data) != 0) {
        fprintf(stderr, "gpt: cannot read --data %s\n", a.data);
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
                fprintf(stderr, "gpt: cannot read %s\n", dir);
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
    if (windows_len(&w) < (int64_t)a.batch * nproc) {
        fprintf(stderr, "gpt: the corpus (%lld bytes) is too small for context %d\n",
                (long long)w.n_tokens, a.context);
        return 1;
    }
    accel_dataset ds = {.ctx = &w, .len = windows_len, .get = windows_get};
    accel_loader_options lo = accel_loader_options_default();
    lo.batch_size = a.batch;
    lo.shuffle = 1;
    lo.drop_last = 1;
    accel_loader *dl = accel_loader_new(acc, &ds, &lo);
    ACCEL_CHECK(dl ? ACCEL_OK : accel_last_status(acc));

    /* The model: GPT-2 with byte vocabulary, its parameters in an accel_model. */
    nn_gpt_config cfg = nn_gpt_config_default();
    cfg.n_layer = a.layers;
    cfg.n_head = a.heads;
    cfg.n_embd = a.width;
    cfg.block_size = a.context;
    cfg.vocab_size = 256;
    cfg.dropout = 0.0f;
    accel_model *model = NULL;
    nn_params *params = NULL;
    nn_gpt *gpt = NULL;
    ACCEL_CHECK(accel_model_new(acc, &model));
    ACCEL_CHECK(nn_params_for_model(&params, model));
    ACCEL_CHECK(nn_gpt_declare(&gpt, params, &cfg));
    ACCEL_CHECK(nn_params_bind(params));
    ACCEL_CHECK(nn_params_init(params, (uint64_t)a.seed));

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
    ACCEL_CHECK(accel_prepare(acc, model, opt, sch, dl));

    long long tokens_per_step = (long long)a.batch * a.context * a.accum * nproc;
    accel_print(acc,
                "gpt: %lld parameters (%d layers, width %d, %d heads, context %d), corpus %lld "
                "bytes, %d process(es) x batch %d x accumulation %d = %lld tokens/step, "
                "precision %s\n",
                (long long)nn_params_numel(params), a.layers, a.width, a.heads, a.context,
                (long long)w.n_tokens, nproc, a.batch, a.accum, tokens_per_step,
                accel_precision_name(accel_mixed_precision(acc)));
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

    accel_progress_options po = accel_progress_options_default();
    po.total = a.steps;
    po.desc = "train";
    accel_progress *bar = accel_progress_new(acc, &po);
    nn_ctx *g = NULL;
    ACCEL_CHECK(nn_ctx_new(&g));

    int step = 0, micro = 0;
    double step_loss = 0.0, window_loss = 0.0, grad_norm = 0.0, t_window = now();
    int window_steps = 0;
    while (step < a.steps) {
        accel_batch *b;
        accel_status st = accel_loader_next(dl, &b);
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
        micro++;
        if (!accel_sync_gradients(acc)) {
            continue; /* accumulating: optimizer, scheduler and zero_grad would be no-ops */
        }
        ACCEL_CHECK(accel_clip_grad_norm(acc, model, 1.0, 2.0, &grad_norm));
        ACCEL_CHECK(accel_optimizer_step(opt));
        ACCEL_CHECK(accel_scheduler_step(sch));
        ACCEL_CHECK(accel_optimizer_zero_grad(opt));
        step++;
        window_loss += step_loss / micro;
        window_steps++;
        step_loss = 0.0;
        micro = 0;
        accel_progress_update(bar, 1);

        if (step % a.log_every == 0 || step == a.steps || step == 1) {
            /* The mean loss of the window over every process (a collective: every process
             * reaches this line at the same step). */
            double loss_mean = window_loss / window_steps;
            ACCEL_CHECK(
                accel_allreduce(acc, &loss_mean, &loss_mean, 1, ACCEL_F64, ACCEL_AVG, NULL));
            double dt = now() - t_window, lr = accel_scheduler_get_last_lr(sch, 0);
            double tok_s = (double)tokens_per_step * window_steps / dt;
            accel_progress_set_field(bar, "loss", loss_mean);
            accel_progress_set_field(bar, "lr", lr);
            accel_print(acc, "step %5d/%d | loss %.4f | lr %.3e | grad norm %.3f | %.0f tok/s\n",
                        step, a.steps, loss_mean, lr, grad_norm, tok_s);
            accel_value v[] = {ACCEL_SCALAR("loss", loss_mean), ACCEL_SCALAR("lr", lr),
                               ACCEL_SCALAR("grad_norm", grad_norm),
                               ACCEL_SCALAR("tokens_per_s", tok_s)};
            ACCEL_CHECK(accel_log(acc, v, 4, step));
            window_loss = 0.0;
            window_steps = 0;
            t_window = now();
        }
    }
    accel_progress_close(bar);

    if (a.save_dir) {
        ACCEL_CHECK(accel_save_model(acc, model, a.save_dir, NULL)); /* a collective */
        accel_print(acc, "saved %s/model.safetensors\n", a.save_dir);
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
