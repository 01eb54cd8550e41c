/* Tests worker/pretok.c (and its use by the tokenizer loaders) against Hugging Face tokenizers.
 *
 * tests/data/pretok/pretok_cases.json is made by tests/pretok/make_pretok_cases.py from
 * llama.cpp's own list of tokenizer.ggml.pre names and regexes (llama_pre.json beside it) and
 * HF tokenizers' ids for a fixed text over a byte-level BPE vocabulary. Here, for every name:
 * the table's regexes and flags equal llama.cpp's, a GGUF vocabulary with that name and a
 * tokenizer.json with the same pre-tokenizer as HF wrote it both give HF's ids, and decoding
 * gives the text back. Then tokenizer.json pre-tokenizers no name uses (Split behaviours,
 * invert, String patterns, Digits, ByteLevel options, Metaspace), and a few splits worked out
 * by hand. The ctest test_pretok_hf (label slow) regenerates the ids with HF and diffs. */
#include "test_gguf_writer.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include <json-c/json.h>

#include "gguf.h"
#include "pretok.h"
#include "tokenizer.h"

static json_object *cases;
static char tmpdir[64];

static int setup(void **state)
{
	(void)state;
	cases = json_object_from_file(FREEKV_SOURCE_DIR "/tests/data/pretok/pretok_cases.json");
	strcpy(tmpdir, "/tmp/fkv_pretok_XXXXXX");
	return cases && mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
	json_object_put(cases);
	return system(cmd) == 0 ? 0 : -1;
}

static json_object *get(json_object *o, const char *key)
{
	json_object *v = NULL;
	assert_true(json_object_object_get_ex(o, key, &v));
	return v;
}

static const char *text(void)
{
	return json_object_get_string(get(cases, "text"));
}

/* ids vs the expected JSON array; on a difference, where and what, as token texts. */
static void expect_ids(const struct fkv_tokenizer *t, const char *what, json_object *want)
{
	int *ids = NULL;
	int n = tokenizer_encode(t, text(), false, &ids);
	int nw = (int)json_object_array_length(want), i = 0;
	while (i < n && i < nw && ids[i] == json_object_get_int(json_object_array_get_idx(want, i)))
		i++;
	if (i < n || i < nw) {
		fprintf(stderr, "%s: %d ids, HF %d; first difference at %d:", what, n, nw, i);
		for (int k = i; k < i + 6; k++) {
			char got[64] = "", exp[64] = "";
			if (k < n)
				got[tokenizer_piece(t, ids[k], got, sizeof got - 1) & 63] = '\0';
			if (k < nw) {
				int id = json_object_get_int(json_object_array_get_idx(want, k));
				exp[tokenizer_piece(t, id, exp, sizeof exp - 1) & 63] = '\0';
			}
			fprintf(stderr, " [\"%s\" vs HF \"%s\"]", got, exp);
		}
		fprintf(stderr, "\n");
		fail();
	}
	free(ids);
}

/* ---- building the vocabularies ---- */

static json_object *vocab(const char *which)
{
	return get(cases, !strcmp(which, "meta") ? "meta_vocab" : "byte_vocab");
}

/* A GGUF "gpt2" vocabulary (the byte one) with tokenizer.ggml.pre = pre, or none when NULL. */
static struct fkv_tokenizer *load_gguf(const char *pre, struct gguf_ctx **g)
{
	json_object *toks = get(vocab("byte"), "tokens"), *merges = get(vocab("byte"), "merges");
	int nt = (int)json_object_array_length(toks), nm = (int)json_object_array_length(merges);
	const char **tv = calloc((size_t)nt, sizeof *tv), **mv = calloc((size_t)nm, sizeof *mv);
	int32_t *types = calloc((size_t)nt, sizeof *types);
	assert_non_null(tv);
	assert_non_null(mv);
	assert_non_null(types);
	for (int i = 0; i < nt; i++) {
		tv[i] = json_object_get_string(json_object_array_get_idx(toks, i));
		types[i] = 1;
	}
	for (int i = 0; i < nm; i++) {
		json_object *m = json_object_array_get_idx(merges, i);
		char *s = NULL;
		assert_true(asprintf(&s, "%s %s", json_object_get_string(json_object_array_get_idx(m, 0)),
				     json_object_get_string(json_object_array_get_idx(m, 1))) > 0);
		mv[i] = s;
	}
	struct gbuf b;
	gb_begin(&b);
	gb_kv_str(&b, "tokenizer.ggml.model", "gpt2");
	if (pre)
		gb_kv_str(&b, "tokenizer.ggml.pre", pre);
	gb_kv_strs(&b, "tokenizer.ggml.tokens", tv, nt);
	gb_kv_arr32(&b, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, nt);
	gb_kv_strs(&b, "tokenizer.ggml.merges", mv, nm);
	gb_kv_u32(&b, "tokenizer.ggml.bos_token_id", 0); /* for add_bos; no add_bos_token key */
	gb_end(&b);
	char err[2048] = "";
	struct fkv_tokenizer *t = NULL;
	int rc = gguf_open_buf(b.buf.p, b.buf.n, g, err, sizeof err);
	if (rc == 0)
		rc = tokenizer_load_gguf(*g, &t, err, sizeof err);
	if (rc)
		fprintf(stderr, "GGUF pre \"%s\": %s\n", pre ? pre : "(none)", err);
	assert_int_equal(rc, 0);
	for (int i = 0; i < nm; i++)
		free((char *)mv[i]);
	free(tv);
	free(mv);
	free(types);
	free(b.buf.p);
	return t;
}

