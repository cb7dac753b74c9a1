/* chat_template: turns chat messages into the prompt text the model continues.
 *
 * A GGUF may carry tokenizer.chat_template, a Jinja program. Strata does not run Jinja: it
 * recognises the few well-known templates by their markers and renders them in C:
 *   llama2  ("[INST]"):            [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant}
 * ... chatml  ("<|im_start|>"):      <|im_start|>{role}\n{content}<|im_end|>\n ...
 * <|im_start|>assistant\n zephyr  ("<|user|>"):          <|{role}|>\n{content}</s>\n ...
 * <|assistant|>\n Anything else, and models without a template (stories260K), use the documented
 * default: plain:                         "System: {content}\n" "User: {content}\n" "Assistant:
 * {content}\n"
 *                                  ... then "Assistant:"
 * The BOS token is added by the tokenizer, not by the template. Special-token markers such as
 * <|im_start|> are rendered as text; they become special tokens only where the tokenizer maps them.
 */
#ifndef STRATA_CHAT_TEMPLATE_H
#define STRATA_CHAT_TEMPLATE_H

#include "serving/api/api_request.h"

#include <stddef.h>

enum chat_template { CHAT_PLAIN, CHAT_LLAMA2, CHAT_CHATML, CHAT_ZEPHYR };

/* Which template a GGUF tokenizer.chat_template (NULL/len 0: none) selects. */
enum chat_template chat_template_detect(const char *jinja, size_t len);
const char *chat_template_name(enum chat_template t);
/* malloc'd, NUL-terminated prompt text; NULL on out of memory. */
char *chat_template_render(enum chat_template t, const struct chat_message *m, int n);

#endif
