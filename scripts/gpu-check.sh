#!/bin/bash
# gpu-check: the one-shot check of the CUDA backend on a lent GPU machine (docs/cuda.md).
#
#   scripts/gpu-check.sh --prepare
#       here, where the build works (nvcc, Debian's packages): builds the appliance binary, test_cuda,
#       bench_cuda and synth_model with the kernels for sm_80, sm_90 and compute_90 PTX, and gathers
#       them into build/gpu-bundle/ (git ignores it) with their shared libraries and the dynamic
#       loader (image/mkinitrd.sh's closure), a static busybox (every tool --run uses), bash,
#       stories260K (converted here; the synthetic models are generated there, deterministically)
#       and this script; prints the size and the device tool call that runs it.
#   build/gpu-bundle/gpu-check.sh --run [--only STEP,...]
#       there, from the bundle (also here: the GPU parts then skip, the CPU standing in). Needs of the
#       machine only a Linux kernel, the NVIDIA driver (libcuda.so.1: ldconfig's, $LD_LIBRARY_PATH's,
#       the usual folders, or $STRATA_LIBCUDA) and space under /tmp: every program runs through the
#       bundle's loader with the bundle's libraries, every tool is the bundle's busybox.
#
# --run writes under $OUT (default build/gpu-check-out), at most 8 small text files: summary.txt
# first (a header, "# running STEP" as each step starts, then "ok - ..." / "not ok - ..." /
# "skip - ..." lines with their figures as it ends, a total at the end), and STEP.txt per step. Each
# step has its own time limit (STEPS below) and the whole run stays within $GPU_CHECK_BUDGET seconds
# (default 420), so one hang costs one step, not the run. --only runs the probe and the named steps.
# Exit status 0 when nothing is "not ok". GPU_CHECK_WORK: the work folder (default /tmp, or beside
# the bundle when /tmp is short). GPU_CHECK_ASSUME_GPU=1 (tests/integration/gpu_bundle.sh): after
# the probe, every step takes whatever backend serves for the GPU, so the GPU branches run here.
set -u

# --- what --run checks: one line per model, shape or step ----------------------------------------
# End to end, `strata generate` greedy on the CPU and on the GPU, byte-identical text (stories260K
# comes first, from the bundle). NAME  SHAPE (synth_model --shape)  TYPE  TOKENS  [synth_model args]
# llama3-8b-4l: Llama-3-8B's matrices, vocabulary and heads with 4 of its 32 layers (the full depth
# is bench_cuda's); 32 there makes it the whole model, at ~6x the generation time.
GENERATE_MODELS="
tinyllama-q4_0     tinyllama                       q4_0  32
tinyllama-q8_0     tinyllama                       q8_0  32
tinyllama-q4_k     tinyllama                       q4_k  32
llama3-8b-4l-q4_0  4096,14336,4,32,8,128256,8192   q4_0  32  --untied
llama3-8b-4l-q8_0  4096,14336,4,32,8,128256,8192   q8_0  32  --untied
llama3-8b-4l-q4_k  4096,14336,4,32,8,128256,8192   q4_k  32  --untied
tinyllama-q4_k_m   tinyllama                       q4_k_m  32
llama3-8b-4l-q4_k_m  4096,14336,4,32,8,128256,8192 q4_k_m  32  --untied
tinyllama-q6_k     tinyllama                       q6_k  32
"
# Without a GPU each model above is replaced by this small shape of the same type (the plumbing runs).
STANDIN_SHAPE=tiny-gqa
# The benchmark (bench_cuda --shape, --type, --batches, --prefill).
BENCH_SHAPES=1b,8b
BENCH_TYPES=f16,q8_0,q4_0,q4_k,q4_k_m,q6_k
BENCH_BATCHES=8,32,64,128
BENCH_PREFILL=1024
# The steps in order, each with its time limit in seconds.
STEPS="probe:40 test_cuda:90 generate:170 serve:45 coop:45 bench:150 profile:100"
# The profile: bench_cuda with STRATA_CUDA_PROFILE=1 (every launch timed alone) on one shape.
PROFILE_ARGS="--shape 8b --type q4_k_m --batches 64 --prefill 1024"
# The device tool call (printed by --prepare, written in docs/cuda.md).
RUN_COMMAND="bash build/gpu-bundle/gpu-check.sh --run"
RUN_CARRY='["build/gpu-bundle"]'
RUN_TIMEOUT_S=480
PROMPT="Once upon a time"

die() { echo "gpu-check: $*" >&2; exit 1; }

# =================================================================================================
# --prepare (here)
# =================================================================================================

# fatbin_archs FILE: the entries of an nvcc fatbin ("sm_80 sm_90 compute_90"), read from its
# headers: magic 0xba55ed50, u16 version, u16 header size, u64 payload size; then per entry u16
# kind (1 PTX, 2 ELF), u16, u32 entry header size, u64 payload size, ..., u32 arch at byte 28.
fatbin_archs() {
    local f=$1 magic hsz total off end kind ehs psz arch out=""
    u32() { od -An -tu4 -j "$1" -N 4 "$f" | tr -d ' '; }
    magic=$(od -An -tx4 -N 4 "$f" | tr -d ' ')
    [ "$magic" = ba55ed50 ] || { echo "not-a-fatbin"; return 1; }
    hsz=$(od -An -tu2 -j 6 -N 2 "$f" | tr -d ' ')
    total=$(od -An -tu8 -j 8 -N 8 "$f" | tr -d ' ')
    off=$hsz end=$((hsz + total))
    while [ "$off" -lt "$end" ]; do
        kind=$(od -An -tu2 -j "$off" -N 2 "$f" | tr -d ' ')
        ehs=$(u32 $((off + 4)))
        psz=$(od -An -tu8 -j $((off + 8)) -N 8 "$f" | tr -d ' ')
        arch=$(u32 $((off + 28)))
        case $kind in 1) out="$out compute_$arch" ;; 2) out="$out sm_$arch" ;; *) out="$out kind$kind" ;; esac
        [ "$ehs" -gt 0 ] || break
        off=$((off + ehs + psz))
    done
    echo "${out# }"
}

