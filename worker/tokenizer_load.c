/* tokenizer_load — builds a tokenizer from a GGUF vocabulary or a Hugging Face tokenizer.json
 * (plus tokenizer_config.json / config.json beside it). Everything unsupported is refused with
 * a message naming the field, so a model never runs with a silently wrong tokenizer. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <json-c/json.h>

#include "gguf.h"
#include "model.h"
#include "tokenizer_impl.h"

#define MAX_VOCAB (1 << 24)

static const char META[] = "\xE2\x96\x81"; /* U+2581 */

/* ---- GGUF ---- */

static int add_norm(struct fkv_tokenizer *t, bool prepend, const char *pat, const char *with,
		    char *err, size_t errlen)
{
	if (t->n_norm == TOK_MAX_NORM || strlen(pat) >= TOK_MAX_PAT || strlen(with) >= TOK_MAX_PAT) {
		snprintf(err, errlen, "normalizer: too many steps or pattern too long");
		return -ENOTSUP;
	}
	struct tok_norm *n = &t->norm[t->n_norm++];
	memset(n, 0, sizeof *n);
	n->prepend = prepend;
	strcpy(n->pat, pat);
	strcpy(n->with, with);
	return 0;
}

static int gguf_id(const struct gguf_ctx *g, const char *key, int n_vocab, int *out, char *err,
		   size_t errlen)
{
	uint32_t v;
	int rc = gguf_get_u32(g, key, &v);
	if (rc == -ENOENT)
		return 0;
	if (rc || v >= (uint32_t)n_vocab) {
		snprintf(err, errlen, "%s: %s", key, rc ? "not an integer" : "out of range");
		return -EINVAL;
	}
	*out = (int)v;
	return 0;
}

static int gguf_merges(struct fkv_tokenizer *t, const struct gguf_ctx *g, char *err,
		       size_t errlen)
{
	struct gguf_arr a;
	int rc = gguf_get_arr(g, "tokenizer.ggml.merges", &a);
	if (rc || a.type != GGUF_TYPE_STRING || a.n > INT_MAX) {
		snprintf(err, errlen, "tokenizer.ggml.merges: %s",
			 rc == -ENOENT ? "missing (needed by a gpt2 vocabulary)" : "not a string array");
		return rc == -ENOENT ? -ENOENT : -EINVAL;
	}
	char buf[1024];
	for (uint64_t i = 0; i < a.n; i++) {
		const struct gguf_str *m = &a.strs[i];
		const char *sp = m->len < sizeof buf ? memchr(m->s, ' ', m->len) : NULL;
		if (!sp) {
			snprintf(err, errlen, "tokenizer.ggml.merges[%llu]: not \"left right\"",
				 (unsigned long long)i);
			return -EINVAL;
		}
		size_t ll = (size_t)(sp - m->s), rl = m->len - ll - 1;
		memcpy(buf, m->s, ll);
		memcpy(buf + ll, sp + 1, rl);
		int l = tokenizer_lookup(t, m->s, ll), r = tokenizer_lookup(t, sp + 1, rl);
		int mid = tokenizer_lookup(t, buf, ll + rl);
		if (l < 0 || r < 0 || mid < 0) {
			snprintf(err, errlen, "tokenizer.ggml.merges[%llu]: a token is not in the vocabulary",
				 (unsigned long long)i);
			return -EINVAL;
		}
		rc = tokenizer_add_merge(t, l, r, mid, (int)a.n);
		if (rc && rc != -EEXIST)
			return rc;
	}
	return 0;
}

