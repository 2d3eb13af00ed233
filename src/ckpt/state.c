/*
 * save_state / load_state orchestration: folder naming (explicit, or ProjectConfiguration's
 * project_dir/checkpoints/checkpoint_<n>, with the automatic counter `iteration`, kept in
 * the module's state of state_registry.c) and the collective protocol around the crash-safe
 * folder primitives of atomic.h; the registered objects and pre-hooks are state_registry.c's.
 *
 * Save protocol: the writing process (the main one, or each node's local main with
 * save_on_each_node) creates the staging folder; all agree; hooks run; every process writes its
 * own files and the writer the shared ones; all agree; the writer commits (marker last, rename,
 * parent fsync) and only then rotates. Invariant: a process killed at any moment leaves every
 * earlier checkpoint complete, and a checkpoint is complete only when every process's files are.
 *
 * Load protocol: every process plans (verifies, opens, validates); all agree; positions are
 * compared; the fused load's copies run with their checksums (only when the live state has
 * nothing to lose, nothing_to_lose below); all agree; the rest is applied; all agree.
 * Invariant: with something to lose, a refused load modifies nothing; a refused fused load
 * leaves acc->partial_load set, which optimizer steps and saves refuse, until a load succeeds.
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
#include "core/settings.h"

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
    if (acc->settings->ckpt.project_dir == NULL || acc->settings->ckpt.project_dir[0] == '\0') {
        accel__seterr(acc, ACCEL_EINVAL,
                      "%s: automatic_checkpoint_naming needs project_dir (accel_options."
                      "project_dir)",
                      who);
        return NULL;
    }
    char *base = accel__path_join(acc->settings->ckpt.project_dir, "checkpoints");
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
    if (acc->settings->ckpt.automatic_checkpoint_naming != 1) {
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
    accel__ckpt_module *m = accel__module(acc, ACCEL__MOD_CKPT);
    if (accel__ckpt_parse_name(name, &it) && it + 1 > m->iteration && it < INT_MAX) {
        m->iteration = (int)(it + 1);
    }
}

/* ---- save ---- */

static int is_writer(const accel *acc)
{
    return acc->settings->ckpt.save_on_each_node == 1 ? acc->local_rank == 0 : acc->rank == 0;
}

