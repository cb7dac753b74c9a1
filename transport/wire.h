/* wire: the fabric's bytes on the wire, encoded and decoded field by field.
 *
 * Everything is little-endian and written with explicit shifts, never by casting a struct over
 * wire bytes. Every frame starts with a 28-byte header:
 *   magic u32 "STRA" | version u8 | type u8 | flags u16 | length u32 | conn u32 | seq u64 | crc u32
 * `length` counts the payload bytes after the header, `crc` is the CRC-32C of exactly those bytes
 * (the sealed payload as sent), so a corrupted frame is dropped before any cryptography runs.
 * HELLO and HELLO_ACK payloads are in the clear and carry a MAC keyed with the cluster key;
 * every other payload is sealed by the session (transport/auth.h). Inside a sealed MSG payload is
 * one application message (or a fragment of one, on datagram transports): a type byte and its body.
 *
 * Decoders take (buf, len), check every length against what is left before reading it, reject
 * trailing bytes, and return 0 or -1 with one line in err. Weight payloads inside CHUNK messages
 * are returned as pointers into the caller's buffer (no copy). */
#ifndef STRATA_WIRE_H
#define STRATA_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define WIRE_MAGIC   0x41525453u /* "STRA" as little-endian bytes 53 54 52 41 */
#define WIRE_VERSION 1
#define WIRE_HDR_LEN 28
/* Authenticated-encryption tag appended to every sealed payload. */
#define WIRE_TAG_LEN 16
/* Largest application message; a CHUNK carries at most WIRE_MAX_CHUNK bytes of weights. */
#define WIRE_MAX_MSG   (1u << 20)
#define WIRE_MAX_CHUNK (WIRE_MAX_MSG - 64)
#define WIRE_MIN_CHUNK 256
#define WIRE_MAX_FRAME (WIRE_HDR_LEN + WIRE_MAX_MSG + WIRE_TAG_LEN)
/* Spans of a manifest: embedding, up to 256 blocks, head, and some room. */
#define WIRE_MAX_SPANS        1024
#define WIRE_MAX_HEADER_BYTES (256u << 20)
#define WIRE_NAME_LEN         63
#define WIRE_NONCE_LEN        32
#define WIRE_MAC_LEN          32
#define WIRE_ID_LEN           32
/* Selective acknowledgement: bitmap of the WIRE_SACK_BITS packets after the cumulative ack. */
#define WIRE_SACK_WORDS 8
#define WIRE_SACK_BITS  (64 * WIRE_SACK_WORDS)

/* Frame types (header `type`). */
enum wire_type {
    WIRE_HELLO = 1,     /* client -> server: nonce, MAC */
    WIRE_HELLO_ACK = 2, /* server -> client: both nonces, conn id, MAC */
    WIRE_MSG = 3,       /* sealed application message or fragment */
    WIRE_ACK = 4,       /* sealed: cumulative + selective ack (datagram transports) */
    WIRE_CLOSE = 5,     /* sealed: the sender is closing the connection */
    /* The control plane's handshake (cluster/sealed_conn.h): HELLO and HELLO_ACK with both ends'
     * node ids bound in (transport/auth.h). The fabric's transports speak types 1 and 2. */
    WIRE_HELLO_ID = 6,     /* client -> server: nonce, client id, MAC */
    WIRE_HELLO_ID_ACK = 7, /* server -> client: both nonces, conn id, both ids, MAC */
};
#define WIRE_F_END 1u /* MSG: last fragment of an application message */

struct wire_hdr {
    uint8_t version, type;
    uint16_t flags;
    uint32_t length; /* payload bytes after the header */
    uint32_t conn;   /* connection id chosen by the server; 0 in HELLO */
    uint64_t seq;
    uint32_t crc; /* CRC-32C of the payload */
};

/* Little-endian primitives over a bounded cursor. A write past `cap` or a read past `len` sets
 * `bad` and does nothing, so a sequence of calls can be checked once at the end. */
struct wire_w {
    uint8_t *p;
    size_t cap, off;
    int bad;
};
struct wire_r {
    const uint8_t *p;
    size_t len, off;
    int bad;
};
void wire_put_u8(struct wire_w *w, uint8_t v);
void wire_put_u16(struct wire_w *w, uint16_t v);
void wire_put_u32(struct wire_w *w, uint32_t v);
void wire_put_u64(struct wire_w *w, uint64_t v);
void wire_put_f32(struct wire_w *w, float v); /* IEEE-754 binary32 bits, little-endian */
void wire_put_bytes(struct wire_w *w, const void *p, size_t n);
uint8_t wire_get_u8(struct wire_r *r);
uint16_t wire_get_u16(struct wire_r *r);
uint32_t wire_get_u32(struct wire_r *r);
uint64_t wire_get_u64(struct wire_r *r);
float wire_get_f32(struct wire_r *r);
const uint8_t *wire_get_bytes(struct wire_r *r, size_t n); /* NULL (and bad) if short */
uint32_t wire_f32_bits(float f);
float wire_bits_f32(uint32_t u);

