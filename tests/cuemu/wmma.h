/*
 * nvcuda::wmma (CUDA's <mma.h>) for the emulator build: the 16x16x16 shapes with bf16 / fp16
 * inputs and fp32 accumulators that accel's kernels use. Included at the end of kernel.h.
 *
 * Each lane's fragment holds the whole 16x16 tile (num_elements 256, row-major for matrix_a
 * and the accumulator, k-major for matrix_b): element-wise loops over frag.x[i] that treat
 * every element alike behave as on a GPU, where each lane holds a slice. Code that depends on
 * which lane holds which element is not portable CUDA and has no meaning here.
 * load / store / mma are warp-collective on a GPU; here every lane does the whole operation on
 * its own copy, so a store followed by other lanes' reads of that memory needs a __syncwarp
 * between them, as on a GPU. mma_sync sums in fp32, k ascending. Misuse that is undefined on
 * a GPU (a pointer not 32-byte aligned, ldm not a multiple of 16 bytes) aborts with a message.
 */
#ifndef ACCEL_CUEMU_WMMA_H
#define ACCEL_CUEMU_WMMA_H

#include <stdio.h>
#include <stdlib.h>

namespace nvcuda
{
namespace wmma
{

struct matrix_a {
};
struct matrix_b {
};
struct accumulator {
};
struct row_major {
};
struct col_major {
};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "cuemu wmma: only the 16x16x16 shape");
    static constexpr int num_elements = 256;
    T x[256];
};

namespace detail
{
inline float to_f(float v)
{
    return v;
}
inline float to_f(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}
inline float to_f(__half v)
{
    return __half2float(v);
}

inline void check(const void *p, unsigned ldm, size_t elem, const char *what)
{
    if (((uintptr_t)p & 31) != 0 || (ldm * elem) % 16 != 0) {
        fprintf(stderr,
                "cuemu: wmma %s: pointer %p must be 32-byte aligned and ldm %u a multiple of "
                "16 bytes (undefined on a GPU)\n",
                what, p, ldm);
        abort();
    }
}

/* Element (r, c) of a 16x16 tile at p with leading dimension ldm. */
template <typename T> inline T at(const T *p, unsigned ldm, int r, int c, bool row)
{
    return row ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}
} // namespace detail

template <typename Use, typename T, typename Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, const T &v)
{
    for (int i = 0; i < 256; i++) {
        f.x[i] = v;
    }
}

/* matrix_a / matrix_b with their layout in the type. */
template <typename Use, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> &f, const T *p, unsigned ldm)
{
    static_assert(!std::is_same<Use, accumulator>::value, "accumulators take a layout_t");
    detail::check(p, ldm, sizeof(T), "load_matrix_sync");
    bool row = std::is_same<Layout, row_major>::value;
    for (int r = 0; r < 16; r++) {
        for (int c = 0; c < 16; c++) {
            f.x[r * 16 + c] = detail::at(p, ldm, r, c, row);
        }
    }
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                             unsigned ldm, layout_t layout)
{
    detail::check(p, ldm, sizeof(float), "load_matrix_sync");
    for (int r = 0; r < 16; r++) {
        for (int c = 0; c < 16; c++) {
            f.x[r * 16 + c] = detail::at(p, ldm, r, c, layout == mem_row_major);
        }
    }
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ldm, layout_t layout)
{
    detail::check(p, ldm, sizeof(float), "store_matrix_sync");
    for (int r = 0; r < 16; r++) {
        for (int c = 0; c < 16; c++) {
            if (layout == mem_row_major) {
                p[(size_t)r * ldm + c] = f.x[r * 16 + c];
            } else {
                p[(size_t)c * ldm + r] = f.x[r * 16 + c];
            }
        }
    }
}

/* d = a b + c, fp32 sums with k ascending (d may be c). */
template <typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c)
{
    /* The operands widened once (exact), then each row of d summed over k ascending for all
     * 16 columns at once: every element still gets c + p0 + p1 + ... in that order (the
     * independent columns are what the compiler may run side by side). */
    float fa[256], fb[256], out[256];
    for (int i = 0; i < 256; i++) {
        fa[i] = detail::to_f(a.x[i]);
        fb[i] = detail::to_f(b.x[i]);
    }
    for (int m = 0; m < 16; m++) {
        float *o = out + m * 16;
        for (int n = 0; n < 16; n++) {
            o[n] = c.x[m * 16 + n];
        }
        for (int k = 0; k < 16; k++) {
            float av = fa[m * 16 + k];
            const float *br = fb + k * 16;
            for (int n = 0; n < 16; n++) {
                o[n] += av * br[n];
            }
        }
    }
    for (int i = 0; i < 256; i++) {
        d.x[i] = out[i];
    }
}

} // namespace wmma
} // namespace nvcuda

#endif /* ACCEL_CUEMU_WMMA_H */
