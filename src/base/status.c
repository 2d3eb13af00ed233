/*
 * Names and descriptions of status codes and dtypes, tensor view helpers, shapes in messages.
 * Both tables come from one source each (ACCEL_STATUS_MAP, dtype_info) so a new entry needs one
 * edit.
 */
#include <stdio.h>
#include <string.h>

#include "accel/status.h"
#include "accel/tensor.h"
#include "base/base.h"

const char *accel_status_name(accel_status st)
{
    switch (st) {
#define ACCEL__STATUS_NAME(name, value, desc)                                                      \
    case ACCEL_##name:                                                                             \
        return #name;
        ACCEL_STATUS_MAP(ACCEL__STATUS_NAME)
#undef ACCEL__STATUS_NAME
    }
    return "UNKNOWN";
}

const char *accel_status_str(accel_status st)
{
    switch (st) {
#define ACCEL__STATUS_DESC(name, value, desc)                                                      \
    case ACCEL_##name:                                                                             \
        return desc;
        ACCEL_STATUS_MAP(ACCEL__STATUS_DESC)
#undef ACCEL__STATUS_DESC
    }
    return "unknown status";
}

static const struct {
    const char *name;
    size_t bits;
    int is_float;
} dtype_info[ACCEL_DTYPE_COUNT] = {
    [ACCEL_F32] = {"F32", 32, 1},
    [ACCEL_F64] = {"F64", 64, 1},
    [ACCEL_F16] = {"F16", 16, 1},
    [ACCEL_BF16] = {"BF16", 16, 1},
    [ACCEL_F8_E4M3] = {"F8_E4M3", 8, 1},
    [ACCEL_F8_E5M2] = {"F8_E5M2", 8, 1},
    [ACCEL_I8] = {"I8", 8, 0},
    [ACCEL_U8] = {"U8", 8, 0},
    [ACCEL_I16] = {"I16", 16, 0},
    [ACCEL_U16] = {"U16", 16, 0},
    [ACCEL_I32] = {"I32", 32, 0},
    [ACCEL_I64] = {"I64", 64, 0},
    [ACCEL_BOOL] = {"BOOL", 8, 0},
    [ACCEL_U32] = {"U32", 32, 0},
    [ACCEL_U64] = {"U64", 64, 0},
    [ACCEL_C64] = {"C64", 64, 0},
    [ACCEL_F8_E8M0] = {"F8_E8M0", 8, 1},
    [ACCEL_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8, 1},
    [ACCEL_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8, 1},
    [ACCEL_F4] = {"F4", 4, 1},
    [ACCEL_F6_E2M3] = {"F6_E2M3", 6, 1},
    [ACCEL_F6_E3M2] = {"F6_E3M2", 6, 1},
};

static int dtype_valid(accel_dtype dt)
{
    return (int)dt >= 0 && dt < ACCEL_DTYPE_COUNT;
}

size_t accel_dtype_nbytes(accel_dtype dt)
{
    return dtype_valid(dt) && dtype_info[dt].bits % 8 == 0 ? dtype_info[dt].bits / 8 : 0;
}

size_t accel_dtype_bits(accel_dtype dt)
{
    return dtype_valid(dt) ? dtype_info[dt].bits : 0;
}

const char *accel_dtype_name(accel_dtype dt)
{
    return dtype_valid(dt) ? dtype_info[dt].name : NULL;
}

int accel_dtype_is_float(accel_dtype dt)
{
    return dtype_valid(dt) ? dtype_info[dt].is_float : 0;
}

accel_status accel_dtype_from_name(const char *name, accel_dtype *out)
{
    if (name == NULL) {
        return ACCEL_EINVAL;
    }
    for (int i = 0; i < ACCEL_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_info[i].name) == 0) {
            *out = (accel_dtype)i;
            return ACCEL_OK;
        }
    }
    return ACCEL_EINVAL;
}

int64_t accel_tensor_numel(const accel_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        n *= t->shape[i];
    }
    return n;
}

size_t accel_tensor_nbytes(const accel_tensor *t)
{
    return ((size_t)accel_tensor_numel(t) * accel_dtype_bits(t->dtype) + 7) / 8;
}

accel_tensor accel_tensor_view(void *data, accel_dtype dt, int ndim, const int64_t *shape)
{
    accel_tensor t;
    memset(&t, 0, sizeof(t));
    t.data = data;
    t.dtype = dt;
    t.ndim = (ndim >= 0 && ndim <= ACCEL_MAX_DIMS) ? ndim : 0;
    for (int i = 0; i < t.ndim; i++) {
        t.shape[i] = shape[i];
    }
    t.device.type = ACCEL_DEVICE_CPU;
    return t;
}

const char *accel__shape_str(char *buf, size_t nbytes, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, nbytes, "[");
    for (int d = 0; d < ndim && k < nbytes; d++) {
        k += (size_t)snprintf(buf + k, nbytes - k, d ? ", %lld" : "%lld", (long long)shape[d]);
    }
    if (k < nbytes) {
        snprintf(buf + k, nbytes - k, "]");
    }
    return buf;
}
