/*
 * The reducer (DDP's Reducer): owns a model's gradient buckets end to end. It turns the
 * geometry's buckets into communication ranges at prepare (from the first to the last
 * trainable parameter, with the frozen ranges inside precomputed), counts readiness during a
 * backward, launches each complete bucket strictly in bucket order on every process, asks for
 * bf16 / fp16 compression as the all-reduce's wire dtype (the communicator rounds inside its
 * reduction, no conversion pass on any thread), waits, and records profiler spans. Gradients
 * in GPU memory go to a device communicator (nccl) directly: each bucket's all-reduce (at
 * ZeRO-2 its in-place reduce-scatter, the other pieces zeroed once it completed) is posted on
 * the reducer's communication stream after an event recorded on the compute stream at launch,
 * so it overlaps the rest of backward (with hybrid sharding the cross-replica all-reduce of the
 * owned piece follows at once, on a stream of its own). Host communicators (several processes
 * sharing a GPU) get them through staging: the collective's hooks copy a bucket to pinned host
 * memory after that event and back once reduced, on that same stream of their own (ZeRO-2: the
 * padded bucket out, the owned piece back; the other pieces are zeroed on the device). With
 * hybrid sharding the owned piece stays in host memory for the cross-replica all-reduce, whose
 * hook copies it back (on a stream of its own: the replica communicator has its own thread).
 *
 * Invariants: launches follow bucket order, so every process issues the same collectives in
 * the same order; a bucket's gradients belong to the communication thread from its launch
 * until it is waited for; frozen gradients inside a communicated range are zeroed before it is
 * sent, so they contribute nothing.
 */
#include <string.h>

#include "core/profile.h"
#include "train_internal.h"

/* The reduction of a bucket: an average over all processes, except in a join region that
 * divides by the processes still training (sum now, scale after). */
static accel_reduce_op bucket_op(const accel_model *m)
{
    return (m->join_active && !m->join_divide_initial) ? ACCEL_SUM : ACCEL_AVG;
}

/* ---- staging ---- */

static int force_staging;

void accel__train_force_staging(int on)
{
    force_staging = on;
}

/* Gradients in GPU memory and a communicator that reads host memory only. */
int accel__model_staged(const accel_model *m)
{
    return force_staging ||
           (!accel__model_on_host(m) && !(accel__comm_caps(m->acc->comm) & ACCEL__COMM_DEVICE_MEM));
}

/* ---- building ---- */

/* Communication ranges, trainable counts and each parameter's public bucket index, walking
 * memory (backward) order, then the frozen ranges inside each communicated range. */
static void build_ranges(accel_model *m)
{
    accel__reducer *r = &m->red;
    for (int b = 0; b < r->n_buckets; b++) {
        accel__bucket *bk = &r->buckets[b];
        bk->model = m;
        bk->index = b;
        bk->offset = m->flat.buckets[b].offset;
    }
    for (int i = m->n_params - 1; i >= 0; i--) {
        accel_param *p = &m->params[i];
        accel__bucket *bk = &r->buckets[m->flat_bucket[i]];
        p->bucket = p->frozen ? -1 : bk->index;
        if (p->frozen) {
            continue;
        }
        if (bk->n_params++ == 0) {
            bk->offset = p->offset;
            r->n_sent++;
        }
        bk->count = p->offset + p->numel - bk->offset;
    }
    int nf = 0, cur = -1;
    for (int i = m->n_params - 1; i >= 0; i--) {
        const accel_param *p = &m->params[i];
        accel__bucket *bk = &r->buckets[m->flat_bucket[i]];
        if (bk->index != cur) {
            cur = bk->index;
            bk->frozen_first = nf;
        }
        if (!p->frozen || p->offset < bk->offset || p->offset >= bk->offset + bk->count) {
            continue;
        }
        accel__range *last = bk->n_frozen > 0 ? &r->frozen[nf - 1] : NULL;
        if (last != NULL && last->offset + last->count == p->offset) {
            last->count += p->numel;
        } else {
            r->frozen[nf++] = (accel__range){p->offset, p->numel};
            bk->n_frozen++;
        }
    }
}

/* The communication stream, one event per bucket, and when staged the pinned host mirror of
 * the gradients. */
