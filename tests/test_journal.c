/* Tests kvstore/daemon/journal.c on a real file: records appended and replayed in order, the
 * asynchronous group commit (sync generations: what journal_need asks for, what a sync started
 * on the journal's thread covers, journal_sync waiting for it, the on_synced callback and its
 * removal), compaction after a thread sync, and compaction in steps (the snapshot written a
 * part at a time beside the journal, what is appended to both after a part follows it, the
 * switch; a dropped one leaves the journal as it was), and zeros written ahead of the records
 * (replay's end; never over a record; cut off at reopen). */
#include "test_util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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

/* Syncs started back to back (refused while one runs): every generation asked for ends once
 * the caller starts it again, as the data plane does, done never goes back, and every record
 * is in the file. */
static void test_syncs_back_to_back(void **state)
{
	(void)state;
	struct journal *j;
	char err[256];
	assert_int_equal(journal_open(path, 0, &j, err, sizeof err), 0);
	uint64_t seen = 0;
	for (uint32_t i = 0; i < 60; i++) {
		append_n(j, i, 1);
		uint64_t need = journal_need(j);
		assert_int_equal(journal_sync_start(j), 0);
		uint64_t now = journal_synced(j);
		assert_true(now >= seen);
		seen = now;
		if (i % 10 == 9) { /* as the data plane waits: start again while one is refused */
			uint64_t end = clock_ms() + 5000;
			while (journal_synced(j) < need && clock_ms() < end) {
				assert_int_equal(journal_sync_start(j), 0);
				journal_wait_synced(j, need, 5);
			}
			assert_false(journal_synced(j) < need);
		}
	}
	assert_int_equal(journal_sync(j), 0);
	assert_false(journal_dirty(j));
	journal_close(j);
	struct seen s = { 0 };
	struct journal_replay r;
	assert_int_equal(journal_replay(path, collect, &s, &r, err, sizeof err), 0);
	assert_int_equal(s.n, 60);
}

/* Syncs asked for while one runs are begun by the thread the moment it ends: the caller asks
 * once and waits, as the data plane does when its completions wait on a generation. */
