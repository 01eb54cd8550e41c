/* Tests worker/model/gguf.c: the real stories260K.gguf (metadata of every kind the tokenizer needs,
 * tensor table, tensor bytes checked against the independent llama2.c checkpoint), GGUF files
 * built here byte by byte (every metadata type, alignment, F16/BF16), and broken variants:
 * bad magic/version, quantized tensors (sized by block, described but without a dtype), unknown
 * tensor types, lying counts and offsets, every truncation of
 * the header and a sample of the data, and a random mutation/truncation fuzz loop (run it under
 * ASan: no crash, no over-read, no leak). */
#include "test_buf.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "gguf.h"

/* ---- a little GGUF writer ---- */

static void put(struct test_buf *b, const void *src, size_t n)
{
	test_buf_put(b, src, n);
}

static void put_u8(struct test_buf *b, uint8_t v) { put(b, &v, 1); }
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
static void pad_to(struct test_buf *b, size_t align)
{
	while (b->n % align)
		put_u8(b, 0);
}

/* Options for the synthetic file; each flag breaks one thing. */
struct mk {
	uint32_t magic, version;
	uint32_t tensor_type;	/* of tensor "b" */
	uint64_t b_ne0;		/* elements of tensor "b" */
	uint64_t b_offset;	/* data offset of tensor "b" */
	uint64_t kv_count_delta;
	bool dup_key;
};

#define MK_DEFAULT { .magic = 0x46554747u, .version = 3, .tensor_type = 1, .b_offset = 64, .b_ne0 = 4 }

/* 15 metadata entries of every type, alignment 64, tensors: "a" f32 (3, 2), "b" (type opt) (4), "c" bf16 (2, 2). */
static struct test_buf make_gguf(const struct mk *o)
{
	struct test_buf b = { 0 };
	put_u32(&b, o->magic);
	put_u32(&b, o->version);
	put_u64(&b, 3);
	put_u64(&b, 15 + o->kv_count_delta + (o->dup_key ? 1 : 0));
	put_key(&b, "general.architecture", GGUF_TYPE_STRING);
	put_str(&b, "llama");
	put_key(&b, "general.alignment", GGUF_TYPE_UINT32);
	put_u32(&b, 64);
	put_key(&b, "t.u8", GGUF_TYPE_UINT8);
	put_u8(&b, 200);
	put_key(&b, "t.i8", GGUF_TYPE_INT8);
	put_u8(&b, 0xfe); /* -2 */
	put_key(&b, "t.u16", GGUF_TYPE_UINT16);
	uint16_t u16 = 60000;
	put(&b, &u16, 2);
	put_key(&b, "t.i16", GGUF_TYPE_INT16);
	int16_t i16 = -300;
	put(&b, &i16, 2);
	put_key(&b, "t.i32", GGUF_TYPE_INT32);
	int32_t i32 = -5;
	put(&b, &i32, 4);
	put_key(&b, "t.f32", GGUF_TYPE_FLOAT32);
	put_f32(&b, 1.5f);
	put_key(&b, "t.bool", GGUF_TYPE_BOOL);
	put_u8(&b, 1);
	put_key(&b, "t.u64", GGUF_TYPE_UINT64);
	put_u64(&b, 1ull << 40);
	put_key(&b, "t.f64", GGUF_TYPE_FLOAT64);
	double f64 = 0.25;
	put(&b, &f64, 8);
	put_key(&b, "t.strs", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_STRING);
	put_u64(&b, 3);
	put_str(&b, "a");
	put_str(&b, "");
	put_str(&b, "\xe2\x96\x81the");
	put_key(&b, "t.ints", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_INT32);
	put_u64(&b, 3);
	for (int32_t v = -1; v <= 1; v++)
		put(&b, &v, 4);
	put_key(&b, "t.nested", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_ARRAY);
	put_u64(&b, 2);
	for (int k = 0; k < 2; k++) {
		put_u32(&b, GGUF_TYPE_UINT8);
		put_u64(&b, 2);
		put_u8(&b, 1);
		put_u8(&b, 2);
	}
	if (o->dup_key) {
		put_key(&b, "t.u8", GGUF_TYPE_UINT8);
		put_u8(&b, 1);
	}
	put_key(&b, "t.floats", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_FLOAT32);
	put_u64(&b, 2);
	put_f32(&b, 0.5f);
	put_f32(&b, -2.0f);
	/* tensors */
	put_str(&b, "a");
	put_u32(&b, 2);
	put_u64(&b, 2);
	put_u64(&b, 3);
	put_u32(&b, 0);
	put_u64(&b, 0);
	put_str(&b, "b");
	put_u32(&b, 1);
	put_u64(&b, o->b_ne0);
	put_u32(&b, o->tensor_type);
	put_u64(&b, o->b_offset);
	put_str(&b, "c");
	put_u32(&b, 2);
	put_u64(&b, 2);
	put_u64(&b, 2);
	put_u32(&b, 30);
	put_u64(&b, 128);
	pad_to(&b, 64);
	for (int i = 0; i < 6; i++)
		put_f32(&b, (float)i);
	pad_to(&b, 64);
	uint16_t h[4] = { 0x3c00, 0x4000, 0xc000, 0x0000 }; /* 1, 2, -2, 0 in f16 */
	put(&b, h, sizeof h);
	pad_to(&b, 64);
	uint16_t bf[4] = { 0x3f80, 0x4040, 0xbf80, 0x0000 }; /* 1, 3, -1, 0 in bf16 */
	put(&b, bf, sizeof bf);
	return b;
}

