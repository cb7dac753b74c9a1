#include "serving/engine/sampler.h"

#include "os/common/errmsg.h"

#include <math.h>
#include <stdlib.h>

/* xorshift64*: tiny, fast, and the same sequence on every platform. */
static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

/* Uniform in [0, 1) with 24 bits, so float rounding cannot reach 1. */
static float rng_f32(uint64_t *s)
{
    return (float)(rng_next(s) >> 40) / 16777216.0f;
}

int sampler_init(struct sampler *s, const struct sampler_params *p, int vocab_size, char *err)
{
    s->p = *p;
    s->vocab_size = vocab_size;
    /* splitmix the seed so seeds 0, 1, 2... give unrelated streams and the state is never 0 */
    uint64_t z = p->seed + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    s->rng = (z ^ (z >> 31)) | 1;
    s->cand = NULL;
    if (p->temperature > 0) {
        s->cand = malloc((size_t)vocab_size * sizeof *s->cand);
        if (!s->cand)
            return errmsg_set(err, "sampler: out of memory for %d candidates", vocab_size);
    }
    return 0;
}

void sampler_free(struct sampler *s)
{
    free(s->cand);
    s->cand = NULL;
}

/* The maximum first (a reduction the compiler vectorizes), then its first index, found 64 logits
 * at a time with a vectorized "any equal" and only then one by one: the one-pass loop, a compare
 * and a branch per logit, was 2-3% of a stories110M decode step, and the one-by-one search
 * alone ~1%. NaNs are skipped by both passes, as the one-pass loop skipped them. */
int sampler_argmax(const float *logits, int n)
{
    float max = logits[0];
#pragma omp simd reduction(max : max)
    for (int i = 1; i < n; i++) max = logits[i] > max ? logits[i] : max;
    for (int i0 = 0; i0 < n; i0 += 64) {
        int end = n - i0 < 64 ? n : i0 + 64, hit = 0;
#pragma omp simd reduction(| : hit)
        for (int i = i0; i < end; i++) hit |= logits[i] == max;
        if (!hit) continue;
        for (int i = i0; i < end; i++)
            if (logits[i] == max) return i;
    }
    return 0;
}

static int cand_desc(const void *a, const void *b)
{
    const struct sampler_cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id; /* stable across libc qsort implementations */
}

int sampler_sample(struct sampler *s, float *logits)
{
    int n = s->vocab_size;
    if (s->p.temperature <= 0 || !s->cand) return sampler_argmax(logits, n);

    float max = logits[sampler_argmax(logits, n)];
    for (int i = 0; i < n; i++) {
        s->cand[i].p = (logits[i] - max) / s->p.temperature;
        s->cand[i].id = i;
    }
    int k = n;
    if ((s->p.top_k > 0 && s->p.top_k < n) || s->p.top_p < 1.0f || s->p.min_p > 0) {
        /* Ordering is needed for top-k and top-p; full sort is O(V log V), which for a 32k
         * vocabulary is ~0.5 ms, small beside a decode step of a real model. */
        qsort(s->cand, (size_t)n, sizeof *s->cand, cand_desc);
        if (s->p.top_k > 0 && s->p.top_k < n) k = s->p.top_k;
    }
    double sum = 0;
    for (int i = 0; i < k; i++) {
        s->cand[i].p = expf(s->cand[i].p);
        sum += s->cand[i].p;
    }
    /* min_p: relative to the most likely token (the first after sorting; exp(0) = 1). */
    if (s->p.min_p > 0) {
        float pmax = s->cand[0].p;
        int kept = 1;
        while (kept < k && s->cand[kept].p >= s->p.min_p * pmax) kept++;
        if (kept < k) {
            sum = 0;
            for (int i = 0; i < kept; i++) sum += s->cand[i].p;
            k = kept;
        }
    }
    if (s->p.top_p > 0 && s->p.top_p < 1.0f) {
        double acc = 0, target = s->p.top_p * sum;
        int kept = 0;
        while (kept < k) {
            acc += s->cand[kept].p;
            kept++;
            if (acc >= target) break;
        }
        k = kept;
        sum = acc;
    }
    double r = rng_f32(&s->rng) * sum, acc = 0;
    for (int i = 0; i < k; i++) {
        acc += s->cand[i].p;
        if (r < acc) return s->cand[i].id;
    }
    return s->cand[k - 1].id;
}
