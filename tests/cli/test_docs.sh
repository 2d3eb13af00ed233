#!/usr/bin/env bash
# What the user documents promise is what the tool does, both ways:
#   1. flags: every `accel VERB --flag` written in a command of README.md or docs/*.md (code
#      blocks and inline code) is in `accel VERB --help` and accepted by the parser; every flag
#      of every verb's --help (verbs listed by `accel --help`) is documented in the verb's
#      document (launch: a row of docs/launch.md's option table); every --flag docs/launch.md
#      names is launch's, or one of the few other programs' flags listed below; so is every
#      flag README.md and docs/guide.md name (or it is examples/gpt's); and the config keys of
#      docs/launch.md's option table are documented keys, and its defaults those --help shows;
#   2. environment variables: every variable of docs/configuration.md's table is one the code
#      reads, and every ACCEL_* / ACCELERATE_* variable the code reads (the env table of
#      src/base/env.c, getenv, the accel__env_* getters) is in that table; the variables
#      accel launch sets are those of docs/launch.md's environment table;
#   3. config-file keys: the keys and policies of docs/configuration.md's two key tables are
#      those of src/base/config.c's rule tables, and `accel launch --config_file F` with a file
#      holding each key (and distributed_type, which is required) does what the policy says:
#      used / accepted keys run silently, ignored ones warn (and are silent with a neutral
#      value), refused ones stop before anything starts (exit 2), unknown keys warn.
# Every mismatch is listed (FAIL lines), then the test fails. DOCS_TRACE=1 also lists each
# documented command's flag as it is checked.
set -u

B=${ACCEL_BUILD_DIR:-build}
SRC=${ACCEL_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
ACCEL=$B/accel
T=$(mktemp -d "${TMPDIR:-/tmp}/accel-test-docs.XXXXXX")
trap 'rm -rf "$T"' EXIT
export HF_HOME=$T/hf
unset ACCELERATE_CONFIG_FILE ACCELERATE_MIXED_PRECISION ACCELERATE_USE_CPU ACCELERATE_DEBUG_MODE \
    ACCELERATE_GRADIENT_ACCUMULATION_STEPS ACCEL_ZERO_STAGE ACCEL_CONFIG_CHECKED XDG_CACHE_HOME
[ -x "$ACCEL" ] || { echo "FAIL: $ACCEL is missing: build first (ACCEL_BUILD_DIR=$B)"; exit 1; }
ACCEL=$(cd "$B" && pwd)/accel # the checks run in the source tree
cd "$SRC" || exit 1

FAILS=0
bad() {
    echo "FAIL: $*"
    FAILS=$((FAILS + 1))
}
ok() { echo "ok: $*"; }

# ---------------------------------------------------------------------------------------------
# 1. Flags
# ---------------------------------------------------------------------------------------------

# The document of each verb: where its flags must be documented. A new verb fails here until
# it has one.
doc_of() {
    case $1 in
    launch) echo docs/launch.md ;;
    config | "config default" | "config update" | test | env) echo docs/configuration.md ;;
    estimate-memory) echo docs/estimate-memory.md ;;
    merge-weights) echo docs/checkpoint.md ;;
    *) return 1 ;;
    esac
}

# Verbs from `accel --help` ("commands:" up to the next blank line), and config's own verbs
# from `accel config --help` ("  accel config default ...").
mapfile -t VERBS < <("$ACCEL" --help | awk '/^commands:/ { on = 1; next } on && NF == 0 { exit }
    on { print $1 }')
[ "${#VERBS[@]}" -ge 5 ] || bad "accel --help lists ${#VERBS[@]} commands"
mapfile -t -O "${#VERBS[@]}" VERBS < <("$ACCEL" config --help |
    sed -n 's/^ *accel config \([a-z][a-z]*\) .*/config \1/p')

# FLAGS[verb] = " --name=V --cpu=0 -n=V ..." from the verb's --help: =V when it takes a value,
# =M for several ("DTYPE..."), =0 for a plain flag; METAVAR[verb --name] its placeholder.
declare -A FLAGS METAVAR
for v in "${VERBS[@]}"; do
    # shellcheck disable=SC2086 # "config default" is two words
    "$ACCEL" $v --help >"$T/help" 2>&1 || bad "accel $v --help exited $?"
    doc_of "$v" >/dev/null || bad "accel $v: no document is known for it (doc_of in $0)"
    FLAGS[$v]=" "
    while read -r short long meta; do
        kind=0
        [ -n "$meta" ] && kind=V
        case $meta in *...) kind=M ;; esac
        FLAGS[$v]+="$long=$kind "
        METAVAR[$v $long]=$meta
        if [ "$short" != - ]; then
            FLAGS[$v]+="$short=$kind "
            METAVAR[$v $short]=$meta
        fi
    done < <(awk '/^  -/ {
            s = substr($0, 3); short = "-"
            if (s ~ /^-[a-zA-Z], /) { short = substr(s, 1, 2); s = substr(s, 5) }
            long = s; sub(/ .*/, "", long); s = substr(s, length(long) + 1); meta = ""
            if (s ~ /^ [^ ]/) { meta = substr(s, 2); sub(/ .*/, "", meta) }
            print short, long, meta
        }' "$T/help")
