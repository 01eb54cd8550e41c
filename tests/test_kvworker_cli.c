/* Tests for the kvworker executable (worker/cli/kvworker.c, worker/cli/cmd_*.c): runs the real binary
 * on stories260K and checks what it prints — the greedy continuation equals the engine's own
 * greedy tokens, text output is the decoding of those ids, --stats is one JSON line (hardkv's
 * with each layer's temperatures), the sampler's --top-p and the retrieval's --kv-top-p are
 * two flags, perplexity ends with its line, bad flags exit 2, failures exit 1 with a message;
 * info reports the geometry model_load reads, for GGUF and HF, and describes files generate
 * refuses. */
#include "test_proc.h"
#include "test_buf.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <sys/stat.h>

#include "backend.h"
#include "engine.h"
#include "gguf.h"
#include "model.h"
#include "sampler.h"
#include "tokenizer.h"

static char bin[4096], tmpdir[64];
static const char *gguf, *hf;

/* Runs kvworker with args (NULL-terminated) and stdin from in_path (or /dev/null). */
static struct result run(const char *in_path, const char *const *args)
{
	return proc_run(bin, tmpdir, in_path, args);
}

#define RUN(in, ...) run(in, (const char *const[]){ __VA_ARGS__, NULL })

/* Space-separated ids on one line; returns the count. */
static int parse_ids(const char *s, int *ids, int max)
{
	int n = 0;
	char *end;
	while (*s && *s != '\n') {
		long v = strtol(s, &end, 10);
		assert_true(end != s);
		assert_true(v >= 0 && v < 512);
		assert_true(n < max);
		ids[n++] = (int)v;
		s = end;
		if (*s == ' ')
			s++;
	}
	return n;
}

