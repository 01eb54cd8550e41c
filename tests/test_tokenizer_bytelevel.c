/* Tests worker/tokenizer*.c on tokenizers written by the test: a hand-written byte-level
 * tokenizer (Llama 3 regex) from tokenizer.json and from an equivalent GGUF "gpt2" vocabulary
 * with ids worked out by hand, post-processors, the NFC normalizer (utf8proc), malformed
 * tokenizer.json and GGUF files, and the SentencePiece score order. */
#include "test_buf.h"

#include <errno.h>
#include <stdbool.h>
#include <sys/stat.h>

#include <json-c/json.h>

#include "gguf.h"
#include "model.h"
#include "tokenizer.h"
#include "test_gguf_writer.h"
#include "test_tokenizer.h"

/* ---- a hand-written byte-level tokenizer ----
 *
 * Ids 0..255 are the single bytes (spelled through the GPT-2 byte table, so id == byte value),
 * then the merges "Ġ t" -> 256 "Ġt", "h e" -> 257, "Ġt he" -> 258 "Ġthe", "l l" -> 259,
 * "3 4" -> 260, a merge-less token 261 "xyz", and added tokens 262 <|begin_of_text|> and
 * 263 <|end_of_text|> (special) and 264 <|user|> (not special). */
static const char LLAMA3_RE[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
	"\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char *bl_merges[5][2] = {
	{ "\xc4\xa0", "t" }, { "h", "e" }, { "\xc4\xa0t", "he" }, { "l", "l" }, { "3", "4" },
};

/* GPT-2's byte table, written out from its definition: printable Latin-1 bytes stand for
 * themselves, the other 68 take code points 256.. in byte order. */
static void bl_byte_char(int b, char out[4])
{
	int cp = b, extra = 0;
	bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
	if (!keep) {
		for (int x = 0; x < b; x++)
			if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174))
				extra++;
		cp = 256 + extra;
	}
	if (cp < 0x80) {
		out[0] = (char)cp, out[1] = 0;
	} else {
		out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
	}
}

static const char *bl_extra[] = { "\xc4\xa0t", "he", "\xc4\xa0the", "ll", "34", "xyz" };
static const char *bl_added[] = { "<|begin_of_text|>", "<|end_of_text|>", "<|user|>" };

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* Writes dir/tokenizer.json (+ tokenizer_config.json); merges as strings or as pairs. */
static void bl_write_json(const char *dir, bool pair_merges)
{
	json_object *root = json_object_new_object(), *model = json_object_new_object();
	json_object *vocab = json_object_new_object(), *merges = json_object_new_array();
	json_object *added = json_object_new_array();
	for (int b = 0; b < 256; b++) {
		char c[4];
		bl_byte_char(b, c);
		json_object_object_add(vocab, c, json_object_new_int(b));
	}
	for (int i = 0; i < 6; i++)
		json_object_object_add(vocab, bl_extra[i], json_object_new_int(256 + i));
	for (int i = 0; i < 5; i++) {
		if (pair_merges) {
			json_object *p = json_object_new_array();
			json_object_array_add(p, json_object_new_string(bl_merges[i][0]));
			json_object_array_add(p, json_object_new_string(bl_merges[i][1]));
			json_object_array_add(merges, p);
		} else {
			char m[32];
			snprintf(m, sizeof m, "%s %s", bl_merges[i][0], bl_merges[i][1]);
			json_object_array_add(merges, json_object_new_string(m));
		}
	}
	for (int i = 0; i < 3; i++) {
		json_object *a = json_object_new_object();
		json_object_object_add(a, "id", json_object_new_int(262 + i));
		json_object_object_add(a, "content", json_object_new_string(bl_added[i]));
		json_object_object_add(a, "special", json_object_new_boolean(i < 2));
		json_object_array_add(added, a);
	}
	json_object_object_add(model, "type", json_object_new_string("BPE"));
	json_object_object_add(model, "byte_fallback", json_object_new_boolean(0));
	json_object_object_add(model, "ignore_merges", json_object_new_boolean(1));
	json_object_object_add(model, "vocab", vocab);
	json_object_object_add(model, "merges", merges);
	json_object_object_add(root, "version", json_object_new_string("1.0"));
	json_object_object_add(root, "added_tokens", added);
	json_object_object_add(root, "normalizer", NULL);
	json_object *pre = json_tokener_parse(
		"{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\"},"
		"\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
		"\"trim_offsets\":true,\"use_regex\":false}]}");
	json_object *split = json_object_array_get_idx(json_object_object_get(pre, "pretokenizers"), 0);
	json_object_object_add(json_object_object_get(split, "pattern"), "Regex",
			       json_object_new_string(LLAMA3_RE));
	json_object_object_add(root, "pre_tokenizer", pre);
	json_object_object_add(root, "post_processor", json_tokener_parse(
		"{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<|begin_of_text|>\","
		"\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}]}"));
	json_object_object_add(root, "decoder", json_tokener_parse(
		"{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true}"));
	json_object_object_add(root, "model", model);
	char path[512];
	snprintf(path, sizeof path, "%s/tokenizer.json", dir);
	assert_int_equal(json_object_to_file_ext(path, root, JSON_C_TO_STRING_PLAIN), 0);
	json_object_put(root);
	snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
	write_file(path, "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|end_of_text|>\"}");
}

