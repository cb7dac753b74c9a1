/* bpe_vocab: for tests, the GGUF tokenizer metadata of a byte-level BPE tokenizer.json (the npm
 * packages' Llama 3 and Qwen3 vocabularies in tests/node), written as llama.cpp's
 * convert_hf_to_gguf.py writes it: every token by id, type 1 (normal), added tokens 3 (control)
 * when "special" or spelled <|...|>, else 4 (user-defined); merges as "a b"; model gpt2 and the
 * given pre-tokenizer, BOS, EOS and add_bos. */
#ifndef STRATA_TEST_BPE_VOCAB_H
#define STRATA_TEST_BPE_VOCAB_H

#include "serving/engine/gguf.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A JSON file, parsed; NULL when it cannot be read or parsed. */
static inline cJSON *read_json(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 20, n = 0, k;
    char *buf = malloc(cap);
    while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0)
        if ((n += k) == cap) buf = realloc(buf, cap *= 2);
    fclose(f);
    cJSON *j = buf ? cJSON_ParseWithLength(buf, n) : NULL;
    free(buf);
    return j;
}

/* The tokenizer metadata of tokenizer.json tj into w; 0 or -1. */
static inline int put_bpe_vocab(struct gguf_writer *w, const cJSON *tj, const char *pre, int bos,
                                int eos, int add_bos)
{
    const cJSON *vocab = cJSON_GetObjectItem(cJSON_GetObjectItem(tj, "model"), "vocab");
    const cJSON *merges = cJSON_GetObjectItem(cJSON_GetObjectItem(tj, "model"), "merges");
    const cJSON *added = cJSON_GetObjectItem(tj, "added_tokens"), *v;
    int n = 0, nm = cJSON_GetArraySize(merges), rc = -1;
    cJSON_ArrayForEach(v, vocab) if (v->valueint >= n) n = v->valueint + 1;
    cJSON_ArrayForEach(v, added)
    {
        int id = cJSON_GetObjectItem(v, "id")->valueint;
        if (id >= n) n = id + 1;
    }
    const char **tok = calloc((size_t)n, sizeof *tok);
    int32_t *type = calloc((size_t)n, sizeof *type);
    char **merge = calloc((size_t)nm + 1, sizeof *merge);
    if (!tok || !type || !merge) goto out;
    for (int i = 0; i < n; i++) tok[i] = "[PAD]", type[i] = 5;
    cJSON_ArrayForEach(v, vocab) tok[v->valueint] = v->string, type[v->valueint] = 1;
    cJSON_ArrayForEach(v, added)
    {
        int id = cJSON_GetObjectItem(v, "id")->valueint;
        const char *t = cJSON_GetObjectItem(v, "content")->valuestring;
        size_t l = strlen(t);
        int looks = l >= 4 && !strncmp(t, "<|", 2) && !strcmp(t + l - 2, "|>");
        tok[id] = t;
        type[id] = cJSON_IsTrue(cJSON_GetObjectItem(v, "special")) || looks ? 3 : 4;
    }
    int i = 0;
    cJSON_ArrayForEach(v, merges)
    {
        const char *a = cJSON_IsString(v) ? v->valuestring : cJSON_GetArrayItem(v, 0)->valuestring;
        const char *b = cJSON_IsString(v) ? NULL : cJSON_GetArrayItem(v, 1)->valuestring;
        size_t la = strlen(a), lb = b ? strlen(b) : 0;
        if (!(merge[i] = malloc(la + lb + 2))) goto out;
        memcpy(merge[i], a, la + 1);
        if (b) merge[i][la] = ' ', memcpy(merge[i] + la + 1, b, lb + 1);
        i++;
    }
    uint8_t yes = (uint8_t)add_bos;
    rc = gguf_w_str(w, "tokenizer.ggml.model", "gpt2") ||
         gguf_w_str(w, "tokenizer.ggml.pre", pre) ||
         gguf_w_arr_str(w, "tokenizer.ggml.tokens", tok, (uint64_t)n) ||
         gguf_w_arr_i32(w, "tokenizer.ggml.token_type", type, (uint64_t)n) ||
         gguf_w_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merge, (uint64_t)nm) ||
         gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos) ||
         gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos) ||
         gguf_w_val(w, "tokenizer.ggml.add_bos_token", GGUF_BOOL, &yes);
out:
    for (int k = 0; merge && k < nm; k++) free(merge[k]);
    free(merge);
    free(tok);
    free(type);
    return rc ? -1 : 0;
}

#endif
