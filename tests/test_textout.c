/* gate/textout.c: stop strings found across piece boundaries, text before them handed out
 * once and never retracted, held-back prefixes released when they turn out not to stop;
 * multi-byte characters split over pieces are held until complete; invalid bytes become
 * U+FFFD. */
#include "test_util.h"

#include "textout.h"

/* Pushes pieces one by one; returns the concatenation of what was handed out, then flushed. */
static char *run(const char *const *pieces, int n, const char *const *stop, int n_stop,
		 bool *stopped, size_t *handed_before_flush)
{
	struct textout t;
	struct tbuf out = { 0 };
	textout_init(&t, stop, n_stop);
	for (int i = 0; i < n; i++)
		assert_int_equal(textout_push(&t, pieces[i], strlen(pieces[i]), &out), 0);
	if (handed_before_flush)
		*handed_before_flush = out.len;
	assert_int_equal(textout_flush(&t, &out), 0);
	*stopped = t.stopped;
	textout_free(&t);
	char *s = strdup(out.p ? out.p : "");
	tbuf_free(&out);
	return s;
}

static void test_stop(void **state)
{
	(void)state;
	bool st;
	size_t before;
	const char *const p1[] = { "Hello wo", "rld. The", " end" };
	const char *const s1[] = { "ld. T" };
	char *r = run(p1, 3, s1, 1, &st, NULL);
	assert_string_equal(r, "Hello wor");
	assert_true(st);
	free(r);
	/* "wor" could start "world!": held back, then released when it is "world." */
	const char *const s2[] = { "world!" };
	r = run(p1, 3, s2, 1, &st, &before);
	assert_string_equal(r, "Hello world. The end");
	assert_false(st);
	assert_int_equal(before, strlen("Hello world. The end"));
	free(r);
	/* The earliest of several stop strings wins. */
	const char *const s3[] = { "end", "The" };
	r = run(p1, 3, s3, 2, &st, NULL);
	assert_string_equal(r, "Hello world. ");
	free(r);
	/* A stop string at the very start leaves nothing. */
	const char *const s4[] = { "Hel" };
	r = run(p1, 3, s4, 1, &st, NULL);
	assert_string_equal(r, "");
	assert_true(st);
	free(r);
	/* A prefix of a stop string at the end of the stream is text after all. */
	const char *const p5[] = { "abc", "de" };
	const char *const s5[] = { "def" };
	r = run(p5, 2, s5, 1, &st, &before);
	assert_int_equal(before, 3);
	assert_string_equal(r, "abcde");
	free(r);
}

static void test_utf8(void **state)
{
	(void)state;
	bool st;
	size_t before;
	/* "é" (c3 a9) and "€" (e2 82 ac) split across pieces. */
	const char *const p1[] = { "caf\xc3", "\xa9 5\xe2\x82", "\xac" };
	char *r = run(p1, 3, NULL, 0, &st, &before);
	assert_string_equal(r, "caf\xc3\xa9 5\xe2\x82\xac");
	assert_int_equal(before, strlen(r));
	free(r);
	/* Bytes that never complete a character, and invalid ones, become U+FFFD. */
	const char *const p2[] = { "a\xff", "b\xe2\x82" };
	r = run(p2, 2, NULL, 0, &st, &before);
	assert_string_equal(r, "a\xef\xbf\xbd" "b\xef\xbf\xbd\xef\xbf\xbd");
	free(r);
	struct tbuf o = { 0 };
	/* Overlong "/" (c0 af) and a UTF-16 surrogate (ed a0 80) are not UTF-8. */
	assert_int_equal(utf8_sanitize("\xc0\xaf\xed\xa0\x80ok", 7, &o), 0);
	assert_string_equal(o.p, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdok");
	tbuf_free(&o);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stop),
		cmocka_unit_test(test_utf8),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
