/*
 * The nn toolkit's CUDA kernels (nn_kernels.cu, ce_kernels.cu, attn_tc.cu) as plain C
 * launchers. Each one checks nothing (the ops in ops_gpu.c / linear_gpu.c validated shapes and
 * devices), queues its kernels on the stream s (the ctx's compute stream) and returns the
 * launch status (cudaGetLastError); a fault inside a kernel surfaces at the next
 * synchronisation.
 *
 * `write` arguments: 1 stores into the destination (a fresh gradient), 0 adds to it. `rnd`
 * arguments: 0 none, 1 round to bf16, 2 round to fp16 (nearest even), as the CPU's autocast
 * rounds what a low-precision kernel would read or produce. No kernel uses floating-point
 * atomics: sums over rows run in a fixed order, so results are deterministic. Element-wise
 * kernels move 16-byte vectors where every pointer they get is 16-byte aligned (8-byte for a
 * 2-byte destination), scalars otherwise: the results are the same either way.
 */
#ifndef ACCEL_NN_CUDA_KERNELS_H
#define ACCEL_NN_CUDA_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest head size nn_cu_attn_* take (a warp holds one row, 8 values per lane). */
#define NN_CU_ATTN_MAX_HD 256

/* y[i] = a[i % na] + b[i % nb] for i < max(na, nb) (the smaller size divides the larger). */
cudaError_t nn_cu_add(cudaStream_t s, const float *a, int64_t na, const float *b, int64_t nb,
                      float *y);
/* dst[i] (+)= rnd(src[i]). */
cudaError_t nn_cu_acc(cudaStream_t s, float *dst, const float *src, int64_t n, int rnd, int write);
/* dst[i] (+)= src[i], and h[i] = the new dst[i] rounded to dt (1 bf16, 2 fp16) in 2 bytes (a
 * half shadow of dst; nn_cu_to_half's bits). */
cudaError_t nn_cu_acc_shadow(cudaStream_t s, float *dst, const float *src, int64_t n, int write,
                             void *h, int dt);
/* dst[i] (+)= src[i], src bf16 (dt 1) or fp16 (dt 2). */
cudaError_t nn_cu_acc_half(cudaStream_t s, float *dst, const void *src, int64_t n, int dt,
                           int write);
/* dst[c] (+)= rnd(sum over r of src[r * cols + c]), src fp32 (src_dt 0), bf16 (1) or fp16 (2),
 * in a fixed order: the rows in chunks of 512 (more where rows / 512 exceeds 65535), within a
 * chunk 32 interleaved partial sums (row r goes to r % 32) added in order, then the chunks'
 * sums in order. part: nn_cu_col_sum_part_count(rows, cols) floats of scratch (may be NULL
 * when that is 0: up to 512 rows, one pass straight into dst). Where src is 16-byte aligned
 * and a row a whole number of 16-byte vectors, each thread reads a vector a row (the same
 * order, the same bits). */
cudaError_t nn_cu_col_sum(cudaStream_t s, const void *src, int src_dt, int64_t rows, int64_t cols,
                          float *dst, int write, int rnd, float *part);
int64_t nn_cu_col_sum_part_count(int64_t rows, int64_t cols);
/* dst[c] (+)= rnd(part[0 * cols + c] + part[1 * cols + c] + ... + part[(nparts - 1) * cols + c]),
 * in that order (partial rows of a sum over rows). */
cudaError_t nn_cu_sum_parts(cudaStream_t s, const float *part, int64_t nparts, int64_t cols,
                            float *dst, int write, int rnd);
/* Two such sums in one launch (LayerNorm's weight and bias gradients): part's first nparts
 * rows into dst0, the next nparts rows into dst1; either NULL for none. */
cudaError_t nn_cu_sum_parts_pair(cudaStream_t s, const float *part, int64_t nparts, int64_t cols,
                                 float *dst0, float *dst1, int write, int rnd);
/* dst = src rounded to bf16 (dt 1) or fp16 (dt 2), stored in 2 bytes. */
cudaError_t nn_cu_to_half(cudaStream_t s, const float *src, void *dst, int64_t n, int dt);

/* GELU (approximate 0: erf, 1: tanh) and its backward gx (+)= gelu'(x) gy. */
cudaError_t nn_cu_gelu(cudaStream_t s, const float *x, float *y, int64_t n, int approximate);
cudaError_t nn_cu_gelu_bwd(cudaStream_t s, const float *x, const float *gy, float *gx, int64_t n,
                           int approximate, int write);

/* Inverted dropout with the CPU's counter-based mask: dst (+)= src * mask(key, i). */
cudaError_t nn_cu_dropout(cudaStream_t s, uint64_t key, float p, const float *src, float *dst,
                          int64_t n, int write);

