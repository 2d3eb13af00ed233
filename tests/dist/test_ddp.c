/* ACCEL_TEST_NPROCS: 1 2 4
 *
 * Data-parallel equivalence: N processes x per-process batch B x accumulation K reach the same
 * parameters as one process taking the whole N*B*K batch per step (computed here, in double,
 * without accel), over 10 steps, for SGD + momentum and AdamW, K in {1, 3}, with a linear
 * schedule that must tick N times per real step. Also: every process starts from process 0's
 * weights whatever it initialised, a frozen parameter stays bit-identical, a parameter never
 * marked ready still syncs, and all processes end bit-identical.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/internal.h"

#define IN 6
#define HID 8
#define OUT 3
#define B 2
#define STEPS 10
#define TOTAL 100

enum { W1, B1, W2, B2, NP }; /* registration order */
static const int64_t numel[NP] = {HID * IN, HID, OUT *HID, OUT};

static double hash01(unsigned long long a, unsigned long long b)
{
    unsigned long long x = a * 0x9E3779B97F4A7C15ULL ^ (b + 0x632BE59BD9B4E019ULL);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 29;
    return (double)(x >> 11) / (double)(1ULL << 53) * 2.0 - 1.0;
}

static void sample(long long i, double *x, double *t)
{
    for (int d = 0; d < IN; d++) {
        x[d] = hash01((unsigned long long)i, (unsigned long long)d);
    }
    for (int o = 0; o < OUT; o++) {
        t[o] = hash01((unsigned long long)i, 100ULL + (unsigned long long)o);
    }
}

/* loss = mean over the n samples [first, first + n) of 0.5 |W2 tanh(W1 x + b1) + b2 - t|^2;
 * adds scale * dloss/dparam into g[p] (double). */
static void grads(double *const w[NP], long long first, int n, double scale, double *g[NP])
{
    for (int s = 0; s < n; s++) {
        double x[IN], t[OUT], h[HID], y[OUT], dy[OUT], dh[HID];
        sample(first + s, x, t);
        for (int j = 0; j < HID; j++) {
            double a = w[B1][j];
            for (int d = 0; d < IN; d++) {
                a += w[W1][j * IN + d] * x[d];
            }
            h[j] = tanh(a);
        }
        for (int o = 0; o < OUT; o++) {
            y[o] = w[B2][o];
            for (int j = 0; j < HID; j++) {
                y[o] += w[W2][o * HID + j] * h[j];
            }
            dy[o] = (y[o] - t[o]) * scale / n;
        }
        for (int j = 0; j < HID; j++) {
            dh[j] = 0;
            for (int o = 0; o < OUT; o++) {
                dh[j] += w[W2][o * HID + j] * dy[o];
            }
            dh[j] *= 1 - h[j] * h[j];
        }
        for (int o = 0; o < OUT; o++) {
            g[B2][o] += dy[o];
            for (int j = 0; j < HID; j++) {
                g[W2][o * HID + j] += dy[o] * h[j];
            }
        }
        for (int j = 0; j < HID; j++) {
            g[B1][j] += dh[j];
            for (int d = 0; d < IN; d++) {
                g[W1][j * IN + d] += dh[j] * x[d];
            }
        }
    }
}

static void init_weights(double *w[NP], unsigned long long seed)
{
    for (int p = 0; p < NP; p++) {
        for (int64_t i = 0; i < numel[p]; i++) {
            w[p][i] = 0.5 * hash01(seed, (unsigned long long)(p * 1000 + i));
        }
    }
}

typedef struct run_cfg {
    int adamw, k;
} run_cfg;

static const double LR_SGD = 0.05, MOM = 0.9, WD = 0.01, LR_ADAM = 1e-2;

/* lr after `ticks` ticks of linear(0 warmup, TOTAL). */
static double lr_at(double base, long long ticks)
{
    return base * (double)(TOTAL - ticks) / TOTAL;
}

