# Strata build. Convention over lists: every .c under os/runtime os/common drivers serving transport
# cluster cmd is part of libstrata (os/init, the musl PID-1 stage, is built on its own, and
# cmd/main.c is the binary's entry), every tests/unit/test_*.c is a test program, every
# tests/fuzz/fuzz_*.c a libFuzzer target. Adding a module means adding files, not editing this
# Makefile. This file owns every build (the scripts/ only run what it built).
#
#   make            build/strata and the test programs
#   make test       install missing packages, build, run everything (normal + ASan/UBSan + fuzz)
#   make bench      benchmarks (never in CI)
#   make soak       the 10-minute chaos soak of a cluster (tests/soak/, never in make test)
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
    $(if $(wildcard $(DEPS_INCLUDE)/raft.h),,libraft-dev) \
    $(if $(wildcard $(DEPS_INCLUDE)/uv.h),,libuv1-dev) \
    $(if $(wildcard $(DEPS_INCLUDE)/simgrid/engine.h),,libsimgrid-dev) \
    $(if $(filter check-arm64,$(MAKECMDGOALS)), \
      $(if $(shell command -v aarch64-linux-gnu-gcc 2>/dev/null),,gcc-aarch64-linux-gnu) \
      $(if $(wildcard /usr/aarch64-linux-gnu/include/stdio.h),,libc6-dev-arm64-cross) \
      $(if $(shell command -v qemu-aarch64 2>/dev/null),,qemu-user)) \
    $(if $(filter image-arm64 arm64-server check-arm64-image,$(MAKECMDGOALS))$(filter arm64,$(ARCH)),\
      $(if $(shell command -v aarch64-linux-gnu-gcc 2>/dev/null),,gcc-aarch64-linux-gnu)) \
    $(if $(filter check-arm64-image,$(MAKECMDGOALS)), \
      $(if $(shell command -v qemu-system-aarch64 2>/dev/null),,qemu-system-arm)))
ifneq ($(DEPS_MISSING),)
$(error missing packages: $(DEPS_MISSING). Install them (and the rest of the toolchain) with `make deps` (scripts/install-deps.sh: apt-get, as root or through sudo), then run make again)
endif
endif

DPDK_CFLAGS := $(shell $(PKG_CONFIG) --cflags libdpdk 2>/dev/null)
DPDK_LIBS   := $(shell $(PKG_CONFIG) --libs libdpdk 2>/dev/null)

CFLAGS_BASE = -std=c11 -D_GNU_SOURCE -g $(OPT) -Wall -Wextra -Werror -pthread -I. \
              -fno-strict-aliasing -fopenmp-simd $(SANFLAGS)
CFLAGS  ?=
# The control plane's consensus (Canonical's C Raft) and its event loop.
RAFT_LIBS   := $(shell $(PKG_CONFIG) --libs raft libuv 2>/dev/null || echo -lraft -luv)
# SimGrid (C++, ~31 MiB with its closure) serves only `strata sim`: the appliance's binary,
# build/strata-appliance, is the same program without that command and links none of it.
SIMGRID_LIBS := $(shell $(PKG_CONFIG) --libs simgrid 2>/dev/null)
BASE_LIBS = $(DPDK_LIBS) -libverbs -lcjson -lsodium $(RAFT_LIBS) -ldl -lm -pthread
LDLIBS   = $(SIMGRID_LIBS) $(BASE_LIBS)
LDFLAGS += $(SANFLAGS)

