/*
 * The mpi backend's call check: that every member of a communicator makes the same collective
 * call. Always on, and free: every message of a collective carries a fingerprint of the call's
 * declaration in its MPI tag (mpi_impl.h), so a message only ever matches a receive of a call
 * declared the same way, and a mismatched call waits until the deadline instead of taking
 * another call's data; a timeout then says when a peer has sent a message of another call.
 * Two calls whose fingerprints collide do meet; every receive then checks that its message is
 * the bytes it expects (accel__mpi_check_sizes), which tells them apart unless their messages
 * are the same size.
 * In debug mode (ACCELERATE_DEBUG_MODE) every call first exchanges its whole declaration, so a
 * mismatch is ACCEL_EINVAL on every member naming both calls, as gloo's envelopes give.
 */
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "mpi_impl.h"

accel_status accel__mpi_check_setup(accel__mpi *m)
{
    int *ub = NULL, found = 0;
    /* Asked of MPI_COMM_WORLD: the bound is the implementation's, the same on every
     * communicator, and Open MPI attaches it to the world and its copies but not to
     * MPI_Comm_split's communicators. */
    accel__mpi_lock();
    int rc = MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
    accel__mpi_unlock();
    /* The standard promises tags up to 32767 at least (Open MPI: 2^31 - 1). */
    long long top = rc == MPI_SUCCESS && found && ub != NULL ? *ub : 32767;
    m->tag_bits = 0;
    while (m->tag_bits < 31 && ((1ll << (m->tag_bits + 1)) - 1) <= top) {
        m->tag_bits++;
    }
    if (m->tag_bits < ACCEL__MPI_MSG_BITS + ACCEL__MPI_KIND_BITS + 8) {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED,
                             "mpi: MPI_TAG_UB is %lld, below the 32767 the MPI standard promises",
                             top);
    }
    m->decls = accel__calloc((size_t)m->n_ranks, sizeof(*m->decls));
    return m->decls != NULL ? ACCEL_OK : accel__seterr(NULL, ACCEL_ENOMEM, "mpi: out of memory");
}

uint64_t (*accel__mpi_fingerprint_hook)(const accel__coll_decl *d, uint64_t fp);

