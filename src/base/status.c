/*
 * Names and descriptions of status codes and dtypes, tensor view helpers. Both tables come from
 * one source each (ACCEL_STATUS_MAP, dtype_info) so a new entry needs one edit.
 */
#include <string.h>

#include "accel/status.h"
#include "accel/tensor.h"

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
    size_t nbytes;
    int is_float;
} dtype_info[ACCEL_DTYPE_COUNT] = {
    [ACCEL_F32] = {"F32", 4, 1},         [ACCEL_F64] = {"F64", 8, 1},
    [ACCEL_F16] = {"F16", 2, 1},         [ACCEL_BF16] = {"BF16", 2, 1},
    [ACCEL_F8_E4M3] = {"F8_E4M3", 1, 1}, [ACCEL_F8_E5M2] = {"F8_E5M2", 1, 1},
    [ACCEL_I8] = {"I8", 1, 0},           [ACCEL_U8] = {"U8", 1, 0},
    [ACCEL_I16] = {"I16", 2, 0},         [ACCEL_U16] = {"U16", 2, 0},
    [ACCEL_I32] = {"I32", 4, 0},         [ACCEL_I64] = {"I64", 8, 0},
    [ACCEL_BOOL] = {"BOOL", 1, 0},
};

static int dtype_valid(accel_dtype dt)
{
    return (int)dt >= 0 && dt < ACCEL_DTYPE_COUNT;
}

size_t accel_dtype_nbytes(accel_dtype dt)
{
    return dtype_valid(dt) ? dtype_info[dt].nbytes : 0;
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
    return (size_t)accel_tensor_numel(t) * accel_dtype_nbytes(t->dtype);
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