int tokenizer_load_gguf(const struct gguf_ctx *g, struct fkv_tokenizer **out, char *err,
			size_t errlen)
{
	*out = NULL;
	const char *model;
	int rc = gguf_get_str(g, "tokenizer.ggml.model", &model, NULL);
	if (rc) {
		snprintf(err, errlen, "tokenizer.ggml.model: %s", rc == -ENOENT ? "missing" : "not a string");
		return rc == -ENOENT ? -ENOENT : -EINVAL;
	}
	bool spm = !strcmp(model, "llama");
	if (!spm && strcmp(model, "gpt2") != 0) {
		snprintf(err, errlen, "tokenizer.ggml.model \"%s\" is not supported (llama, gpt2)", model);
		return -ENOTSUP;
	}
	struct gguf_arr toks, scores = { 0 }, types = { 0 };
	rc = gguf_get_arr(g, "tokenizer.ggml.tokens", &toks);
	if (rc || toks.type != GGUF_TYPE_STRING || toks.n == 0 || toks.n > MAX_VOCAB) {
		snprintf(err, errlen, "tokenizer.ggml.tokens: %s",
			 rc == -ENOENT ? "missing" : "not a string array of 1..2^24 tokens");
		return rc == -ENOENT ? -ENOENT : -EINVAL;
	}
	int n = (int)toks.n;
	bool has_scores = gguf_get_arr(g, "tokenizer.ggml.scores", &scores) == 0;
	bool has_types = gguf_get_arr(g, "tokenizer.ggml.token_type", &types) == 0;
	if ((has_scores && scores.n != toks.n) || (has_types && types.n != toks.n)) {
		snprintf(err, errlen, "tokenizer.ggml.%s: %llu entries for %d tokens",
			 has_scores && scores.n != toks.n ? "scores" : "token_type",
			 (unsigned long long)(has_scores && scores.n != toks.n ? scores.n : types.n), n);
		return -EINVAL;
	}
	if (spm && !has_scores) {
		snprintf(err, errlen, "tokenizer.ggml.scores: missing (needed by a llama vocabulary)");
		return -ENOENT;
	}
	struct fkv_tokenizer *t = tokenizer_alloc(n);
	if (!t)
		return -ENOMEM;
	for (int i = 0; i < n && rc == 0; i++) {
		float score = 0;
		int64_t type = TOKT_NORMAL;
		if ((has_scores && gguf_arr_f32(&scores, (uint64_t)i, &score)) ||
		    (has_types && gguf_arr_int(&types, (uint64_t)i, &type)) ||
		    type < TOKT_NORMAL || type > TOKT_BYTE) {
			snprintf(err, errlen, "tokenizer.ggml.scores/token_type[%d]: invalid", i);
			rc = -EINVAL;
			break;
		}
		rc = tokenizer_set_token(t, i, toks.strs[i].s, toks.strs[i].len, score,
					 (enum tok_type)type);
		if (type == TOKT_UNKNOWN && t->unk < 0)
			t->unk = i;
	}
	if (rc == 0)
		rc = tokenizer_index_vocab(t);
	if (rc == 0)
		rc = gguf_id(g, "tokenizer.ggml.unknown_token_id", n, &t->unk, err, errlen);
	if (rc == 0)
		rc = gguf_id(g, "tokenizer.ggml.bos_token_id", n, &t->bos, err, errlen);
	if (rc == 0)
		rc = gguf_id(g, "tokenizer.ggml.eos_token_id", n, &t->eos, err, errlen);
	t->add_bos = spm;
	int ab = rc ? 0 : gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos);
	bool has_add_bos = ab == 0;
	if (ab == -EINVAL) {
		snprintf(err, errlen, "tokenizer.ggml.add_bos_token: not a bool");
		rc = -EINVAL;
	}
	if (rc == 0 && spm) {
		bool space = true;
		if (gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &space) == -EINVAL) {
			snprintf(err, errlen, "tokenizer.ggml.add_space_prefix: not a bool");
			rc = -EINVAL;
		}
		t->merge = TOK_MERGE_SCORE;
		t->byte_fallback = true;
		t->dec_byte_fallback = true;
		strcpy(t->dec_pat, META);
		strcpy(t->dec_with, " ");
		t->dec_strip = space ? 1 : 0;
		if (rc == 0 && space)
			rc = add_norm(t, true, "", META, err, errlen);
		if (rc == 0)
			rc = add_norm(t, false, " ", META, err, errlen);
	} else if (rc == 0) {
		/* As in llama.cpp, a vocabulary without the key gets the "default" pre-tokenizer. */
		const char *pre = "default";
		struct pretok_gguf_flags fl;
		if (gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL) == -EINVAL) {
			snprintf(err, errlen, "tokenizer.ggml.pre: not a string");
			rc = -EINVAL;
		}
		if (rc == 0)
			rc = pretok_from_gguf(&t->pre, pre, &fl, err, errlen);
		if (rc == 0) {
			t->merge = TOK_MERGE_RANK;
			t->byte_level = true;
			t->dec_bytes = true;
			t->ignore_merges = fl.ignore_merges;
			if (!has_add_bos)
				t->add_bos = fl.add_bos;
		}
		if (rc == 0)
			rc = gguf_merges(t, g, err, errlen);
	}
	if (rc == 0)
		rc = tokenizer_finish(t);
	if (rc) {
		if (rc == -ENOMEM)
			snprintf(err, errlen, "tokenizer: out of memory");
		tokenizer_free(t);
		return rc;
	}
	*out = t;
	return 0;
}

