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
 *
 * With ACCEL_CUEMU_WMMA_LANES defined (the emulator build's default: cmake's ACCEL_CUEMU_WMMA
 * is "lanes"; "whole" gives the whole-tile fragments above), fragments are laid out per lane
 * as on sm_80+ instead (an inline namespace keeps the two apart at link time): 8 elements a lane,
 * those of mma.m16n8k16 twice. Lane l = 4 g + q holds accumulator and matrix_a element i at row
 * g + 8 ((i >> 1) & 1), column (k) 2 q + (i & 1) + 8 (i >> 2), matrix_b element i at k
 * 2 q + (i & 1) + 8 ((i >> 1) & 1), column g + 8 (i >> 2). fp16 matrix_a / matrix_b have 16
 * elements a lane as in CUDA's <mma.h> (the second 8 repeat the first here; the real layout
 * is not documented). mma_sync reads the other lanes' fragments where they lie, between two
 * full-warp shuffles (full warps only), and sums as the whole-tile fragments do. This runs code
 * that relies on the sm_80+ layout (after checking it) on that layout.
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

/* What both layouts use: an element as a float, the alignment rules of a load / store, and an
 * element of a tile in memory. */
namespace common
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
} // namespace common

#ifndef ACCEL_CUEMU_WMMA_LANES
template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "cuemu wmma: only the 16x16x16 shape");
    static constexpr int num_elements = 256;
    T x[256];
};

namespace detail
{
using namespace common;

} // namespace detail

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

#else  /* ACCEL_CUEMU_WMMA_LANES */
inline namespace lanes
{
template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "cuemu wmma: only the 16x16x16 shape");
    static constexpr int num_elements =
        std::is_same<T, __half>::value && !std::is_same<Use, accumulator>::value ? 16 : 8;
    T x[num_elements];
};

namespace detail
{
using namespace common;

inline int lane()
{
    return (int)((threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) & 31);
}

/* Row and column of this lane's element i (of the first 8) in a 16x16 tile: matrix_b's row is
 * k, the others' column is k. */
template <typename Use> inline int row_of(int l, int i)
{
    if (std::is_same<Use, matrix_b>::value) {
        return 2 * (l & 3) + (i & 1) + 8 * ((i >> 1) & 1);
    }
    return (l >> 2) + 8 * ((i >> 1) & 1);
}
template <typename Use> inline int col_of(int l, int i)
{
    if (std::is_same<Use, matrix_b>::value) {
        return (l >> 2) + 8 * (i >> 2);
    }
    return 2 * (l & 3) + (i & 1) + 8 * (i >> 2);
}

/* The lane and element that hold element (r, c) of a 16x16 tile (matrix_b: r is k; the others:
 * c is k), from row_of / col_of: owner<Use>()[16 r + c] = 8 lane + element. */
template <typename Use> inline const unsigned char *owner()
{
    static const struct table {
        unsigned char at[256];
        table()
        {
            for (int l = 0; l < 32; l++) {
                for (int i = 0; i < 8; i++) {
                    at[row_of<Use>(l, i) * 16 + col_of<Use>(l, i)] = (unsigned char)(8 * l + i);
                }
            }
        }
    } t;
    return t.at;
}

/* The operands of each thread's mma_sync under way, by its index in the block: a launch holds
 * cuemu_lock and runs its blocks one at a time (kernel.cc), so one table serves them all. A
 * lane's entry is set before the warp meets and cleared after it met again; an entry left
 * clear (a lane that exited) reads as NaN, as the shuffle of a lane taking no part did. */
struct mma_operands {
    const void *a, *b;
};
inline mma_operands *mma_table()
{
    static mma_operands t[1024];
    return t;
}

/* Every lane of the warp at this point: a full-warp shuffle, so a divergent or partial warp
 * fails here as it did when mma_sync gathered the fragments by shuffles. */
inline void warp_meet()
{
    (void)__shfl_sync(0xffffffffu, 0, 0);
}

/* Element (r, c) of the warp's fragment `which` (0: a, 1: b) of type F, read from the lane
 * that holds it. */
template <typename Use, typename F>
inline float element(const mma_operands *warp, int which, int r, int c)
{
    int li = owner<Use>()[r * 16 + c];
    const void *f = which == 0 ? warp[li >> 3].a : warp[li >> 3].b;
    return f != nullptr ? to_f(static_cast<const F *>(f)->x[li & 7]) : __builtin_nanf("");
}
} // namespace detail

