/* Tests worker/gguf.c on a file shaped like a real model's: a 50,000-token vocabulary (tokens,
 * scores, token types, merges), metadata of every kind before and after the big arrays (a
 * small string array first, as general.languages is, and a chat template), and 345 tensors
 * with distinct shapes, offsets and bytes; every key, value, vocabulary entry and tensor is
 * read back, from a file (gguf_open) and from an exact-size heap copy (gguf_open_buf).
 *
 * Why: the reader copies key names, string values and tensor names into one arena that grows
 * (and moves) while the file is parsed. A reader that resolved the keys to pointers before
 * appending the tensor names lost 'general.architecture' on SmolLM2 (272 tensors): the arena
 * moved, and the allocator reused the head of the freed block, where the first key lay. Here
 * the tensor names alone make the arena grow twice, so the stale read shows up as a
 * wrong key even without a sanitizer (and as a use-after-free under ASan or valgrind). */
#include "test_buf.h"

#include <errno.h>
#include <math.h>
#include <sys/stat.h>

#include "gguf.h"

#define N_VOCAB 50000
#define N_MERGES 1000
#define N_LAYERS 38
#define N_PER_LAYER 9
#define N_TENSORS (N_LAYERS * N_PER_LAYER + 3)
#define ALIGN 32

static const char *const layer_tensors[N_PER_LAYER] = {
	"attn_norm.weight", "attn_q.weight",   "attn_k.weight", "attn_v.weight", "attn_output.weight",
	"ffn_norm.weight",  "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
};

static const char TEMPLATE[] =
	"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
	"{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
	"{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
	"{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

static void put(struct test_buf *b, const void *src, size_t n) { test_buf_put(b, src, n); }
static void put_u32(struct test_buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct test_buf *b, uint64_t v) { put(b, &v, 8); }
static void put_f32(struct test_buf *b, float v) { put(b, &v, 4); }
static void put_str(struct test_buf *b, const char *s)
{
	put_u64(b, strlen(s));
	put(b, s, strlen(s));
}
static void put_key(struct test_buf *b, const char *k, uint32_t type)
{
	put_str(b, k);
	put_u32(b, type);
}

/* Vocabulary entry i: distinct, of varying length, some with multi-byte UTF-8. */
static void token(int i, char *out, size_t len)
{
	if (i % 3 == 0)
		snprintf(out, len, "\xe2\x96\x81w%d", i);
	else if (i % 3 == 1)
		snprintf(out, len, "t%d%.*s", i, i % 11, "abcdefghijk");
	else
		snprintf(out, len, "\xc4\xa0%05d", i);
}

static float score(int i) { return -0.25f * (float)i; }
static int32_t token_type(int i) { return 1 + i % 6; }

struct tinfo {
	char name[64];
	int n_dims;
	uint64_t ne[2];
	uint64_t offset;
};

static void tensor_table(struct tinfo *t)
{
	int k = 0;
	snprintf(t[k].name, sizeof t[k].name, "token_embd.weight");
	t[k].n_dims = 2, t[k].ne[0] = 16, t[k].ne[1] = 40, k++;
	snprintf(t[k].name, sizeof t[k].name, "output_norm.weight");
	t[k].n_dims = 1, t[k].ne[0] = 16, t[k].ne[1] = 1, k++;
	snprintf(t[k].name, sizeof t[k].name, "output.weight");
	t[k].n_dims = 2, t[k].ne[0] = 16, t[k].ne[1] = 41, k++;
	for (int l = 0; l < N_LAYERS; l++) {
		for (int j = 0; j < N_PER_LAYER; j++, k++) {
			snprintf(t[k].name, sizeof t[k].name, "blk.%d.%s", l, layer_tensors[j]);
			bool norm = j == 0 || j == 5;
			t[k].n_dims = norm ? 1 : 2;
			t[k].ne[0] = 1 + (uint64_t)(l + j) % 13;
			t[k].ne[1] = norm ? 1 : 2 + (uint64_t)j;
		}
	}
	uint64_t off = 0;
	for (int i = 0; i < N_TENSORS; i++) {
		t[i].offset = off;
		off += (t[i].ne[0] * t[i].ne[1] * 4 + ALIGN - 1) / ALIGN * ALIGN;
	}
}

