/* libFuzzer target for the step-model cache file (serving/sched/step_cache.h). The first byte picks
 * how the rest is read: even, as a whole file (the checksum stops almost everything: every byte
 * of it is read anyway); odd, as the lines before the check line, signed here as the encoder
 * signs them, so the field parsing behind the checksum is reached too. Whatever parses has
 * usable numbers and encodes back to a file that parses to the same model. */
#include "serving/sched/step_cache.h"

#include <math.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct step_identity id = {
    .model = "blake2b:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
    .hardware = "cpu fuzz (avx2), 2 threads, kv f16"};

static void check_parsed(const struct step_cached *c)
{
    const double v[4] = {c->m.a, c->m.b, c->m.c, c->err};
    for (int i = 0; i < 4; i++)
        if (!isfinite(v[i]) || v[i] < 0) abort();
    if (!(c->m.a > 0) || c->m.corr != 1 || c->steps < 0) abort();
    char buf[4096], err[ERRMSG_LEN];
    size_t n = step_cache_encode(buf, sizeof buf, &id, c);
    struct step_cached d;
    if (!n || step_cache_parse(buf, n, &id, &d, err)) abort();
    if (d.m.a != c->m.a && fabs(d.m.a - c->m.a) > 1e-8 * c->m.a) abort(); /* %.9g round trip */
    if (d.steps != c->steps) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    struct step_cached c;
    char err[ERRMSG_LEN];
    const char *body = (const char *)data + 1;
    size_t n = size - 1;
    if (!(data[0] & 1)) {
        if (!step_cache_parse(body, n, &id, &c, err)) check_parsed(&c);
        return 0;
    }
    if (n > 8192) return 0;
    char *file = malloc(n + 64);
    if (!file) return 0;
    memcpy(file, body, n);
    unsigned char h[16];
    crypto_generichash(h, sizeof h, (const unsigned char *)body, n, NULL, 0);
    size_t m = n + (size_t)sprintf(file + n, "check ");
    for (int i = 0; i < 16; i++) m += (size_t)sprintf(file + m, "%02x", h[i]);
    file[m++] = '\n';
    if (!step_cache_parse(file, m, &id, &c, err)) check_parsed(&c);
    free(file);
    return 0;
}