done

# The kind of flag F of verb V (V, M or 0), empty when --help does not list it.
flag_kind() {
    local f=${2%%=*} rest
    [ "${f:0:2}" = "--" ] && f=--$(echo "${f:2}" | tr - _) # Accelerate's --num-processes
    rest=${FLAGS[$1]#* $f=}
    [ "$rest" = "${FLAGS[$1]}" ] && return 0
    echo "${rest%% *}"
}

# Does the parser accept `accel V F VALUE`? (--help after it: nothing runs.)
declare -A ACCEPTED_ONCE
parser_accepts() { # VERB FLAG VALUE|"" WHERE
    local key="$1 $2 $3"
    [ -n "${ACCEPTED_ONCE[$key]:-}" ] && return 0
    ACCEPTED_ONCE[$key]=1
    [ -n "${DOCS_TRACE:-}" ] && echo "check: $4: accel $1 $2 $3"
    local args=("$2")
    [ -n "$3" ] && args+=("$3")
    # shellcheck disable=SC2086
    if ! "$ACCEL" $1 "${args[@]}" --help >"$T/out" 2>"$T/err" </dev/null; then
        bad "$4: accel $1 ${args[*]} is refused by the parser: $(head -n 1 "$T/err")"
    fi
}

# Every `accel WORD ...` in code (fenced blocks, inline spans) of README.md and docs/*.md, as
# "FILE:LINE<TAB>WORD ARGS"; messages the tool prints ("accel launch: error: ...") are left
# out, and so is the rest of a line from a shell comment, a pipe or a redirection.
extract_commands() {
    awk '
    function scan(text, where,   s, m, w, rest) {
        s = text
        while (match(s, /(^|[^A-Za-z0-9_.\/-])(build\/)?accel +[a-z][a-z-]*/)) {
            m = substr(s, RSTART, RLENGTH)
            w = m
            sub(/^.*accel +/, "", w)
            s = substr(s, RSTART + RLENGTH)
            if (s ~ /^:/) continue
            rest = s
            sub(/[;&<>)`].*$/, "", rest)
            sub(/ \| .*$/, "", rest)
            sub(/[ \t]#.*$/, "", rest)
            sub(/\\[ \t]*$/, "", rest)
            printf "%s\t%s%s\n", where, w, rest
        }
    }
    # A command of a code block goes on over a line ending in "\" and over a usage line
    # indented under it ("             [--max_restarts N] [...]").
    function flush() { if (held != "") scan(held, held_at); held = "" }
    FNR == 1 { flush(); fenced = 0 }
    /^[ \t]*```/ { flush(); fenced = !fenced; next }
    fenced {
        line = $0
        sub(/[ \t]#.*$/, "", line)
        if (held != "" && (cont || line ~ /^[ \t]+\[-/)) {
            held = held " " line
        } else {
            flush(); held = line; held_at = FILENAME ":" FNR
        }
        cont = sub(/\\[ \t]*$/, "", held)
        next
    }
    {
        n = split($0, part, "`")
        for (i = 2; i <= n; i += 2) scan(part[i], FILENAME ":" FNR)
    }
    END { flush() }' README.md docs/*.md
}

n_cmds=0
while IFS=$'\t' read -r where text; do
    read -r -a tok <<<"$text"
    verb=${tok[0]}
    i=1
    if [ "$verb" = config ] && [[ "${tok[1]:-}" =~ ^(default|update)$ ]]; then
        verb="config ${tok[1]}"
        i=2
    fi
    if [ -z "${FLAGS[$verb]:-}" ]; then
        # "accel configuration saved at F" is a message; a flag given to a verb that does not
        # exist is a drift.
        [[ " ${tok[*]} " == *" --"* ]] && bad "$where: accel $verb: no such command ($text)"
        continue
    fi
    n_cmds=$((n_cmds + 1))
    while [ "$i" -lt "${#tok[@]}" ]; do
        t=${tok[$i]//[\[\]]/}
        i=$((i + 1))
        case $t in
        -- | ... | "") [ "$t" = -- ] && [ "$verb" = launch ] && break; continue ;;
        -?*) ;;
        *) [ "$verb" = launch ] && break; continue ;; # launch: the program, then its own flags
        esac
        flag=$t value=
        case $flag in
        --*=*) value=${flag#*=} flag=${flag%%=*} ;;
        -[a-zA-Z]?*) value=${flag:2} value=${value#=} flag=${flag:0:2} ;;
        esac
        kind=$(flag_kind "$verb" "$flag")
        if [ -z "$kind" ]; then
            bad "$where: accel $verb $flag is not in accel $verb --help"
            continue
        fi
        if [ "$kind" = V ] && [ -z "$value" ] && [ "$i" -lt "${#tok[@]}" ]; then
            value=${tok[$i]//[\[\]]/}
            i=$((i + 1))
        elif [ "$kind" = M ]; then
            while [ "$i" -lt "${#tok[@]}" ] && [ "${tok[$i]:0:1}" != - ]; do
                value="${value:+$value,}${tok[$i]}"
                i=$((i + 1))
            done
        fi
        # A placeholder value ("N", "no|fp16|bf16"): the first choice of --help's metavar.
        meta=${METAVAR[$verb ${flag%%=*}]:-}
        if [ "$kind" != 0 ]; then
            if [ -z "$value" ] || [[ "$value" =~ ^[A-Z]+$ ]] || [[ "$value" == *"|"* ]]; then
                value=${meta%%|*}
                [[ "$value" =~ ^[A-Z.]+$ ]] && value=1
            fi
        fi
        parser_accepts "$verb" "$flag" "$value" "$where"
    done
done < <(extract_commands)
[ "$n_cmds" -ge 40 ] || bad "only $n_cmds accel commands found in the documents"
ok "$n_cmds accel commands of README.md and docs/*.md checked against --help and the parser"

# Every flag of --help in the verb's document.
for v in "${VERBS[@]}"; do
    doc=$(doc_of "$v") || continue
    for f in ${FLAGS[$v]}; do
        f=${f%%=*}
        case $f in --help | -h) continue ;; esac
        if [ "$v" = launch ]; then
            # a row of the option table: "| `--flag ...` |" or "| `-n`, `--flag N` |"
            grep -qE -- "^\| (\`-[a-zA-Z]\`, )?\`${f}[\` ]" "$doc" ||
                { [ "${f:0:2}" != "--" ] && grep -qE -- "^\| \`$f\`, " "$doc"; } ||
                bad "accel launch $f (in --help) has no row in $doc's option table"
        else
            grep -qE -- "$f([^a-z0-9_-]|$)" "$doc" || bad "accel $v $f (in --help) is not in $doc"
        fi
    done
done
ok "every flag of --help (${#VERBS[@]} commands) is documented"

# The defaults --help prints from the option table ("(default: 3)") are the "default" column
# of docs/launch.md's option table.
"$ACCEL" launch --help | awk '/^  -/ { if (cur != "") print cur; cur = $0; next }
    /^        / { cur = cur " " $0; next } { if (cur != "") print cur; cur = "" }
    END { if (cur != "") print cur }' |
    sed -n 's/^  \(-[a-z], \)\{0,1\}\(--[a-z_]*\).*(default: \([^ )]*\))$/\2 \3/p' >"$T/defaults"
[ -s "$T/defaults" ] || bad "accel launch --help shows no default"
while read -r f d; do
    doc_d=$(awk -v f="$f" '/^\| `-/ { line = $0; gsub(/\\\|/, "/", line); split(line, c, "|")
        if (index(c[2], "`" f "`") || index(c[2], "`" f " ")) { print c[4]; exit } }' \
        docs/launch.md | tr -d '` ')
    [ "$doc_d" = "$d" ] ||
        bad "accel launch $f: the default is $d in --help," \
            "'$doc_d' in docs/launch.md's option table"
done <"$T/defaults"
ok "the defaults of --help in docs/launch.md"

# Every --flag docs/launch.md names is accel launch's, except those of the other programs it
# talks about:
#   mpirun: --hostfile --npernode --bind-to --allow-run-as-root;  torchrun: --nproc_per_node
#   --nnodes;  Slurm: --signal;  accel itself: --version;  the example programs (./train,
#   examples/gpt) after PROGRAM: --epochs --lr --checkpoint_every --resume;  the syntax
#   "--flag value": --flag.
others=" --hostfile --npernode --bind-to --allow-run-as-root --nproc_per_node --nnodes --signal"
others+=" --version --epochs --lr --checkpoint_every --resume --flag "
for f in $(grep -oE -- '(^|[^a-zA-Z0-9_-])--[a-z][a-z0-9_-]*' docs/launch.md | sed 's/^[^-]*//' |
    sort -u); do
    [[ "$others" == *" $f "* ]] && continue
    [ -n "$(flag_kind launch "$f")" ] ||
        bad "docs/launch.md names $f, which accel launch --help does not list"
done
ok "the flags docs/launch.md names"

# README.md and docs/guide.md, the documents a new user starts from, name flags in prose too
# ("starts the job again, `--max_restarts N`"): each is a flag of an accel command, of
# examples/gpt (its option table in examples/gpt.c), or one of: pkg-config's --cflags --libs
# --static --variable, TensorBoard's --logdir.
all_flags=" "
for v in "${VERBS[@]}"; do
    for f in ${FLAGS[$v]}; do all_flags+="${f%%=*} "; done
done
all_flags+="$(grep -oE '"--[a-z][a-z0-9_]*"' examples/gpt.c | tr -d '"' | tr '\n' ' ')"
all_flags+=" --cflags --libs --static --variable --logdir "
for doc in README.md docs/guide.md; do
    for f in $(grep -oE -- '(^|[^a-zA-Z0-9_-])--[a-z][a-z0-9_-]*' "$doc" |
        sed 's/^[^-]*//' | sort -u); do
        [[ "$all_flags" == *" $f "* ]] ||
            bad "$doc names $f, a flag of neither accel nor examples/gpt"
    done
done
ok "the flags README.md and docs/guide.md name"

# ---------------------------------------------------------------------------------------------
# 2. Environment variables
# ---------------------------------------------------------------------------------------------

# What the code reads: the env table, getenv("...") and the accel__env_* getters, in src/.
code_vars=$( (
    awk '/^static const accel__env_var env_table\[\]/ { on = 1 } on && /^};/ { exit }
        on' src/base/env.c | grep -oE '^ *\{"[A-Z][A-Z0-9_]*"' | grep -oE '[A-Z][A-Z0-9_]*'
    grep -rhoE '(getenv|accel__env_(int|real|bool|string))\("[A-Z][A-Z0-9_]*"' src |
        grep -oE '"[A-Z][A-Z0-9_]*"' | tr -d '"'
) | sort -u)
# The variables of configuration.md's table (first column; OMPI_COMM_WORLD_* is a family).
doc_vars=$(awk '/^## Environment variables/ { on = 1; next } on && /^## / { exit }
    on && /^\| `/ { split($0, c, "|"); print c[2] }' docs/configuration.md |
    grep -oE '`[A-Z][A-Z0-9_]*\*?`' | tr -d '`' | sort -u)
[ "$(echo "$doc_vars" | wc -w)" -ge 20 ] ||
    bad "docs/configuration.md: the variable table was not found"
for d in $doc_vars; do
    pat="^${d%\*}"
    [ "${d%\*}" = "$d" ] && pat="$pat\$"
    echo "$code_vars" | grep -qE "$pat" ||
        bad "docs/configuration.md documents $d, which the code does not read"
done
# Internal variables, not for users (the tests' hooks set by the tool or a test script):
internal=" ACCEL_TEST_PREFLIGHT_CLOSED ACCEL_TEST_REPORT "
for c in $(echo "$code_vars" | grep -E '^ACCEL(ERATE)?_'); do
    [[ "$internal" == *" $c "* ]] && continue
    found=0
    for d in $doc_vars; do
        case $c in "${d%\*}"*) [ "${d%\*}" != "$d" ] || [ "$c" = "$d" ] && found=1 ;; esac
    done
    [ "$found" -eq 1 ] ||
        bad "the code reads $c, which docs/configuration.md's variable table lacks"
done
ok "environment variables: $(echo "$doc_vars" | wc -w) documented," \
    "$(echo "$code_vars" | wc -w) read"

# What accel launch sets in each process (setenv / set_env_int in src/cli, but for accel test's
# own ACCEL_TEST_REPORT) against docs/launch.md's "Environment of each process" table.
set_vars=$(grep -ohE '(setenv|set_env_int)\("[A-Z][A-Z0-9_]*"' src/cli/*.c |
    grep -oE '[A-Z][A-Z0-9_]+' | grep -vx ACCEL_TEST_REPORT | sort -u)
launch_vars=$(awk '/^## Environment of each process/ { on = 1; next } on && /^## / { exit }
    on && /^\| `/ { split($0, c, "|"); print c[2] }' docs/launch.md |
    grep -oE '`[A-Z][A-Z0-9_]*`' | tr -d '`' | sort -u)
[ "$(echo "$set_vars" | wc -w)" -ge 15 ] ||
    bad "src/cli: the variables accel launch sets were not found"
for v in $(comm -23 <(echo "$set_vars") <(echo "$launch_vars")); do
    bad "accel launch sets $v, which docs/launch.md's environment table lacks"
done
for v in $(comm -13 <(echo "$set_vars") <(echo "$launch_vars")); do
    bad "docs/launch.md's environment table has $v, which accel launch does not set"
done
ok "the $(echo "$set_vars" | wc -w) variables accel launch sets"

# ---------------------------------------------------------------------------------------------
# 3. Config-file keys
# ---------------------------------------------------------------------------------------------

# "KEY POLICY" of the code's rule tables (section keys as "deepspeed_config.zero_stage").
code_keys=$(awk '
    /^static const key_rule keys\[\]/ { p = ""; on = 1; next }
    /^static const key_rule deepspeed_keys\[\]/ { p = "deepspeed_config."; on = 1; next }
    /^static const key_rule fsdp_keys\[\]/ { p = "fsdp_config."; on = 1; next }
    on && /^};/ { on = 0 }
    on && match($0, /\{"[a-z0-9_]+", (USED|ACCEPTED|IGNORED|REFUSED)/) {
        s = substr($0, RSTART + 2, RLENGTH - 2); split(s, f, /", /)
        print p f[1], tolower(f[2])
    }' src/base/config.c | sort)
# The same from the tables of configuration.md's "Config file" section (the column "policy").
doc_keys=$(awk '/^## Config file/ { on = 1; next } on && /^## / { exit }
    on && /^\| key \|/ {
        n = split($0, h, "|"); for (i = 1; i <= n; i++) if (h[i] ~ /^ *policy *$/) pc = i; next
    }
    on && /^\| `/ && pc {
        split($0, c, "|"); pol = c[pc]; gsub(/^ +| +$/, "", pol); sub(/ .*/, "", pol)
        n = split(c[2], k, "`")
        for (i = 2; i <= n; i += 2) print k[i], pol
    }' docs/configuration.md | sort)
[ "$(echo "$code_keys" | wc -l)" -ge 40 ] || bad "src/base/config.c: the key tables were not found"
# The "config key" column of docs/launch.md's option table names documented keys.
for k in $(awk '/^\| `-/ { line = $0; gsub(/\\\|/, "/", line); split(line, c, "|"); print c[3] }' \
    docs/launch.md | grep -oE '`[a-z_.]+' | tr -d '`'); do
    echo "$doc_keys" | grep -q "^$k " ||
        bad "docs/launch.md's option table names config key $k, which docs/configuration.md lacks"
done
while read -r k p; do
    dp=$(echo "$doc_keys" | awk -v k="$k" '$1 == k { print $2 }')
    if [ -z "$dp" ]; then
        bad "config key $k (src/base/config.c, $p) is not in docs/configuration.md's key tables"
    elif [ "$dp" != "$p" ]; then
        bad "config key $k: docs/configuration.md says $dp, src/base/config.c $p"
    fi
done <<<"$code_keys"
# ... and the other way: mpirun_config's keys have no rule table (the reader takes
# mpirun_hostfile, accel launch mpirun_ccl; docs/launch.md's table maps them).
while read -r k p; do
    case $k in mpirun_config.*) continue ;; esac
    echo "$code_keys" | grep -q "^$k " ||
        bad "config key $k ($p in docs/configuration.md) is not in src/base/config.c's key tables"
