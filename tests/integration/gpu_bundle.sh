#!/bin/bash
# gpu_bundle: the GPU check's bundle (scripts/gpu-check.sh --prepare -> build/gpu-bundle/) is
# self-contained. --run runs from it in a root that holds only the bundle, mounted read-only (a
# chroot in a private mount namespace; beside it /proc, /sys, /dev/null and friends, /tmp, /out
# and the CUDA toolkit's stub libcuda.so.1 where a machine keeps its driver), through the bundle's
# own loader, libraries and busybox, so that a missing library, tool or file shows here rather than
# in a lent GPU machine's few minutes. Two runs:
#   - as it is (no GPU): every step ends in "skip - ...: no GPU ..." with the CPU standing in (each
#     text compared, the servers, the cooperative helper and joiner run), none in "not ok";
#   - with GPU_CHECK_ASSUME_GPU=1, so the GPU branches run: the CPU's texts pass as the GPU's
#     ("ok"), test_cuda's skips and bench_cuda's "no CUDA device" are "not ok".
# Also: docs/cuda.md gives the device call --prepare prints. About 25 s here (the fatbin is cached
# in build/cuda).
set -u
cd "$(dirname "$0")/../.." || exit 1
fail=0
ok() { echo "ok - $*"; }
not_ok() { echo "not ok - $*"; fail=1; }

if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "skip - gpu bundle: no nvcc here (the bundle needs the kernels)"
    exit 0
fi
if ! prep=$(bash scripts/gpu-check.sh --prepare 2>&1); then
    not_ok "gpu bundle --prepare: $(echo "$prep" | tail -n 3 | tr '\n' ' ')"
    exit 1
fi
ok "gpu bundle --prepare: $(echo "$prep" | grep '^kernels:'); $(echo "$prep" | grep '^bundle:')"

# The call --prepare prints is the one docs/cuda.md gives.
cmd=$(echo "$prep" | sed -n 's/^  command: *//p')
carry=$(echo "$prep" | sed -n 's/^  carry: *//p')
tmo=$(echo "$prep" | sed -n 's/^  timeout_s: *//p')
if [ -n "$cmd" ] && grep -qF "{\"command\": \"$cmd\", \"carry\": $carry, \"timeout_s\": $tmo}" docs/cuda.md; then
    ok "gpu bundle: docs/cuda.md gives the device call --prepare prints ($cmd, carry $carry, timeout_s $tmo)"
else
    not_ok "gpu bundle: docs/cuda.md does not give the call --prepare prints: command '$cmd', carry $carry, timeout_s $tmo"
fi

R=$(mktemp -d /tmp/gpu_bundle.XXXXXX)
trap 'rm -rf "$R"' EXIT
mkdir -p "$R"/{bundle,tmp,proc,sys,dev}
for d in null zero random urandom; do : >"$R/dev/$d"; done
STUB=/usr/local/cuda/lib64/stubs/libcuda.so
want_probe="no CUDA device (libcuda.so.1 not found)"
if [ -f $STUB ]; then
    mkdir -p "$R/usr/local/nvidia/lib64"
    cp $STUB "$R/usr/local/nvidia/lib64/libcuda.so.1"
    want_probe="no CUDA device (cuInit: CUDA_ERROR_STUB_LIBRARY"
fi
# As root a private mount namespace; otherwise a user namespace that maps us to root.
ns=(unshare --mount --fork)
[ "$(id -u)" = 0 ] || ns=(unshare --user --map-root-user --mount --fork)
if ! "${ns[@]}" true 2>/dev/null; then
    echo "skip - gpu bundle in a clean root: ${ns[*]} is not allowed here"
    exit $fail
fi

