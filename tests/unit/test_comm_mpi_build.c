/*
 * The mpi backend's place in the backend table, in both kinds of build: with MPI it is built,
 * listed by accel_backends_built and reduces through a wire dtype; without, asking for it is
 * ACCEL_EUNSUPPORTED naming the package and the build option (never a crash or a silent
 * fallback). MPI itself is exercised under mpirun by tests/comm/test_mpi.sh (a unit test must
 * not start MPI: the sanitizer build runs these).
 */
#include <string.h>

#include "check.h"
#include "comm/comm.h"

int main(void)
{
    const accel__comm_backend *b = accel__comm_backend_find("mpi");
    CHECK(b != NULL);
#ifdef ACCEL_HAVE_MPI
    CHECK(b->built && b->ops != NULL && (b->caps & ACCEL__COMM_WIRE) != 0);
    CHECK(!(b->caps & ACCEL__COMM_NATIVE_ASYNC)); /* a host backend: the progress thread */
    CHECK(strstr(accel_backends_built(), "mpi") != NULL);
    printf("test_comm_mpi_build: mpi is built in\n");
#else
    CHECK(!b->built && b->ops == NULL);
    CHECK(strstr(accel_backends_built(), "mpi") == NULL);
    accel__comm_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.backend = "mpi";
    cfg.n_ranks = 2;
    cfg.timeout_s = 5;
    accel__comm *c = NULL;
    CHECK(accel__comm_new(&c, &cfg) == ACCEL_EUNSUPPORTED && c == NULL);
    const char *msg = accel_last_error(NULL);
    CHECK_MSG(strstr(msg, "libopenmpi-dev") != NULL && strstr(msg, "-DACCEL_MPI=ON") != NULL, "%s",
              msg);
    printf("test_comm_mpi_build: no MPI in this build: %s\n", msg);
#endif
    return 0;
}
