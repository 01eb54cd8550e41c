/* gate/openai.c: requests parse into the values the API defines (defaults included), every
 * kind of bad body is refused with the right status, param and message, and the rendered
 * objects have the API's shape (checked by parsing them back). */
#include "test_util.h"

#include <json-c/json.h>

#include "openai.h"

static int parse(enum oa_kind k, const char *body, struct oa_req *r, struct oa_err *e)
{
	return oa_parse(k, body, strlen(body), r, e);
}

static void test_parse_ok(void **state)
{
	(void)state;
	struct oa_req r;
	struct oa_err e;
	assert_int_equal(parse(OA_COMPLETION, "{\"model\":\"m\",\"prompt\":\"hi\"}", &r, &e), 0);
	assert_string_equal(r.model, "m");
	assert_string_equal(r.prompt, "hi");
	assert_false(r.has_max_tokens);
	assert_true(r.temperature == 1.0f && r.top_p == 1.0f && !r.stream && !r.has_seed);
	oa_req_free(&r);
	assert_int_equal(parse(OA_COMPLETION,
			       "{\"model\":\"m\",\"prompt\":[1,2,3],\"max_tokens\":7,\"temperature\":0,"
			       "\"top_p\":0.5,\"seed\":-1,\"stop\":[\"a\",\"bc\"],\"stream\":true,"
			       "\"stream_options\":{\"include_usage\":true},\"n\":1,\"user\":\"u\","
			       "\"echo\":false,\"presence_penalty\":0,\"logprobs\":null}",
			       &r, &e), 0);
	assert_int_equal(r.n_ids, 3);
	assert_int_equal(r.ids[2], 3);
	assert_int_equal(r.max_tokens, 7);
	assert_true(r.temperature == 0.0f && r.top_p == 0.5f);
	assert_true(r.has_seed && r.seed == UINT64_MAX);
	assert_int_equal(r.n_stop, 2);
	assert_string_equal(r.stop[1], "bc");
	assert_true(r.stream && r.include_usage);
	oa_req_free(&r);
	assert_int_equal(parse(OA_CHAT,
			       "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
			       "[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}],"
			       "\"max_completion_tokens\":3}", &r, &e), 0);
	assert_int_equal(r.n_msgs, 1);
	assert_string_equal(r.msgs[0].content, "ab");
	assert_int_equal(r.max_tokens, 3);
	oa_req_free(&r);
}

static void refused(enum oa_kind k, const char *body, const char *param, const char *msg)
{
	struct oa_req r;
	struct oa_err e;
	assert_int_equal(parse(k, body, &r, &e), 400);
	assert_int_equal(e.http, 400);
	assert_string_equal(e.type, "invalid_request_error");
	if (param)
		assert_string_equal(e.param, param);
	if (msg && !strstr(e.message, msg)) {
		fprintf(stderr, "'%s' not in '%s'\n", msg, e.message);
		fail();
	}
}

static void test_parse_refused(void **state)
{
	(void)state;
	const enum oa_kind C = OA_COMPLETION;
	refused(C, "{\"model\":\"m\",", NULL, "could not parse");
	refused(C, "{\"model\":\"m\",\"prompt\":\"x\"}}", NULL, "could not parse");
	refused(C, "{'model':'m'}", NULL, "could not parse");
	refused(C, "\"text\"", NULL, "JSON object");
	refused(C, "", NULL, "could not parse");
	refused(C, "{\"model\":\"m\",\"prompt\":\"\xff\"}", NULL, "could not parse");
	refused(C, "{\"model\":\"m\",\"prompt\":\"x\",\"foo\":1}", "foo",
		"Unrecognized request argument supplied: foo");
	refused(C, "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":-1}", "max_tokens", NULL);
	refused(C, "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":1.5}", "max_tokens", NULL);
	refused(C, "{\"model\":\"m\",\"prompt\":\"x\",\"temperature\":3}", "temperature", NULL);
	refused(C, "{\"model\":\"m\",\"prompt\":\"x\",\"n\":2}", "n", NULL);
	refused(C, "{\"model\":\"m\",\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}",
		"stop", NULL);
	refused(C, "{\"model\":\"m\",\"prompt\":\"x\",\"best_of\":3}", "best_of", NULL);
	refused(C, "{\"model\":\"m\",\"prompt\":\"a\\u0000b\"}", "prompt", "NUL");
	refused(C, "{\"model\":\"m\",\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}",
		"stream_options", NULL);
	refused(C, "{\"prompt\":\"x\"}", "model", NULL);
	refused(C, "{\"model\":\"m\"}", "prompt", NULL);
	refused(OA_CHAT, "{\"model\":\"m\",\"messages\":[]}", "messages", NULL);
	refused(OA_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}", NULL, "content");
	refused(OA_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
		"[{\"type\":\"image_url\"}]}]}", NULL, "text");
	refused(OA_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
		"\"tools\":[{\"type\":\"function\"}]}", "tools", NULL);
}

static struct json_object *back(char *s)
{
	assert_non_null(s);
	struct json_object *o = json_tokener_parse(s);
	assert_non_null(o);
	free(s);
	return o;
}

static const char *str_at(struct json_object *o, const char *path0, const char *path1)
{
	struct json_object *x;
	assert_true(json_object_object_get_ex(o, path0, &x));
	if (path1)
		assert_true(json_object_object_get_ex(x, path1, &x));
	return json_object_get_string(x);
}

static void test_render(void **state)
{
	(void)state;
	struct oa_err e;
	oa_error(&e, 404, "invalid_request_error", "model_not_found", "model", "no \"%s\"", "x");
	struct json_object *o = back(oa_error_json(&e)), *x;
	assert_string_equal(str_at(o, "error", "message"), "no \"x\"");
	assert_string_equal(str_at(o, "error", "code"), "model_not_found");
	assert_string_equal(str_at(o, "error", "param"), "model");
	json_object_put(o);
	struct oa_out out = { "chatcmpl-1", "m", 1700000000, 3 };
	o = back(oa_completion_json(OA_CHAT, &out, "hi/\xc3\xa9", "stop", 5, 2));
	assert_string_equal(str_at(o, "object", NULL), "chat.completion");
	x = json_object_array_get_idx(json_object_object_get(o, "choices"), 0);
	assert_string_equal(str_at(x, "message", "content"), "hi/\xc3\xa9");
	assert_string_equal(str_at(x, "finish_reason", NULL), "stop");
	assert_int_equal(json_object_get_int(json_object_object_get(
				 json_object_object_get(o, "usage"), "total_tokens")), 7);
	/* Prompt tokens found in kvstored's pool, as OpenAI reports cached prompt tokens. */
	assert_int_equal(json_object_get_int(json_object_object_get(json_object_object_get(
				 json_object_object_get(o, "usage"), "prompt_tokens_details"),
				 "cached_tokens")), 3);
	json_object_put(o);
	o = back(oa_chunk_json(OA_CHAT, &out, NULL, true, NULL));
	x = json_object_array_get_idx(json_object_object_get(o, "choices"), 0);
	assert_string_equal(str_at(x, "delta", "role"), "assistant");
	assert_null(json_object_object_get(x, "finish_reason"));
	json_object_put(o);
	o = back(oa_usage_chunk_json(OA_COMPLETION, &out, 3, 4));
	assert_string_equal(str_at(o, "object", NULL), "text_completion");
	assert_int_equal(json_object_array_length(json_object_object_get(o, "choices")), 0);
	json_object_put(o);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_ok),
		cmocka_unit_test(test_parse_refused),
		cmocka_unit_test(test_render),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
