/* Tests for worker/kvcache/policy_opts.c: defaults, the flag table (both spellings, bad values), the
 * scaling to short contexts with explicit flags kept, the consistency checks (specache's
 * included), the top-p and recalibration bounds, and kvcache_resolve_opts. */
#include "test_util.h"

#include <errno.h>

#include "policy_opts.h"

/* Parses a NULL-terminated flag list; returns the first error or 0, counting consumed flags. */
static int parse(struct policy_opts *o, char **argv, int *consumed, char *err, size_t errlen)
{
	int argc = 0;
	while (argv[argc])
		argc++;
	*consumed = 0;
	for (int i = 0; i < argc; i++) {
		int ret = policy_opts_parse_flag(o, argc, argv, &i, err, errlen);
		if (ret < 0)
			return ret;
		*consumed += ret;
	}
	return 0;
}

static void test_defaults_and_flags(void **state)
{
	(void)state;
	struct policy_opts o;
	policy_opts_default(&o);
	assert_string_equal(o.policy, "freekv");
	assert_int_equal(o.kv.page, 32);
	assert_int_equal(o.kv.budget, 2048);
	assert_int_equal(o.kv.sink, 512);
	assert_int_equal(o.kv.window, 512);
	assert_int_equal(o.kv.full_layers, 1);
	assert_true(o.kv.tau == 0.9f);
	assert_false(o.kv.debug_invariants);

	char err[256];
	int n;
	char *argv[] = { "--policy", "freekv", "--budget=128", "--other", "--tau", "0",
			 "--page-size", "16", "--debug-invariants", "--full-layers=0", NULL };
	assert_int_equal(parse(&o, argv, &n, err, sizeof err), 0);
	assert_int_equal(n, 6);
	assert_string_equal(o.policy, "freekv");
	assert_int_equal(o.kv.budget, 128);
	assert_int_equal(o.kv.page, 16);
	assert_true(o.kv.tau == 0.0f);
	assert_true(o.kv.debug_invariants);
	assert_int_equal(o.kv.full_layers, 0);
	assert_true(o.set_budget && o.set_page && !o.set_sink && !o.set_window);
}

static void test_bad_values(void **state)
{
	(void)state;
	char *bad[][3] = {
		{ "--policy", "lru", NULL },	{ "--budget", "12x", NULL },
		{ "--page-size", "0", NULL },	{ "--tau", "-1", NULL },
		{ "--tau", "nan", NULL },	{ "--window", NULL, NULL },
		{ "--debug-invariants=1", NULL, NULL }, { "--sink", "", NULL },
		{ "--budget", "99999999999", NULL },
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		struct policy_opts o, before;
		policy_opts_default(&o);
		before = o;
		char err[256] = "";
		int n;
		assert_int_equal(parse(&o, bad[i], &n, err, sizeof err), -EINVAL);
		assert_true(strlen(err) > 0);
		/* A refused value changes nothing. */
		assert_memory_equal(&o.kv, &before.kv, sizeof o.kv);
		assert_string_equal(o.policy, before.policy);
	}
}

