#!/bin/bash
# The appliance joins a cluster from its kernel command line, under QEMU (software emulation):
# two guests booted from the same image, their second NICs joined by `-netdev dgram` on
# 127.0.0.1 (the fabric network, 10.0.9.0/24), their first NICs on QEMU's user network (the API,
# forwarded to the host). Guest A serves its baked model and offers it (strata.fabric_ip,
# strata.key); guest B boots with strata.role=join strata.peers=10.0.9.1 and no model: it pulls
# the weights from A over the fabric into its arena, its /health reports the layers as they
# arrive, and its completion is the native greedy text. The key never shows on the console.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/boot.sh
QEMU_DIR=build/qemu/cluster_qemu
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }
command -v "$QEMU_BIN" >/dev/null || { echo "skip - cluster_qemu: $QEMU_BIN is not installed"; exit 0; }
if ! msg=$(boot_image); then nok "cluster_qemu image" "$msg"; exit 1; fi
boot_have_serve || { echo "not ok - cluster_qemu: build/strata has no serve command"; exit 1; }
KEY=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
pa=$(qemu_free_port)
pb=$(qemu_free_port)
ua=$(qemu_free_port)
ub=$(qemu_free_port)
[ "$ua" != "$ub" ] || ub=$((ua + 1))
COMMON="console=ttyS0 quiet strata.ip=10.0.2.15/24 strata.gw=10.0.2.2 strata.key=$KEY strata.fabric_iface=eth1 $BOOT_ARGS"
nic() { # nic API-PORT DGRAM-LOCAL DGRAM-REMOTE
    echo "-netdev user,id=n0,hostfwd=tcp:127.0.0.1:$1-:8080 -device virtio-net-pci,netdev=n0,romfile=,addr=3" \
        "-netdev dgram,id=f0,local.type=inet,local.host=127.0.0.1,local.port=$2,remote.type=inet,remote.host=127.0.0.1,remote.port=$3" \
        "-device virtio-net-pci,netdev=f0,romfile=,addr=4,mac=52:54:00:00:09:$4"
}
trap 'qemu_stop ca; qemu_stop cb' EXIT
t0=$(date +%s.%N)
# shellcheck disable=SC2046
qemu_start ca -kernel "$(boot_kernel)" -initrd "$BOOT_OUT/initrd.img" \
    -append "$COMMON strata.node=1 strata.fabric_ip=10.0.9.1/24 ${BOOT_ARGS%\"} --weight-rate 0.03\"" \
    $(nic "$ua" "$pa" "$pb" 01)
# shellcheck disable=SC2046
qemu_start cb -kernel "$(boot_kernel)" -initrd "$BOOT_OUT/initrd.img" \
    -append "$COMMON strata.node=2 strata.role=join strata.peers=10.0.9.1 strata.fabric_ip=10.0.9.2/24" \
    $(nic "$ub" "$pb" "$pa" 02)

if qemu_wait cb "strata-init: exec" 120 "Kernel panic" "strata-init: error"; then
    lb=$(qemu_log cb)
    if grep -qa "strata-init: exec: strata serve --host 0.0.0.0 --port 8080 --fabric tcp --listen 10.0.9.2:7000 --key-file /run/strata/cluster.key --node-id 2 --peers 10.0.9.1:7000" "$lb"; then
        ok "cluster_qemu joiner's init passes the fabric from the command line (no -m)"
    else
        nok "cluster_qemu joiner's init passes the fabric from the command line" "$(grep -a 'strata-init: exec' "$lb" | tr -d '\r')"
    fi
    if grep -qa "$KEY" "$lb" "$(qemu_log ca)"; then
        nok "cluster_qemu key never on the console" "the cluster key was printed"
    elif grep -qa "strata.key=\*\*\*" "$lb"; then
        ok "cluster_qemu key never on the console (strata.key=***)"
    else
        nok "cluster_qemu key never on the console" "no masked cmdline line"
    fi
else
    nok "cluster_qemu joiner boots to the server" "$(qemu_tail cb 8)"
    exit 1
fi
# The joiner's /health: 503 with layer progress, then 200 "partial" (A, its helper, runs the
# missing layers: a completion is asked then), then 200 "ready". A paces its weights (~35 s for
# the 1 MiB model) so that the partial state lasts.
want=$(boot_expected "$BOOT_PROMPT" "$BOOT_TOKENS")
ask() { curl -s --max-time 300 "http://127.0.0.1:$ub/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\":\"$BOOT_PROMPT\",\"max_tokens\":$BOOT_TOKENS,\"temperature\":0}"; }
seen="" asked=0
limit=$(awk -v s="$QEMU_TIMEOUT_SCALE" 'BEGIN { printf "%d", 240 * s * 5 }')
for ((i = 0; i < limit; i++)); do
    body=$(curl -s --max-time 2 -w ' %{http_code}' "http://127.0.0.1:$ub/health" || true)
    code=${body##* }
    st=$(sed -n 's/.*"state":"\([a-z]*\)".*/\1/p' <<<"${body% *}")
    [ -n "$st" ] && case " $seen " in *" $code:$st "*) ;; *) seen="$seen $code:$st" ;; esac
    if [ "$code" = 200 ] && [ "$st" = partial ] && [ $asked = 0 ]; then
        ask >"$QEMU_DIR/partial.json" &
        asked=$!
    fi
    [ "$code" = 200 ] && [ "$st" = ready ] && break
    qemu_running cb || break
    sleep 0.2
done
if [ "$code" = 200 ] && [ "$st" = ready ]; then
    ok "cluster_qemu joiner pulled the model and serves (/health seen:$seen, $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }') s from QEMU start)"
else
    nok "cluster_qemu joiner pulled the model and serves" "last /health $code $st (seen:$seen): $(qemu_tail cb 6) | A: $(qemu_tail ca 4)"
    exit 1
fi
body=$(ask)
got="$BOOT_PROMPT$(json_field "$body" choices.0.text)"
if [ "$got" = "$want" ]; then
    ok "cluster_qemu joiner's completion is the native greedy text"
else
    nok "cluster_qemu joiner's completion is the native greedy text" "got '$got' want '$want'"
fi
if [ $asked = 0 ]; then
    echo "skip - cluster_qemu completion while partial: every layer arrived before the joiner could serve (/health seen:$seen)"
else
    wait $asked
    body=$(cat "$QEMU_DIR/partial.json")
    got="$BOOT_PROMPT$(json_field "$body" choices.0.text)"
    if [ "$got" = "$want" ]; then
        ok "cluster_qemu completion asked while partial (A runs the missing layers) is the native greedy text"
    else
        nok "cluster_qemu completion asked while partial is the native greedy text" "got '$got' want '$want' (${body:0:200})"
    fi
fi
exit $fail
