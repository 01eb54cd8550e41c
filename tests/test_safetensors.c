/* Tests worker/model/safetensors.c: the stories260K Hugging Face folder (table, bytes equal to the
 * GGUF conversion), hand-made headers that lie in every way the reader checks, a sharded folder
 * built here (index + two shards, then broken indexes), and every truncation of the real file's
 * header plus a sample of its data, parsed from exact-size copies so ASan sees any over-read. */
#include "test_util.h"

#include <errno.h>
#include <sys/stat.h>

#include "gguf.h"
#include "safetensors.h"

/* An image: 8-byte length, the header JSON, then data_len bytes of a counting pattern. */
static uint8_t *image(const char *header, size_t data_len, size_t *len)
{
	size_t hl = strlen(header);
	*len = 8 + hl + data_len;
	uint8_t *p = malloc(*len);
	assert_non_null(p);
	uint64_t h = hl;
	memcpy(p, &h, 8);
	memcpy(p + 8, header, hl);
	for (size_t i = 0; i < data_len; i++)
		p[8 + hl + i] = (uint8_t)i;
	return p;
}

static int open_image(const char *header, size_t data_len, char *err, size_t errlen)
{
	size_t len;
	uint8_t *p = image(header, data_len, &len);
	struct st_ctx *s;
	int ret = st_open_buf(p, len, &s, err, errlen);
	if (!ret)
		st_close(s);
	free(p);
	return ret;
}

static void test_valid_image(void **state)
{
	(void)state;
	const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
			"\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[8,20]},"
			"\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
			"\"s\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[20,22]}}   ";
	size_t len;
	uint8_t *p = image(h, 22, &len);
	struct st_ctx *s;
	char err[256];
	assert_int_equal(st_open_buf(p, len, &s, err, sizeof err), 0);
	assert_int_equal(st_n_tensors(s), 3);
	assert_int_equal(st_n_files(s), 1);
	assert_string_equal(st_tensor(s, 0)->name, "a"); /* sorted by name */
	const struct st_tensor *w = st_find(s, "w");
	assert_non_null(w);
	assert_int_equal(w->dtype, FKV_BF16);
	assert_int_equal(w->n_dims, 2);
	assert_int_equal(w->shape[0], 2);
	assert_int_equal(w->shape[1], 3);
	assert_int_equal(w->size, 12);
	assert_ptr_equal(w->data, p + 8 + strlen(h) + 8);
	const struct st_tensor *sc = st_find(s, "s");
	assert_int_equal(sc->n_dims, 0);
	assert_int_equal(sc->size, 2);
	assert_null(st_find(s, "__metadata__"));
	assert_null(st_find(s, "x"));
	st_close(s);
	free(p);
}

static void expect(const char *header, size_t data_len, int want, const char *needle)
{
	char err[256] = "";
	int ret = open_image(header, data_len, err, sizeof err);
	if (ret != want || !strstr(err, needle))
		fail_msg("header %s: want %d containing '%s', got %d: %s", header, want, needle, ret, err);
}