/* A tokenizer.json: vocabulary `which`, BPE options as the HF side had them, pre_tokenizer as
 * HF serialised it. Loaded and returned. */
static struct fkv_tokenizer *load_json(const char *which, bool ignore_merges, json_object *pre)
{
	json_object *toks = get(vocab(which), "tokens"), *root = json_object_new_object();
	json_object *model = json_object_new_object(), *v = json_object_new_object();
	bool meta = !strcmp(which, "meta");
	for (size_t i = 0; i < json_object_array_length(toks); i++)
		json_object_object_add(v, json_object_get_string(json_object_array_get_idx(toks, i)),
				       json_object_new_int((int)i));
	json_object_object_add(model, "type", json_object_new_string("BPE"));
	json_object_object_add(model, "vocab", v);
	json_object_object_add(model, "merges", json_object_get(get(vocab(which), "merges")));
	json_object_object_add(model, "ignore_merges", json_object_new_boolean(ignore_merges));
	json_object_object_add(model, "byte_fallback", json_object_new_boolean(meta));
	if (meta)
		json_object_object_add(model, "unk_token", json_object_new_string("<unk>"));
	json_object_object_add(root, "model", model);
	json_object_object_add(root, "pre_tokenizer", json_object_get(pre));
	json_object_object_add(root, "decoder", json_tokener_parse(
		meta ? "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
		       "{\"String\":\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},"
		       "{\"type\":\"Fuse\"}]}"
		     : "{\"type\":\"ByteLevel\"}"));
	char path[128], err[2048] = "";
	snprintf(path, sizeof path, "%s/tokenizer.json", tmpdir);
	assert_int_equal(json_object_to_file_ext(path, root, JSON_C_TO_STRING_PLAIN), 0);
	json_object_put(root);
	struct fkv_tokenizer *t = NULL;
	int rc = tokenizer_load_json(path, &t, err, sizeof err);
	if (rc)
		fprintf(stderr, "%s\n", err);
	assert_int_equal(rc, 0);
	return t;
}

/* ---- the GGUF names ---- */

/* The table holds exactly llama.cpp's byte-level names, each with llama.cpp's regexes, flags. */
static void test_table_is_llamas(void **state)
{
	(void)state;
	json_object *names = get(cases, "names"), *configs = get(cases, "configs");
	assert_int_equal(pretok_gguf_count(), json_object_object_length(names));
	for (int i = 0; i < pretok_gguf_count(); i++) {
		const char *name = pretok_gguf_name(i);
		json_object *n = NULL;
		if (!json_object_object_get_ex(names, name, &n))
			fail_msg("table name \"%s\" is not one of llama.cpp's", name);
		json_object *c = json_object_array_get_idx(configs, json_object_get_int(get(n, "config")));
		json_object *stages = get(c, "stages");
		const char *const *re = pretok_gguf_stages(i);
		size_t k = 0;
		for (; re[k]; k++) {
			if (k >= json_object_array_length(stages) ||
			    strcmp(re[k], json_object_get_string(json_object_array_get_idx(stages, k))) != 0)
				fail_msg("\"%s\": stage %zu differs from llama.cpp's", name, k);
		}
		assert_int_equal(k, json_object_array_length(stages));
		struct pretok p = { 0 };
		struct pretok_gguf_flags fl;
		char err[512];
		assert_int_equal(pretok_from_gguf(&p, name, &fl, err, sizeof err), 0);
		assert_int_equal(p.n, (int)k);
		if (fl.ignore_merges != json_object_get_boolean(get(c, "ignore_merges")) ||
		    fl.add_bos != json_object_get_boolean(get(n, "add_bos")))
			fail_msg("\"%s\": ignore_merges/add_bos differ from llama.cpp's", name);
		pretok_free(&p);
	}
}