/* The hand-written tokenizer as a GGUF "gpt2" vocabulary (pre "llama-bpe"). */
static void bl_gguf(struct gbuf *b)
{
	static char bytes[256][4];
	const char *toks[265];
	int32_t types[265];
	for (int i = 0; i < 256; i++) {
		bl_byte_char(i, bytes[i]);
		toks[i] = bytes[i];
		types[i] = 1;
	}
	for (int i = 0; i < 6; i++)
		toks[256 + i] = bl_extra[i], types[256 + i] = 1;
	for (int i = 0; i < 3; i++)
		toks[262 + i] = bl_added[i], types[262 + i] = i < 2 ? 3 : 4;
	char mbuf[5][32];
	const char *merges[5];
	for (int i = 0; i < 5; i++) {
		snprintf(mbuf[i], sizeof mbuf[i], "%s %s", bl_merges[i][0], bl_merges[i][1]);
		merges[i] = mbuf[i];
	}
	gb_begin(b);
	gb_kv_str(b, "tokenizer.ggml.model", "gpt2");
	gb_kv_str(b, "tokenizer.ggml.pre", "llama-bpe");
	gb_kv_strs(b, "tokenizer.ggml.tokens", toks, 265);
	gb_kv_arr32(b, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, 265);
	gb_kv_strs(b, "tokenizer.ggml.merges", merges, 5);
	gb_kv_u32(b, "tokenizer.ggml.bos_token_id", 262);
	gb_kv_u32(b, "tokenizer.ggml.eos_token_id", 263);
	gb_kv_bool(b, "tokenizer.ggml.add_bos_token", true);
	gb_end(b);
}

/* Worked out by hand from the vocabulary above and the Llama 3 split regex. */
static const struct {
	const char *text;
	int n;
	int ids[16];
} bl_known[] = {
	/* "the" | " the": h+e (rank 1); Ġ+t (rank 0) then Ġt+he (rank 2). */
	{ "the the", 3, { 116, 257, 258 } },
	{ "Hello!!", 6, { 72, 101, 259, 111, 33, 33 } },
	/* Equal ranks: the leftmost pair merges first. */
	{ "lll", 2, { 259, 108 } },
	/* é is C3 A9: two byte symbols, no merges. */
	{ "\xc3\xa9t\xc3\xa9", 5, { 195, 169, 116, 195, 169 } },
	{ "a\n\nb", 4, { 97, 10, 10, 98 } },
	/* \p{N}{1,3} splits "123" | "45", so the merge "3 4" cannot apply ... */
	{ "12345", 5, { 49, 50, 51, 52, 53 } },
	/* ... but does inside "345". */
	{ "345", 2, { 260, 53 } },
	/* ignore_merges: a pre-token that is a whole vocabulary entry is taken as is. */
	{ "xyz", 1, { 261 } },
	{ " xyz", 4, { 32, 120, 121, 122 } },
	/* "a" | " " | " the": \s+(?!\S) leaves the last space to the word. */
	{ "a  the", 3, { 97, 32, 258 } },
	{ "na\xc3\xafve caf\xc3\xa9", 12, { 110, 97, 195, 175, 118, 101, 32, 99, 97, 102, 195, 169 } },
	{ "<|begin_of_text|>the<|end_of_text|>", 4, { 262, 116, 257, 263 } },
	{ "hi<|user|>the", 5, { 104, 105, 264, 116, 257 } },
	{ "", 0, { 0 } },
};