static accel_status alloc_stream(accel_model *m)
{
    accel__reducer *r = &m->red;
    size_t nbytes = m->flat.padded_numel * sizeof(float);
    accel_status st = accel__stream_new(m->dev, &r->comm_stream);
    if (st == ACCEL_OK && r->staged) {
        st = accel__dev_host_alloc(m->dev, nbytes, &r->host_buf);
    }
    if (st == ACCEL_OK && m->replica_comm != NULL) {
        st = accel__stream_new(m->dev, &r->cross_stream);
    }
    for (int b = 0; b < r->n_buckets && st == ACCEL_OK; b++) {
        st = accel__event_new(m->dev, &r->buckets[b].ready_ev);
        if (st == ACCEL_OK && r->on_device && m->replica_comm != NULL) {
            st = accel__event_new(m->dev, &r->buckets[b].cross_ev);
        }
    }
    if (st != ACCEL_OK) {
        return accel__seterr(NULL, st, "accel_prepare: staging gradients through host memory: %s",
                             accel_last_error(NULL));
    }
    return ACCEL_OK;
}

accel_status accel__reducer_prepare(accel_model *m)
{
    accel__reducer *r = &m->red;
    accel *acc = m->acc;
    if (r->buckets != NULL) {
        return ACCEL_OK;
    }
    r->zero_stage = m->zero_stage;
    switch (r->zero_stage) {
    case 0: /* DDP: every bucket all-reduced in place */
    case 1: /* all-reduce, then each process steps its shard and the pieces are gathered */
    case 2: /* reduce-scatter each bucket into its owners' pieces, gather after the step */
    case 3: /* as 2 with one bucket per unit, parameters gathered per unit before use */
        break;
    default: /* accel_init refuses other values */
        return accel__seterr(acc, ACCEL_EINVAL, "accel_prepare: ZeRO stage %d is not 0-3",
                             r->zero_stage);
    }
    /* Stages 1-3 on a device run on either path, hybrid sharding's cross-replica step
     * included: a communicator that reads device memory (nccl) reduces and gathers the GPU
     * buffers in place, a host one goes through staging (gradient buckets here, the allgathers
     * in zero.c and zero3.c). */
    int staged = accel__model_staged(m);
    r->n_buckets = m->flat.n_buckets;
    r->buckets = accel__calloc((size_t)r->n_buckets, sizeof(*r->buckets));
    r->frozen = accel__calloc((size_t)m->n_params, sizeof(*r->frozen));
    r->ready = accel__calloc((size_t)m->n_params, 1);
    if (r->buckets == NULL || r->frozen == NULL || r->ready == NULL) {
        accel__reducer_free(m);
        return accel__seterr(acc, ACCEL_ENOMEM, "accel_prepare: out of memory for buckets");
    }
    build_ranges(m);
    memset(r->ready, 1, (size_t)m->n_params);
    int dt = acc->settings->train.comm_dtype;
    int compressed = acc->n_ranks > 1 && (dt == ACCEL_BF16 || dt == ACCEL_F16);
    if (compressed && !(accel__comm_caps(acc->comm) & ACCEL__COMM_WIRE)) {
        accel__reducer_free(m);
        return accel__seterr(acc, ACCEL_EUNSUPPORTED,
                             "accel_prepare: comm_dtype=%s needs a backend that reduces through a "
                             "wire dtype, and %s does not",
                             accel_dtype_name((accel_dtype)dt),
                             accel__comm_backend_name(acc->comm));
    }
    r->staged = acc->n_ranks > 1 && staged;
    r->on_device = acc->n_ranks > 1 && !r->staged && !accel__model_on_host(m);
    r->comm_dtype = compressed ? (accel_dtype)dt : ACCEL_F32;
    accel_status st = ACCEL_OK;
    if (r->staged || r->on_device) {
        st = alloc_stream(m);
    }
    if (st != ACCEL_OK) {
        accel__reducer_free(m);
        return accel__adopt_thread_error(acc, st);
    }
    return ACCEL_OK;
}

void accel__reducer_free(accel_model *m)
{
    accel__reducer *r = &m->red;
    if (r->buckets != NULL) {
        (void)accel__reducer_wait(m);
    }
    accel__stream_free(m->dev, r->comm_stream);
    accel__stream_free(m->dev, r->cross_stream);
    accel__dev_host_free(m->dev, r->host_buf);
    for (int b = 0; r->buckets != NULL && b < r->n_buckets; b++) {
        accel__event_free(m->dev, r->buckets[b].ready_ev);
        accel__event_free(m->dev, r->buckets[b].cross_ev);
        accel__free(r->buckets[b].hook_msg);
    }
    accel__free(r->buckets);
    accel__free(r->frozen);
    accel__free(r->ready);
    memset(r, 0, sizeof(*r));
}