static int setup(void **state)
{
	(void)state;
	snprintf(bin, sizeof bin, "%s/worker/kvworker", FREEKV_BUILD_DIR);
	if (access(bin, X_OK)) {
		fprintf(stderr, "skip: %s not built\n", bin);
		return -1;
	}
	strcpy(tmpdir, "/tmp/freekv-cli-XXXXXX");
	if (!mkdtemp(tmpdir))
		return -1;
	static char g[4096], h[4096];
	const char *p = test_model_path("stories260K/stories260K.gguf");
	if (p) {
		snprintf(g, sizeof g, "%s", p);
		gguf = g;
	}
	p = test_model_path("stories260K/hf");
	if (p) {
		snprintf(h, sizeof h, "%s", p);
		hf = h;
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

/* The engine's greedy continuation of prompt, computed in this process. */
static int engine_greedy(const char *model, const char *prompt, int n, int *out)
{
	struct fkv_model m;
	struct fkv_tokenizer *tok;
	struct backend *be;
	struct engine *e;
	char err[512];
	assert_int_equal(model_load(model, &m, err, sizeof err), 0);
	assert_int_equal(tokenizer_load(&m, &tok, err, sizeof err), 0);
	assert_int_equal(backend_cpu_new(&be, 1), 0);
	assert_int_equal(engine_new(&e, &m, be, NULL, err, sizeof err), 0);
	int *ids, seq, got = 0;
	int np = tokenizer_encode(tok, prompt, true, &ids);
	assert_true(np > 0);
	float *lg = malloc(512 * sizeof *lg);
	assert_int_equal(engine_seq_new(e, &seq, err, sizeof err), 0);
	assert_int_equal(engine_prefill(e, seq, ids, np, lg, false, err, sizeof err), 0);
	while (got < n) {
		int32_t t = sampler_argmax(lg, 512);
		if (t == tokenizer_eos(tok))
			break;
		out[got++] = t;
		assert_int_equal(engine_decode(e, 1, &seq, &t, lg, err, sizeof err), 0);
	}
	free(lg);
	free(ids);
	engine_free(e);
	backend_free(be);
	tokenizer_free(tok);
	model_free(&m);
	return got;
}

static void test_generate_greedy(void **state)
{
	(void)state;
	if (!gguf || !hf) {
		skip();
		return;
	}
	const char *prompt = "Once upon a time";
	int want[64], got_g[64], got_h[64];
	int nw = engine_greedy(gguf, prompt, 30, want);
	assert_true(nw > 10);
	struct result rg = RUN(NULL, "generate", "-m", gguf, "-p", prompt, "-n", "30", "--temp",
			       "0", "--ids");
	struct result rh = RUN(NULL, "generate", "-m", hf, "-p", prompt, "-n", "30", "--temp", "0",
			       "--ids", "-t", "2");
	assert_int_equal(rg.rc, 0);
	assert_int_equal(rh.rc, 0);
	assert_int_equal(parse_ids(rg.out, got_g, 64), nw);
	assert_int_equal(parse_ids(rh.out, got_h, 64), nw);
	assert_memory_equal(got_g, want, nw * sizeof(int));
	assert_memory_equal(got_h, want, nw * sizeof(int));
	/* Text mode prints the decoding of the same ids, and not the prompt. */
	struct result rt = RUN(NULL, "generate", "-m", gguf, "-p", prompt, "-n", "30", "--temp",
			       "0");
	assert_int_equal(rt.rc, 0);
	struct fkv_model m;
	struct fkv_tokenizer *tok;
	char err[256], *text;
	assert_int_equal(model_load(gguf, &m, err, sizeof err), 0);
	assert_int_equal(tokenizer_load(&m, &tok, err, sizeof err), 0);
	assert_true(tokenizer_decode(tok, want, nw, &text) > 0);
	const char *o = rt.out + (rt.out[0] == ' ' && text[0] != ' ');
	assert_int_equal(strncmp(o, text, strlen(text)), 0);
	assert_null(strstr(rt.out, prompt));
	free(text);
	tokenizer_free(tok);
	model_free(&m);
	proc_result_free(&rg);
	proc_result_free(&rh);
	proc_result_free(&rt);
}

static void test_generate_stdin_stats_seed(void **state)
{
	(void)state;
	if (!gguf) {
		skip();
		return;
	}
	char in[128];
	snprintf(in, sizeof in, "%s/prompt.txt", tmpdir);
	FILE *f = fopen(in, "w");
	fputs("Once upon a time", f);
	fclose(f);
	struct result a = RUN(in, "generate", "-m", gguf, "-p", "-", "-n", "12", "--temp", "0",
			      "--ids", "--stats");
	struct result b = RUN(NULL, "generate", "-m", gguf, "-f", in, "-n", "12", "--temp", "0",
			      "--ids");
	assert_int_equal(a.rc, 0);
	assert_string_equal(a.out, b.out);
	/* --stats: one JSON object on stderr with the timings. */
	struct json_object *j = json_tokener_parse(a.err), *v;
	assert_non_null(j);
	assert_true(json_object_object_get_ex(j, "prefill_tok_s", &v));
	assert_true(json_object_get_double(v) > 0);
	assert_true(json_object_object_get_ex(j, "decode_tok_s", &v));
	assert_true(json_object_get_double(v) > 0);
	assert_true(json_object_object_get_ex(j, "generated_tokens", &v));
	assert_int_equal(json_object_get_int(v), 12);
	json_object_put(j);
	/* Seeded sampling reproduces; another seed gives another continuation. */
	struct result s1 = RUN(NULL, "generate", "-m", gguf, "-p", "A cat", "-n", "40", "--temp",
			       "1.2", "--top-k", "0", "--top-p", "1", "--seed", "11", "--ids");
	struct result s2 = RUN(NULL, "generate", "-m", gguf, "-p", "A cat", "-n", "40", "--temp",
			       "1.2", "--top-k", "0", "--top-p", "1", "--seed", "11", "--ids");
	struct result s3 = RUN(NULL, "generate", "-m", gguf, "-p", "A cat", "-n", "40", "--temp",
			       "1.2", "--top-k", "0", "--top-p", "1", "--seed", "12", "--ids");
	assert_int_equal(s1.rc, 0);
	assert_string_equal(s1.out, s2.out);
	assert_string_not_equal(s1.out, s3.out);
	/* The sampler's --top-p and the retrieval's --kv-top-p are two flags: --top-p 0 is a valid
	 * nucleus mass, --kv-top-p 0 is refused; hardkv's --stats carry its temperatures. */
	struct result h = RUN(NULL, "generate", "-m", gguf, "-p", "A cat", "-n", "120", "--top-p",
			      "0", "--policy", "hardkv", "--kv-top-p", "0.8", "--recalibrate", "16",
			      "--page-size", "8", "--budget", "64", "--sink", "8", "--window", "16",
			      "--stats");
	if (h.rc)
		fail_msg("hardkv generate: %s", h.err);
	const char *line = strstr(h.err, "{\"prompt_tokens");
	assert_non_null(line);
	j = json_tokener_parse(line);
	assert_non_null(j);
	assert_true(json_object_object_get_ex(j, "kv_top_p", &v));
	assert_true(fabs(json_object_get_double(v) - 0.8) < 1e-6);
	assert_true(json_object_object_get_ex(j, "layers", &v));
	struct json_object *l1 = json_object_array_get_idx(v, 1), *t;
	assert_true(json_object_object_get_ex(l1, "temperatures", &t));
	assert_int_equal(json_object_array_length(t), 4);
	assert_true(json_object_object_get_ex(l1, "calibrations", &t));
	assert_true(json_object_get_int64(t) > 1);
	assert_true(json_object_object_get_ex(l1, "pages_mean_per_head", &t));
	assert_true(json_object_get_double(t) >= 1.0 && json_object_get_double(t) <= 5.0);
	json_object_put(j);
	struct result hb = RUN(NULL, "generate", "-m", gguf, "-p", "A cat", "-n", "4", "--policy",
			       "hardkv", "--kv-top-p", "0");
	assert_int_not_equal(hb.rc, 0);
	assert_non_null(strstr(hb.err, "(0, 1]"));
	proc_result_free(&h);
	proc_result_free(&hb);
	proc_result_free(&a);
	proc_result_free(&b);
	proc_result_free(&s1);
	proc_result_free(&s2);
	proc_result_free(&s3);
}

static void test_perplexity(void **state)
{
	(void)state;
	if (!gguf || !hf) {
		skip();
		return;
	}
	char path[128];
	snprintf(path, sizeof path, "%s/text.txt", tmpdir);
	FILE *f = fopen(path, "w");
	fputs("Once upon a time, there was a little girl named Lily. She loved to play outside. "
	      "One day, she saw a big red ball in the park. She was very happy.\n", f);
	fclose(f);
	double ppl[2];
	const char *models[2] = { gguf, hf };
	for (int i = 0; i < 2; i++) {
		struct result r = RUN(NULL, "perplexity", "-m", models[i], "-f", path, "--ctx", "16");
		assert_int_equal(r.rc, 0);
		char *last = r.out + strlen(r.out) - 1;
		while (last > r.out && last[-1] != '\n')
			last--;
		assert_int_equal(sscanf(last, "perplexity: %lf", &ppl[i]), 1);
		assert_true(ppl[i] > 1.0 && ppl[i] < 100.0); /* far below vocab 512: a trained model */
		proc_result_free(&r);
	}
	assert_true(fabs(ppl[0] - ppl[1]) < 1e-3 * ppl[0]);
	/* Shuffled words score worse than the story. */
	f = fopen(path, "w");
	fputs("ball Lily park a the big girl happy outside red she time was named upon\n", f);
	fclose(f);
	struct result r = RUN(NULL, "perplexity", "-m", gguf, "-f", path);
	assert_int_equal(r.rc, 0);
	double bad;
	assert_non_null(strstr(r.out, "perplexity: "));
	assert_int_equal(sscanf(strstr(r.out, "perplexity: "), "perplexity: %lf", &bad), 1);
	assert_true(bad > 2 * ppl[0]);
	assert_null(strstr(r.err, "warning"));
	proc_result_free(&r);
	/* A window past the model's trained context (2048) runs, with a warning. */
	r = RUN(NULL, "perplexity", "-m", gguf, "-f", path, "--ctx", "4096");
	assert_int_equal(r.rc, 0);
	assert_non_null(strstr(r.err, "--ctx 4096 is past the model's trained context of 2048"));
	proc_result_free(&r);
}

static void test_bad_flags_exit_2(void **state)
{
	(void)state;
	const char *m = gguf ? gguf : "/nonexistent";
	const char *const cases[][12] = {
		{ NULL },
		{ "frobnicate", NULL },
		{ "generate", "-m", m, "-p", "x", "--bogus", NULL },
		{ "generate", "-m", m, "-p", "x", "-n", "abc", NULL },
		{ "generate", "-m", m, "-p", "x", "-n", "-3", NULL },
		{ "generate", "-m", m, "-p", "x", "--top-p", "2", NULL },
		{ "generate", "-m", m, "-p", "x", "--temp", "nan", NULL },
		{ "generate", "-m", m, "-p", "x", "-t", "0", NULL },
		{ "generate", "-m", m, "-p", "x", "--slice-us", "50", NULL },
		{ "generate", "-m", m, "-p", "x", "--slice-us", "100001", NULL },
		{ "generate", "-p", "x", NULL },
		{ "generate", "-m", m, NULL },
		{ "generate", "-m", m, "-p", "x", "extra", NULL },
		{ "perplexity", "-m", m, NULL },
		{ "perplexity", "-m", m, "-f", "x", "--ctx", "1", NULL },
		{ "synth", "--preset", "nope", "--out", "/tmp/x", NULL },
		{ "synth", "--preset", "tiny", NULL },
		{ "synth", "--preset", "tiny", "--out", "/tmp/x", "--dtype", "q4", NULL },
		{ "info", NULL },
		{ "info", "-m", NULL },
		{ "info", "-m", m, "--temp", "0", NULL },
		{ "info", "-m", m, "extra", NULL },
		{ "info", "-m", m, "--bogus", NULL },
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		struct result r = run(NULL, cases[i]);
		if (r.rc != 2)
			fail_msg("case %zu (%s %s): exit %d, want 2", i,
				 cases[i][0] ? cases[i][0] : "", cases[i][0] && cases[i][1] ?
				 cases[i][1] : "", r.rc);
		assert_non_null(strstr(r.err, "usage") ? r.err : strstr(r.err, "unknown"));
		assert_int_equal(r.out[0], '\0');
		proc_result_free(&r);
	}
	struct result h = RUN(NULL, "generate", "--help");
	assert_int_equal(h.rc, 0);
	assert_non_null(strstr(h.out, "--top-p"));
	proc_result_free(&h);
	h = RUN(NULL, "perplexity", "--help");
	assert_int_equal(h.rc, 0);
	proc_result_free(&h);
	h = RUN(NULL, "synth", "--help");
	assert_int_equal(h.rc, 0);
	proc_result_free(&h);
	h = RUN(NULL, "info", "--help");
	assert_int_equal(h.rc, 0);
	assert_non_null(strstr(h.out, "--json"));
	proc_result_free(&h);
}

static void test_failures_exit_1(void **state)
{
	(void)state;
	struct result r = RUN(NULL, "generate", "-m", "/nonexistent/model.gguf", "-p", "x");
	assert_int_equal(r.rc, 1);
	assert_non_null(strstr(r.err, "/nonexistent/model.gguf"));
	proc_result_free(&r);
	r = RUN(NULL, "perplexity", "-m", "/nonexistent", "-f", "/nonexistent/text");
	assert_int_equal(r.rc, 1);
	assert_non_null(strstr(r.err, "cannot read"));
	proc_result_free(&r);
	if (!gguf)
		return;
	/* Retrieval options that cannot apply to this model are refused, saying why. */
	r = RUN(NULL, "generate", "-m", gguf, "-p", "x", "--policy", "freekv", "--full-layers", "99");
	assert_int_equal(r.rc, 1);
	assert_non_null(strstr(r.err, "--full-layers 99: the model has 5 layers"));
	proc_result_free(&r);
	r = RUN(NULL, "generate", "-m", gguf, "-p", "x", "--policy", "freekv", "--page-size", "7");
	assert_int_equal(r.rc, 1);
	assert_non_null(strstr(r.err, "multiples of the page size 7 (those not given were derived"));
	proc_result_free(&r);
	/* A prompt longer than the context: a clear error. */
	r = RUN(NULL, "generate", "-m", gguf, "-p", "Once upon a time there was a girl", "--ctx",
		"4", "--temp", "0");
	assert_int_equal(r.rc, 1);
	assert_non_null(strstr(r.err, "context limit"));
	proc_result_free(&r);
	/* Generation stops at the context limit and says so. */
	int ids[64];
	r = RUN(NULL, "generate", "-m", gguf, "-p", "Once upon a time", "--ctx", "12", "-n", "50",
		"--temp", "0", "--ids");
	assert_int_equal(r.rc, 0);
	assert_true(parse_ids(r.out, ids, 64) <= 12 - 5 + 1);
	assert_non_null(strstr(r.err, "context limit"));
	proc_result_free(&r);
}

static void test_synth_then_generate(void **state)
{
	(void)state;
	char out[128];
	snprintf(out, sizeof out, "%s/tiny", tmpdir);
	struct result r = RUN(NULL, "synth", "--preset", "tiny", "--layers", "1", "--dtype", "bf16",
			      "--out", out);
	assert_int_equal(r.rc, 0);
	proc_result_free(&r);
	r = RUN(NULL, "generate", "-m", out, "-p", "hello world", "-n", "5", "--temp", "0",
		"--ids");
	assert_int_equal(r.rc, 0);
	int n = 0;
	for (char *p = strtok(r.out, " \n"); p; p = strtok(NULL, " \n"))
		n++;
	assert_true(n >= 1 && n <= 5);
	proc_result_free(&r);
}

/* ---- info ---- */

static struct json_object *info_json(const char *model)
{
	struct result r = RUN(NULL, "info", "-m", model, "--json");
	if (r.rc != 0)
		fail_msg("info -m %s --json: exit %d: %s", model, r.rc, r.err);
	struct json_object *j = json_tokener_parse(r.out);
	assert_non_null(j);
	proc_result_free(&r);
	return j;
}

static int64_t jint(struct json_object *j, const char *key)
{
	struct json_object *v;
	if (!json_object_object_get_ex(j, key, &v) || !json_object_is_type(v, json_type_int))
		fail_msg("info JSON: '%s' missing or not an integer", key);
	return json_object_get_int64(v);
}

static const char *jstr(struct json_object *j, const char *key)
{
	struct json_object *v;
	if (!json_object_object_get_ex(j, key, &v) || !json_object_is_type(v, json_type_string))
		fail_msg("info JSON: '%s' missing or not a string", key);
	return json_object_get_string(v);
}

/* Count and bytes of one tensor type in info's JSON. */
static void jtype(struct json_object *j, const char *type, int64_t *count, int64_t *bytes)
{
	struct json_object *types, *t;
	assert_true(json_object_object_get_ex(j, "tensor_types", &types));
	if (!json_object_object_get_ex(types, type, &t))
		fail_msg("info JSON: no tensor type %s", type);
	*count = jint(t, "count");
	*bytes = jint(t, "bytes");
}

/* info agrees with model_load on every size, and with the files on the rest. */
static void test_info_stories(void **state)
{
	(void)state;
	if (!gguf || !hf) {
		skip();
		return;
	}
	const char *models[2] = { gguf, hf };
	for (int k = 0; k < 2; k++) {
		struct fkv_model m;
		char err[512];
		assert_int_equal(model_load(models[k], &m, err, sizeof err), 0);
		const struct fkv_model_config *c = &m.cfg;
		struct json_object *j = info_json(models[k]);
		assert_string_equal(jstr(j, "format"), k ? "hf" : "gguf");
		assert_string_equal(jstr(j, "architecture"), "llama");
		assert_int_equal(jint(j, "layers"), 5);
		assert_int_equal(jint(j, "heads"), 8);
		assert_int_equal(jint(j, "kv_heads"), 4);
		assert_int_equal(jint(j, "head_dim"), 8);
		assert_int_equal(jint(j, "hidden_size"), 64);
		assert_int_equal(jint(j, "ffn_size"), 172);
		assert_int_equal(jint(j, "vocab_size"), 512);
		assert_int_equal(jint(j, "layers"), c->n_layers);
		assert_int_equal(jint(j, "heads"), c->n_heads);
		assert_int_equal(jint(j, "kv_heads"), c->n_kv_heads);
		assert_int_equal(jint(j, "head_dim"), c->head_dim);
		assert_int_equal(jint(j, "hidden_size"), c->dim);
		assert_int_equal(jint(j, "ffn_size"), c->ffn_dim);
		assert_int_equal(jint(j, "vocab_size"), c->vocab_size);
		/* the GGUF says 2048 though the model was trained at 512 (model.h) */
		assert_int_equal(jint(j, "context_length"), k ? 512 : 2048);
		assert_int_equal(jint(j, "context_length"), c->ctx_len);
		struct json_object *v;
		assert_true(json_object_object_get_ex(j, "norm_eps", &v));
		assert_true((float)json_object_get_double(v) == c->norm_eps);
		assert_true(json_object_object_get_ex(j, "rope_theta", &v));
		assert_true((float)json_object_get_double(v) == c->rope_theta);
		assert_string_equal(jstr(j, "rope_style"),
				    c->rope_style == FKV_ROPE_INTERLEAVED ? "interleaved" : "halves");
		assert_string_equal(jstr(j, "rope_style"), k ? "halves" : "interleaved");
		assert_true(json_object_object_get_ex(j, "rope_scaling", &v));
		assert_string_equal(jstr(v, "type"), "none");
		assert_string_equal(jstr(j, "tokenizer_model"), k ? "BPE" : "llama");
		assert_string_equal(jstr(j, "chat_template"), "none");
		/* the GGUF writes the tied output head a second time; the HF folder does not */
		int64_t count, bytes;
		jtype(j, "F32", &count, &bytes);
		assert_int_equal(jint(j, "tensors"), k ? 47 : 48);
		assert_int_equal(count, jint(j, "tensors"));
		assert_int_equal(jint(j, "parameters"), k ? 260032 : 292800);
		assert_int_equal(bytes, jint(j, "parameters") * 4);
		assert_int_equal(jint(j, "parameter_bytes"), bytes);
		json_object_put(j);
		model_free(&m);
	}
	/* the text form says the same */
	struct result r = RUN(NULL, "info", "-m", gguf);
	assert_int_equal(r.rc, 0);
	static const char *const lines[] = {
		"architecture:    llama\n", "layers:          5\n",	 "heads:           8\n",
		"kv heads:        4\n",	    "head dim:        8\n",	 "hidden size:     64\n",
		"ffn size:        172\n",   "vocab size:      512\n",	 "context length:  2048\n",
		"norm eps:        1e-05\n", "tokenizer:       llama\n", "chat template:   none\n",
		"tensors:         48 (F32 48)\n",
	};
	for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) {
		if (!strstr(r.out, lines[i]))
			fail_msg("info text lacks '%s':\n%s", lines[i], r.out);
	}
	assert_string_equal(r.err, "");
	proc_result_free(&r);
}

static void put_str(struct test_buf *b, const char *s)
{
	uint64_t n = strlen(s);
	test_buf_put(b, &n, 8);
	test_buf_put(b, s, n);
}

static void put_kv(struct test_buf *b, const char *key, uint32_t type, const void *v, size_t n)
{
	put_str(b, key);
	test_buf_put(b, &type, 4);
	if (type == GGUF_TYPE_STRING)
		put_str(b, v);
	else
		test_buf_put(b, v, n);
}

/* A qwen2 GGUF generate refuses twice over (a pre-tokenizer and a tensor type it does not
 * support), with a llama3 chat template and linear rope scaling. */
static void write_odd_gguf(const char *path)
{
	struct test_buf b = { 0 };
	uint32_t u32 = 0x46554747u, version = 3;
	uint64_t nt = 2, nkv = 14;
	test_buf_put(&b, &u32, 4);
	test_buf_put(&b, &version, 4);
	test_buf_put(&b, &nt, 8);
	test_buf_put(&b, &nkv, 8);
	put_kv(&b, "general.architecture", GGUF_TYPE_STRING, "qwen2", 0);
	static const struct {
		const char *key;
		uint32_t v;
	} ints[] = { { "qwen2.block_count", 1 },	  { "qwen2.context_length", 4096 },
		     { "qwen2.embedding_length", 64 },	  { "qwen2.feed_forward_length", 96 },
		     { "qwen2.attention.head_count", 4 }, { "qwen2.attention.head_count_kv", 2 } };
	for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
		put_kv(&b, ints[i].key, GGUF_TYPE_UINT32, &ints[i].v, 4);
	float eps = 1e-6f, theta = 1e6f, factor = 4.0f;
	put_kv(&b, "qwen2.attention.layer_norm_rms_epsilon", GGUF_TYPE_FLOAT32, &eps, 4);
	put_kv(&b, "qwen2.rope.freq_base", GGUF_TYPE_FLOAT32, &theta, 4);
	put_kv(&b, "qwen2.rope.scaling.type", GGUF_TYPE_STRING, "linear", 0);
	put_kv(&b, "qwen2.rope.scaling.factor", GGUF_TYPE_FLOAT32, &factor, 4);
	put_kv(&b, "tokenizer.ggml.model", GGUF_TYPE_STRING, "gpt2", 0);
	put_kv(&b, "tokenizer.ggml.pre", GGUF_TYPE_STRING, "smollm", 0);
	put_kv(&b, "tokenizer.chat_template", GGUF_TYPE_STRING,
	       "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}", 0);
	/* tensors: token_embd.weight IQ4_NL (64, 100) at 0 (a type without kernels: docs/quant.md),
	 * output_norm.weight F16 (64) after it, 32-byte aligned */
	static const struct {
		const char *name;
		uint64_t ne1;
		uint32_t type;
		uint64_t off;
	} ts[] = { { "token_embd.weight", 100, 20, 0 }, { "output_norm.weight", 0, 1, 3616 } };
	for (size_t i = 0; i < 2; i++) {
		uint32_t nd = ts[i].ne1 ? 2 : 1;
		uint64_t ne0 = 64;
		put_str(&b, ts[i].name);
		test_buf_put(&b, &nd, 4);
		test_buf_put(&b, &ne0, 8);
		if (ts[i].ne1)
			test_buf_put(&b, &ts[i].ne1, 8);
		test_buf_put(&b, &ts[i].type, 4);
		test_buf_put(&b, &ts[i].off, 8);
	}
	uint8_t zero[3744] = { 0 };
	test_buf_put(&b, zero, (32 - b.n % 32) % 32);
	test_buf_put(&b, zero, 3616 + 128); /* 100 rows x 2 blocks x 18 bytes, padding, 64 x f16 */
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(b.p, 1, b.n, f), b.n);
	assert_int_equal(fclose(f), 0);
	free(b.p);
}