static void check_bytelevel(const struct fkv_tokenizer *t)
{
	for (size_t i = 0; i < sizeof bl_known / sizeof bl_known[0]; i++) {
		expect_ids(t, bl_known[i].text, false, bl_known[i].ids, bl_known[i].n);
		if (!strstr(bl_known[i].text, "_of_text|>")) /* specials decode to nothing */
			expect_roundtrip(t, bl_known[i].text);
	}
	assert_int_equal(tokenizer_vocab_size(t), 265);
	assert_int_equal(tokenizer_bos(t), 262);
	assert_int_equal(tokenizer_eos(t), 263);
	assert_true(tokenizer_adds_bos(t));
	expect_ids(t, "the", true, (int[]){ 262, 116, 257 }, 3);
	char *text = NULL;
	int ids[] = { 262, 116, 257, 258, 264, 263, 0, 255 };
	assert_int_equal(tokenizer_decode(t, ids, 8, &text), 17);
	assert_memory_equal(text, "the the<|user|>\0\xff", 17);
	free(text);
	char buf[8];
	assert_int_equal(tokenizer_piece(t, 258, buf, sizeof buf), 4);
	assert_memory_equal(buf, " the", 4);
}

static char *make_tmpdir(void)
{
	char *dir = strdup("/tmp/fkv_tok_XXXXXX");
	assert_non_null(dir);
	assert_non_null(mkdtemp(dir));
	return dir;
}

static void rm_tmpdir(char *dir)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
	free(dir);
}

static void test_bytelevel_json_and_gguf(void **state)
{
	(void)state;
	char *dir = make_tmpdir(), path[512], err[512] = "";
	struct fkv_tokenizer *js = NULL, *jp = NULL, *gg = NULL;
	snprintf(path, sizeof path, "%s/tokenizer.json", dir);
	bl_write_json(dir, false);
	int rc = tokenizer_load_json(path, &js, err, sizeof err);
	if (rc)
		fprintf(stderr, "%s\n", err);
	assert_int_equal(rc, 0);
	bl_write_json(dir, true);
	assert_int_equal(tokenizer_load_json(path, &jp, err, sizeof err), 0);
	struct gbuf b;
	struct gguf_ctx *g = NULL;
	bl_gguf(&b);
	rc = gguf_open_buf(b.buf.p, b.buf.n, &g, err, sizeof err);
	if (rc == 0)
		rc = tokenizer_load_gguf(g, &gg, err, sizeof err);
	if (rc)
		fprintf(stderr, "%s\n", err);
	assert_int_equal(rc, 0);

	check_bytelevel(js);
	check_bytelevel(jp);
	check_bytelevel(gg);
	uint64_t rng = 99;
	char text[512];
	for (int iter = 0; iter < 1000; iter++) {
		random_text(&rng, text, sizeof text, false);
		int *a = NULL, *c = NULL;
		int na = tokenizer_encode(js, text, false, &a), nc = tokenizer_encode(gg, text, false, &c);
		assert_true(na >= 0);
		assert_int_equal(na, nc);
		assert_memory_equal(a, c, (size_t)na * sizeof *a);
		free(a);
		free(c);
		expect_roundtrip(js, text);
	}
	tokenizer_free(js);
	tokenizer_free(jp);
	tokenizer_free(gg);
	gguf_close(g);
	free(b.buf.p);
	rm_tmpdir(dir);
}

/* Qwen2 ships a ByteLevel post_processor with no "single" template and no bos_token: loading
 * must not trip over the missing template, and no BOS is added. */
