/* GGUF reader/writer and model_plan: round trips, hostile files, exact error messages. */
#include "os/common/errmsg.h"
#include "serving/engine/gguf.h"
#include "serving/engine/model.h"
#include "tests/unit/check.h"

#include <stdint.h>

static char err[ERRMSG_LEN];

/* Serialise a writer into a malloc'd buffer. */
static uint8_t *write_mem(struct gguf_writer *w, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    int rc = gguf_writer_write(w, f, err);
    fclose(f);
    if (rc < 0) {
        free(buf);
        return NULL;
    }
    return (uint8_t *)buf;
}

/* Parse a private copy of exactly `len` bytes, so ASan sees any read past the end. */
static int parse_copy(const uint8_t *buf, size_t len, int header_only)
{
    uint8_t *c = malloc(len ? len : 1);
    memcpy(c, buf, len);
    struct gguf g;
    int rc = header_only ? gguf_parse_header(&g, c, len, err) : gguf_parse(&g, c, len, err);
    if (rc == 0) gguf_free(&g);
    free(c);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Round trip */

TEST(roundtrip_every_kv_type)
{
    struct gguf_writer *w = gguf_writer_new();
    uint8_t u8 = 200, b = 1;
    int8_t i8 = -100;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    int32_t i32 = -2000000000;
    uint64_t u64 = 0xfedcba9876543210ull;
    int64_t i64 = -0x123456789abcdefll;
    double f64 = 3.141592653589793;
    CHECK(gguf_w_val(w, "k.u8", GGUF_UINT8, &u8) == 0);
    CHECK(gguf_w_val(w, "k.i8", GGUF_INT8, &i8) == 0);
    CHECK(gguf_w_val(w, "k.u16", GGUF_UINT16, &u16) == 0);
    CHECK(gguf_w_val(w, "k.i16", GGUF_INT16, &i16) == 0);
    CHECK(gguf_w_u32(w, "k.u32", 4000000000u) == 0);
    CHECK(gguf_w_val(w, "k.i32", GGUF_INT32, &i32) == 0);
    CHECK(gguf_w_f32(w, "k.f32", 0.5f) == 0);
    CHECK(gguf_w_val(w, "k.bool", GGUF_BOOL, &b) == 0);
    CHECK(gguf_w_str(w, "k.str", "hello, world") == 0);
    CHECK(gguf_w_val(w, "k.u64", GGUF_UINT64, &u64) == 0);
    CHECK(gguf_w_val(w, "k.i64", GGUF_INT64, &i64) == 0);
    CHECK(gguf_w_val(w, "k.f64", GGUF_FLOAT64, &f64) == 0);
    const char *strs[] = {"a", "", "long string with \xe2\x96\x81 spaces"};
    CHECK(gguf_w_arr_str(w, "a.str", strs, 3) == 0);
    float fa[] = {1.5f, -2.25f};
    CHECK(gguf_w_arr_f32(w, "a.f32", fa, 2) == 0);
    int32_t ia[] = {7, -8, 9};
    CHECK(gguf_w_arr_i32(w, "a.i32", ia, 3) == 0);
    uint8_t u8a[] = {1, 2, 3, 4, 5};
    CHECK(gguf_w_arr(w, "a.u8", GGUF_UINT8, u8a, 5) == 0);
    uint64_t u64a[] = {1, UINT64_MAX};
    CHECK(gguf_w_arr(w, "a.u64", GGUF_UINT64, u64a, 2) == 0);
    double f64a[] = {0.25};
    CHECK(gguf_w_arr(w, "a.f64", GGUF_FLOAT64, f64a, 1) == 0);
    CHECK(gguf_w_arr(w, "a.empty", GGUF_INT16, NULL, 0) == 0);
    CHECK(gguf_w_val(w, "bad", GGUF_STRING, "x") < 0); /* strings go through gguf_w_str */
    gguf_writer_free(w);

    /* The failed add poisons the writer: build again without it. */
    w = gguf_writer_new();
    CHECK(gguf_w_val(w, "k.u8", GGUF_UINT8, &u8) == 0);
    CHECK(gguf_w_val(w, "k.i8", GGUF_INT8, &i8) == 0);
    CHECK(gguf_w_val(w, "k.u16", GGUF_UINT16, &u16) == 0);
    CHECK(gguf_w_val(w, "k.i16", GGUF_INT16, &i16) == 0);
    CHECK(gguf_w_u32(w, "k.u32", 4000000000u) == 0);
    CHECK(gguf_w_val(w, "k.i32", GGUF_INT32, &i32) == 0);
    CHECK(gguf_w_f32(w, "k.f32", 0.5f) == 0);
    CHECK(gguf_w_val(w, "k.bool", GGUF_BOOL, &b) == 0);
    CHECK(gguf_w_str(w, "k.str", "hello, world") == 0);
    CHECK(gguf_w_val(w, "k.u64", GGUF_UINT64, &u64) == 0);
    CHECK(gguf_w_val(w, "k.i64", GGUF_INT64, &i64) == 0);
    CHECK(gguf_w_val(w, "k.f64", GGUF_FLOAT64, &f64) == 0);
    CHECK(gguf_w_arr_str(w, "a.str", strs, 3) == 0);
    CHECK(gguf_w_arr_f32(w, "a.f32", fa, 2) == 0);
    CHECK(gguf_w_arr_i32(w, "a.i32", ia, 3) == 0);
    CHECK(gguf_w_arr(w, "a.u8", GGUF_UINT8, u8a, 5) == 0);
    CHECK(gguf_w_arr(w, "a.u64", GGUF_UINT64, u64a, 2) == 0);
    CHECK(gguf_w_arr(w, "a.f64", GGUF_FLOAT64, f64a, 1) == 0);
    CHECK(gguf_w_arr(w, "a.empty", GGUF_INT16, NULL, 0) == 0);
    size_t len;
    uint8_t *buf = write_mem(w, &len);
    gguf_writer_free(w);
    CHECKF(buf, "%s", err);
    struct gguf g;
    CHECKF(gguf_parse(&g, buf, len, err) == 0, "%s", err);
    CHECK_EQ_INT(g.version, 3);
    CHECK_EQ_INT(g.n_kv, 19);
    CHECK_EQ_INT(g.n_tensors, 0);
    CHECK_EQ_INT(g.alignment, 32);
    const struct gguf_kv *kv;
    CHECK((kv = gguf_find(&g, "k.u8")) && kv->type == GGUF_UINT8 && kv->v.u == 200);
    CHECK((kv = gguf_find(&g, "k.i8")) && kv->type == GGUF_INT8 && kv->v.i == -100);
    CHECK((kv = gguf_find(&g, "k.u16")) && kv->type == GGUF_UINT16 && kv->v.u == 60000);
    CHECK((kv = gguf_find(&g, "k.i16")) && kv->type == GGUF_INT16 && kv->v.i == -30000);
    CHECK((kv = gguf_find(&g, "k.u32")) && kv->type == GGUF_UINT32 && kv->v.u == 4000000000u);
    CHECK((kv = gguf_find(&g, "k.i32")) && kv->type == GGUF_INT32 && kv->v.i == -2000000000);
    CHECK((kv = gguf_find(&g, "k.f32")) && kv->type == GGUF_FLOAT32 && kv->v.f == 0.5);
    CHECK((kv = gguf_find(&g, "k.bool")) && kv->type == GGUF_BOOL && kv->v.u == 1);
    CHECK((kv = gguf_find(&g, "k.u64")) && kv->type == GGUF_UINT64 && kv->v.u == u64);
    CHECK((kv = gguf_find(&g, "k.i64")) && kv->type == GGUF_INT64 && kv->v.i == i64);
    CHECK((kv = gguf_find(&g, "k.f64")) && kv->type == GGUF_FLOAT64 && kv->v.f == f64);
    struct gguf_str s;
    CHECK(gguf_get_str(&g, "k.str", &s, err) == 0 && gguf_str_eq(s, "hello, world"));
    uint32_t u32;
    float f32;
    CHECK(gguf_get_u32(&g, "k.u32", &u32, err) == 0 && u32 == 4000000000u);
    CHECK(gguf_get_u32(&g, "k.u16", &u32, err) == 0 && u32 == 60000);
    CHECK(gguf_get_u32(&g, "k.i8", &u32, err) < 0);
    CHECK_STR(err, "key k.i8: value -100 is out of range");
    CHECK(gguf_get_u32(&g, "k.u64", &u32, err) < 0);
    CHECK(gguf_get_u32(&g, "k.str", &u32, err) < 0);
    CHECK_STR(err, "key k.str has type string, expected an integer");
    CHECK(gguf_get_u32(&g, "nope", &u32, err) < 0);
    CHECK_STR(err, "missing key nope");
    CHECK(gguf_get_f32(&g, "k.f64", &f32, err) == 0 && f32 == (float)f64);
    CHECK(gguf_get_f32(&g, "k.f32", &f32, err) == 0 && f32 == 0.5f);
    CHECK(gguf_get_str(&g, "k.u8", &s, err) < 0);

    CHECK(gguf_get_arr(&g, "a.str", GGUF_STRING, &kv, err) == 0 && kv->v.arr.n == 3);
    const uint8_t *p = kv->v.arr.data;
    for (int i = 0; i < 3; i++) {
        p = gguf_next_str(p, &s);
        CHECK(gguf_str_eq(s, strs[i]));
    }
    CHECK(gguf_get_arr(&g, "a.f32", GGUF_FLOAT32, &kv, err) == 0 && kv->v.arr.n == 2);
    CHECK(memcmp(kv->v.arr.data, fa, sizeof fa) == 0);
    CHECK(gguf_get_arr(&g, "a.i32", GGUF_INT32, &kv, err) == 0);
    CHECK(memcmp(kv->v.arr.data, ia, sizeof ia) == 0);
    CHECK(gguf_get_arr(&g, "a.u8", GGUF_UINT8, &kv, err) == 0 && kv->v.arr.n == 5);
    CHECK(memcmp(kv->v.arr.data, u8a, sizeof u8a) == 0);
    CHECK(gguf_get_arr(&g, "a.u64", GGUF_UINT64, &kv, err) == 0);
    CHECK(memcmp(kv->v.arr.data, u64a, sizeof u64a) == 0);
    CHECK(gguf_get_arr(&g, "a.f64", GGUF_FLOAT64, &kv, err) == 0);
    CHECK(memcmp(kv->v.arr.data, f64a, sizeof f64a) == 0);
    CHECK(gguf_get_arr(&g, "a.empty", GGUF_INT16, &kv, err) == 0 && kv->v.arr.n == 0);
    CHECK(gguf_get_arr(&g, "a.f32", GGUF_INT32, &kv, err) < 0);
    CHECK_STR(err, "key a.f32 has type array of f32, expected an array of i32");
    gguf_free(&g);
    free(buf);
}

TEST(roundtrip_every_tensor_type)
{
    enum { NT = 15 };
    const uint32_t types[NT] = {GGML_F32,  GGML_F16,  GGML_Q4_0, GGML_Q8_0, GGML_Q4_K,
                                GGML_BF16, GGML_Q4_1, GGML_Q5_0, GGML_Q5_1, GGML_IQ4_NL,
                                GGML_Q2_K, GGML_Q3_K, GGML_Q5_K, GGML_Q6_K, GGML_IQ4_XS};
    const uint64_t bytes_per_256[NT] = {1024, 512, 144, 272, 144, 512, 160, 176,
                                        192,  144, 84,  110, 176, 210, 136};
    struct gguf_writer *w = gguf_writer_new();
    CHECK(gguf_w_str(w, "general.architecture", "test") == 0);
    uint8_t *data[NT];
    char name[NT][32];
    for (int i = 0; i < NT; i++) {
        uint64_t ne[3] = {256, 3, 2}; /* 6 rows of 256 */
        CHECK_EQ_INT(ggml_row_bytes(types[i], 256), bytes_per_256[i]);
        size_t n = bytes_per_256[i] * 6;
        data[i] = malloc(n);
        for (size_t k = 0; k < n; k++) data[i][k] = (uint8_t)(k * 31 + i);
        snprintf(name[i], sizeof name[i], "t.%s", ggml_type_name(types[i]));
        CHECK(gguf_w_tensor(w, name[i], types[i], i == 0 ? 3 : 2, ne, data[i]) == 0);
    }
    uint64_t bad_ne[1] = {100};
    struct gguf_writer *w2 = gguf_writer_new();
    CHECK(gguf_w_tensor(w2, "bad", GGML_Q8_0, 1, bad_ne, data[0]) < 0); /* 100 % 32 */
    gguf_writer_free(w2);
    size_t len;
    uint8_t *buf = write_mem(w, &len);
    gguf_writer_free(w);
    CHECKF(buf, "%s", err);
    struct gguf g;
    CHECKF(gguf_parse(&g, buf, len, err) == 0, "%s", err);
    CHECK_EQ_INT(g.n_tensors, NT);
    CHECK_EQ_INT(g.data_offset % 32, 0);
    for (int i = 0; i < NT; i++) {
        const struct gguf_tensor *t = gguf_find_tensor(&g, name[i]);
        CHECK(t);
        CHECK(t == &g.tensors[i]); /* in the order added */
        CHECK_EQ_INT(t->type, types[i]);
        CHECK_EQ_INT(t->n_dims, i == 0 ? 3 : 2);
        CHECK_EQ_INT(t->ne[0], 256);
        CHECK_EQ_INT(t->ne[1], 3);
        CHECK_EQ_INT(t->ne[2], i == 0 ? 2 : 1);
        CHECK_EQ_INT(t->nbytes, i == 0 ? bytes_per_256[i] * 6 : bytes_per_256[i] * 3);
        CHECK_EQ_INT(t->offset % 32, 0);
        CHECK(memcmp(gguf_tensor_data(&g, t), data[i], t->nbytes) == 0);
        free(data[i]);
    }
    CHECK(gguf_find_tensor(&g, "t.q8_1") == NULL);
    gguf_free(&g);
    free(buf);
}

TEST(printable_names)
{
    char out[12];
    struct gguf_str s = {"ab\x1b[0m\x7f\xc3\xa9", 9};
    CHECK_STR(gguf_str_printable(s, out, sizeof out), "ab?[0m?\xc3\xa9");
    s = (struct gguf_str){"0123456789abcdef", 16};
    CHECK_STR(gguf_str_printable(s, out, sizeof out), "01234567...");
    s = (struct gguf_str){"", 0};
    CHECK_STR(gguf_str_printable(s, out, sizeof out), "");
}

TEST(type_table)
{
    CHECK_STR(ggml_type_name(GGML_Q4_K), "q4_k");
    CHECK_STR(ggml_type_name(GGML_BF16), "bf16");
    CHECK_STR(ggml_type_name(99), "unknown");
    CHECK_EQ_INT(ggml_block_elems(GGML_F16), 1);
    CHECK_EQ_INT(ggml_block_elems(GGML_Q4_0), 32);
    CHECK_EQ_INT(ggml_block_elems(GGML_Q4_K), 256);
    CHECK_EQ_INT(ggml_block_elems(4), 0); /* removed Q4_2 */
    CHECK_EQ_INT(ggml_row_bytes(GGML_Q4_0, 64), 36);
    CHECK_STR(ggml_type_name(GGML_IQ4_XS), "iq4_xs");
    CHECK_EQ_INT(ggml_block_elems(GGML_IQ4_NL), 32);
    CHECK_EQ_INT(ggml_row_bytes(GGML_IQ4_XS, 512), 272);
    CHECK_EQ_INT(ggml_row_bytes(GGML_Q6_K, 256), 210);
    CHECK_EQ_INT(ggml_row_bytes(GGML_Q8_0, 33), 0);
    CHECK_EQ_INT(ggml_row_bytes(77, 32), 0);
    CHECK_EQ_INT(ggml_row_bytes(GGML_F32, UINT64_MAX / 2), 0); /* overflow */
}

/* ---------------------------------------------------------------------------------------------
 * Hand-assembled files for the hostile cases */

struct bb {
    uint8_t b[8192];
    size_t n;
};
static void put(struct bb *b, const void *p, size_t n)
{
    memcpy(b->b + b->n, p, n);
    b->n += n;
}
static void put32(struct bb *b, uint32_t v)
{
    put(b, &v, 4);
}
static void put64(struct bb *b, uint64_t v)
{
    put(b, &v, 8);
}
static void putstr(struct bb *b, const char *s)
{
    put64(b, strlen(s));
    put(b, s, strlen(s));
}

struct tinfo {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[5];
    uint32_t type;
    uint64_t offset;
};

/* A file: header, `kv` (raw entries, n_kv of them), tensor infos, padding to 32, then data_len
 * bytes of data. Counts in the header can be overridden. */
static void build(struct bb *b, uint64_t n_kv, const struct bb *kv, const struct tinfo *t, int nt,
                  size_t data_len)
{
    b->n = 0;
    put32(b, 0x46554747);
    put32(b, 3);
    put64(b, (uint64_t)nt);
    put64(b, n_kv);
    if (kv) put(b, kv->b, kv->n);
    for (int i = 0; i < nt; i++) {
        putstr(b, t[i].name);
        put32(b, t[i].n_dims);
        for (uint32_t d = 0; d < t[i].n_dims; d++) put64(b, t[i].ne[d]);
        put32(b, t[i].type);
        put64(b, t[i].offset);
    }
    while (b->n % 32) b->b[b->n++] = 0;
    for (size_t i = 0; i < data_len; i++) b->b[b->n++] = (uint8_t)i;
}

static struct bb file, kv;

/* Two f32 tensors of 8 and 16 elements: the last one ends the file exactly. */
static void valid_file(void)
{
    kv.n = 0;
    putstr(&kv, "general.name");
    put32(&kv, GGUF_STRING);
    putstr(&kv, "tiny");
    putstr(&kv, "list");
    put32(&kv, GGUF_ARRAY);
    put32(&kv, GGUF_STRING);
    put64(&kv, 2);
    putstr(&kv, "ab");
    putstr(&kv, "c");
    struct tinfo t[2] = {{"a", 1, {8}, GGML_F32, 0}, {"b", 2, {8, 2}, GGML_F32, 32}};
    build(&file, 2, &kv, t, 2, 96);
}

#define EXPECT_FAIL(substr)                                                                        \
    do {                                                                                           \
        CHECK(parse_copy(file.b, file.n, 0) < 0);                                                  \
        CHECKF(strstr(err, substr), "error \"%s\" lacks \"%s\"", err, substr);                     \
    } while (0)

TEST(valid_small_file)
{
    valid_file();
    CHECKF(parse_copy(file.b, file.n, 0) == 0, "%s", err);
    struct gguf g;
    CHECK(gguf_parse(&g, file.b, file.n, err) == 0);
    CHECK_EQ_INT(g.n_tensors, 2);
    CHECK_EQ_INT(g.tensors[1].nbytes, 64);
    CHECK_EQ_INT(g.data_offset + 96, file.n);
    gguf_free(&g);
}

TEST(truncated_at_every_byte)
{
    valid_file();
    for (size_t n = 0; n < file.n; n++) {
        CHECKF(parse_copy(file.b, n, 0) < 0, "a file cut to %zu of %zu bytes parsed", n, file.n);
        CHECKF(err[0], "no message at %zu", n);
    }
    /* The header-only parse needs everything up to the data section. */
    struct gguf g;
    CHECK(gguf_parse(&g, file.b, file.n, err) == 0);
    size_t head = g.data_offset;
    gguf_free(&g);
    CHECKF(parse_copy(file.b, head, 1) == 0, "%s", err);
    for (size_t n = 0; n + 32 <= head; n++) CHECK(parse_copy(file.b, n, 1) < 0);
}

TEST(bad_magic_and_version)
{
    valid_file();
    file.b[0] = 'X';
    EXPECT_FAIL("not a GGUF file (bad magic)");
    valid_file();
    file.b[4] = 1;
    EXPECT_FAIL("GGUF version 1 is not supported");
    valid_file();
    file.b[4] = 0, file.b[7] = 3;
    EXPECT_FAIL("big-endian");
    valid_file();
    file.b[4] = 2; /* version 2 has the same layout */
    CHECK(parse_copy(file.b, file.n, 0) == 0);
}

TEST(huge_counts)
{
    valid_file();
    uint64_t huge = 1ull << 62;
    memcpy(file.b + 16, &huge, 8);
    EXPECT_FAIL("metadata count 4611686018427387904 cannot fit");
    valid_file();
    memcpy(file.b + 8, &huge, 8);
    EXPECT_FAIL("tensor count 4611686018427387904 cannot fit");
    valid_file();
    uint64_t more = 3; /* one more key than there is: reads into the tensor infos and fails */
    memcpy(file.b + 16, &more, 8);
    CHECK(parse_copy(file.b, file.n, 0) < 0);
}

TEST(string_length_past_end)
{
    kv.n = 0;
    put64(&kv, 100);
    put(&kv, "general.name....", 16); /* key claims 100 bytes, the file ends after 16 */
    build(&file, 1, &kv, NULL, 0, 0);
    file.n = 24 + 8 + 16;
    EXPECT_FAIL("metadata key at byte 24: length 100 exceeds the 16 bytes left");
    kv.n = 0;
    putstr(&kv, "k");
    put32(&kv, GGUF_STRING);
    put64(&kv, UINT64_MAX);
    build(&file, 1, &kv, NULL, 0, 0);
    EXPECT_FAIL("key 'k': string value at byte 37: length 18446744073709551615 exceeds");
    kv.n = 0;
    putstr(&kv, "arr");
    put32(&kv, GGUF_ARRAY);
    put32(&kv, GGUF_UINT64);
    put64(&kv, 1ull << 61);
    build(&file, 1, &kv, NULL, 0, 0);
    EXPECT_FAIL("key 'arr': array of 2305843009213693952 u64");
    kv.n = 0;
    putstr(&kv, "sarr");
    put32(&kv, GGUF_ARRAY);
    put32(&kv, GGUF_STRING);
    put64(&kv, 2);
    putstr(&kv, "x");
    put64(&kv, 1000);
    build(&file, 1, &kv, NULL, 0, 0);
    EXPECT_FAIL("key 'sarr': element 1: array string");
}

TEST(bad_value_types)
{
    kv.n = 0;
    putstr(&kv, "k");
    put32(&kv, 13);
    put32(&kv, 0);
    build(&file, 1, &kv, NULL, 0, 0);
    EXPECT_FAIL("key 'k': unknown value type 13");
    kv.n = 0;
    putstr(&kv, "nest");
    put32(&kv, GGUF_ARRAY);
    put32(&kv, GGUF_ARRAY);
    put64(&kv, 0);
    build(&file, 1, &kv, NULL, 0, 0);
    EXPECT_FAIL("key 'nest': array element type 9 (array) is not supported");
    kv.n = 0;
    putstr(&kv, "bad\x1b[2Jkey"); /* a terminal escape: never printed raw */
    put32(&kv, 99);
    build(&file, 1, &kv, NULL, 0, 0);
    EXPECT_FAIL("key 'bad?[2Jkey'");
    kv.n = 0;
    for (int i = 0; i < 2; i++) {
        putstr(&kv, "dup");
        put32(&kv, GGUF_UINT8);
        put(&kv, "\1", 1);
    }
    build(&file, 2, &kv, NULL, 0, 0);
    EXPECT_FAIL("duplicate key 'dup'");
}

TEST(alignment_key)
{
    struct tinfo t[1] = {{"a", 1, {8}, GGML_F32, 0}};
    kv.n = 0;
    putstr(&kv, "general.alignment");
    put32(&kv, GGUF_UINT32);
    put32(&kv, 48);
    build(&file, 1, &kv, t, 1, 32);
    EXPECT_FAIL("general.alignment 48 is not a power of two");
    kv.n = 0;
    putstr(&kv, "general.alignment");
    put32(&kv, GGUF_UINT32);
    put32(&kv, 0);
    build(&file, 1, &kv, t, 1, 32);
    EXPECT_FAIL("general.alignment 0 is not a power of two");
    kv.n = 0;
    putstr(&kv, "general.alignment");
    put32(&kv, GGUF_STRING);
    putstr(&kv, "32");
    build(&file, 1, &kv, t, 1, 32);
    EXPECT_FAIL("general.alignment has type string, expected u32");
    /* A valid 64-byte alignment moves the data section to the next multiple of 64. */
    kv.n = 0;
    putstr(&kv, "general.alignment");
    put32(&kv, GGUF_UINT32);
    put32(&kv, 64);
    build(&file, 1, &kv, t, 1, 0);
    while (file.n % 64) file.b[file.n++] = 0;
    file.n += 32;
    struct gguf g;
    CHECKF(gguf_parse(&g, file.b, file.n, err) == 0, "%s", err);
    CHECK_EQ_INT(g.alignment, 64);
    CHECK_EQ_INT(g.data_offset % 64, 0);
    gguf_free(&g);
}

TEST(tensor_info_errors)
{
    struct tinfo t[2];
    t[0] = (struct tinfo){"a", 0, {8}, GGML_F32, 0};
    build(&file, 0, NULL, t, 1, 32);
    EXPECT_FAIL("tensor 'a': n_dims 0 is not in 1..4");
    t[0] = (struct tinfo){"a", 5, {8, 1, 1, 1, 1}, GGML_F32, 0};
    build(&file, 0, NULL, t, 1, 32);
    EXPECT_FAIL("tensor 'a': n_dims 5 is not in 1..4");
    t[0] = (struct tinfo){"a", 2, {8, 0}, GGML_F32, 0};
    build(&file, 0, NULL, t, 1, 32);
    EXPECT_FAIL("tensor 'a': dimension 1 is 0");
    t[0] = (struct tinfo){"a", 2, {8, UINT64_MAX}, GGML_F32, 0};
    build(&file, 0, NULL, t, 1, 32);
    EXPECT_FAIL("tensor 'a': dimension 1 is -1");
    t[0] = (struct tinfo){"a", 3, {1ull << 32, 1ull << 32, 4}, GGML_F32, 0};
    build(&file, 0, NULL, t, 1, 32);
    EXPECT_FAIL("tensor 'a': element count overflows");
    t[0] = (struct tinfo){"a", 2, {1ull << 40, 1ull << 22}, GGML_F32, 0};
    build(&file, 0, NULL, t, 1, 32);
    EXPECT_FAIL("tensor 'a': byte size overflows");
    t[0] = (struct tinfo){"a", 1, {8}, 4, 0};
    build(&file, 0, NULL, t, 1, 32);
    EXPECT_FAIL("tensor 'a': unknown type 4");
    t[0] = (struct tinfo){"a", 1, {40}, GGML_Q8_0, 0};
    build(&file, 0, NULL, t, 1, 64);
    EXPECT_FAIL("tensor 'a': row length 40 is not a multiple of q8_0's block of 32");
    t[0] = (struct tinfo){"a", 1, {8}, GGML_F32, 16};
    build(&file, 0, NULL, t, 1, 64);
    EXPECT_FAIL("tensor 'a': offset 16 is not a multiple of the alignment 32");
    t[0] = (struct tinfo){"a", 1, {8}, GGML_F32, 64};
    build(&file, 0, NULL, t, 1, 64);
    EXPECT_FAIL("tensor 'a': data [64, 96) lies outside the file's 64 data bytes");
    t[0] = (struct tinfo){"a", 1, {8}, GGML_F32, UINT64_MAX - 31};
    build(&file, 0, NULL, t, 1, 64);
    EXPECT_FAIL("tensor 'a': offset 18446744073709551584 + size 32 overflows");
    t[0] = (struct tinfo){"a", 1, {16}, GGML_F32, 0};
    t[1] = (struct tinfo){"b", 1, {8}, GGML_F32, 32};
    build(&file, 0, NULL, t, 2, 128);
    EXPECT_FAIL("tensor 'b' overlaps tensor 'a'");
    t[1] = (struct tinfo){"a", 1, {8}, GGML_F32, 64};
    build(&file, 0, NULL, t, 2, 128);
    EXPECT_FAIL("duplicate tensor 'a'");
    /* Known ggml types Strata does not compute with still parse (model_plan rejects them). */
    t[0] = (struct tinfo){"a", 1, {32}, 3 /* q4_1 */, 0};
    build(&file, 0, NULL, t, 1, 32);
    CHECKF(parse_copy(file.b, file.n, 0) == 0, "%s", err);
    /* The header-only parse does not need the data. */
    t[0] = (struct tinfo){"a", 1, {8}, GGML_F32, 1u << 30};
    build(&file, 0, NULL, t, 1, 0);
    CHECKF(parse_copy(file.b, file.n, 1) == 0, "%s", err);
    CHECK(parse_copy(file.b, file.n, 0) < 0);
}

/* ---------------------------------------------------------------------------------------------
 * model_plan on a tiny llama: dim 8, hidden 16, 2 layers, 2 heads, 1 kv head, vocab 10 */

struct mk {
    const char *arch;
    const char *skip_key;
    const char *zero_key; /* this key is written as 0 */
    const char *skip_tensor;
    const char *extra_tensor;
    const char *bad_shape; /* this tensor gets one extra row */
    const char *f16_tensor;
    uint32_t matrix_type;
    int tied;
    int heads;
    int mul;     /* scales every dimension (0 = 1): 4 makes rows multiples of 32 */
    int reverse; /* write the tensors in reverse execution order */
    /* the other architectures' parts */
    int bias;            /* blk.N.attn_{q,k,v}.bias (qwen2; optional in llama) */
    int bias_from;       /* ... only in layers >= bias_from */
    int qk_norm;         /* blk.N.attn_{q,k}_norm.weight (qwen3) */
    int key_length;      /* ARCH.attention.key_length: the head dimension (0: dim / heads) */
    int rope_freqs;      /* rope_freqs.weight, first in the file as llama.cpp writes it */
    const char *u32_key; /* one more key, ARCH.u32_key = u32_val */
    uint32_t u32_val;
    const char *str_key; /* and ARCH.str_key = str_val */
    const char *str_val;
    const char *f32_key; /* and ARCH.f32_key = f32_val */
    float f32_val;
};

static uint8_t *make_model(const struct mk *o, size_t *len)
{
    static float
        zeros[32768]; /* the largest tensor's bytes (mul 32: 512 x 256 in Q6_K or f32 norms) */
    for (int i = 0; i < 32768; i++) zeros[i] = (float)i;
    struct gguf_writer *w = gguf_writer_new();
    const char *arch = o->arch ? o->arch : "llama";
    const uint64_t M = o->mul ? (uint64_t)o->mul : 1;
    const uint64_t heads = o->heads ? (uint64_t)o->heads : 2;
    const uint64_t hd = o->key_length ? (uint64_t)o->key_length : 8 / heads, qd = heads * hd,
                   kvd = hd; /* one kv head */
    char key[96];
#define AK(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
#define KEY(k, v)                                                                                  \
    if (!o->skip_key || strcmp(o->skip_key, AK(k)))                                                \
    gguf_w_u32(w, AK(k), o->zero_key && !strcmp(o->zero_key, AK(k)) ? 0 : (v))
    gguf_w_str(w, "general.architecture", arch);
    KEY("embedding_length", 8 * M);
    KEY("feed_forward_length", 16 * M);
    KEY("block_count", 2);
    KEY("attention.head_count", (uint32_t)heads);
    KEY("attention.head_count_kv", 1);
    KEY("context_length", 32);
    if (o->key_length) KEY("attention.key_length", (uint32_t)hd);
    if (o->u32_key) gguf_w_u32(w, AK(o->u32_key), o->u32_val);
    if (o->str_key) gguf_w_str(w, AK(o->str_key), o->str_val);
    if (o->f32_key) gguf_w_f32(w, AK(o->f32_key), o->f32_val);
#undef KEY
#undef AK
    struct {
        char name[48];
        uint64_t cols, rows;
    } ts[48];
    int n = 0;
#define T(nm, c, r)                                                                                \
    (snprintf(ts[n].name, 48, "%s", nm), ts[n].cols = (c)*M, ts[n].rows = (r)*M, n++)
    if (o->rope_freqs) T("rope_freqs.weight", hd / 2, 0);
    T("token_embd.weight", 8, 10);
    for (int l = 0; l < 2; l++) {
        const char *k[14] = {"attn_norm.weight",   "attn_q.weight",      "attn_k.weight",
                             "attn_v.weight",      "attn_q.bias",        "attn_k.bias",
                             "attn_v.bias",        "attn_q_norm.weight", "attn_k_norm.weight",
                             "attn_output.weight", "ffn_norm.weight",    "ffn_gate.weight",
                             "ffn_down.weight",    "ffn_up.weight"};
        const uint64_t c[14] = {8, 8, 8, 8, qd, kvd, kvd, hd, hd, qd, 8, 8, 16, 8},
                       r[14] = {0, qd, kvd, kvd, 0, 0, 0, 0, 0, 8, 0, 16, 8, 16};
        for (int i = 0; i < 14; i++) {
            if (i >= 4 && i <= 6 && (!o->bias || l < o->bias_from)) continue;
            if ((i == 7 || i == 8) && !o->qk_norm) continue;
            char nm[48];
            snprintf(nm, sizeof nm, "blk.%d.%s", l, k[i]);
            T(nm, c[i], r[i]);
        }
    }
    T("output_norm.weight", 8, 0);
    if (!o->tied) T("output.weight", 8, 10);
    if (o->extra_tensor) T(o->extra_tensor, 8, 0);
#undef T
    for (int j = 0; j < n; j++) {
        int i = o->reverse ? n - 1 - j : j;
        if (o->skip_tensor && !strcmp(o->skip_tensor, ts[i].name)) continue;
        int bad = o->bad_shape && !strcmp(o->bad_shape, ts[i].name);
        uint64_t ne[2] = {ts[i].cols + (bad && !ts[i].rows), ts[i].rows + (bad && ts[i].rows)};
        uint32_t type = ts[i].rows ? o->matrix_type : GGML_F32;
        if (o->f16_tensor && !strcmp(o->f16_tensor, ts[i].name)) type = GGML_F16;
        gguf_w_tensor(w, ts[i].name, type, ne[1] ? 2 : 1, ne, zeros);
    }
    uint8_t *buf = write_mem(w, len);
    gguf_writer_free(w);
    return buf;
}

/* model_plan's message for a model built with o ("" when it succeeds). */
static const char *plan_msg(const struct mk *o)
{
    size_t len;
    uint8_t *buf = make_model(o, &len);
    if (!buf) return "write failed";
    struct gguf g;
    if (gguf_parse(&g, buf, len, err) < 0) {
        free(buf);
        return err;
    }
    struct model m;
    int rc = model_plan(&m, &g, "m.gguf", err);
    if (rc == 0) {
        model_free(&m);
        err[0] = 0;
    }
    gguf_free(&g);
    free(buf);
    return err;
}

TEST(model_plan_layout)
{
    struct mk o = {0};
    size_t len;
    uint8_t *buf = make_model(&o, &len);
    CHECK(buf);
    struct gguf g;
    CHECKF(gguf_parse(&g, buf, len, err) == 0, "%s", err);
    struct model m;
    CHECKF(model_plan(&m, &g, "m.gguf", err) == 0, "%s", err);
    const struct model_config *c = &m.cfg;
    CHECK_EQ_INT(c->dim, 8);
    CHECK_EQ_INT(c->hidden_dim, 16);
    CHECK_EQ_INT(c->n_layers, 2);
    CHECK_EQ_INT(c->n_heads, 2);
    CHECK_EQ_INT(c->n_kv_heads, 1);
    CHECK_EQ_INT(c->head_dim, 4);
    CHECK_EQ_INT(c->kv_dim, 4);
    CHECK_EQ_INT(c->vocab_size, 10); /* from token_embd: no tokenizer in this file */
    CHECK_EQ_INT(c->seq_len, 32);
    CHECK(c->norm_eps == 1e-5f && c->rope_theta == 10000.0f);
    CHECK_EQ_INT(m.n_spans, 4);
    CHECK_EQ_INT(m.n_slots, 1 + 18 + 2);
    CHECK(!m.tied_output);
    for (int s = 0; s < m.n_spans; s++) {
        CHECK_EQ_INT(m.spans[s].offset % 4096, 0);
        if (s) CHECK(m.spans[s].offset >= m.spans[s - 1].offset + m.spans[s - 1].size);
    }
    CHECK(m.image_size >= m.spans[3].offset + m.spans[3].size);
    /* The writer wrote the file in execution order: each span is one range of the file. */
    CHECK(m.file_in_order);
    CHECK_EQ_INT(m.file_spans[0].offset, g.data_offset);
    CHECK_EQ_INT(m.file_spans[0].size, 10 * 8 * 4);
    CHECK_EQ_INT(m.file_spans[3].offset + m.file_spans[3].size, len); /* 320 bytes: no padding */
    for (int s = 1; s < m.n_spans; s++)
        CHECK(m.file_spans[s].offset >= m.file_spans[s - 1].offset + m.file_spans[s - 1].size);
    uint64_t prev_end = 0;
    for (int i = 0; i < m.n_slots; i++) {
        const struct model_slot *sl = &m.slots[i];
        const struct span *sp = &m.spans[sl->span];
        CHECK(sl->image_offset >= prev_end && sl->image_offset % 64 == 0);
        CHECK(sl->image_offset >= sp->offset &&
              sl->image_offset + sl->src->nbytes <= sp->offset + sp->size);
        prev_end = sl->image_offset + sl->src->nbytes;
    }
    CHECK(gguf_str_eq(m.slots[0].src->name, "token_embd.weight") && m.slots[0].span == 0);
    CHECK(gguf_str_eq(m.slots[1].src->name, "blk.0.attn_norm.weight") && m.slots[1].span == 1);
    CHECK(gguf_str_eq(m.slots[9].src->name, "blk.0.ffn_up.weight"));
    CHECK(gguf_str_eq(m.slots[10].src->name, "blk.1.attn_norm.weight") && m.slots[10].span == 2);
    CHECK(gguf_str_eq(m.slots[20].src->name, "output.weight") && m.slots[20].span == 3);
    CHECK_EQ_INT(m.layers[1].wk.rows, 4);
    CHECK_EQ_INT(m.layers[1].wk.cols, 8);
    CHECK_EQ_INT(m.layers[1].w_down.cols, 16);
    CHECK_EQ_INT(m.layers[0].attn_norm.cols, 8);
    CHECK_EQ_INT(m.layers[0].attn_norm.nbytes, 32);
    CHECK_EQ_INT(m.output.rows, 10);
    uint8_t *image = aligned_alloc(4096, m.image_size);
    memset(image, 0xAA, m.image_size);
    CHECK(model_fill(&m, image, 4, err) < 0);
    for (int s = m.n_spans - 1; s >= 0; s--) CHECKF(model_fill(&m, image, s, err) == 0, "%s", err);
    model_bind(&m, image);
    CHECK(m.layers[1].w_down.data == image + m.slots[17].image_offset);
    CHECK(memcmp(m.layers[1].w_down.data,
                 gguf_tensor_data(&g, gguf_find_tensor(&g, "blk.1.ffn_down.weight")),
                 8 * 16 * 4) == 0);
    CHECK(memcmp(m.output.data, gguf_tensor_data(&g, gguf_find_tensor(&g, "output.weight")), 320) ==
          0);
    CHECK(m.output.data != m.token_embd.data);
    free(image);
    model_free(&m);
    gguf_free(&g);
    free(buf);
}

TEST(model_plan_tied_output)
{
    struct mk o = {.tied = 1};
    size_t len;
    uint8_t *buf = make_model(&o, &len);
    struct gguf g;
    CHECKF(gguf_parse(&g, buf, len, err) == 0, "%s", err);
    struct model m;
    CHECKF(model_plan(&m, &g, "m.gguf", err) == 0, "%s", err);
    CHECK(m.tied_output);
    CHECK_EQ_INT(m.n_slots, 20);
    uint8_t *image = calloc(1, m.image_size);
    for (int s = 0; s < m.n_spans; s++) CHECK(model_fill(&m, image, s, err) == 0);
    model_bind(&m, image);
    CHECK(m.output.data == m.token_embd.data);
    CHECK_EQ_INT(m.output.rows, 10);
    free(image);
    model_free(&m);
    gguf_free(&g);
    free(buf);
}

TEST(model_plan_file_out_of_order)
{
    /* Tensors are found by name: a file in any order gives the same execution-order image. */
    struct mk o = {.reverse = 1};
    size_t len;
    uint8_t *buf = make_model(&o, &len);
    struct gguf g;
    CHECKF(gguf_parse(&g, buf, len, err) == 0, "%s", err);
    CHECK(gguf_str_eq(g.tensors[0].name, "output.weight"));
    struct model m;
    CHECKF(model_plan(&m, &g, "m.gguf", err) == 0, "%s", err);
    CHECK(!m.file_in_order);
    CHECK(gguf_str_eq(m.slots[0].src->name, "token_embd.weight"));
    CHECK(gguf_str_eq(m.slots[20].src->name, "output.weight"));
    uint8_t *image = calloc(1, m.image_size);
    for (int s = 0; s < m.n_spans; s++) CHECK(model_fill(&m, image, s, err) == 0);
    model_bind(&m, image);
    const struct gguf_tensor *t = gguf_find_tensor(&g, "blk.0.attn_v.weight");
    CHECK(memcmp(m.layers[0].wv.data, gguf_tensor_data(&g, t), t->nbytes) == 0);
    CHECK(m.layers[0].wv.data < m.layers[1].wv.data);
    free(image);
    model_free(&m);
    gguf_free(&g);
    free(buf);
}

TEST(model_plan_quantized_types)
{
    const uint32_t ok[] = {GGML_F16,  GGML_BF16, GGML_Q8_0,   GGML_Q4_0,  GGML_Q4_1,
                           GGML_Q5_0, GGML_Q5_1, GGML_IQ4_NL, GGML_Q2_K,  GGML_Q3_K,
                           GGML_Q4_K, GGML_Q5_K, GGML_Q6_K,   GGML_IQ4_XS};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        /* rows a multiple of 256 for the super-block types */
        struct mk o = {.matrix_type = ok[i], .mul = ggml_block_elems(ok[i]) == 256 ? 32 : 4};
        CHECKF(!strcmp(plan_msg(&o), ""), "%s: %s", ggml_type_name(ok[i]), plan_msg(&o));
    }
}

