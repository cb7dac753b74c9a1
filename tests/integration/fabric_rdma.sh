#!/bin/bash
# RDMA for real, under software emulation: a QEMU guest (Debian's kernel, a test initramfs built
# by image/mkinitrd.sh) loads rdma_rxe, adds a Soft-RoCE device on its virtio NIC, and runs two
# `strata node` processes against its own address: the joiner pulls the weight image from the
# source's registered arena with one-sided RDMA READs (control messages over the authenticated
# TCP channel) and must end with the exact bytes; a joiner with the wrong cluster key must get
# nothing. The same guest then runs a kernel-TCP chain under tc netem (loss, delay, reordering),
# which the test host's kernel may lack. One guest runs both ends (event-mode completions; busy polling is ~20x slower under
# emulation).
set -u
cd "$(dirname "$0")/../.."
. tests/lib/qemu.sh
N=rdma_soft_roce_pull_in_qemu
STRATA=${STRATA:-build/strata-appliance} # the appliance's binary (no simulator)
[ -x "$STRATA" ] || { echo "not ok - $N: $STRATA not built"; exit 1; }
command -v "$QEMU_BIN" >/dev/null || { echo "skip - $N: $QEMU_BIN is not installed"; exit 0; }
if [ ! -f build/kernel/vmlinuz ]; then
    image/fetch-kernel.sh build/kernel >/dev/null 2>&1 ||
        { echo "skip - $N: no guest kernel (image/fetch-kernel.sh failed: offline?)"; exit 0; }
fi
RXE=$(ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so 2>/dev/null | head -n 1)
[ -n "$RXE" ] || { echo "skip - $N: rdma-core's rxe provider is not installed"; exit 0; }
W=$(mktemp -d /tmp/fabric_rdma.XXXXXX)
QEMU_DIR=$W
QEMU_MEM=${QEMU_MEM:-1024}
trap 'qemu_stop fab; [ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$W/key"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$W/badkey"

cat >"$W/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /etc/modules); do insmod "$m" || echo "FABRIC: insmod $m failed"; done
ip link set lo up
i=0; while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
rdma link add rxe0 type rxe netdev eth0 || echo "FABRIC: rdma link add failed"
echo "FABRIC: rdma devices: $(ls /sys/class/infiniband 2>/dev/null)"
rdma_selftest rxe0 2>&1 | sed 's/^/FABRIC-DRIVER: /'
A=10.0.2.15
strata node --role source --transport rdma --listen $A:7000 --key-file /key --synthetic 24M:12:8 \
    --image-out /tmp/src.img --exit-after 1 --timeout 120 >/tmp/src.out 2>/tmp/src.err &
S=$!
sleep 1
strata node --role joiner --transport rdma --peer $A:7000 --key-file /badkey --image-out /tmp/bad.img \
    --timeout 10 >/tmp/bad.out 2>/tmp/bad.err
echo "FABRIC: wrong key: $(tail -n 1 /tmp/bad.out)"
strata node --role joiner --transport rdma --peer $A:7000 --key-file /key --image-out /tmp/j.img \
    --timeout 120 >/tmp/j.out 2>/tmp/j.err
