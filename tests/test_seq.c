/* Tests kvstore/daemon/seq.c: open/reopen rules (fingerprint and geometry must match), geometry
 * bounds, attach/detach/orphan state changes, token ids kept and checked, and the block map. */
#include "test_util.h"

#include <errno.h>

#include "seq.h"

static const struct seq_geometry geo = { 4, 2, 64, 16, SEQ_DTYPE_F16 };
static const uint8_t fp[32] = { 1, 2, 3 };

static struct seq *open_ok(struct seq_table *t, const char *name, const uint32_t *tok, size_t n)
{
	struct seq *s;
	bool created;
	char err[256];
	assert_int_equal(seq_open(t, name, fp, sizeof fp, &geo, tok, n, 1000, true, &s, &created, err, sizeof err), 0);
	return s;
}

static void test_open_reopen(void **state)
{
	(void)state;
	struct seq_table t;
	struct seq *s, *r;
	bool created;
	char err[256];
	uint32_t tok[5] = { 10, 11, 12, 13, 14 };
	seq_table_init(&t, 2);
	s = open_ok(&t, "a", tok, 3);
	assert_int_equal(s->state, SEQ_DETACHED);
	assert_int_equal(s->block_bytes, 2 * 2 * 16 * 64 * 2);
	assert_int_equal(s->n_tokens, 3);
	/* reopen extends the token ids when they agree */
	assert_int_equal(seq_open(&t, "a", fp, sizeof fp, &geo, tok, 5, 1000, true, &r, &created, err, sizeof err), 0);
	assert_ptr_equal(r, s);
	assert_false(created);
	assert_int_equal(s->n_tokens, 5);
	uint32_t bad[2] = { 10, 99 };
	assert_int_equal(seq_open(&t, "a", fp, sizeof fp, &geo, bad, 2, 1000, true, &r, &created, err, sizeof err), -EINVAL);
	uint8_t fp2[32] = { 9 };
	assert_int_equal(seq_open(&t, "a", fp2, sizeof fp2, &geo, NULL, 0, 1000, true, &r, &created, err, sizeof err), -EEXIST);
	assert_non_null(strstr(err, "fingerprint"));
	struct seq_geometry g2 = geo;
	g2.page_size = 32;
	assert_int_equal(seq_open(&t, "a", fp, sizeof fp, &g2, NULL, 0, 1000, true, &r, &created, err, sizeof err), -EEXIST);
	assert_non_null(strstr(err, "geometry"));
	assert_int_equal(seq_open(&t, "b", fp, sizeof fp, &geo, NULL, 0, 1000, false, &r, &created, err, sizeof err), -ENOENT);
	open_ok(&t, "b", NULL, 0);
	assert_int_equal(seq_open(&t, "c", fp, sizeof fp, &geo, NULL, 0, 1000, true, &r, &created, err, sizeof err), -ENOSPC);
	assert_int_equal(seq_open(&t, "", fp, sizeof fp, &geo, NULL, 0, 1000, true, &r, &created, err, sizeof err), -EINVAL);
	assert_int_equal(seq_open(&t, "a", fp, 0, &geo, NULL, 0, 1000, true, &r, &created, err, sizeof err), -EINVAL);
	assert_int_equal(seq_open(&t, "a", fp, sizeof fp, &geo, tok, 5, 4, true, &r, &created, err, sizeof err), -E2BIG);
	assert_ptr_equal(seq_find_name(&t, "b"), seq_find(&t, seq_find_name(&t, "b")->id));
	assert_null(seq_find(&t, 12345));
	seq_table_shutdown(&t);
}

static void test_geometry_bounds(void **state)
{
	(void)state;
	char err[256];
	struct seq_geometry g = geo;
	assert_int_equal(seq_check_geometry(&g, err, sizeof err), 0);
	g.n_layers = 0;
	assert_int_equal(seq_check_geometry(&g, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "n_layers"));
	g = geo;
	g.dtype = 7;
	assert_int_equal(seq_check_geometry(&g, err, sizeof err), -EINVAL);
	g = geo;
	g.head_dim = 4096;
	g.n_kv_heads = 1024;
	assert_int_equal(seq_check_geometry(&g, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "block"));
}

