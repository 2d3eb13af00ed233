#!/usr/bin/env bash
# make install works for users: headers, libraries, accel, pkg-config and the CMake package.
# Installs the build tree into a temporary prefix, then builds examples/hello.c three ways
# (pkg-config, the static archive with pkg-config --static's dependencies, find_package) and
# runs each.
set -euo pipefail
# Runs a program and checks its output (no `| grep -q` under pipefail: grep's early exit
# would kill the program with SIGPIPE).
expect() { local want=$1; shift; local out; out=$("$@" 2>&1) || return 1; grep -q "$want" <<<"$out"; }
build=${ACCEL_BUILD_DIR:?}
src=${ACCEL_SOURCE_DIR:?}
if grep -q '^ACCEL_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
    # Users link the library without -fsanitize; an instrumented one cannot be linked so.
    echo "SKIP: a sanitizer build is not what users install"
    exit 77
fi
tmp=$(mktemp -d /tmp/accel-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
for f in bin/accel include/accel/accel.h lib/pkgconfig/accel.pc lib/cmake/accel/accelConfig.cmake; do
    [ -e "$tmp/prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
expect '^accel ' "$tmp/prefix/bin/accel" --version || { echo "FAIL: installed accel --version"; exit 1; }

export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
# shellcheck disable=SC2046
cc -std=c11 -o "$tmp/hello_shared" "$src/examples/hello.c" $(pkg-config --cflags --libs accel)
LD_LIBRARY_PATH="$tmp/prefix/lib" expect "Num processes: 1" "$tmp/hello_shared" ||
    { echo "FAIL: pkg-config (shared) build does not run"; exit 1; }
cc -std=c11 -o "$tmp/hello_static" "$src/examples/hello.c" -I"$tmp/prefix/include" "$tmp/prefix/lib/libaccel.a" $(pkg-config --static --libs accel | sed "s/-laccel//") -fopenmp
expect "Num processes: 1" "$tmp/hello_static" || { echo "FAIL: static libaccel.a build"; exit 1; }
if ldd "$tmp/hello_static" | grep -q libaccel; then
    echo "FAIL: --static build still links libaccel.so"; exit 1
fi

mkdir "$tmp/proj"
cat > "$tmp/proj/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.20)
project(user C)
find_package(accel REQUIRED)
add_executable(hello $src/examples/hello.c)
target_link_libraries(hello accel::accel)
CM
cmake -S "$tmp/proj" -B "$tmp/proj/b" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/proj/b" >/dev/null
LD_LIBRARY_PATH="$tmp/prefix/lib" expect "Num processes: 1" "$tmp/proj/b/hello" ||
    { echo "FAIL: find_package build does not run"; exit 1; }
LD_LIBRARY_PATH="$tmp/prefix/lib" expect "Num processes: 2" \
    "$tmp/prefix/bin/accel" launch --num_processes 2 "$tmp/proj/b/hello" ||
    { echo "FAIL: installed accel launch of a find_package build"; exit 1; }
echo "PASS: install, pkg-config (shared, static), find_package"
