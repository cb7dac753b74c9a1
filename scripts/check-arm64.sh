#!/bin/bash
# check-arm64.sh DIR TEST...: run the engine's aarch64 test programs (built by `make check-arm64`
# into DIR) under qemu-aarch64 user emulation, so that every kernel table runs:
#   qemu's `max` CPU (dotprod, i8mm, SVE2): every test with the table the engine picks (i8mm;
#     test_matmul walks scalar, neon, dotprod and i8mm itself), then test_engine again with
#     STRATA_ISA=dotprod, =neon and =scalar (the whole forward pass on each table);
#   a Neoverse N1 (dot product, no i8mm) and a Cortex-A57 (Armv8.0: NEON, no dot product):
#     test_fwd_kernels, and test_engine on the A57, where the engine's own choice must fall back
#     to dotprod and neon (an instruction the CPU lacks would trap under qemu).
# A test that prints "# ... ISA on this CPU: X" must name the table expected on that CPU (one
# more "ok"/"not ok" line). Lines come out as "ok - [arm64 CPU ISA] TEST: name" (not ok, skip
# alike); a program that exits non-zero without a "not ok" line is one "not ok". Exit status 1 if
# anything failed. Correctness only: under emulation time says nothing of speed (docs/arm64.md).
set -u
dir=$1
shift
QEMU=${ARM64_QEMU:-qemu-aarch64 -L /usr/aarch64-linux-gnu}
fail=0

run() { # run <cpu> <STRATA_ISA or ""> <expected table> <test>
    local cpu=$1 isa=$2 want=$3 t=$4 label out rc got
    label="arm64 $cpu ${isa:-best}"
    if [ -n "$isa" ]; then
        out=$(STRATA_ISA=$isa $QEMU -cpu "$cpu" "$dir/$t" 2>&1)
    else
        out=$(env -u STRATA_ISA $QEMU -cpu "$cpu" "$dir/$t" 2>&1)
    fi
    rc=$?
    printf '%s\n' "$out" | sed -n "s/^\(ok\|not ok\|skip\) - /\1 - [$label] $t: /p"
    printf '%s\n' "$out" | grep -q '^not ok - ' && fail=1
    got=$(printf '%s\n' "$out" | sed -n 's/^# .*ISA on this CPU: \([a-z0-9]*\)$/\1/p' | head -n 1)
    if [ -n "$got" ]; then
        if [ "$got" = "$want" ]; then
            echo "ok - [$label] $t: kernels chosen: $got"
        else
            echo "not ok - [$label] $t: kernels chosen: $got, expected $want"
            fail=1
        fi
    fi
    if [ $rc -ne 0 ]; then
        fail=1
        if ! printf '%s\n' "$out" | grep -q '^not ok - '; then
            echo "not ok - [$label] $t: exited with status $rc"
            printf '%s\n' "$out" | tail -n 15 | sed 's/^/    /'
        fi
    fi
}

for t in "$@"; do run max "" i8mm "$t"; done
for t in "$@"; do
    [ "$t" = test_engine ] || continue
    for isa in dotprod neon scalar; do run max $isa $isa "$t"; done
done
for t in "$@"; do
    case $t in test_fwd_kernels) run neoverse-n1 "" dotprod "$t" ;; esac
    case $t in test_fwd_kernels | test_engine) run cortex-a57 "" neon "$t" ;; esac
done
exit $fail