prepare() {
    cd "$(dirname "$0")/.." || exit 1
    local shared=${STRATA_SHARED:-../shared} bundle=build/gpu-bundle jobs
    jobs=$(nproc)
    local nvcc
    nvcc=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })
    [ -n "$nvcc" ] || die "--prepare: no nvcc here: the bundle would carry no kernels (install the CUDA 13 toolkit)"
    for f in stories260K.bin tok512.bin; do
        [ -f "$shared/models/$f" ] || die "--prepare: $shared/models/$f is missing (STRATA_SHARED)"
    done
    command -v busybox >/dev/null || die "--prepare: busybox (Debian's busybox-static) is missing: make deps"
    ! ldd "$(command -v busybox)" >/dev/null 2>&1 ||
        die "--prepare: $(command -v busybox) is not static (install busybox-static)"

    echo "== build (make -j$jobs; the fatbin is cached in build/cuda)"
    local bins="build/strata-appliance build/tests/test_cuda build/bench/bench_cuda build/tools/synth_model"
    # shellcheck disable=SC2086 # the list of targets
    nice make -s -j"$jobs" $bins >build/gpu-bundle-build.log 2>&1 || {
        tail -n 30 build/gpu-bundle-build.log
        die "--prepare: the build failed (build/gpu-bundle-build.log)"
    }
    local archs
    archs=$(fatbin_archs build/cuda/kernels.fatbin) || die "--prepare: build/cuda/kernels.fatbin is not a fatbin"
    for a in sm_80 sm_90 compute_90; do
        case " $archs " in *" $a "*) ;; *) die "--prepare: the fatbin lacks $a (it has: $archs)" ;; esac
    done
    echo "kernels: build/cuda/kernels.fatbin, $(stat -c %s build/cuda/kernels.fatbin) bytes: $archs"

    echo "== gather $bundle"
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bundle.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    build/strata-appliance convert --tokenizer "$shared/models/tok512.bin" \
        "$shared/models/stories260K.bin" "$tmp/stories260K.gguf" >/dev/null 2>&1 ||
        die "--prepare: strata convert of $shared/models/stories260K.bin failed"
    local lib=/lib/x86_64-linux-gnu
    # libcuda.so.1 needs libdl, libpthread and librt besides libc and libm: the bundle's glibc
    # brings its own, so none of the host's (another glibc) is mixed in.
    image/mkinitrd.sh -o "$tmp/bundle.cpio" -z none -S -i scripts/gpu-check.sh \
        -b build/strata-appliance:/bin/strata -b build/tests/test_cuda:/bin/test_cuda \
        -b build/bench/bench_cuda:/bin/bench_cuda -b build/tools/synth_model:/bin/synth_model \
        -b "$(command -v busybox)":/bin/busybox -b /bin/bash:/bin/bash \
        -b $lib/libdl.so.2 -b $lib/libpthread.so.0 -b $lib/librt.so.1 -b $lib/libm.so.6 \
        -f "$tmp/stories260K.gguf":/models/stories260K.gguf \
        -f "$shared/models/stories260K.bin":/shared/models/stories260K.bin \
        -f "$shared/models/tok512.bin":/shared/models/tok512.bin ||
        die "--prepare: image/mkinitrd.sh failed"
    rm -rf "$bundle"
    mkdir -p "$bundle"
    (cd "$bundle" && cpio -idm --quiet <"$tmp/bundle.cpio") || die "--prepare: cannot unpack the bundle"
    # The initrd's skeleton has no place in a folder that travels: device nodes, empty mount points.
    rm -rf "${bundle:?}"/{dev,proc,sys,run,tmp,mnt,etc,lib/modules}
    mv "$bundle/init" "$bundle/gpu-check.sh"
    [ -x "$bundle/lib64/ld-linux-x86-64.so.2" ] || die "--prepare: the bundle has no /lib64/ld-linux-x86-64.so.2"
    {
        echo "strata $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo -dirty), prepared $(date -u +%FT%TZ) on $(hostname)"
        echo "kernels: $archs ($("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p' | head -n 1))"
        echo "glibc $(ldd --version | head -n 1 | awk '{print $NF}'), busybox $(busybox | head -n 1 | awk '{print $2}')"
    } >"$bundle/BUNDLE"

    local bytes tree
    bytes=$(du -sb "$bundle" | cut -f1)
    # What the device tool sends: tracked and untracked-not-ignored files, plus the carried bundle.
    tree=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
    echo "bundle: $bundle, $((bytes / 1024)) KiB in $(find "$bundle" -type f | wc -l) files; with the working tree $(((bytes + tree) / 1048576)) MiB of the device tool's 64 MiB"
    [ $((bytes + tree)) -lt $((56 * 1048576)) ] || die "--prepare: too large to travel (keep it under 56 MiB)"
    cat <<EOF
== the device tool call (docs/cuda.md says what to do with the results)
  command:   $RUN_COMMAND
  carry:     $RUN_CARRY
  timeout_s: $RUN_TIMEOUT_S
