/*
 * Symmetric shared allocations of the shm backend (accel_alloc_shared): every rank creates one
 * segment of the requested size, every rank maps every peer's, and the names are unlinked before
 * the call returns, so a SIGKILL after it leaves nothing in /dev/shm (before it, the launcher
 * sweeps the job prefix). Collectives on buffers inside such an allocation read peers' data in
 * place (shm_coll.c). The names carry the job segment's random secret, which only processes that
 * could open the job's (private) segment know: nobody else can create them in advance, and a
 * peer's segment is mapped only after fstat shows it is this user's and private.
 *
 * Invariant: allocation ids are assigned in call order, so the id-th allocation has the same id
 * on every rank; the registry is only touched while the communicator is idle (comm.c).
 * Handshake: each rank publishes (id, nbytes, creation status), sync, checks everyone's, maps
 * the peers' segments, publishes the mapping status, sync, unlinks its name, checks, sync. Every
 * rank takes the same branch after each sync (it only depends on the published words), so sync
 * counts stay aligned whatever fails.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "shm.h"

static void seg_name(const accel__shm *s, uint64_t id, int rank, char *out, size_t n)
{
    snprintf(out, n, "%s-%016llx-sym%llu-r%d", s->name, (unsigned long long)s->hdr->secret,
             (unsigned long long)id, rank);
}

static void sym_release(accel__shm *s, accel__shm_sym *a)
{
    if (a == NULL) {
        return;
    }
    if (a->base != NULL) {
        for (int q = 0; q < s->n_ranks; q++) {
            if (a->base[q] != NULL) {
                munmap(a->base[q], a->map_nbytes);
            }
        }
    }
    accel__free(a->base);
    accel__free(a);
}

/* This rank's segment: created, sized (pages reserved now, not at first touch) and mapped. */
static accel_status create_own(accel__shm *s, accel__shm_sym *a, const char *name)
{
    /* The name is unguessable, so an existing one is a bug or an attack: never reuse it. */
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        return accel__seterr(NULL, ACCEL_EIO, "accel_alloc_shared: cannot create segment %s: %s",
                             name, strerror(errno));
    }
    int err = fchmod(fd, 0600) != 0 ? errno : posix_fallocate(fd, 0, (off_t)a->map_nbytes);
    if (err != 0) {
        close(fd);
        shm_unlink(name);
        return accel__seterr(NULL, ACCEL_ENOMEM,
                             "accel_alloc_shared: process %d cannot reserve %zu bytes in "
                             "/dev/shm for %s: %s",
                             s->rank, a->map_nbytes, name, strerror(err));
    }
    void *p = mmap(NULL, a->map_nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(name);
        return accel__seterr(NULL, ACCEL_ENOMEM,
                             "accel_alloc_shared: cannot map %s (%zu bytes): %s", name,
                             a->map_nbytes, strerror(errno));
    }
    a->base[s->rank] = p;
    return ACCEL_OK;
}

static accel_status map_peer(accel__shm *s, accel__shm_sym *a, int q)
{
    char name[256];
    seg_name(s, a->id, q, name, sizeof(name));
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        return accel__seterr(NULL, ACCEL_EIO,
                             "accel_alloc_shared: process %d cannot open process %d's segment "
                             "%s: %s",
                             s->rank, q, name, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 07777) != 0600 || (size_t)st.st_size != a->map_nbytes) {
        close(fd);
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "accel_alloc_shared: process %d's segment %s is not this user's "
                             "private segment of %zu bytes: refusing it",
                             q, name, a->map_nbytes);
    }
    void *p = mmap(NULL, a->map_nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel_alloc_shared: cannot map %s: %s", name,
                             strerror(errno));
    }
    a->base[q] = p;
    return ACCEL_OK;
}

/* After a sync: ACCEL_OK when every rank published this allocation with phase `phase` ok. A
 * rank at another allocation id is at a different call: the job is aborted (EINVAL). */
static accel_status check_peers(accel__shm *s, const accel__shm_sym *a, int phase)
{
    for (int q = 0; q < s->n_ranks; q++) {
        uint64_t seq, nbytes;
        int status[2];
        accel__shm_get_alloc(s, q, &seq, &nbytes, status);
        if (seq != a->id) {
            accel__shm_abort(s, ACCEL__SHM_OTHER_CALL, q, 0);
            return accel__shm_check_abort(s);
        }
        if (nbytes != a->nbytes) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "accel_alloc_shared: process %d asked for %llu bytes, process "
                                 "%d for %zu (every process must pass the same size)",
                                 q, (unsigned long long)nbytes, s->rank, a->nbytes);
        }
        if (status[phase] != 0) {
            if (q == s->rank) {
                return (accel_status)status[phase]; /* the message is already set */
            }
            return accel__seterr(NULL, (accel_status)status[phase],
                                 "accel_alloc_shared: process %d failed to %s its segment (%s)", q,
                                 phase == 0 ? "create" : "map a peer's",
                                 accel_status_name((accel_status)status[phase]));
        }
    }
    return ACCEL_OK;
}

