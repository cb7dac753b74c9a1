/* strata convert: stories260K.bin + tok512.bin -> GGUF, checked tensor by tensor against the
 * checkpoint's floats; broken checkpoints give clear messages. */
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "serving/engine/convert.h"
#include "serving/engine/quant.h"
#include "tests/unit/check.h"

#include <stdint.h>
#include <unistd.h>

static char err[ERRMSG_LEN];
static uint8_t *ckpt, *tok;
static size_t ckpt_size, tok_size;

static int load_inputs(void)
{
    if (ckpt) return 0;
    char p[512];
    snprintf(p, sizeof p, "%s/models/stories260K.bin", check_shared());
    if (convert_read_file(p, &ckpt, &ckpt_size, err) < 0) return -1;
    snprintf(p, sizeof p, "%s/models/tok512.bin", check_shared());
    return convert_read_file(p, &tok, &tok_size, err);
}

#define NEED_INPUTS()                                                                              \
    do {                                                                                           \
        if (load_inputs() < 0) SKIP("test data missing: %s", err);                                 \
    } while (0)

static uint8_t *convert_mem(const void *ck, size_t ck_size, uint32_t type, size_t *len, int *rc)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    *rc =
        convert_llama2c(ck, ck_size, tok, tok_size, type, "stories260K", "stories260K.bin", f, err);
    fclose(f);
    if (*rc < 0) {
        free(buf);
        return NULL;
    }
    return (uint8_t *)buf;
}

/* Offsets (in floats after the 28-byte header) of the checkpoint's tensors for stories260K. */
enum { D = 64, H = 172, L = 5, KV = 32, V = 512, S = 512 };
static const float *ck_tensor(const char *which, int l)
{
    const float *f = (const float *)(ckpt + 28);
    size_t at = 0;
    const struct {
        const char *n;
        size_t per;
        int layers;
    } order[] = {{"emb", (size_t)V * D, 1}, {"rms_att", D, L},  {"wq", D * D, L},
                 {"wk", KV * D, L},         {"wv", KV * D, L},  {"wo", D * D, L},
                 {"rms_ffn", D, L},         {"w1", H * D, L},   {"w2", D * H, L},
                 {"w3", H * D, L},          {"rms_final", D, 1}};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        if (!strcmp(order[i].n, which)) return f + at + (size_t)l * order[i].per;
        at += order[i].per * (size_t)order[i].layers;
    }
    return NULL;
}

