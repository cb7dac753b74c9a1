#include "serving/api/stop_string.h"

#include <string.h>

size_t stop_find(const char *text, size_t len, size_t from, char *const *stops, int n)
{
    size_t best = (size_t)-1;
    for (int i = 0; i < n; i++) {
        size_t k = strlen(stops[i]);
        if (!k || k > len) continue;
        /* a match ending at or after `from` starts at or after from - k + 1 */
        size_t s0 = from >= k ? from - k + 1 : 0;
        for (size_t s = s0; s + k <= len && s < best; s++)
            if (!memcmp(text + s, stops[i], k)) {
                best = s;
                break;
            }
    }
    return best;
}

size_t stop_safe_len(const char *text, size_t len, char *const *stops, int n)
{
    size_t hold = 0;
    for (int i = 0; i < n; i++) {
        size_t k = strlen(stops[i]);
        /* tails shorter than the stop string that equal its beginning */
        for (size_t t = k > 1 ? k - 1 : 0; t > hold; t--) {
            if (t > len) continue;
            if (!memcmp(text + len - t, stops[i], t)) {
                hold = t;
                break;
            }
        }
    }
    return len - hold;
}