accel_status accel__shm_alloc(accel__shm *s, size_t nbytes, void **out)
{
    s->what = "accel_alloc_shared";
    ACCEL_TRY(accel__shm_check_abort(s));
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (nbytes > SIZE_MAX - page) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_alloc_shared: %zu bytes is too large",
                             nbytes);
    }
    accel__shm_sym *a = accel__calloc(1, sizeof(*a));
    char **base = accel__calloc((size_t)s->n_ranks, sizeof(*base));
    if (a == NULL || base == NULL) {
        accel__free(a);
        accel__free(base);
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel_alloc_shared: out of memory");
    }
    a->base = base;
    a->id = ++s->n_allocs;
    a->nbytes = nbytes;
    a->map_nbytes = nbytes == 0 ? page : (nbytes + page - 1) / page * page;
    char name[256];
    seg_name(s, a->id, s->rank, name, sizeof(name));

    accel_status own = create_own(s, a, name);
    accel__shm_put_alloc(s, a->id, nbytes, 0, own);
    accel__shm_put_alloc(s, a->id, nbytes, 1, 0);
    /* Sizes may differ (checked below, without breaking the communicator): not declared. */
    accel__shm_begin_call(s, ACCEL__SHM_CALL_ALLOC, 0, 0, 0, 0, 0);
    accel_status st = accel__shm_sync(s);
    if (st != ACCEL_OK || (st = check_peers(s, a, 0)) != ACCEL_OK) {
        if (own == ACCEL_OK) {
            shm_unlink(name);
        }
        if (!accel__shm_aborted(s)) {
            /* Every rank is here (they all saw the same words): once this sync passes, every
             * name is gone and the words may be reused. */
            accel_status st2 = accel__shm_sync(s);
            st = st2 != ACCEL_OK ? st2 : st;
        }
        sym_release(s, a);
        return st;
    }
    accel_status mapped = ACCEL_OK;
    for (int q = 0; q < s->n_ranks && mapped == ACCEL_OK; q++) {
        if (q != s->rank) {
            mapped = map_peer(s, a, q);
        }
    }
    accel__shm_put_alloc(s, a->id, nbytes, 1, mapped);
    st = accel__shm_sync(s);
    shm_unlink(name); /* everyone has mapped it (or failed to) */
    if (st == ACCEL_OK) {
        st = check_peers(s, a, 1);
        /* A third sync: no rank may start another allocation (rewriting its words) before
         * everyone has read them, and no name may outlive the call. */
        accel_status st2 = accel__shm_sync(s);
        st = st != ACCEL_OK ? st : st2;
    }
    if (st != ACCEL_OK) {
        sym_release(s, a);
        return st;
    }
    a->next = s->syms;
    s->syms = a;
    *out = a->base[s->rank];
    return ACCEL_OK;
}

accel_status accel__shm_free(accel__shm *s, void *p)
{
    for (accel__shm_sym **link = &s->syms; *link != NULL; link = &(*link)->next) {
        accel__shm_sym *a = *link;
        if (a->base[s->rank] == p) {
            *link = a->next;
            sym_release(s, a);
            return ACCEL_OK;
        }
    }
    return accel__seterr(NULL, ACCEL_EINVAL,
                         "accel_free_shared: %p was not returned by accel_alloc_shared (or was "
                         "freed already)",
                         p);
}

void accel__shm_free_all(accel__shm *s)
{
    while (s->syms != NULL) {
        accel__shm_sym *a = s->syms;
        s->syms = a->next;
        sym_release(s, a);
    }
}

accel__shm_sym *accel__shm_sym_find(const accel__shm *s, const void *p, size_t nbytes, size_t *off)
{
    uintptr_t x = (uintptr_t)p;
    for (accel__shm_sym *a = s->syms; a != NULL; a = a->next) {
        uintptr_t b = (uintptr_t)a->base[s->rank];
        if (x >= b && x - b <= a->nbytes && nbytes <= a->nbytes - (x - b)) {
            *off = x - b;
            return a;
        }
    }
    return NULL;
}