static void test_bytelevel_post_processor_without_template(void **state)
{
	(void)state;
	char *dir = make_tmpdir(), path[512], err[512] = "";
	bl_write_json(dir, false);
	snprintf(path, sizeof path, "%s/tokenizer.json", dir);
	json_object *root = json_object_from_file(path);
	assert_non_null(root);
	json_object_object_add(root, "post_processor", json_tokener_parse(
		"{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,"
		"\"use_regex\":false}"));
	assert_int_equal(json_object_to_file_ext(path, root, JSON_C_TO_STRING_PLAIN), 0);
	json_object_put(root);
	snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
	write_file(path, "{\"eos_token\": \"<|end_of_text|>\", \"bos_token\": null}");
	snprintf(path, sizeof path, "%s/tokenizer.json", dir);
	struct fkv_tokenizer *t = NULL;
	int rc = tokenizer_load_json(path, &t, err, sizeof err);
	if (rc)
		fprintf(stderr, "%s\n", err);
	assert_int_equal(rc, 0);
	assert_false(tokenizer_adds_bos(t));
	int *ids = NULL;
	int n = tokenizer_encode(t, "hello", true, &ids);
	assert_true(n > 0);
	for (int i = 0; i < n; i++)
		assert_int_not_equal(ids[i], 262); /* <|begin_of_text|> */
	free(ids);
	tokenizer_free(t);
	rm_tmpdir(dir);
}

/* Qwen2's tokenizer.json normalises to NFC: decomposed and composed spellings of the same text
 * must give the same ids (and without the normalizer they must not); specials are still
 * matched on the raw text; invalid UTF-8 is -EILSEQ under NFC (tolerated without it). The
 * composed forms below are written out from the Unicode tables, not computed. */
static void test_bytelevel_nfc(void **state)
{
	(void)state;
	static const struct {
		const char *raw, *nfc;
	} pairs[] = {
		{ "caf" "e\xcc\x81", "caf\xc3\xa9" },			/* e + U+0301 -> U+00E9 */
		{ "\xe2\x84\xab ngstr", "\xc3\x85 ngstr" },		/* U+212B ANGSTROM SIGN -> U+00C5 */
		{ "e\xcc\xa3\xcc\x82 e\xcc\x82\xcc\xa3", "\xe1\xbb\x87 \xe1\xbb\x87" }, /* both orders -> U+1EC7 */
		{ "<|user|>A\xcc\x8a the", "<|user|>\xc3\x85 the" },	/* A + U+030A -> U+00C5 */
		{ "\xe1\x84\x80\xe1\x85\xa1", "\xea\xb0\x80" },		/* Hangul jamo -> U+AC00 */
	};
	static const char *const normalizers[] = {
		"{\"type\":\"NFC\"}",
		"{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"}]}",
	};
	char *dir = make_tmpdir(), path[512], err[512] = "";
	snprintf(path, sizeof path, "%s/tokenizer.json", dir);
	bl_write_json(dir, false);
	struct fkv_tokenizer *plain = NULL;
	assert_int_equal(tokenizer_load_json(path, &plain, err, sizeof err), 0);
	json_object *root = json_object_from_file(path);
	assert_non_null(root);
	for (size_t k = 0; k < sizeof normalizers / sizeof normalizers[0]; k++) {
		json_object_object_add(root, "normalizer", json_tokener_parse(normalizers[k]));
		assert_int_equal(json_object_to_file_ext(path, root, JSON_C_TO_STRING_PLAIN), 0);
		struct fkv_tokenizer *t = NULL;
		int rc = tokenizer_load_json(path, &t, err, sizeof err);
		if (rc)
			fail_msg("%s: %s", normalizers[k], err);
		for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
			int *a = NULL, *b = NULL, *c = NULL, *d = NULL;
			int na = tokenizer_encode(t, pairs[i].raw, false, &a);
			int nb = tokenizer_encode(t, pairs[i].nfc, false, &b);
			int nc = tokenizer_encode(plain, pairs[i].raw, false, &c);
			int nd = tokenizer_encode(plain, pairs[i].nfc, false, &d);
			assert_true(na > 0 && nc > 0);
			assert_int_equal(na, nb);
			assert_memory_equal(a, b, (size_t)na * sizeof *a);
			assert_int_equal(nb, nd); /* composed text is left as it is */
			assert_memory_equal(b, d, (size_t)nb * sizeof *b);
			assert_true(nc != na || memcmp(c, a, (size_t)na * sizeof *a));
			if (!strncmp(pairs[i].raw, "<|user|>", 8))
				assert_int_equal(a[0], 264);
			char *text = NULL;
			assert_true(tokenizer_decode(t, a, na, &text) >= 0);
			assert_string_equal(text, pairs[i].nfc);
			free(text);
			free(a);
			free(b);
			free(c);
			free(d);
		}
		static const char *const invalid[] = { "caf\xff", "e\xcc", "\xc0\xaf", "ok \xed\xa0\x80" };
		for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
			int *ids = (int *)1;
			assert_int_equal(tokenizer_encode(t, invalid[i], false, &ids), -EILSEQ);
			assert_null(ids);
			int n = tokenizer_encode(plain, invalid[i], false, &ids);
			assert_true(n > 0);
			free(ids);
		}
		int *ids = NULL; /* invalid bytes after a special: the special is no excuse */
		assert_int_equal(tokenizer_encode(t, "<|user|>\x80", true, &ids), -EILSEQ);
		tokenizer_free(t);
	}
	json_object_put(root);
	tokenizer_free(plain);
	rm_tmpdir(dir);
}

