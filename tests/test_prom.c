/* metrics/prom.c: the text format byte for byte — HELP/TYPE lines, label values escaped,
 * integral and fractional values, histogram buckets cumulative with le="+Inf" equal to _count,
 * a value on a bound counted in that bound's bucket — and bad bounds refused. */
#include "test_util.h"

#include <errno.h>
#include <math.h>

#include "prom.h"

static void test_samples(void **state)
{
	(void)state;
	struct prom_buf b;
	prom_buf_init(&b);
	prom_family(&b, "freekv_x_total", "counter", "a \\ help\nline");
	struct prom_label l[2] = { { "worker", "ipc:///a\"b\\c\nd" }, { "code", "200" } };
	prom_sample(&b, "freekv_x_total", l, 2, 42);
	prom_one(&b, "freekv_y_seconds", "gauge", "y", 0.25);
	prom_one(&b, "freekv_z", "gauge", "z", NAN);
	assert_int_equal(b.err, 0);
	assert_string_equal(b.p,
			    "# HELP freekv_x_total a \\\\ help\\nline\n"
			    "# TYPE freekv_x_total counter\n"
			    "freekv_x_total{worker=\"ipc:///a\\\"b\\\\c\\nd\",code=\"200\"} 42\n"
			    "# HELP freekv_y_seconds y\n# TYPE freekv_y_seconds gauge\n"
			    "freekv_y_seconds 0.25\n"
			    "# HELP freekv_z z\n# TYPE freekv_z gauge\nfreekv_z NaN\n");
	prom_buf_free(&b);
}

static void test_histogram(void **state)
{
	(void)state;
	struct prom_hist h;
	const double bounds[] = { 0.1, 1, 2.5 };
	assert_int_equal(prom_hist_init(&h, bounds, 3), 0);
	prom_hist_observe(&h, 0.05);
	prom_hist_observe(&h, 1);	/* on a bound: in le="1" */
	prom_hist_observe(&h, 2);
	prom_hist_observe(&h, 7);
	struct prom_buf b;
	prom_buf_init(&b);
	struct prom_label l = { "path", "/v1" };
	prom_hist_write(&b, "freekv_d_seconds", &l, 1, &h);
	assert_string_equal(b.p,
			    "freekv_d_seconds_bucket{path=\"/v1\",le=\"0.1\"} 1\n"
			    "freekv_d_seconds_bucket{path=\"/v1\",le=\"1\"} 2\n"
			    "freekv_d_seconds_bucket{path=\"/v1\",le=\"2.5\"} 3\n"
			    "freekv_d_seconds_bucket{path=\"/v1\",le=\"+Inf\"} 4\n"
			    "freekv_d_seconds_sum{path=\"/v1\"} 10.05\n"
			    "freekv_d_seconds_count{path=\"/v1\"} 4\n");
	prom_buf_free(&b);
	prom_hist_free(&h);
	const double bad[] = { 1, 1 };
	assert_int_equal(prom_hist_init(&h, bad, 2), -EINVAL);
	assert_int_equal(prom_hist_init(&h, bad, 0), -EINVAL);
	/* The shared latency buckets print as written (shortest round trip). */
	assert_int_equal(prom_hist_init(&h, prom_latency_buckets, prom_n_latency_buckets), 0);
	prom_buf_init(&b);
	prom_hist_write(&b, "t", NULL, 0, &h);
	assert_non_null(strstr(b.p, "t_bucket{le=\"0.00025\"} 0\n"));
	prom_buf_free(&b);
	prom_hist_free(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_samples),
		cmocka_unit_test(test_histogram),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