static accel_status save_state(accel *acc, const char *dir)
{
    static const char *who = "accel_save_state";
    if (acc == NULL) {
        return accel__seterr(NULL, ACCEL_EINVAL, "%s: acc is NULL", who);
    }
    accel__ckpt_module *m = accel__ckpt_module_of(acc);
    if (m == NULL) {
        return ACCEL_ENOMEM;
    }
    if (acc->partial_load[0] != '\0') {
        return accel__seterr(acc, ACCEL_ESTATE, "%s: refused: %s", who, acc->partial_load);
    }
    int automatic = acc->settings->ckpt.automatic_checkpoint_naming == 1;
    char *base = NULL, *target = NULL;
    if (automatic) {
        if (dir != NULL && acc->rank == 0 && !m->warned_auto_dir) {
            m->warned_auto_dir = 1; /* once: the argument is usually constant */
            accel__log(&acc->log, ACCEL__LOG_WARN,
                       "%s: automatic_checkpoint_naming is on: %s is ignored (as in Accelerate)",
                       who, dir);
        }
        if ((base = checkpoints_base(acc, who)) == NULL) {
            return accel_last_status(acc);
        }
        target = auto_dir(base, m->iteration);
    } else if (dir == NULL) {
        return accel__seterr(acc, ACCEL_EINVAL,
                             "%s: dir is NULL and automatic_checkpoint_naming is off", who);
    } else {
        target = accel__strdup(dir);
    }
    accel__stage stage = {0};
    accel_status st = target ? accel__stage_init(&stage, target) : ACCEL_ENOMEM;
    int writer = is_writer(acc);
    /* The staging path is this process's to discard after a failure once it holds the save lock
     * and has tried to make the folder: a failed try may have left part of it (a stale folder
     * half removed, a new one not yet fsynced), and no other process may touch it. */
    int ours = 0;
    if (st != ACCEL_OK) {
        /* A dir that names no folder ("", "."): agreed below like every other refusal, so
         * processes given other dirs fail with it instead of waiting for this one. */
    } else if (writer && (st = accel__stage_lock(&stage)) != ACCEL_OK) {
        /* Another job saves the same folder right now: held from before the existence check
         * to the end of the rotation, so neither removes, mixes or replaces the other's. */
        if (st == ACCEL_ESTATE) {
            char cause[1024];
            snprintf(cause, sizeof cause, "%s", accel_last_error(NULL));
            st = accel__seterr(acc, st, "%s: %s%s", who, cause,
                               acc->settings->ckpt.save_on_each_node == 1
                                   ? " (with save_on_each_node, another node of this job may "
                                     "share the file system: the option is for nodes that do not)"
                                   : "");
        }
    } else if (writer && automatic && accel__is_dir(target)) {
        st = accel__seterr(acc, ACCEL_EINVAL,
                           "%s: checkpoint %s already exists (load_state it first, or set "
                           "accel_options.iteration past it)",
                           who, target);
    } else if (writer && !automatic && accel__is_file(target)) {
        st = accel__seterr(acc, ACCEL_EINVAL, "%s: %s is a file; pass a folder", who, target);
    } else if (writer) {
        ours = 1;
        st = accel__stage_create(&stage);
    }
    st = agree(acc, st, who);

    accel__state_objs objs = {0};
    accel__state_saves saves = {0};
    accel__state_info info = {0};
    if (st == ACCEL_OK) {
        st = accel__ckpt_run_hooks(acc, 0, stage.stage_dir);
    }
    if (st == ACCEL_OK) {
        st = accel__state_collect(acc, &objs);
    }
    /* Every process saves every object's shared part, so sharded objects (whose pieces are
     * spread over the processes) are found and checked together before anything is written. */
    if (st == ACCEL_OK) {
        st = accel__state_save_shared(acc, &objs, writer, &saves);
    }
    st = agree(acc, st, who);
    if (st == ACCEL_OK) {
        st = accel__state_shard_decide(acc, &saves);
    }
    if (st == ACCEL_OK) {
        info.num_processes = acc->n_ranks;
        memcpy(info.n, objs.n, sizeof info.n);
        st = accel__state_write_shared(acc, &saves, stage.stage_dir, writer);
        if (st == ACCEL_OK) {
            st = accel__state_write_rank(acc, &objs, stage.stage_dir, &info);
        }
    }
    st = agree(acc, st, who);
    if (st == ACCEL_OK && writer) {
        char *extra = accel__state_info_json(&info, m->iteration);
        st = extra ? accel__stage_commit(&stage, extra) : ACCEL_ENOMEM;
        free(extra); /* json_dumps: the C allocator */
        if (st == ACCEL_OK && automatic) {
            st = accel__ckpt_rotate_keep(base, acc->settings->ckpt.total_limit, m->iteration);
        }
    } else if (st != ACCEL_OK && ours) {
        accel__stage_discard(&stage);
    }
    st = agree(acc, st, who);
    if (st == ACCEL_OK) {
        if (automatic) {
            m->iteration++;
        }
        accel__ckpt_set_last_dir(acc, target);
    }
    accel__state_saves_release(&saves);
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
static accel_status check_in_step(accel *acc, const accel__state_plan *p, const char *dir)
{
    if (acc->n_ranks == 1) {
        return ACCEL_OK;
    }
    /* Every process has the same objects (checked against the marker), so the same count. */
    size_t k = 2 + 3 * accel__state_plan_n_positions(p);
    int64_t *all = accel__calloc(k * (size_t)acc->n_ranks, sizeof(int64_t));
    if (all == NULL) {
        return accel__seterr(acc, ACCEL_ENOMEM, "out of memory");
    }
    int64_t *mine = all + (size_t)acc->rank * k;
    memcpy(mine, accel__state_plan_positions(p), k * sizeof(int64_t));
    accel__coll op = ACCEL__COLL(ACCEL__COLL_ALLGATHER, mine, all, k, ACCEL_I64, ACCEL_SUM, 0);
    accel_status st = accel__comm_run(acc->comm, &op);
    if (st != ACCEL_OK) {
        accel__free(all);
        return accel__adopt_thread_error(acc, st);
    }
    for (int r = 1; r < acc->n_ranks && st == ACCEL_OK; r++) {
        const int64_t *a = all, *b = all + (size_t)r * k;
        if (a[0] != b[0] || a[1] != b[1]) {
            st = accel__seterr(acc, ACCEL_ECORRUPT,
                               "accel_load_state: checkpoint %s is inconsistent: process %d "
                               "resumes at accumulation step %lld (sync %lld), process 0 at %lld "
                               "(sync %lld) (random_states_<process>.json)",
                               dir, r, (long long)b[0], (long long)b[1], (long long)a[0],
                               (long long)a[1]);
        }
        for (size_t i = 0; 2 + 3 * i < k && st == ACCEL_OK; i++) {
            const int64_t *x = a + 2 + 3 * i, *y = b + 2 + 3 * i;
            if (x[0] != y[0] || (x[2] == y[2] && x[1] != y[1])) {
                const char *noun, *file;
                int index;
                accel__state_plan_position_owner(p, i, &noun, &index, &file);
                st = accel__seterr(acc, ACCEL_ECORRUPT,
                                   "accel_load_state: checkpoint %s is inconsistent: %s %d of "
                                   "process %d resumes at epoch %lld, batch %lld, process 0's at "
                                   "epoch %lld, batch %lld (%s<process>.json)",
                                   dir, noun, index, r, (long long)y[0], (long long)y[1],
                                   (long long)x[0], (long long)x[1], file);
            }
        }
    }
    accel__free(all);
    return st;
}

/*
 * Whether the live state has nothing a load could lose (the fused load, docs/checkpoint.md
 * "Fast verified loads"): no optimizer has stepped and no load succeeded since accel_init, so
 * the weights are the ones the program made before loading and makes again when rerun; or a
 * refused fused load left them partly written already.
 */
static int nothing_to_lose(accel *acc)
{
    const accel__ckpt_module *m = accel__module(acc, ACCEL__MOD_CKPT);
    if (m != NULL && m->fused_mode != ACCEL__FUSED_AUTO) {
        return m->fused_mode == ACCEL__FUSED_ALWAYS;
    }
    if (acc->partial_load[0] != '\0') {
        return 1;
    }
    if (m != NULL && m->loaded) {
        return 0;
    }
    for (const accel__object *o = acc->objects; o != NULL; o = o->next) {
        if (o->kind == ACCEL__OBJ_OPTIMIZER &&
            accel_optimizer_num_steps((const accel_optimizer *)o) > 0) {
            return 0;
        }
    }
    return 1;
}

void accel__ckpt_set_fused_mode(accel *acc, accel__fused_mode mode)
{
    accel__ckpt_module *m = accel__ckpt_module_of(acc);
    if (m != NULL) {
        m->fused_mode = mode;
    }
}

/* A fused load refused after writing tensors: steps and saves refuse until a load succeeds. */
static void mark_partial(accel *acc, const char *src)
{
    snprintf(acc->partial_load, sizeof acc->partial_load,
             "the model and optimizer state are partly loaded from checkpoint %s, which "
             "accel_load_state refused after writing part of it (the live state had nothing to "
             "lose: no step since accel_init); load a valid checkpoint or restart the program",
             src);
}

/* Loads folder `src` (the protocol of the file comment); `verified`: the marker of the
 * caller's verification of it (taken), or NULL. */
static accel_status load_from(accel *acc, const char *src, accel__ckpt_marker *verified)
{
    static const char *who = "accel_load_state";
    accel_status st = ACCEL_OK;
    if (!accel__is_dir(src)) {
        st = accel__seterr(acc, ACCEL_ENOTFOUND, "%s: checkpoint folder %s does not exist", who,
                           src);
    }
    if (st == ACCEL_OK) {
        st = accel__ckpt_run_hooks(acc, 1, src);
    }
    accel__state_objs objs = {0};
    accel__state_plan *plan = NULL;
    if (st == ACCEL_OK) {
        st = accel__state_collect(acc, &objs);
    }
    /* The same on every process: steps and loads are collective. */
    int fused = verified == NULL && nothing_to_lose(acc);
    if (st == ACCEL_OK) {
        st = accel__state_plan_new(acc, &objs, src, verified, fused, &plan);
        if (st != ACCEL_OK) {
            accel__adopt_thread_error(acc, st);
        }
    } else if (verified != NULL) {
        accel__ckpt_marker_release(verified);
    }
    /* Nothing is modified anywhere unless every process validated its files (the fused load:
     * every file but those it checks while copying). */
    st = agree(acc, st, who);
    if (st == ACCEL_OK) {
        st = check_in_step(acc, plan, src);
    }
    int written = 0;
    if (st == ACCEL_OK) {
        written = fused;
        st = agree(acc, accel__state_plan_apply_fused(plan, src), who);
    }
    if (st == ACCEL_OK) {
        st = accel__state_plan_apply(acc, plan);
    }
    st = agree(acc, st, who);
    if (st == ACCEL_OK) {
        advance_iteration(acc, src);
        accel__ckpt_set_last_dir(acc, src);
        acc->partial_load[0] = '\0';
        accel__ckpt_module *m = accel__module(acc, ACCEL__MOD_CKPT);
        m->loaded = 1; /* load_state made the module (module_of) */
    } else if (written) {
        char why[ACCEL__ERRMSG_NBYTES];
        snprintf(why, sizeof why, "%s", accel_last_error(acc));
        mark_partial(acc, src);
        st = accel__seterr(acc, st, "%s; %s", why, acc->partial_load);
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
    int loaded = 0; /* the fused path loaded the chosen folder already */
    accel_status st = list_candidates(acc, base, &its, &n);
    if (st == ACCEL_OK && n == 0) {
        st = accel__seterr(acc, ACCEL_ENOTFOUND, "%s: no checkpoint in %s", who, base);
    }
    char skipped[400] = "", newest_why[ACCEL__ERRMSG_NBYTES] = "";
    int64_t chosen = -1;
    accel__ckpt_marker marker = {0};
    /* With nothing to lose, each candidate is checked for completeness only and loaded fused
     * (its checksums checked while copying); a damaged one is then skipped after the load
     * refused it, the state marked partly loaded until a later candidate loads. */
    int fused = nothing_to_lose(acc);
    for (int64_t i = n - 1; st == ACCEL_OK && i >= 0 && chosen < 0; i--) {
        char *dir = auto_dir(base, its[i]);
        if (dir == NULL) {
            st = accel__adopt_thread_error(acc, ACCEL_ENOMEM);
            break;
        }
        /* The chosen folder's marker keeps the verified mappings, loaded from below. */
        accel_status vst =
            fused ? accel__ckpt_check_complete(dir)
                  : accel__ckpt_verify(dir, acc->local_rank, acc->local_n_ranks, &marker);
        if (vst == ACCEL_ECORRUPT) {
            accel__log(&acc->log, ACCEL__LOG_WARN, "%s: skipping damaged checkpoint: %s", who,
                       accel_last_error(NULL));
        }
        if (vst != ACCEL_OK) {
            memset(&marker, 0, sizeof marker); /* verify returned none */
        }
        vst = agree(acc, vst, who);
        if (vst != ACCEL_OK) {
            accel__ckpt_marker_release(&marker); /* maybe verified here, damaged elsewhere */
        }
        if (vst == ACCEL_OK && fused) {
            /* Damage found while loading is skipped like damage found before; any other
             * failure is the caller's to see, as for a named folder (below). */
            vst = load_from(acc, dir, NULL);
            loaded = vst == ACCEL_OK;
            if (vst == ACCEL_ECORRUPT) {
                accel__log(&acc->log, ACCEL__LOG_WARN, "%s: skipping damaged checkpoint: %s", who,
                           accel_last_error(acc));
            }
        }
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
        int add = acc->partial_load[0] != '\0' && strstr(newest_why, "partly loaded") == NULL;
        st = accel__seterr(acc, ACCEL_ECORRUPT,
                           "%s: no valid checkpoint in %s: %s %s damaged (each named in a "
                           "warning); the newest: %s%s%s",
                           who, base, skipped, n > 1 ? "are all" : "is", newest_why,
                           add ? "; " : "", add ? acc->partial_load : "");
    }
    if (st == ACCEL_OK && !loaded) {
        char *dir = auto_dir(base, chosen);
        st = dir ? load_from(acc, dir, &marker) : accel__adopt_thread_error(acc, ACCEL_ENOMEM);
        accel__free(dir);
    }
    if (marker.files != NULL) { /* not handed to load_from */
        accel__ckpt_marker_release(&marker);
    }
    accel__ckpt_module *m = accel__module(acc, ACCEL__MOD_CKPT);
    if (st == ACCEL_OK && its[n - 1] + 1 > m->iteration && its[n - 1] < INT_MAX) {
        m->iteration = (int)(its[n - 1] + 1); /* past every folder, damaged ones too */
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
    if (accel__ckpt_module_of(acc) == NULL) { /* the counter a loaded checkpoint_<n> moves */
        return ACCEL_ENOMEM;
    }
    if (dir != NULL) {
        return load_from(acc, dir, NULL);
    }
    if (acc->settings->ckpt.automatic_checkpoint_naming == 1) {
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
