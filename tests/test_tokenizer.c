/* Tests worker/tokenizer*.c on stories260K: its SentencePiece BPE from GGUF and from
 * hf/tokenizer.json against ids produced by SentencePiece itself and against each other; the
 * heap-based merge loop against a naive quadratic reference; decode round trips; long inputs;
 * the tokenizer a loaded model carries. */
#include "test_buf.h"

#include <errno.h>
#include <stdbool.h>
#include <sys/stat.h>

#include <json-c/json.h>

#include "gguf.h"
#include "model.h"
#include "tokenizer.h"
#include "test_tokenizer.h"


/* ---- stories260K ---- */

struct stories {
	struct gguf_ctx *g;
	struct fkv_tokenizer *gguf, *json;
};

/* Loads both tokenizers, or skips the test when the model folder is absent. */
static bool stories_open(struct stories *s)
{
	char err[512] = "";
	memset(s, 0, sizeof *s);
	const char *p = test_model_path("stories260K/stories260K.gguf");
	if (!p)
		return false;
	assert_int_equal(gguf_open(p, &s->g, err, sizeof err), 0);
	assert_int_equal(tokenizer_load_gguf(s->g, &s->gguf, err, sizeof err), 0);
	p = test_model_path("stories260K/hf/tokenizer.json");
	if (!p)
		return false;
	int rc = tokenizer_load_json(p, &s->json, err, sizeof err);
	if (rc)
		fprintf(stderr, "%s\n", err);
	assert_int_equal(rc, 0);
	return true;
}

static void stories_close(struct stories *s)
{
	tokenizer_free(s->gguf);
	tokenizer_free(s->json);
	gguf_close(s->g);
}

/* Expected ids from SentencePiece 0.2 (python: sp.encode(s)) on stories260K/tok512.model with
 * normalizer_spec.remove_extra_whitespaces turned off — the model proto with the bytes
 * 1a 02 20 00 appended (a second field 3 that protobuf merges into the normalizer spec) —
 * because HF tokenizers' Llama normalizer (Prepend + Replace) and llama.cpp never collapse
 * whitespace, while this model's own spec does (" a  b " gives [261, 268] there). The entry
 * marked "by hand" has invalid UTF-8, which SentencePiece's Python API cannot take: a, then
 * <0xFF> and <0xFE> (id 3 + byte), then b. */
static const struct {
	const char *text;
	int n;
	int ids[24];
} known[] = {
	{ "Hello world", 6, { 346, 306, 414, 263, 304, 341 } },
	{ " a  b ", 5, { 410, 261, 410, 268, 410 } },
	{ "a\tb\nc", 5, { 261, 12, 430, 13, 429 } },
	{ "caf\xc3\xa9", 4, { 280, 412, 431, 485 } },
	{ "\xe6\x97\xa5\xe6\x9c\xac", 7, { 410, 233, 154, 168, 233, 159, 175 } },
	{ "\xf0\x9f\x98\x80", 5, { 410, 243, 162, 155, 131 } },
	{ "", 0, { 0 } },
	{ "Once upon a time, there was a little girl named Lily.", 15,
	  { 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426 } },
	{ "  leading", 6, { 410, 410, 278, 411, 380, 299 } },
	{ "trailing  ", 7, { 259, 420, 412, 290, 299, 410, 410 } },
	{ "x\xc3\xbf\x01y", 6, { 410, 444, 198, 194, 4, 422 } },
	{ "\xc3\x9cn\xc3\xaf" "c\xc3\xb6" "d\xc3\xa9 \xc3\xb1", 13,
	  { 410, 198, 159, 416, 198, 178, 429, 198, 185, 418, 485, 410, 493 } },
	{ "123 4567", 9, { 410, 475, 479, 472, 410, 484, 480, 490, 491 } },
	{ "\n\n", 3, { 410, 13, 13 } },
	{ "hello", 3, { 281, 306, 414 } },
	{ "Lily and Max", 5, { 317, 269, 392, 412, 444 } },
	{ " ", 2, { 410, 410 } },
	{ "\xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x9a\x80!", 17,
	  { 410, 485, 413, 485, 410, 231, 187, 176, 233, 153, 138, 410, 243, 162, 157, 131, 443 } },
	{ "The end.\n", 5, { 291, 344, 264, 426, 13 } },
	{ "a\xff\xfe" "b", 4, { 261, 258, 257, 430 } }, /* by hand */
};