static void test_scaling(void **state)
{
	(void)state;
	struct policy_opts o;
	char err[256];
	/* The stories260K case: context 512. */
	policy_opts_default(&o);
	char buf[512] = "";
	FILE *f = fmemopen(buf, sizeof buf, "w");
	assert_int_equal(policy_opts_finalize(&o, 512, f, err, sizeof err), 0);
	fclose(f);
	assert_int_equal(o.kv.page, 8);
	assert_int_equal(o.kv.budget, 64);
	assert_int_equal(o.kv.sink, 8);
	assert_int_equal(o.kv.window, 16);
	assert_string_equal(buf, ""); /* the defaults scale silently, as --help says */
	/* With a flag given, the note says what the others became. */
	policy_opts_default(&o);
	char *given[] = { "--page-size", "16", NULL };
	int ng;
	assert_int_equal(parse(&o, given, &ng, err, sizeof err), 0);
	memset(buf, 0, sizeof buf);
	f = fmemopen(buf, sizeof buf, "w");
	assert_int_equal(policy_opts_finalize(&o, 512, f, err, sizeof err), 0);
	fclose(f);
	assert_non_null(strstr(buf, "page 16, budget 64"));

	/* A long context keeps the defaults, silently. */
	policy_opts_default(&o);
	memset(buf, 0, sizeof buf);
	f = fmemopen(buf, sizeof buf, "w");
	assert_int_equal(policy_opts_finalize(&o, 131072, f, err, sizeof err), 0);
	fclose(f);
	assert_int_equal(o.kv.budget, 2048);
	assert_int_equal(o.kv.page, 32);
	assert_string_equal(buf, "");

	/* Explicit flags are kept; the rest derive from the budget. */
	policy_opts_default(&o);
	char *argv[] = { "--budget", "128", "--page-size", "4", NULL };
	int n;
	assert_int_equal(parse(&o, argv, &n, err, sizeof err), 0);
	assert_int_equal(policy_opts_finalize(&o, 512, NULL, err, sizeof err), 0);
	assert_int_equal(o.kv.budget, 128);
	assert_int_equal(o.kv.page, 4);
	assert_int_equal(o.kv.sink, 16);
	assert_int_equal(o.kv.window, 32);

	/* Tiny contexts bottom out at B 16, p 4. */
	policy_opts_default(&o);
	assert_int_equal(policy_opts_finalize(&o, 64, NULL, err, sizeof err), 0);
	assert_int_equal(o.kv.budget, 16);
	assert_int_equal(o.kv.page, 4);
	assert_int_equal(o.kv.sink, 4);
	assert_int_equal(o.kv.window, 4);
	assert_int_equal(policy_opts_finalize(&o, 0, NULL, err, sizeof err), -EINVAL);
}

static void test_consistency(void **state)
{
	(void)state;
	struct { const char *a[8]; } cases[] = {
		{ { "--budget", "100", NULL } },			/* not a page multiple */
		{ { "--sink", "33", NULL } },
		{ { "--budget", "64", "--sink", "32", "--window", "32", NULL } }, /* no room */
		{ { "--window", "16", "--page-size", "32", NULL } },	/* window < page */
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		struct policy_opts o;
		policy_opts_default(&o);
		char err[256] = "";
		int n;
		assert_int_equal(parse(&o, (char **)cases[i].a, &n, err, sizeof err), 0);
		assert_int_equal(policy_opts_finalize(&o, 1 << 20, NULL, err, sizeof err), -EINVAL);
		assert_true(strlen(err) > 0);
	}
}

/* --kv-top-p takes (0, 1], --recalibrate whole numbers >= 1; a refusal names the bounds and
 * changes nothing; values set directly are checked too (0 is "the policy's default"). */
