#!/bin/bash
# cold_start_qemu: the appliance from power-on to ready under QEMU (software emulation), as a
# timeline: every console line stamped with the host's time since QEMU started, the guest's
# uptime where the line carries one, /health 200 and the first token through the forwarded port.
#   COLD_QEMU=initrd   the model baked into the initrd (boot_qemu.sh's boot; default)
#   COLD_QEMU=disk     the raw disk's strata-model partition (ext4, virtio-blk), kernel booted
#                      directly (no firmware), the partition kept between boots (a copy of the
#                      image's disk; COLD_QEMU_FRESH=1 makes a new one): run it twice to see the
#                      second boot start from the step model the first one cached there
#   MODEL=path.gguf    another model (build/bench-models/tinyllama-q4_0.gguf for a 1.1B; give
#                      the guest memory: QEMU_MEM=3072)   COLD_QEMU_ARGS: more server arguments
# The image goes to build/bench-image (build/bench-image-<model> for another MODEL).
# Software emulation on a shared host: the figures are slow and noisy; say the host's load.
set -u
cd "$(dirname "$0")/../.."
MODEL=${MODEL:-}
export BOOT_OUT=build/bench-image${MODEL:+-$(basename "$MODEL" .gguf)}
. tests/lib/boot.sh
[ -n "${COLD_QEMU_ARGS:-}" ] && BOOT_ARGS="strata.args=\"-v $COLD_QEMU_ARGS\""
QEMU_DIR=build/qemu/cold_start
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; }
MODE=${COLD_QEMU:-initrd}
mkdir -p "$QEMU_DIR"
if ! msg=$(boot_image); then echo "cold_start_qemu: $msg"; exit 1; fi
port=$(qemu_free_port)
base="console=ttyS0 quiet strata.ip=10.0.2.15/24 strata.gw=10.0.2.2 strata.dns=10.0.2.3 $BOOT_KERNEL_ARGS $BOOT_ARGS"
if [ "$MODE" = disk ]; then
    # the partition (the model and the cached step model) stays between boots; the server comes
    # from the kernel's initrd, so a rebuilt image needs no new disk (COLD_QEMU_FRESH=1: one)
    disk=$QEMU_DIR/disk-$(basename "$BOOT_OUT").img
    [ -f "$disk" ] && [ -z "${COLD_QEMU_FRESH:-}" ] || cp "$BOOT_OUT/strata.img" "$disk"
    set -- -kernel "$(boot_kernel)" -initrd "$BOOT_OUT/initrd-base.img" \
        -append "$base strata.model=part:strata-model" \
        -drive if=none,id=d0,format=raw,file="$disk" -device virtio-blk-pci,drive=d0
else
    set -- -kernel "$(boot_kernel)" -initrd "$BOOT_OUT/initrd.img" -append "$base"
fi
echo "cold_start_qemu: $MODE boot of $(basename "${MODEL:-stories260K}") on $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), guest ${QEMU_MEM} MiB, $QEMU_ACCEL"
qemu_start cold "$@" -netdev "user,id=n0,hostfwd=tcp:127.0.0.1:$port-:8080" -device virtio-net-pci,netdev=n0,romfile=
trap 'qemu_stop cold' EXIT
python3 - "$(qemu_log cold)" "$port" "$MODE" <<'PY'
import json, re, sys, threading, time, urllib.request

log, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t0 = time.time()
url = "http://127.0.0.1:%d" % port
marks = {}


def poll():
    while time.time() - t0 < 1800:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    marks["health 200"] = time.time() - t0
                    break
        except Exception:
            pass
        time.sleep(0.05)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 1, "temperature": 0}).encode()
    rq = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(rq, timeout=1200) as r:
        r.read()
    marks["first token"] = time.time() - t0


threading.Thread(target=poll, daemon=True).start()
seen, buf = 0, b""
keep = re.compile(r"strata-init: (start|cmdline|cpu|hugepages|modules: \d|nvidia|net|model|exec)|"
                  r"listening on|loader: .*arena|matrices stored|step model|ready:|saved to|error|panic")
span = re.compile(r"loader: span (\d+)/(\d+) resident")
# on the disk, until the step model is cached on the partition (a boot that started from the
# cache writes none; or 5 minutes after the token)
def done():
    if "first token" not in marks:
        return False
    return mode != "disk" or saved or cached or time.time() - t0 > marks["first token"] + 300


saved = cached = False
while not done() and time.time() - t0 < 1800:
    with open(log, "rb") as f:
        f.seek(seen)
        data = f.read()
    seen += len(data)
    buf += data
    now = time.time() - t0
    *lines, buf = buf.split(b"\n")
    for l in lines:
        s = l.decode("utf-8", "replace").strip("\r")
        m = span.search(s)
        saved |= "saved to" in s
        cached |= "(cached in" in s
        if s and (keep.search(s) or (m and m.group(1) in ("1", m.group(2)))):
            print("%7.2f s  %s" % (now, s[:150]))
    time.sleep(0.05)
for k in ("health 200", "first token"):
    print("%7.2f s  == %s (host)" % (marks.get(k, float("nan")), k))
PY
boot_shutdown cold
