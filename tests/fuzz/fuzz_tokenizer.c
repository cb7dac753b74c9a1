/* libFuzzer target: encode arbitrary bytes with the tok512 vocabulary (../shared/models, or a
 * built-in byte-level vocabulary when the file is missing) and decode them back: the round trip
 * must give valid UTF-8 input exactly (a literal U+2581 comes back as the space it stands for).
 * Invalid UTF-8 is split as llama.cpp splits it (lead-byte lengths after spaces became U+2581),
 * so it may not round-trip and a space may cost three byte tokens: there only the ids and the
 * decoded length are checked. Inputs starting with 'T' are also loaded as a tokenizer.bin. */
#include "os/common/errmsg.h"
#include "serving/api/utf8.h"
#include "serving/engine/convert.h"
#include "serving/engine/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct tokenizer tok;

/* <unk>, <s>, </s>, 256 byte tokens, printable ASCII, a few merges. */
static void builtin_vocab(void)
{
    static uint8_t img[16384];
    size_t n = 4;
    char piece[8];
    for (int i = 0; i < 3 + 256 + 95 + 4; i++) {
        if (i < 3)
            strcpy(piece, i == 0 ? "<unk>" : i == 1 ? "\n<s>\n" : "\n</s>\n");
        else if (i < 259)
            snprintf(piece, sizeof piece, "<0x%02X>", i - 3);
        else if (i < 259 + 95)
            snprintf(piece, sizeof piece, "%c", ' ' + i - 259);
        else
            strcpy(piece, (const char *[]){" t", "he", " the", "in"}[i - 354]);
        float score = -(float)i;
        int32_t len = (int32_t)strlen(piece);
        memcpy(img + n, &score, 4);
        memcpy(img + n + 4, &len, 4);
        memcpy(img + n + 8, piece, (size_t)len);
        n += 8 + (size_t)len;
    }
    char err[ERRMSG_LEN];
    if (tokenizer_from_llama2c(&tok, img, n, 0, err) < 0) abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *shared = getenv("STRATA_SHARED");
    char path[512], err[ERRMSG_LEN];
    snprintf(path, sizeof path, "%s/models/tok512.bin", shared ? shared : "../shared");
    uint8_t *buf;
    size_t size;
    if (convert_read_file(path, &buf, &size, err) == 0) {
        int rc = tokenizer_from_llama2c(&tok, buf, size, 512, err);
        free(buf);
        if (rc == 0) return 0;
    }
    builtin_vocab();
    return 0;
}

/* U+2581 is how SentencePiece writes a space: a literal one in the text decodes as ' '. Rewrites
 * s[0..n) with every U+2581 as ' ' and returns the new length. */
static size_t spaces_unescaped(char *s, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + 2 < n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
            s[o++] = ' ';
            i += 2;
        } else {
            s[o++] = s[i];
        }
    }
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[ERRMSG_LEN];
    if (size > 0 && data[0] == 'T') {
        struct tokenizer t;
        uint8_t *copy = malloc(size);
        memcpy(copy, data, size);
        if (tokenizer_from_llama2c(&t, copy + 1, size - 1, 0, err) == 0) {
            int ids[64], n;
            tokenizer_encode(&t, "abc \xe2\x96\x81", 7, 1, ids, 64, &n, err);
            tokenizer_free(&t);
        }
        free(copy);
    }
    char *text = malloc(size ? size : 1);
    memcpy(text, data, size);
    int cap = 3 * (int)size + 2, n;
    int valid = utf8_valid(text, size);
    int *ids = malloc((size_t)cap * sizeof *ids);
    if (tokenizer_encode(&tok, text, size, 1, ids, cap, &n, err) < 0) abort();
    char *back = malloc(3 * size + 8);
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok.vocab_size) abort();
        char s[4];
        size_t l;
        const char *p = tokenizer_decode(&tok, i ? ids[i - 1] : -1, ids[i], s, &l);
        if (o + l > (valid ? size : 3 * size))
            abort(); /* never more than the text (or its escapes) */
        memcpy(back + o, p, l);
        o += l;
    }
    if (valid) {
        size_t a = spaces_unescaped(text, size), b = spaces_unescaped(back, o);
        if (a != b || (a && memcmp(back, text, a) != 0)) abort();
    }
    free(back);
    free(ids);
    free(text);
    return 0;
}