/* y[r] = w[ids[r]] (rows of C); backward gw[ids[r]] += gy[r], rows in order, given the rows
 * grouped by id: for each of the nd distinct ids gid[k], its rows order[start[k]] ..
 * order[start[k + 1] - 1] in increasing order (one thread per gw element adds them in turn). */
cudaError_t nn_cu_embedding(cudaStream_t s, const float *w, const int32_t *ids, float *y,
                            int64_t rows, int64_t C);
cudaError_t nn_cu_embedding_bwd(cudaStream_t s, const int32_t *order, const int32_t *start,
                                const int32_t *gid, int64_t nd, const float *gy, int64_t C,
                                float *gw);

/* LayerNorm over rows of C of x, or of x + res (res non-NULL: a residual add fused in, the
 * sum, k_add's bits, also stored into sum): y = its output (w / b may be NULL: ones / zeros;
 * y may be NULL: not stored), with yh non-NULL also y rounded to dt (1 bf16, 2 fp16) into the
 * 2-byte yh (a half shadow, nn_cu_to_half's bits); saves mean and 1/std per row. */
typedef struct nn_cu_ln {
    const float *x, *res;
    float *sum;
    const float *w, *b;
    float *y;
    void *yh;
    int dt;
    float *mean, *rstd;
    int64_t rows, C;
    float eps;
} nn_cu_ln;
cudaError_t nn_cu_layernorm(cudaStream_t s, const nn_cu_ln *a);
/* gx (+)= the input gradient (with write and gbase non-NULL: gx = gbase + it, the bits of a copy
 * of gbase added to), and with gh non-NULL the new gx rounded to dt (1 bf16, 2 fp16) into the
 * 2-byte gh (its half shadow); gw / gb (may be NULL) += the parameter gradients, each summed
 * over the rows in a fixed order: with gx, where C is a multiple of 4 up to 1024 and the
 * pointers 16-byte aligned, in blocks of 128 rows (8 runs of 16 consecutive rows, each in row
 * order, the runs in order), then the blocks in order; otherwise in nn_cu_col_sum's order.
 * part: nn_cu_layernorm_bwd_part_count(rows, C) floats of scratch (NULL when that is 0).
 * gyh non-NULL: dY is its 2-byte values of gdt (1 bf16, 2 fp16), widened exactly (the same bits
 * as gy holding them widened), and gy is not read. */
cudaError_t nn_cu_layernorm_bwd(cudaStream_t s, const float *x, const float *gy, const void *gyh,
                                int gdt, const float *w, const float *mean, const float *rstd,
                                int64_t rows, int64_t C, float *gx, int write, const float *gbase,
                                void *gh, int dt, float *gw, float *gb, float *part);
/* 1 when nn_cu_layernorm_bwd with these arguments reads the 2-byte gyh (only the register-row
 * kernel does); with gyh and 0 here, that call fails with cudaErrorInvalidValue. */
int nn_cu_layernorm_bwd_reads_half(int64_t C, const float *x, const void *gyh, const float *w,
                                   const float *gx, int write, const float *gbase, const void *gh);
int64_t nn_cu_layernorm_bwd_part_count(int64_t rows, int64_t C);
/* Only the parameter gradients of nn_cu_layernorm_bwd, in nn_cu_col_sum's order (part:
 * 2 * nn_cu_col_sum_part_count(rows, C) floats). */
cudaError_t nn_cu_layernorm_bwd_params(cudaStream_t s, const float *x, const float *gy,
                                       const float *mean, const float *rstd, int64_t rows,
                                       int64_t C, float *gw, float *gb, float *part);

/* Cross entropy per row: lse[r] and row_loss[r] (0 where t[r] == ignore). */
cudaError_t nn_cu_ce_fwd(cudaStream_t s, const float *x, const int32_t *t, int64_t rows, int64_t C,
                         int64_t ignore, float eps, float *lse, float *row_loss);
/* *y = (sum of row_loss in double) / divisor (one block, fixed order). */
cudaError_t nn_cu_sum_div(cudaStream_t s, const float *row_loss, int64_t rows, double divisor,
                          float *y);
/* gx (+)= gr * (softmax - eps / C - (1 - eps) onehot), gr = (per_row ? gy[r] : gy[0]) * scale;
 * ignored rows get nothing (zeros when write). */
cudaError_t nn_cu_ce_bwd(cudaStream_t s, const float *x, const int32_t *t, const float *lse,
                         const float *gy, int64_t rows, int64_t C, int64_t ignore, float eps,
                         float scale, int per_row, float *gx, int write);

