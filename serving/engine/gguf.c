/* gguf: GGUF v3 reader and writer. See gguf.h for the contract.
 *
 * The reader treats the file as hostile: every length is compared with the bytes left before it
 * is used, all size arithmetic is done in uint64_t with explicit overflow checks, and nothing is
 * dereferenced outside [base, base+size). Messages name the key or tensor (made printable) and the
 * byte offset, so a caller only prefixes the file name. */
#include "serving/engine/gguf.h"

#include "os/common/errmsg.h"

#include <stdlib.h>
#include <string.h>

#define GGUF_MAGIC             0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS          4

/* ---------------------------------------------------------------------------------------------
 * ggml types: block size and bytes per block. Types Strata computes with, plus the other ggml
 * types whose layout is fixed, so files holding them parse and are rejected later with a name. */

static const struct ggml_type_info {
    const char *name;
    int block;      /* elements per block; 0 = unknown type */
    int type_bytes; /* bytes per block */
} type_info[] = {
    [GGML_F32] = {"f32", 1, 4},
    [GGML_F16] = {"f16", 1, 2},
    [GGML_Q4_0] = {"q4_0", 32, 18},
    [GGML_Q4_1] = {"q4_1", 32, 20},
    [GGML_Q5_0] = {"q5_0", 32, 22},
    [GGML_Q5_1] = {"q5_1", 32, 24},
    [GGML_Q8_0] = {"q8_0", 32, 34},
    [9] = {"q8_1", 32, 36},
    [GGML_Q2_K] = {"q2_k", 256, 84},
    [GGML_Q3_K] = {"q3_k", 256, 110},
    [GGML_Q4_K] = {"q4_k", 256, 144},
    [GGML_Q5_K] = {"q5_k", 256, 176},
    [GGML_Q6_K] = {"q6_k", 256, 210},
    [15] = {"q8_k", 256, 292},
    [GGML_IQ4_NL] = {"iq4_nl", 32, 18},
    [GGML_IQ4_XS] = {"iq4_xs", 256, 136},
    [24] = {"i8", 1, 1},
    [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},
    [27] = {"i64", 1, 8},
    [28] = {"f64", 1, 8},
    [GGML_BF16] = {"bf16", 1, 2},
};
#define N_TYPE_INFO (sizeof type_info / sizeof type_info[0])

static const struct ggml_type_info *type_get(uint32_t type)
{
    if (type >= N_TYPE_INFO || type_info[type].block == 0) return NULL;
    return &type_info[type];
}

int ggml_block_elems(uint32_t type)
{
    const struct ggml_type_info *ti = type_get(type);
    return ti ? ti->block : 0;
}

const char *ggml_type_name(uint32_t type)
{
    const struct ggml_type_info *ti = type_get(type);
    return ti ? ti->name : "unknown";
}

uint64_t ggml_row_bytes(uint32_t type, uint64_t n)
{
    const struct ggml_type_info *ti = type_get(type);
    if (!ti || n % (uint64_t)ti->block) return 0;
    uint64_t blocks = n / (uint64_t)ti->block;
    if (blocks > UINT64_MAX / (uint64_t)ti->type_bytes) return 0;
    return blocks * (uint64_t)ti->type_bytes;
}