/* ---- tokenizer.json ---- */

static json_object *jget(json_object *o, const char *key)
{
	json_object *v = NULL;
	if (o && json_object_is_type(o, json_type_object))
		json_object_object_get_ex(o, key, &v);
	return v;
}

/* Element i of o when o is an array that long; NULL otherwise (json-c asserts on non-arrays). */
static json_object *jidx(json_object *o, size_t i)
{
	if (!o || !json_object_is_type(o, json_type_array) || i >= json_object_array_length(o))
		return NULL;
	return json_object_array_get_idx(o, i);
}

static const char *jstr(json_object *o, const char *key)
{
	json_object *v = jget(o, key);
	return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

static bool jbool(json_object *o, const char *key, bool dflt)
{
	json_object *v = jget(o, key);
	return v && json_object_is_type(v, json_type_boolean) ? json_object_get_boolean(v) : dflt;
}

/* Id of the token whose text is s (any type), or -1. */
static int find_text(const struct fkv_tokenizer *t, const char *s)
{
	size_t n = strlen(s);
	for (int id = 0; id < t->n_vocab; id++)
		if (t->len[id] == n && !memcmp(t->pool + t->off[id], s, n))
			return id;
	return -1;
}

/* Walks a component or a Sequence of them (its list under seq_key), calling fn on each. */
typedef int (*component_fn)(struct fkv_tokenizer *t, json_object *c, const char *type, char *err,
			    size_t errlen);

static int walk(struct fkv_tokenizer *t, json_object *c, const char *what, const char *seq_key,
		component_fn fn, char *err, size_t errlen)
{
	if (!c || json_object_is_type(c, json_type_null))
		return 0;
	const char *type = jstr(c, "type");
	if (!type) {
		snprintf(err, errlen, "%s: no \"type\"", what);
		return -EINVAL;
	}
	if (!strcmp(type, "Sequence")) {
		json_object *list = jget(c, seq_key);
		if (!list || !json_object_is_type(list, json_type_array)) {
			snprintf(err, errlen, "%s: Sequence without \"%s\"", what, seq_key);
			return -EINVAL;
		}
		for (size_t i = 0; i < json_object_array_length(list); i++) {
			int rc = walk(t, json_object_array_get_idx(list, i), what, seq_key, fn, err, errlen);
			if (rc)
				return rc;
		}
		return 0;
	}
	if (errlen > 0)
		err[0] = '\0';
	int rc = fn(t, c, type, err, errlen);
	if (rc == -ENOTSUP && errlen > 0 && !err[0])
		snprintf(err, errlen, "%s: type \"%s\" (or its options) is not supported", what, type);
	return rc;
}

static int copy_pat(char *dst, const char *src, char *err, size_t errlen)
{
	if (!src || strlen(src) >= TOK_MAX_PAT) {
		snprintf(err, errlen, "pattern missing or longer than %d bytes", TOK_MAX_PAT - 1);
		return -EINVAL;
	}
	strcpy(dst, src);
	return 0;
}

static int on_normalizer(struct fkv_tokenizer *t, json_object *c, const char *type, char *err,
			 size_t errlen)
{
	if (!strcmp(type, "NFC")) {
		int rc = add_norm(t, false, "", "", err, errlen);
		if (rc == 0)
			t->norm[t->n_norm - 1].nfc = true;
		return rc;
	}
	if (!strcmp(type, "Prepend")) {
		const char *p = jstr(c, "prepend");
		return p ? add_norm(t, true, "", p, err, errlen) : -ENOTSUP;
	}
	if (!strcmp(type, "Replace")) {
		const char *pat = jstr(jget(c, "pattern"), "String"), *with = jstr(c, "content");
		return pat && with && *pat ? add_norm(t, false, pat, with, err, errlen) : -ENOTSUP;
	}
	return -ENOTSUP;
}

static const struct {
	const char *name;
	enum pretok_behavior b;
} split_behaviors[] = {
	{ "Isolated", PRETOK_ISOLATED },
	{ "Removed", PRETOK_REMOVED },
	{ "MergedWithPrevious", PRETOK_MERGED_PREV },
	{ "MergedWithNext", PRETOK_MERGED_NEXT },
	{ "Contiguous", PRETOK_CONTIGUOUS },
};

static int split(struct fkv_tokenizer *t, json_object *c, char *err, size_t errlen)
{
	json_object *pat = jget(c, "pattern");
	const char *re = jstr(pat, "Regex"), *lit = jstr(pat, "String");
	const char *behavior = jstr(c, "behavior");
	size_t k = 0, nb = sizeof split_behaviors / sizeof split_behaviors[0];
	while (behavior && k < nb && strcmp(split_behaviors[k].name, behavior) != 0)
		k++;
	if (!re && !lit) {
		snprintf(err, errlen, "pre_tokenizer: Split needs pattern {\"Regex\": ...} or "
			 "{\"String\": ...}");
		return -EINVAL;
	}
	if (!behavior || k == nb) {
		snprintf(err, errlen, "pre_tokenizer: Split behavior \"%s\" is not supported (Isolated, "
			 "Removed, MergedWithPrevious, MergedWithNext, Contiguous)",
			 behavior ? behavior : "(none)");
		return -ENOTSUP;
	}
	bool invert = jbool(c, "invert", false);
	if (re)
		return pretok_add_regex(&t->pre, re, split_behaviors[k].b, invert, err, errlen);
	return pretok_add_literal(&t->pre, lit, split_behaviors[k].b, invert, err, errlen);
}

static int on_pre_tokenizer(struct fkv_tokenizer *t, json_object *c, const char *type, char *err,
			    size_t errlen)
{
	/* HF maps bytes to the GPT-2 alphabet inside ByteLevel: a later step would cut that text. */
	if (t->byte_level) {
		snprintf(err, errlen, "pre_tokenizer: \"%s\" after ByteLevel is not supported", type);
		return -ENOTSUP;
	}
	if (!strcmp(type, "Metaspace")) {
		const char *rep = jstr(c, "replacement");
		const char *scheme = jstr(c, "prepend_scheme");
		if (!scheme) /* before tokenizers 0.19 */
			scheme = jbool(c, "add_prefix_space", true) ? "always" : "never";
		return pretok_add_metaspace(&t->pre, rep ? rep : META, scheme, jbool(c, "split", true), err,
					    errlen);
	}
	if (!strcmp(type, "ByteLevel")) {
		t->byte_level = true;
		return pretok_add_bytelevel(&t->pre, jbool(c, "add_prefix_space", false),
					    jbool(c, "use_regex", true), err, errlen);
	}
	if (!strcmp(type, "Digits"))
		return pretok_add_digits(&t->pre, jbool(c, "individual_digits", false), err, errlen);
	if (!strcmp(type, "Split"))
		return split(t, c, err, errlen);
	return -ENOTSUP;
}

static int on_decoder(struct fkv_tokenizer *t, json_object *c, const char *type, char *err,
		      size_t errlen)
{
	if (!strcmp(type, "ByteLevel")) {
		t->dec_bytes = true;
		return 0;
	}
	if (!strcmp(type, "ByteFallback")) {
		t->dec_byte_fallback = true;
		return 0;
	}
	if (!strcmp(type, "Fuse"))
		return 0;
	if (!strcmp(type, "Replace")) {
		const char *pat = jstr(jget(c, "pattern"), "String"), *with = jstr(c, "content");
		if (!pat || !with || t->dec_pat[0])
			return -ENOTSUP;
		int rc = copy_pat(t->dec_pat, pat, err, errlen);
		return rc ? rc : copy_pat(t->dec_with, with, err, errlen);
	}
	if (!strcmp(type, "Strip")) {
		const char *content = jstr(c, "content");
		json_object *start = jget(c, "start"), *stop = jget(c, "stop");
		if (!content || strcmp(content, " ") != 0 || !start || json_object_get_int(stop) != 0)
			return -ENOTSUP;
		t->dec_strip = json_object_get_int(start);
		return 0;
	}
	if (!strcmp(type, "Metaspace")) {
		const char *scheme = jstr(c, "prepend_scheme"), *rep = jstr(c, "replacement");
		bool prefix = scheme ? strcmp(scheme, "never") != 0 : jbool(c, "add_prefix_space", true);
		int rc = copy_pat(t->dec_pat, rep ? rep : META, err, errlen);
		if (rc)
			return rc;
		strcpy(t->dec_with, " ");
		t->dec_strip = prefix ? 1 : 0;
		t->dec_byte_fallback = true;
		return 0;
	}
	return -ENOTSUP;
}

/* Reads merges given as "left right" strings or ["left", "right"] pairs. */
static int json_merges(struct fkv_tokenizer *t, json_object *merges, char *err, size_t errlen)
{
	size_t n = json_object_array_length(merges);
	if (n > INT_MAX / 2) {
		snprintf(err, errlen, "model.merges: too many");
		return -EINVAL;
	}
	char buf[1024];
	for (size_t i = 0; i < n; i++) {
		json_object *m = json_object_array_get_idx(merges, i);
		const char *l = NULL, *r = NULL;
		size_t ll = 0, rl = 0;
		if (json_object_is_type(m, json_type_string)) {
			l = json_object_get_string(m);
			r = strchr(l, ' ');
			if (r && !strchr(r + 1, ' ')) {
				ll = (size_t)(r - l);
				r++;
				rl = strlen(r);
			} else {
				r = NULL;
			}
		} else if (json_object_is_type(m, json_type_array) && json_object_array_length(m) == 2) {
			json_object *a = json_object_array_get_idx(m, 0), *b = json_object_array_get_idx(m, 1);
			if (json_object_is_type(a, json_type_string) && json_object_is_type(b, json_type_string)) {
				l = json_object_get_string(a);
				r = json_object_get_string(b);
				ll = (size_t)json_object_get_string_len(a);
				rl = (size_t)json_object_get_string_len(b);
			}
		}
		if (!l || !r || ll + rl > sizeof buf) {
			snprintf(err, errlen, "model.merges[%zu]: not \"left right\" or [\"left\", \"right\"]", i);
			return -EINVAL;
		}
		memcpy(buf, l, ll);
		memcpy(buf + ll, r, rl);
		int li = tokenizer_lookup(t, l, ll), ri = tokenizer_lookup(t, r, rl);
		int mi = tokenizer_lookup(t, buf, ll + rl);
		if (li < 0 || ri < 0 || mi < 0) {
			snprintf(err, errlen, "model.merges[%zu]: \"%.*s\" + \"%.*s\": %s not in model.vocab",
				 i, (int)ll, l, (int)rl, r, li < 0 || ri < 0 ? "a part is" : "the merged token is");
			return -EINVAL;
		}
		int rc = tokenizer_add_merge(t, li, ri, mi, (int)n);
		if (rc && rc != -EEXIST)
			return rc;
	}
	return 0;
}

/* Highest id in model.vocab and added_tokens, validating both. */
static int json_max_id(json_object *vocab, json_object *added, int *max_id, char *err,
		       size_t errlen)
{
	*max_id = -1;
	json_object_object_foreach(vocab, key, val)
	{
		int64_t id = json_object_get_int64(val);
		if (!json_object_is_type(val, json_type_int) || id < 0 || id >= MAX_VOCAB) {
			snprintf(err, errlen, "model.vocab[\"%s\"]: id not an integer in [0, 2^24)", key);
			return -EINVAL;
		}
		if (id > *max_id)
			*max_id = (int)id;
	}
	for (size_t i = 0; added && i < json_object_array_length(added); i++) {
		json_object *a = json_object_array_get_idx(added, i), *idv = jget(a, "id");
		int64_t id = json_object_get_int64(idv);
		if (!idv || !json_object_is_type(idv, json_type_int) || id < 0 || id >= MAX_VOCAB ||
		    !jstr(a, "content")) {
			snprintf(err, errlen, "added_tokens[%zu]: needs an integer id in [0, 2^24) and a content", i);
			return -EINVAL;
		}
		if (id > *max_id)
			*max_id = (int)id;
	}
	if (*max_id < 0) {
		snprintf(err, errlen, "model.vocab: empty");
		return -EINVAL;
	}
	return 0;
}

/* The token text a tokenizer_config.json entry names: a string or {"content": ...}. */
static const char *config_token(json_object *cfg, const char *key)
{
	json_object *v = jget(cfg, key);
	if (v && json_object_is_type(v, json_type_string))
		return json_object_get_string(v);
	return jstr(v, "content");
}

/* Parses dir/name into *out when the file exists (*out stays NULL when it does not). */
static int read_side_file(const char *dir, const char *name, json_object **out, char *err,
			  size_t errlen)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	*out = NULL;
	if (access(path, F_OK) != 0)
		return 0;
	*out = json_object_from_file(path);
	if (!*out || !json_object_is_type(*out, json_type_object)) {
		snprintf(err, errlen, "%s: not a valid JSON object", name);
		json_object_put(*out);
		*out = NULL;
		return -EINVAL;
	}
	return 0;
}

