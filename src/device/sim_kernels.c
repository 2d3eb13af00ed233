/*
 * The simulated GPU's kernels (sim.h): each checks its dtypes and that its operands are device
 * memory of its GPU, within one allocation, when issued (failing as the CUDA device does), and
 * is queued on its stream; when the stream runs, the CPU device's kernel does the work on the
 * running thread alone.
 */
#include "sim_impl.h"

typedef accel__sim_op sim_op;

void accel__sim_run_kernel(const sim_op *op, accel_status *st)
{
    accel__device *cpu = accel__device_cpu();
    const accel__device_ops *k = cpu->ops;
    static accel__stream quiet; /* non-NULL: the CPU kernel stays on this thread */
    switch (op->kernel) {
    case ACCEL__SIM_K_SGD:
        *st = k->sgd_step(cpu, &op->sgd, &quiet);
        break;
    case ACCEL__SIM_K_ADAM:
        *st = k->adam_step(cpu, &op->adam, &quiet);
        break;
    case ACCEL__SIM_K_CONVERT:
        *st = k->convert(cpu, op->x, op->y, &quiet);
        break;
    case ACCEL__SIM_K_SCALE:
        *st = k->scale(cpu, op->x, op->f1, &quiet);
        break;
    case ACCEL__SIM_K_CLAMP:
        *st = k->clamp(cpu, op->x, op->f1, op->f2, &quiet);
        break;
    case ACCEL__SIM_K_POW_SUM:
        *st = k->pow_sum(cpu, op->x, op->p, op->out, &quiet);
        break;
    case ACCEL__SIM_K_ABS_MAX:
        *st = k->abs_max(cpu, op->x, op->out, &quiet);
        break;
    case ACCEL__SIM_K_NONFINITE:
        *st = k->nonfinite(cpu, op->x, op->out, &quiet);
        break;
    default:
        *st = k->unscale_check(cpu, op->x, op->f1, op->out, &quiet);
        break;
    }
}

static int is_float(accel_dtype dt)
{
    return dt == ACCEL_F32 || dt == ACCEL_BF16 || dt == ACCEL_F16;
}

static accel_status unsupported(const char *who, accel_dtype dt)
{
    const char *name = accel_dtype_name(dt);
    /* The CUDA device's words, so tests of its errors pass on the simulation too. */
    return accel__seterr(NULL, ACCEL_EUNSUPPORTED, "cuda device: %s does not support dtype %s", who,
                         name ? name : "?");
}

static size_t span_nbytes(accel__dspan x)
{
    return x.count * accel_dtype_nbytes(x.dtype);
}

/* Checks a kernel's operand x (dtypes: F32 only, or any float) and its result (`out`,
 * out_nbytes of device memory; NULL: none), then queues it. */
static accel_status kernel_locked(accel__device *d, const char *who, int f32_only, sim_op *op,
                                  size_t out_nbytes, accel__stream *s)
{
    if (f32_only ? op->x.dtype != ACCEL_F32 : !is_float(op->x.dtype)) {
        return unsupported(who, op->x.dtype);
    }
    ACCEL_TRY(accel__sim_need_dev(d, who, "x", op->x.data, span_nbytes(op->x)));
    if (out_nbytes > 0) {
        ACCEL_TRY(accel__sim_need_dev(d, who, "the result", op->out, out_nbytes));
    }
    op->kind = ACCEL__SIM_KERNEL;
    return accel__sim_enqueue(d, s, op);
}

#define KERNEL_OP(who, f32_only, out_nbytes, s, ...)                                               \
    do {                                                                                           \
        sim_op op_ = {__VA_ARGS__};                                                                \
        ACCEL__SIM_LOCKED(kernel_locked(d, who, f32_only, &op_, out_nbytes, s));                   \
    } while (0)

accel_status accel__sim_scale(accel__device *d, accel__dspan x, float factor, accel__stream *s)
{
    KERNEL_OP("scale", 1, 0, s, .kernel = ACCEL__SIM_K_SCALE, .x = x, .f1 = factor);
}

accel_status accel__sim_clamp(accel__device *d, accel__dspan x, float lo, float hi,
                              accel__stream *s)
{
    KERNEL_OP("clamp", 1, 0, s, .kernel = ACCEL__SIM_K_CLAMP, .x = x, .f1 = lo, .f2 = hi);
}

accel_status accel__sim_pow_sum(accel__device *d, accel__dspan x, double p, double *acc,
                                accel__stream *s)
{
    KERNEL_OP("pow_sum", 0, sizeof(double), s, .kernel = ACCEL__SIM_K_POW_SUM, .x = x, .p = p,
              .out = acc);
}

