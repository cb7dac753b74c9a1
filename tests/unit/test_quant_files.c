/* quant files: quantize_row() writes what llama.cpp's llama-quantize writes, byte for byte, for
 * every weight type its presets produce, and quant_preset_type() picks the type it picked for
 * every tensor. ../shared/models/quant-refs/ holds one model quantized
 * by llama-quantize into 16 presets (README there); its f32 source is synth_model's
 * (dim 256, hidden 768, 4 layers, seed 7, tok512 vocabulary, untied) with output.weight times 16.
 * This regenerates that source, quantizes every tensor of every preset file to the file's type
 * for it, and compares the bytes, and the types with the preset's: one line per file. */
#include "os/common/errmsg.h"
#include "serving/engine/convert.h"
#include "serving/engine/gguf.h"
#include "serving/engine/quant.h"
#include "serving/engine/quant_preset.h"
#include "tests/synth/synth_gguf.h"
#include "tests/unit/check.h"

#include <stdint.h>
#include <unistd.h>

static const char *presets[] = {"Q2_K",   "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M",
                                "Q5_K_S", "Q5_K_M", "Q6_K",   "Q4_0",   "Q4_1",   "Q5_0",
                                "Q5_1",   "Q8_0",   "IQ4_NL", "IQ4_XS"};

static struct gguf src;
static uint8_t *src_buf;
static const char *cur; /* the preset under test */

/* The kind and layer of a llama tensor from its name (-1: a norm, not a matrix). */
static int tensor_kind(const char *name, int *layer)
{
    static const struct {
        const char *suffix;
        enum quant_tensor_kind kind;
    } k[] = {{"attn_q.weight", QT_ATTN_Q},     {"attn_k.weight", QT_ATTN_K},
             {"attn_v.weight", QT_ATTN_V},     {"attn_output.weight", QT_ATTN_OUTPUT},
             {"ffn_gate.weight", QT_FFN_GATE}, {"ffn_down.weight", QT_FFN_DOWN},
             {"ffn_up.weight", QT_FFN_UP}};
    *layer = 0;
    if (!strcmp(name, "token_embd.weight")) return QT_TOKEN_EMBD;
    if (!strcmp(name, "output.weight")) return QT_OUTPUT;
    if (sscanf(name, "blk.%d.", layer) != 1) return -1;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strstr(name, k[i].suffix)) return (int)k[i].kind;
    return -1;
}

static int load_source(char *err)
{
    const char *path = "build/test-quant-files-f32.gguf";
    char tok[4096];
    snprintf(tok, sizeof tok, "%s/models/tok512.bin", check_shared());
    struct synth_spec s = {.name = "quant-refs",
                           .dim = 256,
                           .hidden = 768,
                           .layers = 4,
                           .heads = 4,
                           .kv_heads = 2,
                           .vocab = 512,
                           .seq = 512,
                           .type = GGML_F32,
                           .seed = 7,
                           .threads = 1,
                           .tokenizer = tok};
    size_t size;
    if (synth_gguf_write(path, &s, err) < 0 || convert_read_file(path, &src_buf, &size, err) < 0)
        return -1;
    unlink(path);
    return gguf_parse(&src, src_buf, size, err);
}

TEST(preset_file)
{
    char path[512], err[ERRMSG_LEN];
    snprintf(path, sizeof path, "%s/models/quant-refs/kq-%s.gguf", check_shared(), cur);
    if (access(path, R_OK) != 0) SKIP("%.400s not found", path);
    uint8_t *buf;
    size_t size;
    struct gguf g;
    CHECKF(convert_read_file(path, &buf, &size, err) == 0, "%s", err);
    CHECKF(gguf_parse(&g, buf, size, err) == 0, "%s", err);
    float *row = malloc(sizeof(float) * 4096);
    uint8_t *q = malloc(4096 * 4);
    int bad_tensor = -1, bad_row = -1, quantized = 0;
    for (uint64_t i = 0; i < g.n_tensors && bad_tensor < 0; i++) {
        const struct gguf_tensor *t = &g.tensors[i];
        char name[96];
        gguf_str_printable(t->name, name, sizeof name);
        const struct gguf_tensor *s = gguf_find_tensor(&src, name);
        CHECKF(s && s->type == GGML_F32 && s->ne[0] == t->ne[0] && s->ne[1] == t->ne[1],
               "%s: tensor %s has no f32 twin in the regenerated source", cur, name);
        const uint64_t cols = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
        const uint64_t rb = ggml_row_bytes(t->type, cols);
        CHECKF(rb && cols <= 4096, "%s: tensor %s: type %s", cur, name, ggml_type_name(t->type));
        int layer, kind = tensor_kind(name, &layer);
        if (kind >= 0) { /* the quant-refs model: 4 layers, 4 heads over 2 KV heads */
            uint32_t want = quant_preset_type(quant_preset_find(cur), kind, layer, 4, 2, cols);
            CHECKF(want == t->type, "%s: tensor %s is %s, quant_preset_type says %s", cur, name,
                   ggml_type_name(t->type), ggml_type_name(want));
        }
        const float scale = gguf_str_eq(t->name, "output.weight") ? 16.0f : 1.0f;
        const float *x = gguf_tensor_data(&src, s);
        const uint8_t *want = gguf_tensor_data(&g, t);
        quantized += t->type != GGML_F32;
        for (uint64_t r = 0; r < rows; r++) {
            for (uint64_t c = 0; c < cols; c++) row[c] = x[r * cols + c] * scale;
            CHECKF(quantize_row(t->type, row, q, (int)cols) == 0, "%s: %s: quantize_row(%s)", cur,
                   name, ggml_type_name(t->type));
            if (memcmp(q, want + r * rb, rb)) {
                bad_tensor = (int)i;
                bad_row = (int)r;
                break;
            }
        }
    }
    free(row);
    free(q);
    if (bad_tensor >= 0) {
        char name[96];
        gguf_str_printable(g.tensors[bad_tensor].name, name, sizeof name);
        uint32_t type = g.tensors[bad_tensor].type;
        gguf_free(&g);
        free(buf);
        CHECKF(0, "%s: tensor %s (%s) row %d differs from llama-quantize's", cur, name,
               ggml_type_name(type), bad_row);
    }
    gguf_free(&g);
    free(buf);
    CHECKF(quantized > 0, "%s: nothing quantized", cur);
}

int main(void)
{
    char err[ERRMSG_LEN];
    if (load_source(err) < 0) {
        printf("not ok - regenerate the quant-refs source model: %s\n", err);
        return 1;
    }
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "kq-%s.gguf byte-identical to llama-quantize", presets[i]);
        cur = presets[i];
        check_run(name, preset_file);
    }
    gguf_free(&src);
    free(src_buf);
    CHECK_DONE();
}
