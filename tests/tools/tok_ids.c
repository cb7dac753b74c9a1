/* tok_ids: Strata's tokenizer on test inputs, for the exactness checks of
 * tests/integration/tokenizer_exact.sh and for `make bench`.
 *
 *   build/tools/tok_ids VOCAB.gguf --vectors NAME      llama.cpp's vectors NAME.inp / NAME.out:
 *                                                      "ok - NAME (N strings)" or "not ok - ..."
 *   build/tools/tok_ids VOCAB.gguf --records FILE      ids of each record of a corpus file, one
 *                                                      line each (no BOS, no special tokens)
 *   build/tools/tok_ids VOCAB.gguf --hashes FILE       per record "<count> <fnv64 of that line>",
 *                                                      the form llama.cpp's ids are kept in
 *                                                      (tests/fixtures/tokenizer/)
 *   build/tools/tok_ids VOCAB.gguf --bench FILE        encoding speed on a corpus file, MB/s
 *   build/tools/tok_ids VOCAB.gguf TEXT...             ids and pieces of TEXT (special tokens
 *                                                      parsed, BOS as the vocabulary adds it)
 *
 * A corpus file is a sequence of records, each a 4-byte little-endian length and that many bytes
 * (tests/tools/tok_corpus.py writes them). */
#include "os/common/errmsg.h"
#include "serving/engine/convert.h"
#include "serving/engine/gguf.h"
#include "serving/engine/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char err[ERRMSG_LEN];

static int *ids;
static int ids_cap;

/* Encode text (no BOS); the ids land in the global buffer. */
static int encode(const struct tokenizer *t, const char *s, size_t n, int special, int *count)
{
    size_t need = 3 * n + 8;
    if (need > (size_t)ids_cap) {
        free(ids);
        ids_cap = (int)need;
        ids = malloc(need * sizeof *ids);
        if (!ids) return errmsg_set(err, "out of memory");
    }
    struct tok_span sp = {s, n, special};
    return tokenizer_encode_spans(t, &sp, 1, special, ids, ids_cap, count, err);
}

static int vectors(const struct tokenizer *t, const char *name)
{
    char p[4096];
    uint8_t *inp, *out;
    size_t ni, no;
    snprintf(p, sizeof p, "%s.inp", name);
    if (convert_read_file(p, &inp, &ni, err) < 0) goto bad;
    snprintf(p, sizeof p, "%s.out", name);
    if (convert_read_file(p, &out, &no, err) < 0) goto bad;
    static const char SEP[] = "\n__ggml_vocab_test__\n";
    const char *s = (const char *)inp, *end = s + ni, *o = (const char *)out;
    const char *oend = o + no;
    int k = 0, fails = 0;
    while (s < end) {
        const char *e = memmem(s, (size_t)(end - s), SEP, strlen(SEP));
        if (!e) break;
        const char *ol = memchr(o, '\n', (size_t)(oend - o));
        if (!ol) ol = oend;
        int n;
        if (encode(t, s, (size_t)(e - s), 0, &n) < 0) {
            printf("not ok - %s: string %d: %s\n", name, k, err);
            return 1;
        }
        char got[65536] = "";
        size_t gl = 0;
        for (int i = 0; i < n && gl < sizeof got - 16; i++)
            gl += (size_t)snprintf(got + gl, sizeof got - gl, " %d", ids[i]);
        if (gl != (size_t)(ol - o) || memcmp(got, o, gl) != 0) {
            if (!fails++)
                printf("# %s: string %d: got%s\n#   want %.*s\n", name, k, got, (int)(ol - o), o);
        }
        k++;
        s = e + strlen(SEP);
        o = ol < oend ? ol + 1 : oend;
    }
    if (fails)
        printf("not ok - %s: %d of %d strings differ\n", name, fails, k);
    else
        printf("ok - %s (%d strings)\n", name, k);
    free(inp);
    free(out);
    return fails != 0;
bad:
    printf("not ok - %s: %s\n", name, err);
    return 1;
}

/* Call fn on each record of a corpus file. */
static int each_record(const char *path, uint8_t **buf, size_t *size)
{
    if (convert_read_file(path, buf, size, err) < 0) {
        fprintf(stderr, "tok_ids: %s\n", err);
        return -1;
    }
    return 0;
}

