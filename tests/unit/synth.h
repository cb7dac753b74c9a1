/* synth: a small random Llama model as GGUF for the unit tests and benchmarks (deterministic
 * from a seed), written by the one synthetic-model generator, tests/synth/synth_gguf.c (weights,
 * vocabulary: see synth_gguf.h). The classifier is untied; matrices are in `type`. */
#ifndef STRATA_TEST_SYNTH_H
#define STRATA_TEST_SYNTH_H

#include "os/common/errmsg.h"
#include "tests/synth/synth_gguf.h"

#include <stdint.h>
#include <stdio.h>

struct synth_cfg {
    int dim, hidden, layers, heads, kv_heads, vocab, seq;
};

static int synth_write(const char *path, const struct synth_cfg *c, uint32_t type, uint64_t seed)
{
    struct synth_spec s = {"test", c->dim, c->hidden, c->layers, c->heads, c->kv_heads, c->vocab,
                           c->seq, 0,      type,      seed,      1,        NULL,        NULL,
                           NULL};
    char err[ERRMSG_LEN];
    int rc = synth_gguf_write(path, &s, err);
    if (rc) fprintf(stderr, "synth_write %s: %s\n", path, err);
    return rc;
}

#endif