/* BOS/EOS and whether BOS is added, from tokenizer_config.json, config.json and the
 * post-processor template, in that order of precedence. */
static int json_specials(struct fkv_tokenizer *t, json_object *root, const char *dir, char *err,
			 size_t errlen)
{
	json_object *tc = NULL, *mc = NULL;
	int rc = read_side_file(dir, "tokenizer_config.json", &tc, err, errlen);
	if (rc == 0)
		rc = read_side_file(dir, "config.json", &mc, err, errlen);
	if (rc) {
		json_object_put(tc);
		return rc;
	}

	/* Template: the first item of "single" being a SpecialToken means BOS is added. */
	json_object *pp = jget(root, "post_processor"), *procs = jget(pp, "processors");
	for (size_t i = 0; jidx(procs, i); i++)
		if (jstr(jidx(procs, i), "type") &&
		    !strcmp(jstr(jidx(procs, i), "type"), "TemplateProcessing"))
			pp = jidx(procs, i);
	/* Qwen2 ships a ByteLevel post_processor with no "single" template: no BOS from it. */
	const char *tmpl_bos = jstr(jget(jidx(jget(pp, "single"), 0), "SpecialToken"), "id");
	int tmpl_id = tmpl_bos ? find_text(t, tmpl_bos) : -1;

	const char *s;
	if ((s = config_token(tc, "bos_token")))
		t->bos = find_text(t, s);
	if (t->bos < 0 && jget(mc, "bos_token_id"))
		t->bos = json_object_get_int(jget(mc, "bos_token_id"));
	if (t->bos < 0)
		t->bos = tmpl_id;
	if ((s = config_token(tc, "eos_token")))
		t->eos = find_text(t, s);
	json_object *eos = jget(mc, "eos_token_id");
	if (t->eos < 0 && eos)
		t->eos = json_object_get_int(json_object_is_type(eos, json_type_array) ?
					     json_object_array_get_idx(eos, 0) : eos);
	json_object *ab = jget(tc, "add_bos_token");
	if (ab && json_object_is_type(ab, json_type_boolean))
		t->add_bos = json_object_get_boolean(ab);
	else
		t->add_bos = tmpl_id >= 0 && tmpl_id == t->bos;
	json_object_put(tc);
	json_object_put(mc);
	if (t->bos >= t->n_vocab || t->eos >= t->n_vocab || t->bos < -1 || t->eos < -1) {
		snprintf(err, errlen, "bos/eos id out of range (%d/%d for %d tokens)", t->bos, t->eos,
			 t->n_vocab);
		return -EINVAL;
	}
	return 0;
}

