/*
 * An optimizer's checkpoint (the state protocol, core/state_proto.h): its state buffers as
 * torch names them ("exp_avg.<param>", "exp_avg_sq.<param>", "max_exp_avg_sq.<param>",
 * "momentum_buffer.<param>") and its hyper-parameters, step count and param groups as the
 * "accel_optimizer" JSON of optimizer[_<i>].safetensors. The one place that knows which
 * buffer is which. Invariant: a load changes nothing until it is applied, and then restores
 * exactly what was saved.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "train_internal.h"

/*
 * Calls fn(arg, name, view, whole) for every state tensor of opt: per buffer (SGD:
 * momentum_buffer; Adam: exp_avg, exp_avg_sq, max_exp_avg_sq with amsgrad), per parameter,
 * named as torch's state_dict names them, on the model's device. Without ZeRO the view is the
 * whole tensor with the parameter's shape; from stage 1 on the state holds only this
 * process's pieces, so the view is the 1-D piece of `rank` (this process's m->rank, or -1 for
 * none) and `whole` says where it lies in the tensor (an empty piece when the process owns none
 * of the parameter). Absent buffers are skipped.
 */
static accel_status each_tensor(const accel_optimizer *opt, int rank,
                                accel_status (*fn)(void *arg, const char *name, accel_tensor t,
                                                   const accel__state_piece *whole),
                                void *arg)
{
    static const char *const sgd[] = {"momentum_buffer."};
    static const char *const adam[] = {"exp_avg.", "exp_avg_sq.", "max_exp_avg_sq."};
    float *bufs[3] = {opt->state_a, opt->state_b, opt->state_c};
    const char *const *names = opt->kind == ACCEL__SGD ? sgd : adam;
    int nb = opt->kind == ACCEL__SGD ? 1 : 3;
    const accel_model *m = opt->model;
    for (int b = 0; b < nb; b++) {
        for (int i = 0; bufs[b] != NULL && i < m->n_params; i++) {
            const accel_param *p = &m->params[i];
            char name[ACCEL_PARAM_NAME_MAX + 32];
            snprintf(name, sizeof name, "%s%s", names[b], p->name);
            accel__state_piece whole = {p->ndim, {0}, 0};
            memcpy(whole.shape, p->shape, sizeof whole.shape);
            accel_tensor t;
            if (m->zero_stage >= 1) {
                size_t flat_off, shard_off, count;
                accel__zero_param_part(m, i, rank, &flat_off, &shard_off, &count);
                whole.offset = count > 0 ? (int64_t)(flat_off - p->offset) : 0;
                float *at =
                    count > 0 ? accel__zero_state_at(m, bufs[b], flat_off, shard_off) : bufs[b];
                t = accel_tensor_view(at, ACCEL_F32, 1, (int64_t[]){(int64_t)count});
            } else {
                t = accel_tensor_view(bufs[b] + p->offset, ACCEL_F32, p->ndim, p->shape);
            }
            t.device = p->data_view.device; /* the state lives with the weights */
            ACCEL_TRY(fn(arg, name, t, &whole));
        }
    }
    return ACCEL_OK;
}

static accel_status put_piece(void *w, const char *name, accel_tensor t,
                              const accel__state_piece *whole)
{
    return accel__state_put_piece(w, name, t, whole);
}

static accel_status get_piece(void *r, const char *name, accel_tensor t,
                              const accel__state_piece *whole)
{
    return accel__state_get_piece(r, name, t, whole);
}

static const char *kind_name(accel__optim_kind kind)
{
    return kind == ACCEL__SGD ? "sgd" : kind == ACCEL__ADAM ? "adam" : "adamw";
}

accel_status accel__optim_state_save(accel__object *self, accel__state_writer *w)
{
    accel_optimizer *opt = (accel_optimizer *)self;
    const accel_model *m = opt->model;
    ACCEL_TRY(each_tensor(opt, accel__zero_save_rank(m), put_piece, w));
    /* Hyper-parameters in this order (the metadata keeps it). */
    ACCEL_TRY(accel__state_put_str(w, "kind", kind_name(opt->kind)));
    ACCEL_TRY(accel__state_put_i64(w, "step", opt->n_steps));
    ACCEL_TRY(accel__state_put_bool(w, "step_was_skipped", opt->step_was_skipped));
    ACCEL_TRY(accel__state_put_f64(w, "momentum", opt->momentum));
    ACCEL_TRY(accel__state_put_f64(w, "dampening", opt->dampening));
    ACCEL_TRY(accel__state_put_f64(w, "beta1", opt->beta1));
    ACCEL_TRY(accel__state_put_f64(w, "beta2", opt->beta2));
    ACCEL_TRY(accel__state_put_f64(w, "eps", opt->eps));
    ACCEL_TRY(accel__state_put_bool(w, "nesterov", opt->nesterov));
    ACCEL_TRY(accel__state_put_bool(w, "maximize", opt->maximize));
    ACCEL_TRY(accel__state_put_bool(w, "amsgrad", opt->amsgrad));
    ACCEL_TRY(accel__state_begin(w, "param_groups", 1));
    for (int g = 0; g < opt->n_groups; g++) {
        ACCEL_TRY(accel__state_begin(w, NULL, 0));
        ACCEL_TRY(accel__state_put_f64(w, "lr", opt->groups[g].lr));
        ACCEL_TRY(accel__state_put_f64(w, "weight_decay", opt->groups[g].weight_decay));
        ACCEL_TRY(accel__state_end(w));
    }
    ACCEL_TRY(accel__state_end(w));
    ACCEL_TRY(accel__state_begin(w, "param_group_of", 0));
    for (int i = 0; i < m->n_params; i++) {
        ACCEL_TRY(accel__state_put_i64(w, m->params[i].name, opt->param_group[i]));
    }
    return accel__state_end(w);
}

