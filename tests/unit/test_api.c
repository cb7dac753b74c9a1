/* The API's pure parts: HTTP head parsing, request validation (OpenAI error shapes), response
 * shapes, chat templates, UTF-8, stop strings, the step-time fit and the Prometheus text. */
#include "check.h"
#include "os/common/errmsg.h"
#include "serving/api/api_request.h"
#include "serving/api/api_response.h"
#include "serving/api/chat_template.h"
#include "serving/api/http.h"
#include "serving/api/metrics.h"
#include "serving/sched/step_model.h"
#include "serving/api/stop_string.h"
#include "serving/api/utf8.h"

#include <cjson/cJSON.h>

static int parse(const char *s, struct http_request *r, int *status)
{
    char err[ERRMSG_LEN];
    return http_parse_head(s, strlen(s), 16384, r, status, err);
}

TEST(http_head_ok)
{
    struct http_request r;
    int st;
    CHECK_EQ_INT(parse("POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n"
                       "Authorization: Bearer sk-1\r\nExpect: 100-continue\r\n\r\nbody",
                       &r, &st),
                 1);
    CHECK_STR(r.method, "POST");
    CHECK_STR(r.path, "/v1/completions");
    CHECK_EQ_INT(r.content_length, 12);
    CHECK(r.keep_alive && r.expect_continue && r.has_auth);
    CHECK_STR(r.bearer, "sk-1");
    CHECK_EQ_INT(r.head_len,
                 strlen("POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: "
                        "12\r\nAuthorization: Bearer sk-1\r\nExpect: 100-continue\r\n\r\n"));
    CHECK_EQ_INT(parse("GET /health HTTP/1.0\r\n\r\n", &r, &st), 1);
    CHECK(!r.keep_alive && r.content_length == -1);
    CHECK_EQ_INT(parse("GET /health HTTP/1.1\r\nConnection: close\r\n\r\n", &r, &st), 1);
    CHECK(!r.keep_alive);
    CHECK_EQ_INT(parse("GET /health HTTP/1.1\r\nHost: x\r\n", &r, &st), 0);
}

/* X-Strata-Route: local pins a request to the node reached; any other value is refused, and no
 * request is pinned without it */
TEST(http_head_route_local)
{
    struct http_request r;
    int st;
    CHECK_EQ_INT(parse("POST /v1/completions HTTP/1.1\r\nx-strata-route:  LOCAL \r\n\r\n", &r, &st),
                 1);
    CHECK(r.route_local && !r.forwarded);
    CHECK_EQ_INT(parse("POST /v1/completions HTTP/1.1\r\nHost: a\r\n\r\n", &r, &st), 1);
    CHECK(!r.route_local);
    const char *bad[] = {"node2", "", "locals", "local,local", "loca"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char head[128], err[ERRMSG_LEN];
        snprintf(head, sizeof head, "GET / HTTP/1.1\r\nX-Strata-Route: %s\r\n\r\n", bad[i]);
        CHECK_EQ_INT(http_parse_head(head, strlen(head), 16384, &r, &st, err), -1);
        CHECK_EQ_INT(st, 400);
        CHECK(strstr(err, "X-Strata-Route") != NULL);
    }
}