/* Header. decode checks magic, version, type, and that `length` fits in len - WIRE_HDR_LEN and
 * WIRE_MAX_FRAME; it does not check the CRC (wire_frame_check does). */
void wire_hdr_encode(uint8_t out[WIRE_HDR_LEN], const struct wire_hdr *h);
int wire_hdr_decode(struct wire_hdr *h, const uint8_t *buf, size_t len, char *err);
/* The same checks except that the payload need not have arrived yet (stream transports). */
int wire_hdr_peek(struct wire_hdr *h, const uint8_t *buf, size_t len, char *err);
/* Decode the header of a whole frame of exactly len bytes and check its payload CRC. */
int wire_frame_check(struct wire_hdr *h, const uint8_t *frame, size_t len, char *err);

/* HELLO / HELLO_ACK bodies (the MAC is computed and checked by transport/auth.c). */
#define WIRE_HELLO_LEN     (WIRE_NONCE_LEN + WIRE_MAC_LEN)
#define WIRE_HELLO_ACK_LEN (2 * WIRE_NONCE_LEN + 4 + WIRE_MAC_LEN)
/* HELLO_ID: nonce | client id u64 | MAC; HELLO_ID_ACK: client nonce | server nonce | conn u32 |
 * server id u64 | client id u64 | MAC. */
#define WIRE_HELLO_ID_LEN     (WIRE_NONCE_LEN + 8 + WIRE_MAC_LEN)
#define WIRE_HELLO_ID_ACK_LEN (2 * WIRE_NONCE_LEN + 4 + 16 + WIRE_MAC_LEN)

/* ACK plaintext: next expected sequence number and which of the following WIRE_SACK_BITS
 * packets already arrived (bit i of word i/64 is seq cum+1+i). */
struct wire_ack {
    uint64_t cum;
    uint64_t sack[WIRE_SACK_WORDS];
};
#define WIRE_ACK_LEN (8 + 8 * WIRE_SACK_WORDS)
size_t wire_ack_encode(uint8_t *out, size_t cap, const struct wire_ack *a);
int wire_ack_decode(struct wire_ack *a, const uint8_t *buf, size_t len, char *err);

/* Application messages (first byte of a MSG payload). */
enum wire_msg {
    MSG_JOIN = 16,        /* joiner -> holder: which model, which spans it already holds */
    MSG_MANIFEST = 17,    /* holder -> joiner: identity, header length, spans with CRCs */
    MSG_CHUNK = 18,       /* holder -> joiner: bytes of the header or of the weight image */
    MSG_REFETCH = 19,     /* joiner -> holder: a unit (0 header, 1+s span s) failed its CRC */
    MSG_DONE = 20,        /* joiner -> holder: every span verified */
    MSG_RDMA_INFO = 21,   /* both ways: queue pair and memory region for one-sided reads */
    MSG_ACTIVATIONS = 22, /* coop: a step's hidden states at the input of layer `layer` */
    MSG_COOP_TOKENS = 23, /* coop: the tokens sampled for a MSG_ACTIVATIONS step, or an error */
    MSG_COOP_OPEN = 24,   /* coop: a sequence's sampler, before its first activations */
    MSG_COOP_CLOSE = 25,  /* coop: sequences the helper forgets (their KV blocks freed) */
    MSG_COOP_KV_REQ = 26, /* coop: the joiner asks for the KV of some layers of a sequence */
    MSG_COOP_KV = 27,     /* coop: one chunk of that KV (one layer, some positions), or an error */
};

struct wire_span {
    uint64_t offset, size; /* in the weight image */
    uint32_t crc;          /* CRC-32C of the span's bytes */
};

