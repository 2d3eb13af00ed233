/*
 * The emulator's kernel scheduler (kernel.h): a launch runs its blocks one after another on the
 * calling thread, under cuemu_lock; a block's threads are fibers (Boost.Context's fcontext: a
 * switch is a few register moves, no system call) that run in turn, each until it exits or
 * waits at a barrier, a warp shuffle or a vote. A barrier opens when every thread of the block
 * reached it, a warp operation when every live lane its mask names did (CUDA's rule).
 *
 * Invariants: threads run in order 0..n-1 (blocks too), or n-1..0 with ACCEL_CUEMU_ORDER=reverse,
 * which changes the result of a kernel that reads shared memory without a barrier; a block that
 * cannot go on (a barrier some thread never reaches) is a bug a GPU would hang on, so it is
 * reported, naming the kernel, block and threads, and the process aborts. Fiber stacks are
 * allocated once, grown for bigger blocks, and reused by every launch.
 */
#include "cuemu/kernel.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <boost/context/detail/fcontext.hpp>

namespace bctx = boost::context::detail;

namespace cuemu
{

namespace
{

const uint3 k_zero = {0, 0, 0};

enum state { READY, AT_BARRIER, AT_WARP, EXITED };

struct kthread {
    bctx::fcontext_t ctx;
    uint3 tid;
    int state;
    int started; /* it has a fiber (it may run on the stack of a thread that exited) */
    unsigned ready_pass; /* the pass that made it ready: it runs in a later one */
    op_kind op;
    unsigned mask; /* warp operations */
    int arg, width;
    int pred;
    unsigned result; /* a barrier's reduction, a vote */
    unsigned char in[16], out[16];
    const char *file; /* where it waits */
    int line;
};

/* A warp's lanes: those waiting at a warp operation, those exited or absent (a partial warp). */
struct warp_lanes {
    unsigned waiting, gone;
};

/* The launch being run (one at a time: cuemu_lock). */
struct block_run {
    const launch_site *site;
    void (*body)(void *);
    void *ctx;
    kthread *thr;
    warp_lanes *warps;
    unsigned n;        /* threads in the block */
    unsigned n_exited; /* of them */
    unsigned n_at_barrier;
    kthread *cur;
    bctx::fcontext_t sched; /* the scheduler, while a fiber runs */
    int reverse;            /* ACCEL_CUEMU_ORDER=reverse */
    unsigned pass;          /* passes over the threads, each in order, so far */
    unsigned pos;           /* how far this pass got */
    int progress;           /* some thread ran in this pass */
};

block_run g_run;

/* Fiber stacks: one region, a guard below each stack, kept between launches. The guard is
 * 64 KiB so that a big local array that overflows lands in it, not in the next stack. */
constexpr size_t k_guard_nbytes = 64 * 1024;
size_t g_stack_nbytes; /* ACCEL_CUEMU_STACK_KIB (64), read at the first launch */
char *g_stacks;
size_t g_stack_stride;
unsigned g_stack_count;
kthread *g_threads;
warp_lanes *g_warps;

int g_reverse; /* ACCEL_CUEMU_ORDER, read at the first launch */

const char *op_name(op_kind op)
{
    switch (op) {
    case OP_SYNCTHREADS:
        return "__syncthreads";
    case OP_SYNCTHREADS_COUNT:
        return "__syncthreads_count";
    case OP_SYNCTHREADS_AND:
        return "__syncthreads_and";
    case OP_SYNCTHREADS_OR:
        return "__syncthreads_or";
    case OP_SYNCWARP:
        return "__syncwarp";
    case OP_SHFL:
        return "__shfl_sync";
    case OP_SHFL_UP:
        return "__shfl_up_sync";
    case OP_SHFL_DOWN:
        return "__shfl_down_sync";
    case OP_SHFL_XOR:
        return "__shfl_xor_sync";
    case OP_BALLOT:
        return "__ballot_sync";
    case OP_ANY:
        return "__any_sync";
    case OP_ALL:
        return "__all_sync";
    }
    return "?";
}

void print_kernel(FILE *f)
{
    fprintf(f, "kernel %s (launched at %s:%d), block (%u,%u,%u) of grid (%u,%u,%u), ",
            kernel_name(g_run.site->kernel).s, g_run.site->file, g_run.site->line, g_block_idx.x,
            g_block_idx.y, g_block_idx.z, g_grid_dim.x, g_grid_dim.y, g_grid_dim.z);
}

void describe(FILE *f, const kthread *t)
{
    fprintf(f, "thread (%u,%u,%u) ", t->tid.x, t->tid.y, t->tid.z);
    switch (t->state) {
    case READY:
        fprintf(f, "runs");
        break;
    case EXITED:
        fprintf(f, "has exited");
        break;
    case AT_WARP:
        fprintf(f, "waits at %s(mask 0x%08x) at %s:%d", op_name(t->op), t->mask, t->file, t->line);
        break;
    default:
        fprintf(f, "waits at %s at %s:%d", op_name(t->op), t->file, t->line);
        break;
    }
}

/* A bug a GPU would hang on or leave undefined: say where, then abort (the contract of a
 * testing aid: a wrong kernel must not pass). */
[[noreturn]] void fail(const kthread *a, const kthread *b, const char *fmt, ...)
{
    fprintf(stderr, "cuemu: ");
    if (g_run.site != nullptr) {
        print_kernel(stderr);
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (a != nullptr) {
        fprintf(stderr, ": ");
        describe(stderr, a);
    }
    if (b != nullptr) {
        fprintf(stderr, ", while ");
        describe(stderr, b);
    }
    fprintf(stderr, " (a GPU would hang or give undefined results)\n");
    fflush(stderr);
    abort();
}

kthread *current(op_kind op)
{
    if (g_run.cur == nullptr) {
        fprintf(stderr, "cuemu: %s called outside a kernel\n", op_name(op));
        abort();
    }
    return g_run.cur;
}

/* ---- switching: each thread hands over to the next ready one of the pass directly; the
 * scheduler only starts a pass and sees it end ---- */

kthread g_dead; /* the "from" of a jump out of an exited fiber: nothing to save */

/* The next thread of this pass, or nullptr at its end. A thread made ready during the pass
 * waits for the next one, so that each pass runs threads strictly in order. */
kthread *next_ready(void)
{
    for (unsigned k = g_run.pos + 1; k < g_run.n; k++) {
        kthread *t = &g_run.thr[g_run.reverse ? g_run.n - 1 - k : k];
        if (t->state == READY && t->ready_pass != g_run.pass) {
            g_run.pos = k;
            g_run.progress = 1;
            return t;
        }
    }
    g_run.pos = g_run.n;
    return nullptr;
}

/* Where the jump that resumed us came from: save its context (fcontext is one-shot). */
void came_from(bctx::transfer_t t)
{
    kthread *from = static_cast<kthread *>(t.data);
    if (from == nullptr) {
        g_run.sched = t.fctx;
    } else if (from != &g_dead) {
        from->ctx = t.fctx;
    }
}

void fiber_main(bctx::transfer_t t);

/* Leaves `me` (nullptr: the scheduler) for `to` (nullptr: the scheduler) until resumed. A thread
 * that has not started gets a fiber on its own stack. */
void switch_to(kthread *me, kthread *to)
{
    if (to != nullptr && !to->started) {
        /* Stacks start at staggered offsets: at one offset their hot frames would all fall in
         * the same cache sets. */
        size_t i = (size_t)(to - g_run.thr), color = (i % 64) * 64;
        char *top = g_stacks + g_stack_stride * (i + 1) - color;
        to->ctx = bctx::make_fcontext(top, g_stack_nbytes - color, fiber_main);
        to->started = 1;
    }
    g_run.cur = to;
    g_thread_idx = to != nullptr ? &to->tid : &k_zero;
    came_from(bctx::jump_fcontext(to != nullptr ? to->ctx : g_run.sched, me));
}

/* The running thread waits: on to the next thread of the pass. */
void yield(void)
{
    kthread *me = g_run.cur;
    switch_to(me, next_ready());
}

/* ---- block barriers ---- */

/* Every thread is at the barrier (the caller checked no thread exited): open it. */
void open_barrier(const kthread *last)
{
    unsigned count = 0;
    for (unsigned i = 0; i < g_run.n; i++) {
        const kthread *t = &g_run.thr[i];
        /* CUDA allows __syncthreads in conditional code only where the whole block takes the
         * same branch: threads at two different barriers are a divergent barrier. */
        if (t->op != last->op || t->line != last->line ||
            (t->file != last->file && strcmp(t->file, last->file) != 0)) {
            fail(t, last, "a divergent barrier: threads wait at different barriers");
        }
        count += g_run.thr[i].pred != 0;
    }
    unsigned r = 0;
    switch (last->op) {
    case OP_SYNCTHREADS_COUNT:
        r = count;
        break;
    case OP_SYNCTHREADS_AND:
        r = count == g_run.n;
        break;
    case OP_SYNCTHREADS_OR:
        r = count != 0;
        break;
    default:
        break;
    }
    for (unsigned i = 0; i < g_run.n; i++) {
        g_run.thr[i].result = r;
        g_run.thr[i].state = READY;
        g_run.thr[i].ready_pass = g_run.pass;
    }
    g_run.n_at_barrier = 0;
}

/* Some thread exited while others wait at (or will wait at) a block barrier. */
[[noreturn]] void barrier_after_exit(void)
{
    const kthread *waiting = nullptr, *gone = nullptr;
    for (unsigned i = 0; i < g_run.n; i++) {
        const kthread *t = &g_run.thr[i];
        if (t->state == AT_BARRIER && waiting == nullptr) {
            waiting = t;
        }
        if (t->state == EXITED && gone == nullptr) {
            gone = t;
        }
    }
    fail(waiting, gone, "a barrier that an exited thread never reaches");
}

/* ---- warp operations ---- */

unsigned lane_of(const kthread *t)
{
    return (unsigned)(t - g_run.thr) % 32u;
}

kthread *warp_base(const kthread *t)
{
    return g_run.thr + ((unsigned)(t - g_run.thr) / 32u) * 32u;
}

warp_lanes *warp_of(const kthread *t)
{
    return &g_run.warps[(unsigned)(t - g_run.thr) / 32u];
}

/* The lane a shuffle reads for lane `lane`, or -1 for "its own value". */
int shfl_source(const kthread *t, unsigned lane)
{
    int w = t->width;
    int seg = (int)lane & ~(w - 1); /* the lane's segment of `width` lanes */
    int l = (int)lane;
    switch (t->op) {
    case OP_SHFL:
        return seg + (t->arg & (w - 1));
    case OP_SHFL_UP:
        return l - t->arg >= seg ? l - t->arg : -1;
    case OP_SHFL_DOWN:
        return l + t->arg < seg + w ? l + t->arg : -1;
    default: { /* xor: lanes of earlier segments may be read, later ones give the own value */
        int s = l ^ t->arg;
        return s < seg + w ? s : -1;
    }
    }
}

/* If every live lane named in t's mask waits at t's operation with t's mask, do it. The
 * bitmasks make the common case (a lane that is not the last to arrive) O(1). */
void try_complete_warp(kthread *t)
{
    warp_lanes *wl = warp_of(t);
    unsigned live = t->mask & ~wl->gone; /* the lanes that take part */
    if ((wl->waiting & live) != live) {
        return;
    }
    kthread *w = warp_base(t);
    unsigned ballot = 0;
    for (unsigned j = 0; j < 32; j++) {
        if ((live >> j) & 1u) {
            if (w[j].mask != t->mask) {
                return; /* lane j waits at another operation: the scheduler will see */
            }
            if (w[j].op != t->op || w[j].width != t->width) {
                fail(&w[j], t, "lanes of one warp operation call different intrinsics");
            }
            ballot |= (unsigned)(w[j].pred != 0) << j;
        }
    }
    wl->waiting &= ~live;
    for (unsigned j = 0; j < 32; j++) {
        if (!((live >> j) & 1u)) {
            continue;
        }
        kthread *l = &w[j];
        switch (t->op) {
        case OP_BALLOT:
            l->result = ballot;
            break;
        case OP_ANY:
            l->result = ballot != 0;
            break;
        case OP_ALL:
            l->result = ballot == live;
            break;
        case OP_SYNCWARP:
            break;
        default: {
            int s = shfl_source(l, j);
            /* Whole buffers: a fixed-size copy is a few moves, the extra bytes are unused. */
            if (s < 0) {
                memcpy(l->out, l->in, sizeof l->out);
            } else if (s < 32 && ((live >> s) & 1u)) {
                memcpy(l->out, w[s].in, sizeof l->out);
            } else {
                memset(l->out, 0xff, sizeof l->out); /* an absent lane: undefined on a GPU */
            }
            break;
        }
        }
        l->state = READY;
        l->ready_pass = g_run.pass;
    }
}

/* ---- fibers and the scheduler ---- */

/* A thread's end: it may let others go on, or be the last one a barrier waited for. */
void thread_exit(kthread *me)
{
    me->state = EXITED;
    g_run.n_exited++;
    if (g_run.n_at_barrier > 0 && g_run.n_at_barrier + g_run.n_exited == g_run.n) {
        barrier_after_exit();
    }
    /* Lanes waiting at a warp operation that named this lane may now go on without it (only
     * the waiting lanes are visited: most threads exit with none waiting). */
    warp_lanes *wl = warp_of(me);
    wl->gone |= 1u << lane_of(me);
    kthread *w = warp_base(me);
    for (unsigned rest = wl->waiting; rest != 0; rest &= rest - 1) {
        unsigned j = (unsigned)__builtin_ctz(rest);
        if (((wl->waiting >> j) & 1u) && ((w[j].mask >> lane_of(me)) & 1u)) {
            try_complete_warp(&w[j]);
        }
    }
}

/* When its thread exits, a fiber runs the next thread itself if that one has not started: a
 * kernel without barriers then runs a whole block on one stack, without a switch. */
void fiber_main(bctx::transfer_t t)
{
    came_from(t);
    for (;;) {
        g_run.body(g_run.ctx);
        thread_exit(g_run.cur);
        kthread *next = next_ready();
        if (next == nullptr || next->started) {
            switch_to(&g_dead, next);
            abort(); /* an exited fiber is never resumed */
        }
        next->started = 1;
        g_run.cur = next;
        g_thread_idx = &next->tid;
    }
}

/* Stacks and thread records for n threads. */
void reserve_fibers(unsigned n)
{
    if (n <= g_stack_count) {
        return;
    }
    size_t stride = g_stack_nbytes + k_guard_nbytes;
    if (g_stacks != nullptr) {
        munmap(g_stacks, g_stack_stride * g_stack_count);
    }
    void *p = mmap(nullptr, stride * n, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    kthread *thr = static_cast<kthread *>(realloc(g_threads, sizeof(kthread) * n));
    if (thr != nullptr) {
        g_threads = thr;
    }
    size_t n_warps = (n + 31) / 32;
    warp_lanes *warps = static_cast<warp_lanes *>(realloc(g_warps, sizeof(warp_lanes) * n_warps));
    if (warps != nullptr) {
        g_warps = warps;
    }
    if (p == MAP_FAILED || thr == nullptr || warps == nullptr) {
        fprintf(stderr, "cuemu: no memory for %u fiber stacks of %zu KiB\n", n,
                g_stack_nbytes / 1024);
        abort();
    }
    for (unsigned i = 0; i < n; i++) { /* overflowing a stack faults instead of corrupting */
        mprotect(static_cast<char *>(p) + stride * i, k_guard_nbytes, PROT_NONE);
    }
    g_stacks = static_cast<char *>(p);
    g_stack_stride = stride;
    g_stack_count = n;
}

/* The launch's dynamic shared memory (launch_check capped it at 48 KiB, or up to 227 KiB by
 * cudaFuncSetAttribute). */
void reserve_dynamic_shared(size_t nbytes)
{
    static size_t have;
    if (nbytes <= have && g_dynamic_shared != nullptr) {
        return;
    }
    void *p = nullptr;
    size_t want = nbytes < 1024 ? 1024 : nbytes;
    if (posix_memalign(&p, 128, want) != 0) {
        fprintf(stderr, "cuemu: no memory for %zu bytes of dynamic shared memory\n", want);
        abort();
    }
    free(g_dynamic_shared);
    g_dynamic_shared = static_cast<char *>(p);
    have = want;
}

/* Runs one block to its end (all threads exited). */
void run_block(unsigned n)
{
    /* Only what is read before a thread writes it: the rest (its operation, mask, buffers) is
     * set when it waits. A whole-record memset and three divisions per thread were a fifth of
     * the time of a short kernel's block. */
    unsigned x = 0, y = 0, z = 0;
    for (unsigned i = 0; i < n; i++) {
        kthread *t = &g_run.thr[i];
        t->tid.x = x;
        t->tid.y = y;
        t->tid.z = z;
        t->state = READY;
        t->started = 0;
        t->ready_pass = 0;
        t->pred = 0;
        t->mask = 0;
        if (++x == g_block_dim.x) {
            x = 0;
            if (++y == g_block_dim.y) {
                y = 0;
                z++;
            }
        }
    }
    for (unsigned w = 0; w < (n + 31) / 32; w++) {
        g_run.warps[w].waiting = 0;
        g_run.warps[w].gone = n - 32 * w >= 32 ? 0u : ~0u << (n - 32 * w);
    }
    g_run.n_exited = 0;
    g_run.n_at_barrier = 0;
    g_run.pass = 0; /* the threads start ready in pass 0 and run from pass 1 */
    while (g_run.n_exited < n) {
        g_run.pass++;
        g_run.pos = (unsigned)-1;
        g_run.progress = 0;
        kthread *first = next_ready();
        if (first != nullptr) {
            switch_to(nullptr, first); /* back when the pass ends */
        }
        if (!g_run.progress && g_run.n_exited < n) {
            /* Everyone left waits: name a waiting thread and one it waits for. */
            const kthread *a = nullptr, *b = nullptr;
            for (unsigned i = 0; i < n && a == nullptr; i++) {
                if (g_run.thr[i].state == AT_WARP || g_run.thr[i].state == AT_BARRIER) {
                    a = &g_run.thr[i];
                }
            }
            for (unsigned i = 0; i < n && b == nullptr; i++) {
                const kthread *t = &g_run.thr[i];
                if (t->state == EXITED) {
                    continue;
                }
                if (a->state == AT_BARRIER
                        ? t->state != AT_BARRIER
                        : (warp_base(t) == warp_base(a) && ((a->mask >> lane_of(t)) & 1u) &&
                           (t->state != AT_WARP || t->mask != a->mask))) {
                    b = t;
                }
            }
            fail(a, b, "no thread can go on");
        }
    }
}

/* ---- a fault in a kernel names the kernel and thread instead of a bare SIGSEGV ---- */

struct sigaction g_old_segv;

void on_segv(int sig, siginfo_t *si, void *uctx)
{
    const char *a = static_cast<const char *>(si->si_addr);
    size_t span = g_stack_stride * g_stack_count;
    if (g_run.cur != nullptr) {
        int overflow = a >= g_stacks && a < g_stacks + span &&
                       (size_t)(a - g_stacks) % g_stack_stride < k_guard_nbytes;
        /* Not async-signal-safe, but the process ends here anyway. */
        char msg[512];
        int len = snprintf(msg, sizeof msg,
                           "cuemu: kernel %s (launched at %s:%d), block (%u,%u,%u), thread "
                           "(%u,%u,%u): ",
                           kernel_name(g_run.site->kernel).s, g_run.site->file, g_run.site->line,
                           g_block_idx.x, g_block_idx.y, g_block_idx.z, g_run.cur->tid.x,
                           g_run.cur->tid.y, g_run.cur->tid.z);
        if (len > 0 && (size_t)len < sizeof msg) {
            if (overflow) {
                snprintf(msg + len, sizeof msg - (size_t)len,
                         "its locals overflowed the fiber stack of %zu KiB (raise "
                         "ACCEL_CUEMU_STACK_KIB)\n",
                         g_stack_nbytes / 1024);
            } else {
                snprintf(msg + len, sizeof msg - (size_t)len,
                         "invalid memory access at %p (SIGSEGV)\n", si->si_addr);
            }
            if (write(2, msg, strlen(msg)) < 0) {
                /* nothing more to say */
            }
        }
        if (overflow) {
            abort();
        }
    }
    /* Otherwise the handler that was there before. */
    if ((g_old_segv.sa_flags & SA_SIGINFO) && g_old_segv.sa_sigaction != nullptr) {
        g_old_segv.sa_sigaction(sig, si, uctx);
    } else if (g_old_segv.sa_handler != SIG_DFL && g_old_segv.sa_handler != SIG_IGN) {
        g_old_segv.sa_handler(sig);
    } else {
        sigaction(SIGSEGV, &g_old_segv, nullptr); /* the fault repeats, with the default */
    }
}

/* A fault on a guard page needs a stack of its own to be handled on. Once per host thread. */
void ensure_signal_stack(void)
{
    static thread_local bool done;
    if (done) {
        return;
    }
    done = true;
    stack_t cur;
    if (sigaltstack(nullptr, &cur) == 0 && (cur.ss_flags & SS_DISABLE)) {
        stack_t st;
        st.ss_size = 64 * 1024;
        st.ss_sp = malloc(st.ss_size); /* the thread's for its lifetime */
        st.ss_flags = 0;
        if (st.ss_sp != nullptr) {
            sigaltstack(&st, nullptr);
        }
    }
}

/* The environment, once. */
void configure(void)
{
    const char *v = getenv("ACCEL_CUEMU_ORDER");
    if (v != nullptr && strcmp(v, "reverse") == 0) {
        g_reverse = 1;
    } else if (v != nullptr && v[0] != '\0' && strcmp(v, "forward") != 0) {
        fprintf(stderr, "cuemu: ACCEL_CUEMU_ORDER=%s: expected forward or reverse\n", v);
        abort();
    }
    long kib = 64;
    v = getenv("ACCEL_CUEMU_STACK_KIB");
    if (v != nullptr && v[0] != '\0') {
        char *end;
        kib = strtol(v, &end, 10);
        if (*end != '\0' || kib < 16 || kib > 65536) {
            fprintf(stderr, "cuemu: ACCEL_CUEMU_STACK_KIB=%s: expected 16 to 65536\n", v);
            abort();
        }
    }
    g_stack_nbytes = (size_t)kib * 1024;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
}

} // namespace

/* The kernel's name as launched, without the parentheses the launch rewrite adds. */
kernel_name::kernel_name(const char *k)
{
    size_t len = strlen(k);
    if (len >= 2 && k[0] == '(' && k[len - 1] == ')') {
        k++;
        len -= 2;
    }
    snprintf(s, sizeof s, "%.*s", (int)len, k);
}

const uint3 *g_thread_idx = &k_zero;
char *g_dynamic_shared;
uint3 g_block_idx;
dim3 g_block_dim(0, 0, 0), g_grid_dim(0, 0, 0);

int block_barrier(op_kind op, int pred, const char *file, int line)
{
    kthread *t = current(op);
    t->state = AT_BARRIER;
    t->op = op;
    t->pred = pred;
    t->file = file;
    t->line = line;
    g_run.n_at_barrier++;
    if (g_run.n_at_barrier + g_run.n_exited == g_run.n) {
        if (g_run.n_exited > 0) {
            barrier_after_exit();
        }
        open_barrier(t);
    }
    yield();
    return (int)t->result;
}

/* Records t's warp operation and waits until the warp completes it. */
static void warp_wait(kthread *t, op_kind op, unsigned mask, const char *file, int line)
{
    t->op = op;
    t->mask = mask;
    t->file = file;
    t->line = line;
    t->state = AT_WARP;
    if (!((mask >> lane_of(t)) & 1u)) {
        fail(t, nullptr, "%s: the mask 0x%08x does not name the calling lane %u", op_name(op), mask,
             lane_of(t));
    }
    warp_of(t)->waiting |= 1u << lane_of(t);
    try_complete_warp(t);
    yield();
}

unsigned warp_vote(op_kind op, unsigned mask, int pred, const char *file, int line)
{
    kthread *t = current(op);
    t->pred = pred;
    t->width = 32;
    warp_wait(t, op, mask, file, line);
    return t->result;
}

void warp_shfl(op_kind op, unsigned mask, const void *in, void *out, size_t nbytes, int arg,
               int width, const char *file, int line)
{
    kthread *t = current(op);
    if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
        fail(t, nullptr, "%s at %s:%d: width %d is not a power of 2 up to 32", op_name(op), file,
             line, width);
    }
    if (nbytes == 4) { /* the common sizes as fixed copies (no call) */
        memcpy(t->in, in, 4);
    } else if (nbytes == 8) {
        memcpy(t->in, in, 8);
    } else {
        memcpy(t->in, in, nbytes);
    }
    t->arg = arg;
    t->width = width;
    warp_wait(t, op, mask, file, line);
    if (nbytes == 4) {
        memcpy(out, t->out, 4);
    } else if (nbytes == 8) {
        memcpy(out, t->out, 8);
    } else {
        memcpy(out, t->out, nbytes);
    }
}

void launch_run(const launch_site &site, void (*body)(void *), void *ctx)
{
    cuemu_lock();
    if (g_stack_nbytes == 0) {
        configure();
    }
    ensure_signal_stack();
    unsigned n = site.block.x * site.block.y * site.block.z;
    reserve_fibers(n);
    g_run.site = &site;
    g_run.body = body;
    g_run.ctx = ctx;
    g_run.thr = g_threads;
    g_run.warps = g_warps;
    g_run.n = n;
    g_run.reverse = g_reverse;
    reserve_dynamic_shared(site.smem);
    g_block_dim = site.block;
    g_grid_dim = site.grid;
    unsigned long long blocks = (unsigned long long)site.grid.x * site.grid.y * site.grid.z;
    for (unsigned long long k = 0; k < blocks; k++) {
        unsigned long long b = g_reverse ? blocks - 1 - k : k;
        g_block_idx.x = (unsigned)(b % site.grid.x);
        g_block_idx.y = (unsigned)(b / site.grid.x % site.grid.y);
        g_block_idx.z = (unsigned)(b / ((unsigned long long)site.grid.x * site.grid.y));
        memset(g_dynamic_shared, 0xff, site.smem); /* unwritten shared memory reads NaN */
        run_block(n);
    }
    g_run.site = nullptr;
    g_block_dim = dim3(0, 0, 0);
    g_grid_dim = dim3(0, 0, 0);
    g_block_idx = k_zero;
    cuemu_unlock();
}

} // namespace cuemu
