/*
 * The YAML document tree of ytree.h: libyaml's event parser builds it, libyaml's emitter (or
 * jansson, for .json files) writes it. Invariant: every node is owned by exactly one parent
 * (or the caller for the root); keys of a mapping are unique.
 */
#include "base/ytree.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "base/base.h"
#include "base/fs.h"

#define MAX_DEPTH 32

static accel__ynode *new_node(accel__ykind kind)
{
    accel__ynode *n = accel__calloc(1, sizeof(*n));
    if (n == NULL) {
        accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
        return NULL;
    }
    n->kind = kind;
    return n;
}

accel__ynode *accel__ynode_scalar(const char *text, int quoted)
{
    accel__ynode *n = new_node(ACCEL__Y_SCALAR);
    if (n != NULL && (n->text = accel__strdup(text)) == NULL) {
        accel__free(n);
        accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
        return NULL;
    }
    if (n != NULL) {
        n->quoted = quoted;
    }
    return n;
}

accel__ynode *accel__ynode_map(void)
{
    return new_node(ACCEL__Y_MAP);
}

accel__ynode *accel__ynode_seq(void)
{
    return new_node(ACCEL__Y_SEQ);
}

void accel__ynode_free(accel__ynode *n)
{
    if (n == NULL) {
        return;
    }
    for (int i = 0; i < n->n; i++) {
        if (n->keys != NULL) {
            accel__free(n->keys[i]);
        }
        accel__ynode_free(n->items[i]);
    }
    accel__free(n->keys);
    accel__free(n->items);
    accel__free(n->text);
    accel__free(n);
}

static int find_key(const accel__ynode *map, const char *key)
{
    for (int i = 0; map != NULL && map->kind == ACCEL__Y_MAP && i < map->n; i++) {
        if (strcmp(map->keys[i], key) == 0) {
            return i;
        }
    }
    return -1;
}

accel__ynode *accel__ynode_get(const accel__ynode *map, const char *key)
{
    int i = find_key(map, key);
    return i < 0 ? NULL : map->items[i];
}

accel__ynode *accel__ynode_path(const accel__ynode *root, const char *path)
{
    const accel__ynode *n = root;
    char key[128];
    while (n != NULL && *path != '\0') {
        size_t len = strcspn(path, ".");
        if (len >= sizeof(key)) {
            return NULL;
        }
        memcpy(key, path, len);
        key[len] = '\0';
        n = accel__ynode_get(n, key);
        path += len + (path[len] == '.');
    }
    return (accel__ynode *)n;
}

/* Appends (key, v) to a mapping, or v to a sequence (key NULL). Takes v in every case. The
 * arrays grow by doubling (they hold at least the next power of two of n entries; remove never
 * shrinks them), so a file of many entries is read in linear time. */
