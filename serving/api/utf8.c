#include "serving/api/utf8.h"

#include <string.h>

/* Length of the valid sequence at s (n bytes left): 1..4; 0 if invalid; -k if it is a valid
 * start cut short by the end of the buffer. *good: how many bytes form a valid start (for 0: the
 * bytes before the one that breaks the sequence, 0 when the first byte cannot start one). */
static int seq_len_at(const unsigned char *s, size_t n, int *good)
{
    *good = 0;
    unsigned c = s[0];
    int need;
    unsigned lo = 0x80, hi = 0xbf;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf)
        need = 1;
    else if (c == 0xe0)
        need = 2, lo = 0xa0;
    else if (c >= 0xe1 && c <= 0xec)
        need = 2;
    else if (c == 0xed)
        need = 2, hi = 0x9f; /* no surrogates */
    else if (c >= 0xee && c <= 0xef)
        need = 2;
    else if (c == 0xf0)
        need = 3, lo = 0x90;
    else if (c >= 0xf1 && c <= 0xf3)
        need = 3;
    else if (c == 0xf4)
        need = 3, hi = 0x8f;
    else
        return 0;
    for (int k = 1; k <= need; k++) {
        *good = k;
        if ((size_t)k >= n) return -k;
        unsigned b = s[k];
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) return 0;
    }
    return need + 1;
}

static int seq_len(const unsigned char *s, size_t n)
{
    int good;
    return seq_len_at(s, n, &good);
}

int utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        int l = seq_len(p + i, n - i);
        if (l <= 0) return 0;
        i += (size_t)l;
    }
    return 1;
}

size_t utf8_complete_prefix(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        int l = seq_len(p + i, n - i);
        if (l < 0) return i;         /* a character still arriving */
        i += l == 0 ? 1 : (size_t)l; /* invalid bytes are passed on (sanitized later) */
    }
    return n;
}

size_t utf8_sanitize(const char *s, size_t n, char *out)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (i < n) {
        int l = seq_len(p + i, n - i);
        if (l > 0) {
            memcpy(out + o, p + i, (size_t)l);
            o += (size_t)l;
            i += (size_t)l;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    out[o] = 0;
    return o;
}

size_t utf8_replace_invalid(const char *s, size_t n, char *out)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (i < n) {
        int good, l = seq_len_at(p + i, n - i, &good);
        if (l > 0) {
            memcpy(out + o, p + i, (size_t)l);
            o += (size_t)l;
            i += (size_t)l;
            continue;
        }
        /* one U+FFFD for the maximal invalid subpart; the byte that broke it starts anew */
        memcpy(out + o, "\xef\xbf\xbd", 3);
        o += 3;
        i += l < 0 ? n - i : good ? (size_t)good : 1;
    }
    out[o] = 0;
    return o;
}