TEST(http_head_bad)
{
    struct http_request r;
    int st;
    const struct {
        const char *in;
        int status;
    } cases[] = {
        {"GARBAGE\r\n\r\n", 400},
        {"GET nopath HTTP/1.1\r\n\r\n", 400},
        {"GET / HTTP/2.0\r\n\r\n", 505},
        {"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\n folded\r\n\r\n", 400},
        {"POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", 400},
        {"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
        {"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
        {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
        {"POST / HTTP/1.1\r\nExpect: 200-ok\r\n\r\n", 417},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECKF(parse(cases[i].in, &r, &st) == -1, "case %zu accepted", i);
        CHECKF(st == cases[i].status, "case %zu: status %d, want %d", i, st, cases[i].status);
    }
    char big[20000];
    memset(big, 'a', sizeof big);
    memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
    char err[ERRMSG_LEN];
    CHECK_EQ_INT(http_parse_head(big, sizeof big, 16384, &r, &st, err), -1);
    CHECK_EQ_INT(st, 431);
}

static int req(const char *json, int chat, struct completion_request *r, struct api_error *e)
{
    return api_request_parse(json, strlen(json), chat, r, e);
}

TEST(request_valid)
{
    struct completion_request r;
    struct api_error e;
    CHECK_EQ_INT(req("{\"model\":\"m\",\"prompt\":\"Once\",\"max_tokens\":5,\"temperature\":0,"
                     "\"stop\":[\"a\",\"bc\"],\"stream\":true,\"stream_options\":"
                     "{\"include_usage\":true},\"seed\":7,\"top_k\":-1,\"unknown\":{\"x\":1},"
                     "\"ignore_eos\":true,\"ttft_ms\":200,\"logprobs\":null}",
                     0, &r, &e),
                 0);
    CHECK_STR(r.prompt, "Once");
    CHECK(r.max_tokens == 5 && r.temperature == 0 && r.n_stop == 2 && r.stream && r.include_usage &&
          r.has_seed && r.seed == 7 && r.top_k == 0 && r.ignore_eos && r.ttft_ms == 200);
    api_request_free(&r);
    CHECK_EQ_INT(req("{\"prompt\":[1,2,3]}", 0, &r, &e), 0);
    CHECK(r.n_prompt_ids == 3 && r.prompt_ids[2] == 3 && r.max_tokens == -1 &&
          r.temperature == 1.0f);
    api_request_free(&r);
    CHECK_EQ_INT(req("{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                     "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"}]}],"
                     "\"max_completion_tokens\":3,\"stop\":\"x\"}",
                     1, &r, &e),
                 0);
    CHECK(r.n_messages == 2 && r.max_tokens == 3 && r.n_stop == 1);
    CHECK_STR(r.messages[1].content, "Hi");
    api_request_free(&r);
}

TEST(request_invalid)
{
    const struct {
        const char *json;
        int chat;
        const char *param, *msg_part;
    } cases[] = {
        {"{\"prompt\":\"x\"", 0, "", "could not parse the JSON body"},
        {"[1,2]", 0, "", "could not parse"},
        {"", 0, "", "could not parse"},
        {"{}", 0, "prompt", "Missing required parameter"},
        {"{\"prompt\":5}", 0, "prompt", "Invalid type for 'prompt'"},
        {"{\"prompt\":\"x\",\"max_tokens\":\"5\"}", 0, "max_tokens",
         "expected an integer, but got a string"},
        {"{\"prompt\":\"x\",\"max_tokens\":-3}", 0, "max_tokens", ">= 1"},
        {"{\"prompt\":\"x\",\"max_tokens\":1e12}", 0, "max_tokens", ">= 1"},
        {"{\"prompt\":\"x\",\"max_tokens\":2.5}", 0, "max_tokens", "integer"},
        {"{\"prompt\":\"x\",\"temperature\":3}", 0, "temperature", "between 0 and 2"},
        {"{\"prompt\":\"x\",\"top_p\":0}", 0, "top_p", "(0, 1]"},
        {"{\"prompt\":\"x\",\"n\":2}", 0, "n", "n=1"},
        {"{\"prompt\":\"x\",\"stream\":\"yes\"}", 0, "stream", "boolean"},
        {"{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 0, "stop", "at most 4"},
        {"{\"prompt\":\"x\",\"stop\":[1]}", 0, "stop", "array of strings"},
        {"{\"prompt\":\"\xff\xfe\"}", 0, "prompt", "UTF-8"},
        {"{\"prompt\":\"\\ud800\"}", 0, "", "could not parse"}, /* cJSON rejects lone surrogates */
        {"{\"prompt\":[1,-2]}", 0, "prompt", "token id"},
        {"{\"messages\":[]}", 1, "messages", "empty array"},
        {"{\"messages\":[{\"content\":\"x\"}]}", 1, "messages[0].role", "Missing"},
        {"{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 1, "messages[0].role",
         "one of"},
        {"{\"messages\":\"hi\"}", 1, "messages", "an array"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct completion_request r;
        struct api_error e;
        CHECKF(req(cases[i].json, cases[i].chat, &r, &e) == -1, "case %zu accepted", i);
        CHECKF(e.status == 400, "case %zu: status %d", i, e.status);
        CHECKF(!strcmp(e.param, cases[i].param), "case %zu: param '%s'", i, e.param);
        CHECKF(strstr(e.message, cases[i].msg_part), "case %zu: message '%s'", i, e.message);
        char *j = api_error_json(&e);
        cJSON *o = cJSON_Parse(j);
        cJSON *err = cJSON_GetObjectItem(o, "error");
        CHECK(cJSON_IsString(cJSON_GetObjectItem(err, "message")));
        CHECK(cJSON_IsString(cJSON_GetObjectItem(err, "type")));
        CHECK(cJSON_GetObjectItem(err, "param") && cJSON_GetObjectItem(err, "code"));
        cJSON_Delete(o);
        free(j);
    }
}

TEST(response_shapes)
{
    struct api_reply rep = {.chat = 0,
                            .id = "cmpl-1",
                            .created = 5,
                            .model = "m",
                            .finish_reason = "length",
                            .prompt_tokens = 3,
                            .completion_tokens = 2,
                            .cached_tokens = 1};
    char *j = api_completion_json(&rep, "ab\xff", 3);
    cJSON *o = cJSON_Parse(j);
    CHECK(o);
    CHECK_STR(cJSON_GetObjectItem(o, "object")->valuestring, "text_completion");
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    CHECK_STR(cJSON_GetObjectItem(c0, "text")->valuestring, "ab\xef\xbf\xbd");
    CHECK_STR(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
    CHECK_EQ_INT(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "total_tokens")->valueint, 5);
    CHECK_EQ_INT(cJSON_GetObjectItem(
                     cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "prompt_tokens_details"),
                     "cached_tokens")
                     ->valueint,
                 1);
    cJSON_Delete(o);
    free(j);
    rep.chat = 1;
    rep.finish_reason = NULL;
    j = api_chunk_json(&rep, "hi", 2, 1);
    o = cJSON_Parse(j);
    CHECK_STR(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion.chunk");
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    CHECK_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "delta"), "role")->valuestring,
              "assistant");
    CHECK_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "delta"), "content")->valuestring, "hi");
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(c0, "finish_reason")));
    cJSON_Delete(o);
    free(j);
    j = api_models_json("stories", 1);
    CHECK(strstr(j, "\"object\":\"list\"") && strstr(j, "\"id\":\"stories\""));
    free(j);
}