/* Element e of tensor i: names the tensor and the element. */
static float tensor_value(int i, uint64_t e) { return (float)i + (float)e / 1024.0f; }

/* The metadata scalars after the vocabulary, checked one by one. */
static const struct {
	const char *key;
	uint32_t v;
} ints_after[] = {
	{ "llama.block_count", N_LAYERS },	    { "llama.context_length", 8192 },
	{ "llama.embedding_length", 576 },	    { "llama.feed_forward_length", 1536 },
	{ "llama.attention.head_count", 9 },	    { "llama.attention.head_count_kv", 3 },
	{ "llama.rope.dimension_count", 64 },	    { "llama.vocab_size", N_VOCAB },
	{ "tokenizer.ggml.bos_token_id", 1 },	    { "tokenizer.ggml.eos_token_id", 2 },
	{ "tokenizer.ggml.unknown_token_id", 0 }, { "general.file_type", 0 },
};
#define N_INTS (sizeof ints_after / sizeof ints_after[0])
/* general.architecture, general.name, general.languages, tokenizer.ggml.model,
 * tokenizer.ggml.pre, tokens, scores, token_type, merges, llama.rope.freq_base,
 * llama.attention.layer_norm_rms_epsilon, tokenizer.ggml.add_bos_token,
 * tokenizer.chat_template, then the ints */
#define N_KV (13 + N_INTS)

static struct test_buf make_large(const struct tinfo *t)
{
	struct test_buf b = { 0 };
	char s[64];
	put_u32(&b, 0x46554747u);
	put_u32(&b, 3);
	put_u64(&b, N_TENSORS);
	put_u64(&b, N_KV);
	put_key(&b, "general.architecture", GGUF_TYPE_STRING);
	put_str(&b, "llama");
	put_key(&b, "general.name", GGUF_TYPE_STRING);
	put_str(&b, "Large Test Model 135M");
	put_key(&b, "general.languages", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_STRING);
	put_u64(&b, 1);
	put_str(&b, "en");
	put_key(&b, "tokenizer.ggml.model", GGUF_TYPE_STRING);
	put_str(&b, "gpt2");
	put_key(&b, "tokenizer.ggml.pre", GGUF_TYPE_STRING);
	put_str(&b, "smollm");
	put_key(&b, "tokenizer.ggml.tokens", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_STRING);
	put_u64(&b, N_VOCAB);
	for (int i = 0; i < N_VOCAB; i++) {
		token(i, s, sizeof s);
		put_str(&b, s);
	}
	put_key(&b, "tokenizer.ggml.scores", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_FLOAT32);
	put_u64(&b, N_VOCAB);
	for (int i = 0; i < N_VOCAB; i++)
		put_f32(&b, score(i));
	put_key(&b, "tokenizer.ggml.token_type", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_INT32);
	put_u64(&b, N_VOCAB);
	for (int i = 0; i < N_VOCAB; i++) {
		int32_t v = token_type(i);
		put(&b, &v, 4);
	}
	put_key(&b, "tokenizer.ggml.merges", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_STRING);
	put_u64(&b, N_MERGES);
	for (int i = 0; i < N_MERGES; i++) {
		snprintf(s, sizeof s, "m%d n%d", i, i + 1);
		put_str(&b, s);
	}
	put_key(&b, "llama.rope.freq_base", GGUF_TYPE_FLOAT32);
	put_f32(&b, 100000.0f);
	put_key(&b, "llama.attention.layer_norm_rms_epsilon", GGUF_TYPE_FLOAT32);
	put_f32(&b, 1e-5f);
	put_key(&b, "tokenizer.ggml.add_bos_token", GGUF_TYPE_BOOL);
	uint8_t no = 0;
	put(&b, &no, 1);
	put_key(&b, "tokenizer.chat_template", GGUF_TYPE_STRING);
	put_str(&b, TEMPLATE);
	for (size_t i = 0; i < N_INTS; i++) {
		put_key(&b, ints_after[i].key, GGUF_TYPE_UINT32);
		put_u32(&b, ints_after[i].v);
	}
	for (int i = 0; i < N_TENSORS; i++) {
		put_str(&b, t[i].name);
		put_u32(&b, (uint32_t)t[i].n_dims);
		for (int d = 0; d < t[i].n_dims; d++)
			put_u64(&b, t[i].ne[d]);
		put_u32(&b, 0); /* F32 */
		put_u64(&b, t[i].offset);
	}
	uint8_t zero = 0;
	while (b.n % ALIGN)
		put(&b, &zero, 1);
	for (int i = 0; i < N_TENSORS; i++) {
		uint64_t n = t[i].ne[0] * t[i].ne[1];
		for (uint64_t e = 0; e < n; e++)
			put_f32(&b, tensor_value(i, e));
		while (b.n % ALIGN)
			put(&b, &zero, 1);
	}
	return b;
}