static void test_bad_headers(void **state)
{
	(void)state;
	expect("{\"x\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, -EPROTO,
	       "tensor 'x' has unsupported dtype I32");
	expect("{\"x\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, -EPROTO, "'x'");
	expect("{\"x\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, -EPROTO, "unknown dtype Q4");
	expect("{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, -EINVAL,
	       "'x' spans 8 bytes but F32 x shape needs 12");
	expect("{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, -EINVAL, "'x' ends at data offset 16");
	expect("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, -EINVAL, "'x' has invalid data_offsets");
	expect("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, -EINVAL, "'x' has invalid data_offsets");
	expect("{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, -EINVAL, "'x' has an invalid shape");
	expect("{\"x\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, -EINVAL, "'x' needs dtype");
	expect("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
	       "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, -EINVAL, "'x' and 'y' overlap");
	expect("{\"x\":{\"dtype\":\"F32\",\"shape\":[1099511627777],\"data_offsets\":[0,8]}}", 8, -EINVAL, "invalid shape");
	expect("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, -EINVAL, "invalid JSON");
	expect("[1,2]", 0, -EINVAL, "not a JSON object");
	expect("{} x", 0, -EINVAL, "trailing bytes");
	/* header length beyond the file */
	uint8_t b[16] = { 0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}' };
	struct st_ctx *s;
	char err[256];
	assert_int_equal(st_open_buf(b, 10, &s, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "runs past the end"));
	assert_int_equal(st_open_buf(b, 5, &s, err, sizeof err), -EINVAL);
	memset(b, 0xff, 8);
	assert_int_equal(st_open_buf(b, 16, &s, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "exceeds"));
}

static void write_image(const char *dir, const char *name, const char *header, size_t data_len)
{
	size_t len;
	uint8_t *p = image(header, data_len, &len);
	test_write_file(dir, name, p, len);
	free(p);
}

static void write_index(const char *dir, const char *json)
{
	test_write_file(dir, "model.safetensors.index.json", json, strlen(json));
}

static int open_dir(const char *dir, char *err, size_t errlen, struct st_ctx **out)
{
	return st_open(dir, out, err, errlen);
}

static void test_sharded(void **state)
{
	(void)state;
	char dir[] = "/tmp/freekv-st-XXXXXX";
	assert_non_null(mkdtemp(dir));
	write_image(dir, "model-00001-of-00002.safetensors",
		    "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		    "\"b\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[8,16]}}", 16);
	write_image(dir, "model-00002-of-00002.safetensors",
		    "{\"c\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]}}", 6);
	write_index(dir, "{\"metadata\":{\"total_size\":22},\"weight_map\":{"
			 "\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00001-of-00002.safetensors\","
			 "\"c\":\"model-00002-of-00002.safetensors\"}}");
	struct st_ctx *s;
	char err[256];
	assert_int_equal(open_dir(dir, err, sizeof err, &s), 0);
	assert_int_equal(st_n_files(s), 2);
	assert_int_equal(st_n_tensors(s), 3);
	const struct st_tensor *c = st_find(s, "c");
	assert_non_null(c);
	assert_int_equal(c->dtype, FKV_BF16);
	assert_int_equal(((const uint8_t *)c->data)[5], 5);
	assert_int_equal(((const uint8_t *)st_find(s, "b")->data)[0], 8);
	st_close(s);

	/* the index names a tensor that is not in its shard */
	write_index(dir, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
			 "\"z\":\"model-00002-of-00002.safetensors\"}}");
	assert_int_equal(open_dir(dir, err, sizeof err, &s), -EINVAL);
	assert_non_null(strstr(err, "'z'"));
	/* the index puts a tensor in the wrong shard */
	write_index(dir, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
			 "\"c\":\"model-00001-of-00002.safetensors\"}}");
	assert_int_equal(open_dir(dir, err, sizeof err, &s), -EINVAL);
	assert_non_null(strstr(err, "'c'"));
	/* a missing shard */
	write_index(dir, "{\"weight_map\":{\"a\":\"model-00003-of-00003.safetensors\"}}");
	assert_int_equal(open_dir(dir, err, sizeof err, &s), -ENOENT);
	assert_non_null(strstr(err, "model-00003-of-00003.safetensors"));
	/* a shard path escaping the folder */
	write_index(dir, "{\"weight_map\":{\"a\":\"../x.safetensors\"}}");
	assert_int_equal(open_dir(dir, err, sizeof err, &s), -EINVAL);
	/* no weight_map */
	write_index(dir, "{\"metadata\":{}}");
	assert_int_equal(open_dir(dir, err, sizeof err, &s), -EINVAL);
	assert_non_null(strstr(err, "weight_map"));
	/* the same tensor in two shards */
	write_image(dir, "model-00002-of-00002.safetensors",
		    "{\"a\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]}}", 6);
	write_index(dir, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
			 "\"b\":\"model-00002-of-00002.safetensors\"}}");
	assert_int_equal(open_dir(dir, err, sizeof err, &s), -EINVAL);
	assert_non_null(strstr(err, "'a' appears twice"));

	char path[512];
	const char *files[] = { "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
				"model.safetensors.index.json" };
	for (size_t i = 0; i < 3; i++) {
		snprintf(path, sizeof path, "%s/%s", dir, files[i]);
		unlink(path);
	}
	/* an empty folder: model.safetensors is missing */
	assert_int_equal(open_dir(dir, err, sizeof err, &s), -ENOENT);
	rmdir(dir);
}

static void test_stories_folder(void **state)
{
	(void)state;
	const char *found = test_model_path("stories260K/hf");
	if (!found)
		skip();
	char dir[4096]; /* test_model_path's buffer is reused below */
	snprintf(dir, sizeof dir, "%s", found);
	struct st_ctx *s;
	char err[256];
	assert_int_equal(st_open(dir, &s, err, sizeof err), 0);
	assert_int_equal(st_n_files(s), 1);
	assert_int_equal(st_n_tensors(s), 1 + 5 * 9 + 1);
	const struct st_tensor *e = st_find(s, "model.embed_tokens.weight");
	assert_non_null(e);
	assert_int_equal(e->dtype, FKV_F32);
	assert_int_equal(e->n_dims, 2);
	assert_int_equal(e->shape[0], 512);
	assert_int_equal(e->shape[1], 64);
	assert_null(st_find(s, "lm_head.weight"));
	const struct st_tensor *d = st_find(s, "model.layers.4.mlp.down_proj.weight");
	assert_int_equal(d->shape[0], 64);
	assert_int_equal(d->shape[1], 172);

	const char *gpath = test_model_path("stories260K/stories260K.gguf");
	if (gpath) { /* same weights as the GGUF for tensors without the rope permutation */
		struct gguf_ctx *g;
		assert_int_equal(gguf_open(gpath, &g, err, sizeof err), 0);
		const struct gguf_tensor_info *t = gguf_tensor(g, gguf_find_tensor(g, "token_embd.weight"));
		assert_memory_equal(t->data, e->data, e->size);
		t = gguf_tensor(g, gguf_find_tensor(g, "blk.4.ffn_down.weight"));
		assert_memory_equal(t->data, d->data, d->size);
		gguf_close(g);
	}
	st_close(s);

	/* every cut of the header, sampled cuts of the data: all refused, none over-read */
	char file[4200];
	snprintf(file, sizeof file, "%s/model.safetensors", dir);
	size_t len;
	uint8_t *p = test_read_file(file, &len);
	uint64_t hl;
	memcpy(&hl, p, 8);
	for (size_t cut = 0; cut < len; cut += cut < 8 + hl + 64 ? 1 : 4099) {
		uint8_t *c = malloc(cut ? cut : 1);
		memcpy(c, p, cut);
		err[0] = 0;
		int ret = st_open_buf(c, cut, &s, err, sizeof err);
		free(c);
		if (ret != -EINVAL || !err[0])
			fail_msg("cut %zu: got %d (%s)", cut, ret, err);
	}
	/* random mutations of the header and truncations: no crash, no leak, bounded results */
	uint64_t seed = 12345;
	for (int it = 0; it < 600; it++) {
		size_t cut = test_rand(&seed) % 2 ? len : 8 + test_rand(&seed) % (len - 8);
		uint8_t *c = malloc(cut);
		memcpy(c, p, cut);
		size_t span = cut - 8 < hl ? cut - 8 : (size_t)hl;
		for (int k = 0; k < 3 && span; k++)
			c[8 + test_rand(&seed) % span] = (uint8_t)(32 + test_rand(&seed) % 95);
		if (st_open_buf(c, cut, &s, err, sizeof err) == 0) {
			for (int i = 0; i < st_n_tensors(s); i++) {
				const struct st_tensor *t = st_tensor(s, i);
				assert_true((const uint8_t *)t->data + t->size <= c + cut);
			}
			st_close(s);
		}
		free(c);
	}
	free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_valid_image),
		cmocka_unit_test(test_bad_headers),
		cmocka_unit_test(test_sharded),
		cmocka_unit_test(test_stories_folder),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
