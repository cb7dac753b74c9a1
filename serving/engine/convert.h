/* convert: llama2.c checkpoints to GGUF, and the pieces any GGUF model writer shares.
 *
 * A llama2.c "v0" checkpoint is 7 little-endian int32 (dim, hidden_dim, n_layers, n_heads,
 * n_kv_heads, vocab_size, seq_len; a negative vocab_size means an untied classifier follows the
 * other tensors) and then fp32 tensors: token_embedding (vocab, dim), rms_att (L, dim),
 * wq (L, dim, dim), wk (L, kv_dim, dim), wv (L, kv_dim, dim), wo (L, dim, dim), rms_ffn (L, dim),
 * w1 (L, hidden, dim), w2 (L, dim, hidden), w3 (L, hidden, dim), rms_final (dim),
 * freq_cis_real and freq_cis_imag (seq_len, head_dim/2 each; unused: RoPE is computed from
 * llama.rope.freq_base = 10000, which is what they hold), [wcls (vocab, dim)].
 * The checkpoint's size must match its header exactly.
 *
 * The GGUF gets tensors in execution order (w1 -> ffn_gate, w2 -> ffn_down, w3 -> ffn_up), wq/wk
 * unpermuted (see the RoPE note in model.c), norms in F32, every matrix in the requested type when
 * its row length is a multiple of the type's block (else F32, with a warning), and the tokenizer
 * as tokenizer.ggml.* metadata in llama.cpp's spelling (U+2581 for spaces, <s> and </s>). */
#ifndef STRATA_CONVERT_H
#define STRATA_CONVERT_H

#include "serving/engine/gguf.h"
#include "serving/engine/model.h"
#include "serving/engine/tokenizer.h"

#include <stddef.h>
#include <stdint.h>

/* Parse a weight type name: f32 f16 bf16 q8_0 q4_0 q4_k. -1 if unknown. */
int convert_parse_type(const char *name, uint32_t *type);

/* Convert checkpoint and tokenizer images (as read from the files) into a GGUF written to out.
 * `name` goes into general.name; `what` names the checkpoint in messages. */
int convert_llama2c(const void *ckpt, size_t ckpt_size, const void *tok, size_t tok_size,
                    uint32_t type, const char *name, const char *what, FILE *out, char *err);
/* The same from and to files. */
int convert_llama2c_files(const char *ckpt_path, const char *tok_path, const char *out_path,
                          uint32_t type, char *err);

/* Shared by model writers (the converter, tests/tools/synth_model): */
/* general.* keys and cfg under its architecture's prefix ("llama.block_count"). */
int convert_put_config(struct gguf_writer *w, const struct model_config *cfg, uint32_t type,
                       const char *name);
/* The same with general.file_type given (a llama.cpp preset's, quant_preset.h). */
int convert_put_config_ftype(struct gguf_writer *w, const struct model_config *cfg,
                             uint32_t file_type, const char *name);
/* tokenizer.ggml.* keys for t. */
int convert_put_tokenizer(struct gguf_writer *w, const struct tokenizer *t);
/* The type a matrix with rows of `cols` elements gets when `type` is requested: `type` if cols is
 * a multiple of its block, else F32. */
uint32_t convert_matrix_type(uint32_t type, uint64_t cols);
/* Encode rows x cols floats as `type` into out (ggml_row_bytes(type, cols) * rows bytes). */
int convert_encode(uint32_t type, const float *x, uint64_t rows, uint64_t cols, void *out);

/* Read a whole file into a malloc'd buffer. */
int convert_read_file(const char *path, uint8_t **buf, size_t *size, char *err);

#endif