static void test_info_describes_what_generate_refuses(void **state)
{
	(void)state;
	char path[128];
	snprintf(path, sizeof path, "%s/odd.gguf", tmpdir);
	write_odd_gguf(path);
	struct json_object *j = info_json(path), *v;
	assert_string_equal(jstr(j, "architecture"), "qwen2");
	assert_int_equal(jint(j, "layers"), 1);
	assert_int_equal(jint(j, "heads"), 4);
	assert_int_equal(jint(j, "kv_heads"), 2);
	assert_int_equal(jint(j, "head_dim"), 16);
	assert_int_equal(jint(j, "vocab_size"), 100); /* no token list: the embedding's rows */
	assert_int_equal(jint(j, "context_length"), 4096);
	assert_string_equal(jstr(j, "rope_style"), "halves");
	assert_true(json_object_object_get_ex(j, "rope_theta", &v));
	assert_true(json_object_get_double(v) == 1e6);
	assert_true(json_object_object_get_ex(j, "rope_scaling", &v));
	assert_string_equal(jstr(v, "type"), "linear");
	assert_true(json_object_object_get_ex(v, "factor", &v));
	assert_true(json_object_get_double(v) == 4.0);
	assert_string_equal(jstr(j, "tokenizer_model"), "gpt2");
	assert_string_equal(jstr(j, "pre_tokenizer"), "smollm");
	assert_string_equal(jstr(j, "chat_template"), "llama3");
	int64_t count, bytes;
	jtype(j, "IQ4_NL", &count, &bytes);
	assert_int_equal(count, 1);
	assert_int_equal(bytes, 3600);
	jtype(j, "F16", &count, &bytes);
	assert_int_equal(count, 1);
	assert_int_equal(bytes, 128);
	assert_int_equal(jint(j, "parameters"), 6400 + 64);
	assert_int_equal(jint(j, "parameter_bytes"), 3728);
	json_object_put(j);
	struct result r = RUN(NULL, "info", "-m", path);
	assert_int_equal(r.rc, 0);
	assert_non_null(strstr(r.out, "pre-tokenizer:   smollm\n"));
	assert_non_null(strstr(r.out, "tensors:         2 (IQ4_NL 1, F16 1)\n"));
	assert_non_null(strstr(r.out, "rope scaling:    linear (factor 4)\n"));
	proc_result_free(&r);
	r = RUN(NULL, "generate", "-m", path, "-p", "x");
	assert_int_equal(r.rc, 1);
	assert_non_null(strstr(r.err, "type IQ4_NL"));
	proc_result_free(&r);
}