/* Bytes of one scalar metadata value; 0 for string, array and unknown types. */
static uint64_t vtype_size(uint32_t t)
{
    switch (t) {
    case GGUF_UINT8:
    case GGUF_INT8:
    case GGUF_BOOL:
        return 1;
    case GGUF_UINT16:
    case GGUF_INT16:
        return 2;
    case GGUF_UINT32:
    case GGUF_INT32:
    case GGUF_FLOAT32:
        return 4;
    case GGUF_UINT64:
    case GGUF_INT64:
    case GGUF_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

const char *gguf_vtype_name(uint32_t t)
{
    static const char *const names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                        "bool", "string", "array", "u64", "i64", "f64"};
    return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

/* ---------------------------------------------------------------------------------------------
 * Reader */

struct rd {
    const uint8_t *base;
    uint64_t size, off;
    char *err;
};

/* A name from the file, cut to 64 bytes and with non-printable bytes replaced, for messages. */
struct pname {
    char s[80];
};
char *gguf_str_printable(struct gguf_str s, char *out, size_t cap)
{
    if (cap == 0) return out;
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    int cut = n < s.len && cap > 4;
    if (cut) n = cap - 4;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.p[i];
        out[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    strcpy(out + n, cut ? "..." : "");
    return out;
}

static struct pname printable(struct gguf_str str)
{
    struct pname n;
    gguf_str_printable(str, n.s, 68); /* 64 bytes and "..." */
    return n;
}

static uint64_t rd_left(const struct rd *r)
{
    return r->size - r->off;
}

static int rd_bytes(struct rd *r, void *out, uint64_t n, const char *what)
{
    if (n > rd_left(r))
        return errmsg_set(r->err,
                          "truncated at byte %llu reading %s (%llu bytes needed, %llu left)",
                          (unsigned long long)r->off, what, (unsigned long long)n,
                          (unsigned long long)rd_left(r));
    memcpy(out, r->base + r->off, n);
    r->off += n;
    return 0;
}

static int rd_u32(struct rd *r, uint32_t *v, const char *what)
{
    return rd_bytes(r, v, 4, what);
}

static int rd_u64(struct rd *r, uint64_t *v, const char *what)
{
    return rd_bytes(r, v, 8, what);
}

static int rd_str(struct rd *r, struct gguf_str *s, const char *what)
{
    uint64_t start = r->off;
    if (rd_u64(r, &s->len, what) < 0) return -1;
    if (s->len > rd_left(r))
        return errmsg_set(r->err, "%s at byte %llu: length %llu exceeds the %llu bytes left", what,
                          (unsigned long long)start, (unsigned long long)s->len,
                          (unsigned long long)rd_left(r));
    s->p = (const char *)r->base + r->off;
    r->off += s->len;
    return 0;
}

static int parse_kv(struct rd *r, struct gguf_kv *kv)
{
    if (rd_str(r, &kv->key, "metadata key") < 0) return -1;
    struct pname kn = printable(kv->key);
    const char *k = kn.s;
    if (rd_u32(r, &kv->type, "value type") < 0) return errmsg_prefix(r->err, "key '%s': ", k);
    uint64_t sz = vtype_size(kv->type);
    if (sz) {
        uint8_t raw[8] = {0};
        if (rd_bytes(r, raw, sz, "value") < 0) return errmsg_prefix(r->err, "key '%s': ", k);
        switch (kv->type) {
        case GGUF_UINT8:
        case GGUF_BOOL:
            kv->v.u = raw[0];
            break;
        case GGUF_INT8:
            kv->v.i = (int8_t)raw[0];
            break;
        case GGUF_UINT16: {
            uint16_t x;
            memcpy(&x, raw, 2);
            kv->v.u = x;
            break;
        }
        case GGUF_INT16: {
            int16_t x;
            memcpy(&x, raw, 2);
            kv->v.i = x;
            break;
        }
        case GGUF_UINT32: {
            uint32_t x;
            memcpy(&x, raw, 4);
            kv->v.u = x;
            break;
        }
        case GGUF_INT32: {
            int32_t x;
            memcpy(&x, raw, 4);
            kv->v.i = x;
            break;
        }
        case GGUF_FLOAT32: {
            float x;
            memcpy(&x, raw, 4);
            kv->v.f = x;
            break;
        }
        case GGUF_UINT64:
            memcpy(&kv->v.u, raw, 8);
            break;
        case GGUF_INT64:
            memcpy(&kv->v.i, raw, 8);
            break;
        case GGUF_FLOAT64:
            memcpy(&kv->v.f, raw, 8);
            break;
        }
        return 0;
    }
    if (kv->type == GGUF_STRING) {
        if (rd_str(r, &kv->v.s, "string value") < 0) return errmsg_prefix(r->err, "key '%s': ", k);
        return 0;
    }
    if (kv->type != GGUF_ARRAY)
        return errmsg_set(r->err, "key '%s': unknown value type %u at byte %llu", k, kv->type,
                          (unsigned long long)(r->off - 4));
    uint64_t at = r->off;
    if (rd_u32(r, &kv->v.arr.type, "array type") < 0 || rd_u64(r, &kv->v.arr.n, "array length") < 0)
        return errmsg_prefix(r->err, "key '%s': ", k);
    kv->v.arr.data = r->base + r->off;
    uint64_t esz = vtype_size(kv->v.arr.type), n = kv->v.arr.n;
    if (esz) {
        if (n > rd_left(r) / esz)
            return errmsg_set(r->err,
                              "key '%s': array of %llu %s at byte %llu exceeds the %llu bytes left",
                              k, (unsigned long long)n, gguf_vtype_name(kv->v.arr.type),
                              (unsigned long long)at, (unsigned long long)rd_left(r));
        r->off += n * esz;
        return 0;
    }
    if (kv->v.arr.type != GGUF_STRING)
        return errmsg_set(r->err, "key '%s': array element type %u (%s) is not supported", k,
                          kv->v.arr.type, gguf_vtype_name(kv->v.arr.type));
    /* Each string takes at least its 8-byte length: reject absurd counts before walking. */
    if (n > rd_left(r) / 8)
        return errmsg_set(
            r->err, "key '%s': array of %llu strings at byte %llu exceeds the %llu bytes left", k,
            (unsigned long long)n, (unsigned long long)at, (unsigned long long)rd_left(r));
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_str s;
        if (rd_str(r, &s, "array string") < 0)
            return errmsg_prefix(r->err, "key '%s': element %llu: ", k, (unsigned long long)i);
    }
    return 0;
}

static int parse_tensor_info(struct rd *r, struct gguf_tensor *t, uint64_t index)
{
    if (rd_str(r, &t->name, "tensor name") < 0)
        return errmsg_prefix(r->err, "tensor %llu: ", (unsigned long long)index);
    struct pname tn = printable(t->name);
    if (rd_u32(r, &t->n_dims, "n_dims") < 0) return errmsg_prefix(r->err, "tensor '%s': ", tn.s);
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return errmsg_set(r->err, "tensor '%s': n_dims %u is not in 1..%d", tn.s, t->n_dims,
                          GGUF_MAX_DIMS);
    uint64_t elems = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (rd_u64(r, &t->ne[d], "dimension") < 0)
            return errmsg_prefix(r->err, "tensor '%s': ", tn.s);
        /* ggml stores dims as int64: anything above INT64_MAX is negative there. */
        if (t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX)
            return errmsg_set(r->err, "tensor '%s': dimension %u is %lld", tn.s, d,
                              (long long)t->ne[d]);
        if (elems > (uint64_t)INT64_MAX / t->ne[d])
            return errmsg_set(r->err, "tensor '%s': element count overflows", tn.s);
        elems *= t->ne[d];
    }
    if (rd_u32(r, &t->type, "tensor type") < 0 || rd_u64(r, &t->offset, "tensor offset") < 0)
        return errmsg_prefix(r->err, "tensor '%s': ", tn.s);
    const struct ggml_type_info *ti = type_get(t->type);
    if (!ti) return errmsg_set(r->err, "tensor '%s': unknown type %u", tn.s, t->type);
    if (t->ne[0] % (uint64_t)ti->block)
        return errmsg_set(r->err,
                          "tensor '%s': row length %llu is not a multiple of %s's block of %d",
                          tn.s, (unsigned long long)t->ne[0], ti->name, ti->block);
    uint64_t rows = elems / t->ne[0], row = ggml_row_bytes(t->type, t->ne[0]);
    if (row == 0 || rows > UINT64_MAX / row)
        return errmsg_set(r->err, "tensor '%s': byte size overflows", tn.s);
    t->nbytes = row * rows;
    return 0;
}

/* Sort helpers for duplicate and overlap checks. */
static int cmp_str(const struct gguf_str *a, const struct gguf_str *b)
{
    uint64_t n = a->len < b->len ? a->len : b->len;
    int c = n ? memcmp(a->p, b->p, n) : 0;
    if (c) return c;
    return a->len < b->len ? -1 : a->len > b->len;
}
static int cmp_key_ptr(const void *a, const void *b)
{
    return cmp_str(*(const struct gguf_str *const *)a, *(const struct gguf_str *const *)b);
}
static int cmp_tensor_offset(const void *a, const void *b)
{
    const struct gguf_tensor *x = *(const struct gguf_tensor *const *)a;
    const struct gguf_tensor *y = *(const struct gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Duplicate keys or tensor names make lookups ambiguous: llama.cpp rejects them too. */
static int check_unique(struct gguf_str **names, uint64_t n, const char *what, char *err)
{
    if (n < 2) return 0;
    qsort(names, n, sizeof *names, cmp_key_ptr);
    for (uint64_t i = 1; i < n; i++)
        if (cmp_str(names[i - 1], names[i]) == 0)
            return errmsg_set(err, "duplicate %s '%s'", what, printable(*names[i]).s);
    return 0;
}

/* The fixed header: magic, version, and the two counts, each count checked against the bytes left
 * so a hostile count cannot make the caller allocate gigabytes. */
static int parse_header(struct rd *r, struct gguf *g)
{
    char *err = r->err;
    uint32_t magic = 0;
    if (rd_u32(r, &magic, "magic") < 0) return -1;
    if (magic != GGUF_MAGIC) return errmsg_set(err, "not a GGUF file (bad magic)");
    if (rd_u32(r, &g->version, "version") < 0) return -1;
    if (g->version != 3 && g->version != 2) {
        if (g->version == 1)
            return errmsg_set(err, "GGUF version 1 is not supported (need 2 or 3)");
        if ((g->version & 0xffff) == 0 && g->version)
            return errmsg_set(err, "GGUF version %u is not supported (big-endian file?)",
                              g->version);
        return errmsg_set(err, "GGUF version %u is not supported (need 2 or 3)", g->version);
    }
    if (rd_u64(r, &g->n_tensors, "tensor count") < 0 || rd_u64(r, &g->n_kv, "metadata count") < 0)
        return -1;
    /* The smallest key-value is 13 bytes (8 key length, 4 type, 1 value), the smallest tensor info
     * 32 (8 name length, 4 n_dims, 8 dim, 4 type, 8 offset). */
    if (g->n_kv > rd_left(r) / 13)
        return errmsg_set(err, "metadata count %llu cannot fit in the %llu bytes left",
                          (unsigned long long)g->n_kv, (unsigned long long)rd_left(r));
    if (g->n_tensors > rd_left(r) / 32)
        return errmsg_set(err, "tensor count %llu cannot fit in the %llu bytes left",
                          (unsigned long long)g->n_tensors, (unsigned long long)rd_left(r));
    return 0;
}

/* general.alignment, when present, must be a u32 power of two; absent, it is 32. */
static int read_alignment(struct gguf *g, char *err)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const struct gguf_kv *al = gguf_find(g, "general.alignment");
    if (!al) return 0;
    if (al->type != GGUF_UINT32)
        return errmsg_set(err, "general.alignment has type %s, expected u32",
                          gguf_vtype_name(al->type));
    if (al->v.u == 0 || (al->v.u & (al->v.u - 1)))
        return errmsg_set(err, "general.alignment %llu is not a power of two",
                          (unsigned long long)al->v.u);
    g->alignment = al->v.u;
    return 0;
}

/* Place the data section after the header (at off) and check each tensor's range: aligned, no
 * overflow, and (unless header_only) inside the file. Fills order[] with the tensors. */
static int place_tensors(struct gguf *g, uint64_t off, size_t size, int header_only,
                         struct gguf_tensor **order, char *err)
{
    /* The data section starts at the next multiple of the alignment. */
    uint64_t pad = (g->alignment - off % g->alignment) % g->alignment;
    g->data_offset = off + pad; /* off <= size, pad < alignment <= 2^32: no overflow */
    if (!header_only && g->n_tensors && g->data_offset > size)
        return errmsg_set(err, "truncated: data section at byte %llu is past the end (%zu bytes)",
                          (unsigned long long)g->data_offset, size);
    uint64_t data_size = !header_only && g->data_offset <= size ? size - g->data_offset : 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment)
            return errmsg_set(err,
                              "tensor '%s': offset %llu is not a multiple of the alignment %llu",
                              printable(t->name).s, (unsigned long long)t->offset,
                              (unsigned long long)g->alignment);
        if (t->offset > UINT64_MAX - t->nbytes ||
            (uint64_t)t->offset + t->nbytes > UINT64_MAX - g->data_offset)
            return errmsg_set(err, "tensor '%s': offset %llu + size %llu overflows",
                              printable(t->name).s, (unsigned long long)t->offset,
                              (unsigned long long)t->nbytes);
        if (!header_only && (t->offset > data_size || t->nbytes > data_size - t->offset))
            return errmsg_set(
                err, "tensor '%s': data [%llu, %llu) lies outside the file's %llu data bytes",
                printable(t->name).s, (unsigned long long)t->offset,
                (unsigned long long)(t->offset + t->nbytes), (unsigned long long)data_size);
        order[i] = t;
    }
    return 0;
}

