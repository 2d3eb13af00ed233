/*
 * accel_prepare and the registry of live objects. Each module's object embeds accel__object as
 * its first member; this file only orders and dispatches, so core knows nothing of models or
 * loaders. Invariant: acc->objects lists exactly the objects not yet freed.
 */
#include <string.h>

#include "internal.h"

void accel__object_register(accel *acc, accel__object *obj, accel__object_kind kind,
                            const accel__object_class *cls)
{
    obj->magic = ACCEL__OBJECT_MAGIC;
    obj->kind = kind;
    obj->acc = acc;
    obj->prepared = 0;
    obj->cls = cls;
    obj->prev = NULL;
    obj->next = acc->objects;
    if (acc->objects != NULL) {
        acc->objects->prev = obj;
    }
    acc->objects = obj;
}

void accel__object_unregister(accel__object *obj)
{
    if (obj == NULL || obj->acc == NULL) {
        return;
    }
    if (obj->prev != NULL) {
        obj->prev->next = obj->next;
    } else if (obj->acc->objects == obj) {
        obj->acc->objects = obj->next;
    }
    if (obj->next != NULL) {
        obj->next->prev = obj->prev;
    }
    obj->next = obj->prev = NULL;
    obj->acc = NULL;
}

accel_status accel__prepare_objects(accel *acc, int n, void *const *objs)
{
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "accel_prepare: acc is NULL");
    }
    for (int i = 0; i < n; i++) {
        const accel__object *o = objs[i];
        if (o == NULL || o->magic != ACCEL__OBJECT_MAGIC || o->kind >= ACCEL__OBJ_N_PREPARABLE) {
            return accel__seterr(acc, ACCEL_EINVAL,
                                 "accel_prepare: argument %d is not a model, optimizer, scheduler "
                                 "or loader",
                                 i + 1);
        }
        if (o->acc != acc) {
            return accel__seterr(acc, ACCEL_EINVAL,
                                 "accel_prepare: argument %d belongs to another accelerator",
                                 i + 1);
        }
    }
    /* Kinds in dependency order, and within a kind the caller's order. */
    for (int kind = 0; kind < ACCEL__OBJ_N_PREPARABLE; kind++) {
        for (int i = 0; i < n; i++) {
            accel__object *o = objs[i];
            if ((int)o->kind != kind || o->prepared) {
                continue;
            }
            if (o->cls->prepare != NULL) {
                ACCEL_TRY(o->cls->prepare(o));
            }
            o->prepared = 1;
        }
    }
    return ACCEL_OK;
}

/* The newest object accel_free_memory releases (objects of a module stay: no destroy). */
static accel__object *first_releasable(accel *acc)
{
    accel__object *o = acc->objects;
    while (o != NULL && o->cls->destroy == NULL) {
        o = o->next;
    }
    return o;
}

void accel_free_memory(accel *acc)
{
    if (acc == NULL) {
        return;
    }
    /* Newest first: an optimizer goes before the model it points into. */
    for (accel__object *o = first_releasable(acc); o != NULL; o = first_releasable(acc)) {
        o->cls->destroy(o);
        for (accel__object *p = acc->objects; p != NULL; p = p->next) {
            if (p == o) { /* a destroy that forgot to unregister must not loop */
                accel__object_unregister(o);
                break;
            }
        }
    }
    /* As Accelerate's free_memory resets its step: the next run accumulates from scratch. */
    accel__module_release(acc, ACCEL__MOD_GSTATE);
}