static void reference(const run_cfg *c, int n_procs, double *w[NP])
{
    double *g[NP], *m1[NP], *m2[NP];
    for (int p = 0; p < NP; p++) {
        g[p] = calloc((size_t)numel[p], sizeof(double));
        m1[p] = calloc((size_t)numel[p], sizeof(double));
        m2[p] = calloc((size_t)numel[p], sizeof(double));
    }
    init_weights(w, 1000); /* process 0's initialisation */
    int global = n_procs * B * c->k;
    for (int s = 0; s < STEPS; s++) {
        for (int p = 0; p < NP; p++) {
            memset(g[p], 0, (size_t)numel[p] * sizeof(double));
        }
        grads(w, (long long)s * global, global, 1.0, g);
        double lr = lr_at(c->adamw ? LR_ADAM : LR_SGD, (long long)s * n_procs);
        for (int p = 0; p < NP; p++) {
            if (c->adamw && p == B1) {
                continue; /* frozen */
            }
            for (int64_t i = 0; i < numel[p]; i++) {
                if (!c->adamw) {
                    double d = g[p][i] + WD * w[p][i];
                    m1[p][i] = (s == 0) ? d : MOM * m1[p][i] + d;
                    w[p][i] -= lr * m1[p][i];
                } else {
                    w[p][i] *= 1 - lr * WD;
                    m1[p][i] = 0.9 * m1[p][i] + 0.1 * g[p][i];
                    m2[p][i] = 0.999 * m2[p][i] + 0.001 * g[p][i] * g[p][i];
                    double bc1 = 1 - pow(0.9, s + 1), bc2 = 1 - pow(0.999, s + 1);
                    w[p][i] -= lr / bc1 * m1[p][i] / (sqrt(m2[p][i]) / sqrt(bc2) + 1e-8);
                }
            }
        }
    }
    for (int p = 0; p < NP; p++) {
        free(g[p]), free(m1[p]), free(m2[p]);
    }
}

