/*
 * The per-call constants of the Adam / AdamW update, shared by every device backend (the CPU's
 * cpu_optim.c and CUDA's cuda/) so that each derives them with the same fp32 host arithmetic
 * and their element updates start from identical bits. Plain C, also read by nvcc (no accel
 * headers here).
 */
#ifndef ACCEL_DEVICE_OPTIM_COEF_H
#define ACCEL_DEVICE_OPTIM_COEF_H

typedef struct accel__adam_coef {
    float sign;      /* -1 under maximize, else 1 */
    float l2;        /* Adam's weight decay added to the gradient (0 for AdamW) */
    float decay;     /* AdamW's decoupled factor 1 - lr * wd (1 for Adam) */
    float w1;        /* 1 - beta1: exp_avg.lerp_(grad, w1) */
    float beta2, w2; /* exp_avg_sq * beta2 + w2 * grad * grad */
    float eps;
    float bc2_sqrt;  /* sqrt(1 - beta2^t) */
    float step_size; /* lr / (1 - beta1^t) */
} accel__adam_coef;

/* Evaluated in fp32 in this order, as torch's single-tensor Adam does on the host. */
static inline accel__adam_coef accel__adam_coef_make(float lr, float wd, int decoupled, float beta1,
                                                     float beta2, float eps, float bc1,
                                                     float bc2_sqrt, int maximize)
{
    accel__adam_coef c;
    c.sign = maximize ? -1.0f : 1.0f;
    c.l2 = decoupled ? 0.0f : wd;
    c.decay = decoupled ? 1.0f - lr * wd : 1.0f;
    c.step_size = lr / bc1;
    c.w1 = 1.0f - beta1;
    c.w2 = 1.0f - beta2;
    c.beta2 = beta2;
    c.eps = eps;
    c.bc2_sqrt = bc2_sqrt;
    return c;
}

#endif /* ACCEL_DEVICE_OPTIM_COEF_H */
