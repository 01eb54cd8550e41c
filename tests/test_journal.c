/* Tests kvstore/daemon/journal.c on a real file: records appended and replayed in order, the
 * asynchronous group commit (sync generations: what journal_need asks for, what a sync started
 * on the journal's thread covers, journal_sync waiting for it, the on_synced callback and its
 * removal), compaction after a thread sync, and compaction in the background (a forked child
 * writes the snapshot of the state at the fork; what is appended meanwhile follows it; a failed
 * or abandoned one leaves the journal as it was). */
#include "test_util.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <time.h>

#include "clock.h"
#include "journal.h"

static char dir[64], path[128];

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof dir, "/tmp/freekv-journal-XXXXXX");
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/j", dir);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	char p[160];
	snprintf(p, sizeof p, "%s.tmp", path);
	unlink(p);
	unlink(path);
	rmdir(dir);
	return 0;
}

struct seen {
	uint32_t n;
	uint32_t v[64];
};

static int collect(void *ctx, uint32_t type, const void *payload, uint32_t len, char *msg,
		   size_t msglen)
{
	(void)msg, (void)msglen;
	struct seen *s = ctx;
	uint32_t x;
	if (type != 7 || len != sizeof x || s->n == 64)
		return -EINVAL;
	memcpy(&x, payload, sizeof x);
	s->v[s->n++] = x;
	return 0;
}

static void append_n(struct journal *j, uint32_t from, uint32_t n)
{
	for (uint32_t i = from; i < from + n; i++)
		assert_int_equal(journal_append(j, 7, &i, sizeof i), 0);
}

static void replay_expect(uint32_t n)
{
	struct seen s = { 0 };
	struct journal_replay r;
	char err[256];
	assert_int_equal(journal_replay(path, collect, &s, &r, err, sizeof err), 0);
	assert_false(r.damaged);
	assert_int_equal(s.n, n);
	for (uint32_t i = 0; i < n; i++)
		assert_int_equal(s.v[i], i);
}

/* Waits up to 5 s for the journal's thread to finish generation gen. */
static void wait_synced(struct journal *j, uint64_t gen)
{
	uint64_t end = clock_ms() + 5000;
	while (journal_synced(j) < gen && clock_ms() < end) {
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
	}
	assert_true(journal_synced(j) >= gen);
}

static _Atomic unsigned calls;

static void count_call(void *ctx)
{
	assert_ptr_equal(ctx, &calls);
	atomic_fetch_add(&calls, 1);
}

/* The callback runs just after a generation is marked done: wait for it too. */
static void wait_calls(unsigned n)
{
	uint64_t end = clock_ms() + 5000;
	while (atomic_load(&calls) < n && clock_ms() < end) {
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
	}
	assert_int_equal(atomic_load(&calls), n);
}

static void test_generations(void **state)
{
	(void)state;
	struct journal *j;
	char err[256];
	assert_int_equal(journal_open(path, 0, &j, err, sizeof err), 0);
	/* Nothing appended: nothing to wait for, nothing to start. */
	assert_int_equal(journal_need(j), 0);
	assert_int_equal(journal_synced(j), 0);
	assert_int_equal(journal_sync_start(j), 0);
	assert_int_equal(journal_need(j), 0);
	assert_false(journal_dirty(j));

	atomic_store(&calls, 0);
	journal_on_synced(j, count_call, &calls);
	append_n(j, 0, 3);
	assert_true(journal_dirty(j));
	assert_int_equal(journal_need(j), 1); /* the next sync to start covers them */
	assert_int_equal(journal_sync_start(j), 0);
	assert_int_equal(journal_need(j), 1); /* started: it covers everything so far */
	append_n(j, 3, 2);
	assert_int_equal(journal_need(j), 2); /* these need one that starts later */
	wait_synced(j, 1);
	wait_calls(1);
	assert_int_equal(journal_sync_start(j), 0);
	wait_synced(j, 2);
	wait_calls(2);
	assert_int_equal(journal_need(j), 2);
	assert_false(journal_dirty(j));

	/* The caller's sync is a generation too, and waits for the thread's. */
	append_n(j, 5, 1);
	assert_int_equal(journal_sync_start(j), 0);
	append_n(j, 6, 1);
	assert_int_equal(journal_need(j), 4);
	assert_int_equal(journal_sync(j), 0);
	assert_int_equal(journal_synced(j), 4);
	assert_false(journal_dirty(j));
	assert_int_equal(atomic_load(&calls), 3); /* the thread's ran; the caller's calls nothing */

	/* Once replaced, the callback is never called again. */
	journal_on_synced(j, NULL, NULL);
	append_n(j, 7, 1);
	assert_int_equal(journal_sync_start(j), 0);
	assert_int_equal(journal_sync(j), 0); /* waits for the thread's sync and its callback */
	assert_int_equal(journal_synced(j), 5);
	assert_int_equal(atomic_load(&calls), 3);

	struct journal_stats st;
	journal_stats(j, &st);
	assert_int_equal(st.syncs, 5);
	journal_close(j);
	replay_expect(8);
}

static int fill_none(void *ctx, struct journal *snap)
{
	(void)snap;
	uint32_t *n = ctx;
	for (uint32_t i = 0; i < *n; i++) {
		int ret = journal_append(snap, 7, &i, sizeof i);
		if (ret)
			return ret;
	}
	return 0;
}