static void test_stories_known_ids(void **state)
{
	(void)state;
	struct stories s;
	if (!stories_open(&s))
		skip();
	for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
		expect_ids(s.gguf, known[i].text, false, known[i].ids, known[i].n);
		expect_ids(s.json, known[i].text, false, known[i].ids, known[i].n);
		expect_roundtrip(s.gguf, known[i].text);
		expect_roundtrip(s.json, known[i].text);
	}
	stories_close(&s);
}

static void test_stories_bos_eos_specials(void **state)
{
	(void)state;
	struct stories s;
	if (!stories_open(&s))
		skip();
	const struct fkv_tokenizer *both[2] = { s.gguf, s.json };
	for (int k = 0; k < 2; k++) {
		const struct fkv_tokenizer *t = both[k];
		assert_int_equal(tokenizer_vocab_size(t), 512);
		assert_int_equal(tokenizer_bos(t), 1);
		assert_int_equal(tokenizer_eos(t), 2);
		assert_true(tokenizer_adds_bos(t));
		assert_true(tokenizer_is_special(t, 1));
		assert_false(tokenizer_is_special(t, 346));
		expect_ids(t, "", true, (int[]){ 1 }, 1);
		expect_ids(t, "hello", true, (int[]){ 1, 281, 306, 414 }, 4);
		/* Specials are matched verbatim; each text run gets its own "▁", as HF does. */
		expect_ids(t, "<s>hello</s>", false, (int[]){ 1, 281, 306, 414, 2 }, 5);
		expect_ids(t, "hello</s>hello", false, (int[]){ 281, 306, 414, 2, 281, 306, 414 }, 7);

		char *text = NULL;
		int ids[] = { 1, 346, 306, 414, 263, 304, 341, 2 };
		assert_int_equal(tokenizer_decode(t, ids, 8, &text), 11);
		assert_string_equal(text, "Hello world"); /* BOS/EOS silent, leading space dropped */
		free(text);
		int bytes[] = { 410, 233, 154, 168, 0 };
		assert_int_equal(tokenizer_decode(t, bytes, 5, &text), 6);
		assert_string_equal(text, "\xe6\x97\xa5\xef\xbf\xbd"); /* <unk> is U+FFFD */
		free(text);
		int bad[] = { 346, 512 };
		text = (char *)1;
		assert_int_equal(tokenizer_decode(t, bad, 2, &text), -EINVAL);
		assert_null(text);
		assert_int_equal(tokenizer_decode(t, NULL, 0, &text), 0);
		assert_string_equal(text, "");
		free(text);

		/* Pieces keep their leading space: streaming output concatenates them. */
		char buf[16];
		assert_int_equal(tokenizer_piece(t, 346, buf, sizeof buf), 3);
		assert_memory_equal(buf, " He", 3);
		assert_int_equal(tokenizer_piece(t, 233, buf, sizeof buf), 1);
		assert_int_equal((unsigned char)buf[0], 0xE6);
		assert_int_equal(tokenizer_piece(t, 1, buf, sizeof buf), 0);
		assert_int_equal(tokenizer_piece(t, -1, buf, sizeof buf), -EINVAL);
	}
	int *ids = (int *)1;
	assert_int_equal(tokenizer_encode(s.gguf, NULL, false, &ids), -EINVAL);
	assert_null(ids);
	stories_close(&s);
}