static int json_build(struct fkv_tokenizer **out, json_object *root, const char *dir, char *err,
		      size_t errlen)
{
	json_object *model = jget(root, "model"), *vocab = jget(model, "vocab");
	json_object *merges = jget(model, "merges"), *added = jget(root, "added_tokens");
	const char *type = jstr(model, "type");
	if (!model || !json_object_is_type(model, json_type_object)) {
		snprintf(err, errlen, "no \"model\" object");
		return -EINVAL;
	}
	if (!type || strcmp(type, "BPE") != 0) {
		snprintf(err, errlen, "model.type \"%s\" is not supported (BPE)", type ? type : "(none)");
		return -ENOTSUP;
	}
	if (!vocab || !json_object_is_type(vocab, json_type_object) || !merges ||
	    !json_object_is_type(merges, json_type_array) ||
	    (added && !json_object_is_type(added, json_type_array))) {
		snprintf(err, errlen, "model.vocab (object), model.merges (array) or added_tokens "
			 "(array) missing or mistyped");
		return -EINVAL;
	}
	const char *sub = jstr(model, "continuing_subword_prefix");
	const char *suf = jstr(model, "end_of_word_suffix");
	json_object *dropout = jget(model, "dropout");
	if ((sub && *sub) || (suf && *suf) || (dropout && json_object_get_double(dropout) != 0.0)) {
		snprintf(err, errlen, "model: continuing_subword_prefix, end_of_word_suffix and "
			 "dropout are not supported");
		return -ENOTSUP;
	}
	int max_id, rc = json_max_id(vocab, added, &max_id, err, errlen);
	if (rc)
		return rc;
	struct fkv_tokenizer *t = tokenizer_alloc(max_id + 1);
	if (!t)
		return -ENOMEM;
	t->merge = TOK_MERGE_RANK;
	t->byte_fallback = jbool(model, "byte_fallback", false);
	t->ignore_merges = jbool(model, "ignore_merges", false);
	json_object_object_foreach(vocab, key, val)
	{
		size_t kl = strlen(key);
		bool is_byte = t->byte_fallback && kl == 6 && !strncmp(key, "<0x", 3) && key[5] == '>';
		rc = tokenizer_set_token(t, json_object_get_int(val), key, kl, 0,
					 is_byte ? TOKT_BYTE : TOKT_NORMAL);
		if (rc)
			goto fail;
	}
	for (size_t i = 0; added && i < json_object_array_length(added); i++) {
		json_object *a = json_object_array_get_idx(added, i), *c = jget(a, "content");
		rc = tokenizer_set_token(t, json_object_get_int(jget(a, "id")), json_object_get_string(c),
					 (size_t)json_object_get_string_len(c), 0,
					 jbool(a, "special", false) ? TOKT_CONTROL : TOKT_USER);
		if (rc)
			goto fail;
	}
	const char *unk = jstr(model, "unk_token");
	if (unk && (t->unk = find_text(t, unk)) >= 0)
		t->type[t->unk] = TOKT_UNKNOWN;
	rc = tokenizer_index_vocab(t);
	if (rc == 0)
		rc = json_merges(t, merges, err, errlen);
	if (rc == 0)
		rc = walk(t, jget(root, "normalizer"), "normalizer", "normalizers", on_normalizer, err, errlen);
	if (rc == 0)
		rc = walk(t, jget(root, "pre_tokenizer"), "pre_tokenizer", "pretokenizers", on_pre_tokenizer,
			  err, errlen);
	if (rc == 0)
		rc = walk(t, jget(root, "decoder"), "decoder", "decoders", on_decoder, err, errlen);
	if (rc == 0)
		rc = json_specials(t, root, dir, err, errlen);
	if (rc == 0)
		rc = tokenizer_finish(t);
	if (rc == 0) {
		*out = t;
		return 0;
	}
fail:
	if (rc == -ENOMEM)
		snprintf(err, errlen, "out of memory");
	tokenizer_free(t);
	return rc;
}