/* An HF folder's chat template: from tokenizer_config.json, else chat_template.jinja. */
static void test_info_hf_chat_template(void **state)
{
	(void)state;
	if (!hf) {
		skip();
		return;
	}
	char dir[128], path[4300];
	snprintf(dir, sizeof dir, "%s/hfchat", tmpdir);
	assert_int_equal(mkdir(dir, 0700), 0);
	static const char *const files[] = { "config.json", "model.safetensors", "tokenizer.json" };
	for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
		char src[4300];
		snprintf(src, sizeof src, "%s/%s", hf, files[i]);
		snprintf(path, sizeof path, "%s/%s", dir, files[i]);
		assert_int_equal(symlink(src, path), 0);
	}
	snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
	FILE *f = fopen(path, "w");
	fputs("{{ '<start_of_turn>user\\n' + content + '<end_of_turn>' }}", f);
	fclose(f);
	struct json_object *j = info_json(dir);
	assert_string_equal(jstr(j, "chat_template"), "gemma");
	json_object_put(j);
	snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
	f = fopen(path, "w");
	fputs("{\"chat_template\": \"{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}\"}", f);
	fclose(f);
	j = info_json(dir);
	assert_string_equal(jstr(j, "chat_template"), "chatml");
	assert_int_equal(jint(j, "layers"), 5);
	json_object_put(j);
}

