/* stop_string: where generated text must end, and how much of it may be streamed yet.
 *
 * A stop string can span tokens, so the streamer holds back any tail of the text that is a prefix
 * of some stop string until the next token settles it; the client never sees a stop string or a
 * part of one (as the OpenAI API behaves). */
#ifndef STRATA_STOP_STRING_H
#define STRATA_STOP_STRING_H

#include <stddef.h>

/* Earliest match of any stop string that ends at or after byte `from` of text[0..len); returns
 * its start, or (size_t)-1 when none. */
size_t stop_find(const char *text, size_t len, size_t from, char *const *stops, int n);
/* Bytes of text that can be sent now: len minus the longest tail that begins some stop string. */
size_t stop_safe_len(const char *text, size_t len, char *const *stops, int n);

#endif