/* Per name, the GGUF vocabulary encodes the text to HF's ids and decodes it back. */
static void test_gguf_names_give_hf_ids(void **state)
{
	(void)state;
	json_object *configs = get(cases, "configs");
	json_object_object_foreach(get(cases, "names"), name, n)
	{
		json_object *c = json_object_array_get_idx(configs, json_object_get_int(get(n, "config")));
		struct gguf_ctx *g = NULL;
		struct fkv_tokenizer *t = load_gguf(name, &g);
		char what[96];
		snprintf(what, sizeof what, "GGUF pre \"%s\"", name);
		expect_ids(t, what, get(c, "ids"));
		assert_int_equal(tokenizer_adds_bos(t), json_object_get_boolean(get(n, "add_bos")));
		int *ids = NULL;
		char *back = NULL;
		int k = tokenizer_encode(t, text(), false, &ids);
		assert_int_equal(tokenizer_decode(t, ids, k, &back), (int)strlen(text()));
		assert_string_equal(back, text());
		free(ids);
		free(back);
		tokenizer_free(t);
		gguf_close(g);
	}
}

/* A GGUF vocabulary without tokenizer.ggml.pre is "default", as in llama.cpp. */
static void test_gguf_without_pre_is_default(void **state)
{
	(void)state;
	json_object *n = get(get(cases, "names"), "default");
	json_object *c = json_object_array_get_idx(get(cases, "configs"),
						   json_object_get_int(get(n, "config")));
	struct gguf_ctx *g = NULL;
	struct fkv_tokenizer *t = load_gguf(NULL, &g);
	expect_ids(t, "GGUF without pre", get(c, "ids"));
	tokenizer_free(t);
	gguf_close(g);
}

/* Each distinct stage list, read from the tokenizer.json HF wrote for it. */
static void test_json_configs_give_hf_ids(void **state)
{
	(void)state;
	json_object *configs = get(cases, "configs");
	for (size_t i = 0; i < json_object_array_length(configs); i++) {
		json_object *c = json_object_array_get_idx(configs, i);
		struct fkv_tokenizer *t = load_json("byte", json_object_get_boolean(get(c, "ignore_merges")),
						    get(c, "pre_tokenizer"));
		char what[64];
		snprintf(what, sizeof what, "tokenizer.json of config %zu", i);
		expect_ids(t, what, get(c, "ids"));
		tokenizer_free(t);
	}
}

/* HF pre-tokenizers beyond the GGUF table: Split behaviours and options, Digits, ByteLevel,
 * Metaspace (on a SentencePiece-style vocabulary with byte fallback). */
static void test_json_pre_tokenizers_give_hf_ids(void **state)
{
	(void)state;
	json_object *jc = get(cases, "json_cases");
	for (size_t i = 0; i < json_object_array_length(jc); i++) {
		json_object *c = json_object_array_get_idx(jc, i);
		struct fkv_tokenizer *t = load_json(json_object_get_string(get(c, "vocab")), false,
						    get(c, "pre_tokenizer"));
		expect_ids(t, json_object_get_string(get(c, "what")), get(c, "ids"));
		tokenizer_free(t);
	}
}

static void test_unknown_name_lists_known(void **state)
{
	(void)state;
	struct pretok p = { 0 };
	struct pretok_gguf_flags fl;
	char err[2048] = "";
	assert_int_equal(pretok_from_gguf(&p, "gpt2", &fl, err, sizeof err), -ENOTSUP);
	assert_non_null(strstr(err, "\"gpt2\" is not supported; known: default minicpm5 llama3"));
	assert_non_null(strstr(err, " smollm "));
	assert_non_null(strstr(err, " mellum2"));
	assert_int_equal(p.n, 0);
	/* A short buffer is cut, not overrun. */
	char small[40];
	assert_int_equal(pretok_from_gguf(&p, "x", &fl, small, sizeof small), -ENOTSUP);
	assert_int_equal(strlen(small), sizeof small - 1);
}

/* ---- splits worked out by hand ---- */

struct collect {
	char out[256];
	size_t n;
};

static int collect(void *arg, const char *s, size_t n)
{
	struct collect *c = arg;
	c->n += (size_t)snprintf(c->out + c->n, sizeof c->out - c->n, "[%.*s]", (int)n, s);
	return 0;
}

