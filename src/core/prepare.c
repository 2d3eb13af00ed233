/*
 * accel_prepare and the registry of live objects. Each module's object embeds accel__object as
 * its first member; this file only orders and dispatches, so core knows nothing of models or
 * loaders. Invariant: acc->objects lists exactly the objects not yet freed.
 */
#include <string.h>

#include "internal.h"

void accel__object_register(accel *acc, accel__object *obj, accel__object_kind kind,
                            accel_status (*prepare)(accel__object *),
                            void (*destroy)(accel__object *))
{
    obj->magic = ACCEL__OBJECT_MAGIC;
    obj->kind = kind;
    obj->acc = acc;
    obj->prepared = 0;
    obj->prepare = prepare;
    obj->destroy = destroy;
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
        if (o == NULL || o->magic != ACCEL__OBJECT_MAGIC || o->kind >= ACCEL__OBJ_KIND_COUNT) {
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
    for (int kind = 0; kind < ACCEL__OBJ_KIND_COUNT; kind++) {
        for (int i = 0; i < n; i++) {
            accel__object *o = objs[i];
            if ((int)o->kind != kind || o->prepared) {
                continue;
            }
            if (o->prepare != NULL) {
                ACCEL_TRY(o->prepare(o));
            }
            o->prepared = 1;
        }
    }
    return ACCEL_OK;
}

void accel_free_memory(accel *acc)
{
    if (acc == NULL) {
        return;
    }
    /* Newest first: an optimizer goes before the model it points into. */
    while (acc->objects != NULL) {
        accel__object *o = acc->objects;
        o->destroy(o);
        if (acc->objects == o) { /* a destroy that forgot to unregister must not loop */
            accel__object_unregister(o);
        }
    }
    memset(&acc->gstate, 0, sizeof(acc->gstate));
    acc->gstate.sync_gradients = 1;
    acc->gstate.remainder = -1;
}
