#!/bin/bash
# boot_disks: the UEFI disk (out/strata.img, OVMF, systemd-boot) on the disks servers have, two
# guests at once: NVMe (`-device nvme`) with virtio-net, and SATA on q35's AHCI controller
# (`-device ide-hd,bus=ide.0`) with an Intel e1000e NIC. Each must find the strata-model
# partition on its disk (nvme, ahci + sd_mod from the initrd), bring the NIC up, and serve a
# completion equal to the native greedy output. Also checks what the base initrd carries for real
# hardware (NIC and storage modules, DPDK PMDs, verbs providers) and its size budget.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/boot.sh
QEMU_DIR=build/qemu/boot_disks
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }

# The base initrd's budget, unpacked (docs/measurements.md): 13.4 MiB before the hardware
# drivers, 35.6 MiB with them, 40.4 MiB since the CUDA kernels cover all 15 weight types (the
# fatbin in /bin/strata grew from ~1.5 to 6 MB: sm_80, sm_90 and compute_90 PTX).
BUDGET_MIB=44

CODE=/usr/share/OVMF/OVMF_CODE_4M.fd VARS=/usr/share/OVMF/OVMF_VARS_4M.fd
[ -f $CODE ] || { CODE=/usr/share/OVMF/OVMF_CODE.fd VARS=/usr/share/OVMF/OVMF_VARS.fd; }
[ -f $CODE ] || { nok "disks firmware" "OVMF is not installed (make deps)"; exit 1; }
if ! msg=$(boot_image); then nok "disks image" "$msg"; exit 1; fi
mkdir -p "$QEMU_DIR"

# --- what the initrd carries --------------------------------------------------------------------
list=$(zstd -dc "$BOOT_OUT/initrd-base.img" | cpio -t --quiet 2>/dev/null)
mods=$(zstd -dc "$BOOT_OUT/initrd-base.img" | cpio -i --quiet --to-stdout etc/modules 2>/dev/null)
missing=""
for m in nvme ahci sd_mod e1000e mlx5_core mlx5_ib ice irdma bnxt_en i40e ixgbe vfat efivarfs; do
    grep -qx "/lib/modules/$m.ko" <<<"$mods" || missing="$missing $m"
done
if [ -z "$missing" ]; then ok "initrd carries the storage, NIC, RDMA and ESP modules"
else nok "initrd carries the storage, NIC, RDMA and ESP modules" "not in /etc/modules:$missing"; fi
# Dependencies before their users: libata before ahci, mlx5_core before mlx5_ib, ice before irdma.
order_ok=1
for pair in libata:ahci scsi_mod:sd_mod nvme_core:nvme mlx5_core:mlx5_ib ib_core:mlx5_ib ice:irdma; do
    a=$(grep -nx "/lib/modules/${pair%%:*}.ko" <<<"$mods" | cut -d: -f1)
    b=$(grep -nx "/lib/modules/${pair##*:}.ko" <<<"$mods" | cut -d: -f1)
    [ -n "$a" ] && [ -n "$b" ] && [ "$a" -lt "$b" ] || { order_ok=0; nok "module order" "$pair: lines ${a:-none} ${b:-none}"; }
done
[ $order_ok = 1 ] && ok "module order: dependencies load first"
missing=""
for p in net_mlx5 net_ice net_bnxt net_i40e net_ixgbe net_e1000 bus_pci mempool_ring; do
    grep -q "dpdk/pmds-[0-9.]*/librte_$p.so$" <<<"$list" || missing="$missing $p"
done
for p in mlx5 irdma bnxt_re rxe; do
    grep -q "libibverbs/lib$p-rdmav[0-9]*.so$" <<<"$list" && grep -q "etc/libibverbs.d/$p.driver$" <<<"$list" ||
        missing="$missing lib$p"
done
if [ -z "$missing" ]; then ok "image carries the DPDK PMDs and verbs providers for those NICs"
else nok "image carries the DPDK PMDs and verbs providers for those NICs" "missing:$missing"; fi
unpacked=$(zstd -dc "$BOOT_OUT/initrd-base.img" | wc -c)
mib=$(awk -v b="$unpacked" 'BEGIN { printf "%.1f", b / 1048576 }')
if [ "$unpacked" -le $((BUDGET_MIB * 1048576)) ]; then
    ok "initrd-base $mib MiB unpacked, $(awk -v b="$(stat -c %s "$BOOT_OUT/initrd-base.img")" 'BEGIN { printf "%.1f", b / 1048576 }') MiB compressed (budget $BUDGET_MIB MiB unpacked)"
else
    img=$(realpath "$BOOT_OUT/initrd-base.img")
    big=$(mkdir -p "$QEMU_DIR/unpacked" && cd "$QEMU_DIR/unpacked" && rm -rf ./* &&
        zstd -dc "$img" | cpio -idm --quiet 2>/dev/null &&
        find . -type f -printf '%s %p\n' | sort -rn | head -n 5 |
        awk '{ printf "%s %.1f MiB, ", substr($2, 2), $1 / 1048576 }')
    nok "initrd-base size budget" "$mib MiB unpacked, over $BUDGET_MIB MiB; largest: $big"
fi

# --- two boots at once ----------------------------------------------------------------------------
start() { # start NAME PORT DISK-DEVICE NIC-DEVICE
    cp $VARS "$QEMU_DIR/$1-vars.fd"
    qemu_start "$1" \
        -drive if=pflash,format=raw,readonly=on,file=$CODE -drive if=pflash,format=raw,file="$QEMU_DIR/$1-vars.fd" \
        -drive if=none,id=d0,format=raw,snapshot=on,file="$BOOT_OUT/strata.img" -device "$3" \
        -netdev "user,id=n0,hostfwd=tcp:127.0.0.1:$2-:8080" -device "$4,netdev=n0,romfile="
}
trap 'qemu_stop nvme; qemu_stop ahci' EXIT
port_nvme=$(qemu_free_port)
t0_nvme=$(date +%s.%N)
start nvme "$port_nvme" nvme,drive=d0,serial=strata0,bootindex=0 virtio-net-pci
port_ahci=$(qemu_free_port)
[ "$port_ahci" = "$port_nvme" ] && port_ahci=$((port_nvme + 1))
t0_ahci=$(date +%s.%N)
start ahci "$port_ahci" ide-hd,drive=d0,bus=ide.0,bootindex=0 e1000e

check() { # check NAME DEV PORT T0 NIC-MODULE
    local name=$1 log
    log=$(qemu_log "$name")
    if ! qemu_wait "$name" "strata-init: exec" 300 "Shell> " "Kernel panic" "strata-init: error"; then
        nok "$name boots from the disk" "$(qemu_tail "$name" 6)"
        return
    fi
    if grep -qa "strata-init: model: partition strata-model ($2) mounted read-only" "$log"; then
        ok "$name model partition found on $2"
    else
        nok "$name model partition found on $2" "$(grep -a 'strata-init: \(model\|error\)' "$log" | tr '\r\n' '  ')"
    fi
    if grep -qa "strata-init: modules: $5.ko" "$log"; then ok "$name NIC driver $5 loaded"
    else nok "$name NIC driver $5 loaded" "$(grep -a "strata-init: modules: .*$5" "$log" | tr '\r\n' '  ')"; fi
    if boot_have_serve; then
        boot_http "$name" "$3" "$4"
    else
        echo "skip - $name http completion: build/strata has no serve command yet"
    fi
}
check nvme /dev/nvme0n1p2 "$port_nvme" "$t0_nvme" virtio_net
check ahci /dev/sda2 "$port_ahci" "$t0_ahci" e1000e
exit $fail
