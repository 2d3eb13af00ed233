/*
 * The hand-vectorised x86 kernels of reduce_x86.c, plugged into the dispatch table of reduce.c.
 * Same contract as accel__reduce for their dtype; callable only when the ISA is available.
 */
#ifndef ACCEL_COMM_REDUCE_X86_H
#define ACCEL_COMM_REDUCE_X86_H

#include <stddef.h>

#include "reduce.h"

#if defined(__x86_64__) || defined(__i386__)
#define ACCEL__HAVE_X86 1
#else
#define ACCEL__HAVE_X86 0
#endif

#if ACCEL__HAVE_X86
#define ACCEL__DECL_FAST(fmt, isa)                                                                 \
    void accel__reduce_##fmt##_##isa(void *out, void *out2, const void *const *in, int n_in,       \
                                     size_t count, accel_reduce_op op, int avg_div);
ACCEL__DECL_FAST(f32, avx2)
ACCEL__DECL_FAST(bf16, avx2)
ACCEL__DECL_FAST(f16, avx2)
ACCEL__DECL_FAST(f32, avx512)
ACCEL__DECL_FAST(bf16, avx512)
ACCEL__DECL_FAST(f16, avx512)
ACCEL__DECL_FAST(wbf16, avx2)
ACCEL__DECL_FAST(wf16, avx2)
ACCEL__DECL_FAST(wbf16, avx512)
ACCEL__DECL_FAST(wf16, avx512)
#undef ACCEL__DECL_FAST
void accel__copy_nt_avx2(void *dst, const void *src, size_t nbytes);
#endif

#endif /* ACCEL_COMM_REDUCE_X86_H */