/* Parses len bytes from an exact-size heap copy, so ASan flags any over-read. */
static int parse_copy(const void *src, size_t len, char *err, size_t errlen)
{
	void *c = malloc(len ? len : 1);
	assert_non_null(c);
	memcpy(c, src, len);
	struct gguf_ctx *g;
	int ret = gguf_open_buf(c, len, &g, err, errlen);
	if (!ret) {
		/* whatever parsed must lie inside the buffer */
		for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
			const struct gguf_tensor_info *t = gguf_tensor(g, i);
			assert_true((const uint8_t *)t->data >= (const uint8_t *)c);
			assert_true((const uint8_t *)t->data + t->size <= (const uint8_t *)c + len);
		}
		for (int64_t i = 0; i < gguf_n_kv(g); i++)
			assert_non_null(gguf_key(g, i));
		gguf_close(g);
	}
	free(c);
	return ret;
}

static void test_synthetic_all_types(void **state)
{
	(void)state;
	struct mk o = MK_DEFAULT;
	struct test_buf b = make_gguf(&o);
	struct gguf_ctx *g;
	char err[256];
	assert_int_equal(gguf_open_buf(b.p, b.n, &g, err, sizeof err), 0);
	assert_int_equal(gguf_version(g), 3);
	assert_int_equal(gguf_alignment(g), 64);
	assert_int_equal(gguf_data_offset(g) % 64, 0);
	assert_int_equal(gguf_n_kv(g), 15);
	uint32_t u;
	int32_t i;
	uint64_t u64;
	float f;
	bool bo;
	const char *s;
	size_t len;
	assert_int_equal(gguf_get_u32(g, "t.u8", &u), 0);
	assert_int_equal(u, 200);
	assert_int_equal(gguf_get_i32(g, "t.i8", &i), 0);
	assert_int_equal(i, -2);
	assert_int_equal(gguf_get_u32(g, "t.i8", &u), -EINVAL); /* negative does not fit u32 */
	assert_int_equal(gguf_get_u32(g, "t.u16", &u), 0);
	assert_int_equal(u, 60000);
	assert_int_equal(gguf_get_i32(g, "t.i16", &i), 0);
	assert_int_equal(i, -300);
	assert_int_equal(gguf_get_i32(g, "t.i32", &i), 0);
	assert_int_equal(i, -5);
	assert_int_equal(gguf_get_f32(g, "t.f32", &f), 0);
	assert_true(f == 1.5f);
	assert_int_equal(gguf_get_f32(g, "t.f64", &f), 0);
	assert_true(f == 0.25f);
	assert_int_equal(gguf_get_bool(g, "t.bool", &bo), 0);
	assert_true(bo);
	assert_int_equal(gguf_get_u64(g, "t.u64", &u64), 0);
	assert_true(u64 == 1ull << 40);
	assert_int_equal(gguf_get_u32(g, "t.u64", &u), -EINVAL); /* too large */
	assert_int_equal(gguf_get_str(g, "general.architecture", &s, &len), 0);
	assert_string_equal(s, "llama");
	assert_int_equal(len, 5);
	assert_int_equal(gguf_get_str(g, "t.u8", &s, NULL), -EINVAL);
	assert_int_equal(gguf_get_u32(g, "general.architecture", &u), -EINVAL);
	assert_int_equal(gguf_get_u32(g, "no.such.key", &u), -ENOENT);
	assert_int_equal(gguf_find_key(g, "no.such.key"), -1);
	assert_int_equal(gguf_kv_type(g, gguf_find_key(g, "t.f64")), GGUF_TYPE_FLOAT64);

	struct gguf_arr a;
	assert_int_equal(gguf_get_arr(g, "t.strs", &a), 0);
	assert_int_equal(a.type, GGUF_TYPE_STRING);
	assert_int_equal(a.n, 3);
	assert_int_equal(a.strs[0].len, 1);
	assert_memory_equal(a.strs[0].s, "a", 1);
	assert_int_equal(a.strs[1].len, 0);
	assert_int_equal(a.strs[2].len, 6);
	assert_memory_equal(a.strs[2].s, "\xe2\x96\x81the", 6);
	assert_int_equal(gguf_get_arr(g, "t.ints", &a), 0);
	int64_t v;
	for (uint64_t k = 0; k < 3; k++) {
		assert_int_equal(gguf_arr_int(&a, k, &v), 0);
		assert_int_equal(v, (int64_t)k - 1);
	}
	assert_int_equal(gguf_arr_int(&a, 3, &v), -EINVAL);
	assert_int_equal(gguf_get_arr(g, "t.floats", &a), 0);
	assert_int_equal(gguf_arr_f32(&a, 1, &f), 0);
	assert_true(f == -2.0f);
	assert_int_equal(gguf_arr_int(&a, 0, &v), -EINVAL);
	assert_int_equal(gguf_get_arr(g, "t.nested", &a), 0);
	assert_int_equal(a.type, GGUF_TYPE_ARRAY);
	assert_int_equal(a.n, 2);
	assert_null(a.data);
	assert_int_equal(gguf_get_arr(g, "t.u8", &a), -EINVAL);

	assert_int_equal(gguf_n_tensors(g), 3);
	const struct gguf_tensor_info *t = gguf_tensor(g, gguf_find_tensor(g, "a"));
	assert_int_equal(t->dtype, FKV_F32);
	assert_int_equal(t->n_dims, 2);
	assert_int_equal(t->ne[0], 2);
	assert_int_equal(t->ne[1], 3);
	assert_int_equal(t->size, 24);
	float fa[6];
	memcpy(fa, t->data, sizeof fa);
	for (int k = 0; k < 6; k++)
		assert_true(fa[k] == (float)k);
	t = gguf_tensor(g, gguf_find_tensor(g, "b"));
	assert_int_equal(t->dtype, FKV_F16);
	assert_true(f16_to_f32(((const uint16_t *)t->data)[2]) == -2.0f);
	t = gguf_tensor(g, gguf_find_tensor(g, "c"));
	assert_int_equal(t->dtype, FKV_BF16);
	assert_true(bf16_to_f32(((const uint16_t *)t->data)[1]) == 3.0f);
	assert_int_equal((uintptr_t)t->data % 64, (uintptr_t)b.p % 64);
	assert_int_equal(gguf_find_tensor(g, "d"), -1);
	assert_null(gguf_tensor(g, 3));
	gguf_close(g);
	free(b.p);
}