TEST(convert_f32_bit_exact)
{
    NEED_INPUTS();
    size_t len;
    int rc;
    uint8_t *buf = convert_mem(ckpt, ckpt_size, GGML_F32, &len, &rc);
    CHECKF(rc == 0, "%s", err);
    struct gguf g;
    CHECKF(gguf_parse(&g, buf, len, err) == 0, "%s", err);
    struct model m;
    CHECKF(model_plan(&m, &g, "stories260K.gguf", err) == 0, "%s", err);
    CHECK_EQ_INT(m.cfg.dim, 64);
    CHECK_EQ_INT(m.cfg.hidden_dim, 172);
    CHECK_EQ_INT(m.cfg.n_layers, 5);
    CHECK_EQ_INT(m.cfg.n_heads, 8);
    CHECK_EQ_INT(m.cfg.n_kv_heads, 4);
    CHECK_EQ_INT(m.cfg.vocab_size, 512);
    CHECK_EQ_INT(m.cfg.seq_len, 512);
    CHECK_EQ_INT(m.cfg.head_dim, 8);
    CHECK(m.cfg.norm_eps == 1e-5f && m.cfg.rope_theta == 10000.0f);
    CHECK(m.tied_output);
    struct gguf_str s;
    CHECK(gguf_get_str(&g, "general.name", &s, err) == 0 && gguf_str_eq(s, "stories260K"));
    /* Every tensor equals the checkpoint's floats, and they come in execution order. */
    const char *kinds[9] = {"attn_norm", "attn_q",   "attn_k",   "attn_v", "attn_output",
                            "ffn_norm",  "ffn_gate", "ffn_down", "ffn_up"};
    const char *src[9] = {"rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3"};
    const size_t n[9] = {D, D * D, KV * D, KV * D, D * D, D, H * D, D * H, H * D};
    const struct gguf_tensor *t = gguf_find_tensor(&g, "token_embd.weight");
    CHECK(t && t == &g.tensors[0] && t->type == GGML_F32);
    CHECK(memcmp(gguf_tensor_data(&g, t), ck_tensor("emb", 0), (size_t)V * D * 4) == 0);
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 9; k++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, kinds[k]);
            t = gguf_find_tensor(&g, name);
            CHECKF(t && t == &g.tensors[1 + l * 9 + k], "%s", name);
            CHECK_EQ_INT(t->nbytes, n[k] * 4);
            CHECKF(memcmp(gguf_tensor_data(&g, t), ck_tensor(src[k], l), n[k] * 4) == 0, "%s",
                   name);
        }
    t = gguf_find_tensor(&g, "output_norm.weight");
    CHECK(t && t == &g.tensors[46]);
    CHECK(memcmp(gguf_tensor_data(&g, t), ck_tensor("rms_final", 0), D * 4) == 0);
    CHECK(gguf_find_tensor(&g, "output.weight") == NULL);
    CHECK_EQ_INT(g.n_tensors, 47);
    model_free(&m);

    /* The tokenizer survives the trip (spaces as U+2581 in the file, back to ' ' on load). */
    struct tokenizer a, b;
    CHECKF(tokenizer_from_gguf(&a, &g, err) == 0, "%s", err);
    CHECKF(tokenizer_from_llama2c(&b, tok, tok_size, 512, err) == 0, "%s", err);
    CHECK_EQ_INT(a.vocab_size, 512);
    CHECK_EQ_INT(a.bos_id, 1);
    CHECK_EQ_INT(a.eos_id, 2);
    for (int i = 0; i < 512; i++) {
        CHECK(a.scores[i] == b.scores[i]);
        if (i == 1 || i == 2) continue;
        CHECKF(a.piece_len[i] == b.piece_len[i] &&
                   !memcmp(a.pieces[i], b.pieces[i], (size_t)a.piece_len[i]),
               "piece %d", i);
    }
    CHECK_STR(a.pieces[1], "<s>");
    CHECK_STR(a.pieces[2], "</s>");
    const struct gguf_kv *kv;
    CHECK(gguf_get_arr(&g, "tokenizer.ggml.tokens", GGUF_STRING, &kv, err) == 0);
    const uint8_t *p = kv->v.arr.data;
    for (int i = 0; i < 260; i++) p = gguf_next_str(p, &s);
    CHECK(gguf_str_eq(s, "\xe2\x96\x81t")); /* id 259, " t" in tok512.bin */
    CHECK(gguf_get_arr(&g, "tokenizer.ggml.token_type", GGUF_INT32, &kv, err) == 0);
    int32_t tt[260];
    memcpy(tt, kv->v.arr.data, sizeof tt); /* array data in the file is not 4-byte aligned */
    CHECK(tt[0] == 2 && tt[1] == 3 && tt[2] == 3 && tt[3] == 6 && tt[258] == 6 && tt[259] == 1);
    tokenizer_free(&a);
    tokenizer_free(&b);
    gguf_free(&g);
    free(buf);
}