int tokenizer_load_json(const char *path, struct fkv_tokenizer **out, char *err, size_t errlen)
{
	*out = NULL;
	if (access(path, R_OK) != 0) {
		int e = errno;
		snprintf(err, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	json_object *root = json_object_from_file(path);
	if (!root) {
		snprintf(err, errlen, "%s: not valid JSON: %s", path, json_util_get_last_err());
		return -EINVAL;
	}
	char dir[4096];
	snprintf(dir, sizeof dir, "%s", path);
	char *slash = strrchr(dir, '/');
	if (slash)
		*slash = '\0';
	else
		strcpy(dir, ".");
	char msg[2048] = "";
	int rc = json_build(out, root, dir, msg, sizeof msg);
	json_object_put(root);
	if (rc)
		snprintf(err, errlen, "%s: %s", path, msg);
	return rc;
}

int tokenizer_load(const struct fkv_model *m, struct fkv_tokenizer **out, char *err, size_t errlen)
{
	const struct gguf_ctx *g = model_gguf(m);
	if (g) {
		char msg[2048] = "";
		int rc = tokenizer_load_gguf(g, out, msg, sizeof msg);
		if (rc)
			snprintf(err, errlen, "%s: %s", m->path, msg);
		return rc;
	}
	char path[4200];
	snprintf(path, sizeof path, "%s/tokenizer.json", m->path);
	return tokenizer_load_json(path, out, err, errlen);
}
