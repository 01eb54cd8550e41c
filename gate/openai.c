/* openai — see openai.h. Shapes: https://platform.openai.com/docs/api-reference (completions,
 * chat, streaming, errors). */
#include "openai.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD 400

int oa_error(struct oa_err *e, int http, const char *type, const char *code, const char *param,
	     const char *fmt, ...)
{
	e->http = http;
	e->type = type;
	e->code = code;
	snprintf(e->param, sizeof e->param, "%s", param ? param : "");
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof e->message, fmt, ap);
	va_end(ap);
	return http;
}

#define INVALID(e, param, ...) oa_error(e, BAD, "invalid_request_error", NULL, param, __VA_ARGS__)

void oa_req_free(struct oa_req *r)
{
	free(r->model);
	free(r->prompt);
	free(r->ids);
	for (int i = 0; i < r->n_msgs; i++) {
		free((char *)r->msgs[i].role);
		free((char *)r->msgs[i].content);
	}
	free(r->msgs);
	free(r->cache_salt);
	for (int i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------- parsing */

static bool is_null(struct json_object *v)
{
	return !v || json_object_get_type(v) == json_type_null;
}

static bool is_number(struct json_object *v)
{
	enum json_type t = json_object_get_type(v);
	return t == json_type_int || t == json_type_double;
}

/* An integer-valued JSON number in [lo, hi]. */
static int get_int(struct json_object *v, const char *name, long long lo, long long hi,
		   long long *out, struct oa_err *e)
{
	if (json_object_get_type(v) == json_type_int) {
		errno = 0;
		long long x = json_object_get_int64(v);
		if (x == INT64_MAX && json_object_get_uint64(v) > INT64_MAX)
			return INVALID(e, name, "%s: %s is too large", name,
				       json_object_to_json_string(v));
		if (x < lo || x > hi)
			return INVALID(e, name, "%s: %lld is out of range [%lld, %lld]", name, x, lo,
				       hi);
		*out = x;
		return 0;
	}
	return INVALID(e, name, "%s: expected an integer, got %s", name,
		       json_object_to_json_string(v));
}

static int get_num(struct json_object *v, const char *name, double lo, double hi, float *out,
		   struct oa_err *e)
{
	if (!is_number(v))
		return INVALID(e, name, "%s: expected a number, got %s", name,
			       json_object_to_json_string(v));
	double x = json_object_get_double(v);
	if (!(x >= lo && x <= hi))
		return INVALID(e, name, "%s: %g is out of range [%g, %g]", name, x, lo, hi);
	*out = (float)x;
	return 0;
}

static int get_bool(struct json_object *v, const char *name, bool *out, struct oa_err *e)
{
	if (json_object_get_type(v) != json_type_boolean)
		return INVALID(e, name, "%s: expected true or false", name);
	*out = json_object_get_boolean(v);
	return 0;
}

static int dup_str(struct json_object *v, const char *name, char **out, struct oa_err *e)
{
	if (json_object_get_type(v) != json_type_string)
		return INVALID(e, name, "%s: expected a string", name);
	/* The body was validated as UTF-8; an embedded NUL would cut the prompt silently. */
	size_t n = (size_t)json_object_get_string_len(v);
	const char *s = json_object_get_string(v);
	if (memchr(s, '\0', n))
		return INVALID(e, name, "%s: contains a NUL character", name);
	if (!(*out = strndup(s, n)))
		return oa_error(e, 500, "server_error", NULL, NULL, "out of memory");
	return 0;
}

static int parse_stop(struct json_object *v, struct oa_req *r, struct oa_err *e)
{
	if (json_object_get_type(v) == json_type_string) {
		if (!json_object_get_string_len(v))
			return INVALID(e, "stop", "stop: an empty string never matches");
		return dup_str(v, "stop", &r->stop[r->n_stop++], e);
	}
	if (json_object_get_type(v) != json_type_array)
		return INVALID(e, "stop", "stop: expected a string or a list of strings");
	size_t n = json_object_array_length(v);
	if (n > OA_MAX_STOP)
		return INVALID(e, "stop", "stop: at most %d sequences, got %zu", OA_MAX_STOP, n);
	for (size_t i = 0; i < n; i++) {
		struct json_object *s = json_object_array_get_idx(v, i);
		if (json_object_get_type(s) != json_type_string || !json_object_get_string_len(s))
			return INVALID(e, "stop", "stop[%zu]: expected a non-empty string", i);
		int ret = dup_str(s, "stop", &r->stop[r->n_stop], e);
		if (ret)
			return ret;
		r->n_stop++;
	}
	return 0;
}

static int parse_prompt(struct json_object *v, struct oa_req *r, struct oa_err *e)
{
	if (json_object_get_type(v) == json_type_string)
		return dup_str(v, "prompt", &r->prompt, e);
	if (json_object_get_type(v) != json_type_array || !json_object_array_length(v))
		return INVALID(e, "prompt", "prompt: expected a string, a list of one string or a "
			       "list of token ids");
	size_t n = json_object_array_length(v);
	struct json_object *first = json_object_array_get_idx(v, 0);
	if (json_object_get_type(first) == json_type_string) {
		if (n != 1)
			return INVALID(e, "prompt", "prompt: one prompt per request (got %zu)", n);
		return dup_str(first, "prompt", &r->prompt, e);
	}
	if (n > (1u << 24))
		return INVALID(e, "prompt", "prompt: too many token ids");
	if (!(r->ids = malloc(n * sizeof *r->ids)))
		return oa_error(e, 500, "server_error", NULL, NULL, "out of memory");
	for (size_t i = 0; i < n; i++) {
		struct json_object *t = json_object_array_get_idx(v, i);
		long long id;
		if (json_object_get_type(t) == json_type_array)
			return INVALID(e, "prompt", "prompt: one prompt per request");
		int ret = get_int(t, "prompt", 0, INT32_MAX, &id, e);
		if (ret)
			return ret;
		r->ids[i] = (int32_t)id;
	}
	r->n_ids = (int)n;
	return 0;
}

/* A message's content: a string, or a list of {"type": "text", "text": ...} parts. */
static int parse_content(struct json_object *c, int k, char **out, struct oa_err *e)
{
	char name[48];
	snprintf(name, sizeof name, "messages[%d].content", k);
	if (json_object_get_type(c) == json_type_string)
		return dup_str(c, name, out, e);
	if (json_object_get_type(c) != json_type_array)
		return INVALID(e, name, "%s: expected a string or a list of text parts", name);
	size_t total = 0, n = json_object_array_length(c);
	for (size_t i = 0; i < n; i++) {
		struct json_object *p = json_object_array_get_idx(c, i), *t, *x;
		if (!json_object_object_get_ex(p, "type", &t) ||
		    json_object_get_type(t) != json_type_string ||
		    strcmp(json_object_get_string(t), "text") ||
		    !json_object_object_get_ex(p, "text", &x) ||
		    json_object_get_type(x) != json_type_string)
			return INVALID(e, name, "%s[%zu]: only {\"type\": \"text\", \"text\": ...} "
				       "parts are supported", name, i);
		total += (size_t)json_object_get_string_len(x);
	}
	char *s = malloc(total + 1);
	if (!s)
		return oa_error(e, 500, "server_error", NULL, NULL, "out of memory");
	size_t at = 0;
	for (size_t i = 0; i < n; i++) {
		struct json_object *x;
		json_object_object_get_ex(json_object_array_get_idx(c, i), "text", &x);
		size_t l = (size_t)json_object_get_string_len(x);
		memcpy(s + at, json_object_get_string(x), l);
		at += l;
	}
	s[at] = '\0';
	if (strlen(s) != at) {
		free(s);
		return INVALID(e, name, "%s: contains a NUL character", name);
	}
	*out = s;
	return 0;
}

static int parse_messages(struct json_object *v, struct oa_req *r, struct oa_err *e)
{
	if (json_object_get_type(v) != json_type_array || !json_object_array_length(v))
		return INVALID(e, "messages", "messages: expected a non-empty list of messages");
	size_t n = json_object_array_length(v);
	if (n > 4096)
		return INVALID(e, "messages", "messages: at most 4096 messages");
	if (!(r->msgs = calloc(n, sizeof *r->msgs)))
		return oa_error(e, 500, "server_error", NULL, NULL, "out of memory");
	for (size_t i = 0; i < n; i++) {
		struct json_object *m = json_object_array_get_idx(v, i), *role, *content;
		char name[48];
		snprintf(name, sizeof name, "messages[%zu]", i);
		if (json_object_get_type(m) != json_type_object)
			return INVALID(e, name, "%s: expected an object", name);
		json_object_object_foreach(m, key, val) {
			(void)val;
			if (strcmp(key, "role") && strcmp(key, "content") && strcmp(key, "name"))
				return INVALID(e, name, "%s: unsupported field '%s'", name, key);
		}
		if (!json_object_object_get_ex(m, "role", &role) ||
		    json_object_get_type(role) != json_type_string)
			return INVALID(e, name, "%s.role: required, a string", name);
		if (!json_object_object_get_ex(m, "content", &content) || is_null(content))
			return INVALID(e, name, "%s.content: required", name);
		int ret = dup_str(role, name, (char **)&r->msgs[i].role, e);
		if (!ret)
			ret = parse_content(content, (int)i, (char **)&r->msgs[i].content, e);
		r->n_msgs = (int)i + 1;
		if (ret)
			return ret;
	}
	return 0;
}

/* Parameters of the API kvgate accepts only at their neutral value. */
static int neutral(const char *key, struct json_object *v, struct oa_err *e)
{
	enum json_type t = json_object_get_type(v);
	bool ok;
	if (!strcmp(key, "echo") || !strcmp(key, "store"))
		ok = t == json_type_boolean && !json_object_get_boolean(v);
	else if (!strcmp(key, "logprobs"))
		ok = (t == json_type_boolean && !json_object_get_boolean(v)) ||
		     (t == json_type_int && json_object_get_int64(v) == 0);
	else if (!strcmp(key, "presence_penalty") || !strcmp(key, "frequency_penalty"))
		ok = is_number(v) && json_object_get_double(v) == 0.0;
	else if (!strcmp(key, "best_of"))
		ok = t == json_type_int && json_object_get_int64(v) == 1;
	else if (!strcmp(key, "logit_bias") || !strcmp(key, "metadata"))
		ok = t == json_type_object && (!strcmp(key, "metadata") ||
					       json_object_object_length(v) == 0);
	else if (!strcmp(key, "tools"))
		ok = t == json_type_array && json_object_array_length(v) == 0;
	else if (!strcmp(key, "tool_choice"))
		ok = t == json_type_string && !strcmp(json_object_get_string(v), "none");
	else if (!strcmp(key, "response_format")) {
		struct json_object *ty;
		ok = t == json_type_object && json_object_object_get_ex(v, "type", &ty) &&
		     json_object_get_type(ty) == json_type_string &&
		     !strcmp(json_object_get_string(ty), "text");
	} else if (!strcmp(key, "parallel_tool_calls"))
		ok = t == json_type_boolean;
	else if (!strcmp(key, "user"))
		ok = t == json_type_string;
	else
		return -ENOENT;
	if (ok)
		return 0;
	return INVALID(e, key, "%s: %s is not supported by this server", key,
		       json_object_to_json_string(v));
}

static int field(enum oa_kind kind, const char *key, struct json_object *v, struct oa_req *r,
		 struct oa_err *e, bool *has_prompt)
{
	long long x;
	int ret;
	if (is_null(v) && strcmp(key, "model") && strcmp(key, "prompt") && strcmp(key, "messages"))
		return 0; /* null is "not given" for an optional parameter */
	if (!strcmp(key, "model"))
		return dup_str(v, key, &r->model, e);
	if (!strcmp(key, "cache_salt"))
		return dup_str(v, key, &r->cache_salt, e);
	if (kind == OA_COMPLETION && !strcmp(key, "prompt")) {
		*has_prompt = true;
		return parse_prompt(v, r, e);
	}
	if (kind == OA_CHAT && !strcmp(key, "messages")) {
		*has_prompt = true;
		return parse_messages(v, r, e);
	}
	if (!strcmp(key, "max_tokens") || (kind == OA_CHAT && !strcmp(key, "max_completion_tokens"))) {
		if ((ret = get_int(v, key, 1, 1 << 30, &x, e)))
			return ret;
		r->has_max_tokens = true;
		r->max_tokens = (uint32_t)x;
		return 0;
	}
	if (!strcmp(key, "temperature"))
		return get_num(v, key, 0.0, 2.0, &r->temperature, e);
	if (!strcmp(key, "top_p"))
		return get_num(v, key, 0.0, 1.0, &r->top_p, e);
	if (!strcmp(key, "n")) {
		if ((ret = get_int(v, key, 1, 128, &x, e)))
			return ret;
		return x == 1 ? 0 : INVALID(e, key, "n: only n = 1 is supported");
	}
	if (!strcmp(key, "seed")) {
		if ((ret = get_int(v, key, INT64_MIN, INT64_MAX, &x, e)))
			return ret;
		r->has_seed = true;
		r->seed = (uint64_t)x;
		return 0;
	}
	if (!strcmp(key, "stream"))
		return get_bool(v, key, &r->stream, e);
	if (!strcmp(key, "stream_options")) {
		if (json_object_get_type(v) != json_type_object)
			return INVALID(e, key, "stream_options: expected an object");
		json_object_object_foreach(v, k2, v2) {
			if (strcmp(k2, "include_usage"))
				return INVALID(e, key, "stream_options: unknown field '%s'", k2);
			if ((ret = get_bool(v2, "stream_options.include_usage", &r->include_usage, e)))
				return ret;
		}
		return 0;
	}
	if (!strcmp(key, "stop"))
		return parse_stop(v, r, e);
	if (kind == OA_COMPLETION && !strcmp(key, "suffix"))
		return INVALID(e, key, "suffix: not supported by this server");
	if (kind == OA_CHAT && !strcmp(key, "top_logprobs"))
		return INVALID(e, key, "top_logprobs: not supported by this server");
	ret = neutral(key, v, e);
	if (ret != -ENOENT)
		return ret;
	return INVALID(e, key, "Unrecognized request argument supplied: %s", key);
}

int oa_parse(enum oa_kind kind, const char *body, size_t len, struct oa_req *r, struct oa_err *e)
{
	memset(r, 0, sizeof *r);
	r->kind = kind;
	r->temperature = 1.0f; /* the API's defaults */
	r->top_p = 1.0f;
	struct json_tokener *tk = json_tokener_new();
	if (!tk)
		return oa_error(e, 500, "server_error", NULL, NULL, "out of memory");
	json_tokener_set_flags(tk, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
	struct json_object *root = len ? json_tokener_parse_ex(tk, body, (int)len) : NULL;
	enum json_tokener_error jerr = len ? json_tokener_get_error(tk) : json_tokener_continue;
	size_t used = len ? json_tokener_get_parse_end(tk) : 0;
	json_tokener_free(tk);
	int ret;
	if (!root || jerr != json_tokener_success) {
		ret = INVALID(e, NULL, "We could not parse the JSON body of your request: %s",
			      jerr == json_tokener_continue ? "the body ended too early"
							   : json_tokener_error_desc(jerr));
		json_object_put(root);
		return ret;
	}
	for (; used < len; used++)
		if (!strchr(" \t\r\n", body[used])) {
			json_object_put(root);
			return INVALID(e, NULL, "We could not parse the JSON body of your request: "
				       "text after the JSON value");
		}
	if (json_object_get_type(root) != json_type_object) {
		json_object_put(root);
		return INVALID(e, NULL, "The request body must be a JSON object");
	}
	bool has_prompt = false;
	ret = 0;
	json_object_object_foreach(root, key, val) {
		if ((ret = field(kind, key, val, r, e, &has_prompt)))
			break;
	}
	if (!ret && !r->model)
		ret = INVALID(e, "model", "you must provide a model parameter");
	if (!ret && !has_prompt)
		ret = INVALID(e, kind == OA_CHAT ? "messages" : "prompt", "%s: required",
			      kind == OA_CHAT ? "messages" : "prompt");
	if (!ret && r->include_usage && !r->stream)
		ret = INVALID(e, "stream_options", "stream_options: only with stream: true");
	json_object_put(root);
	if (ret)
		oa_req_free(r);
	return ret;
}

/* ---------------------------------------------------------------- rendering */

static char *dump(struct json_object *o)
{
	const char *s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
							   JSON_C_TO_STRING_NOSLASHESCAPE);
	char *d = s ? strdup(s) : NULL;
	json_object_put(o);
	return d;
}

char *oa_error_json(const struct oa_err *e)
{
	struct json_object *o = json_object_new_object(), *er = json_object_new_object();
	json_object_object_add(er, "message", json_object_new_string(e->message));
	json_object_object_add(er, "type", json_object_new_string(e->type));
	json_object_object_add(er, "param", e->param[0] ? json_object_new_string(e->param) : NULL);
	json_object_object_add(er, "code", e->code ? json_object_new_string(e->code) : NULL);
	json_object_object_add(o, "error", er);
	return dump(o);
}

static struct json_object *head(enum oa_kind kind, const struct oa_out *o, bool chunk)
{
	struct json_object *r = json_object_new_object();
	json_object_object_add(r, "id", json_object_new_string(o->id));
	json_object_object_add(r, "object", json_object_new_string(
		kind == OA_COMPLETION ? "text_completion" :
		chunk ? "chat.completion.chunk" : "chat.completion"));
	json_object_object_add(r, "created", json_object_new_int64(o->created));
	json_object_object_add(r, "model", json_object_new_string(o->model));
	json_object_object_add(r, "system_fingerprint", NULL);
	return r;
}

static struct json_object *usage(uint32_t p, uint32_t c, uint32_t cached)
{
	struct json_object *u = json_object_new_object(), *d = json_object_new_object();
	json_object_object_add(u, "prompt_tokens", json_object_new_int64(p));
	json_object_object_add(u, "completion_tokens", json_object_new_int64(c));
	json_object_object_add(u, "total_tokens", json_object_new_int64((int64_t)p + c));
	/* Prompt tokens whose K/V kvstored already held (prefix sharing): not run again. */
	json_object_object_add(d, "cached_tokens", json_object_new_int64(cached));
	json_object_object_add(u, "prompt_tokens_details", d);
	return u;
}

static struct json_object *str_or_null(const char *s)
{
	return s ? json_object_new_string(s) : NULL;
}

char *oa_completion_json(enum oa_kind kind, const struct oa_out *o, const char *text,
			 const char *finish, uint32_t prompt_tokens, uint32_t completion_tokens)
{
	struct json_object *r = head(kind, o, false), *ch = json_object_new_array(),
			   *c = json_object_new_object();
	json_object_object_add(c, "index", json_object_new_int(0));
	if (kind == OA_COMPLETION) {
		json_object_object_add(c, "text", json_object_new_string(text));
	} else {
		struct json_object *m = json_object_new_object();
		json_object_object_add(m, "role", json_object_new_string("assistant"));
		json_object_object_add(m, "content", json_object_new_string(text));
		json_object_object_add(m, "refusal", NULL);
		json_object_object_add(c, "message", m);
	}
	json_object_object_add(c, "logprobs", NULL);
	json_object_object_add(c, "finish_reason", str_or_null(finish));
	json_object_array_add(ch, c);
	json_object_object_add(r, "choices", ch);
	json_object_object_add(r, "usage", usage(prompt_tokens, completion_tokens, o->cached_tokens));
	return dump(r);
}

char *oa_chunk_json(enum oa_kind kind, const struct oa_out *o, const char *text, bool first,
		    const char *finish)
{
	struct json_object *r = head(kind, o, true), *ch = json_object_new_array(),
			   *c = json_object_new_object();
	json_object_object_add(c, "index", json_object_new_int(0));
	if (kind == OA_COMPLETION) {
		json_object_object_add(c, "text", json_object_new_string(text ? text : ""));
	} else {
		struct json_object *d = json_object_new_object();
		if (first)
			json_object_object_add(d, "role", json_object_new_string("assistant"));
		if (text || first)
			json_object_object_add(d, "content", json_object_new_string(text ? text : ""));
		json_object_object_add(c, "delta", d);
	}
	json_object_object_add(c, "logprobs", NULL);
	json_object_object_add(c, "finish_reason", str_or_null(finish));
	json_object_array_add(ch, c);
	json_object_object_add(r, "choices", ch);
	return dump(r);
}

char *oa_usage_chunk_json(enum oa_kind kind, const struct oa_out *o, uint32_t prompt_tokens,
			  uint32_t completion_tokens)
{
	struct json_object *r = head(kind, o, true);
	json_object_object_add(r, "choices", json_object_new_array());
	json_object_object_add(r, "usage", usage(prompt_tokens, completion_tokens, o->cached_tokens));
	return dump(r);
}