/* A sync under way on the thread when the journal is compacted, then closed with records still
 * buffered: the compaction waits for it, the close syncs the rest. */
static void test_compact_and_close_after_thread_sync(void **state)
{
	(void)state;
	struct journal *j;
	char err[256];
	assert_int_equal(journal_open(path, 0, &j, err, sizeof err), 0);
	append_n(j, 0, 10);
	assert_int_equal(journal_sync_start(j), 0);
	uint32_t keep = 4;
	assert_int_equal(journal_compact(j, fill_none, &keep, err, sizeof err), 0);
	replay_expect(4);
	append_n(j, 4, 3);
	assert_int_equal(journal_sync_start(j), 0);
	append_n(j, 7, 2); /* buffered at close */
	journal_close(j);
	replay_expect(9);
}

/* The state a background snapshot writes: items 0..live-1, after sleeping slow_ms (so that
 * the test can append while it runs), or fail_with. */
static uint32_t live;
static int slow_ms, fail_with;

static int fill_live(void *ctx, struct journal *snap)
{
	(void)ctx;
	if (slow_ms) {
		struct timespec ts = { slow_ms / 1000, (long)(slow_ms % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
	if (fail_with)
		return fail_with;
	for (uint32_t i = 0; i < live; i++) {
		int ret = journal_append(snap, 7, &i, sizeof i);
		if (ret)
			return ret;
	}
	return 0;
}

static bool tmp_exists(void)
{
	char p[160];
	struct stat st;
	snprintf(p, sizeof p, "%s.tmp", path);
	return stat(p, &st) == 0;
}

static void test_compact_in_background(void **state)
{
	(void)state;
	struct journal *j;
	char err[256];
	assert_int_equal(journal_open(path, 0, &j, err, sizeof err), 0);
	for (uint32_t i = 0; i < 30; i++) /* a history the snapshot replaces: item 0 three times */
		assert_int_equal(journal_append(j, 7, &(uint32_t){ i % 10 }, 4), 0);
	assert_int_equal(journal_sync(j), 0);
	live = 10, slow_ms = 300, fail_with = 0;
	assert_int_equal(journal_compact_start(j, fill_live, NULL, err, sizeof err), 0);
	assert_true(journal_compacting(j));
	assert_int_equal(journal_compact_start(j, fill_live, NULL, err, sizeof err), -EBUSY);
	live = 1000; /* after the fork: the snapshot does not see it */
	append_n(j, 10, 3);
	assert_int_equal(journal_sync_start(j), 0); /* a thread sync of the old file meanwhile */
	append_n(j, 13, 2);
	assert_int_equal(journal_compact_poll(j, false, err, sizeof err), JOURNAL_COMPACT_RUNNING);
	uint64_t need = journal_need(j);
	assert_int_equal(journal_compact_poll(j, true, err, sizeof err), JOURNAL_COMPACT_DONE);
	assert_false(journal_compacting(j));
	assert_false(tmp_exists());
	/* Everything appended before the switch is durable in the new file. */
	assert_true(journal_synced(j) >= need);
	assert_false(journal_dirty(j));
	replay_expect(15); /* the snapshot's 0..9, then 10..14 appended while it was written */
	struct journal_stats st;
	journal_stats(j, &st);
	assert_int_equal(st.compactions, 1);
	assert_int_equal(st.records, 15);
	assert_int_equal(journal_compact_poll(j, false, err, sizeof err), 0); /* none under way */
	append_n(j, 15, 2); /* the new file takes the appends */
	journal_close(j);
	replay_expect(17);
}

/* A snapshot that fails, or is still running at close, leaves the journal as it was. */
static void test_compact_in_background_fails(void **state)
{
	(void)state;
	struct journal *j;
	char err[256];
	assert_int_equal(journal_open(path, 0, &j, err, sizeof err), 0);
	append_n(j, 0, 5);
	live = 2, slow_ms = 0, fail_with = -EIO;
	assert_int_equal(journal_compact_start(j, fill_live, NULL, err, sizeof err), 0);
	append_n(j, 5, 2);
	assert_int_equal(journal_compact_poll(j, true, err, sizeof err), -EIO);
	assert_non_null(strstr(err, "making its records"));
	assert_false(journal_compacting(j));
	assert_false(tmp_exists());
	append_n(j, 7, 1);
	assert_int_equal(journal_sync(j), 0);
	replay_expect(8);

	fail_with = 0, slow_ms = 10000;
	uint64_t t0 = clock_ms();
	assert_int_equal(journal_compact_start(j, fill_live, NULL, err, sizeof err), 0);
	append_n(j, 8, 2);
	journal_close(j); /* kills the child: no ten-second wait */
	assert_true(clock_ms() - t0 < 5000);
	assert_false(tmp_exists());
	replay_expect(10);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_generations, setup, teardown),
		cmocka_unit_test_setup_teardown(test_compact_and_close_after_thread_sync, setup, teardown),
		cmocka_unit_test_setup_teardown(test_compact_in_background, setup, teardown),
		cmocka_unit_test_setup_teardown(test_compact_in_background_fails, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