TEST(convert_quantized)
{
    NEED_INPUTS();
    const uint32_t types[] = {GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0};
    const float tol[] = {1e-3f, 1e-2f, 0.02f, 0.15f}; /* relative to the row's max |x| */
    for (int ti = 0; ti < 4; ti++) {
        size_t len;
        int rc;
        log_set_quiet(1);
        uint8_t *buf = convert_mem(ckpt, ckpt_size, types[ti], &len, &rc);
        CHECKF(rc == 0, "%s", err);
        struct gguf g;
        CHECKF(gguf_parse(&g, buf, len, err) == 0, "%s", err);
        struct model m;
        CHECKF(model_plan(&m, &g, "q.gguf", err) == 0, "%s", err);
        CHECK_EQ_INT(m.layers[0].attn_norm.type, GGML_F32);
        CHECK_EQ_INT(m.layers[0].wq.type, types[ti]);
        CHECK_EQ_INT(m.token_embd.type, types[ti]);
        /* ffn_down rows hold 172 elements: not a multiple of 32, so it stays f32 for q types */
        CHECK_EQ_INT(m.layers[0].w_down.type,
                     ggml_block_elems(types[ti]) == 1 ? types[ti] : GGML_F32);
        const struct gguf_tensor *t = gguf_find_tensor(&g, "blk.2.ffn_gate.weight");
        const float *ref = ck_tensor("w1", 2);
        float row[D];
        for (int r = 0; r < H; r++) {
            CHECK(dequantize_row(t->type,
                                 (const uint8_t *)gguf_tensor_data(&g, t) +
                                     r * ggml_row_bytes(t->type, D),
                                 row, D) == 0);
            float mx = 0;
            for (int i = 0; i < D; i++) mx = fmaxf(mx, fabsf(ref[r * D + i]));
            for (int i = 0; i < D; i++)
                CHECKF(fabsf(row[i] - ref[r * D + i]) <= tol[ti] * mx, "%s row %d col %d: %g vs %g",
                       ggml_type_name(types[ti]), r, i, row[i], ref[r * D + i]);
        }
        model_free(&m);
        gguf_free(&g);
        free(buf);
    }
}

TEST(convert_untied_classifier)
{
    NEED_INPUTS();
    /* The same checkpoint with vocab_size negated and a classifier appended. */
    size_t n = ckpt_size + (size_t)V * D * 4;
    uint8_t *ck = malloc(n);
    memcpy(ck, ckpt, ckpt_size);
    int32_t neg = -V;
    memcpy(ck + 20, &neg, 4);
    float *wcls = (float *)(ck + ckpt_size);
    for (int i = 0; i < V * D; i++) wcls[i] = (float)i * 1e-4f;
    size_t len;
    int rc;
    uint8_t *buf = convert_mem(ck, n, GGML_F32, &len, &rc);
    CHECKF(rc == 0, "%s", err);
    struct gguf g;
    CHECKF(gguf_parse(&g, buf, len, err) == 0, "%s", err);
    struct model m;
    CHECKF(model_plan(&m, &g, "u.gguf", err) == 0, "%s", err);
    CHECK(!m.tied_output);
    const struct gguf_tensor *t = gguf_find_tensor(&g, "output.weight");
    CHECK(t && t == &g.tensors[47]);
    CHECK(memcmp(gguf_tensor_data(&g, t), wcls, (size_t)V * D * 4) == 0);
    model_free(&m);
    gguf_free(&g);
    free(buf);
    /* Without the classifier the size no longer matches. */
    buf = convert_mem(ck, ckpt_size, GGML_F32, &len, &rc);
    CHECK(rc < 0);
    CHECKF(strstr(err, "(the classifier the negative vocab_size announces is missing)"), "%s", err);
    free(ck);
}

