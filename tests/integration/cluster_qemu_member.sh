#!/bin/bash
# The appliance as an empty cluster member, from its kernel command line, under QEMU (software
# emulation): strata.role=member strata.cluster=1@10.0.2.15 strata.node=1 and a cluster key, no
# model. Init passes --cluster (the control port added) and the fabric, loads no model, and the
# server starts as a one-node cluster's leader holding nothing: /health 503 "empty: waiting for
# the planner", /v1/cluster names it leader with no model. Without strata.cluster, the member
# role is an init error that names the missing key.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/boot.sh
QEMU_DIR=build/qemu/cluster_qemu_member
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }
command -v "$QEMU_BIN" >/dev/null || { echo "skip - cluster_qemu_member: $QEMU_BIN is not installed"; exit 0; }
if ! msg=$(boot_image); then nok "cluster_qemu_member image" "$msg"; exit 1; fi
KEY=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
port=$(qemu_free_port)
trap 'qemu_stop m; qemu_stop e' EXIT
BASE="console=ttyS0 quiet strata.ip=10.0.2.15/24 strata.gw=10.0.2.2 strata.key=$KEY"
qemu_start m -kernel "$(boot_kernel)" -initrd "$BOOT_OUT/initrd-base.img" \
    -append "$BASE strata.role=member strata.node=1 strata.cluster=1@10.0.2.15" \
    -netdev "user,id=n0,hostfwd=tcp:127.0.0.1:$port-:8080" -device virtio-net-pci,netdev=n0,romfile=
if ! qemu_wait m "strata-init: exec" 120 "Kernel panic" "strata-init: error"; then
    nok "cluster_qemu_member boots to the server" "$(qemu_tail m 8)"
    exit 1
fi
log=$(qemu_log m)
if grep -qa "strata-init: exec: strata serve --host 0.0.0.0 --port 8080 --fabric tcp --listen 10.0.2.15:7000 --key-file /run/strata/cluster.key --node-id 1 --cluster 1@10.0.2.15:7100" "$log" &&
    ! grep -qa "strata-init: exec: .* -m " "$log"; then
    ok "cluster_qemu_member init passes --cluster and the fabric, no model ($(grep -a 'strata-init: cluster' "$log" | tr -d '\r' | cut -c1-90))"
else
    nok "cluster_qemu_member init's server arguments" "$(grep -a 'strata-init: exec' "$log" | tr -d '\r')"
fi
limit=$(awk -v s="$QEMU_TIMEOUT_SCALE" 'BEGIN { printf "%d", 60 * s * 5 }')
h="" c=""
for ((i = 0; i < limit; i++)); do
    h=$(curl -s --max-time 2 "http://127.0.0.1:$port/health" || true)
    c=$(curl -s --max-time 2 "http://127.0.0.1:$port/v1/cluster" || true)
    grep -q '"leader":1' <<<"$c" && grep -q '"models":\[\]' <<<"$c" &&
        grep -q 'empty: waiting for the planner' <<<"$h" && break
    sleep 0.2
done
if grep -q '"leader":1' <<<"$c" && grep -q '"models":\[\]' <<<"$c" &&
    grep -q 'empty: waiting for the planner' <<<"$h"; then
    ok "cluster_qemu_member serves as an empty member: leader of its one-node cluster, no model, /health '$(sed -n 's/.*"stage":"\([^"]*\)".*/\1/p' <<<"$h")'"
else
    nok "cluster_qemu_member empty member" "health: ${h:0:200} cluster: ${c:0:300} | $(qemu_tail m 4)"
fi
qemu_stop m
qemu_start e -kernel "$(boot_kernel)" -initrd "$BOOT_OUT/initrd-base.img" \
    -append "$BASE strata.role=member strata.node=1" -netdev user,id=n0 -device virtio-net-pci,netdev=n0,romfile=
qemu_wait e "reboot: System halted" 60
if grep -qaF "strata-init: error: strata.role=member: needs strata.cluster" "$(qemu_log e)"; then
    ok "cluster_qemu_member without strata.cluster: '$(grep -aF -m1 'strata-init: error' "$(qemu_log e)" | tr -d '\r' | cut -c1-100)' then halt"
else
    nok "cluster_qemu_member without strata.cluster" "$(qemu_tail e 4)"
fi
exit $fail