accel_status accel__sim_abs_max(accel__device *d, accel__dspan x, double *acc, accel__stream *s)
{
    KERNEL_OP("abs_max", 0, sizeof(double), s, .kernel = ACCEL__SIM_K_ABS_MAX, .x = x, .out = acc);
}

accel_status accel__sim_nonfinite(accel__device *d, accel__dspan x, int32_t *flag, accel__stream *s)
{
    KERNEL_OP("nonfinite", 0, sizeof(int32_t), s, .kernel = ACCEL__SIM_K_NONFINITE, .x = x,
              .out = flag);
}

accel_status accel__sim_unscale_check(accel__device *d, accel__dspan x, float factor, int32_t *flag,
                                      accel__stream *s)
{
    KERNEL_OP("unscale_check", 1, sizeof(int32_t), s, .kernel = ACCEL__SIM_K_UNSCALE, .x = x,
              .f1 = factor, .out = flag);
}

static accel_status convert_locked(accel__device *d, accel__dspan dst, accel__dspan src,
                                   accel__stream *s)
{
    if (!is_float(src.dtype)) {
        return unsupported("convert (source)", src.dtype);
    }
    if (!is_float(dst.dtype)) {
        return unsupported("convert (destination)", dst.dtype);
    }
    ACCEL_TRY(accel__sim_need_dev(d, "convert", "the source", src.data, span_nbytes(src)));
    ACCEL_TRY(accel__sim_need_dev(d, "convert", "the destination", dst.data, span_nbytes(dst)));
    sim_op op = {.kind = ACCEL__SIM_KERNEL, .kernel = ACCEL__SIM_K_CONVERT, .x = dst, .y = src};
    return accel__sim_enqueue(d, s, &op);
}

accel_status accel__sim_convert(accel__device *d, accel__dspan dst, accel__dspan src,
                                accel__stream *s)
{
    ACCEL__SIM_LOCKED(convert_locked(d, dst, src, s));
}

static accel_status sgd_locked(accel__device *d, const accel__sgd_args *a, accel__stream *s)
{
    size_t nb = a->count * sizeof(float);
    ACCEL_TRY(accel__sim_need_dev(d, "sgd_step", "param", a->param, nb));
    ACCEL_TRY(accel__sim_need_dev(d, "sgd_step", "grad", a->grad, nb));
    if (a->momentum != 0) {
        ACCEL_TRY(accel__sim_need_dev(d, "sgd_step", "momentum_buf", a->momentum_buf, nb));
    }
    sim_op op = {.kind = ACCEL__SIM_KERNEL, .kernel = ACCEL__SIM_K_SGD, .sgd = *a};
    return accel__sim_enqueue(d, s, &op);
}

accel_status accel__sim_sgd_step(accel__device *d, const accel__sgd_args *a, accel__stream *s)
{
    ACCEL__SIM_LOCKED(sgd_locked(d, a, s));
}

static accel_status adam_locked(accel__device *d, const accel__adam_args *a, accel__stream *s)
{
    size_t nb = a->count * sizeof(float);
    ACCEL_TRY(accel__sim_need_dev(d, "adam_step", "param", a->param, nb));
    ACCEL_TRY(accel__sim_need_dev(d, "adam_step", "grad", a->grad, nb));
    ACCEL_TRY(accel__sim_need_dev(d, "adam_step", "exp_avg", a->exp_avg, nb));
    ACCEL_TRY(accel__sim_need_dev(d, "adam_step", "exp_avg_sq", a->exp_avg_sq, nb));
    if (a->max_exp_avg_sq != NULL) {
        ACCEL_TRY(accel__sim_need_dev(d, "adam_step", "max_exp_avg_sq", a->max_exp_avg_sq, nb));
    }
    if (a->compute != NULL) {
        ACCEL_TRY(accel__sim_need_dev(d, "adam_step", "compute", a->compute,
                                      a->count * accel_dtype_nbytes(a->compute_dtype)));
    }
    sim_op op = {.kind = ACCEL__SIM_KERNEL, .kernel = ACCEL__SIM_K_ADAM, .adam = *a};
    return accel__sim_enqueue(d, s, &op);
}

accel_status accel__sim_adam_step(accel__device *d, const accel__adam_args *a, accel__stream *s)
{
    ACCEL__SIM_LOCKED(adam_locked(d, a, s));
}