done <<<"$doc_keys"

# A valid value of each used key, and the distributed_type its section needs.
declare -A VALUE=(
    [compute_environment]=LOCAL_MACHINE [distributed_type]=MULTI_CPU [mixed_precision]=bf16
    [fp16]=true [use_cpu]=true [debug]=true [num_processes]=1 [num_machines]=1
    [machine_rank]=0 [gpu_ids]=all [main_process_ip]=127.0.0.1 [main_process_port]=29500
    [rdzv_backend]=static [same_network]=true [mpirun_config]="{mpirun_ccl: 1}"
    [deepspeed_config]="{zero_stage: 2}" [fsdp_config]="{fsdp_sharding_strategy: FULL_SHARD}"
    [deepspeed_config.zero_stage]=2 [deepspeed_config.gradient_accumulation_steps]=2
    [fsdp_config.fsdp_version]=2 [fsdp_config.fsdp_sharding_strategy]=SHARD_GRAD_OP
    [fsdp_config.fsdp_reshard_after_forward]=true [mpirun_config.mpirun_ccl]=2
    [mpirun_config.mpirun_hostfile]=hosts
)
# A file holding KEY: VALUE and the distributed_type it needs.
write_config() { # FILE KEY VALUE
    local type=NO
    case $2 in
    deepspeed_config*) type=DEEPSPEED ;;
    fsdp_config*) type=FSDP ;;
    distributed_type) type=$3 ;;
    esac
    {
        echo "distributed_type: $type"
        case $2 in
        distributed_type) ;;
        *.*) printf '%s:\n  %s: %s\n' "${2%%.*}" "${2#*.}" "$3" ;;
        *) echo "$2: $3" ;;
        esac
    } >"$1"
}
launch_with() { # FILE [ENV...]: accel launch --config_file FILE /bin/true; sets RC
    local f=$1
    shift
    env "$@" "$TIMEOUT" -k 5 30 "$ACCEL" launch --config_file "$f" /bin/true >"$T/out" 2>"$T/err"
    RC=$?
}
mkdir -p "$T/nompi"
TIMEOUT=$(command -v timeout)
n_keys=0
while read -r k p; do
    n_keys=$((n_keys + 1))
    f=$T/$k.yaml
    case $p in
    used | accepted)
        v=${VALUE[$k]:-}
        [ "$p" = accepted ] && v=${v:-something}
        if [ -z "$v" ]; then
            bad "config key $k is used: give test_docs.sh a valid value for it (VALUE)"
            continue
        fi
        write_config "$f" "$k" "$v"
        if [ "$k" = mpirun_config.mpirun_hostfile ]; then
            # Runs the job through mpirun: without one in PATH the launcher must say so.
            launch_with "$f" PATH="$T/nompi"
            grep -q "mpirun" "$T/err" ||
                bad "config key $k: accel launch did not try mpirun: $(head -n 1 "$T/err")"
            continue
        fi
        launch_with "$f"
        if [ "$RC" -ne 0 ] || grep -qi "warning\|error" "$T/err"; then
            bad "config key $k ($p): accel launch with '$k: $v' exited $RC: $(head -n 1 "$T/err")"
        fi
        ;;
    ignored)
        write_config "$f" "$k" something
        launch_with "$f"
        { [ "$RC" -eq 0 ] && grep -q "warning: .*ignoring $k: " "$T/err"; } ||
            bad "config key $k (ignored): expected a warning and exit 0, got exit $RC:" \
                "$(head -n 1 "$T/err")"
        write_config "$f" "$k" false # a neutral value: silent
        launch_with "$f"
        { [ "$RC" -eq 0 ] && [ ! -s "$T/err" ]; } ||
            bad "config key $k: false: expected silence and exit 0, got exit $RC:" \
                "$(head -n 1 "$T/err")"
        ;;
    refused)
        write_config "$f" "$k" something
        launch_with "$f"
        { [ "$RC" -eq 2 ] && grep -q "error: .*$k" "$T/err"; } ||
            bad "config key $k (refused): expected exit 2 naming it, got exit $RC:" \
                "$(head -n 1 "$T/err")"
        ;;
    *) bad "config key $k: unknown policy '$p' in docs/configuration.md" ;;
    esac
done <<<"$doc_keys"
for k in no_such_key deepspeed_config.no_such_key fsdp_config.no_such_key; do
    write_config "$T/unknown.yaml" "$k" 1
    launch_with "$T/unknown.yaml"
    { [ "$RC" -eq 0 ] && grep -q "warning: .*ignoring unknown key \"$k\"" "$T/err"; } ||
        bad "unknown config key $k: expected a warning and exit 0, got exit $RC:" \
            "$(head -n 1 "$T/err")"
done
ok "config keys: $n_keys documented keys and 3 unknown ones through accel launch --config_file"

if [ "$FAILS" -gt 0 ]; then
    echo "FAIL: $FAILS mismatches between the documents and the tool"
    exit 1
fi
echo "PASS"
