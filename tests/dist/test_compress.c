/* ACCEL_TEST_NPROCS: 2 3
 *
 * Compressed gradient communication (comm_dtype = ACCEL_BF16 / ACCEL_F16, DDP's bf16/fp16
 * compression hooks):
 *  1. After a communicating backward every gradient equals the fp32 average of the processes'
 *     gradients to the dtype's tolerance (each input and the result are rounded once: |err| <=
 *     2 * 2^-p * max_r |g_r| with p = 8 (bf16) / 11 (f16)), is exactly representable in the
 *     dtype (the wire format really was 16-bit), and is identical on every process. Buckets
 *     are small so several are in flight.
 *  2. N processes x batch b with bf16 compression track 1 process x batch N*b in fp32 (a
 *     linear least-squares model, SGD, 20 steps): max |w - w_ref| <= 2e-3 (weights ~1; each
 *     step's gradient is off by <= 2^-7 relative, lr 0.1, so 20 steps drift ~1e-3 at most).
 */
#include <string.h>

#include "check.h"

#define NP 3
#define PN 3000

static float gen(uint64_t key, uint64_t i)
{
    uint64_t z = key * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) * 0x1p-53 * 2.0 - 1.0);
}

static float round_to(accel_dtype dt, float x)
{
    uint16_t h;
    float y;
    CHECK_OK(NULL, accel_convert(&h, dt, &x, ACCEL_F32, 1));
    CHECK_OK(NULL, accel_convert(&y, ACCEL_F32, &h, dt, 1));
    return y;
}

static void allreduce_equality(accel_dtype dt)
{
    accel_options o = accel_options_default();
    o.comm_dtype = dt;
    o.first_bucket_mb = 4096.0 / 1048576.0;
    o.bucket_cap_mb = 8192.0 / 1048576.0;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    int rank = accel_process_index(acc), n = accel_num_processes(acc);
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    for (int i = 0; i < NP; i++) {
        char name[16];
        snprintf(name, sizeof(name), "p%d", i);
        CHECK_OK(acc, accel_model_add_param(m, name, 1, (int64_t[]){PN}, NULL));
    }
    CHECK_OK(acc, accel_prepare(acc, m));
    CHECK(accel_model_num_buckets(m) > 1);
    for (int round = 0; round < 2; round++) {
        (void)accel_backward_begin(acc);
        for (int i = NP - 1; i >= 0; i--) {
            const accel_param *p = accel_model_param(m, i);
            for (int j = 0; j < PN; j++) {
                p->grad[j] =
                    gen((uint64_t)(rank * 100 + round * 10 + i), (uint64_t)j) * (1.0f + (float)i);
            }
            CHECK_OK(acc, accel_grad_ready(m, i));
        }
        CHECK_OK(acc, accel_backward_end(acc));
        double p_ulp = dt == ACCEL_BF16 ? 0x1p-8 : 0x1p-11, worst = 0;
        for (int i = 0; i < NP; i++) {
            const accel_param *p = accel_model_param(m, i);
            for (int j = 0; j < PN; j++) {
                double ref = 0, mx = 0;
                for (int r = 0; r < n; r++) {
                    double v =
                        gen((uint64_t)(r * 100 + round * 10 + i), (uint64_t)j) * (1.0f + (float)i);
                    ref += v / n;
                    mx = fabs(v) > mx ? fabs(v) : mx;
                }
                float got = p->grad[j];
                CHECK(round_to(dt, got) == got);
                CHECK_MSG(fabs(got - ref) <= 2 * p_ulp * mx, "p%d[%d] %.9g vs %.9g", i, j, got,
                          ref);
                worst = fabs(got - ref) / mx > worst ? fabs(got - ref) / mx : worst;
            }
        }
        /* Identical everywhere: compare a checksum of the bits with process 0's. */
        uint64_t h = 1469598103934665603ull;
        const float *gbuf = accel_model_grad(m);
        for (size_t j = 0; j < accel_model_numel(m); j++) {
            uint32_t u;
            memcpy(&u, &gbuf[j], 4);
            h = (h ^ u) * 1099511628211ull;
        }
        uint64_t h0 = h;
        CHECK_OK(acc, accel_broadcast(acc, &h0, &h0, 1, ACCEL_I64, 0, NULL));
        CHECK(h0 == h);
        if (rank == 0 && round == 1) {
            printf("%s-compressed all-reduce over %d processes: max |err| / max|g| = %.3g "
                   "(bound %.3g)\n",
                   accel_dtype_name(dt), n, worst, 2 * p_ulp);
        }
        memset(accel_model_grad(m), 0, accel_model_numel(m) * sizeof(float));
    }
    accel_free(acc);
}