template <typename Use, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> &f, const T *p, unsigned ldm)
{
    static_assert(!std::is_same<Use, accumulator>::value, "accumulators take a layout_t");
    detail::check(p, ldm, sizeof(T), "load_matrix_sync");
    bool row = std::is_same<Layout, row_major>::value;
    int l = detail::lane();
    for (int i = 0; i < f.num_elements; i++) {
        f.x[i] =
            detail::at(p, ldm, detail::row_of<Use>(l, i % 8), detail::col_of<Use>(l, i % 8), row);
    }
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                             unsigned ldm, layout_t layout)
{
    detail::check(p, ldm, sizeof(float), "load_matrix_sync");
    int l = detail::lane();
    for (int i = 0; i < 8; i++) {
        f.x[i] = detail::at(p, ldm, detail::row_of<accumulator>(l, i),
                            detail::col_of<accumulator>(l, i), layout == mem_row_major);
    }
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ldm, layout_t layout)
{
    detail::check(p, ldm, sizeof(float), "store_matrix_sync");
    int l = detail::lane();
    for (int i = 0; i < 8; i++) {
        int r = detail::row_of<accumulator>(l, i), c = detail::col_of<accumulator>(l, i);
        if (layout == mem_row_major) {
            p[(size_t)r * ldm + c] = f.x[i];
        } else {
            p[(size_t)c * ldm + r] = f.x[i];
        }
    }
}

/* d = a b + c over the warp's fragments, fp32 sums with k ascending (d may be c). Each lane
 * publishes where its a and b are, the warp meets, each lane reads the rows of a and columns
 * of b its own 8 elements of d need straight from the lanes that hold them (its c elements
 * are its own), the warp meets again (nobody writes d, which may be c, before every lane
 * read), and each lane writes its d. The same products summed in the same order as a
 * gather of the whole tiles by shuffles (2 warp meetings instead of 128 shuffles: the
 * emulator's fiber switches were most of an attention test's time). */
template <typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c)
{
    using FA = fragment<matrix_a, 16, 16, 16, T, LA>;
    using FB = fragment<matrix_b, 16, 16, 16, T, LB>;
    int tid = (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
    int l = tid & 31;
    detail::mma_operands *warp = detail::mma_table() + (tid - l);
    warp[l].a = &a;
    warp[l].b = &b;
    detail::warp_meet();
    float out[8];
    for (int i = 0; i < 8; i++) {
        int m = detail::row_of<accumulator>(l, i), n = detail::col_of<accumulator>(l, i);
        float o = c.x[i];
        for (int k = 0; k < 16; k++) {
            o += detail::element<matrix_a, FA>(warp, 0, m, k) *
                 detail::element<matrix_b, FB>(warp, 1, k, n);
        }
        out[i] = o;
    }
    detail::warp_meet();
    warp[l].a = nullptr;
    warp[l].b = nullptr;
    for (int i = 0; i < 8; i++) {
        d.x[i] = out[i];
    }
}
} // namespace lanes
#endif /* ACCEL_CUEMU_WMMA_LANES */

/* Either layout's fragment (lanes' through its inline namespace). */
template <typename Use, typename T, typename Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, const T &v)
{
    for (int i = 0; i < f.num_elements; i++) {
        f.x[i] = v;
    }
}

} // namespace wmma
} // namespace nvcuda

#endif /* ACCEL_CUEMU_WMMA_H */
