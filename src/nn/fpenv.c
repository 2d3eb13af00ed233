/*
 * The flush-denormal scope of nn's kernels (nn_ctx_set_flush_denormal, torch.set_flush_denormal).
 *
 * Invariant: the MXCSR of every thread nn runs on is the caller's again when the outermost nn
 * entry point returns. The calling thread saves it in the scope object; OpenMP workers save
 * theirs in thread-local storage inside one parallel region at entry and restore it in another
 * at exit (a worker that did not take part in the first region has nothing saved and is left
 * alone). Nested entry points (an op inside nn_gpt_forward, ops run by backward) only count.
 */
#include "nn_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define NN_HAVE_MXCSR 1
/* MXCSR bits: flush-to-zero (15) and denormals-are-zero (6). */
#define NN_FTZ_DAZ 0x8040u
#else
#define NN_HAVE_MXCSR 0
#endif

int nn_ctx_set_flush_denormal(nn_ctx *g, int enabled)
{
    if (g == NULL) {
        return 0;
    }
    int prev = g->flush_denormal;
    g->flush_denormal = enabled != 0;
    return prev;
}

#if NN_HAVE_MXCSR && defined(ACCEL_HAVE_OPENMP)
static _Thread_local unsigned worker_saved;
static _Thread_local int worker_has_saved;

static void workers_set(void)
{
#pragma omp parallel
    {
        if (omp_get_thread_num() != 0) {
            worker_saved = _mm_getcsr();
            worker_has_saved = 1;
            _mm_setcsr(worker_saved | NN_FTZ_DAZ);
        }
    }
}

static void workers_restore(void)
{
#pragma omp parallel
    {
        if (omp_get_thread_num() != 0 && worker_has_saved) {
            _mm_setcsr(worker_saved);
            worker_has_saved = 0;
        }
    }
}
#endif

void accel__nn_fp_enter(nn_ctx *g, nn_fpscope *s)
{
    s->counted = 0;
    s->active = 0;
    if (g == NULL || !g->flush_denormal) {
        return;
    }
    s->counted = 1;
    if (g->fp_depth++ > 0) {
        return;
    }
#if NN_HAVE_MXCSR
    s->saved = _mm_getcsr();
    s->active = 1;
    _mm_setcsr(s->saved | NN_FTZ_DAZ);
#ifdef ACCEL_HAVE_OPENMP
    /* Skipped inside a user's parallel region (nested regions would run on one thread). */
    if (omp_get_max_threads() > 1 && !omp_in_parallel()) {
        workers_set();
        s->active = 2;
    }
#endif
#endif
}

void accel__nn_fp_leave(nn_ctx *g, nn_fpscope *s)
{
    if (!s->counted) {
        return;
    }
    g->fp_depth--;
#if NN_HAVE_MXCSR
    if (s->active) {
#ifdef ACCEL_HAVE_OPENMP
        if (s->active == 2) {
            workers_restore();
        }
#endif
        _mm_setcsr(s->saved);
    }
#endif
}

void accel__nn_fp_pause(const nn_fpscope *s)
{
#if NN_HAVE_MXCSR
    if (s->active) {
        _mm_setcsr(s->saved);
    }
#else
    (void)s;
#endif
}

void accel__nn_fp_resume(const nn_fpscope *s)
{
#if NN_HAVE_MXCSR
    if (s->active) {
        _mm_setcsr(s->saved | NN_FTZ_DAZ);
    }
#else
    (void)s;
#endif
}