static void expect_error(const struct mk *o, int want, const char *needle)
{
	struct test_buf b = make_gguf(o);
	char err[256] = "";
	int ret = parse_copy(b.p, b.n, err, sizeof err);
	free(b.p);
	if (ret != want || !strstr(err, needle))
		fail_msg("want %d containing '%s', got %d: %s", want, needle, ret, err);
}

/* A quantized tensor is described and sized by its blocks, without a dtype. */
static void test_quantized_described(void **state)
{
	(void)state;
	struct mk o = MK_DEFAULT;
	o.tensor_type = 3; /* Q4_1: one block of 32 in 20 bytes */
	o.b_ne0 = 32;
	struct test_buf b = make_gguf(&o);
	struct gguf_ctx *g;
	char err[256];
	assert_int_equal(gguf_open_buf(b.p, b.n, &g, err, sizeof err), 0);
	const struct gguf_tensor_info *t = gguf_tensor(g, gguf_find_tensor(g, "b"));
	assert_int_equal(t->type, 3);
	assert_string_equal(t->type_name, "Q4_1");
	assert_false(t->has_dtype);
	assert_int_equal(t->n_elements, 32);
	assert_int_equal(t->size, 20);
	t = gguf_tensor(g, gguf_find_tensor(g, "c"));
	assert_true(t->has_dtype);
	assert_string_equal(t->type_name, "BF16");
	assert_int_equal(t->size, 8);
	gguf_close(g);
	free(b.p);
}

