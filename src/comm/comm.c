/*
 * Communicator front end: validation and backend dispatch. (Minimal: operations run
 * synchronously; the progress thread for async work is the comm module's next step.)
 */
#include <string.h>

#include "comm.h"
#include "core/internal.h"

extern const accel__comm_backend accel__backend_self;

struct accel__comm {
    const accel__comm_backend *be;
    void *impl;
    accel__comm_config cfg;
};

struct accel_work {
    accel_status st;
};

accel_status accel__comm_new(accel__comm **out, const accel__comm_config *cfg)
{
    const accel__comm_backend *be = NULL;
    if (strcmp(cfg->backend, "self") == 0) {
        be = &accel__backend_self;
    } else {
        return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "backend \"%s\" is not built in",
                             cfg->backend);
    }
    accel__comm *c = accel__calloc(1, sizeof(*c));
    if (c == NULL) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory creating the communicator");
    }
    c->be = be;
    c->cfg = *cfg;
    c->cfg.job_id = NULL;
    accel_status st = be->init(c, &c->impl);
    if (st != ACCEL_OK) {
        accel__free(c);
        return st;
    }
    *out = c;
    return ACCEL_OK;
}

void accel__comm_free(accel__comm *c)
{
    if (c == NULL) {
        return;
    }
    c->be->destroy(c, c->impl);
    accel__free(c);
}

int accel__comm_rank(const accel__comm *c)
{
    return c->cfg.rank;
}
int accel__comm_n_ranks(const accel__comm *c)
{
    return c->cfg.n_ranks;
}
const char *accel__comm_backend_name(const accel__comm *c)
{
    return c->be->name;
}
double accel__comm_timeout(const accel__comm *c)
{
    return c->cfg.timeout_s;
}

accel_status accel__comm_run(accel__comm *c, const accel__coll *op, accel_work **work)
{
    accel_status st = c->be->run(c, c->impl, op);
    if (work != NULL) {
        accel_work *w = accel__calloc(1, sizeof(*w));
        if (w == NULL) {
            return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
        }
        w->st = st;
        *work = w;
    }
    return st;
}

accel_status accel__allreduce(accel__comm *c, const void *send, void *recv, size_t count,
                              accel_dtype dt, accel_reduce_op op)
{
    accel__coll o = {ACCEL__COLL_ALLREDUCE, send, recv, count, dt, op, 0};
    return accel__comm_run(c, &o, NULL);
}

accel_status accel__broadcast(accel__comm *c, void *buf, size_t count, accel_dtype dt, int root)
{
    accel__coll o = {ACCEL__COLL_BROADCAST, buf, buf, count, dt, ACCEL_SUM, root};
    return accel__comm_run(c, &o, NULL);
}

accel_status accel__barrier(accel__comm *c)
{
    accel__coll o = {ACCEL__COLL_BARRIER, NULL, NULL, 0, ACCEL_U8, ACCEL_SUM, 0};
    return accel__comm_run(c, &o, NULL);
}
