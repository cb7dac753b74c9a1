/* The CPU check before exec: the server's libraries are compiled for more than the architecture's
 * baseline, and a CPU without those instructions kills PID 1 with an invalid-opcode trap inside a
 * library constructor, before the server's own code (and its crash handler) runs: the kernel then
 * panics with no word of why.
 * x86-64: Debian's DPDK is built with -march=corei7 (`pkg-config --cflags libdpdk`), i.e.
 * Nehalem / x86-64-v2: SSE3, SSSE3, SSE4.1, SSE4.2, POPCNT, CMPXCHG16B and LAHF/SAHF in 64-bit
 * mode, read with CPUID.
 * aarch64: Debian's DPDK is built with -march=armv8-a+crc: Advanced SIMD and the CRC32
 * instructions, read from the kernel's hwcaps (getauxval(AT_HWCAP), <sys/auxv.h>'s HWCAP_*);
 * the name from /proc/cpuinfo's implementer and part. The server's own kernels (AVX2/AVX-512, NEON dot product,
 * i8mm) are chosen at run time. */
#include "os/common/errmsg.h"
#include "os/init/init.h"

#include <stdio.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>

struct feature {
    const char *name;
    unsigned leaf, reg, bit; /* reg: 2 = ecx, 3 = edx */
};

static const struct feature needed[] = {
    {"SSE3", 1, 2, 0},
    {"SSSE3", 1, 2, 9},
    {"SSE4.1", 1, 2, 19},
    {"SSE4.2", 1, 2, 20},
    {"POPCNT", 1, 2, 23},
    {"CMPXCHG16B", 1, 2, 13},
    {"LAHF-SAHF", 0x80000001u, 2, 0},
};

static void brand(char *out, size_t cap)
{
    unsigned r[12] = {0}, max = __get_cpuid_max(0x80000000u, NULL);
    if (max < 0x80000004u) {
        snprintf(out, cap, "unknown CPU");
        return;
    }
    for (unsigned i = 0; i < 3; i++)
        __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
    char s[49];
    memcpy(s, r, 48);
    s[48] = 0;
    char *p = s;
    while (*p == ' ') p++;
    snprintf(out, cap, "%s", p);
}

int init_cpu_check(char *err)
{
    char missing[160] = "", model[64];
    size_t off = 0;
    int n_missing = 0;
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++) {
        const struct feature *f = &needed[i];
        unsigned r[4] = {0};
        int have = __get_cpuid(f->leaf, &r[0], &r[1], &r[2], &r[3]) && (r[f->reg] >> f->bit & 1);
        if (have) continue;
        off += (size_t)snprintf(missing + off, sizeof missing - off, "%s%s", n_missing ? " " : "",
                                f->name);
        n_missing++;
    }
    brand(model, sizeof model);
    if (n_missing)
        return errmsg_set(err,
                          "cpu: %s lacks %s, which the server's libraries need (x86-64-v2: "
                          "DPDK is built for -march=corei7); under QEMU use -cpu max or -cpu host",
                          model, missing);
    init_say("cpu", "%s: x86-64-v2 (SSE4.2, POPCNT, ...) present", model);
    return 0;
}
#elif defined(__aarch64__)
#include <sys/auxv.h>

static const struct {
    const char *name;
    unsigned long bit;
} needed[] = {{"fp", HWCAP_FP}, {"asimd", HWCAP_ASIMD}, {"crc32", HWCAP_CRC32}};

/* "Neoverse-V2", or "implementer 0x41 part 0xd4f" for a core not in the table. */
static void brand(char *out, size_t cap)
{
    static const struct {
        unsigned impl, part;
        const char *name;
    } known[] = {{0x41, 0xd03, "Cortex-A53"},  {0x41, 0xd07, "Cortex-A57"},
                 {0x41, 0xd08, "Cortex-A72"},  {0x41, 0xd0b, "Cortex-A76"},
                 {0x41, 0xd0c, "Neoverse-N1"}, {0x41, 0xd40, "Neoverse-V1"},
                 {0x41, 0xd49, "Neoverse-N2"}, {0x41, 0xd4f, "Neoverse-V2"},
                 {0x41, 0xd8e, "Neoverse-N3"}, {0x41, 0xd84, "Neoverse-V3"}};
    unsigned impl = 0, part = 0;
    int have_impl = 0, have_part = 0;
    char line[256];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f) && !(have_impl && have_part)) {
        if (!have_impl && sscanf(line, "CPU implementer : %x", &impl) == 1) have_impl = 1;
        if (!have_part && sscanf(line, "CPU part : %x", &part) == 1) have_part = 1;
    }
    if (f) fclose(f);
    if (!have_impl || !have_part) {
        snprintf(out, cap, "unknown CPU");
        return;
    }
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (known[i].impl == impl && known[i].part == part) {
            snprintf(out, cap, "%s", known[i].name);
            return;
        }
    snprintf(out, cap, "implementer 0x%02x part 0x%03x", impl, part);
}

int init_cpu_check(char *err)
{
    char missing[64] = "", model[64];
    size_t off = 0;
    int n_missing = 0;
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++) {
        if (hw & needed[i].bit) continue;
        off += (size_t)snprintf(missing + off, sizeof missing - off, "%s%s", n_missing ? " " : "",
                                needed[i].name);
        n_missing++;
    }
    brand(model, sizeof model);
    if (n_missing)
        return errmsg_set(err,
                          "cpu: %s lacks %s, which the server's libraries need (DPDK is built for "
                          "-march=armv8-a+crc); under QEMU use -cpu max or -cpu host",
                          model, missing);
    init_say("cpu", "%s: armv8-a+crc (asimd, crc32) present; dotprod %s, i8mm %s, sve %s", model,
             hw & HWCAP_ASIMDDP ? "yes" : "no", hw2 & HWCAP2_I8MM ? "yes" : "no",
             hw & HWCAP_SVE ? "yes" : "no");
    return 0;
}
#else
#error "os/init/cpu.c: no CPU check for this architecture"
#endif
