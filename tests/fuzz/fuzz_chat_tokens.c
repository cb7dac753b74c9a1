/* libFuzzer target: tokenizer_encode_spans (chat prompts with special tokens) on arbitrary text.
 *
 * The vocabulary (built in, loaded through a GGUF like a real model's) has byte tokens for every
 * byte, a few merges, and special tokens that overlap ("<|im" inside "<|im_start|>"); none of them
 * can be reached by BPE merges from plain text (a special piece that can, a one-character one for
 * example, comes out of content as its id too, in llama.cpp as here). The input is cut into spans
 * at 0xFF bytes; a span's first byte says whether it is a template marker (parse_special) or
 * content. Checks: no error with room for 3 * bytes + 2 * spans + 2 ids, every id in range; when
 * every span is valid UTF-8 (invalid bytes split as llama.cpp splits them need not come back),
 * decoding the ids gives the text back (a literal U+2581 as the space it stands for),
 * each stretch between special tokens with one leading dummy-prefix space; special tokens lie
 * inside one span and come only from marker spans, but for user-defined ones ("<|im"), which
 * llama.cpp cuts out of content too. */
#include "os/common/errmsg.h"
#include "serving/api/utf8.h"
#include "serving/engine/gguf.h"
#include "serving/engine/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct tokenizer tok;
static struct gguf gg;
static char *gbuf;
static int n_fixed;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    static const struct {
        const char *piece;
        int32_t type; /* 1 normal, 2 unknown, 3 control, 4 user-defined */
    } fixed[] = {{"<unk>", 2},
                 {"<s>", 3},
                 {"</s>", 3},
                 {"<|im_start|>", 3},
                 {"<|im_end|>", 3},
                 {"<|im", 4},
                 {"\xe2\x96\x81", 1},
                 {"\xe2\x96\x81t", 1},
                 {"he", 1},
                 {"\xe2\x96\x81the", 1},
                 {"in", 1},
                 {"st", 1},
                 {"im", 1}};
    n_fixed = (int)(sizeof fixed / sizeof fixed[0]);
    static char bytes[256][8];
    const char *pieces[300];
    int32_t types[300];
    float scores[300];
    int n = 0;
    for (int i = 0; i < n_fixed; i++, n++) {
        pieces[n] = fixed[i].piece;
        types[n] = fixed[i].type;
        scores[n] = -(float)i;
    }
    for (int b = 0; b < 256; b++, n++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        pieces[n] = bytes[b];
        types[n] = 6;
        scores[n] = 0;
    }
    struct gguf_writer *w = gguf_writer_new();
    char err[ERRMSG_LEN];
    size_t len;
    FILE *f = open_memstream(&gbuf, &len);
    if (gguf_w_str(w, "tokenizer.ggml.model", "llama") ||
        gguf_w_arr_str(w, "tokenizer.ggml.tokens", pieces, (uint64_t)n) ||
        gguf_w_arr_f32(w, "tokenizer.ggml.scores", scores, (uint64_t)n) ||
        gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)n) ||
        gguf_writer_write(w, f, err))
        abort();
    fclose(f);
    gguf_writer_free(w);
    if (gguf_parse(&gg, gbuf, len, err) || tokenizer_from_gguf(&tok, &gg, err)) abort();
    return 0;
}

static int is_special(int id)
{
    for (int i = 0; i < tok.n_special; i++)
        if (tok.special_ids[i] == id) return 1;
    return 0;
}

/* Whether the decoded piece p[0..len) is the text at *pos, a ' ' matching a literal U+2581 too
 * (SentencePiece's written space); advances *pos past it. */
static int matches(const char *text, size_t tl, size_t *pos, const char *p, size_t len)
{
    size_t at = *pos;
    for (size_t j = 0; j < len; j++) {
        if (p[j] == ' ' && at + 3 <= tl && memcmp(text + at, "\xe2\x96\x81", 3) == 0)
            at += 3;
        else if (at < tl && text[at] == p[j])
            at++;
        else
            return 0;
    }
    *pos = at;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct tok_span sp[64];
    size_t start[64];
    int ns = 0;
    char *text = malloc(size + 1);
    if (!text) return 0;
    size_t tl = 0;
    for (size_t i = 0; i < size && ns < 64;) {
        size_t j = i;
        while (j < size && data[j] != 0xFF) j++;
        int marker = j > i && (data[i] & 1);
        size_t from = j > i ? i + 1 : i;
        memcpy(text + tl, data + from, j - from);
        start[ns] = tl;
        sp[ns] = (struct tok_span){text + tl, j - from, marker};
        tl += j - from;
        ns++;
        i = j + 1;
    }
    /* a span that is not valid UTF-8 is split as llama.cpp splits it (lead-byte lengths after
     * spaces became U+2581): a space may cost three byte tokens and the text need not come back */
    int valid = 1;
    for (int k = 0; k < ns; k++) valid &= utf8_valid(sp[k].text, sp[k].len);
    int cap = (int)(3 * tl + 2 * (size_t)ns + 2);
    int *ids = malloc((size_t)cap * sizeof *ids);
    char err[ERRMSG_LEN];
    int n;
    if (!ids) abort();
    if (tokenizer_encode_spans(&tok, sp, ns, 1, ids, cap, &n, err)) abort();
    if (n < 1 || ids[0] != tok.bos_id) abort();
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok.vocab_size) abort();
    if (!valid) {
        free(ids);
        free(text);
        return 0;
    }
    /* decode: pieces (spaces as ' ', <0xNN> as the byte); drop one leading ' ' per stretch */
    size_t pos = 0;
    int stretch_start = 1;
    for (int i = 1; i < n; i++) {
        int id = ids[i];
        if (is_special(id)) {
            size_t pl = (size_t)tok.piece_len[id];
            /* inside one marker span */
            int k = 0;
            while (k < ns && !(sp[k].len && start[k] <= pos && pos < start[k] + sp[k].len)) k++;
            /* user-defined tokens come out of content too, as in llama.cpp */
            if (k >= ns || (!sp[k].parse_special && tok.type[id] != TOKT_USER_DEFINED) ||
                pos + pl > start[k] + sp[k].len)
                abort();
            if (pos + pl > tl || memcmp(text + pos, tok.pieces[id], pl)) abort();
            pos += pl;
            stretch_start = 1;
            continue;
        }
        char scratch[8];
        size_t len;
        const char *p = tokenizer_decode(&tok, -1, id, scratch, &len);
        if (stretch_start) {
            if (!len || p[0] != ' ') abort();
            p++, len--;
            stretch_start = 0;
        }
        if (!matches(text, tl, &pos, p, len)) abort();
    }
    if (pos != tl) abort();
    free(ids);
    free(text);
    return 0;
}
