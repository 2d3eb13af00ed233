/*
 * The communicator config that the comm tests (test_comm_backends.c, test_comm_v2.c) build for
 * themselves from the launcher's environment, as accel_init would: the layout from accel
 * launch's RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE or, under mpirun, Open MPI's
 * variables; the rendezvous from ACCEL_JOB_ID, MASTER_ADDR, MASTER_PORT, ACCEL_STORE_SERVED and
 * ACCEL_RESTART_COUNT; gloo's interface from ACCEL_SOCKET_IFNAME, else GLOO_SOCKET_IFNAME;
 * debug mode from ACCELERATE_DEBUG_MODE (1 or 0); a 60 s timeout; logging at ACCEL_LOG_LEVEL
 * (warn when unset; tests/comm/test_gloo_netns.sh reads gloo's info line).
 */
#ifndef ACCEL_TEST_COMM_ENV_H
#define ACCEL_TEST_COMM_ENV_H

#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v != NULL && *v != '\0' ? atoi(v) : dflt;
}

/* Under mpirun the layout comes in Open MPI's variables (accel launch sets RANK, ...). */
static int under_mpirun(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") != NULL && getenv("WORLD_SIZE") == NULL;
}

static int layout(const char *name, const char *ompi, int dflt)
{
    return env_int(under_mpirun() ? ompi : name, dflt);
}

/* backend (borrowed) on the environment's layout and rendezvous. */
static accel__comm_config comm_env_config(const char *backend)
{
    accel__comm_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.backend = backend;
    cfg.rank = layout("RANK", "OMPI_COMM_WORLD_RANK", 0);
    cfg.n_ranks = layout("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", 1);
    cfg.local_rank = layout("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", 0);
    cfg.local_n_ranks = layout("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", 1);
    cfg.job_id = getenv("ACCEL_JOB_ID");
    cfg.master_addr = getenv("MASTER_ADDR");
    if (accel__env_string("ACCEL_SOCKET_IFNAME", &cfg.socket_ifname) != ACCEL_OK &&
        accel__env_string("GLOO_SOCKET_IFNAME", &cfg.socket_ifname) != ACCEL_OK) {
        cfg.socket_ifname = NULL; /* empty is unset, as for accel_init (src/core/layout.c) */
    }
    cfg.gloo_ring = getenv("ACCEL_GLOO_RING");
    cfg.master_port = env_int("MASTER_PORT", 29500);
    cfg.store_served = env_int("ACCEL_STORE_SERVED", 0); /* a multi-machine accel launch */
    cfg.restart_count = env_int("ACCEL_RESTART_COUNT", 0);
    cfg.debug = env_int("ACCELERATE_DEBUG_MODE", 0) != 0;
    cfg.timeout_s = 60;
    cfg.log.rank = cfg.rank;
    cfg.log.n_ranks = cfg.n_ranks;
    cfg.log.level = accel__log_default()->level;
    return cfg;
}

#endif