/* nn_linear_cross_entropy's fused classifier over a chunk of `rows` logits rows of C: per row
 * the loss into row_loss[r] (0 where t[r] == ignore) and, when grad, the logits' gradient
 * scale * (softmax - eps / C - (1 - eps) onehot) (zeros for an ignored row) written over x
 * (rnd 0) or, rounded to bf16 (rnd 1) / fp16 (rnd 2), into the 2-byte gh (rows x C). */
cudaError_t nn_cu_lce_rows(cudaStream_t s, float *x, const int32_t *t, int64_t rows, int64_t C,
                           int64_t ignore, float eps, float scale, int grad, int rnd, void *gh,
                           float *row_loss);
/* dst[i] (+)= rnd(*seed * src[i]), seed a device scalar (a backward's incoming gradient). */
cudaError_t nn_cu_scale_acc(cudaStream_t s, float *dst, const float *src, int64_t n,
                            const float *seed, int rnd, int write);
/* dst[i] = *seed * src[i] rounded to bf16 (dt 1) or fp16 (dt 2), stored in 2 bytes: the bits of
 * the values nn_cu_scale_acc writes with rnd = dt. */
cudaError_t nn_cu_scale_half(cudaStream_t s, void *dst, const float *src, int64_t n,
                             const float *seed, int dt);

/* Fused causal attention over packed qkv [B, T, 3C] (H heads of hd): y [B, T, C] and the
 * per-row log-sum-exp lse [B, H, T], one online-softmax pass per query row (no T x T
 * matrix). p > 0: the CPU's counter-based dropout on the probabilities. */
typedef struct nn_cu_attn {
    int64_t B, T, C, H, hd;
    float scale, p;
    uint64_t key;
    int rnd;
    /* 2-byte (rnd's dtype) copies the tensor-core kernels read instead of rounding fp32 tiles
     * themselves, or NULL (then they round as before): qkv_h of qkv (same layout), dy_h of the
     * output's gradient (same layout as y). Same values: the kernels round to rnd's dtype. */
    const void *qkv_h, *dy_h;
    /* 2-byte (rnd's dtype) copies the kernels write next to their fp32 outputs, or NULL: y_h
     * of y (the forward), gqkv_h of the gradient of qkv (the backward, when it writes it:
     * write 1). The same bits nn_cu_to_half would write: attn_tc_fwd.cu's and attn_tc_bwd2.cu's
     * kernels store them in their epilogues; elsewhere the launchers run nn_cu_to_half. */
    void *y_h, *gqkv_h;
} nn_cu_attn;
cudaError_t nn_cu_attn_fwd(cudaStream_t s, const nn_cu_attn *a, const float *qkv, float *y,
                           float *lse);
/* The tensor-core forward (attn_tc.cu), which nn_cu_attn_fwd runs where it applies: rnd bf16
 * or fp16, p == 0, hd a multiple of 16 up to 128, qkv and y 16-byte aligned. Returns 1 when it
 * queued it (*err: the launch status), 0 when it does not apply. */
int nn_cu_attn_fwd_tc(cudaStream_t s, const nn_cu_attn *a, const float *qkv, float *y, float *lse,
                      cudaError_t *err);
/* Which kernels nn_cu_attn_fwd and nn_cu_attn_bwd run: AUTO (the tensor-core kernels where
 * they apply; the default), WARP (the warp kernels always) or TC_SLOW (as AUTO, but the
 * tensor-core kernels never take their register paths: the forward's S and P and the
 * backward's P and dS through shared memory, as before them; it sets
 * nn_cu_attn_bwd_set_fast). ops_gpu.c sets it from ACCEL_NN_ATTN and ACCEL_NN_ATTN_FAST at the first
 * attention forward (A/B timing); tests switch in-process (each direction reads it when it is
 * queued). */
#define NN_CU_ATTN_AUTO 0
#define NN_CU_ATTN_WARP 1
#define NN_CU_ATTN_TC_SLOW 2
void nn_cu_attn_set_kernel(int kind);
/* The tensor-core backward's element-wise work: 1 (the default) forms P and dS in the WMMA
 * accumulators' registers (exp2 on base-2 scores), 0 goes through the fp32 shared scratch
 * (expf) as before. nn_cu_attn_set_kernel sets it (0 for TC_SLOW, else 1); tests switch the
 * backward alone in-process (read when a backward is queued). */
void nn_cu_attn_bwd_set_fast(int on);
/* The element-wise path the last tensor-core backward took (-1: none yet): 0 the scratch, 1
 * the register path, 2 the register path with its A operands built in registers (bf16 where
 * the device's WMMA layouts allow; attn_tc_bwd.cu). For tests and bench/cuda_attn. */