Here (no GPU: the GPU parts skip, the CPU stands in): build/gpu-bundle/gpu-check.sh --run
EOF
}

# =================================================================================================
# --run (there, from the bundle)
# =================================================================================================

# Every tool is busybox's (the same ones here, in the chroot test and there).
TOOLS="awk cat cmp cut date df env free grep head ls mkdir mv nproc rm sed sleep tail timeout
       touch tr uname wc wget"

setup_run() {
    B=${BASH_SOURCE[0]%/*}
    [ "$B" = "${BASH_SOURCE[0]}" ] && B=.
    B=$(cd "$B" && pwd) # builtins only: nothing but the bundle may be on PATH yet
    LOADER=$B/lib64/ld-linux-x86-64.so.2
    [ -f "$LOADER" ] && [ -f "$B/bin/strata" ] ||
        die "--run works from the bundle: scripts/gpu-check.sh --prepare, then build/gpu-bundle/gpu-check.sh --run"
    "$B/bin/busybox" chmod 0755 "$LOADER" "$B"/bin/* 2>/dev/null # in case the copy lost the modes
    BB=$B/bin/busybox
    # Work space (the synthetic models, ~3 GB at a time): $GPU_CHECK_WORK, else /tmp or, when that
    # has under 12 GB free, beside the bundle.
    local d kb
    WORK=${GPU_CHECK_WORK:-}
    for d in "${TMPDIR:-/tmp}" "$B/.."; do
        [ -z "$WORK" ] || break
        kb=$("$BB" df -Pk "$d" 2>/dev/null | "$BB" awk 'NR == 2 {print $4}')
        [ "${kb:-0}" -ge $((12 << 20)) ] && WORK=$(cd "$d" && pwd)/gpu-check.$$
    done
    WORK=${WORK:-${TMPDIR:-/tmp}/gpu-check.$$}
    "$BB" rm -rf "$WORK"
    "$BB" mkdir -p "$WORK/bin" "$WORK/models" "$WORK/ref" || die "cannot create $WORK"
    for t in $TOOLS; do "$BB" ln -s "$BB" "$WORK/bin/$t"; done
    PATH=$WORK/bin:$PATH
    OUT=${OUT:-$B/../gpu-check-out}
    mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || die "cannot create $OUT"
    rm -f "$OUT"/*.txt
    LIBS=$B/lib/x86_64-linux-gnu:$B/usr/lib/x86_64-linux-gnu
    NCPU=$(nproc)
    export STRATA_SHARED=$B/shared
    find_libcuda
}

# The driver's libcuda.so.1: $STRATA_LIBCUDA, else what ldconfig knows, $LD_LIBRARY_PATH, the usual
# folders (the CUDA compat folder last). Its folder joins the library path after the bundle's, for
# what it dlopen()s itself (libnvidia-ptxjitcompiler, ...); the bundle's glibc is found first.
find_libcuda() {
    LIBCUDA=${STRATA_LIBCUDA:-}
    if [ -z "$LIBCUDA" ]; then
        local c d
        for c in /sbin/ldconfig /usr/sbin/ldconfig; do
            [ -x "$c" ] && LIBCUDA=$("$c" -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ {print $NF; exit}')
            [ -n "$LIBCUDA" ] && break
        done
        if [ -z "$LIBCUDA" ]; then
            for d in $(echo "${LD_LIBRARY_PATH:-}" | tr : ' ') /usr/local/nvidia/lib64 /usr/local/nvidia/lib \
                /usr/lib/x86_64-linux-gnu /usr/lib64 /lib/x86_64-linux-gnu /lib64 /usr/lib /usr/local/cuda/compat; do
                case $d in *stubs*) continue ;; esac
                [ -e "$d/libcuda.so.1" ] && { LIBCUDA=$d/libcuda.so.1; break; }
            done
        fi
    fi
    if [ -n "$LIBCUDA" ]; then
        export STRATA_LIBCUDA=$LIBCUDA
        LIBS=$LIBS:${LIBCUDA%/*}
    fi
}

# bx PROGRAM ARGS: a bundled program through the bundle's loader and libraries.
bx() { "$LOADER" --library-path "$LIBS" "$@"; }
strata() { bx "$B/bin/strata" "$@"; }

say() { echo "$*" >>"$OUT/summary.txt"; }
result() { # result ok|not_ok|skip NAME DETAIL
    local s=$1
    [ "$s" = not_ok ] && s="not ok"
    local line="$s - $2${3:+: $3}"
    say "$line"
    echo "$line"
    { echo "$line" >&3; } 2>/dev/null # the run's own output (fd 3), when there is one
}
stamp() { echo $(($(date +%s) - T0)); }
gpu_says() { [ "${GPU:-0}" = 1 ]; }

# --- servers ---------------------------------------------------------------------------------
SERVERS=""
# serve_start NAME ENV ARGS...: `strata serve` on 127.0.0.1, a free port; ENV is "" or
# STRATA_BACKEND=cpu. Sets URL and LOGF; 20 s to answer /health.
serve_start() {
    local name=$1 envs=$2 port="" i
    shift 2
    LOGF=$WORK/$name.log
    # shellcheck disable=SC2086 # ENV is one assignment or nothing
    env $envs "$LOADER" --library-path "$LIBS" "$B/bin/strata" serve -m "$B/models/stories260K.gguf" \
        --host 127.0.0.1 --port 0 --threads 2 -v "$@" >"$LOGF" 2>&1 &
    SERVERS="$SERVERS $!"
    for ((i = 0; i < 200; i++)); do
        port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$LOGF" | head -n 1)
        if [ -n "$port" ] && wget -q -O /dev/null "http://127.0.0.1:$port/health" 2>/dev/null; then
            URL=http://127.0.0.1:$port
            return 0
        fi
        kill -0 "${SERVERS##* }" 2>/dev/null || break
        sleep 0.1
    done
    echo "$name did not become ready; its log ends:"
    tail -n 15 "$LOGF"
    return 1
}
serve_stop_all() {
    local p
    for p in $SERVERS; do kill -TERM "$p" 2>/dev/null; done
    for p in $SERVERS; do wait "$p" 2>/dev/null; done
    SERVERS=""
}
# on_gpu LOG: the log says the CUDA backend serves (and did not fall back to the CPU).
on_gpu() {
    [ "${ASSUME_GPU:-0}" = 1 ] && return 0
    grep -q "engine: backend cuda (" "$1" && ! grep -q "; the CPU serves" "$1"
}
backend_of() { grep -o "engine: backend .*" "$1" | tail -n 1 | cut -c 17-; }

# complete URL PROMPT N OUTFILE: one greedy completion; OUTFILE gets the JSON-escaped text.
complete() {
    wget -q -O "$4.json" --header "Content-Type: application/json" \
        --post-data "{\"prompt\":\"$2\",\"max_tokens\":$3,\"temperature\":0,\"ignore_eos\":true}" \
        "$1/v1/completions" 2>"$4.err" || { echo "request failed: $(cat "$4.err")" >"$4"; return 1; }
    sed -n 's/.*"text":"\(\([^"\\]\|\\.\)*\)".*/\1/p' "$4.json" >"$4"
}
metric() { wget -q -O - "$1/metrics" | awk -v n="$2" '$1 == n {print $2}'; }

PROMPTS=("Once upon a time" "The little dog" "Lily and Ben went to the park" "One day, a bird"
    "Tom had a red ball" "The sun was hot" "A cat sat on the mat" "Sara liked to draw")

# reference N TOKENS: the CPU's greedy texts of the first N prompts (the second eight are the first
# eight with " and then" added), one at a time, from a CPU server; cached in $WORK/ref.
prompt_i() { local i=$1; echo "${PROMPTS[$((i % 8))]}$([ "$i" -ge 8 ] && echo " and then")"; }
reference() {
    local n=$1 tokens=$2 i
    [ -f "$WORK/ref/done-$n-$tokens" ] && return 0
    serve_start ref-cpu STRATA_BACKEND=cpu || return 1
    for ((i = 0; i < n; i++)); do complete "$URL" "$(prompt_i $i)" "$tokens" "$WORK/ref/$tokens-$i" || return 1; done
    kill -TERM "${SERVERS##* }"
    wait "${SERVERS##* }"
    SERVERS=${SERVERS% *}
    touch "$WORK/ref/done-$n-$tokens"
}
# burst URL N TOKENS TAG: N completions at once; then compares each with the reference. Sets SAME, DIFF.
burst() {
    local url=$1 n=$2 tokens=$3 tag=$4 i pids=""
    for ((i = 0; i < n; i++)); do
        complete "$url" "$(prompt_i $i)" "$tokens" "$WORK/$tag-$i" &
        pids="$pids $!"
    done
    # shellcheck disable=SC2086
    wait $pids
    SAME=0 DIFF=""
    for ((i = 0; i < n; i++)); do
        if [ -s "$WORK/$tag-$i" ] && cmp -s "$WORK/ref/$tokens-$i" "$WORK/$tag-$i"; then
            SAME=$((SAME + 1))
        else
            DIFF="$DIFF $i"
            echo "prompt $i '$(prompt_i $i)': CPU:  $(cat "$WORK/ref/$tokens-$i")"
            echo "prompt $i '$(prompt_i $i)': this: $(cat "$WORK/$tag-$i")"
        fi
    done
}

# --- the steps -------------------------------------------------------------------------------
step_probe() {
    echo "bundle: $(cat "$B/BUNDLE" 2>/dev/null)"
    echo "host: $(uname -srm), $NCPU CPUs, $(free -m | awk '/^Mem:/ {print $2 " MiB"}'), work in $WORK ($(df -h "$WORK" | awk 'NR == 2 {print $4}') free)"
    echo "host glibc: $(ldd --version 2>/dev/null | head -n 1)"
    echo "host CPU: $(grep -m 1 '^model name' /proc/cpuinfo | cut -d: -f2-);$(grep -m 1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512bw|avx512vl|avx512_vnni|avx_vnni|f16c|fma)$' | tr '\n' ' ')"
    echo "libcuda: ${LIBCUDA:-not found}"
    if command -v nvidia-smi >/dev/null; then
        timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory,pcie.link.gen.max,pcie.link.width.max --format=csv 2>&1
    else
        echo "nvidia-smi: not on PATH"
    fi
    strata generate -v -m "$B/models/stories260K.gguf" -p "$PROMPT" -n 1 --temp 0 >"$WORK/probe.gen" 2>"$WORK/probe.log"
    local rc=$? be
    be=$(backend_of "$WORK/probe.log")
    echo "strata generate: status $rc, engine: backend $be"
    [ $rc = 0 ] || { tail -n 20 "$WORK/probe.log"; result not_ok probe "strata generate failed (status $rc)"; return 1; }
    if on_gpu "$WORK/probe.log"; then
        echo "GPU=1 CARD='$(echo "$be" | sed 's/^cuda (\(.*\))$/\1/')'" >"$WORK/gpu.env"
        result ok probe "backend $be; libcuda $LIBCUDA; $(uname -r); $NCPU CPUs"
    else
        echo "GPU=0 WHY='$(echo "$be" | sed "s/'//g")'" >"$WORK/gpu.env"
        result skip probe "no GPU: backend $be"
    fi
}

step_test_cuda() {
    bx "$B/bin/test_cuda" >"$WORK/test_cuda.out" 2>&1
    local rc=$? n_ok n_no n_skip
    cat "$WORK/test_cuda.out"
    n_ok=$(grep -c '^ok - ' "$WORK/test_cuda.out")
    n_no=$(grep -c '^not ok - ' "$WORK/test_cuda.out")
    n_skip=$(grep -c '^skip - ' "$WORK/test_cuda.out")
    local counts="$n_ok ok, $n_no not ok, $n_skip skip (status $rc)"
    if [ "$n_no" != 0 ] || [ $rc != 0 ]; then
        result not_ok test_cuda "$counts; $(grep '^not ok - ' "$WORK/test_cuda.out" | head -n 5 | cut -c 10- | tr '\n' '|')"
    elif ! gpu_says; then
        result skip test_cuda "no GPU: $counts"
    elif [ "$n_skip" != 0 ]; then
        result not_ok test_cuda "$counts: on a GPU nothing may skip: $(grep '^skip - ' "$WORK/test_cuda.out" | head -n 3 | cut -c 8- | tr '\n' '|')"
    else
        result ok test_cuda "$counts"
    fi
    # The CPU engine the device is held to runs the host's widest kernels (AVX-512 there, AVX2
    # here): again on AVX2, so that a difference of the CPU's kernels shows as such.
    if gpu_says && grep -qw avx512f /proc/cpuinfo; then
        STRATA_ISA=avx2 bx "$B/bin/test_cuda" >"$WORK/test_cuda.avx2" 2>&1
        rc=$?
        echo "== again with STRATA_ISA=avx2 (status $rc)"
        grep -v '^ok - ' "$WORK/test_cuda.avx2"
        n_ok=$(grep -c '^ok - ' "$WORK/test_cuda.avx2")
        n_no=$(grep -c '^not ok - ' "$WORK/test_cuda.avx2")
        if [ "$n_no" != 0 ] || [ $rc != 0 ]; then
            result not_ok "test_cuda (CPU on avx2)" "$n_ok ok, $n_no not ok; $(grep '^not ok - ' "$WORK/test_cuda.avx2" | head -n 5 | cut -c 10- | tr '\n' '|')"
        else
            result ok "test_cuda (CPU on avx2)" "$n_ok ok"
        fi
    fi
}

# The kernels' times on one shape (docs/cuda.md: where a step's time goes).
step_profile() {
    gpu_says || { result skip profile "no GPU"; return; }
    STRATA_CUDA_PROFILE=1 bx "$B/bin/bench_cuda" $PROFILE_ARGS >"$WORK/profile.out" 2>&1
    local rc=$?
    cat "$WORK/profile.out"
    local b1
    b1=$(awk '/^cuda profile, decode batch 1 /{on=1; next} /^cuda profile/{on=0} on && n < 4 {printf "%s %s; ", $1, $(NF); n++}' "$WORK/profile.out")
    # Q4_K's GEMV before the units (STRATA_CUDA_GEMVQ=chunks) beside it, in the same minutes
    echo "== STRATA_CUDA_GEMVQ=chunks (Q4_K by 16-byte chunks, the kernel before k_gemvq_q4k)"
    STRATA_CUDA_GEMVQ=chunks bx "$B/bin/bench_cuda" --shape 8b --type q4_k,q4_k_m --batches 8 --prefill 16 2>&1 | grep '^bench '
    echo "== units (k_gemvq_q4k), the same rows"
    bx "$B/bin/bench_cuda" --shape 8b --type q4_k,q4_k_m --batches 8 --prefill 16 2>&1 | grep '^bench '
    [ $rc = 0 ] && [ -n "$b1" ] && result ok profile "$PROFILE_ARGS: decode batch 1: $b1(profile.txt has every phase)" ||
        result not_ok profile "status $rc: $(tail -n 2 "$WORK/profile.out" | tr '\n' ' ')"
}

# The synthetic models, generated in the background from the start (one at a time, all CPUs but
# two), each renamed into place when complete; at most two wait unused.
make_models() {
    local name shape type tokens extra waiting
    while read -r name shape type tokens extra; do
        [ -n "$name" ] || continue
        [ "$STANDIN" = 1 ] && shape=$STANDIN_SHAPE
        while waiting=("$WORK"/models/*.gguf) && [ -e "${waiting[0]}" ] && [ ${#waiting[@]} -ge 2 ]; do
            sleep 0.5
        done
        # shellcheck disable=SC2086 # extra synth_model arguments
        if ! bx "$B/bin/synth_model" --shape "$shape" --type "$type" --seed 1 $extra \
            --threads $((NCPU > 4 ? NCPU - 2 : 2)) -o "$WORK/models/$name.gguf" >"$WORK/models/$name.log" 2>&1; then
            mv "$WORK/models/$name.log" "$WORK/models/$name.failed"
        fi
    done <<<"$GENERATE_MODELS"
}

# near_tie CPU.log GPU.log: where two greedy runs (strata generate --trace-top 5) first pick
# different tokens, "STEP GAP_CPU GAP_GPU" when they parted at a near-tie: each one's choice is among
# the other's 5 best, within GEN_TIE of its best (over max(1, |best|)); else "STEP far: ...".
# Synthetic models have random weights, nearly flat logits: two correct engines whose activations
# differ in the last bits (sums in another order, now and then a Q8 rounding flipped: ~1e-2 of the
# logits, docs/cuda.md) part within a few dozen tokens, at such a tie. GEN_TIE is test_cuda's
# bound for the block types' engines against the CPU engine (engine_cuda_matches_cpu_*, 5e-2):
# its decode bound, 3e-2, held for test_cuda's 2-layer models but not for 22-layer TinyLlama
# Q4_K_M, where the flipped roundings of more layers add up (0.0306 at a tie, 2026-11-26).
GEN_TIE=0.05
near_tie() {
    awk -v tie=$GEN_TIE '
        function scale(a) { return a > 1 || a < -1 ? (a < 0 ? -a : a) : 1 }
        FNR == 1 { f++ }
        $1 == "top" { s = $2; line[f, s] = $0; split($3, b, ":"); top[f, s] = b[1]; best[f, s] = b[2]; n[f] = s + 1 }
        function logit_of(ff, st, id,   k, parts, m) {
            m = split(line[ff, st], parts, " ")
            for (k = 3; k <= m; k++) { split(parts[k], b, ":"); if (b[1] == id) return b[2] }
            return "none"
        }
        END {
            for (i = 0; i < n[1] && i < n[2]; i++) if (top[1, i] != top[2, i]) break
            if (i == n[1] || i == n[2]) { print i, "same"; exit }
            c = top[1, i]; g = top[2, i]
            lcg = logit_of(1, i, g); lgc = logit_of(2, i, c)
            if (lcg != "none" && lgc != "none") {
                gc = (best[1, i] - lcg) / scale(best[1, i]); gg = (best[2, i] - lgc) / scale(best[2, i])
                if (gc <= tie && gg <= tie) { printf "%d %.2g %.2g\n", i, gc, gg; exit }
            }
            printf "%d far: CPU [%s] GPU [%s]\n", i, line[1, i], line[2, i]
        }' "$1" "$2"
}

# generate_pair NAME MODEL TOKENS WHAT: CPU and GPU (the CPU standing in without one) greedy, at
# the same time; one result line.
generate_pair() {
    local name=$1 model=$2 n=$3 what=$4 w=$WORK/gen-$1 lim=60
    STRATA_BACKEND=cpu timeout $lim "$LOADER" --library-path "$LIBS" "$B/bin/strata" generate -v \
        -m "$model" -p "$PROMPT" -n "$n" --temp 0 --trace-top 5 --threads "$NCPU" >"$w.cpu" 2>"$w.cpu.log" &
    local cpu=$!
    timeout $lim "$LOADER" --library-path "$LIBS" "$B/bin/strata" generate -v \
        -m "$model" -p "$PROMPT" -n "$n" --temp 0 --trace-top 5 --threads "$NCPU" >"$w.gpu" 2>"$w.gpu.log"
    local grc=$?
    wait $cpu
    local crc=$? be speeds
    be=$(backend_of "$w.gpu.log")
    speeds="decode $(sed -n 's/.*decode: .*(\([0-9.]*\) tok\/s).*/\1/p' "$w.cpu.log") tok/s on the CPU, $(sed -n 's/.*decode: .*(\([0-9.]*\) tok\/s).*/\1/p' "$w.gpu.log") on backend ${be%%[ :]*} (at the same time)"
    echo "== $name ($what): CPU status $crc, other status $grc, backend $be"
    echo "CPU:   $(head -c 300 "$w.cpu" | tr -c ' -~' '.')" # synthetic vocabularies print bytes
    echo "other: $(head -c 300 "$w.gpu" | tr -c ' -~' '.')"
    if [ $crc != 0 ] || [ $grc != 0 ]; then
        tail -n 5 "$w.cpu.log" "$w.gpu.log"
        result not_ok "generate $name" "$what: exit status CPU $crc, CUDA $grc (143: stopped at ${lim} s)"
        return
    fi
    local nb same
    nb=$(wc -c <"$w.cpu")
    same=$(cmp "$w.cpu" "$w.gpu" 2>/dev/null && echo yes)
    if ! gpu_says; then
        [ "$same" = yes ] && result skip "generate $name" "no GPU; the CPU stood in ($what): both runs gave the same $nb bytes" ||
            result not_ok "generate $name" "($what) two CPU runs differ"
    elif ! on_gpu "$w.gpu.log"; then
        result not_ok "generate $name" "$what: not on the GPU: backend $be"
    elif [ "$same" = yes ]; then
        result ok "generate $name" "$what: CUDA = CPU, $nb bytes of greedy text; $speeds"
    else
        local at tie
        at=$(cmp "$w.cpu" "$w.gpu" 2>&1 | sed -n 's/.* differ: \(char\|byte\) \([0-9]*\).*/\2/p')
        tie=$(near_tie "$w.cpu.log" "$w.gpu.log")
        echo "first different token: $tie"
        case $tie in
        *far* | *same* | "")
            result not_ok "generate $name" "$what: CUDA's text differs from the CPU's from byte ${at:-?} of $nb, token ${tie:-?}; $speeds" ;;
        *)
            set -- $tie
            result ok "generate $name" "$what: CUDA = CPU for $1 tokens (byte ${at:-?} of $nb), then a near-tie (each one's pick within $2 / $3 of its best in the other's logits); $speeds" ;;
        esac
    fi
}

