/*
 * The checkpoint module's state on an accelerator (accel__ckpt_module: the automatic counter,
 * the last folder, the fused-load mode) and what users register with it: objects saved through
 * their own callbacks (custom_checkpoint_<index>.bin, through the state protocol) and the
 * save / load pre-hooks, run in registration order. Registrations live as long as the
 * accelerator (the module's destructor unregisters the objects).
 */
#include <string.h>

#include "ckpt/state.h"
#include "core/settings.h"

typedef struct accel__ckpt_hook {
    int handle;
    int is_load;
    accel_state_hook fn;
    void *ctx;
} state_hook;

/* An object registered with accel_register_for_checkpointing: custom_checkpoint_<index>.bin. */
typedef struct accel__ckpt_custom {
    accel__object obj; /* first: listed on the accelerator, kind ACCEL__OBJ_CUSTOM */
    accel_state_save_fn save;
    accel_state_load_fn load;
    void *ctx;
    int index; /* registration order */
} custom_obj;

static void module_free(accel *acc, void *state)
{
    (void)acc;
    accel__ckpt_module *m = state;
    for (int i = 0; i < m->n_custom; i++) {
        accel__object_unregister(&m->custom[i]->obj);
        accel__free(m->custom[i]);
    }
    accel__free(m->custom);
    accel__free(m->hooks);
    accel__free(m->last_dir);
    accel__free(m);
}

accel__ckpt_module *accel__ckpt_module_of(accel *acc)
{
    accel__ckpt_module *m = accel__module(acc, ACCEL__MOD_CKPT);
    if (m == NULL) {
        m = accel__calloc(1, sizeof(*m));
        if (m == NULL) {
            accel__seterr(acc, ACCEL_ENOMEM, "out of memory");
            return NULL;
        }
        m->next_handle = 1;
        m->iteration = acc->settings->ckpt.iteration;
        accel__module_set(acc, ACCEL__MOD_CKPT, m, module_free);
    }
    return m;
}

/* ---- registered objects: their bytes through the state protocol ---- */

struct accel_state_writer {
    accel__state_writer *w;
};

accel_status accel_state_write(accel_state_writer *w, const void *data, size_t nbytes)
{
    if (w == NULL || w->w == NULL || (data == NULL && nbytes > 0)) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_state_write: NULL %s",
                             w && w->w ? "data" : "writer");
    }
    return accel__state_put_bytes(w->w, data, nbytes);
}

static accel_status custom_save(accel__object *self, accel__state_writer *w)
{
    custom_obj *c = (custom_obj *)self;
    accel_state_writer pub = {w};
    accel__clear_error();
    accel_status st = c->save(c->ctx, &pub);
    if (st != ACCEL_OK) {
        return accel__seterr(self->acc, st,
                             "accel_save_state: registered object %d's save failed: %s", c->index,
                             accel__cause(st));
    }
    return ACCEL_OK;
}

static accel_status custom_apply(accel__object *self, const void *data, size_t n)
{
    custom_obj *c = (custom_obj *)self;
    accel__clear_error();
    accel_status st = c->load(c->ctx, data, n);
    if (st != ACCEL_OK) {
        return accel__seterr(self->acc, st,
                             "accel_load_state: registered object %d rejected "
                             "custom_checkpoint_%d.bin: %s",
                             c->index, c->index, accel__cause(st));
    }
    return ACCEL_OK;
}

static accel_status custom_load(accel__object *self, accel__state_reader *r)
{
    const void *data;
    size_t n;
    ACCEL_TRY(accel__state_get_bytes(r, &data, &n));
    return accel__state_plan_stage_first(r->plan, self, custom_apply, data, n);
}

static const accel__object_class custom_class = {
    .state_save = custom_save,
    .state_load = custom_load,
    .name = "custom_checkpoint",
    .store = ACCEL__STORE_BYTES,
    .numbered_from_0 = 1, /* Accelerate: custom_checkpoint_0.pkl */
};

