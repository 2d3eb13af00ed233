/*
 * Gloo's own collectives, for bench/collectives' baseline column under the gloo and hier
 * backends (what PyTorch's ProcessGroupGloo calls: gloo::allreduce's ring, gloo::allgather,
 * gloo::broadcast). A C face over bench/gloo_raw.cc, built only when CMake found Gloo
 * (BENCH_HAVE_GLOO). Rendezvous through the job's accel store at MASTER_ADDR:MASTER_PORT, so it
 * runs under accel launch beside an accel communicator that serves or uses that store.
 */
#ifndef ACCEL_BENCH_GLOO_RAW_H
#define ACCEL_BENCH_GLOO_RAW_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bench_gloo bench_gloo;

/* Connects rank of n through the store at addr:port (keys under "bench/gloo_raw/"), listening
 * on interface ifname when not NULL, else on the address of the route to addr. NULL with a
 * message on stderr on failure. Collective. */
bench_gloo *bench_gloo_open(int rank, int n, const char *addr, int port, const char *ifname,
                            double timeout_s);
/* One f32 collective of bench/collectives (0 allreduce sum, 1 allgather of count / n per rank,
 * 2 reduce_scatter, 3 broadcast from rank 0) out of place over count elements: 0 done, 1 Gloo
 * has no such collective (reduce_scatter), -1 failed (message on stderr). */
int bench_gloo_run(bench_gloo *g, int coll, const float *send, float *recv, size_t count);
void bench_gloo_close(bench_gloo *g);

#ifdef __cplusplus
}
#endif

#endif /* ACCEL_BENCH_GLOO_RAW_H */