TEST(model_plan_errors)
{
    struct mk o;
    o = (struct mk){.bad_shape = "blk.1.attn_q.weight"};
    CHECK_STR(plan_msg(&o), "m.gguf: tensor blk.1.attn_q.weight: shape 8x9 does not match dim 8");
    o = (struct mk){.bad_shape = "blk.0.attn_k.weight"};
    CHECK_STR(plan_msg(&o),
              "m.gguf: tensor blk.0.attn_k.weight: shape 8x5 does not match dim x kv_dim = 8x4");
    o = (struct mk){.bad_shape = "token_embd.weight"}; /* the vocabulary follows token_embd */
    CHECK_STR(plan_msg(&o),
              "m.gguf: tensor output.weight: shape 8x10 does not match dim x vocab = 8x11");
    o = (struct mk){.bad_shape = "output.weight"};
    CHECK_STR(plan_msg(&o),
              "m.gguf: tensor output.weight: shape 8x11 does not match dim x vocab = 8x10");
    o = (struct mk){.bad_shape = "blk.0.ffn_norm.weight"};
    CHECK_STR(plan_msg(&o), "m.gguf: tensor blk.0.ffn_norm.weight: shape 9 does not match dim 8");
    o = (struct mk){.skip_tensor = "blk.1.ffn_up.weight"};
    CHECK_STR(plan_msg(&o), "m.gguf: missing tensor blk.1.ffn_up.weight");
    o = (struct mk){.skip_tensor = "output_norm.weight"};
    CHECK_STR(plan_msg(&o), "m.gguf: missing tensor output_norm.weight");
    o = (struct mk){.skip_tensor = "token_embd.weight"};
    CHECK_STR(plan_msg(&o), "m.gguf: missing tensor token_embd.weight");
    o = (struct mk){.extra_tensor = "rope_freqs.weight"}; /* 2 floats for heads of 4 */
    CHECK_STR(plan_msg(&o),
              "m.gguf: tensor rope_freqs.weight: shape 8 does not match head_dim/2 2");
    o = (struct mk){.extra_tensor = "blk.0.attn_output.bias"};
    CHECK_STR(plan_msg(&o),
              "m.gguf: tensor blk.0.attn_output.bias is not part of the llama architecture");
    o = (struct mk){.extra_tensor = "blk.2.attn_norm.weight"};
    CHECK_STR(plan_msg(&o),
              "m.gguf: tensor blk.2.attn_norm.weight: layer 2 is beyond block_count 2");
    o = (struct mk){.extra_tensor = "blk.01.attn_norm.weight"};
    CHECK_STR(plan_msg(&o),
              "m.gguf: tensor blk.01.attn_norm.weight is not part of the llama architecture");
    o = (struct mk){.f16_tensor = "blk.0.attn_norm.weight"};
    CHECK_STR(plan_msg(&o),
              "m.gguf: tensor blk.0.attn_norm.weight: type f16, norm weights must be f32");
    o = (struct mk){.matrix_type = GGML_Q8_0}; /* rows of 8: the writer refuses */
    CHECK_STR(plan_msg(&o), "write failed");
    o = (struct mk){.arch = "gpt2"};
    CHECK_STR(plan_msg(&o), "m.gguf: general.architecture is \"gpt2\", which is not supported "
                            "(llama, qwen2, qwen3 are)");
    o = (struct mk){.skip_key = "llama.block_count"};
    CHECK_STR(plan_msg(&o), "m.gguf: missing key llama.block_count");
    o = (struct mk){.skip_key = "llama.attention.head_count_kv"}; /* defaults to head_count */
    CHECK_STR(plan_msg(&o),
              "m.gguf: tensor blk.0.attn_k.weight: shape 8x4 does not match dim x kv_dim = 8x8");
    o = (struct mk){.zero_key = "llama.block_count"};
    CHECK_STR(plan_msg(&o), "m.gguf: llama.block_count = 0 is out of range (1..256)");
    o = (struct mk){.zero_key = "llama.attention.head_count_kv"};
    CHECK_STR(plan_msg(&o), "m.gguf: llama.attention.head_count_kv = 0 is out of range (1..4096)");
    o = (struct mk){.heads = 3};
    CHECK_STR(plan_msg(&o), "m.gguf: embedding_length 8 is not a multiple of head_count 3");
    o = (struct mk){.heads = 8};
    CHECK_STR(plan_msg(&o), "m.gguf: head dimension 1 is odd (RoPE rotates pairs)");
}

