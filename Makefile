# Strata build. Convention over lists: every .c under os/runtime os/common drivers serving transport
# cluster cmd is part of libstrata (os/init, the musl PID-1 stage, is built on its own, and
# cmd/main.c is the binary's entry), every tests/unit/test_*.c is a test program, every
# tests/fuzz/fuzz_*.c a libFuzzer target. Adding a module means adding files, not editing this
# Makefile. This file owns every build (the scripts/ only run what it built).
#
#   make            build/strata and the test programs
#   make test       install missing packages, build, run everything (normal + ASan/UBSan + fuzz)
#   make bench      benchmarks (never in CI)
#   make run        build the image and boot it under QEMU (serves on localhost:8080)
#   make image      build out/ (kernel, initrd, UKI, disk image)
#   make SAN=1      build into build/san with -fsanitize=address,undefined

CC       ?= gcc
BUILD    ?= build
SAN      ?=
OPT      ?= -O2
PKG_CONFIG ?= pkg-config

ifeq ($(SAN),1)
BUILD    := build/san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif

# A fresh machine: name the missing Debian packages and the fix once, instead of failing on the
# first missing header. Cheap (one pkg-config call, a few file tests); skipped for the goals that
# install packages themselves (deps, test, bench, run, fuzz) or need none. DEPS_INCLUDE is where
# the headers are looked for (tests point it elsewhere).
DEPS_INCLUDE ?= /usr/include
DEPS_FREE_GOALS := deps test bench run fuzz clean format kernel
ifneq ($(filter-out $(DEPS_FREE_GOALS),$(or $(MAKECMDGOALS),all)),)
DEPS_MISSING := $(strip \
    $(if $(shell command -v $(PKG_CONFIG) 2>/dev/null),,pkg-config) \
    $(if $(shell $(PKG_CONFIG) --exists libdpdk 2>/dev/null && echo y),,libdpdk-dev) \
    $(if $(wildcard $(DEPS_INCLUDE)/infiniband/verbs.h),,libibverbs-dev) \
    $(if $(wildcard $(DEPS_INCLUDE)/cjson/cJSON.h),,libcjson-dev) \
    $(if $(wildcard $(DEPS_INCLUDE)/sodium.h),,libsodium-dev) \
# Scale-out and control-plane scenarios (tests/integration/cluster_*.sh: cooperative execution,
# the control plane's raft, ...) and their unit tests, one line each; make test runs them too
# (every tests/integration/*.sh, every unit test).
CLUSTER_UNIT := test_fabric_node test_cluster_state test_sealed_conn
check-cluster: all
	@fail=0; for t in $(CLUSTER_UNIT); do $(BUILD)/tests/$$t 2>/dev/null || fail=1; done; \
	for s in tests/integration/cluster_*.sh; do bash $$s || fail=1; done; exit $$fail

deps:
	@scripts/install-deps.sh

test: deps
	@scripts/run-tests.sh

bench: deps all benches
	@scripts/run-bench.sh

fuzz: deps
	@FUZZ_SECONDS=$${FUZZ_SECONDS:-300} scripts/run-fuzz.sh

# libFuzzer targets (clang, ASan+UBSan), one library archive for all of them so a target pulls in
# only the objects it uses; the NIC and RDMA drivers and the commands stay out (no parser there).
FUZZ_DIR    := build/fuzz
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -g -O1 -I. -fopenmp-simd -pthread \
               -fsanitize=fuzzer-no-link,address,undefined
FUZZ_LIBSRC := $(filter-out drivers/nic/% drivers/rdma/% cmd/%,$(LIB_SRC))
FUZZ_OBJ    := $(FUZZ_LIBSRC:%.c=$(FUZZ_DIR)/obj/%.o)
FUZZ_BIN    := $(patsubst tests/fuzz/%.c,$(FUZZ_DIR)/%,$(sort $(wildcard tests/fuzz/fuzz_*.c)))
.PHONY: fuzz-build
fuzz-build: $(FUZZ_BIN)
$(FUZZ_DIR)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@
$(FUZZ_DIR)/libfuzz.a: $(FUZZ_OBJ)
	rm -f $@ && ar rcs $@ $^
$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_DIR)/libfuzz.a
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer -MMD -MP $< $(FUZZ_DIR)/libfuzz.a -o $@ \
	    $(filter-out $(DPDK_LIBS) -libverbs,$(LDLIBS))
-include $(FUZZ_OBJ:.o=.d) $(FUZZ_BIN:=.d)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build out

# --- the appliance image: image/ scripts, os/init (static musl), boot/ -------------------------
# `make kernel` fetches and unpacks Debian's kernel into build/kernel (cached .deb); image/mkinitrd.sh
# builds initramfs images from it (see the script's header); tests/lib/qemu.sh boots them.
KERNEL_DIR := build/kernel
.PHONY: kernel
kernel:
	@image/fetch-kernel.sh $(KERNEL_DIR) >/dev/null

# The init is static musl, never sanitized (it is PID 1 in a guest). musl-gcc sees only musl's
# headers: the kernel's uapi headers (netlink) come through a directory of links.
INIT_SRC := $(sort $(wildcard os/init/*.c os/common/*.c))
INIT_HDR := $(wildcard os/init/*.h os/common/*.h)
MUSL_CC  ?= musl-gcc
build/musl-include/.links:
	@mkdir -p $(dir $@)
	ln -sfn /usr/include/linux build/musl-include/linux
	ln -sfn /usr/include/asm-generic build/musl-include/asm-generic
	ln -sfn /usr/include/$$(gcc -print-multiarch)/asm build/musl-include/asm
	@touch $@
build/init: $(INIT_SRC) $(INIT_HDR) build/musl-include/.links
	$(MUSL_CC) -static -std=c11 -D_GNU_SOURCE -Os -Wall -Wextra -Werror -I. \
	    -isystem build/musl-include -o $@ $(INIT_SRC)
# `make image`: out/vmlinuz, out/initrd.img, out/strata.efi, out/strata.img (image/build.sh;
# NVIDIA=path adds NVIDIA's driver, image/README.md).
image: $(BUILD)/strata build/init
	@image/build.sh out

# `make run`: packages, image, then QEMU with the API on localhost:8080 (image/run.sh: PORT, ACCEL,
# MEM, SMP, APPEND, DISK=1 for the UEFI disk, GPU=<pci address> for VFIO, NATIVE=1).
run: deps
	@$(MAKE) -s image
	@image/run.sh out

ifneq ($(SAN),1)
ifneq ($(shell command -v $(MUSL_CC) 2>/dev/null),)
all: build/init
endif
endif