static void test_syncs_chained(void **state)
{
	(void)state;
	struct journal *j;
	char err[256];
	assert_int_equal(journal_open(path, 0, &j, err, sizeof err), 0);
	uint64_t need = 0;
	for (uint32_t i = 0; i < 50; i++) {
		append_n(j, i, 1);
		need = journal_need(j);
		assert_int_equal(journal_sync_start(j), 0);
		assert_int_equal(journal_need(j), need); /* it covers everything so far */
	}
	wait_synced(j, need); /* no call after the last ask */
	assert_false(journal_dirty(j));
	journal_close(j);
	struct seen s = { 0 };
	struct journal_replay r;
	assert_int_equal(journal_replay(path, collect, &s, &r, err, sizeof err), 0);
	assert_int_equal(s.n, 50);
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

static bool tmp_exists(void)
{
	char p[160];
	struct stat st;
	snprintf(p, sizeof p, "%s.tmp", path);
	return stat(p, &st) == 0;
}

/* Appends item i to the old journal and to the new one (a change of something the snapshot has
 * written already). */
static void append_both(struct journal *j, struct journal *snap, uint32_t from, uint32_t n)
{
	append_n(j, from, n);
	append_n(snap, from, n);
}

/* A compaction in steps: the caller writes the snapshot into the new journal a part at a time
 * while the old one goes on; what it appends to both after a part is written follows that part;
 * the switch leaves everything durable in the new file. */
static void test_compact_in_steps(void **state)
{
	(void)state;
	struct journal *j, *snap, *again;
	char err[256];
	assert_int_equal(journal_open(path, 0, &j, err, sizeof err), 0);
	for (uint32_t i = 0; i < 30; i++) /* a history the snapshot replaces */
		assert_int_equal(journal_append(j, 7, &(uint32_t){ i % 10 }, 4), 0);
	assert_int_equal(journal_sync(j), 0);
	assert_false(journal_compacting(j));
	assert_int_equal(journal_compact_begin(j, &snap, err, sizeof err), 0);
	assert_true(journal_compacting(j));
	assert_true(tmp_exists());
	assert_int_equal(journal_compact_begin(j, &again, err, sizeof err), -EBUSY);
	assert_int_equal(journal_compact_finish(j, err, sizeof err), -EINVAL); /* not sealed */
	append_n(snap, 0, 5);		/* the snapshot's first part */
	append_n(j, 99, 1);		/* a change of a part not written yet: the old file only */
	append_both(j, snap, 5, 2);	/* a change of the first part */
	append_n(snap, 7, 3);		/* the snapshot's second part (it holds the 99's effect) */
	assert_int_equal(journal_sync_start(j), 0); /* a thread sync of the old file meanwhile */
	append_both(j, snap, 10, 2);
	assert_int_equal(journal_compact_seal(j), 0);
	assert_true(journal_compact_sealed(j));
	append_both(j, snap, 12, 1);	/* while the new file syncs */
	uint64_t need = journal_need(j), end = clock_ms() + 5000;
	int ret;
	while ((ret = journal_compact_finish(j, err, sizeof err)) == JOURNAL_COMPACT_RUNNING &&
	       clock_ms() < end) {
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
	}
	assert_int_equal(ret, JOURNAL_COMPACT_DONE);
	assert_false(journal_compacting(j));
	assert_false(tmp_exists());
	assert_true(journal_synced(j) >= need); /* everything so far durable in the new file */
	assert_false(journal_dirty(j));
	replay_expect(13);
	struct journal_stats st;
	journal_stats(j, &st);
	assert_int_equal(st.compactions, 1);
	assert_int_equal(st.records, 13);
	append_n(j, 13, 2); /* the new file takes the appends */
	journal_close(j);
	replay_expect(15);
}

/* A compaction dropped, or still under way at close, leaves the journal as it was. */
static void test_compact_in_steps_dropped(void **state)
{
	(void)state;
	struct journal *j, *snap;
	char err[256];
	assert_int_equal(journal_open(path, 0, &j, err, sizeof err), 0);
	append_n(j, 0, 5);
	assert_int_equal(journal_compact_begin(j, &snap, err, sizeof err), 0);
	append_n(snap, 0, 2);
	append_n(j, 5, 2);
	journal_compact_abort(j);
	assert_false(journal_compacting(j));
	assert_false(tmp_exists());
	append_n(j, 7, 1);
	assert_int_equal(journal_sync(j), 0);
	replay_expect(8);

	assert_int_equal(journal_compact_begin(j, &snap, err, sizeof err), 0);
	append_n(snap, 0, 1);
	assert_int_equal(journal_compact_seal(j), 0);
	append_n(j, 8, 2);
	journal_close(j);
	assert_false(tmp_exists());
	replay_expect(10);
}

#define BIG 60000u	/* a large record's payload */

static void big_payload(uint32_t i, uint8_t *p)
{
	memcpy(p, &i, 4);
	for (uint32_t k = 4; k < BIG; k++)
		p[k] = (uint8_t)(i * 7u + k);
}

static int collect_big(void *ctx, uint32_t type, const void *payload, uint32_t len, char *msg,
		       size_t msglen)
{
	(void)msg, (void)msglen;
	uint32_t *n = ctx;
	static uint8_t want[BIG];
	if (type != 8 || len != BIG)
		return -EINVAL;
	big_payload(*n, want);
	if (memcmp(payload, want, BIG))
		return -EINVAL;
	(*n)++;
	return 0;
}

static void append_big(struct journal *j, uint32_t from, uint32_t n)
{
	static uint8_t p[BIG];
	for (uint32_t i = from; i < from + n; i++) {
		big_payload(i, p);
		assert_int_equal(journal_append(j, 8, p, BIG), 0);
		if (i % 8 == 7) /* group commits now and then, as the data plane's */
			assert_int_equal(journal_sync_start(j), 0);
	}
}

static uint64_t file_size(void)
{
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	return (uint64_t)st.st_size;
}

/* Waits up to 5 s for the file to reach at least bytes (zeros written ahead). */
static void wait_size(uint64_t bytes)
{
	uint64_t end = clock_ms() + 5000;
	while (file_size() < bytes && clock_ms() < end) {
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
	}
	assert_true(file_size() >= bytes);
}

/* Everything in the file from off on is zero. */
static void assert_zeros_from(uint64_t off)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	assert_int_equal(fseeko(f, (off_t)off, SEEK_SET), 0);
	int c;
	while ((c = getc(f)) != EOF)
		assert_int_equal(c, 0);
	fclose(f);
}