/* ---- one backward ---- */

/* Hooks run on the communication thread and return nothing: a failure is kept on the bucket
 * and reported by the wait. */
static void hook_status(accel__bucket *bk, accel_status st)
{
    if (st != ACCEL_OK && bk->hook_st == ACCEL_OK) {
        bk->hook_st = st;
        bk->hook_msg = accel__strdup(accel_last_error(NULL));
    }
}

/* The bucket's reduction is a reduce-scatter into the owners' pieces (ZeRO-2/3, uncompressed):
 * it reads the whole padded bucket and writes this process's piece. */
static int scatters(const accel_model *m)
{
    return m->red.zero_stage >= 2 && m->red.comm_dtype == ACCEL_F32;
}

/* The bucket's reduction has a cross-replica step (post_cross). */
static int crosses(const accel_model *m)
{
    return m->replica_comm != NULL && scatters(m);
}

/* Before the data moves, when staged: what the collective reads (the bucket's range; for a
 * reduce-scatter the whole padded bucket) to host memory, ordered after the compute stream's
 * work on it. */
static void bucket_pre(void *arg)
{
    accel__bucket *bk = arg;
    accel_model *m = bk->model;
    accel__reducer *r = &m->red;
    const accel__flat_bucket *fb = &m->flat.buckets[bk->index];
    size_t off = scatters(m) ? fb->offset : bk->offset,
           count = scatters(m) ? fb->padded : bk->count;
    accel_status st = accel__stream_wait_event(m->dev, r->comm_stream, bk->ready_ev);
    if (st == ACCEL_OK) {
        st = accel__dev_copy(m->dev, (float *)r->host_buf + off, m->grad + off,
                             count * sizeof(float), ACCEL__COPY_D2H, r->comm_stream);
    }
    if (st == ACCEL_OK) {
        st = accel__stream_sync(m->dev, r->comm_stream); /* host bytes ready for the collective */
    }
    hook_status(bk, st);
}

/* After the data moved, when staged: what it wrote back to the device (after a reduce-scatter
 * the owned piece). At stages 2-3 the other processes' pieces are then zeroed on the device, as
 * release_unowned gives them back on the host. Complete on return, so the gradients are final
 * once the collective is. With a cross-replica step this is that step's hook (the
 * reduce-scatter has none: its piece stays in host memory for the all-reduce), run on the
 * replica communicator's thread, so on the stream of its own. */
static void bucket_post(void *arg)
{
    accel__bucket *bk = arg;
    accel_model *m = bk->model;
    accel__reducer *r = &m->red;
    accel__stream *s = crosses(m) ? r->cross_stream : r->comm_stream;
    const accel__flat_bucket *fb = &m->flat.buckets[bk->index];
    size_t po = 0, pc = 0;
    if (r->zero_stage >= 2) {
        accel__flat_piece(&m->flat, bk->index, m->rank, &po, &pc);
    }
    size_t off = scatters(m) ? po : bk->offset, count = scatters(m) ? pc : bk->count;
    accel_status st = accel__dev_copy(m->dev, m->grad + off, (float *)r->host_buf + off,
                                      count * sizeof(float), ACCEL__COPY_H2D, s);
    if (st == ACCEL_OK && r->zero_stage >= 2) {
        size_t end = fb->offset + fb->padded;
        st = accel__dev_zero(m->dev, accel__grad_span(m, fb->offset, po - fb->offset), s);
        if (st == ACCEL_OK) {
            st = accel__dev_zero(m->dev, accel__grad_span(m, po + pc, end - po - pc), s);
        }
    }
    if (st == ACCEL_OK) {
        st = accel__stream_sync(m->dev, s);
    }
    hook_status(bk, st);
}

/* ZeRO-2/3 gradient pages: bucket b's mapped writable in one call before the backward writes
 * it, instead of two faults per page (the zero page on the first read of an accumulation, then
 * a copy on write). One bucket ahead of the launches, so pages the earlier buckets released
 * are not all taken back at once: a backward holds only the buckets not yet reduced. */