/* splitmix64's finaliser: every input bit moves about half the output bits. */
static uint64_t mix(uint64_t h)
{
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

void accel__mpi_fingerprint(accel__mpi *m, const accel__coll *op)
{
    const accel__coll_decl d = accel__coll_declare(op);
    const int low = ACCEL__MPI_MSG_BITS + ACCEL__MPI_KIND_BITS, bits = m->tag_bits - low;
    const uint64_t mask = ((uint64_t)1 << bits) - 1;
    const uint64_t small = (uint64_t)(uint8_t)d.dtype | (uint64_t)(uint8_t)d.op << 8 |
                           (uint64_t)(uint8_t)d.wire << 16 | (uint64_t)(uint32_t)d.root << 24;
    /* A hash of everything but the count's low `bits` bits, plus those bits: two calls that
     * differ only there (the commonest slip, another tensor's size; with Open MPI's 25 bits,
     * any two counts below 2^25 elements) never share a fingerprint, and any other difference
     * shares one with probability 2^-bits. */
    const uint64_t h = mix(small ^ mix((d.count >> bits) ^ mix(d.total + 0x9e3779b97f4a7c15ull)));
    uint64_t fp = ((h >> (64 - bits)) + d.count) & mask;
    if (accel__mpi_fingerprint_hook != NULL) {
        fp = accel__mpi_fingerprint_hook(&d, fp) & mask;
    }
    /* The kind stays readable for the timeout's hint; calls of different kinds never share a
     * tag, whatever the hash. */
    m->call_tag = (int)(fp << low | (uint64_t)d.kind << ACCEL__MPI_MSG_BITS);
}

accel_status accel__mpi_check_call(accel__mpi *m, const accel__coll_decl *d)
{
    const int n = m->n_ranks, me = m->rank;
    m->decls[me] = *d;
    /* One round: every declaration to every member (tag 0 whatever the call: the point is to
     * meet when the calls differ). Messages between two members keep their order, so the k-th
     * declaration received from a peer is its k-th call's. */
    int k = 0, rc = MPI_SUCCESS;
    accel__mpi_lock();
    for (int i = 1; i < n && rc == MPI_SUCCESS; i++) {
        const int q = (me + n - i) % n;
        rc = accel__mpi_irecv(m, &m->decls[q], (int)sizeof(*d), MPI_BYTE, 1, q,
                              ACCEL__MPI_MSG_DECLARE, &m->reqs[k], &m->req_rx[k]);
        k++;
    }
    for (int i = 1; i < n && rc == MPI_SUCCESS; i++) {
        const int q = (me + i) % n;
        m->req_rx[k].peer = -1;
        rc = MPI_Isend(&m->decls[me], (int)sizeof(*d), MPI_BYTE, q, ACCEL__MPI_MSG_DECLARE, m->comm,
                       &m->reqs[k++]);
    }
    accel__mpi_unlock();
    accel_status st = accel__mpi_waitall(m, k, m->reqs, m->req_rx, "declaration exchange");
    ACCEL_TRY(rc != MPI_SUCCESS ? accel__mpi_fail(m, rc, "declaration exchange") : st);
    /* Every member holds the same table: each names the same two calls. */
    for (int q = 1; q < n; q++) {
        if (memcmp(&m->decls[q], &m->decls[0], sizeof(*d)) == 0) {
            continue;
        }
        char msg[sizeof(m->broken_msg)];
        if (accel__coll_decl_mismatch("mpi", &m->decls[0], 0, &m->decls[q], q, n, msg,
                                      sizeof(msg))) {
            return accel__seterr(NULL, ACCEL_EINVAL, "%s", msg); /* the communicator stays usable */
        }
        m->broken = ACCEL_EINVAL;
        snprintf(m->broken_msg, sizeof(m->broken_msg), "%s", msg);
        return accel__seterr(NULL, ACCEL_EINVAL, "%s", m->broken_msg);
    }
    return ACCEL_OK;
}

int accel__mpi_check_sizes(accel__mpi *m, int n, const accel__mpi_rx *rx, int rc, char *buf,
                           size_t nbytes)
{
    for (int k = 0; k < n; k++) {
        const MPI_Status *s = &m->statuses[k];
        int cls = MPI_SUCCESS;
        if (rx[k].peer < 0) {
            continue;
        }
        /* MPI_ERR_IN_STATUS: each status has its request's error (MPI_SUCCESS or another). */
        if (rc == MPI_ERR_IN_STATUS && MPI_Error_class(s->MPI_ERROR, &cls) != MPI_SUCCESS) {
            continue;
        }
        if (rc == MPI_ERR_IN_STATUS && cls != MPI_SUCCESS && cls != MPI_ERR_TRUNCATE) {
            continue; /* another error: MPI's own text says it */
        }
        /* An empty status: a request completed by an earlier wait (MPI_REQUEST_NULL now: the
         * pipelined path's last wait covers every request of a segment) or never posted. */
        if (s->MPI_SOURCE == MPI_ANY_SOURCE) {
            continue;
        }
        MPI_Count got = 0;
        if (MPI_Get_elements_x(s, MPI_BYTE, &got) != MPI_SUCCESS || got == MPI_UNDEFINED) {
            got = -1;
        }
        if (cls != MPI_ERR_TRUNCATE && got == rx[k].nbytes) {
            continue;
        }
        /* Open MPI's truncated status holds the bytes sent; the standard does not promise it. */
        if (cls == MPI_ERR_TRUNCATE && got <= rx[k].nbytes) {
            snprintf(buf, nbytes,
                     "process %d sent more than %lld bytes where this call expects %lld",
                     rx[k].peer, (long long)rx[k].nbytes, (long long)rx[k].nbytes);
        } else {
            snprintf(buf, nbytes, "process %d sent %lld bytes where this call expects %lld",
                     rx[k].peer, (long long)got, (long long)rx[k].nbytes);
        }
        return 1;
    }
    return 0;
}

void accel__mpi_foreign_hint(accel__mpi *m, char *buf, size_t nbytes)
{
    const int msg_mask = (1 << ACCEL__MPI_MSG_BITS) - 1,
              kind_mask = (1 << ACCEL__MPI_KIND_BITS) - 1;
    buf[0] = '\0';
    for (int i = 1; i < m->n_ranks; i++) {
        const int q = (m->rank + i) % m->n_ranks;
        int flag = 0;
        MPI_Status s;
        /* The first message from q that no receive took: this call's own would have matched
         * one (every receive of a step is posted before its wait). */
        if (MPI_Iprobe(q, MPI_ANY_TAG, m->comm, &flag, &s) != MPI_SUCCESS || !flag) {
            continue;
        }
        const int tag = s.MPI_TAG, kind = tag >> ACCEL__MPI_MSG_BITS & kind_mask;
        char other[128];
        if ((tag & msg_mask) == ACCEL__MPI_MSG_DECLARE) {
            snprintf(other, sizeof(other), "%s",
                     m->debug ? "its next call's declaration"
                              : "a declaration: debug mode is on there, not here");
        } else if ((tag & ~msg_mask) == m->call_tag) {
            continue; /* this call's: not yet received, not foreign */
        } else if (kind != (m->call_tag >> ACCEL__MPI_MSG_BITS & kind_mask)) {
            snprintf(other, sizeof(other), "%s", accel__coll_name((accel__coll_kind)kind));
        } else {
            snprintf(other, sizeof(other), "%s with another count, dtype, op, root or wire",
                     accel__coll_name((accel__coll_kind)kind));
        }
        /* A hint, not proof: a peer that finished this call may have sent its next one's. */
        snprintf(buf, nbytes,
                 "; process %d sent a message of another call (%s): it is at another "
                 "collective (a mismatch: ACCELERATE_DEBUG_MODE=1 names both calls) or already "
                 "past this one",
                 q, other);
        return;
    }
}
