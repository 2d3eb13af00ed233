/*
 * Gradient staging cases shared by test_staging.c (forced on the CPU, so the logic runs on
 * every machine) and test_cuda_staging.c (a model on a GPU, several processes sharing it): the
 * reducer copies each bucket device -> host, reduces it on the host communicator and copies it
 * back, after an event on the compute stream. Every buffer is reached only through the device
 * seam (accel__dev_copy), as a GPU needs.
 *  1. Bucket all-reduce, fp32 and bf16-compressed: several buckets in flight, a frozen
 *     parameter inside a bucket, gradients produced by queued device kernels just before
 *     accel_grad_ready (the copy out must wait for them). Each bucket's result must equal,
 *     bit for bit, the same reduction done by accel_allreduce on host copies of the inputs
 *     (same backend, count, dtype and op), frozen gradients stay 0, and the result is identical
 *     on every process.
 *  2. prepare's broadcast: processes start from different weights and all hold process 0's.
 *  3. Training: AdamW, bf16 compute copy, clip_grad_norm, 12 steps of a least-squares model
 *     with each process's batch: the weights stay bit-identical across processes and track a
 *     host fp32 run of the full batch within 1e-4 (the only differences: the all-reduce's
 *     summation order and the norm's; weights ~1, lr 1e-2). Also under ZeRO stages 1 and 2
 *     (fp32, so that a host model keeps its whole master: its weights can be read back).
 */
#ifndef ACCEL_TEST_STAGING_CASES_H
#define ACCEL_TEST_STAGING_CASES_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "device/device.h"

#define SC_NP 4    /* parameters */
#define SC_PN 1500 /* elements each */

static float sc_gen(uint64_t key, uint64_t i)
{
    uint64_t z = key * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) * 0x1p-53 * 2.0 - 1.0);
}

static accel__device *sc_dev(accel *acc)
{
    accel__device *d;
    CHECK_OK(NULL, accel__device_open(&d, accel_device_of(acc)));
    return d;
}

static void sc_put(accel__device *d, void *dst, const void *src, size_t nbytes)
{
    CHECK_OK(NULL, accel__dev_copy(d, dst, src, nbytes, ACCEL__COPY_H2D, NULL));
}

static void sc_get(accel__device *d, void *dst, const void *src, size_t nbytes)
{
    CHECK_OK(NULL, accel__dev_copy(d, dst, src, nbytes, ACCEL__COPY_D2H, NULL));
}

/* FNV-1a of a host buffer, compared with process 0's. */
static void sc_same_everywhere(accel *acc, const void *buf, size_t nbytes)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < nbytes; i++) {
        h = (h ^ ((const unsigned char *)buf)[i]) * 1099511628211ull;
    }
    uint64_t h0 = h;
    CHECK_OK(acc, accel_broadcast(acc, &h0, &h0, 1, ACCEL_I64, 0, NULL));
    CHECK_MSG(h0 == h, "process %d differs from process 0", accel_process_index(acc));
}