struct wire_manifest {
    uint8_t model_id[WIRE_ID_LEN]; /* BLAKE2b-256 of the header bytes */
    char name[WIRE_NAME_LEN + 1];
    uint64_t header_len; /* GGUF metadata + tensor infos, sent before the weights */
    uint32_t header_crc;
    uint64_t image_size;
    uint32_t chunk_size; /* the holder sends spans in chunks of at most this many bytes */
    uint32_t n_spans;
    struct wire_span span[WIRE_MAX_SPANS];
};
/* Returns bytes written, 0 if cap is too small. */
size_t wire_manifest_encode(uint8_t *out, size_t cap, const struct wire_manifest *m);
/* Checks besides lengths: 1 <= n_spans <= WIRE_MAX_SPANS, spans in increasing order without
 * overlap and inside image_size, chunk_size in [WIRE_MIN_CHUNK, WIRE_MAX_CHUNK], header_len <=
 * WIRE_MAX_HEADER_BYTES, name printable. */
int wire_manifest_decode(struct wire_manifest *m, const uint8_t *buf, size_t len, char *err);

#define JOIN_HAVE_HEADER 1u /* the header bytes are already verified */
#define JOIN_PULL                                                                                  \
    2u /* the joiner pulls the image with one-sided reads: send only the                           \
          manifest and the header */
struct wire_join {
    uint8_t model_id[WIRE_ID_LEN]; /* all zero: any model (a fresh node) */
    uint8_t flags;                 /* JOIN_* */
    uint32_t chunk_size;           /* chunking the joiner wants (0: the holder's) */
    uint32_t n_spans;              /* bits in `have` */
    uint8_t have[WIRE_MAX_SPANS / 8];
};
size_t wire_join_encode(uint8_t *out, size_t cap, const struct wire_join *j);
int wire_join_decode(struct wire_join *j, const uint8_t *buf, size_t len, char *err);

enum wire_region { REGION_HEADER = 0, REGION_IMAGE = 1 };
struct wire_chunk {
    uint8_t region;  /* enum wire_region */
    uint32_t span;   /* image chunks: the span it belongs to */
    uint64_t offset; /* in the header bytes or the image */
    uint32_t len;
    uint32_t crc; /* CRC-32C of data */
    const uint8_t *data;
};
#define WIRE_CHUNK_HDR_LEN (1 + 1 + 4 + 8 + 4 + 4)
size_t wire_chunk_encode(uint8_t *out, size_t cap, const struct wire_chunk *c);
/* Checks len <= WIRE_MAX_CHUNK, the data length and its CRC (not bounds against a manifest:
 * the receiver does that). */
int wire_chunk_decode(struct wire_chunk *c, const uint8_t *buf, size_t len, char *err);

size_t wire_refetch_encode(uint8_t *out, size_t cap, uint32_t span);
int wire_refetch_decode(uint32_t *span, const uint8_t *buf, size_t len, char *err);
size_t wire_done_encode(uint8_t *out, size_t cap);
int wire_done_decode(const uint8_t *buf, size_t len, char *err);

struct wire_rdma_info {
    uint32_t qpn, psn;
    uint16_t lid;
    uint8_t gid[16];
    uint32_t rkey;
    uint64_t addr, len; /* the registered region the peer may read */
};
#define WIRE_RDMA_INFO_LEN (1 + 4 + 4 + 2 + 16 + 4 + 8 + 8)
size_t wire_rdma_info_encode(uint8_t *out, size_t cap, const struct wire_rdma_info *i);
int wire_rdma_info_decode(struct wire_rdma_info *i, const uint8_t *buf, size_t len, char *err);

/* Cooperative execution (cluster/coop.h). Every coop message ends with the CRC-32C of all its
 * bytes before it (u32), checked before anything else is trusted.
 *
 * MSG_ACTIVATIONS: the hidden states of one step at the input of layer `layer` (the first layer the
 * receiver runs): the joiner ran the embedding and [0, layer). Values travel as IEEE-754 binary32,
 * binary16 (fp16) or bfloat16, little-endian; fp16/bf16 conversions are the engine's
 * (serving/engine/quant.h, round to nearest even) and lossy: f32 is the exact choice. Each row
 * carries its sequence id, position, token id and flags (WIRE_ROW_*), so the receiver runs its own
 * KV cache and knows which rows want a sampled token.
 * dtype WIRE_TOKENS: the values part is empty: the rows' token ids are the input and the receiver
 * runs the embedding too; `layer` must be 0 and `dim` is still the model's (the receiver checks
 * it). A joiner whose embedding table has not arrived yet sends these.
 *   u8 type | u64 step | u32 layer | u32 n | u32 dim | u8 dtype
 *   | n x (u32 seq | u32 pos | u32 token | u8 flags) | n x dim values | u32 crc */