/* A planned model from o (CHECKed), for the layout tests below; free with plan_done. */
struct planned {
    uint8_t *buf;
    struct gguf g;
    struct model m;
    uint8_t *image;
};

static int plan_ok(struct planned *p, const struct mk *o)
{
    size_t len;
    memset(p, 0, sizeof *p);
    p->buf = make_model(o, &len);
    if (!p->buf || gguf_parse(&p->g, p->buf, len, err) < 0 ||
        model_plan(&p->m, &p->g, "m.gguf", err) < 0)
        return -1;
    p->image = aligned_alloc(4096, p->m.image_size);
    for (int s = 0; s < p->m.n_spans; s++)
        if (model_fill(&p->m, p->image, s, err) < 0) return -1;
    model_bind(&p->m, p->image);
    return 0;
}

static void plan_done(struct planned *p)
{
    free(p->image);
    model_free(&p->m);
    gguf_free(&p->g);
    free(p->buf);
}

/* The name of slot i. */
static const char *slot_name(const struct model *m, int i)
{
    static char name[80];
    return gguf_str_printable(m->slots[i].src->name, name, sizeof name);
}

/* Each architecture's config and where its tensors go: every one a layer needs in its span. */
TEST(model_plan_architectures)
{
    struct planned p;
    /* qwen2: q/k/v biases after the projections, NeoX RoPE, qwen2.* keys */
    struct mk o = {.arch = "qwen2", .bias = 1, .tied = 1};
    CHECKF(plan_ok(&p, &o) == 0, "%s", err);
    const struct model_config *c = &p.m.cfg;
    CHECK(c->arch == ARCH_QWEN2 && c->rope_style == ROPE_HALVES && c->qkv_bias && !c->qk_norm &&
          !c->rope_freqs);
    CHECK_EQ_INT(p.m.n_slots, 1 + 2 * 12 + 1);
    const char *want2[12] = {
        "blk.0.attn_norm.weight", "blk.0.attn_q.weight",      "blk.0.attn_k.weight",
        "blk.0.attn_v.weight",    "blk.0.attn_q.bias",        "blk.0.attn_k.bias",
        "blk.0.attn_v.bias",      "blk.0.attn_output.weight", "blk.0.ffn_norm.weight",
        "blk.0.ffn_gate.weight",  "blk.0.ffn_down.weight",    "blk.0.ffn_up.weight"};
    for (int i = 0; i < 12; i++) {
        CHECK_STR(slot_name(&p.m, 1 + i), want2[i]);
        CHECK_EQ_INT(p.m.slots[1 + i].span, 1);
    }
    CHECK_EQ_INT(p.m.layers[1].bk.cols, 4);
    CHECK(!memcmp(p.m.layers[1].bq.data,
                  gguf_tensor_data(&p.g, gguf_find_tensor(&p.g, "blk.1.attn_q.bias")), 8 * 4));
    CHECK_STR(model_arch_name(c->arch), "qwen2");
    plan_done(&p);

    /* qwen3: q/k norms of head_dim, a head dimension from key_length: q is 2 x 8 = 16 wide on a
     * dim of 8, wo takes 16 columns */
    o = (struct mk){.arch = "qwen3", .qk_norm = 1, .key_length = 8};
    CHECKF(plan_ok(&p, &o) == 0, "%s", err);
    c = &p.m.cfg;
    CHECK(c->arch == ARCH_QWEN3 && c->rope_style == ROPE_HALVES && !c->qkv_bias && c->qk_norm);
    CHECK_EQ_INT(c->head_dim, 8);
    CHECK_EQ_INT(c->q_dim, 16);
    CHECK_EQ_INT(c->kv_dim, 8);
    CHECK_EQ_INT(p.m.layers[0].wq.rows, 16);
    CHECK_EQ_INT(p.m.layers[0].wo.cols, 16);
    CHECK_EQ_INT(p.m.layers[0].q_norm.cols, 8);
    CHECK_STR(slot_name(&p.m, 5), "blk.0.attn_q_norm.weight");
    CHECK_STR(slot_name(&p.m, 6), "blk.0.attn_k_norm.weight");
    CHECK_STR(slot_name(&p.m, 7), "blk.0.attn_output.weight");
    plan_done(&p);

    /* llama with Llama 3.1's rope_freqs: the file's one tensor (written first) is copied into
     * every layer's span, so layers [0, k) need nothing else; optional biases too */
    o = (struct mk){.rope_freqs = 1, .bias = 1};
    CHECKF(plan_ok(&p, &o) == 0, "%s", err);
    c = &p.m.cfg;
    CHECK(c->arch == ARCH_LLAMA && c->rope_style == ROPE_PAIRS && c->rope_freqs && c->qkv_bias);
    CHECK(c->rope_scale == 1.0f);
    const struct gguf_tensor *rf = gguf_find_tensor(&p.g, "rope_freqs.weight");
    for (int l = 0; l < 2; l++) {
        const struct tensor *t = &p.m.layers[l].rope_freqs;
        CHECK_EQ_INT(t->cols, 2);
        CHECK(t->type == GGML_F32);
        const uint8_t *d = t->data;
        CHECK(d >= p.image + p.m.spans[1 + l].offset &&
              d + 8 <= p.image + p.m.spans[1 + l].offset + p.m.spans[1 + l].size);
        CHECK(!memcmp(d, gguf_tensor_data(&p.g, rf), 8));
    }
    CHECK_STR(slot_name(&p.m, 7), "blk.0.attn_v.bias");
    CHECK_STR(slot_name(&p.m, 8), "rope_freqs.weight");
    CHECK_STR(slot_name(&p.m, 9), "blk.0.attn_output.weight");
    CHECK_STR(slot_name(&p.m, 21), "rope_freqs.weight");
    CHECK_EQ_INT(p.m.slots[21].span, 2);
    CHECK(!p.m.file_in_order); /* a layer's span also reads the front of the file */
    plan_done(&p);

    /* linear rope scaling: every angle divided by the factor */
    o = (struct mk){.str_key = "rope.scaling.type", .str_val = "linear"};
    o.f32_key = "rope.scaling.factor", o.f32_val = 4.0f;
    CHECKF(plan_ok(&p, &o) == 0, "%s", err);
    CHECK(p.m.cfg.rope_scale == 0.25f);
    plan_done(&p);
    o.str_val = "none"; /* llama.cpp: never scale */
    CHECKF(plan_ok(&p, &o) == 0, "%s", err);
    CHECK(p.m.cfg.rope_scale == 1.0f);
    plan_done(&p);
}