/* A cut or foreign file, or a folder that is no model: exit 1 with the reader's reason. */
static void test_info_malformed(void **state)
{
	(void)state;
	char path[128];
	snprintf(path, sizeof path, "%s/junk.gguf", tmpdir);
	FILE *f = fopen(path, "w");
	fputs("not a model at all", f);
	fclose(f);
	struct result r = RUN(NULL, "info", "-m", path);
	assert_int_equal(r.rc, 1);
	assert_string_equal(r.out, "");
	assert_non_null(strstr(r.err, path));
	assert_non_null(strstr(r.err, "not a GGUF file"));
	proc_result_free(&r);
	r = RUN(NULL, "info", "-m", tmpdir, "--json");
	assert_int_equal(r.rc, 1);
	assert_non_null(strstr(r.err, "no config.json"));
	proc_result_free(&r);
	if (!gguf)
		return;
	size_t len;
	uint8_t *p = test_read_file(gguf, &len);
	snprintf(path, sizeof path, "%s/cut.gguf", tmpdir);
	f = fopen(path, "wb");
	assert_int_equal(fwrite(p, 1, 5000, f), 5000); /* inside the vocabulary */
	fclose(f);
	free(p);
	r = RUN(NULL, "info", "-m", path, "--json");
	assert_int_equal(r.rc, 1);
	assert_string_equal(r.out, "");
	assert_non_null(strstr(r.err, "truncated element"));
	assert_non_null(strstr(r.err, "tokenizer.ggml.tokens"));
	proc_result_free(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_generate_greedy),
		cmocka_unit_test(test_generate_stdin_stats_seed),
		cmocka_unit_test(test_perplexity),
		cmocka_unit_test(test_bad_flags_exit_2),
		cmocka_unit_test(test_failures_exit_1),
		cmocka_unit_test(test_synth_then_generate),
		cmocka_unit_test(test_info_stories),
		cmocka_unit_test(test_info_describes_what_generate_refuses),
		cmocka_unit_test(test_info_hf_chat_template),
		cmocka_unit_test(test_info_malformed),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