int nn_cu_attn_bwd_mode(void);
/* Rows a warp and a block own in the tensor-core backward's kernels on the register path with
 * A operands in registers (path 2) at head sizes up to 64: warp_rows 32 (each fragment of a
 * streamed tile loaded serves two products) with block_rows 128 (the default: each streamed
 * tile loaded serves 128 own rows) or 64; or warp_rows 16 (block_rows 64, as before). For A/B
 * timing and tests: the results are the same bit for bit. Read when a backward is queued.
 * nn_cu_attn_bwd_rows: what the last tensor-core backward used (warp 16 and block 64 or 32
 * elsewhere; 0: none yet). */
void nn_cu_attn_bwd_set_rows(int warp_rows, int block_rows);
void nn_cu_attn_bwd_rows(int *warp_rows, int *block_rows);
/* Whether the tensor-core kernels take this attention (autocast bf16 / fp16, no dropout, head
 * size a multiple of 16 up to 128, not NN_CU_ATTN_WARP; given 16-byte aligned tensors), so
 * that a 2-byte copy of qkv (qkv_h) is worth making. */
int nn_cu_attn_tc_takes_half(const nn_cu_attn *a);
/* The tensor-core forward at 32 query rows a warp (attn_tc_fwd.cu), which nn_cu_attn_fwd_tc
 * runs first: bf16, head size 64, scale > 0, where the device's WMMA fragments have the sm_80+
 * layouts (probed at the first call into lse: one stream synchronisation). Reads a->qkv_h when
 * it is not NULL. Returns 1 when it queued the kernel, 0 when it does not apply. */
int accel__nn_cu_attn_fwd_tc2(cudaStream_t s, const nn_cu_attn *a, const float *qkv, float *y,
                              float *lse, void *qkv_h_out);
/* The forward that also writes qkv's 2-byte copy: where the kernel of 32 query rows a warp
 * applies (as accel__nn_cu_attn_fwd_tc2, not ACCEL_NN_ATTN_FAST=0, a->qkv_h NULL, qkv_h
 * 16-byte aligned), queues it reading fp32 qkv and writing rnd(qkv) into qkv_h (same layout,
 * every element, the values nn_cu_to_half writes) besides y and lse, and returns 1 (*err: the
 * launch status); else queues nothing and returns 0 (the caller makes the copy and runs
 * nn_cu_attn_fwd). Saves the copy's separate pass over qkv. */
int nn_cu_attn_fwd_tc_half(cudaStream_t s, const nn_cu_attn *a, const float *qkv, float *y,
                           float *lse, void *qkv_h, cudaError_t *err);
/* Whether this attention reads qkv only as its 2-byte copy, forward and backward, so that qkv
 * need not exist in fp32 (a GPT block's c_attn output under bf16 autocast): the forward of 32
 * query rows a warp and attn_tc_bwd2.cu's backward both apply (bf16, head size 64, p == 0,
 * scale > 0, NN_CU_ATTN_AUTO, the sm_80+ layouts: probed at the first call into scratch, one
 * float of device memory the caller overwrites next), given 16-byte aligned tensors. */
int nn_cu_attn_half_only(cudaStream_t s, const nn_cu_attn *a, float *scratch);
/* The forward from a->qkv_h alone (qkv has no fp32 values): queues the kernel of 32 query
 * rows a warp where it applies (as nn_cu_attn_half_only, y and a->qkv_h 16-byte aligned) and
 * returns 1 (*err: the launch status), else queues nothing and returns 0. */
int nn_cu_attn_fwd_tc_read_half(cudaStream_t s, const nn_cu_attn *a, float *y, float *lse,
                                cudaError_t *err);
/* The kernel the last tensor-core forward took (-1: none yet): 0 without its register path
 * (NN_CU_ATTN_TC_SLOW), 1 16 query rows a warp (its register path where each warp finds the
 * sm_80+ layout), 2 32 rows a warp (accel__nn_cu_attn_fwd_tc2). For tests and
 * bench/cuda_attn. */
int nn_cu_attn_fwd_mode(void);
/* How many tensor-core forwards and backwards were queued so far, in this process: tests that
 * must know the tensor-core kernels ran (their results can equal the warp kernels' bit for
 * bit once rounded to bf16). */
void nn_cu_attn_tc_counts(unsigned long *fwd, unsigned long *bwd);
/* Backward from dO = gy: gqkv (+)= rnd(dq | dk | dv); D: B*H*T floats of scratch. qkv NULL:
 * only a->qkv_h holds qkv (nn_cu_attn_half_only), and where attn_tc_bwd2.cu's kernels no
 * longer apply it returns cudaErrorNotSupported, queueing nothing. */