TEST(model_plan_architecture_errors)
{
    struct mk o;
    o = (struct mk){.arch = "qwen2", .bias = 1, .bad_shape = "blk.1.attn_k.bias"};
    CHECK_STR(plan_msg(&o), "m.gguf: tensor blk.1.attn_k.bias: shape 5 does not match kv_dim 4");
    o = (struct mk){.arch = "qwen2"};
    CHECK_STR(plan_msg(&o), "m.gguf: missing tensor blk.0.attn_q.bias");
    o = (struct mk){.arch = "qwen2", .bias = 1, .f16_tensor = "blk.0.attn_v.bias"};
    CHECK_STR(plan_msg(&o), "m.gguf: tensor blk.0.attn_v.bias: type f16, biases must be f32");
    o = (struct mk){.arch = "qwen2", .bias = 1, .rope_freqs = 1};
    CHECK_STR(plan_msg(&o), "m.gguf: tensor rope_freqs.weight is not part of the qwen2 "
                            "architecture");
    o = (struct mk){.arch = "qwen3", .qk_norm = 1, .skip_tensor = "blk.1.attn_q_norm.weight"};
    CHECK_STR(plan_msg(&o), "m.gguf: missing tensor blk.1.attn_q_norm.weight");
    o = (struct mk){.arch = "qwen3", .qk_norm = 1, .bad_shape = "blk.0.attn_k_norm.weight"};
    CHECK_STR(plan_msg(&o),
              "m.gguf: tensor blk.0.attn_k_norm.weight: shape 5 does not match head_dim 4");
    o = (struct mk){.arch = "qwen3", .qk_norm = 1, .bias = 1};
    CHECK_STR(plan_msg(&o), "m.gguf: tensor blk.0.attn_q.bias is not part of the qwen3 "
                            "architecture");
    o = (struct mk){
        .arch = "qwen3", .qk_norm = 1, .key_length = 8, .bad_shape = "blk.0.attn_output.weight"};
    CHECK_STR(plan_msg(&o), "m.gguf: tensor blk.0.attn_output.weight: shape 16x9 does not "
                            "match n_heads*head_dim x dim = 16x8");
    o = (struct mk){.bias = 1, .bias_from = 1}; /* llama: biases in every layer or none */
    CHECK_STR(plan_msg(&o), "m.gguf: tensor blk.1.attn_q.bias: blk.0 has no q/k/v biases");
    o = (struct mk){.bias = 1, .skip_tensor = "blk.1.attn_v.bias"};
    CHECK_STR(plan_msg(&o), "m.gguf: missing tensor blk.1.attn_v.bias");
    o = (struct mk){.u32_key = "expert_count", .u32_val = 8}; /* Mixtral is a llama file */
    CHECK_STR(plan_msg(&o), "m.gguf: llama.expert_count = 8: mixture-of-experts models are not "
                            "supported");
    o = (struct mk){.str_key = "rope.scaling.type", .str_val = "yarn"};
    CHECK_STR(plan_msg(&o), "m.gguf: llama.rope.scaling.type is \"yarn\", which is not supported "
                            "(none, linear are)");
    o = (struct mk){.key_length = 8, .u32_key = "attention.value_length", .u32_val = 4};
    CHECK_STR(plan_msg(&o), "m.gguf: llama.attention.value_length 4 differs from "
                            "llama.attention.key_length 8 (not supported)");
    o = (struct mk){.u32_key = "rope.dimension_count", .u32_val = 2};
    CHECK_STR(plan_msg(&o), "m.gguf: llama.rope.dimension_count 2 differs from the head "
                            "dimension 4 (partial RoPE is not supported)");
    o = (struct mk){.arch = "qwen3", .qk_norm = 1, .skip_key = "qwen3.block_count"};
    CHECK_STR(plan_msg(&o), "m.gguf: missing key qwen3.block_count");
    o = (struct mk){.arch = "mamba"};
    CHECK_STR(plan_msg(&o), "m.gguf: general.architecture is \"mamba\", which is not supported "
                            "(llama, qwen2, qwen3 are)");
}

TEST(model_plan_unsupported_type)
{
    /* q8_1 (an activation format) parses (the reader knows its size) and the model refuses it,
     * listing what it takes. */
    struct mk o = {.matrix_type = 9, .mul = 4};
    CHECK_STR(plan_msg(&o), "m.gguf: tensor token_embd.weight: type q8_1 (9) is not supported "
                            "(f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, "
                            "q4_k, q5_k, q6_k, iq4_xs)");
}

int main(void)
{
    RUN(roundtrip_every_kv_type);
    RUN(roundtrip_every_tensor_type);
    RUN(printable_names);
    RUN(type_table);
    RUN(valid_small_file);
    RUN(truncated_at_every_byte);
    RUN(bad_magic_and_version);
    RUN(huge_counts);
    RUN(string_length_past_end);
    RUN(bad_value_types);
    RUN(alignment_key);
    RUN(tensor_info_errors);
    RUN(model_plan_layout);
    RUN(model_plan_tied_output);
    RUN(model_plan_file_out_of_order);
    RUN(model_plan_quantized_types);
    RUN(model_plan_errors);
    RUN(model_plan_architectures);
    RUN(model_plan_architecture_errors);
    RUN(model_plan_unsupported_type);
    CHECK_DONE();
}
