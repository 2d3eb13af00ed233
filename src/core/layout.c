/*
 * Where this process stands in the job and how it reaches the others: the process layout read
 * from the launcher's environment (torchrun's, Open MPI's, MPICH's, MVAPICH's or Slurm's
 * variables), the machines, the backend choice, the rendezvous address, and the communicator
 * opened from them. Each value read is recorded with its source in core/settings.c. Invariant:
 * nothing here runs after accel_init, so no other module re-reads these variables.
 */
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "device/device.h"
#include "layout.h"
#include "settings.h"

/* One family of launcher variables: the first family whose world-size variable is set wins. */
static const char *const layout_sources[][4] = {
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
     "MV2_COMM_WORLD_LOCAL_SIZE"},
    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

/* Reads an int variable into *v; ENOTFOUND leaves *v as is. Range-checks against INT. */
static accel_status env_int_opt(const char *name, int *v, int *found)
{
    long long x;
    accel_status st = accel__env_int(name, &x);
    if (st == ACCEL_ENOTFOUND) {
        return ACCEL_OK;
    }
    ACCEL_TRY(st);
    if (x < 0 || x > 1 << 24) {
        return accel__seterr(NULL, ACCEL_EINVAL, "environment variable %s=%lld is out of range",
                             name, x);
    }
    *v = (int)x;
    if (found != NULL) {
        *found = 1;
    }
    return ACCEL_OK;
}

accel_status accel__layout_read(accel__layout *l)
{
    memset(l, 0, sizeof(*l));
    l->n_ranks = 1;
    l->local_n_ranks = 1;
    for (size_t i = 0; i < sizeof(layout_sources) / sizeof(layout_sources[0]); i++) {
        const char *const *src = layout_sources[i];
        int have_world = 0, have_rank = 0, have_local = 0, have_local_n = 0;
        int rank = 0, world = 1, local = 0, local_n = 0;
        ACCEL_TRY(env_int_opt(src[1], &world, &have_world));
        ACCEL_TRY(env_int_opt(src[0], &rank, &have_rank));
        ACCEL_TRY(env_int_opt(src[2], &local, &have_local));
        ACCEL_TRY(env_int_opt(src[3], &local_n, &have_local_n));
        if (!have_world && !have_rank && !have_local) {
            continue;
        }
        if (!have_world) {
            world = 1;
        }
        if (world < 1) {
            return accel__seterr(NULL, ACCEL_EINVAL, "environment variable %s=%d must be >= 1",
                                 src[1], world);
        }
        if (!have_rank && world > 1) {
            return accel__seterr(NULL, ACCEL_EINVAL, "%s=%d is set but %s is not", src[1], world,
                                 src[0]);
        }
        if (rank >= world) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "environment variable %s=%d is not below %s=%d", src[0], rank,
                                 src[1], world);
        }
        if (!have_local) {
            /* No local rank: assume one machine, as a plain multi-process start would be. */
            local = rank;
        }
        if (!have_local_n) {
            local_n = have_local ? world : world;
        }
        if (local_n < 1 || local_n > world) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "environment variable %s=%d must be between 1 and %s=%d", src[3],
                                 local_n, src[1], world);
        }
        if (local >= local_n) {
            return accel__seterr(NULL, ACCEL_EINVAL,
                                 "environment variable %s=%d is not below the local process "
                                 "count %d",
                                 src[2], local, local_n);
        }
        l->rank = rank;
        l->n_ranks = world;
        l->local_rank = local;
        l->local_n_ranks = local_n;
        l->launched = have_local || world > 1;
        l->by_mpi = i > 0;
        return ACCEL_OK;
    }
    return ACCEL_OK;
}

/* The layout's lines, each with the launcher variable it came from: the family accel__layout_read
 * took is the first with a world size, rank or local rank set. */
accel_status accel__layout_record(const accel__layout *l, accel__settings *set)
{
    const char *unused;
    int family = -1;
    for (size_t i = 0; family < 0 && i < sizeof(layout_sources) / sizeof(layout_sources[0]); i++) {
        for (int k = 0; k < 3 && family < 0; k++) {
            if (accel__env_string(layout_sources[i][k], &unused) == ACCEL_OK) {
                family = (int)i;
            }
        }
    }
    /* layout_sources rows are {rank, world, local rank, local world}. */
    const int values[4] = {l->rank, l->n_ranks, l->local_rank, l->local_n_ranks};
    static const char *const names[4] = {"process_index", "num_processes", "local_process_index",
                                         "local_num_processes"};
    for (int i = 0; i < 4; i++) {
        char value[16], src[ACCEL__SOURCE_NBYTES];
        snprintf(value, sizeof(value), "%d", values[i]);
        const char *var = family >= 0 ? layout_sources[family][i] : NULL;
        if (var != NULL && accel__env_string(var, &unused) == ACCEL_OK) {
            accel__settings_env_source(set, var, src, sizeof(src));
        } else {
            snprintf(src, sizeof(src), "%s",
                     family >= 0 ? "derived from the other variables" : "default (not launched)");
        }
        ACCEL_TRY(accel__settings_add(set, names[i], value, src));
    }
    return ACCEL_OK;
}

