/*
 * save_state / load_state orchestration: folder naming (explicit, or ProjectConfiguration's
 * project_dir/checkpoints/checkpoint_<n>), the registry of custom objects and pre-hooks, and
 * the collective protocol around the crash-safe folder primitives of atomic.h.
 *
 * Save protocol: the writing process (the main one, or each node's local main with
 * save_on_each_node) creates the staging folder; all agree; hooks run; every process writes its
 * own files and the writer the shared ones; all agree; the writer commits (marker last, rename,
 * parent fsync) and only then rotates. Invariant: a process killed at any moment leaves every
 * earlier checkpoint complete, and a checkpoint is complete only when every process's files are.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/atomic.h"
#include "ckpt/state.h"
#include "ckpt/verify.h"
#include "comm/comm.h"
#include "core/profile.h"

typedef struct state_hook {
    int handle;
    int is_load;
    accel_state_hook fn;
    void *ctx;
} state_hook;

typedef struct ckpt_module {
    accel__custom_obj *custom;
    int n_custom, cap_custom;
    state_hook *hooks;
    int n_hooks, cap_hooks, next_handle;
    char *last_dir;
} ckpt_module;

static void module_free(accel *acc, void *state)
{
    (void)acc;
    ckpt_module *m = state;
    accel__free(m->custom);
    accel__free(m->hooks);
    accel__free(m->last_dir);
    accel__free(m);
}

static ckpt_module *module_of(accel *acc)
{
    ckpt_module *m = accel__module(acc, ACCEL__MOD_CKPT);
    if (m == NULL) {
        m = accel__calloc(1, sizeof(*m));
        if (m == NULL) {
            accel__seterr(acc, ACCEL_ENOMEM, "out of memory");
            return NULL;
        }
        m->next_handle = 1;
        accel__module_set(acc, ACCEL__MOD_CKPT, m, module_free);
    }
    return m;
}

/* ---- registry ---- */

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
    ckpt_module *m = module_of(acc);
    if (m == NULL) {
        return ACCEL_ENOMEM;
    }
    if (m->n_custom == m->cap_custom) {
        int cap = m->cap_custom ? m->cap_custom * 2 : 4;
        accel__custom_obj *p = accel__realloc(m->custom, (size_t)cap * sizeof(*p));
        if (p == NULL) {
            return accel__seterr(acc, ACCEL_ENOMEM, "out of memory");
        }
        m->custom = p;
        m->cap_custom = cap;
    }
    m->custom[m->n_custom++] = (accel__custom_obj){save, load, ctx};
    return ACCEL_OK;
}

static accel_status add_hook(accel *acc, int is_load, accel_state_hook fn, void *ctx, int *handle)
{
    if (acc == NULL || fn == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL, "accel_register_%s_state_pre_hook: %s is NULL",
                             is_load ? "load" : "save", acc == NULL ? "acc" : "hook");
    }
    ckpt_module *m = module_of(acc);
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
    ckpt_module *m = acc ? accel__module(acc, ACCEL__MOD_CKPT) : NULL;
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

static accel_status run_hooks(accel *acc, int is_load, const char *dir)
{
    ckpt_module *m = accel__module(acc, ACCEL__MOD_CKPT);
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
    const ckpt_module *m = acc ? accel__module(acc, ACCEL__MOD_CKPT) : NULL;
    return m ? m->last_dir : NULL;
}

int accel_checkpoint_iteration(const accel *acc)
{
    return acc ? acc->opt.iteration : 0;
}

static void set_last_dir(accel *acc, const char *dir)
{
    ckpt_module *m = module_of(acc);
    char *d = accel__strdup(dir);
    if (m != NULL && d != NULL) {
        accel__free(m->last_dir);
        m->last_dir = d;
    } else {
        accel__free(d);
    }
}

/* ---- agreement between processes ---- */

/*
 * Every process contributes its status; all return the worst one (statuses are negative), and
 * a process that did not fail itself gets a message naming the first process that did.
 */