static accel_status push(accel__ynode *parent, const char *key, accel__ynode *v)
{
    size_t have = (size_t)parent->n;
    size_t n = have == 0 ? 1 : (have & (have - 1)) == 0 ? 2 * have : have + 1;
    accel__ynode **items = parent->items;
    char **keys = parent->keys;
    if (have == 0 || (have & (have - 1)) == 0) {
        items = accel__realloc(parent->items, n * sizeof(*items));
        if (items != NULL) {
            parent->items = items;
        }
        if (items != NULL && key != NULL) {
            keys = accel__realloc(parent->keys, n * sizeof(*keys));
            if (keys != NULL) {
                parent->keys = keys;
            }
        }
    }
    char *k = key != NULL ? accel__strdup(key) : NULL;
    if (items == NULL || (key != NULL && (keys == NULL || k == NULL))) {
        accel__free(k);
        accel__ynode_free(v);
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    if (key != NULL) {
        parent->keys[parent->n] = k;
    }
    parent->items[parent->n++] = v;
    return ACCEL_OK;
}

accel_status accel__ynode_set(accel__ynode *map, const char *key, accel__ynode *v)
{
    ACCEL_ASSERT(map->kind == ACCEL__Y_MAP);
    if (v == NULL) {
        return ACCEL_ENOMEM; /* a builder failed; its error is set */
    }
    int i = find_key(map, key);
    if (i >= 0) {
        accel__ynode_free(map->items[i]);
        map->items[i] = v;
        return ACCEL_OK;
    }
    return push(map, key, v);
}

accel_status accel__ynode_append(accel__ynode *seq, accel__ynode *v)
{
    ACCEL_ASSERT(seq->kind == ACCEL__Y_SEQ);
    return v == NULL ? ACCEL_ENOMEM : push(seq, NULL, v);
}

void accel__ynode_remove(accel__ynode *map, const char *key)
{
    int i = find_key(map, key);
    if (i < 0) {
        return;
    }
    accel__free(map->keys[i]);
    accel__ynode_free(map->items[i]);
    memmove(map->keys + i, map->keys + i + 1, (size_t)(map->n - i - 1) * sizeof(char *));
    memmove(map->items + i, map->items + i + 1, (size_t)(map->n - i - 1) * sizeof(accel__ynode *));
    map->n--;
}

int accel__yscalar_is_null(const accel__ynode *n)
{
    if (n == NULL || n->kind != ACCEL__Y_SCALAR || n->quoted) {
        return 0;
    }
    const char *t = n->text;
    return t[0] == '\0' || strcmp(t, "~") == 0 || strcmp(t, "null") == 0 ||
           strcmp(t, "Null") == 0 || strcmp(t, "NULL") == 0 || strcmp(t, "None") == 0;
}

/* ---- parsing ---- */

typedef struct parse_ctx {
    yaml_parser_t p;
    const char *path;
} parse_ctx;

static accel_status yaml_error(parse_ctx *c)
{
    return accel__seterr(NULL, ACCEL_EINVAL, "config file %s: YAML error at line %zu: %s%s%s",
                         c->path, c->p.problem_mark.line + 1,
                         c->p.problem ? c->p.problem : "malformed",
                         c->p.context ? " " : "", c->p.context ? c->p.context : "");
}

static accel_status next_event(parse_ctx *c, yaml_event_t *ev)
{
    return yaml_parser_parse(&c->p, ev) ? ACCEL_OK : yaml_error(c);
}

static accel_status parse_node(parse_ctx *c, yaml_event_t *ev, int depth, accel__ynode **out);

/* The keys of one mapping being parsed, hashed (open addressing, at most half full), so that
 * the duplicate check is not a scan of every earlier key: 300,000 keys took minutes. Slots
 * borrow the mapping's own key strings. */
typedef struct key_set {
    const char **slots;
    size_t cap; /* 0 or a power of two */
    size_t n;
} key_set;

static int key_set_has(const key_set *ks, const char *key)
{
    for (size_t i = ks->cap ? (size_t)accel__fnv1a_str(key) & (ks->cap - 1) : 0; ks->cap && ks->slots[i];
         i = (i + 1) & (ks->cap - 1)) {
        if (strcmp(ks->slots[i], key) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Adds a key known to be absent; ACCEL_ENOMEM when the table cannot grow. */
static accel_status key_set_add(key_set *ks, const char *key)
{
    if (2 * (ks->n + 1) > ks->cap) {
        key_set bigger = {accel__calloc(ks->cap ? 2 * ks->cap : 16, sizeof(char *)),
                          ks->cap ? 2 * ks->cap : 16, 0};
        if (bigger.slots == NULL) {
            return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
        }
        for (size_t i = 0; i < ks->cap; i++) {
            if (ks->slots[i] != NULL) {
                (void)key_set_add(&bigger, ks->slots[i]); /* fits: no growth */
            }
        }
        accel__free(ks->slots);
        *ks = bigger;
    }
    size_t i = (size_t)accel__fnv1a_str(key) & (ks->cap - 1);
    while (ks->slots[i] != NULL) {
        i = (i + 1) & (ks->cap - 1);
    }
    ks->slots[i] = key;
    ks->n++;
    return ACCEL_OK;
}

static accel_status parse_entries(parse_ctx *c, accel__ynode *n, int depth, key_set *ks);

/* The entries of a mapping or the items of a sequence whose start event was consumed. */
static accel_status parse_children(parse_ctx *c, accel__ynode *n, int depth)
{
    key_set ks = {NULL, 0, 0};
    accel_status st = parse_entries(c, n, depth, &ks);
    accel__free(ks.slots);
    return st;
}

static accel_status parse_entries(parse_ctx *c, accel__ynode *n, int depth, key_set *ks)
{
    for (;;) {
        yaml_event_t ev;
        ACCEL_TRY(next_event(c, &ev));
        if (ev.type == YAML_MAPPING_END_EVENT || ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            return ACCEL_OK;
        }
        char *key = NULL;
        int key_line = (int)ev.start_mark.line + 1;
        accel_status st = ACCEL_OK;
        if (n->kind == ACCEL__Y_MAP) {
            if (ev.type != YAML_SCALAR_EVENT) {
                st = accel__seterr(NULL, ACCEL_EINVAL,
                                   "config file %s, line %d: a key must be a plain name, not %s",
                                   c->path, key_line,
                                   ev.type == YAML_ALIAS_EVENT ? "an alias" : "a mapping or list");
            } else if (key_set_has(ks, (const char *)ev.data.scalar.value)) {
                st = accel__seterr(NULL, ACCEL_EINVAL,
                                   "config file %s, line %d: key \"%s\" appears twice", c->path,
                                   key_line, (const char *)ev.data.scalar.value);
            } else if ((key = accel__strdup((const char *)ev.data.scalar.value)) == NULL) {
                st = accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
            }
            yaml_event_delete(&ev);
            if (st == ACCEL_OK) {
                st = next_event(c, &ev);
            }
        }
        accel__ynode *child = NULL;
        if (st == ACCEL_OK) {
            st = parse_node(c, &ev, depth + 1, &child);
        }
        if (st == ACCEL_OK) {
            st = push(n, key, child);
        }
        if (st == ACCEL_OK && key != NULL) {
            st = key_set_add(ks, n->keys[n->n - 1]);
        }
        accel__free(key);
        if (st != ACCEL_OK) {
            return st;
        }
    }
}

/* Builds the node that starts with *ev (consumed here). */
static accel_status parse_node(parse_ctx *c, yaml_event_t *ev, int depth, accel__ynode **out)
{
    int line = (int)ev->start_mark.line + 1;
    accel_status st = ACCEL_OK;
    accel__ynode *n = NULL;
    if (depth > MAX_DEPTH) {
        st = accel__seterr(NULL, ACCEL_EINVAL, "config file %s, line %d: nested too deeply",
                           c->path, line);
    } else if (ev->type == YAML_SCALAR_EVENT) {
        const char *tag = (const char *)ev->data.scalar.tag;
        int quoted = ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE ||
                     (tag != NULL && strcmp(tag, YAML_STR_TAG) == 0);
        n = accel__ynode_scalar((const char *)ev->data.scalar.value, quoted);
        st = n != NULL ? ACCEL_OK : ACCEL_ENOMEM;
    } else if (ev->type == YAML_MAPPING_START_EVENT || ev->type == YAML_SEQUENCE_START_EVENT) {
        n = new_node(ev->type == YAML_MAPPING_START_EVENT ? ACCEL__Y_MAP : ACCEL__Y_SEQ);
        st = n != NULL ? ACCEL_OK : ACCEL_ENOMEM;
    } else if (ev->type == YAML_ALIAS_EVENT) {
        st = accel__seterr(NULL, ACCEL_EINVAL,
                           "config file %s, line %d: YAML aliases are not allowed", c->path, line);
    } else {
        st = accel__seterr(NULL, ACCEL_EINVAL, "config file %s, line %d: unexpected YAML event",
                           c->path, line);
    }
    int is_collection = n != NULL && n->kind != ACCEL__Y_SCALAR;
    yaml_event_delete(ev);
    if (n != NULL) {
        n->line = line;
    }
    if (st == ACCEL_OK && is_collection) {
        st = parse_children(c, n, depth);
    }
    if (st != ACCEL_OK) {
        accel__ynode_free(n);
        return st;
    }
    *out = n;
    return ACCEL_OK;
}

accel_status accel__ytree_parse(FILE *f, const char *path, accel__ynode **out)
{
    parse_ctx c = {.path = path};
    if (!yaml_parser_initialize(&c.p)) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    yaml_parser_set_input_file(&c.p, f);
    accel__ynode *root = NULL;
    accel_status st = ACCEL_OK;
    /* Stream start, at most one document, stream end. The whole stream is read: a second
     * document ("---" again) is refused, as yaml.safe_load refuses it ("expected a single
     * document"), instead of its keys being silently dropped; so is a syntax error after the
     * first document's end ("..."). */
    for (int done = 0, n_docs = 0; st == ACCEL_OK && !done;) {
        yaml_event_t ev;
        st = next_event(&c, &ev);
        if (st != ACCEL_OK) {
            break;
        }
        if (ev.type == YAML_DOCUMENT_START_EVENT && ++n_docs > 1) {
            st = accel__seterr(NULL, ACCEL_EINVAL,
                               "config file %s, line %d: a second YAML document; a config file "
                               "holds one (remove the '---' line and merge the keys)",
                               path, (int)ev.start_mark.line + 1);
        } else if (ev.type == YAML_STREAM_END_EVENT) {
            done = 1;
        } else if (ev.type != YAML_STREAM_START_EVENT && ev.type != YAML_DOCUMENT_START_EVENT &&
                   ev.type != YAML_DOCUMENT_END_EVENT) {
            st = parse_node(&c, &ev, 0, &root); /* consumes ev */
            continue;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&c.p);
    if (st == ACCEL_OK && root == NULL) {
        root = accel__ynode_map();
        st = root != NULL ? ACCEL_OK : ACCEL_ENOMEM;
    }
    if (st != ACCEL_OK) {
        accel__ynode_free(root);
        return st;
    }
    *out = root;
    return ACCEL_OK;
}

/* ---- writing ---- */

typedef struct key_ix {
    const char *key;
    int ix;
} key_ix;

static int cmp_key_ix(const void *a, const void *b)
{
    return strcmp(((const key_ix *)a)->key, ((const key_ix *)b)->key);
}

/* Indices of a mapping's keys in sorted order (what yaml.safe_dump writes); keys are unique,
 * so the order is total. qsort: an insertion sort took minutes for 300,000 keys. */
static int *sorted_keys(const accel__ynode *map)
{
    size_t n = (size_t)(map->n > 0 ? map->n : 1);
    int *ix = accel__malloc(n * sizeof(int));
    key_ix *k = accel__malloc(n * sizeof(key_ix));
    if (ix == NULL || k == NULL) {
        accel__free(ix);
        accel__free(k);
        return NULL;
    }
    for (int i = 0; i < map->n; i++) {
        k[i] = (key_ix){map->keys[i], i};
    }
    qsort(k, (size_t)map->n, sizeof(key_ix), cmp_key_ix);
    for (int i = 0; i < map->n; i++) {
        ix[i] = k[i].ix;
    }
    accel__free(k);
    return ix;
}

static int emit_scalar(yaml_emitter_t *e, const char *text, int quoted)
{
    yaml_event_t ev;
    /* Plain when the emitter can; a string that reads as a bool, number or null is quoted by
     * the builder (quoted = 1), as PyYAML quotes 'no'. */
    yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)text, (int)strlen(text), 1, 1,
                                 quoted ? YAML_SINGLE_QUOTED_SCALAR_STYLE : YAML_ANY_SCALAR_STYLE);
    return yaml_emitter_emit(e, &ev);
}

static int emit_node(yaml_emitter_t *e, const accel__ynode *n)
{
    yaml_event_t ev;
    if (n->kind == ACCEL__Y_SCALAR) {
        return emit_scalar(e, n->text, n->quoted);
    }
    if (n->kind == ACCEL__Y_SEQ) {
        yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_SEQUENCE_STYLE);
        int ok = yaml_emitter_emit(e, &ev);
        for (int i = 0; ok && i < n->n; i++) {
            ok = emit_node(e, n->items[i]);
        }
        yaml_sequence_end_event_initialize(&ev);
        return ok && yaml_emitter_emit(e, &ev);
    }
    int *ix = sorted_keys(n);
    if (ix == NULL) {
        return 0;
    }
    yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE);
    int ok = yaml_emitter_emit(e, &ev);
    for (int i = 0; ok && i < n->n; i++) {
        ok = emit_scalar(e, n->keys[ix[i]], 0) && emit_node(e, n->items[ix[i]]);
    }
    accel__free(ix);
    yaml_mapping_end_event_initialize(&ev);
    return ok && yaml_emitter_emit(e, &ev);
}

typedef struct membuf {
    char *data;
    size_t len, cap;
} membuf;

static int membuf_write(void *ctx, unsigned char *buf, size_t n)
{
    membuf *m = ctx;
    if (m->len + n + 1 > m->cap) {
        size_t cap = (m->len + n + 1) * 2;
        char *d = accel__realloc(m->data, cap);
        if (d == NULL) {
            return 0;
        }
        m->data = d;
        m->cap = cap;
    }
    memcpy(m->data + m->len, buf, n);
    m->len += n;
    m->data[m->len] = '\0';
    return 1;
}

/* The tree as YAML text in a new buffer (free with accel__free). */
static accel_status to_yaml(const accel__ynode *root, char **out, size_t *len)
{
    yaml_emitter_t e;
    membuf m = {0};
    if (!yaml_emitter_initialize(&e)) {
        return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
    }
    yaml_emitter_set_output(&e, membuf_write, &m);
    yaml_emitter_set_unicode(&e, 1);
    yaml_emitter_set_width(&e, -1);
    yaml_event_t ev;
    yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING);
    int ok = yaml_emitter_emit(&e, &ev);
    yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1);
    ok = ok && yaml_emitter_emit(&e, &ev) && emit_node(&e, root);
    yaml_document_end_event_initialize(&ev, 1);
    ok = ok && yaml_emitter_emit(&e, &ev);
    yaml_stream_end_event_initialize(&ev);
    ok = ok && yaml_emitter_emit(&e, &ev) && yaml_emitter_flush(&e);
    const char *why = e.problem;
    yaml_emitter_delete(&e);
    if (!ok) {
        accel__free(m.data);
        return accel__seterr(NULL, ACCEL_ENOMEM, "cannot write YAML: %s",
                             why ? why : "out of memory");
    }
    *out = m.data;
    *len = m.len;
    return ACCEL_OK;
}