static void check_str(const struct gguf_ctx *g, const char *key, const char *want)
{
	const char *s;
	size_t len;
	if (gguf_get_str(g, key, &s, &len))
		fail_msg("key '%s': not found as a string", key);
	if (len != strlen(want) || strcmp(s, want))
		fail_msg("key '%s': got '%.40s', want '%.40s'", key, s, want);
}

/* Every key, in file order and by name, every value, every vocabulary entry, every tensor. */
static void check_all(const struct gguf_ctx *g, const struct tinfo *t, const uint8_t *base)
{
	static const char *const order[13] = {
		"general.architecture", "general.name", "general.languages", "tokenizer.ggml.model",
		"tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
		"tokenizer.ggml.token_type", "tokenizer.ggml.merges", "llama.rope.freq_base",
		"llama.attention.layer_norm_rms_epsilon", "tokenizer.ggml.add_bos_token",
		"tokenizer.chat_template",
	};
	assert_int_equal(gguf_n_kv(g), N_KV);
	for (int64_t i = 0; i < (int64_t)N_KV; i++) {
		const char *want = i < 13 ? order[i] : ints_after[i - 13].key;
		const char *got = gguf_key(g, i);
		if (!got || strcmp(got, want))
			fail_msg("key %lld: got '%.40s', want '%s'", (long long)i, got ? got : "(null)", want);
		assert_int_equal(gguf_find_key(g, want), i);
	}
	check_str(g, "general.architecture", "llama");
	check_str(g, "general.name", "Large Test Model 135M");
	check_str(g, "tokenizer.ggml.model", "gpt2");
	check_str(g, "tokenizer.ggml.pre", "smollm");
	check_str(g, "tokenizer.chat_template", TEMPLATE);
	for (size_t i = 0; i < N_INTS; i++) {
		uint32_t v;
		assert_int_equal(gguf_get_u32(g, ints_after[i].key, &v), 0);
		assert_int_equal(v, ints_after[i].v);
	}
	float f;
	assert_int_equal(gguf_get_f32(g, "llama.rope.freq_base", &f), 0);
	assert_true(f == 100000.0f);
	assert_int_equal(gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f), 0);
	assert_true(f == 1e-5f);
	bool bo = true;
	assert_int_equal(gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &bo), 0);
	assert_false(bo);

	struct gguf_arr a, sc, ty;
	assert_int_equal(gguf_get_arr(g, "general.languages", &a), 0);
	assert_int_equal(a.n, 1);
	assert_true(a.strs[0].len == 2 && !memcmp(a.strs[0].s, "en", 2));
	assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.tokens", &a), 0);
	assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.scores", &sc), 0);
	assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.token_type", &ty), 0);
	assert_int_equal(a.type, GGUF_TYPE_STRING);
	assert_int_equal(a.n, N_VOCAB);
	assert_int_equal(sc.n, N_VOCAB);
	assert_int_equal(ty.n, N_VOCAB);
	for (int i = 0; i < N_VOCAB; i++) {
		char s[64];
		token(i, s, sizeof s);
		if (a.strs[i].len != strlen(s) || memcmp(a.strs[i].s, s, a.strs[i].len))
			fail_msg("token %d: got '%.*s', want '%s'", i, (int)a.strs[i].len, a.strs[i].s, s);
		int64_t tt;
		assert_int_equal(gguf_arr_f32(&sc, (uint64_t)i, &f), 0);
		assert_true(f == score(i));
		assert_int_equal(gguf_arr_int(&ty, (uint64_t)i, &tt), 0);
		assert_int_equal(tt, token_type(i));
	}
	/* and a few spelled out, independent of token() */
	static const struct {
		int id;
		const char *s;
	} spot[] = { { 0, "\xe2\x96\x81w0" }, { 1, "t1a" }, { 2, "\xc4\xa0" "00002" },
		     { 12345, "\xe2\x96\x81w12345" }, { 49999, "t49999abcd" } };
	for (size_t i = 0; i < sizeof spot / sizeof spot[0]; i++) {
		const struct gguf_str *x = &a.strs[spot[i].id];
		assert_int_equal(x->len, strlen(spot[i].s));
		assert_memory_equal(x->s, spot[i].s, x->len);
	}
	assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.merges", &a), 0);
	assert_int_equal(a.n, N_MERGES);
	assert_true(a.strs[999].len == 10 && !memcmp(a.strs[999].s, "m999 n1000", 10));

	assert_int_equal(gguf_n_tensors(g), N_TENSORS);
	uint64_t data_off = gguf_data_offset(g);
	assert_int_equal(data_off % ALIGN, 0);
	for (int64_t i = 0; i < N_TENSORS; i++) {
		const struct gguf_tensor_info *ti = gguf_tensor(g, i);
		if (strcmp(ti->name, t[i].name))
			fail_msg("tensor %lld: name '%.40s', want '%s'", (long long)i, ti->name, t[i].name);
		assert_int_equal(gguf_find_tensor(g, t[i].name), i);
		assert_int_equal(ti->n_dims, t[i].n_dims);
		assert_int_equal(ti->ne[0], t[i].ne[0]);
		assert_int_equal(ti->ne[1], t[i].ne[1]);
		assert_int_equal(ti->offset, t[i].offset);
		assert_int_equal(ti->dtype, FKV_F32);
		uint64_t n = t[i].ne[0] * t[i].ne[1];
		assert_int_equal(ti->size, n * 4);
		assert_ptr_equal(ti->data, base + data_off + t[i].offset);
		for (uint64_t e = 0; e < n; e++) {
			float v;
			memcpy(&v, (const uint8_t *)ti->data + e * 4, 4);
			if (v != tensor_value((int)i, e))
				fail_msg("tensor '%s' element %llu: %g", ti->name, (unsigned long long)e, (double)v);
		}
	}
}

