/* openai — the OpenAI API's request and response shapes for kvgate (docs/design.md §6):
 * POST /v1/completions and /v1/chat/completions bodies are parsed and checked here into a
 * struct oa_req; completion objects, streaming chunks (`text_completion`,
 * `chat.completion.chunk`) and error objects ({"error": {message, type, param, code}}) are
 * rendered here. No I/O: gate_api.c moves the bytes.
 *
 * What is accepted: model, prompt (a string, one string in a list, or a list of token ids) or
 * messages (string content, or a list of text parts), max_tokens (max_completion_tokens for
 * chat), temperature, top_p, seed, stop (a string or up to 4), n = 1, stream, stream_options
 * {include_usage}, user. Parameters of the API that kvgate does not implement are accepted only
 * at their neutral value (echo false, logprobs off, penalties 0, best_of 1, empty logit_bias,
 * no tools, response_format text); any other name is refused as the API refuses it,
 * "Unrecognized request argument supplied: NAME".
 *
 * Ownership: oa_parse fills a caller-owned struct oa_req whose strings it allocates;
 * oa_req_free releases them. Render functions return malloc'd NUL-terminated JSON. */
#ifndef FREEKV_OPENAI_H
#define FREEKV_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chat_template.h"

#define OA_MAX_STOP 4

enum oa_kind { OA_COMPLETION, OA_CHAT };

/* An error as the API reports it: HTTP status and the error object's fields. */
struct oa_err {
	int http;
	const char *type;	/* invalid_request_error, not_found_error, rate_limit_error, ... */
	const char *code;	/* NULL or e.g. model_not_found, context_length_exceeded */
	char param[64];		/* empty: null */
	char message[512];
};

struct oa_req {
	enum oa_kind kind;
	char *model;
	char *prompt;			/* completions with a text prompt */
	int32_t *ids;			/* completions with a token-id prompt */
	int n_ids;
	struct chat_msg *msgs;		/* chat; role and content strings owned */
	int n_msgs;
	bool stream, include_usage;
	bool has_max_tokens;
	uint32_t max_tokens;
	float temperature, top_p;
	bool has_seed;
	uint64_t seed;
	char *cache_salt;		/* prefix-sharing namespace (docs/design.md §4) */
	char *stop[OA_MAX_STOP];
	int n_stop;
};

/* Fills e (and returns its status) for the common errors. */
int oa_error(struct oa_err *e, int http, const char *type, const char *code, const char *param,
	     const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* 0, or an HTTP status (400; 413 is the caller's) with e filled. */
int oa_parse(enum oa_kind kind, const char *body, size_t len, struct oa_req *r, struct oa_err *e);
void oa_req_free(struct oa_req *r);

/* {"error": {...}} */
char *oa_error_json(const struct oa_err *e);

/* What a finished (or streaming) completion says about itself. */
struct oa_out {
	const char *id;		/* cmpl-... or chatcmpl-... */
	const char *model;
	long long created;	/* Unix seconds */
	uint32_t cached_tokens;	/* usage.prompt_tokens_details.cached_tokens */
};

/* The non-streamed response: one choice, finish_reason "stop" or "length", usage. */
char *oa_completion_json(enum oa_kind kind, const struct oa_out *o, const char *text,
			 const char *finish, uint32_t prompt_tokens, uint32_t completion_tokens);
/* One streamed chunk. text NULL: no content (chat: the opening chunk carries the role when
 * first is true); finish NULL: finish_reason null. */
char *oa_chunk_json(enum oa_kind kind, const struct oa_out *o, const char *text, bool first,
		    const char *finish);
/* The stream's last chunk when stream_options.include_usage: empty choices and usage. */
char *oa_usage_chunk_json(enum oa_kind kind, const struct oa_out *o, uint32_t prompt_tokens,
			  uint32_t completion_tokens);

#endif