/* FNV-1a 64 of the ids written as a line "1 2 3". */
static uint64_t ids_hash(const int *v, int n)
{
    uint64_t h = 14695981039346656037ull;
    char num[16];
    for (int i = 0; i < n; i++) {
        int l = snprintf(num, sizeof num, i ? " %d" : "%d", v[i]);
        for (int k = 0; k < l; k++) h = (h ^ (uint8_t)num[k]) * 1099511628211ull;
    }
    return h;
}

static int records(const struct tokenizer *t, const char *path, int hashes)
{
    uint8_t *b;
    size_t n;
    if (each_record(path, &b, &n) < 0) return 1;
    FILE *out = stdout;
    for (size_t p = 0; p + 4 <= n;) {
        uint32_t len;
        memcpy(&len, b + p, 4);
        p += 4;
        if (len > n - p) break;
        int c;
        if (encode(t, (const char *)b + p, len, 0, &c) < 0) {
            fprintf(stderr, "tok_ids: %s\n", err);
            return 1;
        }
        if (hashes)
            fprintf(out, "%d %016llx\n", c, (unsigned long long)ids_hash(ids, c));
        else {
            for (int i = 0; i < c; i++) fprintf(out, i ? " %d" : "%d", ids[i]);
            fputc('\n', out);
        }
        p += len;
    }
    free(b);
    return 0;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int bench(const struct tokenizer *t, const char *vocab, const char *path)
{
    uint8_t *b;
    size_t n;
    if (each_record(path, &b, &n) < 0) return 1;
    size_t bytes = 0;
    long tokens = 0;
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        bytes = 0, tokens = 0;
        for (size_t p = 0; p + 4 <= n;) {
            uint32_t len;
            memcpy(&len, b + p, 4);
            p += 4;
            if (len > n - p) break;
            int c;
            if (encode(t, (const char *)b + p, len, 0, &c) < 0) return 1;
            bytes += len, tokens += c;
            p += len;
        }
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    printf("%s: %.2f MB in %ld tokens: %.1f MB/s, %.2f M tokens/s (best of 3, one thread)\n", vocab,
           (double)bytes / 1e6, tokens, (double)bytes / 1e6 / best, (double)tokens / 1e6 / best);
    free(b);
    return 0;
}

static int show(const struct tokenizer *t, int argc, char **argv)
{
    for (int a = 0; a < argc; a++) {
        int c;
        if (encode(t, argv[a], strlen(argv[a]), 1, &c) < 0) {
            fprintf(stderr, "tok_ids: %s\n", err);
            return 1;
        }
        for (int i = 0; i < c; i++) {
            char s[8];
            size_t l;
            const char *p =
                tokenizer_decode_ex(t, i ? ids[i - 1] : -1, ids[i], TOK_RENDER_SPECIAL, s, &l);
            printf("%d '%.*s'%s\n", ids[i], (int)l, p, tokenizer_is_eog(t, ids[i]) ? " (eog)" : "");
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr,
                "usage: tok_ids VOCAB.gguf --vectors NAME | --records FILE | --hashes FILE | "
                "--bench FILE | TEXT...\n");
        return 2;
    }
    uint8_t *buf;
    size_t n;
    struct gguf g;
    struct tokenizer t;
    if (convert_read_file(argv[1], &buf, &n, err) < 0 || gguf_parse(&g, buf, n, err) < 0 ||
        tokenizer_from_gguf(&t, &g, err) < 0) {
        fprintf(stderr, "tok_ids: %s: %s\n", argv[1], err);
        return 1;
    }
    int rc;
    if (!strcmp(argv[2], "--vectors") && argc == 4)
        rc = vectors(&t, argv[3]);
    else if (!strcmp(argv[2], "--records") && argc == 4)
        rc = records(&t, argv[3], 0);
    else if (!strcmp(argv[2], "--hashes") && argc == 4)
        rc = records(&t, argv[3], 1);
    else if (!strcmp(argv[2], "--bench") && argc == 4)
        rc = bench(&t, argv[1], argv[3]);
    else
        rc = show(&t, argc - 2, argv + 2);
    tokenizer_free(&t);
    gguf_free(&g);
    free(buf);
    free(ids);
    return rc;
}
