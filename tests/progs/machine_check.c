/*
 * Helper of the multi-machine launcher tests: checks the layout `accel launch --num_machines M`
 * gave this process (RANK = GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK, WORLD_SIZE =
 * ACCEL_NUM_MACHINES * LOCAL_WORLD_SIZE, ACCEL_STORE_SERVED=1) and prints "JOB=<id>" for the
 * script to compare across machines; then checks that accel_state_summary names the machines,
 * and runs collectives with the default backend: an
 * all-reduce of rank + 1, a broadcast from the last rank, an all-gather of the ranks and a
 * barrier, each checked. When the build has no backend across machines yet, accel_init's
 * refusal is printed as "NO-CROSS-MACHINE-BACKEND: <message>" and the program exits 0, so the
 * script can report it instead of faking the collectives. Exits 1 on any wrong value.
 *   machine_check
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"

static int env_int(const char *name)
{
    const char *v = getenv(name);
    if (v == NULL) {
        fprintf(stderr, "machine_check: %s is not set\n", name);
        exit(1);
    }
    return atoi(v);
}

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "machine_check: rank %d: ", rank);                                     \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(void)
{
    const int rank = env_int("RANK"), world = env_int("WORLD_SIZE");
    const int local = env_int("LOCAL_RANK"), local_n = env_int("LOCAL_WORLD_SIZE");
    const int machine = env_int("GROUP_RANK"), machines = env_int("ACCEL_NUM_MACHINES");
    EXPECT(rank == machine * local_n + local, "RANK %d != GROUP_RANK %d * %d + LOCAL_RANK %d", rank,
           machine, local_n, local);
    EXPECT(world == machines * local_n, "WORLD_SIZE %d != %d machines * %d", world, machines,
           local_n);
    EXPECT(env_int("ACCEL_STORE_SERVED") == 1, "ACCEL_STORE_SERVED is not 1");
    printf("JOB=%s MASTER=%s:%s\n", getenv("ACCEL_JOB_ID") ? getenv("ACCEL_JOB_ID") : "-",
           getenv("MASTER_ADDR"), getenv("MASTER_PORT"));
    fflush(stdout);

    accel *acc;
    accel_status st = accel_init(&acc, NULL);
    if (st == ACCEL_EUNSUPPORTED || st == ACCEL_EINVAL) {
        printf("NO-CROSS-MACHINE-BACKEND: %s: %s\n", accel_status_name(st), accel_last_error(NULL));
        return 0;
    }
    EXPECT(st == ACCEL_OK, "accel_init: %s: %s", accel_status_name(st), accel_last_error(NULL));
    EXPECT(accel_process_index(acc) == rank && accel_num_processes(acc) == world,
           "accel sees rank %d of %d", accel_process_index(acc), accel_num_processes(acc));
    char where[128];
    snprintf(where, sizeof(where), "\nNum machines: %d\nMachine index: %d\nComm: ", machines,
             machine);
    EXPECT(strstr(accel_state_summary(acc), where) != NULL, "accel_state_summary lacks '%s':\n%s",
           where, accel_state_summary(acc));

    double sum = rank + 1;
    st = accel_allreduce(acc, &sum, &sum, 1, ACCEL_F64, ACCEL_SUM, NULL);
    EXPECT(st == ACCEL_OK && sum == world * (world + 1) / 2.0, "allreduce: %s, %g",
           accel_status_name(st), sum);
    int from_last = rank == world - 1 ? 4242 : -1;
    st = accel_broadcast(acc, &from_last, &from_last, 1, ACCEL_I32, world - 1, NULL);
    EXPECT(st == ACCEL_OK && from_last == 4242, "broadcast: %s, %d", accel_status_name(st),
           from_last);
    int *ranks = calloc((size_t)world, sizeof(int));
    EXPECT(ranks != NULL, "out of memory");
    ranks[rank] = rank;
    st = accel_allgather(acc, ranks + rank, ranks, (size_t)world, ACCEL_I32, NULL);
    EXPECT(st == ACCEL_OK, "allgather: %s", accel_status_name(st));
    for (int r = 0; r < world; r++) {
        EXPECT(ranks[r] == r, "allgather: element %d is %d", r, ranks[r]);
    }
    free(ranks);
    EXPECT(accel_barrier(acc, NULL) == ACCEL_OK, "barrier: %s", accel_last_error(acc));
    printf("COLLECTIVES-OK backend=%s\n", accel_backend_name(acc));
    accel_free(acc);
    return 0;
}
