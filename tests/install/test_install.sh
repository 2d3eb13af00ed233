#!/usr/bin/env bash
# make install works for users, the way README.md ("Using the library") says: headers,
# libraries, accel (and accel test's program), pkg-config and the CMake package. Installs the
# build tree into a temporary prefix and builds examples four ways, each run without
# LD_LIBRARY_PATH:
#   hello.c with pkg-config, shared, and the documented -Wl,-rpath (not a system prefix);
#   linear_regression.c (its optimizer's kernels use OpenMP) with pkg-config --static and
#   libaccel.a: the private dependencies listed suffice;
#   find_package: hello.c with accel::accel, linear_regression.c with accel::accel_static.
# Also: the install runs ldconfig exactly when the library directory is one the dynamic loader
# searches (a stand-in ldconfig decides which directories those are), and the relocatable
# accel.pc finds the prefix from a Debian multiarch libdir (PREFIX=/usr: lib/<triplet>).
set -euo pipefail
# Runs a program and checks its output (no `| grep -q` under pipefail: grep's early exit
# would kill the program with SIGPIPE).
expect() { local want=$1; shift; local out; out=$("$@" 2>&1) ||
    return 1; grep -q "$want" <<<"$out"; }
fail() { echo "FAIL: $*"; exit 1; }
build=${ACCEL_BUILD_DIR:?}
src=${ACCEL_SOURCE_DIR:?}
if grep -q '^ACCEL_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
    # Users link the library without -fsanitize; an instrumented one cannot be linked so.
    echo "SKIP: a sanitizer build is not what users install"
    exit 77