static void expect_split(struct pretok *p, const char *in, bool at_start, const char *want)
{
	struct collect c = { .n = 0 };
	assert_int_equal(pretok_run(p, in, strlen(in), at_start, collect, &c), 0);
	assert_string_equal(c.out, want);
	pretok_free(p);
}

static void test_hand_splits(void **state)
{
	(void)state;
	struct pretok p = { 0 };
	char err[256];
	const char *s = "a1b22c";
	/* Matches "1", "2", "2" (one character each) and the gaps a, b, c. */
	assert_int_equal(pretok_add_regex(&p, "\\d", PRETOK_ISOLATED, false, err, sizeof err), 0);
	expect_split(&p, s, true, "[a][1][b][2][2][c]");
	assert_int_equal(pretok_add_regex(&p, "\\d", PRETOK_REMOVED, false, err, sizeof err), 0);
	expect_split(&p, s, true, "[a][b][c]");
	assert_int_equal(pretok_add_regex(&p, "\\d", PRETOK_CONTIGUOUS, false, err, sizeof err), 0);
	expect_split(&p, s, true, "[a][1][b][22][c]");
	/* A match joins its neighbour only when that neighbour is not a match itself. */
	assert_int_equal(pretok_add_regex(&p, "\\d", PRETOK_MERGED_PREV, false, err, sizeof err), 0);
	expect_split(&p, s, true, "[a1][b2][2][c]");
	assert_int_equal(pretok_add_regex(&p, "\\d", PRETOK_MERGED_NEXT, false, err, sizeof err), 0);
	expect_split(&p, s, true, "[a][1b][2][2c]");
	assert_int_equal(pretok_add_regex(&p, "\\d", PRETOK_REMOVED, true, err, sizeof err), 0);
	expect_split(&p, s, true, "[1][2][2]");
	/* Stages run on each piece: "\s+(?!\S)" cannot see past the end of "x  ". */
	assert_int_equal(pretok_add_regex(&p, "[^|]+", PRETOK_ISOLATED, false, err, sizeof err), 0);
	assert_int_equal(pretok_add_regex(&p, "\\s+(?!\\S)", PRETOK_ISOLATED, false, err, sizeof err), 0);
	expect_split(&p, "x  |y  z", true, "[x][  ][|][y][ ][ z]");
	/* Invalid UTF-8 is tolerated: a bad byte never matches, so it stays in its gap. */
	assert_int_equal(pretok_add_regex(&p, "\\d|\\s+", PRETOK_ISOLATED, false, err, sizeof err), 0);
	expect_split(&p, "a\xff\xc3 1", true, "[a\xff\xc3][ ][1]");
	/* Empty matches cut; one right after a match does not. */
	assert_int_equal(pretok_add_regex(&p, "a*", PRETOK_ISOLATED, false, err, sizeof err), 0);
	expect_split(&p, "xaab", true, "[x][aa][b]");
	/* Prefixes: not twice, and "first" only at the start of the text. */
	assert_int_equal(pretok_add_metaspace(&p, "\xE2\x96\x81", "first", true, err, sizeof err), 0);
	expect_split(&p, "a b", true, "[\xE2\x96\x81" "a][\xE2\x96\x81" "b]");
	assert_int_equal(pretok_add_metaspace(&p, "\xE2\x96\x81", "first", true, err, sizeof err), 0);
	expect_split(&p, "a b", false, "[a][\xE2\x96\x81" "b]");
	assert_int_equal(pretok_add_bytelevel(&p, true, false, err, sizeof err), 0);
	expect_split(&p, " a", true, "[ a]");
	/* No stages: the segment is the piece. */
	expect_split(&p, "a b", true, "[a b]");
	assert_int_equal(pretok_add_regex(&p, "(", PRETOK_ISOLATED, false, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "missing closing parenthesis"));
	assert_int_equal(pretok_add_replace(&p, "", "x", err, sizeof err), -EINVAL);
	for (int i = 0; i < PRETOK_MAX_STAGES; i++)
		assert_int_equal(pretok_add_digits(&p, true, err, sizeof err), 0);
	assert_int_equal(pretok_add_digits(&p, true, err, sizeof err), -E2BIG);
	pretok_free(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table_is_llamas),
		cmocka_unit_test(test_gguf_names_give_hf_ids),
		cmocka_unit_test(test_gguf_without_pre_is_default),
		cmocka_unit_test(test_json_configs_give_hf_ids),
		cmocka_unit_test(test_json_pre_tokenizers_give_hf_ids),
		cmocka_unit_test(test_unknown_name_lists_known),
		cmocka_unit_test(test_hand_splits),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
