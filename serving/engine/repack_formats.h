/* repack_formats: one repacked layout = a pair of functions between the 16 rows' ggml blocks at
 * one block index and the record that replaces them (repack.h). Internal to repack*.c. */
#ifndef STRATA_REPACK_FORMATS_H
#define STRATA_REPACK_FORMATS_H

#include <stdint.h>

struct repack_format {
    uint32_t ggml_type, type; /* the ggml type and its repacked type (repack.h) */
    const char *name;
    /* src[r]: row r's block; dst: the record (16 blocks' bytes) */
    void (*pack)(const uint8_t *const *src, uint8_t *dst);
    /* row r's block back out of a record */
    void (*unpack)(const uint8_t *src, int r, uint8_t *dst);
};

/* repack_kquants.c */
void repack_pack_q4_K(const uint8_t *const *src, uint8_t *dst);
void repack_unpack_q4_K(const uint8_t *src, int r, uint8_t *dst);
void repack_pack_q2_K(const uint8_t *const *src, uint8_t *dst);
void repack_unpack_q2_K(const uint8_t *src, int r, uint8_t *dst);
void repack_pack_q3_K(const uint8_t *const *src, uint8_t *dst);
void repack_unpack_q3_K(const uint8_t *src, int r, uint8_t *dst);
void repack_pack_iq4_xs(const uint8_t *const *src, uint8_t *dst);
void repack_unpack_iq4_xs(const uint8_t *src, int r, uint8_t *dst);
void repack_pack_q5_K(const uint8_t *const *src, uint8_t *dst);
void repack_unpack_q5_K(const uint8_t *src, int r, uint8_t *dst);
void repack_pack_q6_K(const uint8_t *const *src, uint8_t *dst);
void repack_unpack_q6_K(const uint8_t *src, int r, uint8_t *dst);

#endif