TEST(convert_bad_checkpoints)
{
    NEED_INPUTS();
    size_t len;
    int rc;
    CHECK(convert_mem(ckpt, ckpt_size - 4, GGML_F32, &len, &rc) == NULL);
    CHECK_STR(err, "stories260K.bin: 1056536 bytes, but its header (dim 64, hidden_dim 172, "
                   "n_layers 5, n_heads 8, n_kv_heads 4, vocab 512, seq_len 512, shared "
                   "classifier) needs 1056540");
    CHECK(convert_mem(ckpt, 10, GGML_F32, &len, &rc) == NULL);
    CHECK_STR(err, "stories260K.bin: 10 bytes, too short for a llama2.c checkpoint header");
    uint8_t *ck = malloc(ckpt_size + 100);
    memcpy(ck, ckpt, ckpt_size);
    CHECK(convert_mem(ck, ckpt_size + 100, GGML_F32, &len, &rc) == NULL);
    CHECKF(strstr(err, "1056640 bytes, but its header"), "%s", err);
    int32_t v = 0x616b3432;
    memcpy(ck, &v, 4);
    CHECK(convert_mem(ck, ckpt_size, GGML_F32, &len, &rc) == NULL);
    CHECKF(strstr(err, "version 1/2 export (magic ak42)"), "%s", err);
    memcpy(ck, ckpt, 28);
    v = 7; /* n_heads 7 does not divide dim 64 */
    memcpy(ck + 12, &v, 4);
    CHECK(convert_mem(ck, ckpt_size, GGML_F32, &len, &rc) == NULL);
    CHECKF(strstr(err, "header has dim 64, n_heads 7, n_kv_heads 4"), "%s", err);
    v = -3;
    memcpy(ck, ckpt, 28);
    memcpy(ck + 8, &v, 4);
    CHECK(convert_mem(ck, ckpt_size, GGML_F32, &len, &rc) == NULL);
    CHECKF(strstr(err, "implausible header"), "%s", err);
    free(ck);
    /* A tokenizer for a different vocabulary. */
    uint8_t *t2 = tok;
    size_t s2 = tok_size;
    tok_size = tok_size - 10;
    CHECK(convert_mem(ckpt, ckpt_size, GGML_F32, &len, &rc) == NULL);
    CHECKF(strstr(err, "tokenizer: "), "%s", err);
    tok = t2, tok_size = s2;
}

TEST(convert_files)
{
    NEED_INPUTS();
    char in[512], tk[512], out[64];
    snprintf(in, sizeof in, "%s/models/stories260K.bin", check_shared());
    snprintf(tk, sizeof tk, "%s/models/tokenizer.bin", check_shared());
    snprintf(out, sizeof out, "/tmp/test_convert.%d.gguf", (int)getpid());
    /* The 32000-token tokenizer does not belong to this 512-token model. */
    CHECK(convert_llama2c_files(in, tk, out, GGML_F32, err) < 0);
    CHECKF(strstr(err, "tokenizer.bin: tokenizer: ") && strstr(err, "bytes left after 512 tokens"),
           "%s", err);
    CHECK(access(out, F_OK) != 0); /* no half-written file */
    snprintf(tk, sizeof tk, "%s/models/tok512.bin", check_shared());
    CHECKF(convert_llama2c_files(in, tk, out, GGML_Q8_0, err) == 0, "%s", err);
    uint8_t *buf;
    size_t len;
    CHECK(convert_read_file(out, &buf, &len, err) == 0);
    struct gguf g;
    CHECKF(gguf_parse(&g, buf, len, err) == 0, "%s", err);
    uint32_t ft;
    CHECK(gguf_get_u32(&g, "general.file_type", &ft, err) == 0 && ft == 7);
    gguf_free(&g);
    free(buf);
    unlink(out);
    CHECK(convert_llama2c_files("/nonexistent/x.bin", tk, out, GGML_F32, err) < 0);
    CHECK_STR(err, "/nonexistent/x.bin: No such file or directory");
    uint32_t type;
    CHECK(convert_parse_type("Q4_0", &type) == 0 && type == GGML_Q4_0);
    CHECK(convert_parse_type("q5_0", &type) == 0 && type == GGML_Q5_0);
    CHECK(convert_parse_type("IQ4_XS", &type) == 0 && type == GGML_IQ4_XS);
    CHECK(convert_parse_type("q8_1", &type) < 0); /* an activation format only */
}

int main(void)
{
    RUN(convert_f32_bit_exact);
    RUN(convert_quantized);
    RUN(convert_untied_classifier);
    RUN(convert_bad_checkpoints);
    RUN(convert_files);
    free(ckpt);
    free(tok);
    CHECK_DONE();
}