static void test_stories_gguf_json_identical(void **state)
{
	(void)state;
	struct stories s;
	if (!stories_open(&s))
		skip();
	uint64_t rng = 0x5eed1234;
	char text[512];
	for (int iter = 0; iter < 3000; iter++) {
		random_text(&rng, text, sizeof text, true);
		int *a = NULL, *b = NULL;
		int na = tokenizer_encode(s.gguf, text, iter & 1, &a);
		int nb = tokenizer_encode(s.json, text, iter & 1, &b);
		assert_true(na >= 0);
		assert_int_equal(na, nb);
		assert_memory_equal(a, b, (size_t)na * sizeof *a);
		free(a);
		free(b);
		if (!strchr(text, '<'))
			expect_roundtrip(s.json, text);
	}
	stories_close(&s);
}

/* ---- the naive reference for score-mode BPE ---- */

struct ref_vocab {
	int n;
	const struct gguf_str *tok;
	struct gguf_arr scores, types;
};

static int ref_find(const struct ref_vocab *v, const char *s, size_t n, int type)
{
	for (int i = 0; i < v->n; i++) {
		int64_t ty;
		gguf_arr_int(&v->types, (uint64_t)i, &ty);
		if (ty == type && v->tok[i].len == n && !memcmp(v->tok[i].s, s, n))
			return i;
	}
	return -1;
}

/* Quadratic SentencePiece BPE straight from the definition: "▁" + text with ' ' -> "▁", split
 * into characters, merge the adjacent pair whose concatenation is the highest-scored normal
 * token (leftmost on ties) until none is, then spell leftovers as <0xNN> tokens. */
static int ref_encode(const struct ref_vocab *v, const char *text, int *out, int cap)
{
	char norm[2048];
	size_t n = 0;
	if (*text) {
		memcpy(norm, "\xe2\x96\x81", 3);
		n = 3;
	}
	for (const char *p = text; *p; p++) {
		if (*p == ' ') {
			memcpy(norm + n, "\xe2\x96\x81", 3);
			n += 3;
		} else {
			norm[n++] = *p;
		}
	}
	size_t start[2048], len[2048];
	int ns = 0;
	for (size_t i = 0; i < n;) {
		unsigned char c = (unsigned char)norm[i];
		size_t l = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
		bool ok = i + l <= n;
		for (size_t k = 1; ok && k < l; k++)
			ok = ((unsigned char)norm[i + k] & 0xC0) == 0x80;
		if (!ok)
			l = 1;
		start[ns] = i;
		len[ns++] = l;
		i += l;
	}
	for (;;) {
		int best = -1;
		float best_score = 0;
		for (int i = 0; i + 1 < ns; i++) {
			int id = ref_find(v, norm + start[i], len[i] + len[i + 1], 1);
			float sc;
			if (id < 0)
				continue;
			gguf_arr_f32(&v->scores, (uint64_t)id, &sc);
			if (best < 0 || sc > best_score) {
				best = i;
				best_score = sc;
			}
		}
		if (best < 0)
			break;
		len[best] += len[best + 1];
		memmove(start + best + 1, start + best + 2, (size_t)(ns - best - 2) * sizeof *start);
		memmove(len + best + 1, len + best + 2, (size_t)(ns - best - 2) * sizeof *len);
		ns--;
	}
	int m = 0;
	for (int i = 0; i < ns; i++) {
		int id = ref_find(v, norm + start[i], len[i], 1);
		if (id >= 0 && m < cap) {
			out[m++] = id;
			continue;
		}
		for (size_t k = 0; k < len[i] && m < cap; k++) {
			char hex[8];
			snprintf(hex, sizeof hex, "<0x%02X>", (unsigned char)norm[start[i] + k]);
			out[m++] = ref_find(v, hex, 6, 6);
		}
	}
	return m;
}