static void sc_allreduce(accel_dtype comm_dtype)
{
    accel_options o = accel_options_default();
    o.comm_dtype = comm_dtype;
    o.first_bucket_mb = 4096.0 / 1048576.0;
    o.bucket_cap_mb = 8192.0 / 1048576.0;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    accel__device *d = sc_dev(acc);
    int rank = accel_process_index(acc);
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    for (int i = 0; i < SC_NP; i++) {
        char name[16];
        snprintf(name, sizeof(name), "p%d", i);
        CHECK_OK(acc, accel_model_add_param(m, name, 1, (int64_t[]){SC_PN}, NULL));
    }
    CHECK_OK(acc, accel_model_freeze(m, 1, 1)); /* inside a bucket: zeroed, not reduced */
    CHECK_OK(acc, accel_prepare(acc, m));
    CHECK(accel_model_num_buckets(m) > 1);
    CHECK(accel_model_param(m, 0)->data_view.device.type == accel_device_of(acc).type);
    size_t numel = accel_model_numel(m);
    float *host = malloc(numel * sizeof(float)), *want = malloc(numel * sizeof(float));
    void *scratch;
    CHECK_OK(NULL, accel__dev_alloc(d, SC_PN * sizeof(float), 0, &scratch));
    CHECK(host && want);
    for (int round = 0; round < 2; round++) {
        memset(want, 0, numel * sizeof(float));
        (void)accel_backward_begin(acc);
        for (int i = SC_NP - 1; i >= 0; i--) {
            const accel_param *p = accel_model_param(m, i);
            float g[SC_PN];
            for (int j = 0; j < SC_PN; j++) {
                g[j] = 2.0f * sc_gen((uint64_t)(rank * 100 + round * 10 + i), (uint64_t)j);
                want[p->offset + (size_t)j] = g[j] / 2.0f;
            }
            /* The gradient comes out of kernels queued on the compute stream (a copy, then a
             * halving: exact), as a user's backward would leave it. */
            sc_put(d, scratch, g, sizeof(g));
            accel__dspan gs = accel__dspan_f32(p->grad_view.data, SC_PN);
            CHECK_OK(NULL, accel__dev_convert(d, gs, accel__dspan_f32(scratch, SC_PN), NULL));
            CHECK_OK(NULL, accel__dev_scale(d, gs, 0.5f, NULL));
            CHECK_OK(acc, accel_grad_ready(m, i));
        }
        CHECK_OK(acc, accel_backward_end(acc));
        sc_get(d, host, accel_model_param(m, SC_NP - 1)->grad_view.data, numel * sizeof(float));
        /* The reference: each bucket through accel_allreduce on the host. */
        for (int b = 0; b < accel_model_num_buckets(m); b++) {
            accel_bucket_info bi;
            CHECK_OK(acc, accel_model_bucket_info(m, b, &bi));
            float *w = want + bi.offset;
            const accel_param *fp = accel_model_param(m, 1);
            if (fp->offset >= bi.offset && fp->offset < bi.offset + bi.count) {
                memset(want + fp->offset, 0, fp->numel * sizeof(float));
            }
            if (comm_dtype == ACCEL_BF16) {
                uint16_t *h16 = malloc(bi.count * 2);
                CHECK(h16 != NULL);
                CHECK_OK(NULL, accel_convert(h16, ACCEL_BF16, w, ACCEL_F32, bi.count));
                CHECK_OK(acc,
                         accel_allreduce(acc, h16, h16, bi.count, ACCEL_BF16, ACCEL_AVG, NULL));
                CHECK_OK(NULL, accel_convert(w, ACCEL_F32, h16, ACCEL_BF16, bi.count));
                free(h16);
            } else {
                CHECK_OK(acc, accel_allreduce(acc, w, w, bi.count, ACCEL_F32, ACCEL_AVG, NULL));
            }
        }
        const accel_param *fp = accel_model_param(m, 1);
        for (size_t j = 0; j < fp->numel; j++) {
            CHECK(host[fp->offset + j] == 0.0f);
        }
        for (size_t j = 0; j < numel; j++) {
            CHECK_MSG(memcmp(&host[j], &want[j], 4) == 0, "%s round %d: grad[%zu] %.9g, want %.9g",
                      accel_dtype_name(comm_dtype), round, j, host[j], want[j]);
        }
        sc_same_everywhere(acc, host, numel * sizeof(float));
        CHECK_OK(
            NULL,
            accel__dev_zero(
                d, accel__dspan_f32(accel_model_param(m, SC_NP - 1)->grad_view.data, numel), NULL));
    }
    accel__dev_free(d, scratch);
    free(host);
    free(want);
    accel_free(acc);
}

/* ---- training ---- */

#define SC_DIN 24
#define SC_BATCH 4 /* per process */
#define SC_STEPS 12

static void sc_sample(int t, int s, float *x, float *y)
{
    double acc_y = 0;
    for (int k = 0; k < SC_DIN; k++) {
        x[k] = sc_gen((uint64_t)(t * 1000 + s), (uint64_t)k);
        acc_y += x[k] * (0.5 + 0.05 * k);
    }
    *y = (float)acc_y;
}

/* grad of the mean over samples [s0, s0 + cnt) of 0.5 (<w, x> - y)^2, into g (overwritten). */
static void sc_lsq_grad(const float *w, int t, int s0, int cnt, float *g)
{
    memset(g, 0, SC_DIN * sizeof(float));
    float x[SC_DIN], y;
    for (int s = s0; s < s0 + cnt; s++) {
        sc_sample(t, s, x, &y);
        float e = -y;
        for (int k = 0; k < SC_DIN; k++) {
            e += w[k] * x[k];
        }
        for (int k = 0; k < SC_DIN; k++) {
            g[k] += e * x[k] / (float)cnt;
        }
    }
}

/* torch AdamW on the host in double, the reference. */
static void sc_adamw(double *w, const float *g, double *m1, double *m2, int t, double lr)
{
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
    for (int k = 0; k < SC_DIN; k++) {
        w[k] *= 1.0 - lr * wd;
        m1[k] = b1 * m1[k] + (1 - b1) * g[k];
        m2[k] = b2 * m2[k] + (1 - b2) * g[k] * g[k];
        double mh = m1[k] / (1 - pow(b1, t)), vh = m2[k] / (1 - pow(b2, t));
        w[k] -= lr * mh / (sqrt(vh) + eps);
    }
}

/* The run on the accelerator's device, or with host_model on the CPU, at ZeRO stage
 * zero_stage (bf16 at stage 0, fp32 above); the final weights in out. */