TEST(chat_templates)
{
    struct chat_message m[] = {
        {"system", "S"}, {"user", "U1"}, {"assistant", "A1"}, {"user", "U2"}};
    char *s = chat_template_render(CHAT_PLAIN, m, 4, 1);
    CHECK_STR(s, "System: S\nUser: U1\nAssistant: A1\nUser: U2\nAssistant:");
    free(s);
    /* llama.cpp's llama2 renderings (test_serve_chat.c has the token ids) */
    s = chat_template_render(CHAT_LLAMA2_SYS, m, 4, 1);
    CHECK_STR(s, "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST]A1</s>[INST] U2 [/INST]");
    free(s);
    s = chat_template_render(CHAT_LLAMA2, m, 4, 1);
    CHECK_STR(s, "[INST] S\nU1 [/INST]A1</s>[INST] U2 [/INST]");
    free(s);
    s = chat_template_render(CHAT_CHATML, m + 1, 1, 1);
    CHECK_STR(s, "<|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\n");
    free(s);
    const char *j = "{% for m in messages %}<|im_start|>{{m.role}}";
    CHECK_EQ_INT(chat_template_detect(j, strlen(j)), CHAT_CHATML);
    CHECK_EQ_INT(chat_template_detect("[INST]", 6), CHAT_LLAMA2);
    CHECK_EQ_INT(chat_template_detect("[INST] <<SYS>>", 14), CHAT_LLAMA2_SYS);
    CHECK_EQ_INT(chat_template_detect(NULL, 0), CHAT_PLAIN);
}