step_generate() {
    generate_pair stories260K "$B/models/stories260K.gguf" 64 "stories260K f32"
    local name shape type tokens extra what t
    while read -r name shape type tokens extra; do
        [ -n "$name" ] || continue
        what="$shape $type${extra:+ $extra}"
        [ "$STANDIN" = 1 ] && what="$STANDIN_SHAPE $type, standing in for $shape"
        for ((t = 0; t < 1200; t++)); do # the model is being made (make_models)
            [ -f "$WORK/models/$name.gguf" ] || [ -f "$WORK/models/$name.failed" ] && break
            sleep 0.1
        done
        if [ -f "$WORK/models/$name.gguf" ]; then
            generate_pair "$name" "$WORK/models/$name.gguf" "$tokens" "$what"
            rm -f "$WORK/models/$name.gguf"
        elif [ -f "$WORK/models/$name.failed" ]; then
            cat "$WORK/models/$name.failed"
            result not_ok "generate $name" "synth_model failed: $(tail -n 1 "$WORK/models/$name.failed")"
        else
            result not_ok "generate $name" "$what: the model was not made within 120 s"
        fi
    done <<<"$GENERATE_MODELS"
}

step_serve() {
    local n=16 tokens=48
    reference $n $tokens || { result not_ok serve "the CPU reference server failed"; return; }
    serve_start serve-gpu "" || { result not_ok serve "strata serve did not start"; return; }
    local url=$URL log=$LOGF
    burst "$url" $n $tokens serve
    local finished steps stoks gen
    finished=$(metric "$url" 'strata_requests_total{outcome="length"}')
    gen=$(metric "$url" strata_generation_tokens_total)
    steps=$(metric "$url" strata_steps_total)
    stoks=$(metric "$url" strata_step_tokens_total)
    echo "== /metrics after the burst"
    wget -q -O - "$url/metrics" | grep -v '^#' | grep -v '_bucket'
    serve_stop_all
    echo "== the server's log (last 20 lines)"
    tail -n 20 "$log"
    local figs="$SAME/$n texts = the CPU's; /metrics: $finished requests done, $gen tokens generated in $steps steps (mean $((stoks / (steps > 0 ? steps : 1))) tokens a step)"
    if ! gpu_says; then
        [ "$SAME" = $n ] && [ "$finished" = $n ] && result skip serve "no GPU; the CPU stood in: $figs" ||
            result not_ok serve "(CPU standing in) $figs; differ:$DIFF"
    elif ! on_gpu "$log"; then
        result not_ok serve "not on the GPU: backend $(backend_of "$log")"
    elif [ "$SAME" = $n ] && [ "$finished" = $n ] && [ "$gen" = $((n * tokens)) ]; then
        result ok serve "$n concurrent completions on $(backend_of "$log"): $figs"
    else
        result not_ok serve "$figs; differ:$DIFF"
    fi
}

