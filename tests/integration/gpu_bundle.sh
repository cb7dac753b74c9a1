#!/bin/bash
# gpu_bundle: the GPU check's bundle (scripts/gpu-check.sh --prepare -> build/gpu-bundle/) is
# self-contained. --run's non-GPU parts run from it in a root that holds only the bundle, mounted
# read-only (a chroot in a private mount namespace; beside it /proc, /sys, /dev/null and friends,
# /tmp, /out and the CUDA toolkit's stub libcuda.so.1 where a driver would be), through the bundle's own loader, libraries and busybox, so that a missing library,
# tool or file shows here rather than in a lent GPU machine's few minutes. Without a GPU every step
# ends in "skip - ...: no GPU ..." with the CPU standing in (each text compared, servers, the
# cooperative helper and joiner run), and none in "not ok". docs/cuda.md gives the device call
# --prepare prints. About 15 s here (the fatbin is cached in build/cuda).
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
if [ -n "$cmd" ] && grep -qF "\"command\": \"$cmd\"" docs/cuda.md && grep -qF "\"carry\": $carry" docs/cuda.md &&
    grep -qF "\"timeout_s\": $tmo" docs/cuda.md; then
    ok "gpu bundle: docs/cuda.md gives the device call --prepare prints ($cmd, carry $carry, timeout_s $tmo)"
else
    not_ok "gpu bundle: docs/cuda.md does not give the call --prepare prints: command '$cmd', carry $carry, timeout_s $tmo"
fi

R=$(mktemp -d /tmp/gpu_bundle.XXXXXX)
trap 'rm -rf "$R"' EXIT
mkdir -p "$R"/{bundle,out,tmp,proc,sys,dev}
for d in null zero random urandom; do : >"$R/dev/$d"; done
# The toolkit's stub driver where a machine keeps the real one: --run finds it, the bundle's loader
# and glibc load it and resolve every driver call, and its cuInit refuses (no GPU behind it).
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
t0=$(date +%s)
"${ns[@]}" bash -c '
    R=$1
    mount --make-rprivate / &&
    mount --bind build/gpu-bundle "$R/bundle" && mount -o remount,bind,ro "$R/bundle" &&
    mount -t proc proc "$R/proc" && mount --rbind /sys "$R/sys" &&
    for d in null zero random urandom; do mount --bind "/dev/$d" "$R/dev/$d" || exit 1; done &&
    exec env -i PATH=/nonexistent HOME=/ TMPDIR=/tmp OUT=/out "$(command -v chroot)" "$R" \
        /bundle/lib64/ld-linux-x86-64.so.2 --library-path /bundle/lib/x86_64-linux-gnu \
        /bundle/bin/bash /bundle/gpu-check.sh --run
' _ "$R" >"$R/run.log" 2>&1
rc=$?
secs=$(($(date +%s) - t0))
S=$R/out/summary.txt
if [ ! -s "$S" ]; then
    not_ok "gpu bundle --run in a clean root: no summary (status $rc): $(tail -n 5 "$R/run.log" | tr '\n' ' ')"
    exit 1
fi
[ $rc = 0 ] && ok "gpu bundle --run in a clean root: exit status 0 in $secs s" ||
    not_ok "gpu bundle --run in a clean root: exit status $rc in $secs s"
while IFS= read -r l; do not_ok "gpu bundle --run in a clean root: $l"; done < <(grep '^not ok - ' "$S")

# Every step ran, and says why it skipped: no GPU, the CPU standing in.
rows=$(sed -n '/^GENERATE_MODELS="/,/^"/p' scripts/gpu-check.sh | grep -c '^[a-z]')
want() { # want NAME PATTERN COUNT
    local n
    n=$(grep -c "^skip - $2" "$S")
    if [ "$n" = "$3" ]; then
        ok "gpu bundle in a clean root, $1: $(grep -m1 "^skip - $2" "$S" | cut -c 8-)"
    else
        not_ok "gpu bundle in a clean root, $1: $n lines 'skip - $2', want $3"
    fi
}
want probe "probe: no GPU: backend cpu: $want_probe" 1
want test_cuda "test_cuda: no GPU: [1-9][0-9]* ok, 0 not ok" 1
want "generate (stories260K and $rows synthetic rows)" "generate .*: no GPU; the CPU stood in (.*): both runs gave the same [1-9][0-9]* bytes" $((rows + 1))
want serve "serve: no GPU; the CPU stood in: 16/16 texts = the CPU's; /metrics: 16 requests done" 1
want coop "coop: no GPU; the CPU stood in for the helper: 4/4 texts .* k=5 at the end" 1
want bench "bench: no GPU: no CUDA device" 1
files=$(ls "$R/out" | wc -l)
[ "$files" -le 8 ] && ok "gpu bundle: $files files under \$OUT (the device tool returns 8 at most)" ||
    not_ok "gpu bundle: $files files under \$OUT, the device tool returns 8 at most"
[ $fail = 0 ] || { echo "--- summary"; cat "$S"; echo "--- output"; tail -n 20 "$R/run.log"; }
exit $fail
