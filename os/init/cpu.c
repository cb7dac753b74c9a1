/* The CPU check before exec: the server's libraries are compiled for more than the x86-64
 * baseline, and a CPU without those instructions kills PID 1 with an invalid-opcode trap inside a
 * library constructor, before the server's own code (and its crash handler) runs: the kernel then
 * panics with no word of why. Debian's DPDK is built with -march=corei7 (`pkg-config --cflags
 * libdpdk`), i.e. Nehalem / x86-64-v2: SSE3, SSSE3, SSE4.1, SSE4.2, POPCNT, CMPXCHG16B and
 * LAHF/SAHF in 64-bit mode. The server's own AVX2/AVX-512 kernels are chosen at run time. */
#include "os/common/errmsg.h"
#include "os/init/init.h"

#include <cpuid.h>
#include <stdio.h>
#include <string.h>

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
