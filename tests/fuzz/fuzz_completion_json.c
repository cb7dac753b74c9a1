/* libFuzzer target: completion request validation (JSON -> struct completion_request) and the
 * rendering that follows it (chat template, error JSON). The first byte picks chat or completions.
 */
#include "serving/api/api_request.h"
#include "serving/api/chat_template.h"
#include "serving/api/utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int chat = data[0] & 1;
    char *buf = malloc(size);
    if (!buf) return 0;
    memcpy(buf, data + 1, size - 1);
    struct completion_request r;
    struct api_error e;
    if (api_request_parse(buf, size - 1, chat, &r, &e) == 0) {
        if (chat) {
            if (r.n_messages < 1) abort();
            for (int t = 0; t < CHAT_N_TEMPLATES; t++) {
                char *p = chat_template_render((enum chat_template)t, r.messages, r.n_messages);
                if (p && !utf8_valid(p, strlen(p))) abort();
                free(p);
            }
        } else if (!r.prompt && !r.n_prompt_ids) {
            abort();
        }
        if (r.n_stop > API_MAX_STOP) abort();
        api_request_free(&r);
    } else {
        if (e.status < 400) abort();
        char *j = api_error_json(&e);
        free(j);
    }
    free(buf);
    return 0;
}