static accel_status agree(accel *acc, accel_status st, const char *what)
{
    if (acc->n_ranks == 1) {
        return st != ACCEL_OK ? accel__adopt_thread_error(acc, st) : ACCEL_OK;
    }
    int32_t v[2] = {st, st != ACCEL_OK ? acc->rank : INT32_MAX}, r[2];
    accel_status cst = accel__allreduce(acc->comm, &v[0], &r[0], 1, ACCEL_I32, ACCEL_MIN);
    if (cst == ACCEL_OK) {
        cst = accel__allreduce(acc->comm, &v[1], &r[1], 1, ACCEL_I32, ACCEL_MIN);
    }
    if (cst != ACCEL_OK) {
        return accel__adopt_thread_error(acc, cst);
    }
    if (st != ACCEL_OK) {
        return accel__adopt_thread_error(acc, st);
    }
    if (r[0] != ACCEL_OK) {
        return accel__seterr(acc, (accel_status)r[0], "%s: process %d failed (%s); see its log",
                             what, (int)r[1], accel_status_name((accel_status)r[0]));
    }
    return ACCEL_OK;
}

/* ---- naming ---- */

static char *checkpoints_base(accel *acc, const char *who)
{
    if (acc->opt.project_dir == NULL || acc->opt.project_dir[0] == '\0') {
        accel__seterr(acc, ACCEL_EINVAL,
                      "%s: automatic_checkpoint_naming needs project_dir (accel_options."
                      "project_dir)",
                      who);
        return NULL;
    }
    char *base = accel__path_join(acc->opt.project_dir, "checkpoints");
    if (base == NULL) {
        accel__adopt_thread_error(acc, ACCEL_ENOMEM);
    }
    return base;
}

static char *auto_dir(const char *base, long long n)
{
    char name[48];
    snprintf(name, sizeof name, "checkpoint_%lld", n);
    return accel__path_join(base, name);
}

/* With automatic naming, a loaded checkpoint_<n> moves the counter past n (Accelerate #1601). */
static void advance_iteration(accel *acc, const char *dir)
{
    if (acc->opt.automatic_checkpoint_naming != 1) {
        return;
    }
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') {
        n--;
    }
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') {
        b--;
    }
    char name[64];
    if (n - b >= sizeof name) {
        return;
    }
    memcpy(name, dir + b, n - b);
    name[n - b] = '\0';
    int64_t it;
    if (accel__ckpt_parse_name(name, &it) && it + 1 > acc->opt.iteration && it < INT_MAX) {
        acc->opt.iteration = (int)(it + 1);
    }
}

/* ---- save ---- */

static int is_writer(const accel *acc)
{
    return acc->opt.save_on_each_node == 1 ? acc->local_rank == 0 : acc->rank == 0;
}