static void sc_training(int host_model, int zero_stage, float *out)
{
    accel_options o = accel_options_default();
    o.mixed_precision = zero_stage == 0 ? ACCEL_PRECISION_BF16 : ACCEL_PRECISION_NO;
    o.zero_stage = zero_stage;
    accel *acc;
    CHECK_OK(NULL, accel_init(&acc, &o));
    int rank = accel_process_index(acc), n = accel_num_processes(acc);
    accel_model *m;
    CHECK_OK(acc, accel_model_new(acc, &m));
    accel__device *d = sc_dev(acc);
    if (host_model) {
        CHECK_OK(acc, accel_model_set_device(m, (accel_device){ACCEL_DEVICE_CPU, 0}));
        CHECK_OK(NULL, accel__device_open(&d, (accel_device){ACCEL_DEVICE_CPU, 0}));
    }
    CHECK_OK(acc, accel_model_add_param(m, "w", 1, (int64_t[]){SC_DIN}, NULL));
    const accel_param *w = accel_model_param(m, 0);
    float w0[SC_DIN];
    for (int k = 0; k < SC_DIN; k++) {
        w0[k] = rank == 0 ? 1.0f : -5.0f; /* prepare must replace it with process 0's */
    }
    sc_put(d, w->data_view.data, w0, sizeof(w0));
    accel_adam_options ao = accel_adamw_options_default();
    ao.lr = 1e-2;
    accel_optimizer *opt;
    CHECK_OK(acc, accel_adamw_new(acc, m, &ao, &opt));
    CHECK_OK(acc, accel_prepare(acc, m, opt));
    float got[SC_DIN];
    sc_get(d, got, w->data_view.data, sizeof(got));
    for (int k = 0; k < SC_DIN; k++) {
        CHECK(got[k] == 1.0f);
    }
    double ref[SC_DIN], m1[SC_DIN] = {0}, m2[SC_DIN] = {0}, maxd = 0;
    for (int k = 0; k < SC_DIN; k++) {
        ref[k] = 1.0;
    }
    for (int t = 1; t <= SC_STEPS; t++) {
        CHECK_OK(acc, accel_accumulate(acc, m));
        /* Forward reads the compute copy (bf16 under mixed precision), as a real one does. */
        float wc[SC_DIN], g[SC_DIN];
        accel_dtype cdt = w->compute_view.dtype;
        sc_get(d, g, w->compute_view.data, SC_DIN * accel_dtype_nbytes(cdt));
        CHECK_OK(NULL, accel_convert(wc, ACCEL_F32, g, cdt, SC_DIN));
        (void)accel_backward_begin(acc);
        sc_lsq_grad(wc, t, rank * SC_BATCH, SC_BATCH, g);
        sc_put(d, w->grad_view.data, g, sizeof(g));
        CHECK_OK(acc, accel_grad_ready(m, 0));
        CHECK_OK(acc, accel_backward_end(acc));
        double norm = 0;
        CHECK_OK(acc, accel_clip_grad_norm(acc, m, 1e9, 2.0, &norm)); /* norm only */
        CHECK(norm > 0 && isfinite(norm));
        CHECK_OK(acc, accel_optimizer_step(opt));
        CHECK_OK(acc, accel_optimizer_zero_grad(opt));
        /* The reference: the full batch, from the bf16 rounding of the reference weights. */
        float rw[SC_DIN], rg[SC_DIN];
        for (int k = 0; k < SC_DIN; k++) {
            rw[k] = (float)ref[k];
        }
        uint16_t r16[SC_DIN];
        if (zero_stage == 0) {
            CHECK_OK(NULL, accel_convert(r16, ACCEL_BF16, rw, ACCEL_F32, SC_DIN));
            CHECK_OK(NULL, accel_convert(rw, ACCEL_F32, r16, ACCEL_BF16, SC_DIN));
        }
        sc_lsq_grad(rw, t, 0, n * SC_BATCH, rg);
        sc_adamw(ref, rg, m1, m2, t, ao.lr);
    }
    sc_get(d, got, w->data_view.data, sizeof(got));
    for (int k = 0; k < SC_DIN; k++) {
        double diff = fabs(got[k] - ref[k]);
        maxd = diff > maxd ? diff : maxd;
    }
    sc_same_everywhere(acc, got, sizeof(got));
    if (rank == 0) {
        printf("training on %s, %d processes, ZeRO stage %d, %d steps: max |w - w_ref| = %.3g\n",
               accel__device_name(d), n, zero_stage, SC_STEPS, maxd);
    }
    CHECK_MSG(maxd <= 1e-4, "max |w - w_ref| = %.3g", maxd);
    memcpy(out, got, sizeof(got));
    accel_free(acc);
}

#endif /* ACCEL_TEST_STAGING_CASES_H */
