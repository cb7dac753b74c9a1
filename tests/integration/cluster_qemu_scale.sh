#!/bin/bash
# Two appliances form a cluster from their kernel command lines and the leader scales out, under
# QEMU (software emulation): second NICs joined by `-netdev dgram` on 127.0.0.1 (10.0.9.0/24:
# the fabric and the control plane), first NICs on QEMU's user network (the API, forwarded to the
# host). Guest A serves its baked model (strata.cluster=1@10.0.9.1,2@10.0.9.2 strata.node=1, slow
# steps so a burst overloads it); guest B boots with strata.role=member and no model. A burst on
# A makes the leader scale out to B, which pulls the model from A over the fabric, serves while
# the layers arrive, and answers with the native greedy text.
set -u
cd "$(dirname "$0")/../.."
BOOT_HOOKS=1 # the server is told to crash, hang or slow down (cmd/test_hooks.h)
. tests/lib/boot.sh
QEMU_DIR=build/qemu/cluster_qemu_scale
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }
command -v "$QEMU_BIN" >/dev/null || { echo "skip - cluster_qemu_scale: $QEMU_BIN is not installed"; exit 0; }
if ! msg=$(boot_image); then nok "cluster_qemu_scale image" "$msg"; exit 1; fi
KEY=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
pa=$(qemu_free_port)
pb=$(qemu_free_port)
ua=$(qemu_free_port)
ub=$(qemu_free_port)
[ "$ua" != "$ub" ] || ub=$((ua + 1))
COMMON="console=ttyS0 quiet strata.ip=10.0.2.15/24 strata.gw=10.0.2.2 strata.key=$KEY strata.fabric_iface=eth1 strata.cluster=1@10.0.9.1,2@10.0.9.2"
nic() { # nic API-PORT DGRAM-LOCAL DGRAM-REMOTE MAC
    echo "-netdev user,id=n0,hostfwd=tcp:127.0.0.1:$1-:8080 -device virtio-net-pci,netdev=n0,romfile=,addr=3" \
        "-netdev dgram,id=f0,local.type=inet,local.host=127.0.0.1,local.port=$2,remote.type=inet,remote.host=127.0.0.1,remote.port=$3" \
        "-device virtio-net-pci,netdev=f0,romfile=,addr=4,mac=52:54:00:00:09:$4"
}
trap 'qemu_stop sa; qemu_stop sb' EXIT
# shellcheck disable=SC2046
qemu_start sa -kernel "$(boot_kernel)" -initrd "$BOOT_OUT/initrd.img" \
    -append "$COMMON strata.node=1 strata.fabric_ip=10.0.9.1/24 strata.args=\"--max-batch 2 --step-tokens 32 --weight-rate 0.05 --test-step-delay-us 100000 --ttft-ms 300 --keep-alive-ms 600000\"" \
    $(nic "$ua" "$pa" "$pb" 01)
# shellcheck disable=SC2046
qemu_start sb -kernel "$(boot_kernel)" -initrd "$BOOT_OUT/initrd-base.img" \
    -append "$COMMON strata.node=2 strata.role=member strata.fabric_ip=10.0.9.2/24 strata.args=\"--keep-alive-ms 600000\"" \
    $(nic "$ub" "$pb" "$pa" 02)
limit=$(awk -v s="$QEMU_TIMEOUT_SCALE" 'BEGIN { printf "%d", 180 * s * 5 }')
up=0
for ((i = 0; i < limit; i++)); do
    c=$(curl -s --max-time 2 "http://127.0.0.1:$ua/v1/cluster" || true)
    if python3 -c "
import json, sys
d = json.loads(sys.argv[1])
sys.exit(0 if d['leader'] and sum(n['alive'] for n in d['nodes']) == 2 else 1)" "$c" 2>/dev/null; then
        up=1
        break
    fi
    qemu_running sa && qemu_running sb || break
    sleep 0.2
done
if [ $up = 0 ]; then
    nok "cluster_qemu_scale two appliances form a cluster" "A: ${c:0:200} | $(qemu_tail sa 4) | B: $(qemu_tail sb 4)"
    exit 1
fi
ok "cluster_qemu_scale two appliances form a cluster from their command lines (leader $(json_field "$c" leader))"
want=$(boot_expected "$BOOT_PROMPT" "$BOOT_TOKENS")
LONG=$(printf 'Once upon a time there was a little girl who liked to play. %.0s' $(seq 1 8))
BURST=()
for i in $(seq 1 8); do
    curl -s -m 600 -o /dev/null "http://127.0.0.1:$ua/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"'"$LONG"'","max_tokens":16,"temperature":0}' &
    BURST+=($!)
done
# B serves (partial or ready) once the leader scaled it up and its embedding arrived
served=0 seen=""
for ((i = 0; i < limit; i++)); do
    body=$(curl -s --max-time 2 -w ' %{http_code}' "http://127.0.0.1:$ub/health" || true)
    code=${body##* }
    st=$(sed -n 's/.*"state":"\([a-z]*\)".*/\1/p' <<<"${body% *}")
    [ -n "$st" ] && case " $seen " in *" $code:$st "*) ;; *) seen="$seen $code:$st" ;; esac
    if [ "$code" = 200 ] && { [ "$st" = partial ] || [ "$st" = ready ]; }; then
        served=1
        break
    fi
    qemu_running sb || break
    sleep 0.2
done
if [ $served = 0 ]; then
    nok "cluster_qemu_scale the leader scaled out to the member" "B /health seen:$seen | $(curl -s --max-time 2 "http://127.0.0.1:$ua/v1/cluster" | head -c 400) | B: $(qemu_tail sb 5)"
else
    ev=$(curl -s --max-time 2 "http://127.0.0.1:$ua/v1/cluster" | python3 -c "
import json, sys
d = json.load(sys.stdin)
print([e for e in d['events'] if e['event'] == 'scale_up'][:1])" 2>/dev/null)
    ok "cluster_qemu_scale the leader scaled out to the member: $ev; B serves ($st, /health seen:$seen)"
    body=$(curl -s --max-time 600 "http://127.0.0.1:$ub/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\":\"$BOOT_PROMPT\",\"max_tokens\":$BOOT_TOKENS,\"temperature\":0}")
    got="$BOOT_PROMPT$(json_field "$body" choices.0.text)"
    if [ "$got" = "$want" ]; then
        ok "cluster_qemu_scale the member's completion (asked when it served $st) is the native greedy text"
    else
        nok "cluster_qemu_scale the member's completion is the native greedy text" "got '$got' want '$want' (${body:0:200})"
    fi
fi
for p in "${BURST[@]}"; do kill "$p" 2>/dev/null; done
wait "${BURST[@]}" 2>/dev/null
exit $fail