# A helper serving every layer on the GPU and a CPU joiner whose own share rises k = 0 -> 5 during
# the requests (tests/integration/cluster_coop.sh's first scenario), over TCP on loopback.
step_coop() {
    local n=4 tokens=80 port i
    reference $n $tokens || { result not_ok coop "the CPU reference server failed"; return; }
    printf '%s' 5f1c2a3b4d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7f8 >"$WORK/coop.key"
    for ((i = 0; i < 3; i++)); do # a port from the dynamic range; another on a clash
        port=$((20000 + RANDOM % 30000))
        serve_start coop-helper "" --fabric tcp --listen "127.0.0.1:$port" --key-file "$WORK/coop.key" && break
    done
    [ $i -lt 3 ] || { result not_ok coop "the helper did not start"; return; }
    local hurl=$URL hlog=$LOGF
    serve_start coop-joiner STRATA_BACKEND=cpu --fabric tcp --peers "127.0.0.1:$port" --key-file "$WORK/coop.key" \
        --resident-schedule 0:0,3:1,9:2,20:4,45:5 --coop-kv transfer || { result not_ok coop "the joiner did not start"; return; }
    local jurl=$URL jlog=$LOGF
    for ((i = 0; i < 100; i++)); do
        grep -q "coop: helper .* connected" "$jlog" && break
        sleep 0.1
    done
    burst "$jurl" $n $tokens coop
    local steps served partial k
    steps=$(metric "$jurl" strata_coop_remote_steps_total)
    partial=$(metric "$jurl" strata_coop_partial_tokens_total)
    k=$(metric "$jurl" strata_coop_k)
    served=$(metric "$hurl" strata_coop_served_steps_total)
    serve_stop_all
    echo "== the helper's log (last 15 lines)"
    tail -n 15 "$hlog"
    echo "== the joiner's log (last 15 lines)"
    tail -n 15 "$jlog"
    local figs="$SAME/$n texts through the joiner = the CPU's alone; $steps steps sent to the helper (it served $served), $partial tokens while partial, k=$k at the end"
    local fine=0
    [ "$SAME" = $n ] && [ "${steps:-0}" -gt 0 ] && [ "$served" = "$steps" ] && [ "$k" = 5 ] && fine=1
    if ! gpu_says; then
        [ $fine = 1 ] && result skip coop "no GPU; the CPU stood in for the helper: $figs" ||
            result not_ok coop "(CPU standing in) $figs; differ:$DIFF"
    elif ! on_gpu "$hlog"; then
        result not_ok coop "the helper is not on the GPU: backend $(backend_of "$hlog")"
    elif [ $fine = 1 ]; then
        result ok coop "CUDA helper + CPU joiner over TCP: $figs"
    else
        result not_ok coop "$figs; differ:$DIFF"
    fi
}

