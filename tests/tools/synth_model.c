/* synth_model: write a complete llama, qwen2 or qwen3 GGUF with random weights, for tests and
 * benchmarks.
 *
 *   build/tools/synth_model --shape stories15M|stories110M|tinyllama|llama3-8b|tiny-gqa|
 *       D,H,L,NH,NKV,V,S --type TYPE|--preset PRESET --seed S -o OUT.gguf
 *       [--tokenizer ../shared/models/tokenizer.bin] [--tied|--untied] [--threads N]
 *       [--arch llama|qwen2|qwen3] [--head-dim N] [--bias] [--rope-freqs] [--rope-theta T]
 *       [--output-scale S] [--qk-scale S]
 *       [--vocab-json tokenizer.json [--vocab-config tokenizer_config.json]]
 *
 * --arch qwen2 writes q/k/v biases, qwen3 per-head q/k norms; --bias gives a llama file biases;
 * --head-dim sets key_length (heads x head dim may then differ from dim, as in Mistral Nemo and
 * Qwen3); --rope-freqs writes Llama 3.1's rope_freqs.weight; --output-scale multiplies the
 * logits (output.weight, or output_norm.weight when tied: a peaked next-token distribution, as a
 * trained model's); --qk-scale multiplies attn_q and attn_k (attention scores with a spread, so
 * that positions matter, as in a trained model); --vocab-json writes a real vocabulary (Llama 3's,
 * Qwen's: a Hugging Face tokenizer.json, with its tokenizer_config.json's chat template and
 * add_bos) as llama.cpp's converter does, and the model's vocabulary is its size (the shape's V is
 * ignored).
 *
 * The command line of tests/synth/synth_gguf.c, the one synthetic-model generator (weights,
 * vocabulary and determinism are described there); --threads defaults to all CPUs, and the bytes
 * do not depend on it. --type: every matrix that ggml type (f32, f16, bf16, q8_0, q4_0, q4_1,
 * q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs); --preset: a llama.cpp quantizer
 * preset (Q4_K_M, Q3_K_S, Q6_K, IQ4_XS, ...: quant_preset.h), each matrix the type llama-quantize
 * gives it, so the file is the one llama-quantize writes from the f32 model. --type also takes
 * the preset names that are not type names (q4_k_m, q3_k_s, ...). */
#include "os/common/errmsg.h"
#include "serving/engine/convert.h"
#include "serving/engine/quant_preset.h"
#include "tests/synth/synth_gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct shape {
    const char *name;
    int dim, hidden, layers, heads, kv_heads, vocab, seq;
    int tied;
} shapes[] = {
    {"stories15M", 288, 768, 6, 6, 6, 32000, 256, 1},
    {"stories110M", 768, 2048, 12, 12, 12, 32000, 1024, 1},
    {"tinyllama", 2048, 5632, 22, 32, 4, 32000, 2048, 0},
    /* Llama-3-8B's shape with a 32000-token vocabulary (the real one is 128256) */
    {"llama3-8b", 4096, 14336, 32, 32, 8, 32000, 8192, 0},
    /* small, grouped-query, every row a multiple of 256 so that every type applies */
    {"tiny-gqa", 256, 512, 2, 8, 2, 512, 256, 0},
};

static int usage(void)
{
    fprintf(stderr,
            "usage: synth_model --shape stories15M|stories110M|tinyllama|llama3-8b|tiny-gqa|"
            "D,H,L,NH,NKV,V,S --type f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|iq4_nl|q2_k|q3_k|q4_k|"
            "q5_k|q6_k|iq4_xs|--preset %s --seed S -o OUT.gguf [--tokenizer TOK.bin] "
            "[--tied|--untied] [--threads N] [--arch llama|qwen2|qwen3] [--head-dim N] [--bias] "
            "[--rope-freqs] [--rope-theta T] [--output-scale S] [--qk-scale S] "
            "[--vocab-json tokenizer.json [--vocab-config tokenizer_config.json]]\n",
            quant_preset_list());
    return 2;
}

