/*
 * The check that every process of a job resolved the same settings (accel__settings_agree):
 * two machines with different config files, or a variable exported on one machine only, would
 * otherwise train something else without a word (one process in bf16, another in fp16), or
 * hang much later. Invariant: every process takes the same branch, because every decision is
 * made from the results of collectives that every process receives alike; so a difference is
 * ACCEL_EINVAL with the same message on every process, and none is left waiting.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "internal.h"
#include "settings.h"

/* How an option field is compared across processes. MUST is 0, so a field added to
 * ACCEL__OPTION_FIELDS must agree unless it is exempted here (and in docs/configuration.md). */
typedef enum rule {
    MUST,       /* the same value on every process */
    MAY_DIFFER, /* per process or per machine by nature */
    WHETHER_SET /* a path that may differ per machine, but set on every process or on none */
} rule;

static const rule rules[ACCEL__OPT_COUNT] = {
    /* The flag only forces the CPU: a machine without a GPU runs on the CPU whatever it says,
     * so the flag's agreement would not make the devices agree. */
    [ACCEL__OPT_cpu] = MAY_DIFFER,
    /* Where each machine keeps its file; the values read from it are compared. */
    [ACCEL__OPT_config_file] = MAY_DIFFER,
    /* Mount points differ per machine; whether checkpoints, trackers or a resume happen
     * must not. */
    [ACCEL__OPT_project_dir] = WHETHER_SET,
    [ACCEL__OPT_logging_dir] = WHETHER_SET,
    [ACCEL__OPT_resume_from_checkpoint] = WHETHER_SET,
};

/* Longest value and source a message shows: two of each and the message's words fit the 1 KiB
 * error message (only a long list of other differing fields gets its end cut). */
#define VALUE_NBYTES 160
#define SOURCE_NBYTES 280

/* One process's value of one field, as the allgather after a difference moves it. */
typedef struct record {
    int64_t digest;
    char value[VALUE_NBYTES];
    char source[SOURCE_NBYTES];
} record;

/* Copies s into dst (nbytes), cut to fit: a message shows the start of a very long path. */
static void copy_cut(char *dst, size_t nbytes, const char *s)
{
    size_t n = strlen(s);
    n = n < nbytes - 1 ? n : nbytes - 1;
    memcpy(dst, s, n);
    dst[n] = '\0';
}

static const char *string_field(const accel *acc, accel__option_id id)
{
    switch (id) {
    case ACCEL__OPT_project_dir:
        return acc->opt.project_dir;
    case ACCEL__OPT_logging_dir:
        return acc->opt.logging_dir;
    case ACCEL__OPT_resume_from_checkpoint:
        return acc->opt.resume_from_checkpoint;
    default:
        return NULL;
    }
}

/* The text that is compared (canon) and the text a message shows (shown) of field id. */
static void field_texts(const accel *acc, accel__option_id id, char *canon, char *shown,
                        size_t nbytes)
{
    if (id == ACCEL__OPT_backend) {
        /* The resolved backend (accel_options.backend is only the request). */
        snprintf(shown, nbytes, "%s", acc->backend);
    } else {
        accel__settings_format(&acc->opt, id, shown, nbytes);
    }
    snprintf(canon, nbytes, "%s", shown);
    if (rules[id] == WHETHER_SET) {
        /* "" counts as unset, as where the modules read these; resume's "latest" is a mode,
         * not a path, so it must agree as such. */
        const char *v = string_field(acc, id);
        int set = v != NULL && v[0] != '\0';
        int latest = set && id == ACCEL__OPT_resume_from_checkpoint && strcmp(v, "latest") == 0;
        snprintf(canon, nbytes, "%s", latest ? "latest" : set ? "a path" : "none");
        if (!set) {
            snprintf(shown, nbytes, "(none)");
        }
    } else if (id == ACCEL__OPT_log_with && (acc->opt.log_with == NULL || !acc->opt.log_with[0])) {
        snprintf(canon, nbytes, "(none)"); /* "" starts no tracker, as NULL */
    }
}

/* This process's digest of each field (0 for fields that may differ). */
static void digests(const accel *acc, int64_t *d)
{
    char canon[ACCEL__SOURCE_NBYTES], shown[ACCEL__SOURCE_NBYTES];
    for (int i = 0; i < ACCEL__OPT_COUNT; i++) {
        d[i] = 0;
        if (rules[i] != MAY_DIFFER) {
            field_texts(acc, (accel__option_id)i, canon, shown, sizeof(canon));
            d[i] = (int64_t)accel__fnv1a_str(canon); /* unseeded: alike on every process */
        }
    }
}