step_bench() {
    bx "$B/bin/bench_cuda" --shape "$BENCH_SHAPES" --type "$BENCH_TYPES" --batches "$BENCH_BATCHES" \
        --prefill "$BENCH_PREFILL" >"$WORK/bench.out" 2>&1
    local rc=$? line
    cat "$WORK/bench.out"
    if grep -q '^skip - bench_cuda' "$WORK/bench.out"; then
        gpu_says && result not_ok bench "$(grep '^skip' "$WORK/bench.out" | cut -c 8-) on a GPU" ||
            result skip bench "no GPU: $(grep '^skip' "$WORK/bench.out" | cut -c 20-)"
        return
    fi
    grep -q '^HBM peak' "$WORK/bench.out" || { result not_ok bench "status $rc: $(tail -n 2 "$WORK/bench.out" | tr '\n' ' ')"; return; }
    say "# $(grep '^device:' "$WORK/bench.out")"
    say "# $(grep '^HBM peak' "$WORK/bench.out")"
    while IFS= read -r line; do
        case $line in
        *": failed: "*) result not_ok "${line%%: failed:*}" "failed: ${line#*: failed: }" ;;
        *) result ok "${line%%: *}" "${line#*: }" ;;
        esac
    done < <(grep '^bench ' "$WORK/bench.out")
    # 1: some shape or type failed (said above); anything else: it died on the way
    [ $rc = 0 ] || { [ $rc = 1 ] && grep -q ': failed: ' "$WORK/bench.out"; } ||
        result not_ok bench "bench_cuda exited with status $rc after: $(tail -n 1 "$WORK/bench.out")"
}