/* Two tensors may not share bytes: sorted by offset, each must end before the next begins. */
static int check_no_overlap(struct gguf_tensor **order, uint64_t n, char *err)
{
    if (n < 2) return 0;
    qsort(order, n, sizeof *order, cmp_tensor_offset);
    for (uint64_t i = 1; i < n; i++)
        if (order[i - 1]->offset + order[i - 1]->nbytes > order[i]->offset)
            return errmsg_set(err, "tensor '%s' overlaps tensor '%s'", printable(order[i]->name).s,
                              printable(order[i - 1]->name).s);
    return 0;
}

static int parse(struct gguf *g, const void *buf, size_t size, int header_only, char *err)
{
    memset(g, 0, sizeof *g);
    g->base = buf;
    g->size = size;
    struct rd r = {buf, size, 0, err};
    if (parse_header(&r, g) < 0) return -1;
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    uint64_t n_names = g->n_kv > g->n_tensors ? g->n_kv : g->n_tensors;
    struct gguf_str **names = calloc(n_names ? n_names : 1, sizeof *names);
    struct gguf_tensor **order = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *order);
    if (!g->kv || !g->tensors || !names || !order) {
        errmsg_set(err, "out of memory for %llu keys and %llu tensors", (unsigned long long)g->n_kv,
                   (unsigned long long)g->n_tensors);
        goto fail;
    }
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (parse_kv(&r, &g->kv[i]) < 0) goto fail;
    for (uint64_t i = 0; i < g->n_kv; i++) names[i] = &g->kv[i].key;
    if (check_unique(names, g->n_kv, "key", err) < 0) goto fail;
    if (read_alignment(g, err) < 0) goto fail;

    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (parse_tensor_info(&r, &g->tensors[i], i) < 0) goto fail;
    for (uint64_t i = 0; i < g->n_tensors; i++) names[i] = &g->tensors[i].name;
    if (check_unique(names, g->n_tensors, "tensor", err) < 0) goto fail;

    if (place_tensors(g, r.off, size, header_only, order, err) < 0) goto fail;
    if (check_no_overlap(order, g->n_tensors, err) < 0) goto fail;
    free(names);
    free(order);
    return 0;