static void test_bad_files(void **state)
{
	(void)state;
	struct mk o = MK_DEFAULT;
	o.magic = 0x46554746u;
	expect_error(&o, -EPROTO, "magic");
	o = (struct mk)MK_DEFAULT;
	o.version = 2; /* v2 has the same layout as v3 */
	struct test_buf v2 = make_gguf(&o);
	char e2[256];
	assert_int_equal(parse_copy(v2.p, v2.n, e2, sizeof e2), 0);
	free(v2.p);
	o.version = 1;
	expect_error(&o, -EPROTO, "version 1");
	o.version = 4;
	expect_error(&o, -EPROTO, "version 4");
	o.version = 0x03000000u;
	expect_error(&o, -EPROTO, "big-endian");
	o = (struct mk)MK_DEFAULT;
	o.tensor_type = 2; /* Q4_0: blocks of 32 cannot hold a row of 4 */
	expect_error(&o, -EINVAL, "tensor 'b' of type Q4_0 has rows of 4 elements, not a multiple of its block of 32");
	o.tensor_type = 12;
	expect_error(&o, -EINVAL, "Q4_K");
	o.tensor_type = 8; /* Q8_0: 2 blocks of 34 bytes at 64 run into "c" at 128 */
	o.b_ne0 = 64;
	expect_error(&o, -EINVAL, "overlap");
	o.tensor_type = 999;
	expect_error(&o, -EPROTO, "tensor 'b' has unknown type 999");
	o.tensor_type = 31; /* retired by ggml: size unknown */
	expect_error(&o, -EPROTO, "unknown type 31");
	o = (struct mk)MK_DEFAULT;
	o.b_offset = 96; /* not a multiple of 64 */
	expect_error(&o, -EINVAL, "'b' offset 96 is not aligned");
	o.b_offset = 128; /* on top of "c" */
	expect_error(&o, -EINVAL, "overlap");
	o.b_offset = 1u << 20;
	expect_error(&o, -EINVAL, "'b'");
	o = (struct mk)MK_DEFAULT;
	o.dup_key = true;
	expect_error(&o, -EINVAL, "'t.u8' appears twice");
	o = (struct mk)MK_DEFAULT;
	o.kv_count_delta = 1ull << 40; /* more entries than bytes */
	expect_error(&o, -EINVAL, "metadata entries");
	o.kv_count_delta = 1; /* one more than written: the tensor table is read as metadata */
	char err[256];
	struct test_buf b = make_gguf(&o);
	assert_true(parse_copy(b.p, b.n, err, sizeof err) < 0);
	free(b.p);
}

/* Every cut of the synthetic file fails cleanly, at every byte. */
static void test_synthetic_truncations(void **state)
{
	(void)state;
	struct mk o = MK_DEFAULT;
	struct test_buf b = make_gguf(&o);
	char err[256];
	assert_int_equal(parse_copy(b.p, b.n, err, sizeof err), 0);
	for (size_t cut = 0; cut < b.n; cut++) {
		err[0] = 0;
		int ret = parse_copy(b.p, cut, err, sizeof err);
		if (ret != -EINVAL)
			fail_msg("cut %zu: got %d (%s)", cut, ret, err);
		assert_true(err[0] != 0);
	}
	free(b.p);
}