static accel_status save_state(accel *acc, const char *dir)
{
    static const char *who = "accel_save_state";
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: acc is NULL", who);
    }
    int automatic = acc->opt.automatic_checkpoint_naming == 1;
    char *base = NULL, *target = NULL;
    if (automatic) {
        static int warned; /* once per process: the argument is usually constant */
        if (dir != NULL && acc->rank == 0 && !warned) {
            warned = 1;
            accel__log(&acc->log, ACCEL__LOG_WARN,
                       "%s: automatic_checkpoint_naming is on: %s is ignored (as in Accelerate)",
                       who, dir);
        }
        if ((base = checkpoints_base(acc, who)) == NULL) {
            return accel_last_status(acc);
        }
        target = auto_dir(base, acc->opt.iteration);
    } else if (dir == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "%s: dir is NULL and automatic_checkpoint_naming is off", who);
    } else {
        target = accel__strdup(dir);
    }
    accel__stage stage = {0};
    accel_status st = target ? accel__stage_init(&stage, target) : ACCEL_ENOMEM;
    if (st != ACCEL_OK) {
        accel__free(base);
        accel__free(target);
        return accel__adopt_thread_error(acc, st);
    }
    int writer = is_writer(acc);
    if (writer && automatic && accel__is_dir(target)) {
        st = accel__seterr(acc, ACCEL_EINVAL,
                           "%s: checkpoint %s already exists (load_state it first, or set "
                           "accel_options.iteration past it)",
                           who, target);
    } else if (writer && !automatic && accel__is_file(target)) {
        st = accel__seterr(acc, ACCEL_EINVAL, "%s: %s is a file; pass a folder", who, target);
    } else if (writer) {
        st = accel__stage_create(&stage);
    }
    st = agree(acc, st, who);

    accel__state_objs objs = {0};
    accel__state_info info = {0};
    if (st == ACCEL_OK) {
        st = run_hooks(acc, 0, stage.stage_dir);
    }
    if (st == ACCEL_OK) {
        st = accel__state_collect(acc, &objs);
    }
    if (st == ACCEL_OK) {
        ckpt_module *m = accel__module(acc, ACCEL__MOD_CKPT);
        objs.custom = m ? m->custom : NULL;
        objs.n_custom = m ? m->n_custom : 0;
        accel__state_info_now(acc, &objs, &info);
        if (writer) {
            st = accel__state_write_shared(acc, &objs, &info, stage.stage_dir);
        }
        if (st == ACCEL_OK) {
            st = accel__state_write_rank(acc, &objs, &info, stage.stage_dir);
        }
    }
    st = agree(acc, st, who);
    if (st == ACCEL_OK && writer) {
        char *extra = accel__state_info_json(&info, acc->opt.iteration);
        st = extra ? accel__stage_commit(&stage, extra) : ACCEL_ENOMEM;
        free(extra); /* json_dumps: the C allocator */
        if (st == ACCEL_OK && automatic) {
            st = accel__ckpt_rotate_keep(base, acc->opt.total_limit, acc->opt.iteration);
        }
    } else if (st != ACCEL_OK && writer) {
        accel__stage_discard(&stage);
    }
    st = agree(acc, st, who);
    if (st == ACCEL_OK) {
        if (automatic) {
            acc->opt.iteration++;
        }
        set_last_dir(acc, target);
    }
    accel__state_objs_release(&objs);
    accel__stage_release(&stage);
    accel__free(base);
    accel__free(target);
    return st;
}

/* ---- load ---- */

/*
 * Every process resumes at the same place: the accumulation step, sync_gradients, and per
 * loader the epoch, and the batch when both processes' loaders have the same length (uneven
 * loaders legitimately stop at different batches). Files of one checkpoint that disagree are
 * damage, even when each is well-formed.
 */
static accel_status check_in_step(accel *acc, accel__state_plan *p, int n_loaders, const char *dir)
{
    if (acc->n_ranks == 1) {
        return ACCEL_OK;
    }
    int k = ACCEL__STATE_POSITIONS(n_loaders);
    int64_t *all = accel__calloc((size_t)k * (size_t)acc->n_ranks, sizeof(int64_t));
    if (all == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "out of memory");
    }
    int64_t *mine = all + (size_t)acc->rank * (size_t)k;
    accel__state_plan_positions(p, mine);
    accel__coll op =
        ACCEL__COLL(ACCEL__COLL_ALLGATHER, mine, all, (size_t)k, ACCEL_I64, ACCEL_SUM, 0);
    accel_status st = accel__comm_run(acc->comm, &op);
    if (st != ACCEL_OK) {
        accel__free(all);
        return accel__adopt_thread_error(acc, st);
    }
    for (int r = 1; r < acc->n_ranks && st == ACCEL_OK; r++) {
        const int64_t *a = all, *b = all + (size_t)r * (size_t)k;
        if (a[0] != b[0] || a[1] != b[1]) {
            st = accel__seterr(acc, ACCEL_ECORRUPT,
                               "accel_load_state: checkpoint %s is inconsistent: process %d "
                               "resumes at accumulation step %lld (sync %lld), process 0 at %lld "
                               "(sync %lld) (random_states_<process>.json)",
                               dir, r, (long long)b[0], (long long)b[1], (long long)a[0],
                               (long long)a[1]);
        }
        for (int i = 0; i < n_loaders && st == ACCEL_OK; i++) {
            const int64_t *x = a + 2 + 3 * i, *y = b + 2 + 3 * i;
            if (x[0] != y[0] || (x[2] == y[2] && x[1] != y[1])) {
                st = accel__seterr(acc, ACCEL_ECORRUPT,
                                   "accel_load_state: checkpoint %s is inconsistent: loader %d "
                                   "of process %d resumes at epoch %lld, batch %lld, process "
                                   "0's at epoch %lld, batch %lld (dl_state_dict_rank<process>"
                                   ".json)",
                                   dir, i, r, (long long)y[0], (long long)y[1], (long long)x[0],
                                   (long long)x[1]);
            }
        }
    }
    accel__free(all);
    return st;
}

