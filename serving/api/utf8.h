/* utf8: validity and boundaries of UTF-8 text, for JSON in and out of the API.
 *
 * cJSON passes bytes through unchecked, so the API checks request strings itself (overlongs,
 * surrogates and code points past U+10FFFF are invalid, as in RFC 3629), and the streamer holds
 * back a token's partial character until the rest arrives, so every chunk is valid UTF-8. */
#ifndef STRATA_UTF8_H
#define STRATA_UTF8_H

#include <stddef.h>

/* 1 if s[0..n) is valid UTF-8. */
int utf8_valid(const char *s, size_t n);
/* Length of the longest prefix of s[0..n) that does not end inside an incomplete but possibly
 * valid sequence (what can be sent now). */
size_t utf8_complete_prefix(const char *s, size_t n);
/* Copy s[0..n) to out (capacity >= 3n+1), replacing each invalid byte with U+FFFD. Returns the
 * output length; out is NUL-terminated. */
size_t utf8_sanitize(const char *s, size_t n, char *out);
/* The same, but one U+FFFD for each maximal invalid subpart (a valid start cut short counts once,
 * as Unicode recommends and as llama.cpp's JSON library writes it): "\xf0\x9f" -> one U+FFFD. */
size_t utf8_replace_invalid(const char *s, size_t n, char *out);

#endif