static uint64_t replay_big(uint32_t n)
{
	uint32_t got = 0;
	struct journal_replay r;
	char err[256];
	assert_int_equal(journal_replay(path, collect_big, &got, &r, err, sizeof err), 0);
	if (r.damaged)
		fprintf(stderr, "damaged: %s\n", r.why);
	assert_false(r.damaged);
	assert_int_equal(got, n);
	return r.valid_bytes;
}

/* Zeros written ahead of the records: the file runs past the records with zeros, which replay
 * takes for the end; 20 MB of records written faster than the zeros cross several stretches
 * and none lands over a record; a compaction's file gets zeros of its own once in place; a
 * reopen cuts them off. */
static void test_zeros_ahead(void **state)
{
	(void)state;
	struct journal *j;
	char err[256];
	assert_int_equal(journal_open(path, 0, &j, err, sizeof err), 0);
	journal_preallocate(j, 4u << 20);
	append_big(j, 0, 8);
	assert_int_equal(journal_sync(j), 0);
	struct journal_stats st;
	journal_stats(j, &st);
	wait_size(st.bytes + (2u << 20)); /* the first stretch, past a gap */
	assert_zeros_from(st.bytes);
	assert_int_equal(replay_big(8), st.bytes);

	append_big(j, 8, 340);
	assert_int_equal(journal_sync(j), 0);
	journal_stats(j, &st);
	wait_size(st.bytes + (1u << 20));
	assert_zeros_from(st.bytes);
	assert_int_equal(replay_big(348), st.bytes);

	uint32_t keep = 0; /* a compaction: the new file starts without zeros */
	assert_int_equal(journal_compact(j, fill_none, &keep, err, sizeof err), 0);
	append_big(j, 0, 40);
	assert_int_equal(journal_sync(j), 0);
	journal_stats(j, &st);
	wait_size(st.bytes + (2u << 20));
	assert_zeros_from(st.bytes);
	assert_int_equal(replay_big(40), st.bytes);
	journal_close(j);

	assert_int_equal(journal_open(path, st.bytes, &j, err, sizeof err), 0);
	assert_int_equal(file_size(), st.bytes);
	journal_close(j);
	assert_int_equal(replay_big(40), st.bytes);
}

/* Zeros where a record should be are the end only when nothing but zeros follows. */
static void test_zeros_then_data(void **state)
{
	(void)state;
	struct journal *j;
	char err[256];
	assert_int_equal(journal_open(path, 0, &j, err, sizeof err), 0);
	append_n(j, 0, 3);
	journal_close(j);
	uint64_t end = file_size();
	int fd = open(path, O_WRONLY);
	assert_true(fd >= 0);
	static const uint8_t z[5000];
	assert_int_equal(pwrite(fd, z, 5, (off_t)end), 5); /* shorter than a record header */
	replay_expect(3);
	assert_int_equal(pwrite(fd, z, sizeof z, (off_t)end), (ssize_t)sizeof z);
	replay_expect(3);
	assert_int_equal(pwrite(fd, "x", 1, (off_t)end + 4000), 1);
	close(fd);
	struct seen s = { 0 };
	struct journal_replay r;
	assert_int_equal(journal_replay(path, collect, &s, &r, err, sizeof err), 0);
	assert_int_equal(s.n, 3);
	assert_true(r.damaged);
	assert_int_equal(r.valid_bytes, end);
	assert_int_equal(r.zero_bytes, sizeof z - 4001);
	char want[128];
	snprintf(want, sizeof want, "zeros at byte %" PRIu64 ", then data at byte %" PRIu64, end,
		 end + 4000);
	assert_string_equal(r.why, want);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_generations, setup, teardown),
		cmocka_unit_test_setup_teardown(test_syncs_back_to_back, setup, teardown),
		cmocka_unit_test_setup_teardown(test_syncs_chained, setup, teardown),
		cmocka_unit_test_setup_teardown(test_compact_and_close_after_thread_sync, setup, teardown),
		cmocka_unit_test_setup_teardown(test_compact_in_steps, setup, teardown),
		cmocka_unit_test_setup_teardown(test_compact_in_steps_dropped, setup, teardown),
		cmocka_unit_test_setup_teardown(test_zeros_ahead, setup, teardown),
		cmocka_unit_test_setup_teardown(test_zeros_then_data, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
