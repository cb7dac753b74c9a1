#!/bin/bash
# update-disk.sh: an A/B update of a disk image from the host, without mounting anything (mtools):
# what `strata update` does on the appliance (os/runtime/boot_slots.h has the scheme).
#
#   image/update-disk.sh [--tries N] DISK NEW.efi
#
# Finds the EFI system partition in DISK's GPT, lists \EFI\Linux, and writes NEW.efi (a unified
# kernel image, e.g. out/strata.efi of a newer build) into the slot that is not the newest good
# one, as strata-GEN-SLOT+N.efi (GEN one past the highest; N tries, default 2), after deleting what
# that slot held. systemd-boot then boots it by default and falls back to the good slot once its
# N tries are spent without the server reaching /health 200 (which renames it to drop the
# counter). The model partition is not touched. Prints the entry written.
set -euo pipefail
TRIES=2
[ "${1:-}" = --tries ] && { TRIES=$2; shift 2; }
DISK=${1:?usage: update-disk.sh [--tries N] DISK NEW.efi}
NEW=${2:?usage: update-disk.sh [--tries N] DISK NEW.efi}
die() { echo "update-disk: $*" >&2; exit 1; }
case $TRIES in [1-9]) ;; *) die "--tries $TRIES: want 1..9" ;; esac
[ -f "$DISK" ] || die "$DISK: no such disk image"
[ "$(head -c 2 "$NEW" 2>/dev/null)" = MZ ] || die "$NEW: not an EFI (PE) image"

# The ESP: the partition of type EF00 in `sgdisk -p`; its first sector gives mtools' offset.
sector=$(sgdisk -p "$DISK" 2>/dev/null | sed -n 's/^Sector size (logical): \([0-9]*\) bytes.*/\1/p')
start=$(sgdisk -p "$DISK" 2>/dev/null | awk '$6 == "EF00" { print $2; exit }')
[ -n "$start" ] && [ -n "$sector" ] || die "$DISK: no EFI system partition (type EF00) in its GPT"
export MTOOLS_SKIP_CHECK=1
img="$DISK@@$((start * sector))"
names=$(mdir -i "$img" -b ::/EFI/Linux 2>/dev/null | sed 's|.*/||') || die "$DISK: no \\EFI\\Linux on the ESP"

# The plan (the same rules as os/runtime/boot_slots.c): the newest good entry keeps its slot.
re='^[sS][tT][rR][aA][tT][aA]-([0-9]+)-([abAB])(\+([0-9]+)(-([0-9]+))?)?\.[eE][fF][iI]$'
max=0 good_gen=0 good_slot=""
for n in $names; do
    [[ $n =~ $re ]] || continue
    g=${BASH_REMATCH[1]} s=${BASH_REMATCH[2],,}
    [ "$g" -gt "$max" ] && max=$g
    if [ -z "${BASH_REMATCH[3]}" ] && [ "$g" -ge "$good_gen" ]; then good_gen=$g good_slot=$s; fi
done
[ -n "$good_slot" ] || die "$DISK: no good entry in \\EFI\\Linux (nothing to fall back to)"
slot=a
[ "$good_slot" = a ] && slot=b
for n in $names; do
    [[ $n =~ $re ]] && [ "${BASH_REMATCH[2],,}" = "$slot" ] && mdel -i "$img" "::/EFI/Linux/$n"
done
entry="strata-$((max + 1))-$slot+$TRIES.efi"
mcopy -i "$img" "$NEW" "::/EFI/Linux/$entry" || die "$DISK: writing $entry failed (ESP full?)"
echo "update-disk: $DISK: \\EFI\\Linux\\$entry written (slot $slot, $TRIES tries; slot $good_slot stays as the fallback)"
