/*
 * A small YAML document tree (src/base/ytree.c): what Accelerate's config files need, read
 * with libyaml and written back with its emitter (or as JSON), so the library and the `accel`
 * tool read and write those files with one code. Mappings keep the file's order and every
 * node its line, so messages can point at the culprit. Aliases, non-scalar keys and duplicate
 * keys are refused (a config file never needs them, and a duplicate is a mistake).
 */
#ifndef ACCEL_BASE_YTREE_H
#define ACCEL_BASE_YTREE_H

#include <stdio.h>

#include "accel/status.h"

typedef enum accel__ykind { ACCEL__Y_SCALAR, ACCEL__Y_MAP, ACCEL__Y_SEQ } accel__ykind;

typedef struct accel__ynode accel__ynode;
struct accel__ynode {
    accel__ykind kind;
    int line;    /* 1-based line in the file; 0 for a node built in memory */
    char *text;  /* scalar: the value as written (quotes removed) */
    int quoted;  /* scalar: written quoted (a string even when it reads as a bool or number) */
    int n;       /* map: entries; seq: items */
    char **keys; /* map: the keys, in file order */
    accel__ynode **items; /* map: values (items[i] is keys[i]'s); seq: the items */
};

/* Parses the YAML (or JSON) document in f; `path` names the file in messages. A file without
 * any document gives an empty mapping. Errors (ACCEL_EINVAL): YAML syntax ("config file P:
 * YAML error at line L: ..."), an alias, a non-scalar or duplicate key, nesting deeper than
 * 32, a second document. */
accel_status accel__ytree_parse(FILE *f, const char *path, accel__ynode **out);

/* Builders: a scalar (copied), an empty mapping or sequence. NULL when out of memory (the
 * thread's error is set). */
accel__ynode *accel__ynode_scalar(const char *text, int quoted);
accel__ynode *accel__ynode_map(void);
accel__ynode *accel__ynode_seq(void);
/* Sets key (copied) to v (owned from now on, also on failure), replacing an existing value
 * in its place or appending. */
accel_status accel__ynode_set(accel__ynode *map, const char *key, accel__ynode *v);
/* Appends v (owned from now on, also on failure) to a sequence. */
accel_status accel__ynode_append(accel__ynode *seq, accel__ynode *v);
/* Removes key from a mapping (nothing when absent). */
void accel__ynode_remove(accel__ynode *map, const char *key);
/* The value of key in a mapping, or NULL (also when `map` is NULL or not a mapping). */
accel__ynode *accel__ynode_get(const accel__ynode *map, const char *key);
/* Follows a dotted path of keys ("deepspeed_config.zero_stage"). */
accel__ynode *accel__ynode_path(const accel__ynode *root, const char *path);
void accel__ynode_free(accel__ynode *n);

/* 1 for a null scalar: empty, ~, null / Null / NULL, None. */
int accel__yscalar_is_null(const accel__ynode *n);

/* Writes the tree atomically to path, keys sorted at every level (as Python's yaml.safe_dump
 * and json.dump(sort_keys=True) write Accelerate's files): as YAML, or as JSON (indent 2) when
 * json is set. The parent folder must exist. */
accel_status accel__ytree_write(const accel__ynode *root, const char *path, int json);

/* Prints the tree as block YAML to f (sorted keys), each line prefixed with `indent`. */
accel_status accel__ytree_print(const accel__ynode *root, FILE *f, const char *indent);

#endif /* ACCEL_BASE_YTREE_H */