enum wire_dtype { WIRE_F32 = 0, WIRE_F16 = 1, WIRE_BF16 = 2, WIRE_TOKENS = 3 };
#define WIRE_MAX_ACT_TOKENS 4096
#define WIRE_MAX_ACT_DIM    65536
#define WIRE_ROW_LOGITS     1u /* sample a token after this row */
#define WIRE_ROW_MASK_EOS   2u /* ... with the end-of-sequence tokens excluded (min_tokens) */
struct wire_activations {
    uint64_t step;
    uint32_t layer; /* first layer the receiver runs */
    uint32_t n, dim;
    uint8_t dtype;         /* enum wire_dtype */
    const uint32_t *seq;   /* [n] (encode: from the caller; decode: into the caller's arrays) */
    const uint32_t *pos;   /* [n] */
    const uint32_t *token; /* [n] */
    const uint8_t *flags;  /* [n] WIRE_ROW_* */
    const float *x;        /* [n][dim] */
};
#define WIRE_ACT_HDR_LEN (1 + 8 + 4 + 4 + 4 + 1)
#define WIRE_ACT_ROW_LEN (4 + 4 + 4 + 1)
size_t wire_activations_size(uint32_t n, uint32_t dim, uint8_t dtype);
/* Rows of `dim` values of `dtype` that fit in one message of at most WIRE_MAX_MSG bytes. */
uint32_t wire_activations_max_rows(uint32_t dim, uint8_t dtype);
size_t wire_activations_encode(uint8_t *out, size_t cap, const struct wire_activations *a);
/* Decodes into seq/pos/token/flags[cap_n] and x[cap_x]; fails if n > cap_n or n * dim > cap_x
 * (not for WIRE_TOKENS, which writes no x), on a bad CRC, an unknown dtype or flag, WIRE_TOKENS
 * with layer != 0, a length that is not exactly the declared shape. */
int wire_activations_decode(struct wire_activations *a, const uint8_t *buf, size_t len,
                            uint32_t *seq, uint32_t *pos, uint32_t *token, uint8_t *flags, float *x,
                            uint32_t cap_n, size_t cap_x, char *err);

/* MSG_COOP_TOKENS: status 0 and one entry per WIRE_ROW_LOGITS row of the step, in row order (the
 * sampled token and the sampler's generator state after drawing it), or status 1 (failed) or 2
 * (refused: the helper had no KV blocks for it and ran none of it; send it again later), no
 * entries, and a message.
 *   u8 type | u64 step | u8 status | u32 n | n x (u32 seq | u32 token | u64 rng)
 *   | u16 error length | error bytes | u32 crc */
#define WIRE_COOP_ERR_LEN 255
#define WIRE_COOP_REFUSED 2 /* MSG_COOP_TOKENS status: no KV blocks at the helper, none of it ran */
struct wire_coop_token {
    uint32_t seq, token;
    uint64_t rng;
};
struct wire_coop_tokens {
    uint64_t step;
    uint8_t status; /* 0 ok, 1 failed, WIRE_COOP_REFUSED */
    uint32_t n;
    struct wire_coop_token *tok; /* [n] (decode: the caller's array) */
    char error[WIRE_COOP_ERR_LEN + 1];
};
size_t wire_coop_tokens_encode(uint8_t *out, size_t cap, const struct wire_coop_tokens *t);
int wire_coop_tokens_decode(struct wire_coop_tokens *t, const uint8_t *buf, size_t len,
                            struct wire_coop_token *tok, uint32_t cap_n, char *err);

/* MSG_COOP_OPEN: a sequence the joiner will send rows of, with its sampler's parameters and its
 * generator state now.
 *   u8 type | u32 seq | f32 temperature | f32 top_p | u32 top_k | f32 min_p | u64 rng | u32 crc */
struct wire_coop_open {
    uint32_t seq;
    float temperature, top_p, min_p;
    uint32_t top_k;
    uint64_t rng;
};
#define WIRE_COOP_OPEN_LEN (1 + 4 + 4 + 4 + 4 + 4 + 8 + 4)
size_t wire_coop_open_encode(uint8_t *out, size_t cap, const struct wire_coop_open *o);
/* Also checks temperature >= 0, top_p in (0, 1], min_p in [0, 1), all finite. */
int wire_coop_open_decode(struct wire_coop_open *o, const uint8_t *buf, size_t len, char *err);

/* MSG_COOP_CLOSE: u8 type | u32 n | n x u32 seq | u32 crc (1 <= n <= WIRE_MAX_ACT_TOKENS). */
size_t wire_coop_close_encode(uint8_t *out, size_t cap, const uint32_t *seq, uint32_t n);
int wire_coop_close_decode(const uint8_t *buf, size_t len, uint32_t *seq, uint32_t cap_n,
                           uint32_t *n, char *err);