fail:
    free(names);
    free(order);
    gguf_free(g);
    return -1;
}

int gguf_parse(struct gguf *g, const void *buf, size_t size, char *err)
{
    return parse(g, buf, size, 0, err);
}

int gguf_parse_header(struct gguf *g, const void *buf, size_t size, char *err)
{
    return parse(g, buf, size, 1, err);
}

void gguf_free(struct gguf *g)
{
    free(g->kv);
    free(g->tensors);
    g->kv = NULL;
    g->tensors = NULL;
    g->n_kv = g->n_tensors = 0;
}

int gguf_str_eq(struct gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && memcmp(s.p, c, n) == 0;
}

const struct gguf_kv *gguf_find(const struct gguf *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (gguf_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (gguf_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out, char *err)
{
    const struct gguf_kv *kv = gguf_find(g, key);
    if (!kv) return errmsg_set(err, "missing key %s", key);
    switch (kv->type) {
    case GGUF_UINT8:
    case GGUF_UINT16:
    case GGUF_UINT32:
    case GGUF_UINT64:
        if (kv->v.u > UINT32_MAX)
            return errmsg_set(err, "key %s: value %llu is out of range", key,
                              (unsigned long long)kv->v.u);
        *out = (uint32_t)kv->v.u;
        return 0;
    case GGUF_INT8:
    case GGUF_INT16:
    case GGUF_INT32:
    case GGUF_INT64:
        if (kv->v.i < 0 || kv->v.i > (int64_t)UINT32_MAX)
            return errmsg_set(err, "key %s: value %lld is out of range", key, (long long)kv->v.i);
        *out = (uint32_t)kv->v.i;
        return 0;
    default:
        return errmsg_set(err, "key %s has type %s, expected an integer", key,
                          gguf_vtype_name(kv->type));
    }
}

int gguf_get_f32(const struct gguf *g, const char *key, float *out, char *err)
{
    const struct gguf_kv *kv = gguf_find(g, key);
    if (!kv) return errmsg_set(err, "missing key %s", key);
    if (kv->type != GGUF_FLOAT32 && kv->type != GGUF_FLOAT64)
        return errmsg_set(err, "key %s has type %s, expected a float", key,
                          gguf_vtype_name(kv->type));
    *out = (float)kv->v.f;
    return 0;
}

int gguf_get_str(const struct gguf *g, const char *key, struct gguf_str *out, char *err)
{
    const struct gguf_kv *kv = gguf_find(g, key);
    if (!kv) return errmsg_set(err, "missing key %s", key);
    if (kv->type != GGUF_STRING)
        return errmsg_set(err, "key %s has type %s, expected a string", key,
                          gguf_vtype_name(kv->type));
    *out = kv->v.s;
    return 0;
}

int gguf_get_arr(const struct gguf *g, const char *key, uint32_t elem_type,
                 const struct gguf_kv **out, char *err)
{
    const struct gguf_kv *kv = gguf_find(g, key);
    if (!kv) return errmsg_set(err, "missing key %s", key);
    if (kv->type != GGUF_ARRAY || kv->v.arr.type != elem_type)
        return errmsg_set(err, "key %s has type %s%s%s, expected an array of %s", key,
                          gguf_vtype_name(kv->type), kv->type == GGUF_ARRAY ? " of " : "",
                          kv->type == GGUF_ARRAY ? gguf_vtype_name(kv->v.arr.type) : "",
                          gguf_vtype_name(elem_type));
    *out = kv;
    return 0;
}

const uint8_t *gguf_next_str(const uint8_t *p, struct gguf_str *s)
{
    memcpy(&s->len, p, 8);
    s->p = (const char *)p + 8;
    return p + 8 + s->len;
}

const void *gguf_tensor_data(const struct gguf *g, const struct gguf_tensor *t)
{
    return g->base + g->data_offset + t->offset;
}

/* ---------------------------------------------------------------------------------------------
 * Writer: metadata is serialised as it is added into one growing buffer; tensor infos are kept
 * and laid out at write time. */

struct wtensor {
    char *name;
    uint32_t type, n_dims;
    uint64_t ne[4];
    uint64_t nbytes;
    const void *data;
};

struct gguf_writer {
    uint8_t *meta;
    size_t meta_len, meta_cap;
    uint64_t n_kv;
    struct wtensor *t;
    int n_t, cap_t;
    int failed; /* an add ran out of memory or was invalid: write refuses */
    int (*fill)(void *ctx, int index, void *buf, uint64_t nbytes);
    void *fill_ctx;
};

struct gguf_writer *gguf_writer_new(void)
{
    return calloc(1, sizeof(struct gguf_writer));
}

void gguf_writer_free(struct gguf_writer *w)
{
    if (!w) return;
    for (int i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w->meta);
    free(w);
}

void gguf_writer_set_fill(struct gguf_writer *w,
                          int (*fill)(void *ctx, int index, void *buf, uint64_t nbytes), void *ctx)
{
    w->fill = fill;
    w->fill_ctx = ctx;
}

static int put(struct gguf_writer *w, const void *p, size_t n)
{
    if (w->failed) return -1;
    if (n == 0) return 0;
    if (n > SIZE_MAX / 2 - w->meta_len) goto oom;
    if (w->meta_len + n > w->meta_cap) {
        size_t cap = w->meta_cap ? w->meta_cap : 256;
        while (cap < w->meta_len + n) cap *= 2;
        uint8_t *m = realloc(w->meta, cap);
        if (!m) goto oom;
        w->meta = m;
        w->meta_cap = cap;
    }
    memcpy(w->meta + w->meta_len, p, n);
    w->meta_len += n;
    return 0;
oom:
    w->failed = 1;
    return -1;
}

static int put_u32(struct gguf_writer *w, uint32_t v)
{
    return put(w, &v, 4);
}

static int put_u64(struct gguf_writer *w, uint64_t v)
{
    return put(w, &v, 8);
}

static int put_str(struct gguf_writer *w, const char *s)
{
    size_t n = strlen(s);
    return put_u64(w, n) || put(w, s, n) ? -1 : 0;
}

static int put_key(struct gguf_writer *w, const char *key, uint32_t type)
{
    if (put_str(w, key) || put_u32(w, type)) return -1;
    w->n_kv++;
    return 0;
}

int gguf_w_val(struct gguf_writer *w, const char *key, uint32_t type, const void *v)
{
    uint64_t sz = vtype_size(type);
    if (!sz) return w->failed = 1, -1;
    return put_key(w, key, type) || put(w, v, sz) ? -1 : 0;
}

int gguf_w_arr(struct gguf_writer *w, const char *key, uint32_t elem_type, const void *v,
               uint64_t n)
{
    uint64_t sz = vtype_size(elem_type);
    if (!sz || n > SIZE_MAX / sz) return w->failed = 1, -1;
    return put_key(w, key, GGUF_ARRAY) || put_u32(w, elem_type) || put_u64(w, n) ||
                   put(w, v, n * sz)
               ? -1
               : 0;
}

int gguf_w_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
    return gguf_w_val(w, key, GGUF_UINT32, &v);
}

int gguf_w_f32(struct gguf_writer *w, const char *key, float v)
{
    return gguf_w_val(w, key, GGUF_FLOAT32, &v);
}

int gguf_w_str(struct gguf_writer *w, const char *key, const char *v)
{
    return put_key(w, key, GGUF_STRING) || put_str(w, v) ? -1 : 0;
}

int gguf_w_arr_str(struct gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
    if (put_key(w, key, GGUF_ARRAY) || put_u32(w, GGUF_STRING) || put_u64(w, n)) return -1;
    for (uint64_t i = 0; i < n; i++)
        if (put_str(w, v[i])) return -1;
    return 0;
}

int gguf_w_arr_f32(struct gguf_writer *w, const char *key, const float *v, uint64_t n)
{
    return gguf_w_arr(w, key, GGUF_FLOAT32, v, n);
}

int gguf_w_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
    return gguf_w_arr(w, key, GGUF_INT32, v, n);
}

