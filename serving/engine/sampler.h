/* sampler: picks the next token from logits.
 *
 * temperature 0 is greedy (argmax, lowest id on ties). Otherwise, in this order: divide by the
 * temperature, keep the top_k best (0 = all), softmax, drop tokens below min_p * p_max, keep the
 * smallest set whose mass reaches top_p (1 = all), renormalise, draw with a per-request xorshift
 * generator seeded from `seed`. Same seed, same logits: same tokens, on any machine. */
#ifndef STRATA_SAMPLER_H
#define STRATA_SAMPLER_H

#include <stdint.h>

struct sampler_params {
    float temperature; /* 0 = greedy */
    float top_p;       /* (0,1]; 1 disables */
    int top_k;         /* 0 disables */
    float min_p;       /* [0,1); 0 disables */
    uint64_t seed;
};

struct sampler {
    struct sampler_params p;
    int vocab_size;
    uint64_t rng;
    struct sampler_cand {
        float p;
        int id;
    } * cand; /* vocab_size scratch */
};

int sampler_init(struct sampler *s, const struct sampler_params *p, int vocab_size, char *err);
void sampler_free(struct sampler *s);
/* logits are clobbered. */
int sampler_sample(struct sampler *s, float *logits);
int sampler_argmax(const float *logits, int n);

#endif