fi
unset LD_LIBRARY_PATH
tmp=$(mktemp -d /tmp/accel-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
libdir_rel=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:PATH=//p' "$build/CMakeCache.txt")

# ---- ldconfig: run for a directory the loader searches, never for another one ----
mkdir "$tmp/bin"
cat >"$tmp/bin/ldconfig" <<'SH'
#!/bin/sh
# Stand-in: `ldconfig -N -v` lists $FAKE_SEARCHED as a searched directory; any other call
# (rebuilding the cache) is recorded.
if [ "${1:-}" = -N ]; then
    printf '%s: (from test)\n\tlibc.so.6 -> libc.so.6\n' "$FAKE_SEARCHED"
    exit 0
fi
echo "ldconfig $*" >>"$FAKE_CALLS"
SH
chmod +x "$tmp/bin/ldconfig"
export FAKE_CALLS=$tmp/ldconfig.calls
out=$(PATH="$tmp/bin:$PATH" FAKE_SEARCHED="$tmp/sys/$libdir_rel" \
    cmake --install "$build" --prefix "$tmp/sys" 2>&1)
[ "$(cat "$FAKE_CALLS" 2>/dev/null)" = "ldconfig " ] ||
    fail "installing into a searched directory did not run ldconfig once: $out"
rm -f "$FAKE_CALLS"
out=$(PATH="$tmp/bin:$PATH" FAKE_SEARCHED=/nonexistent \
    cmake --install "$build" --prefix "$tmp/prefix" 2>&1)
[ ! -e "$FAKE_CALLS" ] || fail "installing into $tmp/prefix ran ldconfig"
grep -q -- "-Wl,-rpath,$tmp/prefix/$libdir_rel" <<<"$out" ||
    fail "installing into a prefix the loader does not search does not say how to run programs:" \
        "$out"
out=$(DESTDIR="$tmp/stage" PATH="$tmp/bin:$PATH" FAKE_SEARCHED="$tmp/sys/$libdir_rel" \
    cmake --install "$build" --prefix "$tmp/sys" 2>&1)
[ ! -e "$FAKE_CALLS" ] || fail "a DESTDIR (package staging) install ran ldconfig"
rm -rf "$tmp/sys" "$tmp/stage"

for f in bin/accel include/accel/accel.h "$libdir_rel/pkgconfig/accel.pc" \
    "$libdir_rel/cmake/accel/accelConfig.cmake" libexec/accel/test_worker; do
    [ -e "$tmp/prefix/$f" ] || fail "$f not installed"
done
expect '^accel ' "$tmp/prefix/bin/accel" --version || fail "installed accel --version"
# accel test finds its program in the install's libexec/accel.
HF_HOME=$tmp/hf OMP_NUM_THREADS=1 expect '^Test is a success!' "$tmp/prefix/bin/accel" test ||
    fail "installed accel test"

# ---- pkg-config ----
export PKG_CONFIG_PATH="$tmp/prefix/$libdir_rel/pkgconfig"
libdir=$(pkg-config --variable=libdir accel)
[ "$(realpath "$libdir")" = "$(realpath "$tmp/prefix/$libdir_rel")" ] || fail "pc libdir is $libdir"
# shellcheck disable=SC2046
cc -std=c11 -o "$tmp/hello_shared" "$src/examples/hello.c" $(pkg-config --cflags --libs accel) \
    -Wl,-rpath,"$(pkg-config --variable=libdir accel)"
expect "Num processes: 1" "$tmp/hello_shared" ||
    fail "pkg-config (shared, rpath) build does not run"
# shellcheck disable=SC2046
cc -std=c11 -o "$tmp/lr_static" "$src/examples/linear_regression.c" $(pkg-config --cflags accel) \
    "$(pkg-config --variable=libdir accel)/libaccel.a" \
    $(pkg-config --static --libs accel | sed 's/-laccel\b//') ||
    fail "pkg-config --static does not name every dependency of libaccel.a"
expect "the weights agree" "$tmp/lr_static" || fail "static libaccel.a build does not run"
if ldd "$tmp/lr_static" | grep -q libaccel; then
    fail "--static build still links libaccel.so"
fi

# A PREFIX=/usr build puts accel.pc in lib/<triplet>/pkgconfig: the relocatable prefix must
# climb one folder more. Configure only (the .pc is made at configure time).
cmake -S "$src" -B "$tmp/multiarch" -DACCEL_BUILD_TESTS=OFF -DCMAKE_INSTALL_PREFIX=/usr \
    -DCMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu >/dev/null
mkdir -p "$tmp/usr/lib/x86_64-linux-gnu/pkgconfig"
cp "$tmp/multiarch/accel.pc" "$tmp/usr/lib/x86_64-linux-gnu/pkgconfig/"
pc_dir=$tmp/usr/lib/x86_64-linux-gnu/pkgconfig
inc=$(PKG_CONFIG_PATH="$pc_dir" pkg-config --variable=includedir accel)
lib=$(PKG_CONFIG_PATH="$pc_dir" pkg-config --variable=libdir accel)
[ "$(realpath -m "$inc")" = "$tmp/usr/include" ] &&
    [ "$(realpath -m "$lib")" = "$tmp/usr/lib/x86_64-linux-gnu" ] ||
    fail "multiarch accel.pc: includedir $inc, libdir $lib"

# ---- CMake package ----
mkdir "$tmp/proj"
cat >"$tmp/proj/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.20)
project(user C)
find_package(accel REQUIRED)
add_executable(hello $src/examples/hello.c)
target_link_libraries(hello accel::accel)
add_executable(lr_static $src/examples/linear_regression.c)
target_link_libraries(lr_static accel::accel_static)
CM
cmake -S "$tmp/proj" -B "$tmp/proj/b" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/proj/b" >"$tmp/proj/build.log" 2>&1 ||
    fail "find_package builds: $(grep -m3 -i 'error\|undefined' "$tmp/proj/build.log")"
expect "Num processes: 1" "$tmp/proj/b/hello" ||
    fail "find_package (accel::accel) build does not run"
expect "the weights agree" "$tmp/proj/b/lr_static" || fail "accel::accel_static build does not run"
if ldd "$tmp/proj/b/lr_static" | grep -q libaccel; then
    fail "accel::accel_static build links libaccel.so"
fi
expect "Num processes: 2" "$tmp/prefix/bin/accel" launch --num_processes 2 "$tmp/proj/b/hello" ||
    fail "installed accel launch of a find_package build"
echo "PASS: install (ldconfig when searched), pkg-config (shared + rpath, static)," \
    "find_package (shared, static)"