accel_status accel_register_for_checkpointing(accel *acc, accel_state_save_fn save,
                                              accel_state_load_fn load, void *ctx)
{
    if (acc == NULL || save == NULL || load == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "accel_register_for_checkpointing: %s is NULL (an object needs both "
                             "a save and a load callback)",
                             acc == NULL    ? "acc"
                             : save == NULL ? "save"
                                            : "load");
    }
    accel__ckpt_module *m = accel__ckpt_module_of(acc);
    if (m == NULL) {
        return ACCEL_ENOMEM;
    }
    if (m->n_custom == m->cap_custom) {
        int cap = m->cap_custom ? m->cap_custom * 2 : 4;
        custom_obj **p = accel__realloc(m->custom, (size_t)cap * sizeof(*p));
        if (p == NULL) {
            return accel__seterr(acc, ACCEL_ENOMEM, "out of memory");
        }
        m->custom = p;
        m->cap_custom = cap;
    }
    custom_obj *c = accel__calloc(1, sizeof(*c));
    if (c == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "out of memory");
    }
    *c = (custom_obj){.save = save, .load = load, .ctx = ctx, .index = m->n_custom};
    accel__object_register(acc, &c->obj, ACCEL__OBJ_CUSTOM, &custom_class);
    c->obj.prepared = 1;
    m->custom[m->n_custom++] = c;
    return ACCEL_OK;
}

static accel_status add_hook(accel *acc, int is_load, accel_state_hook fn, void *ctx, int *handle)
{
    if (acc == NULL || fn == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_register_%s_state_pre_hook: %s is NULL",
                             is_load ? "load" : "save", acc == NULL ? "acc" : "hook");
    }
    accel__ckpt_module *m = accel__ckpt_module_of(acc);
    if (m == NULL) {
        return ACCEL_ENOMEM;
    }
    if (m->n_hooks == m->cap_hooks) {
        int cap = m->cap_hooks ? m->cap_hooks * 2 : 4;
        state_hook *p = accel__realloc(m->hooks, (size_t)cap * sizeof(*p));
        if (p == NULL) {
            return accel__seterr(acc, ACCEL_ENOMEM, "out of memory");
        }
        m->hooks = p;
        m->cap_hooks = cap;
    }
    int h = m->next_handle++;
    m->hooks[m->n_hooks++] = (state_hook){h, is_load, fn, ctx};
    if (handle != NULL) {
        *handle = h;
    }
    return ACCEL_OK;
}

accel_status accel_register_save_state_pre_hook(accel *acc, accel_state_hook hook, void *ctx,
                                                int *handle)
{
    return add_hook(acc, 0, hook, ctx, handle);
}

accel_status accel_register_load_state_pre_hook(accel *acc, accel_state_hook hook, void *ctx,
                                                int *handle)
{
    return add_hook(acc, 1, hook, ctx, handle);
}

accel_status accel_remove_state_pre_hook(accel *acc, int handle)
{
    accel__ckpt_module *m = acc ? accel__module(acc, ACCEL__MOD_CKPT) : NULL;
    for (int i = 0; m != NULL && i < m->n_hooks; i++) {
        if (m->hooks[i].handle == handle) {
            memmove(&m->hooks[i], &m->hooks[i + 1],
                    (size_t)(m->n_hooks - i - 1) * sizeof(m->hooks[0]));
            m->n_hooks--;
            return ACCEL_OK;
        }
    }
    return accel__seterr(acc, acc ? ACCEL_ENOTFOUND : ACCEL_EINVAL,
                         "accel_remove_state_pre_hook: no hook with handle %d", handle);
}

accel_status accel__ckpt_run_hooks(accel *acc, int is_load, const char *dir)
{
    accel__ckpt_module *m = accel__module(acc, ACCEL__MOD_CKPT);
    for (int i = 0; m != NULL && i < m->n_hooks; i++) {
        if (m->hooks[i].is_load != is_load) {
            continue;
        }
        accel__clear_error();
        accel_status st = m->hooks[i].fn(acc, dir, m->hooks[i].ctx);
        if (st != ACCEL_OK) {
            return accel__seterr(acc, st, "accel_%s_state: %s pre-hook %d failed: %s",
                                 is_load ? "load" : "save", is_load ? "load" : "save",
                                 m->hooks[i].handle, accel__cause(st));
        }
    }
    return ACCEL_OK;
}

const char *accel_checkpoint_dir(const accel *acc)
{
    const accel__ckpt_module *m = acc ? accel__module(acc, ACCEL__MOD_CKPT) : NULL;
    return m ? m->last_dir : NULL;
}

int accel_checkpoint_iteration(const accel *acc)
{
    const accel__ckpt_module *m = acc ? accel__module(acc, ACCEL__MOD_CKPT) : NULL;
    return m ? m->iteration : acc ? acc->settings->ckpt.iteration : 0;
}

void accel__ckpt_set_last_dir(accel *acc, const char *dir)
{
    accel__ckpt_module *m = accel__ckpt_module_of(acc);
    char *d = accel__strdup(dir);
    if (m != NULL && d != NULL) {
        accel__free(m->last_dir);
        m->last_dir = d;
    } else {
        accel__free(d);
    }
}
