/*
 * `accel merge-weights CHECKPOINT_DIR OUTPUT [--unsafe_serialization] [--remove_checkpoint_dir]`:
 * Accelerate's command for FSDP checkpoints, for accel's sharded save_state folders (ZeRO stages
 * 1-3): the model's weights consolidated into OUTPUT as accel_save_model writes them. The work
 * is accel_merge_weights; this file parses the arguments (flags may come before or after the
 * two folders, as argparse allows) and reports.
 */
#include <stdio.h>
#include <string.h>

#include "accel/accel.h"
#include "cli.h"

static int run_merge(const cli_verb *verb, int argc, char **argv);

static const cli_option merge_options[] = {
    {"unsafe_serialization", 0, 0, NULL, NULL,
     "write pytorch_model.bin (a torch pickle) instead of model.safetensors: not supported by "
     "accel (refused with a message)",
     NULL, NULL},
    {"remove_checkpoint_dir", 0, 0, NULL, NULL,
     "delete CHECKPOINT_DIR once the output is written and synced to disk", NULL, NULL},
    {"max_shard_size", 0, 1, "10GB", "SIZE",
     "split the output into shards + index beyond this size, as save_model does", NULL, NULL},
    {0},
};

const cli_verb cli_verb_merge_weights = {
    .name = "merge-weights",
    .summary = "merge a sharded save_state checkpoint's weights into model.safetensors",
    .positional = "CHECKPOINT_DIR OUTPUT",
    .description =
        "Consolidates the model weights of a save_state folder saved under ZeRO stages 1-3 (one\n"
        "shard per process: model.shard-<r>-of-<N>.safetensors + model.index.json) into the\n"
        "folder OUTPUT exactly as accel_save_model writes them: model.safetensors, or\n"
        "model-0000i-of-0000k.safetensors + model.safetensors.index.json. It streams: each\n"
        "piece is copied from the mapped shards to its place, so memory use does not grow with\n"
        "the model. The checkpoint is verified (sizes, checksums) first. A checkpoint saved\n"
        "without sharding is accepted too.",
    .options = merge_options,
    .run = run_merge,
};

static int run_merge(const cli_verb *verb, int argc, char **argv)
{
    cli_args a;
    int status;
    if (cli_begin(verb, argc, argv, &a, &status)) {
        return status;
    }
    /* Options after the folders too (argparse's way), with dashes or underscores. */
    const char *pos[2] = {NULL, NULL};
    int n_pos = 0, unsafe = cli_given(verb, &a, "unsafe_serialization"),
        remove = cli_given(verb, &a, "remove_checkpoint_dir");
    const char *max = cli_value(verb, &a, "max_shard_size");
    for (int i = a.first_positional; i < argc; i++) {
        const char *s = argv[i];
        char name[64] = "";
        if (s[0] == '-' && s[1] == '-') {
            snprintf(name, sizeof(name), "%.*s", (int)strcspn(s, "="), s);
            for (char *c = name; *c; c++) {
                *c = *c == '-' && c > name + 1 ? '_' : *c;
            }
        }
        if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
            cli_print_help(verb, stdout);
            return 0;
        } else if ((strcmp(name, "--unsafe_serialization") == 0 ||
                    strcmp(name, "--remove_checkpoint_dir") == 0) &&
                   strchr(s, '=') != NULL) {
            cli_usage_error(verb, "option '%s' takes no value", name);
            return CLI_EXIT_USAGE;
        } else if (strcmp(name, "--unsafe_serialization") == 0) {
            unsafe = 1;
        } else if (strcmp(name, "--remove_checkpoint_dir") == 0) {
            remove = 1;
        } else if (strcmp(name, "--max_shard_size") == 0) {
            if (strchr(s, '=') == NULL && i + 1 >= argc) {
                cli_usage_error(verb, "option '--max_shard_size' needs a value");
                return CLI_EXIT_USAGE;
            }
            max = strchr(s, '=') != NULL ? strchr(s, '=') + 1 : argv[++i];
        } else if (s[0] == '-' && s[1] != '\0') {
            cli_usage_error(verb, "unknown option '%s'", s);
            return CLI_EXIT_USAGE;
        } else if (n_pos < 2) {
            pos[n_pos++] = s;
        } else {
            cli_usage_error(verb, "unexpected argument '%s'", s);
            return CLI_EXIT_USAGE;
        }
    }
    if (n_pos < 2) {
        cli_usage_error(verb, "expected CHECKPOINT_DIR and OUTPUT");
        return CLI_EXIT_USAGE;
    }
    if (pos[0][0] == '\0' || pos[1][0] == '\0') {
        cli_usage_error(verb, "%s is empty: give the path of a folder",
                        pos[0][0] == '\0' ? "CHECKPOINT_DIR" : "OUTPUT");
        return CLI_EXIT_USAGE;
    }
    int flags = (unsafe ? ACCEL_MERGE_UNSAFE_SERIALIZATION : 0) |
                (remove ? ACCEL_MERGE_REMOVE_CHECKPOINT_DIR : 0);
    accel_status st = accel_merge_weights(pos[0], pos[1], max, flags);
    if (st != ACCEL_OK) {
        fprintf(stderr, "accel merge-weights: error: %s\n", accel_last_error(NULL));
        return 1;
    }
    printf("Merged the weights of %s into %s%s\n", pos[0], pos[1],
           remove ? " and removed the checkpoint" : "");
    return 0;
}