/* ---- malformed input ---- */

static void expect_json_error(const char *dir, const char *text, int want, const char *needle)
{
	char path[512], err[512] = "";
	struct fkv_tokenizer *t = (struct fkv_tokenizer *)1;
	snprintf(path, sizeof path, "%s/tokenizer.json", dir);
	write_file(path, text);
	int rc = tokenizer_load_json(path, &t, err, sizeof err);
	if (rc != want || !strstr(err, needle))
		fprintf(stderr, "json %s: rc %d, err \"%s\" (want %d, \"%s\")\n", text, rc, err, want, needle);
	assert_int_equal(rc, want);
	assert_non_null(strstr(err, needle));
	assert_null(t);
}

static void test_json_malformed(void **state)
{
	(void)state;
	char *dir = make_tmpdir();
	expect_json_error(dir, "{", -EINVAL, "not valid JSON");
	expect_json_error(dir, "{}", -EINVAL, "model");
	expect_json_error(dir, "{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", -ENOTSUP, "Unigram");
	expect_json_error(dir, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", -EINVAL,
			  "model.vocab[\"a\"]");
	expect_json_error(dir, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a c\"]}}",
			  -EINVAL, "merges[0]");
	expect_json_error(dir, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}",
			  -EINVAL, "merged token");
	expect_json_error(dir, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[[\"a\"]]}}", -EINVAL,
			  "merges[0]");
	expect_json_error(dir, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":{}}}", -EINVAL,
			  "model.merges");
	expect_json_error(dir, "{\"added_tokens\":[{\"id\":1}],\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
			  -EINVAL, "added_tokens[0]");
	expect_json_error(dir, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
			       "\"pre_tokenizer\":{\"type\":\"WhitespaceSplit\"}}", -ENOTSUP, "WhitespaceSplit");
	expect_json_error(dir, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
			       "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"x\"},"
			       "\"behavior\":\"Merged\"}}", -ENOTSUP, "behavior \"Merged\"");
	expect_json_error(dir, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
			       "\"pre_tokenizer\":{\"type\":\"Split\",\"behavior\":\"Isolated\"}}", -EINVAL,
			  "Split needs pattern");
	/* ByteLevel maps the text to its byte alphabet: nothing may cut it after that. */
	expect_json_error(dir, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
			       "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"ByteLevel\"},"
			       "{\"type\":\"Digits\"}]}}", -ENOTSUP, "\"Digits\" after ByteLevel");
	expect_json_error(dir, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
			       "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"prepend_scheme\":\"sometimes\"}}",
			  -EINVAL, "sometimes");
	expect_json_error(dir, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
			       "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"}}",
			  -EINVAL, "regex");
	expect_json_error(dir, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
			       "\"normalizer\":{\"type\":\"Lowercase\"}}", -ENOTSUP, "Lowercase");
	expect_json_error(dir, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
			       "\"decoder\":{\"type\":\"Sequence\"}}", -EINVAL, "decoders");
	/* A real file cut in half. */
	const char *real = test_model_path("stories260K/hf/tokenizer.json");
	if (real) {
		FILE *f = fopen(real, "r");
		assert_non_null(f);
		char buf[8000];
		size_t n = fread(buf, 1, sizeof buf - 1, f);
		fclose(f);
		buf[n] = '\0';
		expect_json_error(dir, buf, -EINVAL, "not valid JSON");
	}
	/* A broken file beside a good tokenizer.json is an error, not silently ignored. */
	char path[512], err[512] = "";
	snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
	write_file(path, "{\"bos_token\": ");
	expect_json_error(dir, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", -EINVAL,
			  "tokenizer_config.json");
	struct fkv_tokenizer *t = NULL;
	snprintf(path, sizeof path, "%s/absent.json", dir);
	assert_int_equal(tokenizer_load_json(path, &t, err, sizeof err), -ENOENT);
	assert_non_null(strstr(err, "absent.json"));
	rm_tmpdir(dir);
}