/* The machines of the job: accel launch's ACCEL_NUM_MACHINES and GROUP_RANK, else (mpirun,
 * Slurm, one machine) the layout's count of equal machines. */
accel_status accel__layout_machines(accel *acc)
{
    acc->n_machines =
        acc->n_ranks % acc->local_n_ranks == 0 ? acc->n_ranks / acc->local_n_ranks : 1;
    acc->machine_rank = acc->rank / acc->local_n_ranks;
    int found = 0;
    ACCEL_TRY(env_int_opt("ACCEL_NUM_MACHINES", &acc->n_machines, &found));
    ACCEL_TRY(env_int_opt("GROUP_RANK", &acc->machine_rank, NULL));
    if (found && (acc->n_machines < 1 || acc->machine_rank >= acc->n_machines)) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "environment variable GROUP_RANK=%d is not below "
                             "ACCEL_NUM_MACHINES=%d",
                             acc->machine_rank, acc->n_machines);
    }
    return ACCEL_OK;
}

/* Picks the backend: the option, else ACCEL_BACKEND, else from the layout and the device:
 * nccl when every process of the machine has a GPU of its own (NCCL refuses two ranks on one
 * GPU; processes sharing one stage through a host backend) and the store can be reached. */
static accel_status choose_backend(const accel *acc, const accel_options *o, const accel__layout *l,
                                   char *out, size_t out_nbytes)
{
    const char *b = o->backend;
    if (b == NULL) {
        accel_status st = accel__env_string("ACCEL_BACKEND", &b);
        if (st == ACCEL_ENOTFOUND) {
            b = NULL;
        }
    }
    if (b == NULL) {
        const accel__comm_backend *mpi = accel__comm_backend_find("mpi");
        const accel__comm_backend *nccl = accel__comm_backend_find("nccl");
        if (l->n_ranks == 1) {
            b = "self";
        } else if (acc->device.type == ACCEL_DEVICE_CUDA && nccl != NULL && nccl->built &&
                   l->local_n_ranks <= acc->n_gpus && !l->by_mpi) {
            b = "nccl";
        } else if (l->by_mpi && mpi != NULL && mpi->built) {
            b = "mpi"; /* mpirun / srun wired the processes together: MPI knows the job */
        } else if (l->local_n_ranks == l->n_ranks) {
            b = "shm";
        } else if (!l->by_mpi) {
            /* Several machines under accel launch (torchrun's variables): shm inside each and
             * gloo across when a machine has several processes, else gloo alone. */
            b = l->local_n_ranks > 1 ? "hier" : "gloo";
        } else {
            b = "mpi";
        }
    }
    if (strlen(b) >= out_nbytes) {
        return accel__seterr(NULL, ACCEL_EINVAL, "backend name \"%s\" is too long", b);
    }
    strcpy(out, b);
    return ACCEL_OK;
}

/* comm's view of a stream of the process's device (cfg.stream_native). */
static void *native_stream(void *dev, accel__stream *s)
{
    return accel__stream_native(dev, s);
}

/* The backend and the rendezvous address, with where choose_backend / read_rendezvous took
 * them from. */
static accel_status record_comm(accel__settings *set, const accel_options *o, const char *backend,
                                const char *addr, int port_number)
{
    char src[ACCEL__SOURCE_NBYTES], port[16];
    const char *unused;
    if (o->backend != NULL) {
        snprintf(src, sizeof(src), "argument");
    } else if (accel__env_string("ACCEL_BACKEND", &unused) == ACCEL_OK) {
        accel__settings_env_source(set, "ACCEL_BACKEND", src, sizeof(src));
    } else {
        snprintf(src, sizeof(src), "default (from the process layout)");
    }
    ACCEL_TRY(accel__settings_add(set, "backend", backend, src));
    static const char *const vars[2] = {"MASTER_ADDR", "MASTER_PORT"};
    static const char *const names[2] = {"main_process_ip", "main_process_port"};
    snprintf(port, sizeof(port), "%d", port_number);
    const char *values[2] = {addr, port};
    for (int i = 0; i < 2; i++) {
        if (accel__env_string(vars[i], &unused) == ACCEL_OK) {
            accel__settings_env_source(set, vars[i], src, sizeof(src));
        } else {
            snprintf(src, sizeof(src), "default");
        }
        ACCEL_TRY(accel__settings_add(set, names[i], values[i], src));
    }
    return ACCEL_OK;
}