/* MSG_COOP_KV_REQ: when k rises from a to b, the joiner asks for the keys and values of layers
 * [a, b) of every sequence it had running, in one request: sequence i at positions [0, n[i]), in
 * its KV cache's element type (WIRE_F32 or WIRE_F16; the helper refuses another type than its own
 * rather than convert: exactness).
 *   u8 type | u64 req | u32 layer0 | u32 layer1 | u8 dtype | u32 count
 *   | count x (u32 seq | u32 n) | u32 crc
 * Checks: exactly the declared length, the CRC, layer0 < layer1, dtype f32 or f16,
 * 1 <= count <= min(cap, WIRE_COOP_KV_MAX_SEQS), every n >= 1. Decode writes the sequences and
 * their position counts into the caller's arrays (seq, n: room for cap each) and points q at
 * them; encode reads q->seq and q->n. */
#define WIRE_COOP_KV_MAX_SEQS 4096
struct wire_coop_kv_req {
    uint64_t req; /* the joiner's request id: every chunk of the answer repeats it */
    uint32_t layer0, layer1;
    uint8_t dtype;
    uint32_t count;
    uint32_t *seq, *n; /* count each */
};
#define WIRE_COOP_KV_REQ_HDR_LEN (1 + 8 + 4 + 4 + 1 + 4)
size_t wire_coop_kv_req_size(uint32_t count);
size_t wire_coop_kv_req_encode(uint8_t *out, size_t cap, const struct wire_coop_kv_req *q);
int wire_coop_kv_req_decode(struct wire_coop_kv_req *q, const uint8_t *buf, size_t len,
                            uint32_t *seq, uint32_t *n, uint32_t cap, char *err);

/* MSG_COOP_KV: the answer to a request, sequence by sequence in the request's order, each
 * sequence's layers in increasing order, each layer's positions in increasing chunks of at most
 * wire_coop_kv_max_rows() rows; status 0: rows [pos0, pos0 + n) of `layer` of sequence `seq`,
 * first n rows of kv_dim keys, then n rows of kv_dim values, each element f32 or f16 bits (dtype),
 * little-endian; status 1: no rows (n = 0) and a message: that sequence is refused (the joiner
 * recomputes it) and the answer goes on with the next one.
 *   u8 type | u64 req | u32 seq | u8 status | u32 layer | u32 pos0 | u32 n | u32 kv_dim
 *   | u8 dtype | n x kv_dim keys | n x kv_dim values | u16 error length | error | u32 crc
 * Checks: lengths (exactly the declared shape), then the CRC, then ranges: dtype f32 or f16,
 * kv_dim in [1, WIRE_MAX_ACT_DIM], status 0 with n >= 1 or status 1 with n = 0, no error text
 * with status 0. The receiver checks req, seq, layer, pos0, n and kv_dim against what it asked. */
struct wire_coop_kv {
    uint64_t req;
    uint32_t seq;
    uint8_t status; /* 0 rows, 1 failed */
    uint32_t layer, pos0, n, kv_dim;
    uint8_t dtype;
    const uint8_t *k, *v; /* decode: pointers into buf (wire bytes: wire_coop_kv_elems converts) */
    const void *k_src, *v_src; /* encode: n x kv_dim host-order elements of dtype each */
    char error[WIRE_COOP_ERR_LEN + 1];
};
#define WIRE_COOP_KV_HDR_LEN (1 + 8 + 4 + 1 + 4 + 4 + 4 + 4 + 1)
size_t wire_coop_kv_size(uint32_t n, uint32_t kv_dim, uint8_t dtype, size_t error_len);
/* Rows of kv_dim keys and values that fit in one message of at most WIRE_MAX_MSG bytes. */
uint32_t wire_coop_kv_max_rows(uint32_t kv_dim, uint8_t dtype);
size_t wire_coop_kv_encode(uint8_t *out, size_t cap, const struct wire_coop_kv *m);
int wire_coop_kv_decode(struct wire_coop_kv *m, const uint8_t *buf, size_t len, char *err);
/* count elements of a decoded chunk's k or v (wire bytes) into host-order elements of its dtype. */
void wire_coop_kv_elems(void *dst, const uint8_t *src, size_t count, uint8_t dtype);

/* The message type of an application message, or -1 if empty. */
int wire_msg_type(const uint8_t *buf, size_t len);

#endif