static void populate(accel_model *m, int b)
{
    if (m->grad_pages && b < m->flat.n_buckets) {
        const accel__flat_bucket *fb = &m->flat.buckets[b];
        if (accel__pages_populate(m->grad + fb->offset, fb->padded * sizeof(float)) != 0 &&
            !m->red.populate_failed) {
            /* Where the kernel cannot, pages fault in one by one (said once). */
            m->red.populate_failed = 1;
            accel__log(&m->acc->log, ACCEL__LOG_DEBUG,
                       "gradient pages are not populated in advance (MADV_POPULATE_WRITE)");
        }
    }
}

/* Hybrid sharding at stages 2-3: after the group's reduce-scatter, the owned piece holds the
 * group's average; averaged across the replicas (the owners of the same piece in every group)
 * it is the average over all processes. Every process posts these in bucket order: on nccl
 * at the launch, on cross_stream (launch_bucket); on a host communicator once the
 * reduce-scatter completed, and staged the piece is then still in host memory (the
 * reduce-scatter's result) and its hook takes it back to the device. */
static accel_status post_cross(accel_model *m, accel__bucket *bk)
{
    size_t po, pc;
    accel__flat_piece(&m->flat, bk->index, m->rank, &po, &pc);
    float *piece = m->red.staged ? (float *)m->red.host_buf + po : m->grad + po;
    accel__coll op =
        ACCEL__COLL(ACCEL__COLL_ALLREDUCE, piece, piece, pc, ACCEL_F32, bucket_op(m), 0);
    if (m->red.staged) {
        op.post = bucket_post;
        op.hook_arg = bk;
    }
    bk->crossed = 1;
    accel__stream *on = m->red.on_device ? m->red.cross_stream : NULL;
    accel_status st = accel__comm_post(m->replica_comm, &op, on, &bk->xwork);
    if (st != ACCEL_OK) {
        bk->xwork = NULL;
        return accel__adopt_thread_error(m->acc, st);
    }
    return ACCEL_OK;
}

static accel_status launch_bucket(accel_model *m, int b)
{
    accel__reducer *r = &m->red;
    accel__bucket *bk = &r->buckets[b];
    populate(m, b + 1);
    if (bk->n_params == 0) {
        return ACCEL_OK; /* every parameter frozen: nothing to send */
    }
    for (int k = 0; k < bk->n_frozen; k++) {
        const accel__range *fr = &r->frozen[bk->frozen_first + k];
        accel_status st = accel__dev_zero(m->dev, accel__grad_span(m, fr->offset, fr->count), NULL);
        if (st != ACCEL_OK) {
            return accel__adopt_thread_error(m->acc, st);
        }
    }
    /* DDP's bf16 / fp16 compression is the all-reduce's wire dtype: the result is exactly
     * compress -> reduce in fp32 -> round -> decompress, in place on the (symmetric) gradient. */
    float *buf = r->staged ? (float *)r->host_buf + bk->offset : m->grad + bk->offset;
    accel__comm *comm = m->acc->comm;
    accel__coll op =
        ACCEL__COLL(ACCEL__COLL_ALLREDUCE, buf, buf, bk->count, ACCEL_F32, bucket_op(m), 0);
    op.wire = r->comm_dtype;
    if (scatters(m)) {
        /* ZeRO-2: the whole padded bucket reduce-scattered in place, so piece r (rank r's
         * part of its shard) receives the reduced values. The wire dtype exists for the
         * all-reduce only: compressed buckets keep the all-reduce (same values in the owned
         * piece, the rest unused). */
        const accel__flat_bucket *fb = &m->flat.buckets[b];
        size_t piece = fb->padded / (size_t)m->flat.n_ranks;
        float *full = r->staged ? (float *)r->host_buf + fb->offset : m->grad + fb->offset;
        op = ACCEL__COLL(ACCEL__COLL_REDUCE_SCATTER, full, full + (size_t)m->rank * piece, piece,
                         ACCEL_F32, bucket_op(m), 0);
        comm = accel__zero_comm(m); /* the shard group (hybrid sharding) */
    }
    bk->crossed = !crosses(m);
    if (r->staged) {
        op.pre = bucket_pre;
        op.post = crosses(m) ? NULL : bucket_post; /* else the cross-replica step's */
        op.hook_arg = bk;
    }
    bk->hook_st = ACCEL_OK;
    accel__stream *on = NULL;
    if (r->staged || r->on_device) {
        /* The bucket leaves after everything queued on the compute stream so far: staged, the
         * hooks' copies wait for the event; on the device, the collective's stream does. */
        accel_status st = accel__event_record(m->dev, bk->ready_ev, NULL);
        if (st == ACCEL_OK && r->on_device) {
            st = accel__stream_wait_event(m->dev, r->comm_stream, bk->ready_ev);
            on = r->comm_stream;
        }
        if (st != ACCEL_OK) {
            return accel__adopt_thread_error(m->acc, st);
        }
    }
    bk->launch_time = accel__now();
    bk->done_time = 0;
    accel_status st = accel__comm_post(comm, &op, on, &bk->work);
    if (st != ACCEL_OK) {
        bk->work = NULL;
        return accel__adopt_thread_error(m->acc, st);
    }
    if (r->on_device && crosses(m)) {
        /* On nccl the cross-replica step goes right behind the reduce-scatter, ordered on the
         * GPU: every process submits RS(b), X(b), RS(b + 1), ... in the same order (NCCL's
         * rule for several communicators), and on a stream of its own neither the compute
         * stream nor the next bucket's reduce-scatter waits for the replicas. */
        st = accel__event_record(m->dev, bk->cross_ev, r->comm_stream);
        if (st == ACCEL_OK) {
            st = accel__stream_wait_event(m->dev, r->cross_stream, bk->cross_ev);
        }
        if (st != ACCEL_OK) {
            return accel__adopt_thread_error(m->acc, st);
        }
        return post_cross(m, bk);
    }
    return ACCEL_OK;
}