cudaError_t nn_cu_attn_bwd(cudaStream_t s, const nn_cu_attn *a, const float *qkv, const float *y,
                           const float *lse, const float *gy, float *D, float *gqkv, int write);
/* The tensor-core backward (attn_tc.cu), which nn_cu_attn_bwd runs where it applies (as the
 * forward, with gy and gqkv 16-byte aligned too): a dQ kernel per query tile, then a dK/dV
 * kernel per key tile, no atomics. Returns 1 when it queued them (*err: the launch status), 0
 * when it does not apply. */
int nn_cu_attn_bwd_tc(cudaStream_t s, const nn_cu_attn *a, const float *qkv, const float *y,
                      const float *lse, const float *gy, float *D, float *gqkv, int write,
                      cudaError_t *err);
/* The fused MLP's fallback where cuBLASLt has no 2-byte GELU epilogue (lt_gpu.c), dt 1
 * bf16 / 2 fp16 for every 2-byte array. From the fp32 product t (n values, columns of m):
 * z = t + bias[i % m] (bias 2-byte, or NULL), aux = rnd(z), h = rnd(gelu_tanh(z)). */
cudaError_t nn_cu_bias_gelu_half(cudaStream_t s, const float *t, const void *bias, int64_t m,
                                 int64_t n, void *aux, void *h, int dt);
/* t[i] *= gelu_tanh'(aux[i]) in fp32, aux 2-byte. */
cudaError_t nn_cu_dgelu_half(cudaStream_t s, float *t, const void *aux, int64_t n, int dt);
/* The fused MLP's hidden gradient from its plain 2-byte product (linear_gpu.c, the default
 * under autocast), one pass: d (rows x cols, 2-byte of dt) holds the product dY W2^T and
 * becomes dZ = rnd(d * gelu_tanh'(aux)) in place (aux 2-byte, the same layout); with dbias
 * (cols 2-byte values, or NULL) also dbias = rnd(the column sums of the rounded dZ), summed in
 * nn_cu_col_sum's order (part: nn_cu_col_sum_part_count(rows, cols) floats of scratch, NULL
 * when that is 0). 16-byte accesses where cols is a multiple of 8 and d and aux are 16-byte
 * aligned, one value a thread otherwise: the results are the same. */
cudaError_t nn_cu_dgelu_bgrad_half(cudaStream_t s, void *d, const void *aux, int64_t rows,
                                   int64_t cols, void *dbias, float *part, int dt);
/* Whether the fragment layouts of attn_tc_frag.cuh are this device's (attn_tc_fwd.cu): probed
 * at the first call into scratch (one float of device memory the caller overwrites next), one
 * stream synchronisation once a process. 1 yes, 0 no (or the probe failed). */
int accel__nn_cu_attn_f2_layout(cudaStream_t s, float *scratch);
/* The backward at head size 64 (attn_tc_bwd2.cu), which nn_cu_attn_bwd_tc tries first: bf16,
 * scale > 0, a->qkv_h and a->dy_h both set (16-byte aligned), y 16-byte aligned, the layouts of
 * accel__nn_cu_attn_f2_layout (probed into D). Queues D's kernel, the dQ kernel and the dK/dV
 * kernel and returns 1, else 0 (nothing queued). Same gqkv as the other tensor-core backward
 * up to the exponential's rounding (ex2.approx on the GPU; bit for bit in the emulator). */
int accel__nn_cu_attn_bwd_tc2(cudaStream_t s, const nn_cu_attn *a, const float *y,
                              const float *lse, float *D, float *gqkv, int write);
/* Which backward the last tensor-core backward ran (-1: none yet): 1 attn_tc_bwd.cu's
 * kernels, 2 attn_tc_bwd2.cu's. nn_cu_attn_bwd2_allow(0) keeps attn_tc_bwd2.cu's off (tests,
 * bench/cuda_attn; ACCEL_NN_ATTN_FAST=0 does too); 1, the default, allows them. */
int nn_cu_attn_bwd_kernel(void);
void nn_cu_attn_bwd2_allow(int on);
/* Queues the tensor-core backward's two kernels (attn_tc_bwd.cu) once nn_cu_attn_bwd_tc has
 * checked that they apply; the launch status is cudaGetLastError's. */
void accel__nn_cu_attn_bwd_tc_queue(cudaStream_t s, const nn_cu_attn *a, const float *qkv,
                                    const float *y, const float *lse, const float *gy, float *D,
                                    float *gqkv, int write);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_NN_CUDA_KERNELS_H */