/* What a plain scalar means to YAML 1.1 (PyYAML), for JSON output. */
static json_t *scalar_json(const accel__ynode *n)
{
    const char *t = n->text;
    if (n->quoted) {
        return json_string(t);
    }
    if (accel__yscalar_is_null(n)) {
        return json_null();
    }
    static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
    for (int i = 0; i < 3; i++) {
        if (strcasecmp(t, yes[i]) == 0) {
            return json_true();
        }
        if (strcasecmp(t, no[i]) == 0) {
            return json_false();
        }
    }
    char *end;
    errno = 0;
    long long v = strtoll(t, &end, 10);
    if (*t != '\0' && *end == '\0' && errno == 0) {
        return json_integer(v);
    }
    double d = strtod(t, &end);
    if (*t != '\0' && *end == '\0' && (isdigit((unsigned char)t[0]) || t[0] == '-' || t[0] == '.')) {
        return json_real(d);
    }
    return json_string(t);
}

static json_t *to_json(const accel__ynode *n)
{
    if (n->kind == ACCEL__Y_SCALAR) {
        return scalar_json(n);
    }
    json_t *j = n->kind == ACCEL__Y_MAP ? json_object() : json_array();
    for (int i = 0; j != NULL && i < n->n; i++) {
        json_t *c = to_json(n->items[i]);
        int bad = c == NULL || (n->kind == ACCEL__Y_MAP ? json_object_set_new(j, n->keys[i], c)
                                                        : json_array_append_new(j, c));
        if (bad) {
            json_decref(j);
            return NULL;
        }
    }
    return j;
}

accel_status accel__ytree_write(const accel__ynode *root, const char *path, int json)
{
    char *text = NULL;
    size_t len = 0;
    if (json) {
        json_t *j = to_json(root);
        text = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        json_decref(j);
        if (text == NULL) {
            return accel__seterr(NULL, ACCEL_ENOMEM, "out of memory");
        }
        len = strlen(text);
        /* jansson allocates with malloc; write it, then a final newline as json.dump does not */
        accel_status st = accel__write_file_atomic(path, text, len);
        free(text);
        return st;
    }
    ACCEL_TRY(to_yaml(root, &text, &len));
    accel_status st = accel__write_file_atomic(path, text, len);
    accel__free(text);
    return st;
}

accel_status accel__ytree_print(const accel__ynode *root, FILE *f, const char *indent)
{
    char *text = NULL;
    size_t len = 0;
    ACCEL_TRY(to_yaml(root, &text, &len));
    for (const char *p = text; *p != '\0';) {
        size_t n = strcspn(p, "\n");
        fprintf(f, "%s%.*s\n", indent, (int)n, p);
        p += n + (p[n] == '\n');
    }
    accel__free(text);
    return ACCEL_OK;
}