static void expect_gguf_error(struct gbuf *b, int want, const char *needle)
{
	char err[512] = "";
	struct gguf_ctx *g = NULL;
	struct fkv_tokenizer *t = (struct fkv_tokenizer *)1;
	gb_end(b);
	assert_int_equal(gguf_open_buf(b->buf.p, b->buf.n, &g, err, sizeof err), 0);
	int rc = tokenizer_load_gguf(g, &t, err, sizeof err);
	if (rc != want || !strstr(err, needle))
		fprintf(stderr, "gguf: rc %d, err \"%s\" (want %d, \"%s\")\n", rc, err, want, needle);
	assert_int_equal(rc, want);
	assert_non_null(strstr(err, needle));
	assert_null(t);
	gguf_close(g);
	free(b->buf.p);
}

static void test_gguf_malformed(void **state)
{
	(void)state;
	const char *toks[] = { "<unk>", "a", "b", "ab" };
	float scores[] = { 0, -1, -2, -3 }, short_scores[] = { 0, 0 };
	int32_t bad_types[] = { 2, 1, 9, 1 };
	struct gbuf b;

	gb_begin(&b);
	gb_kv_str(&b, "tokenizer.ggml.model", "bert");
	expect_gguf_error(&b, -ENOTSUP, "bert");

	gb_begin(&b);
	expect_gguf_error(&b, -ENOENT, "tokenizer.ggml.model");

	gb_begin(&b);
	gb_kv_str(&b, "tokenizer.ggml.model", "llama");
	expect_gguf_error(&b, -ENOENT, "tokenizer.ggml.tokens");

	gb_begin(&b);
	gb_kv_str(&b, "tokenizer.ggml.model", "llama");
	gb_kv_strs(&b, "tokenizer.ggml.tokens", toks, 4);
	gb_kv_arr32(&b, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, short_scores, 2);
	expect_gguf_error(&b, -EINVAL, "scores");

	gb_begin(&b);
	gb_kv_str(&b, "tokenizer.ggml.model", "llama");
	gb_kv_strs(&b, "tokenizer.ggml.tokens", toks, 4);
	gb_kv_arr32(&b, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, 4);
	gb_kv_arr32(&b, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, bad_types, 4);
	expect_gguf_error(&b, -EINVAL, "token_type[2]");

	gb_begin(&b);
	gb_kv_str(&b, "tokenizer.ggml.model", "llama");
	gb_kv_strs(&b, "tokenizer.ggml.tokens", toks, 4);
	gb_kv_arr32(&b, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, 4);
	gb_kv_u32(&b, "tokenizer.ggml.bos_token_id", 4);
	expect_gguf_error(&b, -EINVAL, "bos_token_id");

	gb_begin(&b);
	gb_kv_str(&b, "tokenizer.ggml.model", "gpt2");
	gb_kv_strs(&b, "tokenizer.ggml.tokens", toks, 4);
	expect_gguf_error(&b, -ENOENT, "merges");

	gb_begin(&b);
	gb_kv_str(&b, "tokenizer.ggml.model", "gpt2");
	gb_kv_str(&b, "tokenizer.ggml.pre", "no-such-pre");
	gb_kv_strs(&b, "tokenizer.ggml.tokens", toks, 4);
	expect_gguf_error(&b, -ENOTSUP, "\"no-such-pre\" is not supported; known: default");

	const char *bad_merge[] = { "a c" };
	gb_begin(&b);
	gb_kv_str(&b, "tokenizer.ggml.model", "gpt2");
	gb_kv_strs(&b, "tokenizer.ggml.tokens", toks, 4);
	gb_kv_strs(&b, "tokenizer.ggml.merges", bad_merge, 1);
	expect_gguf_error(&b, -EINVAL, "merges[0]");
}