#define DIN 16
#define BATCH 4 /* per process */
#define STEPS 20
#define LR 0.1f

/* Sample s of step t: x in [-1, 1]^DIN, y = <w*, x> + noise. */
static void sample(int t, int s, float *x, float *y)
{
    double acc_y = 0;
    for (int k = 0; k < DIN; k++) {
        x[k] = gen((uint64_t)(t * 1000 + s), (uint64_t)k);
        acc_y += x[k] * (0.5 + 0.1 * k);
    }
    *y = (float)acc_y + 0.1f * gen(77, (uint64_t)(t * 1000 + s));
}

/* grad of mean over samples [s0, s0 + cnt) of 0.5 (<w, x> - y)^2, added into g. */
static void lsq_grad(const float *w, int t, int s0, int cnt, float *g)
{
    float x[DIN], y;
    for (int s = s0; s < s0 + cnt; s++) {
        sample(t, s, x, &y);
        float e = -y;
        for (int k = 0; k < DIN; k++) {
            e += w[k] * x[k];
        }
        for (int k = 0; k < DIN; k++) {
            g[k] += e * x[k] / (float)cnt;
        }
    }
}

static void nxb_equivalence(void)
{
    accel_options o = accel_options_default();
    o.comm_dtype = ACCEL_BF16;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    int rank = accel_process_index(acc), n = accel_num_processes(acc);
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    CHECK_OK(acc, accel_model_add_param(m, "w", 1, (int64_t[]){DIN}, NULL));
    const accel_param *w = accel_model_param(m, 0);
    accel_sgd_options so = accel_sgd_options_default();
    so.lr = LR;
    accel_optimizer *opt;
    CHECK_OK(acc, accel_sgd_new(acc, m, &so, &opt));
    CHECK_OK(acc, accel_prepare(acc, m, opt));
    float ref[DIN] = {0};
    for (int t = 0; t < STEPS; t++) {
        CHECK_OK(acc, accel_accumulate(acc, m));
        (void)accel_backward_begin(acc);
        lsq_grad(w->data, t, rank * BATCH, BATCH, w->grad);
        CHECK_OK(acc, accel_grad_ready(m, 0));
        CHECK_OK(acc, accel_backward_end(acc));
        CHECK_OK(acc, accel_optimizer_step(opt));
        CHECK_OK(acc, accel_optimizer_zero_grad(opt));
        float gref[DIN] = {0};
        lsq_grad(ref, t, 0, n * BATCH, gref);
        for (int k = 0; k < DIN; k++) {
            ref[k] -= LR * gref[k];
        }
    }
    double maxd = 0;
    for (int k = 0; k < DIN; k++) {
        double d = fabs(w->data[k] - ref[k]);
        maxd = d > maxd ? d : maxd;
    }
    if (rank == 0) {
        printf("N x b with bf16 compression, %d processes, %d steps: max |w - w_ref| = %.3g\n", n,
               STEPS, maxd);
    }
    CHECK(maxd <= 2e-3);
    CHECK(maxd > 0); /* compression does perturb the result: the test sees it */
    accel_free(acc);
}

int main(void)
{
    allreduce_equality(ACCEL_BF16);
    allreduce_equality(ACCEL_F16);
    nxb_equivalence();
    return 0;
}