TEST(utf8)
{
    CHECK(utf8_valid("h\xc3\xa9llo \xf0\x9f\x98\x80", 11));
    CHECK(!utf8_valid("\xc0\xaf", 2));         /* overlong */
    CHECK(!utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
    CHECK(!utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    CHECK_EQ_INT(utf8_complete_prefix("ab\xf0\x9f\x98", 5), 2);
    CHECK_EQ_INT(utf8_complete_prefix("ab\xff", 3), 3);
    char out[32];
    CHECK_EQ_INT(utf8_sanitize("a\xffz", 3, out), 5);
    CHECK_STR(out, "a\xef\xbf\xbdz");
    /* one U+FFFD per maximal invalid subpart: a cut-short start once, then the byte anew */
    CHECK_EQ_INT(utf8_replace_invalid("a\xf0\x9f", 3, out), 4);
    CHECK_STR(out, "a\xef\xbf\xbd");
    CHECK_EQ_INT(utf8_replace_invalid("\xf0\x9f"
                                      "A\xe2\x82\xac",
                                      6, out),
                 7);
    CHECK_STR(out, "\xef\xbf\xbd"
                   "A\xe2\x82\xac");
    CHECK_EQ_INT(utf8_replace_invalid("\xed\xa0\x80", 3, out), 9); /* surrogate: 3 */
    CHECK_EQ_INT(utf8_replace_invalid("\xc0\xaf\x80", 3, out), 9); /* bad lead, strays */
    CHECK_EQ_INT(utf8_replace_invalid("\xe0\x80", 2, out), 6);     /* overlong start */
}

TEST(stop_strings)
{
    char *stops[] = {"END", "\n\n"};
    CHECK_EQ_INT(stop_find("abcEN", 5, 3, stops, 2), (size_t)-1);
    CHECK_EQ_INT(stop_find("abcEND", 6, 5, stops, 2), 3);
    CHECK_EQ_INT(stop_find("a\n\nEND", 6, 0, stops, 2), 1);
    CHECK_EQ_INT(stop_safe_len("abcEN", 5, stops, 2), 3);
    CHECK_EQ_INT(stop_safe_len("abc\n", 4, stops, 2), 3);
    CHECK_EQ_INT(stop_safe_len("abc", 3, stops, 2), 3);
}

TEST(step_model_fit_recovers_coefficients)
{
    struct step_sample s[6];
    int shapes[6][2] = {{1, 1}, {8, 8}, {16, 16}, {64, 1}, {128, 1}, {80, 9}};
    for (int i = 0; i < 6; i++)
        s[i] = (struct step_sample){shapes[i][0], shapes[i][1],
                                    2e-5 * shapes[i][0] + 1e-4 * shapes[i][1] + 5e-4};
    struct step_model m;
    CHECK_EQ_INT(step_model_fit(&m, s, 6), 0);
    CHECK(fabs(m.a - 2e-5) < 1e-9 && fabs(m.b - 1e-4) < 1e-8 && fabs(m.c - 5e-4) < 1e-8);
    CHECK(fabs(step_model_predict(&m, 10, 2) - (2e-4 + 2e-4 + 5e-4)) < 1e-9);
    CHECK_EQ_INT(step_model_max_tokens(&m, 2, 9e-4 + 1e-9), 10);
}

TEST(metrics_text)
{
    struct serve_metrics m;
    metrics_init(&m);
    metrics_request(&m, OUTCOME_STOP);
    metrics_request(&m, OUTCOME_INVALID);
    hist_observe(&m.ttft, 0.003);
    hist_observe(&m.ttft, 100);
    atomic_store(&m.kv_blocks_used, 3);
    atomic_store(&m.kv_blocks_total, 12);
    atomic_store(&m.slo_ttft_us, 300000);
    size_t len;
    char *t = metrics_render(&m, &len);
    CHECK(strstr(t, "strata_requests_total{outcome=\"stop\"} 1\n"));
    CHECK(strstr(t, "strata_requests_total{outcome=\"invalid\"} 1\n"));
    CHECK(strstr(t, "strata_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n"));
    CHECK(strstr(t, "strata_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"));
    CHECK(strstr(t, "strata_time_to_first_token_seconds_count 2\n"));
    CHECK(strstr(t, "# TYPE strata_kv_blocks_used gauge\n"));
    /* vLLM's names (docs/operations.md) */
    CHECK(strstr(t, "\nstrata_kv_cache_usage_perc 0.2500\n"));
    CHECK(strstr(t, "\nstrata_slo_ttft_seconds 0.300000\n"));
    CHECK(strstr(t, "# TYPE strata_request_time_per_output_token_seconds histogram\n"));
    CHECK(strstr(t, "# TYPE strata_e2e_request_latency_seconds histogram\n"));
    CHECK(strstr(t, "# TYPE strata_num_requests_running gauge\n"));
    CHECK(strstr(t, "# TYPE strata_generation_tokens_total counter\n"));
    /* each name declared once (Prometheus refuses a second TYPE line) */
    for (const char *p = t; (p = strstr(p, "# TYPE ")); p++) {
        const char *e = strchr(p + 7, ' ');
        char name[128];
        snprintf(name, sizeof name, "# TYPE %.*s ", (int)(e - p - 7), p + 7);
        CHECK(!strstr(p + 1, name));
    }
    CHECK_EQ_INT(strlen(t), len);
    free(t);
}

int main(void)
{
    RUN(http_head_ok);
    RUN(http_head_route_local);
    RUN(http_head_bad);
    RUN(request_valid);
    RUN(request_invalid);
    RUN(response_shapes);
    RUN(chat_templates);
    RUN(utf8);
    RUN(stop_strings);
    RUN(step_model_fit_recovers_coefficients);
    RUN(metrics_text);
    CHECK_DONE();
}