/* Loads folder `src` (the protocol of the file comment); `verified`: the caller already
 * checked its checksums. */
static accel_status load_from(accel *acc, const char *src, int verified)
{
    static const char *who = "accel_load_state";
    accel_status st = ACCEL_OK;
    if (!accel__is_dir(src)) {
        st = accel__seterr(acc, ACCEL_ENOTFOUND, "%s: checkpoint folder %s does not exist", who,
                           src);
    }
    if (st == ACCEL_OK) {
        st = run_hooks(acc, 1, src);
    }
    accel__state_objs objs = {0};
    accel__state_plan *plan = NULL;
    if (st == ACCEL_OK) {
        st = accel__state_collect(acc, &objs);
    }
    if (st == ACCEL_OK) {
        ckpt_module *m = accel__module(acc, ACCEL__MOD_CKPT);
        objs.custom = m ? m->custom : NULL;
        objs.n_custom = m ? m->n_custom : 0;
        st = accel__state_plan_new(acc, &objs, src, verified, &plan);
        if (st != ACCEL_OK) {
            accel__adopt_thread_error(acc, st);
        }
    }
    /* Nothing is modified anywhere unless every process validated its files. */
    st = agree(acc, st, who);
    if (st == ACCEL_OK) {
        st = check_in_step(acc, plan, objs.n_loaders, src);
    }
    if (st == ACCEL_OK) {
        st = accel__state_plan_apply(acc, plan);
    }
    st = agree(acc, st, who);
    if (st == ACCEL_OK) {
        advance_iteration(acc, src);
        set_last_dir(acc, src);
    }
    accel__state_plan_free(plan);
    accel__state_objs_release(&objs);
    return st;
}

/* Every "checkpoint_<n>" folder in base (complete or not), ascending, as decided by the main
 * process for everyone. */
static accel_status list_candidates(accel *acc, const char *base, int64_t **out, int64_t *count)
{
    int64_t *its = NULL, n = 0;
    accel_status st = ACCEL_OK;
    if (acc->rank == 0) {
        size_t cnt = 0;
        st = accel__ckpt_list_all(base, &its, &cnt);
        n = (int64_t)cnt;
    }
    st = agree(acc, st, "accel_load_state");
    if (st == ACCEL_OK && acc->n_ranks > 1) {
        st = accel__broadcast(acc->comm, &n, 1, ACCEL_I64, 0);
        st = st != ACCEL_OK ? accel__adopt_thread_error(acc, st) : ACCEL_OK;
        if (st == ACCEL_OK && acc->rank != 0 && n > 0) {
            its = accel__calloc((size_t)n, sizeof(int64_t));
            st = its ? ACCEL_OK : accel__seterr(acc, ACCEL_ENOMEM, "out of memory");
        }
        if (st == ACCEL_OK) {
            st = agree(acc, st, "accel_load_state"); /* everyone has room for the list */
        }
        if (st == ACCEL_OK && n > 0) {
            st = accel__broadcast(acc->comm, its, (size_t)n, ACCEL_I64, 0);
            st = st != ACCEL_OK ? accel__adopt_thread_error(acc, st) : ACCEL_OK;
        }
    }
    if (st != ACCEL_OK) {
        accel__free(its);
        return st;
    }
    *out = its;
    *count = n;
    return ACCEL_OK;
}