static void test_stories_metadata(void **state)
{
	(void)state;
	const char *path = test_model_path("stories260K/stories260K.gguf");
	if (!path)
		skip();
	struct gguf_ctx *g;
	char err[256];
	assert_int_equal(gguf_open(path, &g, err, sizeof err), 0);
	assert_int_equal(gguf_version(g), 3);
	assert_int_equal(gguf_alignment(g), 32);
	assert_int_equal(gguf_n_kv(g), 19);
	assert_int_equal(gguf_n_tensors(g), 48);
	const char *s;
	assert_int_equal(gguf_get_str(g, "tokenizer.ggml.model", &s, NULL), 0);
	assert_string_equal(s, "llama");
	assert_int_equal(gguf_get_str(g, "general.architecture", &s, NULL), 0);
	assert_string_equal(s, "llama");
	struct gguf_arr a;
	assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.tokens", &a), 0);
	assert_int_equal(a.type, GGUF_TYPE_STRING);
	assert_int_equal(a.n, 512);
	assert_true(a.strs[1].len == 3 && !memcmp(a.strs[1].s, "<s>", 3));
	assert_true(a.strs[2].len == 4 && !memcmp(a.strs[2].s, "</s>", 4));
	assert_true(a.strs[3].len == 6 && !memcmp(a.strs[3].s, "<0x00>", 6));
	assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.scores", &a), 0);
	assert_int_equal(a.type, GGUF_TYPE_FLOAT32);
	assert_int_equal(a.n, 512);
	float sc0, sc_last;
	assert_int_equal(gguf_arr_f32(&a, 300, &sc0), 0);
	assert_int_equal(gguf_arr_f32(&a, 511, &sc_last), 0);
	assert_true(sc0 > sc_last); /* merges are scored by rank: earlier pieces score higher */
	assert_int_equal(gguf_get_arr(g, "tokenizer.ggml.token_type", &a), 0);
	assert_int_equal(a.type, GGUF_TYPE_INT32);
	int64_t tt;
	assert_int_equal(gguf_arr_int(&a, 1, &tt), 0);
	assert_int_equal(tt, 3); /* control */
	assert_int_equal(gguf_arr_int(&a, 3, &tt), 0);
	assert_int_equal(tt, 6); /* byte */
	uint32_t u;
	assert_int_equal(gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &u), 0);
	assert_int_equal(u, 1);
	assert_int_equal(gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u), 0);
	assert_int_equal(u, 2);
	static const struct {
		const char *key;
		uint32_t v;
	} ints[] = {
		{ "llama.context_length", 2048 },	  { "llama.embedding_length", 64 },
		{ "llama.feed_forward_length", 172 },	  { "llama.attention.head_count", 8 },
		{ "llama.attention.head_count_kv", 4 }, { "llama.block_count", 5 },
		{ "llama.rope.dimension_count", 8 },
	};
	for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
		assert_int_equal(gguf_get_u32(g, ints[i].key, &u), 0);
		assert_int_equal(u, ints[i].v);
	}
	float eps;
	assert_int_equal(gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps), 0);
	assert_true(eps == 1e-5f);
	bool bo;
	assert_int_equal(gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &bo), -ENOENT);

	const struct gguf_tensor_info *t = gguf_tensor(g, gguf_find_tensor(g, "token_embd.weight"));
	assert_non_null(t);
	assert_int_equal(t->dtype, FKV_F32);
	assert_int_equal(t->ne[0], 64);
	assert_int_equal(t->ne[1], 512);
	assert_int_equal(gguf_data_offset(g), 14176);
	t = gguf_tensor(g, gguf_find_tensor(g, "blk.4.ffn_down.weight"));
	assert_int_equal(t->ne[0], 172);
	assert_int_equal(t->ne[1], 64);

	/* bytes against the llama2.c checkpoint: header of 7 ints, token embeddings, rms_att
	 * (L x dim), then wq (L x dim x dim) — same interleaved layout as the GGUF */
	const char *bin = test_model_path("stories260K/stories260K.bin");
	if (bin) {
		size_t blen;
		uint8_t *b = test_read_file(bin, &blen);
		t = gguf_tensor(g, gguf_find_tensor(g, "token_embd.weight"));
		assert_memory_equal(t->data, b + 28, 512 * 64 * 4);
		t = gguf_tensor(g, gguf_find_tensor(g, "blk.0.attn_q.weight"));
		assert_memory_equal(t->data, b + 28 + (512 * 64 + 5 * 64) * 4, 64 * 64 * 4);
		t = gguf_tensor(g, gguf_find_tensor(g, "blk.3.attn_norm.weight"));
		assert_memory_equal(t->data, b + 28 + (512 * 64 + 3 * 64) * 4, 64 * 4);
		free(b);
	}
	gguf_close(g);
}

