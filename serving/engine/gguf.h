/* gguf: reader and writer of GGUF v3 files (the format llama.cpp and its users share).
 *
 * Reader: gguf_parse() validates a whole file image held in memory (mmap or a buffer): magic,
 * version 3 (2 accepted), counts, every string and array length against the bytes left, tensor
 * ranks (1..4) and dims (no overflow of element or byte counts), types, alignment
 * (general.alignment, default 32, power of two), and that each tensor's data lies inside the file
 * and does not overlap another. It never reads outside [buf, buf+size) and never trusts a count
 * before checking it against the remaining bytes. Parsed keys and names point into the caller's
 * buffer (not NUL-terminated: use the lengths), so the buffer must outlive the struct.
 * gguf_parse_header() does the same on a prefix that holds at least the metadata and tensor infos
 * (a joining node receives these bytes before any weights) and skips the data-range checks
 * against the file size.
 *
 * The host is assumed little-endian (x86-64, aarch64), like the files.
 *
 * Writer: gguf_writer accumulates metadata and tensors and writes a v3 file with 32-byte aligned
 * tensor data in the order tensors were added (execution order, so a layer is one byte range). */
#ifndef STRATA_GGUF_H
#define STRATA_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Metadata value types (GGUF spec). */
enum gguf_vtype {
    GGUF_UINT8 = 0,
    GGUF_INT8 = 1,
    GGUF_UINT16 = 2,
    GGUF_INT16 = 3,
    GGUF_UINT32 = 4,
    GGUF_INT32 = 5,
    GGUF_FLOAT32 = 6,
    GGUF_BOOL = 7,
    GGUF_STRING = 8,
    GGUF_ARRAY = 9,
    GGUF_UINT64 = 10,
    GGUF_INT64 = 11,
    GGUF_FLOAT64 = 12,
};

/* Tensor element types (ggml numbering). Only the ones Strata computes with are listed; the reader
 * also knows the sizes of the other fixed-layout ggml types (Q8_1, Q8_K, ints, F64) so it can
 * parse such files, and model_plan rejects them with a message. Block layouts: quant.h. */
enum ggml_type {
    GGML_F32 = 0,
    GGML_F16 = 1,
    GGML_Q4_0 = 2,
    GGML_Q4_1 = 3,
    GGML_Q5_0 = 6,
    GGML_Q5_1 = 7,
    GGML_Q8_0 = 8,
    GGML_Q2_K = 10,
    GGML_Q3_K = 11,
    GGML_Q4_K = 12,
    GGML_Q5_K = 13,
    GGML_Q6_K = 14,
    GGML_IQ4_NL = 20,
    GGML_IQ4_XS = 23,
    GGML_BF16 = 30,
};

struct gguf_str {
    const char *p; /* not NUL-terminated */
    uint64_t len;
};

struct gguf_kv {
    struct gguf_str key;
    uint32_t type; /* enum gguf_vtype */
    union {
        uint64_t u; /* unsigned ints and bool */
        int64_t i;  /* signed ints */
        double f;   /* floats */
        struct gguf_str s;
        struct {
            uint32_t type; /* element type */
            uint64_t n;
            const uint8_t *data; /* raw little-endian elements; for strings, len-prefixed */
        } arr;
    } v;
};

struct gguf_tensor {
    struct gguf_str name;
    uint32_t n_dims;
    uint64_t ne[4];  /* ne[0] is the innermost (contiguous) dimension; unused dims are 1 */
    uint32_t type;   /* enum ggml_type */
    uint64_t offset; /* from the start of the data section */
    uint64_t nbytes;
};

struct gguf {
    uint32_t version;
    uint64_t n_kv, n_tensors;
    struct gguf_kv *kv;
    struct gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_offset; /* file offset of the data section */
    const uint8_t *base;  /* the caller's buffer */
    size_t size;
};

int gguf_parse(struct gguf *g, const void *buf, size_t size, char *err);
int gguf_parse_header(struct gguf *g, const void *buf, size_t size, char *err);
void gguf_free(struct gguf *g);

/* Bytes of one row of n elements of type t, or 0 if t is unsupported or n is not a multiple of the
 * type's block size. */
uint64_t ggml_row_bytes(uint32_t type, uint64_t n);
const char *ggml_type_name(uint32_t type);
int ggml_block_elems(uint32_t type); /* elements per block: 1, 32 or 256; 0 if unknown */

const struct gguf_kv *gguf_find(const struct gguf *g, const char *key);
const struct gguf_tensor *gguf_find_tensor(const struct gguf *g, const char *name);
/* Typed getters: 0 if present with a compatible type (any integer type for u32, as long as it
 * fits; f32 or f64 for float), -1 with err naming the key otherwise. */
int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out, char *err);
int gguf_get_f32(const struct gguf *g, const char *key, float *out, char *err);
int gguf_get_str(const struct gguf *g, const char *key, struct gguf_str *out, char *err);
/* Pointer to a tensor's bytes inside the buffer. */
const void *gguf_tensor_data(const struct gguf *g, const struct gguf_tensor *t);
/* An array-valued key whose elements have type elem_type: 0 and *out, or -1 with err. */
int gguf_get_arr(const struct gguf *g, const char *key, uint32_t elem_type,
                 const struct gguf_kv **out, char *err);
/* Walk a string array that gguf_parse validated: reads the string at p into *s and returns the
 * position of the next one. Start with kv->v.arr.data. */
const uint8_t *gguf_next_str(const uint8_t *p, struct gguf_str *s);
/* A file string made safe for a message: at most cap-1 bytes (cut with "..."), control bytes and
 * DEL as '?', NUL-terminated. Returns out. */
char *gguf_str_printable(struct gguf_str s, char *out, size_t cap);
/* 1 if s equals the NUL-terminated string c. */
int gguf_str_eq(struct gguf_str s, const char *c);
const char *gguf_vtype_name(uint32_t type);

/* Writer. Values are copied; tensor data is referenced until gguf_writer_write returns. */
struct gguf_writer;
struct gguf_writer *gguf_writer_new(void);
void gguf_writer_free(struct gguf_writer *w);
int gguf_w_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_w_f32(struct gguf_writer *w, const char *key, float v);
int gguf_w_str(struct gguf_writer *w, const char *key, const char *v);
int gguf_w_arr_str(struct gguf_writer *w, const char *key, const char *const *v, uint64_t n);
int gguf_w_arr_f32(struct gguf_writer *w, const char *key, const float *v, uint64_t n);
int gguf_w_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
/* Any scalar type but string and array (v points to a value of that type, bool as uint8_t), and
 * arrays of any scalar type but string and array. */
int gguf_w_val(struct gguf_writer *w, const char *key, uint32_t type, const void *v);
int gguf_w_arr(struct gguf_writer *w, const char *key, uint32_t elem_type, const void *v,
               uint64_t n);
/* Tensors added with data == NULL get their bytes from fill() at write time, one tensor at a time,
 * so a tool can write a model larger than it wants to hold in memory. fill returns 0 or -1. */
void gguf_writer_set_fill(struct gguf_writer *w,
                          int (*fill)(void *ctx, int index, void *buf, uint64_t nbytes), void *ctx);
/* ne as in struct gguf_tensor (ne[0] innermost). data holds ggml_row_bytes(type, ne[0]) * rows. */
int gguf_w_tensor(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                  const uint64_t *ne, const void *data);
int gguf_writer_write(struct gguf_writer *w, FILE *f, char *err);

#endif
