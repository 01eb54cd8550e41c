/* Tests for worker/engine/sampler.c: greedy is argmax, top-k = 1 is greedy, seeded runs reproduce,
 * top-p keeps the smallest prefix reaching the mass, temperature sharpens, draws follow the
 * distribution. */
#include "test_util.h"

#include <errno.h>
#include <math.h>

#include "sampler.h"

#define V 200

static void rand_logits(float *l, uint64_t *s)
{
	for (int i = 0; i < V; i++)
		l[i] = test_randf(s) * 5.0f;
}

static void test_greedy(void **state)
{
	(void)state;
	uint64_t s = 1;
	float l[V];
	struct sampler sp;
	struct sampler_params p = { .temp = 0.0f, .seed = 3 };
	assert_int_equal(sampler_init(&sp, &p, V), 0);
	for (int r = 0; r < 20; r++) {
		rand_logits(l, &s);
		int best = 0;
		for (int i = 0; i < V; i++)
			if (l[i] > l[best])
				best = i;
		assert_int_equal(sampler_sample(&sp, l), best);
	}
	/* Ties go to the lowest id. */
	for (int i = 0; i < V; i++)
		l[i] = 1.0f;
	assert_int_equal(sampler_sample(&sp, l), 0);
	sampler_free(&sp);
}

static void test_topk1_is_greedy(void **state)
{
	(void)state;
	uint64_t s = 2;
	float l[V];
	struct sampler sp;
	struct sampler_params p = { .temp = 1.5f, .top_k = 1, .seed = 9 };
	assert_int_equal(sampler_init(&sp, &p, V), 0);
	for (int r = 0; r < 20; r++) {
		rand_logits(l, &s);
		assert_int_equal(sampler_sample(&sp, l), sampler_argmax(l, V));
	}
	sampler_free(&sp);
}

static void test_seeded_reproducible(void **state)
{
	(void)state;
	uint64_t s = 3;
	float l[V];
	rand_logits(l, &s);
	struct sampler a, b, c;
	struct sampler_params p = { .temp = 1.0f, .top_k = 50, .top_p = 0.9f, .seed = 42 };
	assert_int_equal(sampler_init(&a, &p, V), 0);
	assert_int_equal(sampler_init(&b, &p, V), 0);
	p.seed = 43;
	assert_int_equal(sampler_init(&c, &p, V), 0);
	int same_c = 0;
	for (int r = 0; r < 50; r++) {
		int x = sampler_sample(&a, l), y = sampler_sample(&b, l), z = sampler_sample(&c, l);
		assert_int_equal(x, y);
		same_c += x == z;
	}
	assert_true(same_c < 50); /* another seed gives another sequence */
	sampler_free(&a);
	sampler_free(&b);
	sampler_free(&c);
}

static void test_top_p_mass(void **state)
{
	(void)state;
	/* Probabilities 0.4, 0.3, 0.2, 0.1 (ids 3, 0, 2, 1), then negligible. */
	float l[V];
	for (int i = 0; i < V; i++)
		l[i] = -1e9f;
	l[3] = logf(0.4f);
	l[0] = logf(0.3f);
	l[2] = logf(0.2f);
	l[1] = logf(0.1f);
	struct sampler sp;
	struct sampler_params p = { .temp = 1.0f, .top_p = 0.65f, .seed = 1 };
	assert_int_equal(sampler_init(&sp, &p, V), 0);
	const struct sampler_cand *c;
	int n = sampler_candidates(&sp, l, &c);
	assert_int_equal(n, 2); /* 0.4 < 0.65 <= 0.7 */
	assert_int_equal(c[0].id, 3);
	assert_int_equal(c[1].id, 0);
	assert_true(fabsf(c[0].p - 0.4f / 0.7f) < 1e-5f);
	assert_true(fabsf(c[0].p + c[1].p - 1.0f) < 1e-6f);
	/* Draws only from the nucleus, in about the right proportion. */
	int count3 = 0;
	for (int r = 0; r < 2000; r++) {
		int t = sampler_sample(&sp, l);
		assert_true(t == 3 || t == 0);
		count3 += t == 3;
	}
	assert_true(fabs(count3 / 2000.0 - 0.4 / 0.7) < 0.05);
	sampler_free(&sp);

	p.top_p = 0.95f;
	assert_int_equal(sampler_init(&sp, &p, V), 0);
	assert_int_equal(sampler_candidates(&sp, l, &c), 4);
	sampler_free(&sp);
}

static void test_temperature_and_topk(void **state)
{
	(void)state;
	uint64_t s = 4;
	float l[V];
	rand_logits(l, &s);
	struct sampler sp;
	const struct sampler_cand *c;
	struct sampler_params p = { .temp = 0.5f, .top_k = 10, .seed = 1 };
	assert_int_equal(sampler_init(&sp, &p, V), 0);
	int n = sampler_candidates(&sp, l, &c);
	assert_int_equal(n, 10);
	/* p_i ∝ exp(l_i / T) over the 10 best, sorted. */
	double z = 0;
	for (int i = 0; i < n; i++)
		z += exp(l[c[i].id] / 0.5);
	for (int i = 0; i < n; i++) {
		assert_true(fabs(c[i].p - exp(l[c[i].id] / 0.5) / z) < 1e-5);
		if (i)
			assert_true(l[c[i - 1].id] >= l[c[i].id]);
	}
	/* Nothing outside the top 10 is ever sampled. */
	for (int r = 0; r < 500; r++) {
		int t = sampler_sample(&sp, l);
		int rank = 0;
		for (int i = 0; i < V; i++)
			rank += l[i] > l[t];
		assert_true(rank < 10);
	}
	sampler_free(&sp);
	assert_int_equal(sampler_init(&sp, &p, 0), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_greedy),
		cmocka_unit_test(test_topk1_is_greedy),
		cmocka_unit_test(test_seeded_reproducible),
		cmocka_unit_test(test_top_p_mass),
		cmocka_unit_test(test_temperature_and_topk),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