int gguf_w_tensor(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                  const uint64_t *ne, const void *data)
{
    if (w->failed) return -1;
    if (n_dims < 1 || n_dims > 4) goto bad;
    uint64_t rows = 1;
    for (uint32_t d = 1; d < n_dims; d++) {
        if (!ne[d] || rows > UINT64_MAX / ne[d]) goto bad;
        rows *= ne[d];
    }
    uint64_t row = ggml_row_bytes(type, ne[0]);
    if (!row || rows > UINT64_MAX / row) goto bad;
    if (w->n_t == w->cap_t) {
        int cap = w->cap_t ? w->cap_t * 2 : 64;
        struct wtensor *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) goto bad;
        w->t = t;
        w->cap_t = cap;
    }
    struct wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) goto bad;
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < (int)n_dims ? ne[d] : 1;
    t->nbytes = row * rows;
    t->data = data;
    w->n_t++;
    return 0;
bad:
    w->failed = 1;
    return -1;
}

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

static int write_all(FILE *f, const void *p, uint64_t n, char *err)
{
    if (n && fwrite(p, 1, n, f) != n) return errmsg_set(err, "write failed");
    return 0;
}

static int write_pad(FILE *f, uint64_t n, char *err)
{
    static const uint8_t zeros[64];
    while (n) {
        uint64_t k = n < sizeof zeros ? n : sizeof zeros;
        if (write_all(f, zeros, k, err) < 0) return -1;
        n -= k;
    }
    return 0;
}