/*
 * load_state(NULL) with automatic naming: the newest checkpoint whose marker, sizes and
 * checksums verify. A damaged one is skipped with a warning naming it, its file and the reason
 * (on the process that found it); when every folder is damaged the result is ACCEL_ECORRUPT
 * listing them (ACCEL_ENOTFOUND only when there is no checkpoint at all). The counter then
 * moves past every folder, damaged ones included, so the next save never collides.
 */
static accel_status load_newest(accel *acc)
{
    static const char *who = "accel_load_state";
    char *base = checkpoints_base(acc, who);
    if (base == NULL) {
        return accel_last_status(acc);
    }
    int64_t *its = NULL, n = 0;
    accel_status st = list_candidates(acc, base, &its, &n);
    if (st == ACCEL_OK && n == 0) {
        st = accel__seterr(acc, ACCEL_ENOTFOUND, "%s: no checkpoint in %s", who, base);
    }
    char skipped[400] = "", newest_why[ACCEL__ERRMSG_NBYTES] = "";
    int64_t chosen = -1;
    for (int64_t i = n - 1; st == ACCEL_OK && i >= 0 && chosen < 0; i--) {
        char *dir = auto_dir(base, its[i]);
        if (dir == NULL) {
            st = accel__adopt_thread_error(acc, ACCEL_ENOMEM);
            break;
        }
        accel_status vst = accel__ckpt_verify(dir, acc->local_rank, acc->local_n_ranks, NULL);
        if (vst == ACCEL_ECORRUPT) {
            accel__log(&acc->log, ACCEL__LOG_WARN, "%s: skipping damaged checkpoint: %s", who,
                       accel_last_error(NULL));
        }
        vst = agree(acc, vst, who);
        if (vst == ACCEL_OK) {
            chosen = its[i];
        } else if (vst == ACCEL_ECORRUPT) {
            if (newest_why[0] == '\0') {
                snprintf(newest_why, sizeof newest_why, "%s", accel_last_error(acc));
            }
            size_t len = strlen(skipped);
            snprintf(skipped + len, sizeof skipped - len, "%scheckpoint_%lld", len ? ", " : "",
                     (long long)its[i]);
        } else {
            st = vst;
        }
        accel__free(dir);
    }
    if (st == ACCEL_OK && chosen < 0) {
        st = accel__seterr(acc, ACCEL_ECORRUPT,
                           "%s: no valid checkpoint in %s: %s %s damaged (each named in a "
                           "warning); the newest: %s",
                           who, base, skipped, n > 1 ? "are all" : "is", newest_why);
    }
    if (st == ACCEL_OK) {
        char *dir = auto_dir(base, chosen);
        st = dir ? load_from(acc, dir, 1) : accel__adopt_thread_error(acc, ACCEL_ENOMEM);
        accel__free(dir);
    }
    if (st == ACCEL_OK && its[n - 1] + 1 > acc->opt.iteration && its[n - 1] < INT_MAX) {
        acc->opt.iteration = (int)(its[n - 1] + 1); /* past every folder, damaged ones too */
    }
    accel__free(its);
    accel__free(base);
    return st;
}

static accel_status load_state(accel *acc, const char *dir)
{
    static const char *who = "accel_load_state";
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: acc is NULL", who);
    }
    if (dir != NULL) {
        return load_from(acc, dir, 0);
    }
    if (acc->opt.automatic_checkpoint_naming == 1) {
        return load_newest(acc);
    }
    return accel__seterr(acc, ACCEL_EINVAL,
                         "%s: dir is NULL and automatic_checkpoint_naming is off", who);
}

/* The public entry: the whole call as one "save_state" range in the profiler trace. */
accel_status accel_save_state(accel *acc, const char *dir)
{
    accel__prof_begin(acc, "save_state", ACCEL__PROF_CKPT);
    accel_status st = save_state(acc, dir);
    accel__prof_end(acc);
    return st;
}

/* The public entry: the whole call as one "load_state" range in the profiler trace. */
accel_status accel_load_state(accel *acc, const char *dir)
{
    accel__prof_begin(acc, "load_state", ACCEL__PROF_CKPT);
    accel_status st = load_state(acc, dir);
    accel__prof_end(acc);
    return st;
}