static void run(accel *acc, const run_cfg *c)
{
    int rank = accel_process_index(acc), n = accel_num_processes(acc);
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    const char *names[NP] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
    const int64_t shapes[NP][2] = {{HID, IN}, {HID, 1}, {OUT, HID}, {OUT, 1}};
    for (int p = 0; p < NP; p++) {
        int nd = (p == B1 || p == B2) ? 1 : 2;
        CHECK_OK(acc, accel_model_add_param(m, names[p], nd, shapes[p], NULL));
    }
    /* Every process initialises differently; prepare must give everyone process 0's. */
    double *w[NP], *g[NP];
    for (int p = 0; p < NP; p++) {
        w[p] = calloc((size_t)numel[p], sizeof(double));
        g[p] = calloc((size_t)numel[p], sizeof(double));
    }
    init_weights(w, 1000 + (unsigned long long)rank);
    for (int p = 0; p < NP; p++) {
        const accel_param *pp = accel_model_param(m, p);
        for (int64_t i = 0; i < numel[p]; i++) {
            pp->data[i] = (float)w[p][i];
        }
    }
    accel_optimizer *opt;
    if (c->adamw) {
        CHECK_OK(acc, accel_model_freeze(m, B1, 1));
        accel_adam_options o = accel_adamw_options_default();
        o.lr = LR_ADAM;
        o.weight_decay = WD;
        opt = accel_adamw(acc, m, &o);
    } else {
        accel_sgd_options o = accel_sgd_options_default();
        o.lr = LR_SGD;
        o.momentum = MOM;
        o.weight_decay = WD;
        opt = accel_sgd(acc, m, &o);
    }
    CHECK(opt != NULL);
    accel_scheduler *sch = accel_linear_schedule(acc, opt, 0, TOTAL);
    CHECK(sch != NULL);
    CHECK_OK(acc, accel_prepare(acc, sch, opt, m));
    CHECK(accel_model_num_buckets(m) == 2);
    float frozen_before[HID];
    memcpy(frozen_before, accel_model_param(m, B1)->data, sizeof(frozen_before));

    int global = n * B * c->k;
    for (int s = 0; s < STEPS; s++) {
        for (int j = 0; j < c->k; j++) {
            CHECK_OK(acc, accel_accumulate(acc, m));
            CHECK(accel_sync_gradients(acc) == (j == c->k - 1));
            double seed = accel_backward_begin(acc);
            CHECK_NEAR(seed, 1.0 / c->k, 1e-15);
            for (int p = 0; p < NP; p++) {
                const accel_param *pp = accel_model_param(m, p);
                for (int64_t i = 0; i < numel[p]; i++) {
                    w[p][i] = pp->data[i];
                }
                memset(g[p], 0, (size_t)numel[p] * sizeof(double));
            }
            long long first = (long long)s * global + (long long)(j * n + rank) * B;
            grads(w, first, B, seed, g);
            /* Backward order: fc2.bias, fc2.weight, fc1.bias, fc1.weight. With K = 3,
             * fc1.weight is never marked: accel_backward_end must still sync it. */
            for (int p = NP - 1; p >= 0; p--) {
                const accel_param *pp = accel_model_param(m, p);
                for (int64_t i = 0; i < numel[p]; i++) {
                    pp->grad[i] += (float)g[p][i];
                }
                if (pp->frozen) {
                    pp->grad[0] = 1000.0f + (float)rank; /* must be ignored everywhere */
                }
                if (!(c->k == 3 && p == W1)) {
                    CHECK_OK(acc, accel_grad_ready(m, p));
                }
            }
            CHECK_OK(acc, accel_backward_end(acc));
            if (accel_sync_gradients(acc)) {
                double norm;
                CHECK_OK(acc, accel_clip_grad_norm(acc, m, 1e9, 2.0, &norm));
                CHECK(norm > 0);
            }
            CHECK_OK(acc, accel_optimizer_step(opt));
            CHECK_OK(acc, accel_scheduler_step(sch));
            CHECK_OK(acc, accel_optimizer_zero_grad(opt));
        }
    }
    CHECK_MSG(accel_scheduler_last_step(sch) == (long long)STEPS * n, "%lld ticks",
              accel_scheduler_last_step(sch));
    CHECK(!c->adamw ||
          memcmp(frozen_before, accel_model_param(m, B1)->data, sizeof(frozen_before)) == 0);

    /* Against the one-process reference. */
    double *ref[NP];
    for (int p = 0; p < NP; p++) {
        ref[p] = calloc((size_t)numel[p], sizeof(double));
    }
    reference(c, n, ref);
    double num = 0, den = 0;
    for (int p = 0; p < NP; p++) {
        const accel_param *pp = accel_model_param(m, p);
        for (int64_t i = 0; i < numel[p]; i++) {
            double d = pp->data[i] - ref[p][i];
            num += d * d;
            den += ref[p][i] * ref[p][i];
        }
    }
    double rel = sqrt(num / den);
    CHECK_MSG(rel <= 1e-5, "rank %d adamw %d k %d: relative error %g", rank, c->adamw, c->k, rel);

    /* Every process holds the same bits as process 0. */
    size_t total = accel_model_numel(m);
    float *mine = accel_model_master(m), *root = malloc(total * sizeof(float));
    memcpy(root, mine, total * sizeof(float));
    CHECK_OK(acc, accel_broadcast(acc, root, root, total, ACCEL_F32, 0, NULL));
    CHECK(memcmp(root, mine, total * sizeof(float)) == 0);
    free(root);
    for (int p = 0; p < NP; p++) {
        free(w[p]), free(g[p]), free(ref[p]);
    }
    if (rank == 0) {
        printf("adamw=%d k=%d n=%d: relative error %.3g\n", c->adamw, c->k, n, rel);
    }
    accel_free_memory(acc); /* the next configuration reuses the accelerator */
}

int main(void)
{
    unsetenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS");
    for (int k = 1; k <= 3; k += 2) {
        accel_options o = accel_options_default();
        o.gradient_accumulation_steps = k;
        o.first_bucket_mb = 64.0 / 1048576.0;
        o.bucket_cap_mb = 256.0 / 1048576.0;
        accel *acc;
        CHECK_OK(NULL, accel_init(&acc, &o));
        for (int adamw = 0; adamw <= 1; adamw++) {
            run_cfg c = {adamw, k};
            run(acc, &c);
        }
        accel_free(acc);
    }
    return 0;
}