int gguf_writer_write(struct gguf_writer *w, FILE *f, char *err)
{
    if (w->failed)
        return errmsg_set(err, "gguf writer: an earlier add failed (out of memory or bad tensor)");
    /* Tensor infos go after the metadata; compute them into the same buffer. */
    size_t meta_end = w->meta_len;
    uint64_t off = 0;
    for (int i = 0; i < w->n_t; i++) {
        struct wtensor *t = &w->t[i];
        if (put_str(w, t->name) || put_u32(w, t->n_dims)) goto oom;
        for (uint32_t d = 0; d < t->n_dims; d++)
            if (put_u64(w, t->ne[d])) goto oom;
        if (put_u32(w, t->type) || put_u64(w, off)) goto oom;
        off = align_up(off + t->nbytes, GGUF_DEFAULT_ALIGNMENT);
    }
    uint32_t hdr[2] = {GGUF_MAGIC, 3};
    uint64_t counts[2] = {(uint64_t)w->n_t, w->n_kv};
    uint64_t head = 24 + w->meta_len;
    int rc = -1;
    uint8_t *buf = NULL;
    uint64_t buf_cap = 0;
    if (write_all(f, hdr, 8, err) || write_all(f, counts, 16, err) ||
        write_all(f, w->meta, w->meta_len, err) ||
        write_pad(f, align_up(head, GGUF_DEFAULT_ALIGNMENT) - head, err))
        goto out;
    for (int i = 0; i < w->n_t; i++) {
        struct wtensor *t = &w->t[i];
        const void *data = t->data;
        if (!data) {
            if (!w->fill) {
                errmsg_set(err, "gguf writer: tensor %s has no data", t->name);
                goto out;
            }
            if (t->nbytes > buf_cap) {
                free(buf);
                buf = malloc(t->nbytes);
                buf_cap = buf ? t->nbytes : 0;
                if (!buf) {
                    errmsg_set(err, "gguf writer: out of memory for tensor %s (%llu bytes)",
                               t->name, (unsigned long long)t->nbytes);
                    goto out;
                }
            }
            if (w->fill(w->fill_ctx, i, buf, t->nbytes) < 0) {
                errmsg_set(err, "gguf writer: generating tensor %s failed", t->name);
                goto out;
            }
            data = buf;
        }
        if (write_all(f, data, t->nbytes, err) ||
            write_pad(f, align_up(t->nbytes, GGUF_DEFAULT_ALIGNMENT) - t->nbytes, err))
            goto out;
    }
    if (fflush(f) != 0) {
        errmsg_set(err, "write failed");
        goto out;
    }
    rc = 0;
out:
    free(buf);
    w->meta_len = meta_end;
    return rc;
oom:
    w->meta_len = meta_end;
    w->failed = 0; /* the adds were fine; only this write ran out of memory */
    return errmsg_set(err, "gguf writer: out of memory");
}