static void test_states(void **state)
{
	(void)state;
	struct seq_table t;
	char err[256];
	seq_table_init(&t, 8);
	struct seq *a = open_ok(&t, "a", NULL, 0), *b = open_ok(&t, "b", NULL, 0);
	assert_int_equal(seq_attach(a, 1, err, sizeof err), 0);
	assert_int_equal(seq_attach(a, 2, err, sizeof err), -EBUSY);
	assert_int_equal(seq_attach(b, 2, err, sizeof err), 0);
	assert_int_equal(seq_detach(b, 1, err, sizeof err), -EPERM);
	assert_int_equal(seq_orphan_worker(&t, 1), 1);
	assert_int_equal(a->state, SEQ_ORPHANED);
	assert_int_equal(b->state, SEQ_ATTACHED);
	assert_int_equal(seq_attach(a, 3, err, sizeof err), 0); /* an orphan can be resumed */
	assert_int_equal(a->worker_id, 3);
	assert_int_equal(seq_detach(a, 3, err, sizeof err), 0);
	assert_int_equal(a->state, SEQ_DETACHED);
	assert_string_equal(seq_state_name(SEQ_ORPHANED), "orphaned");
	seq_remove(&t, a);
	assert_null(seq_find_name(&t, "a"));
	assert_int_equal(t.n, 1);
	seq_table_shutdown(&t);
}

static void test_commit_tokens(void **state)
{
	(void)state;
	struct seq_table t;
	char err[256];
	uint32_t tok[8] = { 5, 6, 7, 8, 9, 10, 11, 12 };
	seq_table_init(&t, 8);
	struct seq *s = open_ok(&t, "s", tok, 2);
	assert_int_equal(seq_commit(s, 4, 2, tok + 2, 2, 100, err, sizeof err), 0);
	assert_int_equal(s->n_tokens, 4);
	assert_int_equal(s->committed_tokens, 4);
	/* overlapping re-send that agrees */
	assert_int_equal(seq_commit(s, 6, 3, tok + 3, 3, 100, err, sizeof err), 0);
	assert_int_equal(s->n_tokens, 6);
	assert_memory_equal(s->tokens, tok, 6 * sizeof *tok);
	uint32_t wrong = 77;
	assert_int_equal(seq_commit(s, 6, 5, &wrong, 1, 100, err, sizeof err), -EINVAL);
	assert_int_equal(seq_commit(s, 9, 8, tok, 1, 100, err, sizeof err), -EINVAL); /* gap */
	assert_int_equal(seq_commit(s, 9, 6, tok, 2, 7, err, sizeof err), -E2BIG);
	assert_int_equal(s->n_tokens, 6);
	seq_table_shutdown(&t);
}

static void test_block_map(void **state)
{
	(void)state;
	struct seq_table t;
	uint64_t rng = 42;
	uint32_t ref[4][100];
	seq_table_init(&t, 8);
	struct seq *s = open_ok(&t, "m", NULL, 0);
	assert_int_equal(seq_block(s, 0, 0), SEQ_NO_BLOCK);
	for (int l = 0; l < 4; l++)
		for (int p = 0; p < 100; p++)
			ref[l][p] = SEQ_NO_BLOCK;
	for (int i = 0; i < 300; i++) {
		uint32_t l = (uint32_t)(test_rand(&rng) % 4), p = (uint32_t)(test_rand(&rng) % 100);
		uint32_t b = (uint32_t)(test_rand(&rng) % 100000);
		assert_int_equal(seq_set_block(s, l, p, b), 0);
		ref[l][p] = b;
	}
	for (int l = 0; l < 4; l++)
		for (int p = 0; p < 100; p++)
			assert_int_equal(seq_block(s, (uint32_t)l, (uint32_t)p), ref[l][p]);
	assert_int_equal(seq_set_block(s, 4, 0, 1), -EINVAL);
	assert_int_equal(seq_block(s, 4, 0), SEQ_NO_BLOCK);
	assert_int_equal(seq_block(s, 0, 100000), SEQ_NO_BLOCK);
	seq_table_shutdown(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_open_reopen),
		cmocka_unit_test(test_geometry_bounds),
		cmocka_unit_test(test_states),
		cmocka_unit_test(test_commit_tokens),
		cmocka_unit_test(test_block_map),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