LIB_DIRS := $(wildcard os/runtime os/common drivers serving transport cluster cmd)
LIB_SRC  := $(sort $(filter-out cmd/main.c,$(shell find $(LIB_DIRS) -name '*.c')))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(sort $(wildcard tests/unit/test_*.c))
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
TOOL_SRC := $(sort $(wildcard tests/tools/*.c))
TOOL_BIN := $(TOOL_SRC:tests/tools/%.c=$(BUILD)/tools/%)
BENCH_SRC := $(sort $(wildcard tests/bench/bench_*.c))
BENCH_BIN := $(BENCH_SRC:tests/bench/%.c=$(BUILD)/bench/%)

.PHONY: all test bench run image deps clean fuzz check-fabric check-cluster check-arm64 format soak
# nvcc (serving/engine/cuda, below), set before `all` so that the fatbin is its first prerequisite:
# one core runs nvcc (~2 minutes) while the other compiles the C, instead of the C waiting for it.
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
all: $(if $(NVCC),$(CUDA_FATBIN)) $(BUILD)/strata $(BUILD)/strata-appliance $(BUILD)/strata-appliance-test \
     $(TEST_BIN) $(TOOL_BIN)

# DPDK headers only where the NIC driver is compiled.
$(BUILD)/obj/drivers/nic/%.o: CFLAGS_EXTRA = $(DPDK_CFLAGS) -Wno-error=cast-qual

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS_EXTRA) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libstrata.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && $(AR) rcs $@ $^

# The test hooks (cmd/test_hooks.h: --test-crash, --test-hang, ...): libstrata holds
# cmd/test_hooks.c without them; this copy, compiled with STRATA_TEST_HOOKS and linked ahead of
# the archive, gives them to build/strata (the developer's and the tests' binary) and to
# build/strata-appliance-test (the image of the boot tests that crash or hang it), never to
# build/strata-appliance.
HOOKS_OBJ := $(BUILD)/obj/cmd/test_hooks_on.o
$(HOOKS_OBJ): cmd/test_hooks.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -DSTRATA_TEST_HOOKS -MMD -MP -c $< -o $@

$(BUILD)/strata: $(BUILD)/obj/cmd/main.o $(HOOKS_OBJ) $(BUILD)/libstrata.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The image's /bin/strata: every command but `sim` (cmd/commands.h, STRATA_NO_SIM), so the archive
# contributes no simulator object and SimGrid stays out of the initrd.
$(BUILD)/obj/cmd/main_appliance.o: cmd/main.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -DSTRATA_NO_SIM -MMD -MP -c $< -o $@
$(BUILD)/strata-appliance: $(BUILD)/obj/cmd/main_appliance.o $(BUILD)/libstrata.a
	$(CC) $(LDFLAGS) -o $@ $^ $(BASE_LIBS)
$(BUILD)/strata-appliance-test: $(BUILD)/obj/cmd/main_appliance.o $(HOOKS_OBJ) $(BUILD)/libstrata.a
	$(CC) $(LDFLAGS) -o $@ $^ $(BASE_LIBS)

# Programs track the headers they include (-MMD), like the library's objects. Tests, tools and
# benchmarks share the one synthetic-model generator (tests/synth/synth_gguf.c) and the converter of
# real vocabularies (tests/synth/vocab_json.c), compiled once.
SYNTH_OBJ := $(BUILD)/obj/tests/synth/synth_gguf.o $(BUILD)/obj/tests/synth/vocab_json.o
.SECONDARY: $(SYNTH_OBJ)
$(BUILD)/tests/%: tests/unit/%.c $(SYNTH_OBJ) $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -MMD -MP -o $@ $< $(SYNTH_OBJ) $(BUILD)/libstrata.a \
	    $(LDFLAGS) $(LDLIBS)

$(BUILD)/tools/%: tests/tools/%.c $(SYNTH_OBJ) $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -MMD -MP -o $@ $< $(SYNTH_OBJ) $(BUILD)/libstrata.a \
	    $(LDFLAGS) $(LDLIBS)

# Benchmarks share the memory-bandwidth probe (tests/bench/membw.c), their physical baseline.
$(BUILD)/bench/%: tests/bench/%.c tests/bench/membw.c $(SYNTH_OBJ) $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -MMD -MP -o $@ $< tests/bench/membw.c $(SYNTH_OBJ) \
	    $(BUILD)/libstrata.a $(LDFLAGS) $(LDLIBS)

benches: $(BENCH_BIN)

# CUDA kernels: serving/engine/cuda/kernels.cu (with its k_*.cuh parts) -> one fatbin for sm_80, sm_90 and
# compute_90 PTX (forward compatible), embedded into libstrata by drivers/cuda/cuda_fatbin.c with
# .incbin. No libcudart: the host code loads libcuda.so.1 at run time. A .cu error fails the build.
# Without nvcc (or with `make NVCC=`) the binary is built without kernels and the CPU backend serves.
# The fatbin sits outside $(BUILD) so the SAN build reuses it.
# (NVCC, CUDA_INC, NVCC_FLAGS and CUDA_FATBIN are set above `all`.)
ifneq ($(NVCC),)
build/cuda/kernels.fatbin: serving/engine/cuda/kernels.cu $(wildcard serving/engine/cuda/*.cuh)
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

# The operator's page (GET /, serving/api/ui_page.c): serving/api/ui/index.html with ui.css and
# ui.js put in place of its two marker lines, one document embedded with .incbin. Outside $(BUILD)
# so the SAN build reuses it; the fuzz archive compiles the page's stand-in.
UI_SRC  := serving/api/ui/index.html serving/api/ui/ui.css serving/api/ui/ui.js
UI_PAGE := build/gen/ui.html
$(UI_PAGE): $(UI_SRC)
	@mkdir -p $(dir $@)
	sed -e '/<!-- strata:css -->/{r serving/api/ui/ui.css' -e 'd}' \
	    -e '/<!-- strata:js -->/{r serving/api/ui/ui.js' -e 'd}' serving/api/ui/index.html >$@.tmp
	mv $@.tmp $@
$(BUILD)/obj/serving/api/ui_page.o: CFLAGS_EXTRA = -DSTRATA_UI_PAGE='"$(UI_PAGE)"'
$(BUILD)/obj/serving/api/ui_page.o: $(UI_PAGE)

-include $(LIB_OBJ:.o=.d) $(SYNTH_OBJ:.o=.d) $(BUILD)/obj/cmd/main.d $(BUILD)/obj/cmd/main_appliance.d \
    $(HOOKS_OBJ:.o=.d) \
    $(TEST_BIN:=.d) $(TOOL_BIN:=.d) $(BENCH_BIN:=.d)

# The fabric's unit tests and multi-node scenarios (network namespaces, QEMU), one line each.
FABRIC_UNIT := test_wire test_auth test_weight_stream
check-fabric: all
	@fail=0; for t in $(FABRIC_UNIT); do $(BUILD)/tests/$$t 2>/dev/null || fail=1; done; \
	for s in tests/integration/fabric_*.sh; do bash $$s || fail=1; done; exit $$fail

# Scale-out and control-plane scenarios (tests/integration/cluster_*.sh: cooperative execution,
# weights pulled into a serving node, the appliance joining from its command line, the control
# plane's raft, ...) and their unit tests, one line each; make test runs them too (every
# tests/integration/*.sh, every unit test).
CLUSTER_UNIT := test_fabric_node test_cluster_state test_recover_req test_sealed_conn test_fwd_channel \
                test_relay test_stream_loader
check-cluster: all build/init
	@fail=0; for t in $(CLUSTER_UNIT); do $(BUILD)/tests/$$t 2>/dev/null || fail=1; done; \
	for s in tests/integration/cluster_*.sh; do bash $$s || fail=1; done; exit $$fail

# The engine on aarch64 (docs/arm64.md): serving/engine (the CPU backend; CUDA's host code
# without kernels) and the engine's unit tests cross-built with Debian's aarch64 gcc into
# build/arm64, then run under qemu-aarch64 user emulation by scripts/check-arm64.sh: on qemu's
# `max` CPU (i8mm chosen; test_engine also with STRATA_ISA=dotprod, neon, scalar), a Neoverse N1
# (dotprod chosen) and a Cortex-A57 (Armv8.0: neon chosen). Correctness only: emulated time says
# nothing of speed. Only tests that need nothing past libc (no cJSON, libsodium, ... for arm64).
ARM64_CC    ?= aarch64-linux-gnu-gcc
ARM64_AR    ?= aarch64-linux-gnu-ar
ARM64_QEMU  ?= qemu-aarch64 -L /usr/aarch64-linux-gnu
ARM64_BUILD := build/arm64
ARM64_SRC   := $(sort $(wildcard serving/engine/*.c serving/engine/cuda/*.c) drivers/cuda/cu_api.c \
                 drivers/cuda/cuda_fatbin.c os/common/errmsg.c os/runtime/arena.c os/runtime/log.c \
                 os/runtime/clock.c serving/api/utf8.c)
ARM64_OBJ   := $(ARM64_SRC:%.c=$(ARM64_BUILD)/obj/%.o) $(ARM64_BUILD)/obj/tests/synth/synth_gguf.o
ARM64_TESTS := test_matmul test_fwd_kernels test_quant test_quant_files test_gguf test_convert \
               test_tokenizer test_tokenizer_bpe test_engine
ARM64_FLAGS  = $(filter-out $(SANFLAGS),$(CFLAGS_BASE))
$(ARM64_BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(ARM64_CC) $(ARM64_FLAGS) -MMD -MP -c $< -o $@
$(ARM64_BUILD)/libengine.a: $(ARM64_OBJ)
	rm -f $@ && $(ARM64_AR) rcs $@ $^
$(ARM64_BUILD)/tests/%: tests/unit/%.c $(ARM64_BUILD)/libengine.a
	@mkdir -p $(dir $@)
	$(ARM64_CC) $(ARM64_FLAGS) -MMD -MP -o $@ $< $(ARM64_BUILD)/libengine.a -ldl -lm -pthread
-include $(ARM64_OBJ:.o=.d) $(ARM64_TESTS:%=$(ARM64_BUILD)/tests/%.d)
check-arm64: $(ARM64_TESTS:%=$(ARM64_BUILD)/tests/%)
	@ARM64_QEMU="$(ARM64_QEMU)" scripts/check-arm64.sh $(ARM64_BUILD)/tests $(ARM64_TESTS)

# The arm64 appliance image (docs/arm64.md): `make image-arm64` (or `make image ARCH=arm64`) writes
# out/arm64/ (kernel Image, initrds, UKI, disk) from Debian's arm64 packages. image/arm64-sysroot.sh
# unpacks the server's libraries, musl-dev, libc6-dev and systemd-boot-efi for arm64 into
# build/arm64-sysroot with a private apt configuration (the host's apt is not touched). A sub-make
# cross-builds build/arm64-image/strata-appliance from the same sources as the x86 one
# (aarch64-linux-gnu-gcc --sysroot, the sysroot's pkg-config files; the sysroot script has checked
# the packages, so the x86 check of /usr/include is skipped; the simulator's SimGrid glue,
# sim_net.c, is left out: the appliance has no `sim` command). The init is static musl through
# musl-dev:arm64's specs file with the sysroot's paths (what musl-gcc is). `make check-arm64-image`
# boots it under qemu-system-aarch64 (TCG); make test does the same into build/test-image-arm64
# (tests/integration/boot_arm64.sh).
ARM64_SYSROOT := build/arm64-sysroot
ARM64_IMG     := build/arm64-image
ARM64_ROOT     = $(abspath $(ARM64_SYSROOT))
ARM64_PKG_ENV  = PKG_CONFIG_SYSROOT_DIR=$(ARM64_ROOT) \
                 PKG_CONFIG_LIBDIR=$(ARM64_ROOT)/usr/lib/aarch64-linux-gnu/pkgconfig:$(ARM64_ROOT)/usr/share/pkgconfig
.PHONY: image-arm64 check-arm64-image arm64-sysroot arm64-server
arm64-sysroot:
	@image/arm64-sysroot.sh $(ARM64_SYSROOT)
arm64-server: arm64-sysroot
	@$(ARM64_PKG_ENV) $(MAKE) --no-print-directory BUILD=$(ARM64_IMG) \
	    CC="$(ARM64_CC) --sysroot=$(ARM64_ROOT)" AR=$(ARM64_AR) DEPS_MISSING= \
	    LIB_SRC="$(filter-out cluster/sim/sim_net.c,$(LIB_SRC))" \
	    $(ARM64_IMG)/strata-appliance $(ARM64_IMG)/tests/test_wire
$(ARM64_IMG)/musl.specs: | arm64-sysroot
	@mkdir -p $(dir $@)
	sed 's|/usr/|$(ARM64_ROOT)/usr/|g' $(ARM64_SYSROOT)/usr/lib/aarch64-linux-musl/musl-gcc.specs >$@
$(ARM64_IMG)/musl-include/.links: | arm64-sysroot
	@mkdir -p $(dir $@)
	ln -sfn $(ARM64_ROOT)/usr/include/linux $(dir $@)linux
	ln -sfn $(ARM64_ROOT)/usr/include/asm-generic $(dir $@)asm-generic
	ln -sfn $(ARM64_ROOT)/usr/include/aarch64-linux-gnu/asm $(dir $@)asm
	@touch $@
$(ARM64_IMG)/init: $(INIT_SRC) $(INIT_HDR) $(ARM64_IMG)/musl.specs $(ARM64_IMG)/musl-include/.links
	$(ARM64_CC) -specs=$(ARM64_IMG)/musl.specs -static -std=c11 -D_GNU_SOURCE -Os -Wall -Wextra \
	    -Werror -I. -isystem $(ARM64_IMG)/musl-include -o $@ $(INIT_SRC)
image-arm64: arm64-server $(ARM64_IMG)/init $(BUILD)/strata
	@ARCH=arm64 image/build.sh out/arm64
check-arm64-image: image-arm64
	@bash tests/arm64/boot_image.sh

deps:
	@scripts/install-deps.sh

test: deps
	@scripts/run-tests.sh

bench: deps all benches
	@scripts/run-bench.sh

# The chaos soak (tests/soak/cluster_chaos.sh): 10 minutes of faults under load, at least 20
# faults, nothing wrong, nothing hung (never in make test; a one-minute version is,
# tests/integration/cluster_chaos.sh). SOAK_SECONDS, SOAK_SEED change it.
soak: all
	@bash tests/soak/cluster_chaos.sh --duration $${SOAK_SECONDS:-600} --seed $${SOAK_SEED:-1}

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
ifeq ($(ARCH),arm64)
image: image-arm64
else
image: $(BUILD)/strata $(BUILD)/strata-appliance build/init
	@image/build.sh out
endif

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
