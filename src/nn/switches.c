/*
 * nn's process-wide on/off switches: each read once from its environment variable (an nn ctx
 * needs no accel_init, so it has no resolved settings to take them from), each settable by a
 * test hook. One table, so that every switch is read and overridden the same way.
 */
#include <pthread.h>

#include "nn_internal.h"

static const struct {
    const char *env;
    int dflt;
} switch_env[ACCEL__NN_N_SWITCHES] = {
    [ACCEL__NN_SW_SHADOW] = {"ACCEL_NN_SHADOW", 1},
    [ACCEL__NN_SW_BGRAD] = {"ACCEL_NN_BGRAD", 0},
    [ACCEL__NN_SW_REWIND] = {"ACCEL_NN_REWIND", 1},
};
static int switch_on[ACCEL__NN_N_SWITCHES];
static pthread_once_t switch_once = PTHREAD_ONCE_INIT;

static void switches_read_env(void)
{
    for (int i = 0; i < ACCEL__NN_N_SWITCHES; i++) {
        long long v;
        switch_on[i] = accel__env_int(switch_env[i].env, &v) == ACCEL_OK ? v != 0
                                                                         : switch_env[i].dflt;
    }
}

int accel__nn_switch(accel__nn_switch_id id)
{
    pthread_once(&switch_once, switches_read_env);
    return switch_on[id];
}

void accel__nn_switch_set(accel__nn_switch_id id, int on)
{
    pthread_once(&switch_once, switches_read_env);
    switch_on[id] = on != 0;
}