/* Every cut in the header (metadata + tensor table) and a sample of cuts in the data, from an
 * exact-size copy; a few of them also through real files. */
static void test_stories_truncations(void **state)
{
	(void)state;
	const char *path = test_model_path("stories260K/stories260K.gguf");
	if (!path)
		skip();
	size_t len;
	uint8_t *p = test_read_file(path, &len);
	char err[256];
	for (size_t cut = 0; cut < len; cut += cut < 14240 ? 1 : 4093) {
		err[0] = 0;
		int ret = parse_copy(p, cut, err, sizeof err);
		if (ret != -EINVAL || !err[0])
			fail_msg("cut %zu: got %d (%s)", cut, ret, err);
	}
	assert_int_equal(parse_copy(p, len - 1, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "blk.4.ffn_norm.weight"));

	char dir[] = "/tmp/freekv-gguf-XXXXXX";
	assert_non_null(mkdtemp(dir));
	const size_t cuts[] = { 0, 3, 23, 100, 5000, 14176, 600000, len - 1 };
	char fpath[256];
	snprintf(fpath, sizeof fpath, "%s/cut.gguf", dir);
	for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
		FILE *f = fopen(fpath, "wb");
		assert_non_null(f);
		assert_int_equal(fwrite(p, 1, cuts[i], f), cuts[i]);
		fclose(f);
		struct gguf_ctx *g;
		int ret = gguf_open(fpath, &g, err, sizeof err);
		assert_true(ret == -EINVAL);
		assert_null(g);
	}
	unlink(fpath);
	rmdir(dir);
	free(p);
}

/* Random byte mutations of the header region plus random truncations: any result is fine
 * except a crash, an over-read or a leak (ASan), or a success that points outside the buffer. */
static void test_fuzz(void **state)
{
	(void)state;
	const char *path = test_model_path("stories260K/stories260K.gguf");
	size_t len;
	uint8_t *orig;
	if (path) {
		orig = test_read_file(path, &len);
	} else {
		struct mk o = MK_DEFAULT;
		struct test_buf b = make_gguf(&o);
		orig = b.p;
		len = b.n;
	}
	uint8_t *p = malloc(len);
	assert_non_null(p);
	uint64_t seed = 0x9e3779b97f4a7c15ull;
	int ok = 0, bad = 0;
	size_t hdr = len < 14240 ? len : 14240;
	for (int it = 0; it < 1500; it++) {
		memcpy(p, orig, len);
		int nmut = 1 + (int)(test_rand(&seed) % 4);
		for (int k = 0; k < nmut; k++) {
			size_t at = test_rand(&seed) % hdr;
			p[at] = (uint8_t)test_rand(&seed);
		}
		size_t cut = test_rand(&seed) % 3 ? len : test_rand(&seed) % (len + 1);
		char err[256];
		if (parse_copy(p, cut, err, sizeof err) == 0)
			ok++;
		else
			bad++;
	}
	assert_int_equal(ok + bad, 1500);
	assert_true(bad > 0);
	free(p);
	free(orig);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_synthetic_all_types),
		cmocka_unit_test(test_quantized_described),
		cmocka_unit_test(test_bad_files),
		cmocka_unit_test(test_synthetic_truncations),
		cmocka_unit_test(test_stories_metadata),
		cmocka_unit_test(test_stories_truncations),
		cmocka_unit_test(test_fuzz),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