# run_step NAME LIMIT: the step in its own process group, its output in $OUT/NAME.txt; killed with
# everything it started when it outlives LIMIT or the run's budget.
run_step() {
    local name=$1 limit=$2 left pid dog rc t0
    left=$((DEADLINE - $(date +%s)))
    if [ "$left" -lt 10 ]; then
        result skip "$name" "no time left in the run's $BUDGET s"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    say "# $(stamp) s: running $name (limit $limit s)"
    t0=$(date +%s)
    set -m
    "step_$name" >"$OUT/$name.txt" 2>&1 &
    pid=$!
    (sleep "$limit" && touch "$WORK/killed-$name" && kill -TERM -- "-$pid" && sleep 3 && kill -KILL -- "-$pid") \
        >/dev/null 2>&1 &
    dog=$!
    set +m
    wait "$pid"
    rc=$?
    kill -KILL -- "-$dog" 2>/dev/null
    wait "$dog" 2>/dev/null
    kill -KILL -- "-$pid" 2>/dev/null # whatever the step left running
    if [ -f "$WORK/killed-$name" ]; then
        result not_ok "$name" "stopped at its time limit, $limit s (see $name.txt)"
    elif [ $rc != 0 ] && ! grep -q "^not ok - $name" "$OUT/summary.txt"; then
        result not_ok "$name" "exited with status $rc (see $name.txt)"
    fi
    say "#   $name took $(($(date +%s) - t0)) s"
}