static void test_large_from_buffer(void **state)
{
	(void)state;
	static struct tinfo t[N_TENSORS];
	tensor_table(t);
	struct test_buf b = make_large(t);
	uint8_t *copy = malloc(b.n);
	assert_non_null(copy);
	memcpy(copy, b.p, b.n);
	struct gguf_ctx *g;
	char err[256];
	if (gguf_open_buf(copy, b.n, &g, err, sizeof err))
		fail_msg("gguf_open_buf: %s", err);
	check_all(g, t, copy);
	gguf_close(g);
	free(copy);
	free(b.p);
}

/* Three contexts open at once on the same file: each is independent of the others, and each
 * parse meets the allocator in another state. */
static void test_large_from_file(void **state)
{
	(void)state;
	static struct tinfo t[N_TENSORS];
	tensor_table(t);
	struct test_buf b = make_large(t);
	char dir[] = "/tmp/freekv-gguf-large-XXXXXX", path[128];
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/large.gguf", dir);
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(b.p, 1, b.n, f), b.n);
	assert_int_equal(fclose(f), 0);
	free(b.p);
	struct gguf_ctx *g[3];
	char err[256];
	for (int k = 0; k < 3; k++) {
		if (gguf_open(path, &g[k], err, sizeof err))
			fail_msg("gguf_open #%d: %s", k, err);
	}
	unlink(path);
	rmdir(dir);
	for (int k = 0; k < 3; k++) {
		check_all(g[k], t, gguf_base(g[k]));
		gguf_close(g[k]);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_large_from_buffer),
		cmocka_unit_test(test_large_from_file),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