/* The profiler span of a bucket seen complete (once). */
static void note_done(accel_model *m, accel__bucket *bk)
{
    if (bk->done_time == 0) {
        bk->done_time = accel__now();
        accel__prof_span(m->acc, scatters(m) ? "bucket reduce_scatter" : "bucket allreduce",
                         ACCEL__PROF_COMM, bk->launch_time, bk->done_time, "bucket", bk->index);
    }
}

/* ZeRO-2/3: once bucket b is reduced, the other processes' pieces of it read as zeros (what
 * they contribute to a later reduction: sync.c). On the host their pages are given back; in
 * device memory reduced by the communicator in place (on_device) they are zeroed on the
 * compute stream, after the collective completed (staging zeroes them in bucket_post). */
static accel_status release_unowned(accel_model *m, int b)
{
    const accel__flat_bucket *fb = &m->flat.buckets[b];
    size_t po, pc;
    accel__flat_piece(&m->flat, b, m->rank, &po, &pc);
    size_t end = fb->offset + fb->padded;
    if (m->grad_pages) {
        accel__pages_clear(m->grad + fb->offset, (po - fb->offset) * sizeof(float));
        accel__pages_clear(m->grad + po + pc, (end - po - pc) * sizeof(float));
        return ACCEL_OK;
    }
    accel_status st =
        accel__dev_zero(m->dev, accel__grad_span(m, fb->offset, po - fb->offset), NULL);
    if (st == ACCEL_OK) {
        st = accel__dev_zero(m->dev, accel__grad_span(m, po + pc, end - po - pc), NULL);
    }
    return st == ACCEL_OK ? st : accel__adopt_thread_error(m->acc, st);
}

/* Launches every consecutive ready bucket from next_launch on, then notes completions. */
static accel_status launch_ready(accel_model *m)
{
    accel__reducer *r = &m->red;
    while (r->next_launch < r->n_buckets && r->buckets[r->next_launch].pending == 0) {
        ACCEL_TRY(launch_bucket(m, r->next_launch));
        r->next_launch++;
    }
    for (int b = 0; b < r->next_launch; b++) {
        accel__bucket *bk = &r->buckets[b];
        accel_status wst = ACCEL_OK;
        if (bk->work == NULL || bk->done_time != 0) {
            continue;
        }
        if (!bk->crossed) {
            /* The cross-replica steps go out in bucket order; a failure is the wait's. */
            if (!accel_work_test(bk->work, &wst) || wst != ACCEL_OK) {
                break;
            }
            ACCEL_TRY(post_cross(m, bk));
        }
        if (accel_work_test(bk->xwork != NULL ? bk->xwork : bk->work, &wst)) {
            note_done(m, bk);
            if (wst == ACCEL_OK && m->grad_pages && r->zero_stage >= 2) {
                (void)release_unowned(m, b); /* early: a backward never holds all gradients */
            }
        }
    }
    return ACCEL_OK;
}