# in_root NAME [VAR=VALUE]: --run in the clean root, results in $R/NAME (the chroot's /NAME); sets
# S (the summary), RC and SECS.
in_root() {
    local name=$1 t0
    shift
    mkdir -p "$R/$name"
    t0=$(date +%s)
    "${ns[@]}" bash -c '
        R=$1 name=$2
        shift 2
        mount --make-rprivate / &&
            mount --bind build/gpu-bundle "$R/bundle" && mount -o remount,bind,ro "$R/bundle" &&
            mount -t proc proc "$R/proc" && mount --rbind /sys "$R/sys" || exit 1
        for d in null zero random urandom; do mount --bind "/dev/$d" "$R/dev/$d" || exit 1; done
        exec env -i PATH=/nonexistent HOME=/ TMPDIR=/tmp OUT="/$name" "$@" "$(command -v chroot)" "$R" \
            /bundle/lib64/ld-linux-x86-64.so.2 --library-path /bundle/lib/x86_64-linux-gnu \
            /bundle/bin/bash /bundle/gpu-check.sh --run
    ' _ "$R" "$name" "$@" >"$R/$name.log" 2>&1
    RC=$?
    SECS=$(($(date +%s) - t0))
    S=$R/$name/summary.txt
    [ -s "$S" ] && return 0
    not_ok "gpu bundle --run in a clean root ($name): no summary (status $RC): $(tail -n 5 "$R/$name.log" | tr '\n' ' ')"
    return 1
}
# want RUN WHAT COUNT PATTERN: COUNT summary lines match ^PATTERN.
want() {
    local n
    n=$(grep -c "^$4" "$S")
    if [ "$n" = "$3" ]; then
        ok "gpu bundle in a clean root ($1), $2: $(grep -m1 "^$4" "$S")"
    else
        not_ok "gpu bundle in a clean root ($1), $2: $n lines '$4', want $3"
    fi
}
rows=$(sed -n '/^GENERATE_MODELS="/,/^"/p' scripts/gpu-check.sh | grep -c '^[a-z]')

if in_root nogpu; then
    [ $RC = 0 ] && ok "gpu bundle --run in a clean root: exit status 0 in $SECS s" ||
        not_ok "gpu bundle --run in a clean root: exit status $RC in $SECS s"
    while IFS= read -r l; do not_ok "gpu bundle --run in a clean root: $l"; done < <(grep '^not ok - ' "$S")
    want nogpu probe 1 "skip - probe: no GPU: backend cpu: $want_probe"
    want nogpu test_cuda 1 "skip - test_cuda: no GPU: [1-9][0-9]* ok, 0 not ok"
    want nogpu "generate, stories260K and $rows synthetic rows" $((rows + 1)) \
        "skip - generate .*: no GPU; the CPU stood in (.*): both runs gave the same [1-9][0-9]* bytes"
    want nogpu serve 1 "skip - serve: no GPU; the CPU stood in: 16/16 texts = the CPU's; /metrics: 16 requests done, 768 tokens"
    want nogpu coop 1 "skip - coop: no GPU; the CPU stood in for the helper: 4/4 texts .* k=5 at the end"
    want nogpu bench 1 "skip - bench: no GPU: no CUDA device"
    want nogpu profile 1 "skip - profile: no GPU"
    files=$(ls "$R/nogpu" | wc -l)
    [ "$files" -le 8 ] && ok "gpu bundle: $files files under \$OUT (the device tool returns 8 at most)" ||
        not_ok "gpu bundle: $files files under \$OUT, the device tool returns 8 at most"
    [ $fail = 0 ] || sed 's/^/  | /' "$S"
fi

if in_root assume GPU_CHECK_ASSUME_GPU=1; then
    [ $RC = 1 ] && ok "gpu bundle, GPU assumed: exit status 1 (test_cuda, bench not ok) in $SECS s" ||
        not_ok "gpu bundle, GPU assumed: exit status $RC, want 1"
    want assume probe 1 "# GPU_CHECK_ASSUME_GPU=1 (a test of this script)"
    want assume test_cuda 1 "not ok - test_cuda: [1-9][0-9]* ok, 0 not ok, [1-9][0-9]* skip (status 0): on a GPU nothing may skip: "
    want assume "generate, stories260K and $rows synthetic rows" $((rows + 1)) \
        "ok - generate .*: CUDA = CPU, [1-9][0-9]* bytes of greedy text; decode [0-9.]* tok/s on the CPU, [0-9.]* on backend cpu"
    want assume serve 1 "ok - serve: 16 concurrent completions on cpu: .*: 16/16 texts = the CPU's"
    want assume coop 1 "ok - coop: CUDA helper + CPU joiner over TCP: 4/4 texts"
    want assume bench 1 "not ok - bench: bench_cuda: no CUDA device .* on a GPU"
    want assume profile 1 "not ok - profile: status [0-9]*: .*no CUDA device"
    lines=$((rows + 7))
    # on an AVX-512 host the script runs test_cuda again on the AVX2 kernels: one line more
    if grep -qw avx512f /proc/cpuinfo; then
        want assume "test_cuda (CPU on avx2)" 1 "ok - test_cuda (CPU on avx2): [1-9][0-9]* ok"
        lines=$((lines + 1))
    fi
    n=$(grep -c '^\(ok\|not ok\|skip\) - ' "$S")
    [ "$n" = $lines ] && ok "gpu bundle, GPU assumed: $n result lines, none other" ||
        not_ok "gpu bundle, GPU assumed: $n result lines, want $lines"
    [ $fail = 0 ] || sed 's/^/  | /' "$S"
fi
exit $fail