int main(int argc, char **argv)
{
    struct shape sh = {0};
    const char *out = NULL, *tok_path = NULL, *preset = NULL, *vjson = NULL, *vconfig = NULL;
    uint32_t type = GGML_F32;
    uint64_t seed = 1;
    int tied = -1, have_shape = 0, threads = 0, arch = ARCH_LLAMA, head_dim = 0, bias = 0,
        rope_freqs = 0;
    float rope_theta = 0, output_scale = 0, qk_scale = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--shape") && v) {
            i++;
            for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
                if (!strcmp(v, shapes[k].name)) sh = shapes[k], have_shape = 1;
            if (!have_shape) {
                if (sscanf(v, "%d,%d,%d,%d,%d,%d,%d", &sh.dim, &sh.hidden, &sh.layers, &sh.heads,
                           &sh.kv_heads, &sh.vocab, &sh.seq) != 7) {
                    fprintf(stderr, "synth_model: bad shape '%s'\n", v);
                    return usage();
                }
                sh.name = "custom";
                sh.tied = 1;
                have_shape = 1;
            }
        } else if (!strcmp(a, "--type") && v) {
            if (convert_parse_type(argv[++i], &type) < 0) {
                if (!quant_preset_find(argv[i])) return usage();
                preset = argv[i];
            }
        } else if (!strcmp(a, "--preset") && v) {
            preset = argv[++i];
            if (!quant_preset_find(preset)) return usage();
        } else if (!strcmp(a, "--seed") && v)
            seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(a, "-o") && v)
            out = argv[++i];
        else if (!strcmp(a, "--tokenizer") && v)
            tok_path = argv[++i];
        else if (!strcmp(a, "--vocab-json") && v)
            vjson = argv[++i];
        else if (!strcmp(a, "--vocab-config") && v)
            vconfig = argv[++i];
        else if (!strcmp(a, "--threads") && v)
            threads = atoi(argv[++i]);
        else if (!strcmp(a, "--arch") && v) {
            for (arch = 0; arch < N_ARCHS && strcmp(v, model_arch_name(arch)); arch++) {
            }
            if (arch == N_ARCHS) return usage();
            i++;
        } else if (!strcmp(a, "--head-dim") && v)
            head_dim = atoi(argv[++i]);
        else if (!strcmp(a, "--bias"))
            bias = 1;
        else if (!strcmp(a, "--rope-freqs"))
            rope_freqs = 1;
        else if (!strcmp(a, "--rope-theta") && v)
            rope_theta = strtof(argv[++i], NULL);
        else if (!strcmp(a, "--output-scale") && v)
            output_scale = strtof(argv[++i], NULL);
        else if (!strcmp(a, "--qk-scale") && v)
            qk_scale = strtof(argv[++i], NULL);
        else if (!strcmp(a, "--tied"))
            tied = 1;
        else if (!strcmp(a, "--untied"))
            tied = 0;
        else
            return usage();
    }
    if (!have_shape || !out || (tok_path && vjson) || (vconfig && !vjson)) return usage();
    if (tied >= 0) sh.tied = tied;
    if (sh.dim <= 0 || sh.hidden <= 0 || sh.layers <= 0 || sh.layers > MODEL_MAX_LAYERS ||
        sh.heads <= 0 || sh.kv_heads <= 0 || (sh.vocab < 3 && !vjson) || sh.seq <= 0 ||
        (!head_dim && sh.dim % sh.heads) || sh.heads % sh.kv_heads ||
        (head_dim ? head_dim : sh.dim / sh.heads) % 2 || head_dim < 0 || head_dim > 4096) {
        fprintf(stderr, "synth_model: inconsistent shape %d,%d,%d,%d,%d,%d,%d (head dim %d)\n",
                sh.dim, sh.hidden, sh.layers, sh.heads, sh.kv_heads, sh.vocab, sh.seq, head_dim);
        return 2;
    }
    if ((bias && arch != ARCH_LLAMA) || (rope_freqs && arch != ARCH_LLAMA) || rope_theta < 0 ||
        output_scale < 0 || qk_scale < 0) {
        fprintf(stderr, "synth_model: --bias and --rope-freqs are for --arch llama (qwen2 always "
                        "has biases); --rope-theta and the scales must be positive\n");
        return 2;
    }
    long cpus = threads > 0 ? threads : sysconf(_SC_NPROCESSORS_ONLN);
    struct synth_spec spec = {
        sh.name,  sh.dim,        sh.hidden,  sh.layers,
        sh.heads, sh.kv_heads,   sh.vocab,   sh.seq,
        sh.tied,  type,          seed,       cpus < 1 ? 1 : cpus > 16 ? 16 : (int)cpus,
        tok_path, "synth_model", arch,       head_dim,
        bias,     rope_freqs,    rope_theta, output_scale,
        qk_scale, preset,        vjson,      vconfig,
    };
    char err[ERRMSG_LEN];
    if (synth_gguf_write(out, &spec, err) < 0) {
        fprintf(stderr, "synth_model: %s\n", err);
        return 1;
    }
    return 0;
}
