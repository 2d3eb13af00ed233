# The CUDA emulator build's launch rewrite (tests/cuemu/kernel.h; run as `sed -E -f`):
#     kernel<<<grid, block[, smem[, stream]]>>>(args)
# becomes
#     CUEMU_LAUNCH((kernel), grid, block[, smem[, stream]])(args)
# so that g++ compiles the .cu. The kernel is parenthesised because a template kernel's name
# holds commas (f<A, B>) that would split a macro argument. A launch configuration may span
# lines (they are joined, newlines kept, so line numbers do not move) and may use ->, but no
# other '>' (a comparison or shift there: bracket it in a variable first).
# nvcc's `#pragma unroll [n]` becomes GCC's (g++ warns about a pragma it does not know, and a
# diagnostic pragma cannot silence that warning in g++ 12).
s/^([[:space:]]*)#[[:space:]]*pragma[[:space:]]+unroll[[:space:]]*$/\1#pragma GCC unroll 16/
s/^([[:space:]]*)#[[:space:]]*pragma[[:space:]]+unroll[[:space:]]+([^[:space:]].*)$/\1#pragma GCC unroll \2/
# Dynamic shared memory, `extern __shared__ [__align__(n)] T name[];`, becomes a pointer to the
# launch's smem bytes (kernel.h: cuemu::g_dynamic_shared), as every such array aliases them.
s/^([[:space:]]*)extern[[:space:]]+__shared__[[:space:]]+(__align__[[:space:]]*\([^)]*\)[[:space:]]+)?(.*[^[:space:]])[[:space:]]+([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*\[[[:space:]]*\][[:space:]]*;/\1\3 *const \4 = reinterpret_cast<\3 *>(::cuemu::g_dynamic_shared);/
/<<</ {
    :join
    />>>/! {
        $! {
            N
            b join
        }
    }
    s/([A-Za-z_][A-Za-z0-9_:]*(<[^<>;]*(<[^<>;]*>[^<>;]*)*>)?)[[:space:]]*<<<(([^>]|->)*)>>>/CUEMU_LAUNCH((\1), \4)/g
}