void accel__reducer_begin(accel_model *m)
{
    accel__reducer *r = &m->red;
    populate(m, 0);
    memset(r->ready, 0, (size_t)m->n_params);
    for (int b = 0; b < r->n_buckets; b++) {
        r->buckets[b].pending = r->buckets[b].n_params;
        r->buckets[b].launch_time = r->buckets[b].done_time = 0;
    }
    r->next_launch = 0;
}

accel_status accel__reducer_ready(accel_model *m, int index)
{
    accel__reducer *r = &m->red;
    const accel_param *p = &m->params[index];
    if (r->ready[index]) {
        return accel__seterr(m->acc, ACCEL_EINVAL,
                             "accel_grad_ready: parameter %d \"%s\" marked ready twice in one "
                             "backward",
                             index, p->name);
    }
    r->ready[index] = 1;
    if (p->frozen || !m->comm_now) {
        return ACCEL_OK;
    }
    accel__bucket *bk = &r->buckets[p->bucket];
    bk->pending--;
    if (bk->pending == 0 && m->acc->settings->train.overlap_comm != 0 && m->comm_err == ACCEL_OK) {
        accel_status st = launch_ready(m);
        if (st != ACCEL_OK) {
            m->comm_err = st; /* reported again by accel_backward_end */
        }
        return st;
    }
    return ACCEL_OK;
}

accel_status accel__reducer_finish(accel_model *m)
{
    accel__reducer *r = &m->red;
    accel_status st = m->comm_err;
    if (m->comm_now && st == ACCEL_OK) {
        for (int b = 0; b < r->n_buckets; b++) {
            r->buckets[b].pending = 0;
        }
        st = launch_ready(m);
    }
    accel__prof_begin(m->acc, "allreduce wait", ACCEL__PROF_COMM);
    accel_status wst = accel__reducer_wait(m);
    accel__prof_end(m->acc);
    memset(r->ready, 1, (size_t)m->n_params);
    return st != ACCEL_OK ? st : wst;
}

accel_status accel__reducer_wait(accel_model *m)
{
    accel__reducer *r = &m->red;
    accel_status first = ACCEL_OK;
    for (int b = 0; b < r->n_buckets; b++) {
        accel__bucket *bk = &r->buckets[b];
        if (bk->work == NULL) {
            continue;
        }
        accel_status st = accel_work_wait(bk->work);
        if (st == ACCEL_OK && !bk->crossed) {
            st = post_cross(m, bk);
        }
        if (bk->xwork != NULL) {
            accel_status xst = accel_work_wait(bk->xwork);
            st = st != ACCEL_OK ? st : xst;
            accel_work_free(bk->xwork);
            bk->xwork = NULL;
        }
        bk->crossed = 1;
        note_done(m, bk);
        accel_work_free(bk->work);
        bk->work = NULL;
        if (st == ACCEL_OK && (m->grad_pages || r->on_device) && r->zero_stage >= 2) {
            st = release_unowned(m, b);
        }
        if (st == ACCEL_OK && bk->hook_st != ACCEL_OK) {
            st = bk->hook_st;
            if (first == ACCEL_OK) { /* the message of the first failure stays */
                accel__seterr(m->acc, st, "gradient bucket %d: %s", b,
                              bk->hook_msg ? bk->hook_msg : accel_status_str(st));
            }
        }
        accel__free(bk->hook_msg);
        bk->hook_msg = NULL;
        bk->hook_st = ACCEL_OK;
        if (st != ACCEL_OK && first == ACCEL_OK) {
            first = st;
        }
    }
    return first;
}

accel_status accel__reducer_scale(accel_model *m, float factor)
{
    accel__reducer *r = &m->red;
    for (int b = 0; b < r->n_buckets; b++) {
        const accel__bucket *bk = &r->buckets[b];
        accel_status st =
            accel__dev_scale(m->dev, accel__grad_span(m, bk->offset, bk->count), factor, NULL);
        if (st != ACCEL_OK) {
            return accel__adopt_thread_error(m->acc, st);
        }
    }
    return ACCEL_OK;
}

accel_status accel__reducer_mirror(accel_model *m)
{
    accel__reducer *r = &m->red;
    ACCEL_TRY(accel__model_zero_grad(m));
    accel_status st = ACCEL_OK;
    for (int b = 0; b < r->n_buckets && st == ACCEL_OK; b++) {
        st = launch_bucket(m, b);
    }
    accel_status wst = accel__reducer_wait(m);
    return st != ACCEL_OK ? st : wst;
}
