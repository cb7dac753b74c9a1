# Strata build. Convention over lists: every .c under os/ drivers/ serving/ transport/ cluster/ is part of
# libstrata (except os/init, the musl PID-1 stage, and serving/main.c), every tests/unit/test_*.c
# is a test program, every tests/fuzz/fuzz_*.c a libFuzzer target. Adding a module means adding
# files, not editing this Makefile.
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

DPDK_CFLAGS := $(shell $(PKG_CONFIG) --cflags libdpdk 2>/dev/null)
DPDK_LIBS   := $(shell $(PKG_CONFIG) --libs libdpdk 2>/dev/null)
# The control plane's consensus (Canonical's C Raft) and its event loop.
RAFT_LIBS   := $(shell $(PKG_CONFIG) --libs raft libuv 2>/dev/null || echo -lraft -luv)

CFLAGS_BASE = -std=c11 -D_GNU_SOURCE -g $(OPT) -Wall -Wextra -Werror -pthread -I. \
              -fno-strict-aliasing -fopenmp-simd $(SANFLAGS)
CFLAGS  ?=
LDLIBS   = $(DPDK_LIBS) -libverbs -lmicrohttpd -lcjson -lsodium $(RAFT_LIBS) -ldl -lm -pthread
LDFLAGS += $(SANFLAGS)

LIB_SRC  := $(sort $(shell find os drivers serving transport cluster -name '*.c' \
              ! -path 'os/init/*' ! -path '*/fuzz/*' ! -name main.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(sort $(wildcard tests/unit/test_*.c))
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
TOOL_SRC := $(sort $(wildcard tests/tools/*.c))
TOOL_BIN := $(TOOL_SRC:tests/tools/%.c=$(BUILD)/tools/%)
BENCH_SRC := $(sort $(wildcard tests/bench/bench_*.c))
BENCH_BIN := $(BENCH_SRC:tests/bench/%.c=$(BUILD)/bench/%)

.PHONY: all test bench run image deps clean fuzz check-fabric check-cluster format
all: $(BUILD)/strata $(TEST_BIN) $(TOOL_BIN)

# DPDK headers only where the NIC driver is compiled.
$(BUILD)/obj/drivers/nic/%.o: CFLAGS_EXTRA = $(DPDK_CFLAGS) -Wno-error=cast-qual

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS_EXTRA) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libstrata.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/strata: $(BUILD)/obj/serving/main.o $(BUILD)/libstrata.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c tests/unit/check.h $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -o $@ $< $(BUILD)/libstrata.a $(LDFLAGS) $(LDLIBS)

$(BUILD)/tools/%: tests/tools/%.c $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -o $@ $< $(BUILD)/libstrata.a $(LDFLAGS) $(LDLIBS)

$(BUILD)/bench/%: tests/bench/%.c $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -o $@ $< $(BUILD)/libstrata.a $(LDFLAGS) $(LDLIBS)

benches: $(BENCH_BIN)

# CUDA kernels: drivers/cuda/kernels.cu (with its k_*.cuh parts) -> one fatbin for sm_80, sm_90 and
# compute_90 PTX (forward compatible), embedded into libstrata by drivers/cuda/cuda_fatbin.c with
# .incbin. No libcudart: the host code loads libcuda.so.1 at run time. A .cu error fails the build.
# Without nvcc (or with `make NVCC=`) the binary is built without kernels and the CPU backend serves.
# The fatbin sits outside $(BUILD) so the SAN build reuses it.
ifeq ($(origin NVCC),undefined)
NVCC := $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
endif
# Where cuda.h lives: asked of nvcc itself, since `nvcc` on PATH may be a wrapper script elsewhere.
ifeq ($(origin CUDA_INC),undefined)
CUDA_INC := $(if $(NVCC),$(shell $(NVCC) --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | \
              sed -n 's/^\#\$$ INCLUDES="-I\([^"]*\)".*/\1/p' | head -n 1))
endif
NVCC_FLAGS ?= -O3 -std=c++17 -gencode arch=compute_80,code=sm_80 \
              -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
CUDA_FATBIN := build/cuda/kernels.fatbin
ifneq ($(NVCC),)
build/cuda/kernels.fatbin: drivers/cuda/kernels.cu $(wildcard drivers/cuda/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) -fatbin $(NVCC_FLAGS) -o $@.tmp $< && mv $@.tmp $@

# The driver API prototypes in cu_api.h must match cuda.h: a compile-only check.
build/cuda/cu_api_check.stamp: drivers/cuda/cu_api_check.c drivers/cuda/cu_api.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -fsyntax-only -Wall -Werror -I. -I$(CUDA_INC) -DSTRATA_CU_API_CHECK $<
	@touch $@

$(BUILD)/obj/drivers/cuda/cuda_fatbin.o: CFLAGS_EXTRA = -DSTRATA_CUDA_FATBIN='"$(CUDA_FATBIN)"'
ifneq ($(wildcard $(CUDA_INC)/cuda.h),)
$(BUILD)/obj/drivers/cuda/cuda_fatbin.o: $(CUDA_FATBIN) build/cuda/cu_api_check.stamp
else
$(info note: nvcc is $(NVCC) but cuda.h was not found (CUDA_INC=$(CUDA_INC)): cu_api.h is not checked against it)
$(BUILD)/obj/drivers/cuda/cuda_fatbin.o: $(CUDA_FATBIN)
endif
# test_cuda insists on a non-empty fatbin when nvcc was there.
$(BUILD)/tests/test_cuda: CFLAGS += -DSTRATA_NVCC_BUILD
endif

-include $(LIB_OBJ:.o=.d) $(BUILD)/obj/serving/main.d

# The fabric's unit tests and multi-node scenarios (network namespaces, QEMU), one line each.
FABRIC_UNIT := test_wire test_auth test_weight_stream
check-fabric: all
	@fail=0; for t in $(FABRIC_UNIT); do $(BUILD)/tests/$$t 2>/dev/null || fail=1; done; \
	for s in tests/integration/fabric_*.sh; do bash $$s || fail=1; done; exit $$fail

# The cluster's control plane (and, as they land, the scale-out scenarios), one line each.
CLUSTER_UNIT := test_cluster_state test_sealed_conn
check-cluster: all
	@fail=0; for t in $(CLUSTER_UNIT); do [ -x $(BUILD)/tests/$$t ] && { $(BUILD)/tests/$$t || fail=1; }; done; \
	for s in tests/integration/cluster_*.sh; do bash $$s || fail=1; done; exit $$fail

deps:
	@tools/install-deps.sh

test: deps
	@tools/run-tests.sh

bench: deps all benches
	@tools/run-bench.sh

fuzz: deps
	@FUZZ_SECONDS=$${FUZZ_SECONDS:-300} tools/run-fuzz.sh

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
INIT_SRC := $(sort $(wildcard os/init/*.c)) os/boot_cmdline.c os/errmsg.c
INIT_HDR := $(wildcard os/init/*.h) os/boot_cmdline.h os/errmsg.h
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
# `make image`: out/vmlinuz, out/initrd.img, out/strata.efi, out/strata.img (image/build.sh).
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