static void test_top_p_and_recalibrate(void **state)
{
	(void)state;
	struct policy_opts o;
	policy_opts_default(&o);
	assert_true(o.kv.top_p == 0.0f);
	assert_int_equal(o.kv.recalibrate, 0);
	char err[256];
	int n;
	char *good[] = { "--kv-top-p", "1", "--recalibrate=7", "--policy", "hardkv", NULL };
	assert_int_equal(parse(&o, good, &n, err, sizeof err), 0);
	assert_int_equal(n, 3);
	assert_true(o.kv.top_p == 1.0f);
	assert_int_equal(o.kv.recalibrate, 7);
	assert_string_equal(o.policy, "hardkv");
	char *small[] = { "--kv-top-p=0.05", NULL };
	assert_int_equal(parse(&o, small, &n, err, sizeof err), 0);
	assert_true(o.kv.top_p == 0.05f);
	struct { const char *a[3]; const char *why; } bad[] = {
		{ { "--kv-top-p", "0", NULL }, "(0, 1]" },	{ { "--kv-top-p", "1.01", NULL }, "(0, 1]" },
		{ { "--kv-top-p", "-0.5", NULL }, "(0, 1]" },	{ { "--kv-top-p", "nan", NULL }, "(0, 1]" },
		{ { "--kv-top-p", "1e-60", NULL }, "(0, 1]" },	{ { "--kv-top-p", "x", NULL }, "(0, 1]" },
		{ { "--recalibrate", "0", NULL }, "from 1" },
		{ { "--recalibrate", "-3", NULL }, "from 1" },
		{ { "--recalibrate", "2.5", NULL }, "from 1" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		struct policy_opts before = o;
		err[0] = '\0';
		assert_int_equal(parse(&o, (char **)bad[i].a, &n, err, sizeof err), -EINVAL);
		if (!strstr(err, bad[i].why) || !strstr(err, bad[i].a[0]))
			fail_msg("%s %s: message '%s'", bad[i].a[0], bad[i].a[1], err);
		assert_memory_equal(&o.kv, &before.kv, sizeof o.kv);
	}
	struct kv_policy_opts k = { .top_p = 1.5f };
	assert_int_equal(kvcache_resolve_opts(&k, 512), -EINVAL);
	k = (struct kv_policy_opts){ .page = 8, .budget = 64, .sink = 8, .window = 16,
				     .recalibrate = -1 };
	assert_int_equal(kvcache_resolve_opts(&k, 512), -EINVAL);
	k.recalibrate = 0;
	k.top_p = 0.9f;
	assert_int_equal(kvcache_resolve_opts(&k, 512), 0);
	assert_non_null(strstr(policy_opts_usage(), "--kv-top-p"));
}

/* specache: --kv-bits and --spec-topk, and no budget to fit: only the window must be whole
 * pages (a window covering a 512-token context is fine). */
static void test_specache(void **state)
{
	(void)state;
	struct policy_opts o;
	policy_opts_default(&o);
	assert_int_equal(o.kv.kv_bits, 2);
	assert_int_equal(o.kv.spec_topk, 64);
	char err[256];
	int n;
	char *argv[] = { "--policy", "specache", "--kv-bits=1", "--spec-topk", "16", "--window",
			 "512", NULL };
	assert_int_equal(parse(&o, argv, &n, err, sizeof err), 0);
	assert_int_equal(n, 4);
	assert_int_equal(o.kv.kv_bits, 1);
	assert_int_equal(o.kv.spec_topk, 16);
	assert_int_equal(policy_opts_finalize(&o, 512, NULL, err, sizeof err), 0);
	assert_int_equal(o.kv.window, 512);
	assert_int_equal(o.kv.page, 8);
	/* The same window under a budget policy does not fit its budget. */
	strcpy(o.policy, "quest");
	assert_int_equal(policy_opts_finalize(&o, 512, NULL, err, sizeof err), -EINVAL);
	strcpy(o.policy, "specache");
	o.kv.window = 12; /* not whole pages */
	assert_int_equal(policy_opts_finalize(&o, 512, NULL, err, sizeof err), -EINVAL);
	char *bad[][3] = { { "--kv-bits", "3", NULL }, { "--kv-bits", "0", NULL },
			   { "--spec-topk", "0", NULL } };
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		policy_opts_default(&o);
		assert_int_equal(parse(&o, bad[i], &n, err, sizeof err), -EINVAL);
	}
	assert_non_null(strstr(policy_opts_usage(), "--spec-topk"));
}

static void test_resolve(void **state)
{
	(void)state;
	struct kv_policy_opts k = { .tau = 0.5f };
	assert_int_equal(kvcache_resolve_opts(&k, 512), 0);
	assert_int_equal(k.page, 8);
	assert_int_equal(k.budget, 64);
	assert_true(k.tau == 0.5f);
	struct kv_policy_opts bad = { .page = 8, .budget = 60, .sink = 8, .window = 16 };
	assert_int_equal(kvcache_resolve_opts(&bad, 512), -EINVAL);
	assert_non_null(strstr(policy_opts_usage(), "--tau"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults_and_flags),
		cmocka_unit_test(test_bad_values),
		cmocka_unit_test(test_scaling),
		cmocka_unit_test(test_consistency),
		cmocka_unit_test(test_specache),
		cmocka_unit_test(test_top_p_and_recalibrate),
		cmocka_unit_test(test_resolve),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