wait $S
echo "FABRIC: source: $(tail -n 1 /tmp/src.out)"
echo "FABRIC: joiner: $(tail -n 1 /tmp/j.out)"
tail -n 5 /tmp/j.err /tmp/src.err
if [ -e /tmp/bad.img ]; then R="not ok (the wrong key got an image)"
elif cmp /tmp/src.img /tmp/j.img; then R=ok
else R="not ok (bytes differ)"; fi
rm -f /tmp/*.img
# Kernel TCP under tc netem (this guest's kernel has sch_netem; the test host's may not): a chain
# source -> n1 -> n2 over the loopback, 3% loss, 2 ms +- 1 ms delay, 10% reordering.
if /usr/sbin/tc qdisc add dev lo root netem loss 3% delay 2ms 1ms reorder 10% 50%; then
    strata node --role source --transport tcp --listen 127.0.0.1:7100 --key-file /key --synthetic 8M:12:4 \
        --image-out /tmp/nsrc.img --exit-after 1 --timeout 120 -q >/tmp/ns.out 2>&1 &
    strata node --role joiner --transport tcp --listen 127.0.0.1:7101 --peer 127.0.0.1:7100 --exit-after 1 \
        --key-file /key --image-out /tmp/n1.img --timeout 120 -q >/tmp/n1.out 2>&1 &
    strata node --role joiner --transport tcp --peer 127.0.0.1:7101 --key-file /key --image-out /tmp/n2.img \
        --timeout 120 -q >/tmp/n2.out 2>&1
    wait
    /usr/sbin/tc qdisc del dev lo root
    echo "FABRIC: netem n2: $(tail -n 1 /tmp/n2.out)"
    if cmp /tmp/nsrc.img /tmp/n1.img && cmp /tmp/nsrc.img /tmp/n2.img; then echo "FABRIC-NETEM: ok"
    else echo "FABRIC-NETEM: not ok"; fi
else
    echo "FABRIC-NETEM: skip (tc netem failed)"
fi
echo "FABRIC-RESULT: $R"
poweroff -f
INIT
chmod +x "$W/init"

if ! image/mkinitrd.sh -o "$W/initrd" -i "$W/init" -z gzip -b /bin/busybox -b "$STRATA:/bin/strata" \
    -b build/tools/rdma_selftest:/bin/rdma_selftest \
    -b "$RXE" -b /usr/bin/rdma -b /usr/sbin/tc -f /etc/libibverbs.d/rxe.driver:/etc/libibverbs.d/rxe.driver \
    -f "$W/key:/key" -f "$W/badkey:/badkey" -m virtio_pci -m virtio_net -m rdma_rxe -m sch_netem >"$W/mkinitrd.log" 2>&1; then
    echo "not ok - $N: mkinitrd failed: $(tail -n 3 "$W/mkinitrd.log" | tr '\n' ' ')"
    exit 1
fi
qemu_start fab -kernel build/kernel/vmlinuz -initrd "$W/initrd" \
    -append "console=ttyS0 quiet panic=-1 rdinit=/init" \
    -netdev user,id=n0 -device virtio-net-pci,netdev=n0
if ! qemu_wait fab "FABRIC-RESULT:" 240; then
    echo "not ok - $N: no result from the guest: $(qemu_tail fab 12)"
    exit 1
fi
qemu_wait_exit fab 20 >/dev/null 2>&1
log=$(tr -d '\r' <"$QEMU_DIR/fab.log")
# The driver's own checks (READ, WRITE with immediate, one registration), one line each.
sed -n 's/^FABRIC-DRIVER: //p' <<<"$log" | grep -E '^(ok|not ok|skip) - '
grep -q '^FABRIC-DRIVER: not ok' <<<"$log" && drv_fail=1 || drv_fail=0
grep -q '^FABRIC-DRIVER: ok - rdma_driver_read' <<<"$log" ||
    { echo "not ok - rdma_driver_read: no result from the guest"; drv_fail=1; }
if grep -q "FABRIC-RESULT: ok" <<<"$log"; then
    echo "ok - $N ($(sed -n 's/^FABRIC: joiner: complete: \(.*verified in [0-9.]* s ([0-9.]* MB\/s)\).*/\1/p' <<<"$log"))"
    if grep -q 'FABRIC: wrong key: failed:' <<<"$log"; then
        echo "ok - rdma_wrong_cluster_key_refused"
    else
        echo "not ok - rdma_wrong_cluster_key_refused: $(grep 'FABRIC: wrong key' <<<"$log")"
        exit 1
    fi
else
    echo "not ok - $N: $(grep -E 'FABRIC|strata node' <<<"$log" | tail -n 8 | tr '\n' '|')"
    exit 1
fi
if grep -q "FABRIC-NETEM: ok" <<<"$log"; then
    echo "ok - tcp_chain_netem_loss_reorder_delay_in_qemu ($(sed -n 's/^FABRIC: netem n2: complete: .*verified in \([0-9.]* s\).*/\1/p' <<<"$log"))"
elif grep -q "FABRIC-NETEM: skip" <<<"$log"; then
    echo "skip - tcp_chain_netem_loss_reorder_delay_in_qemu: tc netem failed in the guest"
else
    echo "not ok - tcp_chain_netem_loss_reorder_delay_in_qemu: $(grep 'FABRIC: netem' <<<"$log")"
    exit 1
fi
exit $drv_fail
