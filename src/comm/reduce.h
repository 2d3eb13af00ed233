/*
 * Element-wise reduction kernels used by every backend: combine n inputs (one per rank) into one
 * output, for every dtype and reduce op. Results are identical on every instruction set, so all
 * ranks (whichever slice they reduce) and every ISA produce bit-identical outputs.
 */
#ifndef ACCEL_COMM_REDUCE_H
#define ACCEL_COMM_REDUCE_H

#include <stddef.h>

#include "accel/collectives.h"
#include "accel/tensor.h"

/* Instruction sets a kernel can be built for; chosen at run time. */
typedef enum accel__isa {
    ACCEL__ISA_SCALAR = 0,
    ACCEL__ISA_AVX2 = 1,   /* AVX2 + F16C */
    ACCEL__ISA_AVX512 = 2, /* AVX-512 F/BW/VL */
    ACCEL__ISA_COUNT
} accel__isa;

/*
 * out[i] = in[0][i] op in[1][i] op ... op in[n_in-1][i], combined in that order, for
 * i < count; with out2 != NULL the same values are also stored to out2.
 *
 * Semantics: floats combine in their own type except F16/BF16/F8 which accumulate in f32 over
 * all inputs and round once (RNE). AVG is SUM followed by a division by avg_div (integers: the
 * sum is taken in 64 bits and the quotient truncates toward zero). Integer SUM/PROD wrap modulo
 * 2^bits. BOOL: SUM/MAX are OR, MIN/PROD are AND, the result is 0 or 1. AVG on BOOL is refused
 * by the callers (accel__comm_run), not here.
 *
 * out and out2 may equal one of the inputs exactly (in place); no other overlap is allowed.
 * n_in >= 1. Thread-safe (no state).
 */
void accel__reduce(accel_dtype dt, accel_reduce_op op, void *out, void *out2, const void *const *in,
                   int n_in, size_t count, int avg_div);

/*
 * The same over F32 data through a 16-bit wire format (accel__coll.wire; `wire` is ACCEL_BF16 or
 * ACCEL_F16): every input element is rounded to `wire` (RNE, as accel_convert) and widened, the
 * inputs combine in f32 in rank order (AVG divides there), and the result is rounded to `wire`
 * and stored widened, as f32. Bit for bit what converting each input to `wire`, reducing in
 * `wire` with accel__reduce and converting back gives, without the conversion passes.
 */
void accel__reduce_wire(accel_dtype wire, accel_reduce_op op, void *out, void *out2,
                        const void *const *in, int n_in, size_t count, int avg_div);
void accel__reduce_wire_isa(accel__isa isa, accel_dtype wire, accel_reduce_op op, void *out,
                            void *out2, const void *const *in, int n_in, size_t count, int avg_div);

/* 1 when `dt` has reduction kernels: the first thirteen dtypes (not U32, U64, C64, the FNUZ and
 * E8M0 FP8s, the sub-byte formats, which exist for files). Callers check before reducing. */
int accel__reduce_supported(accel_dtype dt);

/* The same with an explicit instruction set (tests compare every ISA with the scalar one). The
 * caller must check accel__isa_available first. */
void accel__reduce_isa(accel__isa isa, accel_dtype dt, accel_reduce_op op, void *out, void *out2,
                       const void *const *in, int n_in, size_t count, int avg_div);

/* memcpy with non-temporal (streaming) stores where the CPU has them, for outputs that will not
 * be read again soon and are larger than the caches; ordered (sfence) before it returns. Buffers
 * must not overlap. */
void accel__copy_nt(void *dst, const void *src, size_t nbytes);

/* 1 when this CPU (and this build) can run kernels of `isa`. */
int accel__isa_available(accel__isa isa);

/* The best available ISA (what accel__reduce uses), and its name ("avx512", "avx2", "scalar"). */
accel__isa accel__isa_best(void);
const char *accel__isa_name(accel__isa isa);

#endif /* ACCEL_COMM_REDUCE_H */
