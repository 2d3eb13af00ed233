#!/usr/bin/env bash
# scripts/check-layers.sh (run by make test): the project passes it, and in a copy of the
# project a planted include that breaks DESIGN.md §2 (ckpt reaching train's private header, the
# coupling the state protocol removed) is reported with file, line and rule, and fails it; so is
# a library module reading the environment (settings are resolved once, at accel_init).
set -euo pipefail
src=${ACCEL_SOURCE_DIR:?}
tmp=$(mktemp -d /tmp/accel-layers-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

out=$(bash "$src/scripts/check-layers.sh" 2>&1) || fail "the project breaks the layering: $out"

mkdir -p "$tmp/scripts" "$tmp/src/ckpt" "$tmp/src/train"
cp "$src/scripts/check-layers.sh" "$tmp/scripts/"
printf '#include "core/internal.h"\n#include "train/train_internal.h"\n' >"$tmp/src/ckpt/bad.c"
printf '#include "core/internal.h"\n' >"$tmp/src/train/ok.c"
mkdir -p "$tmp/src/track" "$tmp/src/cli"
printf '#include <stdlib.h>\nconst char *u(void) { return getenv("USER"); }\n' \
    >"$tmp/src/track/env.c"
printf '#include <stdlib.h>\nconst char *p(void) { return getenv("PATH"); }\n' >"$tmp/src/cli/env.c"
git -C "$tmp" init -q && git -C "$tmp" add -A
rc=0
out=$(bash "$tmp/scripts/check-layers.sh" 2>&1) || rc=$?
[ "$rc" -eq 1 ] || fail "exit $rc for a planted violation: $out"
grep -q '^src/ckpt/bad.c:2: ckpt may not include train/train_internal.h (layer train)$' <<<"$out" ||
    fail "the violation is not named: $out"
! grep -q 'ok.c' <<<"$out" || fail "an allowed include is reported: $out"
grep -q '^src/track/env.c:2: reads the environment after accel_init' <<<"$out" ||
    fail "the environment read is not named: $out"
! grep -q 'src/cli/env.c' <<<"$out" || fail "the CLI's environment read is reported: $out"
echo "check-layers: the project passes;" \
    "a planted ckpt -> train include and a late getenv are caught"