/* Where the job's processes meet: ACCEL_JOB_ID (accel launch sets a random one), else the
 * store at MASTER_ADDR:MASTER_PORT (the backend agrees on a nonce there). */
typedef struct rendezvous {
    const char *job_id; /* NULL when unset */
    const char *addr;
    int port;
    const char *ifname; /* ACCEL_SOCKET_IFNAME, else GLOO_SOCKET_IFNAME; NULL: the route's */
    const char *gloo_ring; /* ACCEL_GLOO_RING (the gloo backend checks it); NULL: auto */
    int store_served;   /* ACCEL_STORE_SERVED: the launcher serves the store */
    int restart_count;  /* ACCEL_RESTART_COUNT */
} rendezvous;

static accel_status read_rendezvous(rendezvous *r)
{
    r->job_id = NULL;
    r->addr = "127.0.0.1";
    long long port = 29500;
    if (accel__env_string("ACCEL_JOB_ID", &r->job_id) != ACCEL_OK) {
        r->job_id = NULL;
    }
    if (accel__env_string("MASTER_ADDR", &r->addr) != ACCEL_OK) {
        r->addr = "127.0.0.1";
    }
    accel_status st = accel__env_int("MASTER_PORT", &port);
    if (st != ACCEL_OK && st != ACCEL_ENOTFOUND) {
        return st;
    }
    if (port < 0 || port > 65535) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "environment variable MASTER_PORT=%lld is not a port (0..65535)",
                             port);
    }
    r->port = (int)port;
    if (accel__env_string("ACCEL_SOCKET_IFNAME", &r->ifname) != ACCEL_OK &&
        accel__env_string("GLOO_SOCKET_IFNAME", &r->ifname) != ACCEL_OK) {
        r->ifname = NULL;
    }
    if (accel__env_string("ACCEL_GLOO_RING", &r->gloo_ring) != ACCEL_OK) {
        r->gloo_ring = NULL;
    }
    r->store_served = 0;
    st = accel__env_bool("ACCEL_STORE_SERVED", &r->store_served);
    if (st != ACCEL_OK && st != ACCEL_ENOTFOUND) {
        return st;
    }
    long long restarts = 0;
    st = accel__env_int("ACCEL_RESTART_COUNT", &restarts);
    if (st != ACCEL_OK && st != ACCEL_ENOTFOUND) {
        return st;
    }
    r->restart_count = (int)restarts;
    return ACCEL_OK;
}

accel_status accel__layout_comm_open(accel *acc, const accel_options *o, const accel__layout *l,
                                     accel__settings *set)
{
    rendezvous rdv;
    ACCEL_TRY(choose_backend(acc, o, l, acc->backend, sizeof(acc->backend)));
    ACCEL_TRY(read_rendezvous(&rdv));
    ACCEL_TRY(record_comm(set, o, acc->backend, rdv.addr, rdv.port));
    accel__comm_config cfg = {
        .backend = acc->backend,
        .rank = l->rank,
        .n_ranks = l->n_ranks,
        .local_rank = l->local_rank,
        .local_n_ranks = l->local_n_ranks,
        .job_id = rdv.job_id,
        .master_addr = rdv.addr,
        .master_port = rdv.port,
        .socket_ifname = rdv.ifname,
        .gloo_ring = rdv.gloo_ring,
        .store_served = rdv.store_served,
        .restart_count = rdv.restart_count,
        .timeout_s = o->timeout_s,
        .debug = 0, /* on after the settings agreement (accel.c): it is one of them */
        .log = acc->log,
        .trace = acc->trace,
    };
    if (acc->device.type == ACCEL_DEVICE_CUDA) {
        cfg.stream_native = native_stream;
        cfg.stream_arg = acc->dev;
        cfg.device_ordinal = acc->device.index;
    }
    if (strcmp(acc->backend, "nccl") == 0 && acc->device.type == ACCEL_DEVICE_CUDA &&
        l->local_n_ranks > acc->n_gpus) {
        return accel__seterr(NULL, ACCEL_EINVAL,
                             "backend nccl needs a GPU per process, and %d processes share %d "
                             "GPU%s on this machine (NCCL refuses two ranks on one GPU): use "
                             "backend shm, which stages gradients through host memory",
                             l->local_n_ranks, acc->n_gpus, acc->n_gpus == 1 ? "" : "s");
    }
    return accel__comm_new(&acc->comm, &cfg);
}