run() {
    local only=""
    case ${1:-} in --only) only=",${2:-},";; "") ;; *) die "--run [--only STEP,...]" ;; esac
    setup_run
    exec 3>&1 # each result line shows here too, as it comes
    T0=$(date +%s)
    BUDGET=${GPU_CHECK_BUDGET:-420}
    DEADLINE=$((T0 + BUDGET))
    {
        echo "# gpu-check --run $(date -u +%FT%TZ), bundle: $(head -n 1 "$B/BUNDLE" 2>/dev/null)"
        echo "# budget $BUDGET s; steps: $STEPS${only:+; only $only}"
    } >"$OUT/summary.txt"
    local s name limit maker=""
    for s in $STEPS; do
        name=${s%%:*} limit=${s#*:}
        [ "$name" = probe ] || [ -z "$only" ] || case $only in *",$name,"*) ;; *) continue ;; esac
        run_step "$name" "$limit"
        if [ "$name" = probe ]; then
            # shellcheck disable=SC1091
            . "$WORK/gpu.env" 2>/dev/null || GPU=0
            STANDIN=$((1 - GPU))
            if [ "${GPU_CHECK_ASSUME_GPU:-0}" = 1 ]; then
                GPU=1 ASSUME_GPU=1
                say "# GPU_CHECK_ASSUME_GPU=1 (a test of this script): every backend counts as the GPU; no figure below is a GPU's"
            fi
            say "# GPU=$GPU ${CARD:-${WHY:-}}"
            if [ -z "$only" ] || [[ $only == *,generate,* ]]; then
                set -m
                make_models >"$WORK/make_models.log" 2>&1 &
                maker=$!
                set +m
            fi
        fi
    done
    [ -n "$maker" ] && kill -KILL -- "-$maker" 2>/dev/null
    # Logs stay small (what comes back is limited): a long one keeps its head and tail.
    for f in "$OUT"/*.txt; do
        if [ "$(wc -c <"$f")" -gt 1000000 ]; then
            { head -c 400000 "$f"; echo; echo "[... cut ...]"; tail -c 400000 "$f"; } >"$f.cut" && mv "$f.cut" "$f"
        fi
    done
    local n_ok n_no n_skip
    n_ok=$(grep -c '^ok - ' "$OUT/summary.txt")
    n_no=$(grep -c '^not ok - ' "$OUT/summary.txt")
    n_skip=$(grep -c '^skip - ' "$OUT/summary.txt")
    say "# done in $(stamp) s: $n_ok ok, $n_no not ok, $n_skip skip"
    echo "# done in $(stamp) s: $n_ok ok, $n_no not ok, $n_skip skip; $OUT/summary.txt"
    rm -rf "$WORK"
    [ "$n_no" = 0 ]
}

case ${1:-} in
--prepare) prepare ;;
--run) shift; run "$@" ;;
*) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
