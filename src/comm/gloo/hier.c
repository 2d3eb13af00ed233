#include "base/base.h"
#include "comm/comm.h"
static accel_status hier_init(const accel__comm_config *cfg, void **impl)
{
    (void)cfg;
    (void)impl;
    return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "hier: not yet");
}
static void hier_destroy(void *impl)
{
    (void)impl;
}
const accel__comm_ops accel__hier_ops = {.init = hier_init, .destroy = hier_destroy};
