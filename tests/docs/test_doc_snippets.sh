#!/usr/bin/env bash
# The C code shown in README.md and docs/*.md compiles as shown, against the headers and the
# library of this build, with -std=c11 -Wall -Wextra -Wpedantic -Werror.
#
# Conventions for writing C in those documents:
#   - A ```c block that contains "int main(" is a whole program: compiled as it stands and
#     linked with libaccel.
#   - Any other ```c block is a fragment. Its #include lines go to file scope; the rest becomes
#     the body of a function `int doc_fragment(void)`, so it may end in `return 1;`. All the
#     fragments of one document form one translation unit, in document order.
#   - Names a fragment uses but does not declare come from context comments, which do not show
#     when the document is rendered:
#         <!-- doc-test context
#         #include <accel/accel.h>
#         accel *acc; int steps;
#         -->
#     Their lines are placed at file scope for the fragments that follow in the same document.
#     (Fragments may declare what only later text uses: -Wunused-variable and friends are off
#     for fragments.)
#   - `<!-- doc-test skip: REASON -->` on the line before a ```c fence leaves that block out
#     (pseudo-code). Keep these rare.
# Errors point at the document's lines (#line directives).
set -euo pipefail
build=${ACCEL_BUILD_DIR:?}
src=${ACCEL_SOURCE_DIR:?}
if grep -q '^ACCEL_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
    echo "SKIP: the sanitizer build's libaccel.so needs -fsanitize to link"
    exit 77
fi
lib=$(ls "$build"/libaccel.so 2>/dev/null) || { echo "FAIL: $build/libaccel.so not built"; exit 1; }
tmp=$(mktemp -d /tmp/accel-docs-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cflags=(-std=c11 -Wall -Wextra -Wpedantic -Werror -I"$src/include")
# Fragments may also show the internals that docs describe (src/core/profile.h).
frag_flags=(-Wno-unused-variable -Wno-unused-but-set-variable -Wno-unused-function -I"$src/src")

# Splits one document into $out/fragments.c and $out/program_<line>.c; prints
# "fragments programs skipped" counts, or fails on a malformed directive.
extract() {
    awk -v doc="$1" -v out="$2" '
    function fail(msg) { printf "%s:%d: %s\n", doc, NR, msg > "/dev/stderr"; bad = 1; exit 1 }
    BEGIN { frag = out "/fragments.c"; printf "" > frag; nf = np = ns = 0 }
    mode == "context" {
        if ($0 ~ /-->/) { mode = ""; next }
        printf "#line %d \"%s\"\n%s\n", NR, doc, $0 >> frag
        next
    }
    mode == "code" {
        if ($0 ~ /^```[ \t]*$/) { emit(); mode = ""; next }
        body[++n] = $0
        next
    }
    mode == "other" { if ($0 ~ /^```[ \t]*$/) mode = ""; next }
    /^<!-- doc-test context[ \t]*$/ { mode = "context"; next }
    /^<!-- doc-test skip: .+-->[ \t]*$/ { skip_at = NR + 1; next }
    /^<!-- doc-test/ {
        fail("unknown doc-test directive (doc-test context / doc-test skip: REASON)")
    }
    /^```c[ \t]*$/ {
        mode = "code"; start = NR; n = 0
        skipping = (skip_at == NR)
        next
    }
    /^```/ {
        if (skip_at == NR) fail("doc-test skip before a block that is not ```c")
        mode = "other"; next
    }
    { if (skip_at == NR) fail("doc-test skip must be on the line before a ```c fence") }
    function emit(   i, is_main, f) {
        if (skipping) { ns++; return }
        is_main = 0
        for (i = 1; i <= n; i++) if (body[i] ~ /int main\(/) is_main = 1
        if (is_main) {
            f = out "/program_" start ".c"; np++
            printf "#line %d \"%s\"\n", start + 1, doc > f
            for (i = 1; i <= n; i++) print body[i] > f
            close(f)
            return
        }
        nf++
        for (i = 1; i <= n; i++)
            if (body[i] ~ /^[ \t]*#[ \t]*include/)
                printf "#line %d \"%s\"\n%s\n", start + i, doc, body[i] >> frag
        printf "int doc_fragment_%d(void);\nint doc_fragment_%d(void)\n{\n#line %d \"%s\"\n",
            start, start, start + 1, doc >> frag
        for (i = 1; i <= n; i++) print (body[i] ~ /^[ \t]*#[ \t]*include/ ? "" : body[i]) >> frag
        print "return 0;\n}" >> frag
    }
    END {
        if (bad) exit 1
        if (mode == "code") { NR = start; fail("unterminated ```c block") }
        if (mode == "context") fail("unterminated doc-test context comment")
        print nf, np, ns
    }' "$src/$1"
}

failed=0 total=0
summary=()
cd "$src"
for doc in README.md docs/*.md; do
    out="$tmp/${doc//\//_}"
    mkdir -p "$out"
    counts=$(extract "$doc" "$out") || { failed=1; continue; }
    read -r nf np ns <<<"$counts"
    total=$((total + nf + np))
    [ $((nf + np + ns)) -eq 0 ] && continue
    summary+=("$doc: $nf fragments, $np programs, $ns skipped")
    if [ "$nf" -gt 0 ] &&
        ! cc "${cflags[@]}" "${frag_flags[@]}" -c "$out/fragments.c" -o "$out/fragments.o"; then
        echo "FAIL: the fragments of $doc do not compile"
        failed=1
    fi
    for prog in "$out"/program_*.c; do
        [ -e "$prog" ] || continue
        if ! cc "${cflags[@]}" "$prog" -o "${prog%.c}" -L"$(dirname "$lib")" -laccel \
            -Wl,-rpath,"$(dirname "$lib")"; then
            echo "FAIL:" \
                "the program at $doc:$(basename "$prog" .c | sed 's/program_//') does not build"
            failed=1
        fi
    done
done
printf '%s\n' "${summary[@]}"
[ "$total" -gt 0 ] || { echo "FAIL: no C code found in the documents"; exit 1; }
[ "$failed" -eq 0 ] || exit 1
echo "PASS: $total C blocks compile"