/* Every process learns each one's value and source of field `id` and returns the same
 * ACCEL_EINVAL; `others` names the other fields that differ. */
static accel_status report(accel *acc, accel__option_id id, const int64_t *digest,
                           const char *others)
{
    char canon[ACCEL__SOURCE_NBYTES], shown[ACCEL__SOURCE_NBYTES];
    record mine;
    memset(&mine, 0, sizeof(mine));
    field_texts(acc, id, canon, shown, sizeof(canon));
    mine.digest = digest[id];
    copy_cut(mine.value, sizeof(mine.value), shown);
    const char *src = accel_setting_source(acc, accel__settings_field_name(id));
    copy_cut(mine.source, sizeof(mine.source), src != NULL ? src : "?");

    int n = acc->n_ranks;
    record *all = accel__malloc((size_t)n * sizeof(record));
    if (all == NULL) {
        /* The others then see this process leave the exchange (EPEER naming it). */
        return accel__seterr(NULL, ACCEL_ENOMEM, "accel_init: out of memory");
    }
    accel__coll op =
        ACCEL__COLL(ACCEL__COLL_ALLGATHER, &mine, all, sizeof(record), ACCEL_U8, ACCEL_SUM, 0);
    accel_status st = accel__comm_run(acc->comm, &op);
    if (st != ACCEL_OK) {
        accel__free(all);
        return st; /* the communicator's message names the process at fault */
    }
    /* Process 0 and the first process that differs from it (one does: the digests' minimum
     * and maximum differ), and how many differ. */
    int first = -1, n_differ = 0;
    for (int r = 1; r < n; r++) {
        if (all[r].digest != all[0].digest) {
            first = first < 0 ? r : first;
            n_differ++;
        }
    }
    ACCEL_ASSERT(first > 0); /* two values differ, so one differs from process 0's */
    char many[64] = "";
    if (n_differ > 1) {
        snprintf(many, sizeof(many), " (the first of %d that differ from process 0)", n_differ);
    }
    const record *a = &all[0], *b = &all[first];
    st = accel__seterr(
        NULL, ACCEL_EINVAL,
        "accel_init: processes disagree on %s: process 0 has %s (%s), process %d%s has %s (%s) "
        "(every process of a job must resolve the same settings%s%s%s)",
        accel__settings_field_name(id), a->value, a->source, first, many, b->value, b->source,
        rules[id] == WHETHER_SET ? "; the path may differ per machine, but it must be set on "
                                   "every process or on none"
                                 : "",
        others[0] != '\0' ? "; they also disagree on " : "", others);
    accel__free(all);
    return st;
}

accel_status accel__settings_agree(accel *acc)
{
    if (acc->n_ranks == 1) {
        return ACCEL_OK;
    }
    /* One allreduce (max) of each digest and of its complement: max(~d) = ~min(d), so the
     * minimum and the maximum of every field come back in one call. */
    int64_t mine[2 * ACCEL__OPT_COUNT], ext[2 * ACCEL__OPT_COUNT];
    digests(acc, mine);
    for (int i = 0; i < ACCEL__OPT_COUNT; i++) {
        mine[ACCEL__OPT_COUNT + i] = ~mine[i];
    }
    ACCEL_TRY(accel__allreduce(acc->comm, mine, ext, 2 * ACCEL__OPT_COUNT, ACCEL_I64, ACCEL_MAX));
    int first = -1;
    char others[256] = "";
    size_t used = 0;
    for (int i = 0; i < ACCEL__OPT_COUNT; i++) {
        if (ext[i] == ~ext[ACCEL__OPT_COUNT + i]) {
            continue; /* the maximum is the minimum: every process has the same */
        }
        if (first < 0) {
            first = i;
        } else if (used < sizeof(others)) {
            int w = snprintf(others + used, sizeof(others) - used, "%s%s", used ? ", " : "",
                             accel__settings_field_name((accel__option_id)i));
            used += w > 0 ? (size_t)w : 0;
        }
    }
    return first < 0 ? ACCEL_OK : report(acc, (accel__option_id)first, mine, others);
}