static void test_stories_matches_naive_reference(void **state)
{
	(void)state;
	struct stories s;
	if (!stories_open(&s))
		skip();
	struct gguf_arr toks;
	struct ref_vocab v;
	assert_int_equal(gguf_get_arr(s.g, "tokenizer.ggml.tokens", &toks), 0);
	assert_int_equal(gguf_get_arr(s.g, "tokenizer.ggml.scores", &v.scores), 0);
	assert_int_equal(gguf_get_arr(s.g, "tokenizer.ggml.token_type", &v.types), 0);
	v.n = (int)toks.n;
	v.tok = toks.strs;
	uint64_t rng = 42;
	char text[256];
	int want[1024];
	for (int iter = 0; iter < 300; iter++) {
		random_text(&rng, text, sizeof text, false);
		int n = ref_encode(&v, text, want, 1024);
		expect_ids(s.gguf, text, false, want, n);
		expect_ids(s.json, text, false, want, n);
	}
	stories_close(&s);
}

static void test_stories_long_input(void **state)
{
	(void)state;
	struct stories s;
	if (!stories_open(&s))
		skip();
	const char *sentence = "Once upon a time, there was a little girl named Lily. She loved to play.\n";
	size_t sl = strlen(sentence), reps = 3000;
	char *text = malloc(sl * reps + 1);
	assert_non_null(text);
	for (size_t i = 0; i < reps; i++)
		memcpy(text + i * sl, sentence, sl);
	text[sl * reps] = '\0';
	int *one = NULL, *all = NULL;
	int n1 = tokenizer_encode(s.gguf, sentence, false, &one);
	int n = tokenizer_encode(s.gguf, text, false, &all);
	assert_true(n1 > 0);
	/* The sentence ends in '\n', so after the first copy every copy starts "Once" without the
	 * dummy "▁" and the rest of its ids repeat exactly. */
	assert_true(n > (int)reps * (n1 - 2));
	assert_memory_equal(all, one, (size_t)(n1 - 1) * sizeof *one);
	expect_roundtrip(s.json, text);
	int *b = NULL;
	assert_int_equal(tokenizer_encode(s.json, text, false, &b), n);
	assert_memory_equal(all, b, (size_t)n * sizeof *b);
	free(b);
	free(one);
	free(all);
	free(text);
	stories_close(&s);
}

/* Through model_load(): the GGUF vocabulary and the HF folder's tokenizer.json. */
static void test_stories_from_model(void **state)
{
	(void)state;
	const char *paths[2] = { "stories260K/stories260K.gguf", "stories260K/hf" };
	int *ids[2] = { NULL, NULL }, n[2];
	const char *text = "Lily saw a big dog. \"Hi!\" she said.";
	for (int k = 0; k < 2; k++) {
		const char *p = test_model_path(paths[k]);
		if (!p)
			skip();
		struct fkv_model m;
		struct fkv_tokenizer *t = NULL;
		char err[512] = "";
		memset(&m, 0, sizeof m);
		int rc = model_load(p, &m, err, sizeof err);
		if (rc)
			fprintf(stderr, "model_load: %s\n", err);
		assert_int_equal(rc, 0);
		rc = tokenizer_load(&m, &t, err, sizeof err);
		if (rc)
			fprintf(stderr, "tokenizer_load: %s\n", err);
		assert_int_equal(rc, 0);
		assert_int_equal(tokenizer_bos(t), m.cfg.bos_id);
		assert_int_equal(tokenizer_eos(t), m.cfg.eos_id);
		assert_int_equal(tokenizer_vocab_size(t), m.cfg.vocab_size);
		n[k] = tokenizer_encode(t, text, true, &ids[k]);
		assert_true(n[k] > 10);
		tokenizer_free(t);
		model_free(&m);
	}
	assert_int_equal(n[0], n[1]);
	assert_memory_equal(ids[0], ids[1], (size_t)n[0] * sizeof(int));
	free(ids[0]);
	free(ids[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stories_known_ids),
		cmocka_unit_test(test_stories_bos_eos_specials),
		cmocka_unit_test(test_stories_gguf_json_identical),
		cmocka_unit_test(test_stories_matches_naive_reference),
		cmocka_unit_test(test_stories_long_input),
		cmocka_unit_test(test_stories_from_model),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