/* A tiny SentencePiece vocabulary in GGUF, to pin the merge order: with scores "ab" > "bc" the
 * leftmost-best rule gives ab|c, with "bc" preferred a|bc; "x" is missing so it falls back to
 * <0x78>, and the missing "▁" is spelled as bytes too. */
static void test_gguf_score_order(void **state)
{
	(void)state;
	const char *toks[] = { "<unk>", "<s>", "</s>", "<0x78>", "<0xE2>", "<0x96>", "<0x81>",
			       "a", "b", "c", "ab", "bc" };
	int32_t types[] = { 2, 3, 3, 6, 6, 6, 6, 1, 1, 1, 1, 1 };
	float s1[] = { 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -2, -3 };
	float s2[] = { 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -3, -2 };
	for (int k = 0; k < 2; k++) {
		struct gbuf b;
		char err[512] = "";
		struct gguf_ctx *g = NULL;
		struct fkv_tokenizer *t = NULL;
		gb_begin(&b);
		gb_kv_str(&b, "tokenizer.ggml.model", "llama");
		gb_kv_strs(&b, "tokenizer.ggml.tokens", toks, 12);
		gb_kv_arr32(&b, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, k ? s2 : s1, 12);
		gb_kv_arr32(&b, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, 12);
		gb_kv_u32(&b, "tokenizer.ggml.bos_token_id", 1);
		gb_kv_u32(&b, "tokenizer.ggml.eos_token_id", 2);
		gb_kv_bool(&b, "tokenizer.ggml.add_space_prefix", false);
		gb_end(&b);
		assert_int_equal(gguf_open_buf(b.buf.p, b.buf.n, &g, err, sizeof err), 0);
		assert_int_equal(tokenizer_load_gguf(g, &t, err, sizeof err), 0);
		if (k == 0)
			expect_ids(t, "abcx", true, (int[]){ 1, 10, 9, 3 }, 4);
		else
			expect_ids(t, "abcx", true, (int[]){ 1, 7, 11, 3 }, 4);
		/* No dummy prefix here; the space becomes "▁", which only exists as bytes. Decoding
		 * gives the bytes of "▁" back, as HF's decoder chain does (Replace runs on token texts
		 * before ByteFallback turns <0xNN> into bytes). */
		expect_ids(t, "a b", false, (int[]){ 7, 4, 5, 6, 8 }, 5);
		char *text = NULL;
		assert_int_equal(tokenizer_decode(t, (int[]){ 7, 4, 5, 6, 8 }, 5, &text), 5);
		assert_string_equal(text, "a\xe2\x96\x81" "b");
		free(text);
		tokenizer_free(t);
		gguf_close(g);
		free(b.buf.p);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bytelevel_json_and_gguf),
		cmocka_unit_test(test_bytelevel_post_processor_without_template),
		cmocka_unit_test(test_bytelevel_nfc),
		cmocka_unit_test(test_json_malformed),
		cmocka_unit_test(test_gguf_malformed),
		cmocka_unit_test(test_gguf_score_order),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