/* What a load changes, staged until it is applied. */
typedef struct optim_staged {
    int64_t n_steps;
    int step_was_skipped;
    double momentum, dampening, beta1, beta2, eps;
    double lr[ACCEL_OPTIM_MAX_GROUPS], wd[ACCEL_OPTIM_MAX_GROUPS];
    int param_group[]; /* per parameter */
} optim_staged;

static void optim_apply(accel__object *self, void *data)
{
    accel_optimizer *opt = (accel_optimizer *)self;
    const optim_staged *s = data;
    opt->n_steps = s->n_steps;
    opt->step_was_skipped = s->step_was_skipped;
    opt->momentum = s->momentum;
    opt->dampening = s->dampening;
    opt->beta1 = s->beta1;
    opt->beta2 = s->beta2;
    opt->eps = s->eps;
    for (int g = 0; g < opt->n_groups; g++) {
        opt->groups[g].lr = s->lr[g];
        opt->groups[g].weight_decay = s->wd[g];
    }
    memcpy(opt->param_group, s->param_group, (size_t)opt->model->n_params * sizeof(int));
    opt->segments_dirty = 1;
}

/* The hyper-parameters (learning rates, decays, momentum: finite and >= 0; betas in [0, 1)). */
static accel_status load_hyper(accel_optimizer *opt, accel__state_reader *r, optim_staged *s)
{
    const double below_1 = nextafter(1.0, 0.0);
    ACCEL_TRY(accel__state_get_i64(r, "step", 0, ACCEL__STATE_COUNT_MAX, &s->n_steps));
    if (accel__state_has(r, "step_was_skipped")) {
        ACCEL_TRY(accel__state_get_bool(r, "step_was_skipped", &s->step_was_skipped));
    }
    ACCEL_TRY(accel__state_get_f64(r, "momentum", 0, DBL_MAX, &s->momentum));
    ACCEL_TRY(accel__state_get_f64(r, "dampening", 0, DBL_MAX, &s->dampening));
    ACCEL_TRY(accel__state_get_f64(r, "beta1", 0, below_1, &s->beta1));
    ACCEL_TRY(accel__state_get_f64(r, "beta2", 0, below_1, &s->beta2));
    ACCEL_TRY(accel__state_get_f64(r, "eps", 0, DBL_MAX, &s->eps));
    size_t n_groups;
    ACCEL_TRY(accel__state_get_len(r, "param_groups", &n_groups));
    if (n_groups != (size_t)opt->n_groups) {
        return accel__state_fail(r, ACCEL_EINVAL,
                                 "%zu param groups in the checkpoint vs %d in the live optimizer",
                                 n_groups, opt->n_groups);
    }
    for (int g = 0; g < opt->n_groups; g++) {
        ACCEL_TRY(accel__state_enter_item(r, "param_groups", (size_t)g));
        ACCEL_TRY(accel__state_get_f64(r, "lr", 0, DBL_MAX, &s->lr[g]));
        ACCEL_TRY(accel__state_get_f64(r, "weight_decay", 0, DBL_MAX, &s->wd[g]));
        accel__state_leave(r);
    }
    const accel_model *m = opt->model;
    ACCEL_TRY(accel__state_enter(r, "param_group_of"));
    for (int i = 0; i < m->n_params; i++) {
        int64_t g;
        ACCEL_TRY(accel__state_get_i64(r, m->params[i].name, 0, opt->n_groups - 1, &g));
        s->param_group[i] = (int)g;
    }
    accel__state_leave(r);
    return ACCEL_OK;
}

accel_status accel__optim_state_load(accel__object *self, accel__state_reader *r)
{
    accel_optimizer *opt = (accel_optimizer *)self;
    const accel_model *m = opt->model;
    const char *kind;
    ACCEL_TRY(accel__state_get_str(r, "kind", &kind));
    if (strcmp(kind, kind_name(opt->kind)) != 0) {
        return accel__state_fail(r, ACCEL_EINVAL,
                                 "optimizer kind %s in the checkpoint vs %s in the live optimizer",
                                 kind, kind_name(opt->kind));
    }
    optim_staged *s =
        accel__state_stage(r, sizeof(*s) + (size_t)m->n_params * sizeof(int), optim_apply);
    if (s == NULL) {
        return ACCEL_ENOMEM;
    }
    ACCEL_TRY(load_hyper(opt, r, s));
    return each_tensor(opt, opt->model->rank, get_piece, r);
}
