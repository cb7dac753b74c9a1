/* synth: a small random Llama-family model as GGUF for the unit tests and benchmarks
 * (deterministic from a seed), written by the one synthetic-model generator,
 * tests/synth/synth_gguf.c (weights, vocabulary: see synth_gguf.h). synth_write: a Llama 2 file,
 * untied; synth_write_arch: any architecture. Matrices are in `type`. */
#ifndef STRATA_TEST_SYNTH_H
#define STRATA_TEST_SYNTH_H

#include "os/common/errmsg.h"
#include "tests/synth/synth_gguf.h"

#include <stdint.h>
#include <stdio.h>

struct synth_cfg {
    int dim, hidden, layers, heads, kv_heads, vocab, seq;
};

/* The architecture's parts (all 0: a Llama 2 file): synth_gguf.h's fields of the same names. */
struct synth_arch {
    int arch, head_dim, qkv_bias, rope_freqs, tied;
    float rope_theta, qk_scale;
};

static int synth_write_arch(const char *path, const struct synth_cfg *c, const struct synth_arch *a,
                            uint32_t type, uint64_t seed)
{
    struct synth_spec s = {.name = "test",
                           .dim = c->dim,
                           .hidden = c->hidden,
                           .layers = c->layers,
                           .heads = c->heads,
                           .kv_heads = c->kv_heads,
                           .vocab = c->vocab,
                           .seq = c->seq,
                           .tied = a->tied,
                           .type = type,
                           .seed = seed,
                           .threads = 1,
                           .arch = a->arch,
                           .head_dim = a->head_dim,
                           .qkv_bias = a->qkv_bias,
                           .rope_freqs = a->rope_freqs,
                           .rope_theta = a->rope_theta,
                           .qk_scale = a->qk_scale};
    char err[ERRMSG_LEN];
    int rc = synth_gguf_write(path, &s, err);
    if (rc) fprintf(stderr, "synth_write %s: %s\n", path, err);
    return rc;
}

static int synth_write(const char *path, const struct synth_cfg *c, uint32_t type, uint64_t seed)
{
    const struct synth_arch llama2 = {0};
    return synth_write_arch(path, c, &llama2, type, seed);
}

#endif
