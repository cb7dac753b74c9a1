#!/bin/bash
# boot.sh: what the boot tests (tests/integration/boot_*.sh) share, on top of tests/lib/qemu.sh.
#   boot_image            build the appliance image into $BOOT_OUT (build/test-image) unless it
#                         is newer than everything it is made from; sets nothing, prints nothing
#                         unless it fails
#   boot_expected PROMPT N  the native greedy completion (build/strata generate --temp 0), prompt
#                         included, for comparing with the guest's answer
#   boot_http NAME PORT T0  wait for /health 200 on 127.0.0.1:PORT (the guest's forwarded API),
#                         check it reports pid 1 and one process, run a completion and compare it
#                         with boot_expected; prints ok/not ok lines prefixed with NAME. T0 is the
#                         QEMU start time (date +%s.%N) for the "to /health 200" figure.
#   boot_shutdown NAME    ACPI power button (system_powerdown); ok when the guest powers off.
# Results go to the caller's ok/nok functions.
. "$(dirname "${BASH_SOURCE[0]}")/qemu.sh"
# BOOT_HOOKS=1 (set before sourcing): the image's server is build/strata-appliance-test, the
# appliance with the test hooks (--test-crash, --test-hang, --test-step-delay-us: cmd/test_hooks.h),
# built into its own build/test-image-hooks; the others boot the shipped server, which has none.
if [ "${BOOT_HOOKS:-0}" = 1 ]; then
    BOOT_OUT=${BOOT_OUT:-build/test-image-hooks}
    BOOT_SERVER=build/strata-appliance-test
else
    BOOT_OUT=${BOOT_OUT:-build/test-image}
    BOOT_SERVER=build/strata-appliance
fi
BOOT_MODEL=${BOOT_MODEL:-build/models/stories260K.gguf}
BOOT_PROMPT="Once upon a time"
BOOT_TOKENS=40
# The server's arguments (strata.args): its defaults (nothing is timed before it is ready: the
# step model calibrates while idle), -v for the loader's progress lines, the boot's timeline on
# the console.
BOOT_ARGS='strata.args="-v"'
# Kernel keys for the test image's built-in command line (UKI, disk): under software emulation on
# a loaded host the kernel's IO-APIC timer probe can take too long and panic ("IO-APIC + timer
# doesn't work!"); no_timer_check skips that probe, as VM images commonly do.
BOOT_KERNEL_ARGS='no_timer_check'

boot_image() {
    local stamp=$BOOT_OUT/.built newest
    newest=$(ls -t build/strata "$BOOT_SERVER" build/init image/*.sh boot/strata.ipxe boot/pxelinux.cfg/default \
        tests/lib/boot.sh 2>/dev/null | head -n 1)
    if [ -f "$stamp" ] && [ "$stamp" -nt "$newest" ] && [ -f "$BOOT_OUT/strata.img" ]; then return 0; fi
    mkdir -p "$BOOT_OUT"
    # zstd level 9, not the product's 19: 1.1 MB more initrd, 30 s less per build (the boot tests
    # do not test the compression; boot_mkinitrd and `make image` use 19).
    ZSTD_LEVEL=${ZSTD_LEVEL:-9} CMDLINE="$BOOT_KERNEL_ARGS $BOOT_ARGS" MODEL=${MODEL:-} SERVER=$BOOT_SERVER image/build.sh "$BOOT_OUT" >"$BOOT_OUT.log" 2>&1 || {
        echo "image build failed: $(tail -n 3 "$BOOT_OUT.log" | tr '\n' '|')"
        return 1
    }
    # The PXE test's entry point: sets strata-args, then runs the real script.
    printf '#!ipxe\nset strata-args %s\nchain strata.ipxe\n' "$BOOT_ARGS" >"$BOOT_OUT/test.ipxe"
    touch "$stamp"
}

# The kernel QEMU boots directly: the uncompressed ELF (PVH entry, much faster under emulation)
# when the build made one, else the bzImage.
boot_kernel() { if [ -f "$BOOT_OUT/vmlinux" ]; then echo "$BOOT_OUT/vmlinux"; else echo "$BOOT_OUT/vmlinuz"; fi; }

# 1 when the server binary has a serve command (until it lands the tests stop at the exec marker).
boot_have_serve() { grep -q ' serve' <<<"$(build/strata help 2>/dev/null)"; }

boot_expected() {
    build/strata generate -m "$BOOT_MODEL" -p "$1" -n "$2" --temp 0 2>/dev/null
}

# json_field JSON KEY: a top-level number or string field (no jq on the machine).
json_field() {
    python3 -c 'import json,sys
d=json.loads(sys.argv[1]); v=d
for k in sys.argv[2].split("."):
    v = v[int(k)] if isinstance(v, list) else v.get(k)
print(v if v is not None else "")' "$1" "$2" 2>/dev/null
}

boot_http() {
    local name=$1 port=$2 t0=$3 code="" body t_ready i limit
    limit=$(awk -v s="$QEMU_TIMEOUT_SCALE" 'BEGIN { printf "%d", 120 * s * 5 }')
    for ((i = 0; i < limit; i++)); do
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/health" || true)
        [ "$code" = 200 ] && break
        qemu_running "$name" || break
        sleep 0.2
    done
    if [ "$code" != 200 ]; then
        nok "$name health" "no /health 200 on port $port (last: ${code:-none}): $(qemu_tail "$name" 6)"
        return 1
    fi
    t_ready=$(date +%s.%N)
    ok "$name health 200 after $(awk -v a="$t0" -v b="$t_ready" 'BEGIN { printf "%.1f", b - a }') s from QEMU start"
    body=$(curl -s --max-time 10 "http://127.0.0.1:$port/health")
    local pid procs
    pid=$(json_field "$body" pid)
    procs=$(json_field "$body" processes)
    if [ "$pid" = 1 ] && [ "$procs" = 1 ]; then ok "$name server is PID 1 and the only process"
    else nok "$name server is PID 1 and the only process" "/health says pid=$pid processes=$procs: $body"; fi

    local want got text
    want=$(boot_expected "$BOOT_PROMPT" "$BOOT_TOKENS")
    body=$(curl -s --max-time 120 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\":\"$BOOT_PROMPT\",\"max_tokens\":$BOOT_TOKENS,\"temperature\":0}")
    text=$(json_field "$body" choices.0.text)
    got="$BOOT_PROMPT$text"
    if [ -n "$text" ] && [ "$got" = "$want" ]; then
        ok "$name completion matches native greedy output"
    else
        nok "$name completion matches native greedy output" "got '$got' want '$want' (body: ${body:0:300})"
    fi
}

boot_shutdown() {
    local name=$1
    qemu_monitor "$name" system_powerdown >/dev/null 2>&1
    if qemu_wait_exit "$name" 60 && grep -qa "reboot: Power down" "$(qemu_log "$name")"; then
        ok "$name power button shuts down cleanly"
    else
        nok "$name power button shuts down cleanly" "$(qemu_tail "$name" 4)"
    fi
}
