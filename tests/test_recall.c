/* Tests for worker/kvcache/recall.c: the double-buffered recall stream with its two threads. Units come
 * from in-memory HND blocks through the source callback; every slot slice must end up equal to
 * a reference layout_scatter_unit of its block, with tiny staging buffers (many hand-overs),
 * poisoned staging (a buffer reused while read would leave NaN bytes in a slot), many jobs in
 * flight, a prepare step on the copy thread, a failing source, and the backend path (the
 * recall_units op the paged policies use, here the CPU backend's, counted and made to fail), and
 * a real host copy under a lease budget, pinned a staging buffer's worth at a time; an urgent
 * job (a correction's recall) goes before the queued ones. */
#include "test_util.h"

#include <errno.h>
#include <math.h>
#include <unistd.h>

#include "backend.h"
#include "hostkv.h"
#include "recall.h"

enum { LAYERS = 3, PAGES = 40, N_KV = 4, P = 8, D = 16, SLOTS = 12 };

static const struct kv_geom geom = { N_KV, P, D, FKV_BF16 };
static void *blocks[LAYERS][PAGES];
static int fail_page = -1;

static int src(void *arg, int layer, int page, const void **block)
{
	(void)arg;
	if (page == fail_page)
		return -EIO;
	if (layer < 0 || layer >= LAYERS || page < 0 || page >= PAGES)
		return -ERANGE;
	*block = blocks[layer][page];
	return 0;
}

static int setup(void **state)
{
	(void)state;
	uint64_t seed = 77;
	size_t bb = layout_block_bytes(&geom), n = bb / 2;
	for (int l = 0; l < LAYERS; l++)
		for (int p = 0; p < PAGES; p++) {
			float *f = malloc(n * sizeof *f);
			blocks[l][p] = malloc(bb);
			if (!f || !blocks[l][p])
				return -1;
			for (size_t i = 0; i < n; i++)
				f[i] = test_randf(&seed);
			dtype_from_f32(blocks[l][p], f, geom.dtype, n);
			free(f);
		}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	for (int l = 0; l < LAYERS; l++)
		for (int p = 0; p < PAGES; p++)
			free(blocks[l][p]);
	return 0;
}

static size_t slot_floats(void)
{
	return (size_t)2 * P * N_KV * D;
}

/* Random units: every (slot, head) target at most once per job so the expected bytes are
 * defined. */
static int random_units(uint64_t *seed, float *slots, struct recall_unit *u, int max)
{
	bool used[SLOTS][N_KV] = { { false } };
	int n = 0;
	for (int i = 0; i < max; i++) {
		int s = (int)(test_rand(seed) % SLOTS), h = (int)(test_rand(seed) % N_KV);
		if (used[s][h])
			continue;
		used[s][h] = true;
		u[n++] = (struct recall_unit){
			.layer = (int)(test_rand(seed) % LAYERS),
			.page = (int)(test_rand(seed) % PAGES),
			.head = h, .slot = slots + (size_t)s * slot_floats(),
		};
	}
	return n;
}

static void expect_units(float *ref, const float *slots, const struct recall_unit *u, int n)
{
	for (int i = 0; i < n; i++) {
		size_t off = (size_t)((const float *)u[i].slot - slots);
		const char *unit = (const char *)blocks[u[i].layer][u[i].page] +
				   (size_t)u[i].head * layout_unit_bytes(&geom);
		layout_scatter_unit(&geom, ref + off, u[i].head, unit);
	}
}

static void test_jobs_in_flight(void **state)
{
	(void)state;
	const int cases[] = { 1, 3, 64 }; /* staging capacity in units */
	/* Each staging capacity with the ablations (docs/design.md §5): per-token pieces, one
	 * staging buffer, both. */
	for (size_t c = 0; c < 4 * sizeof cases / sizeof *cases; c++) {
		const int v = (int)(c / (sizeof cases / sizeof *cases));
		struct recall_opts o = { .g = geom, .units_per_buffer = cases[c % 3], .src = src,
					 .poison = true, .fragmented = v & 1,
					 .single_buffer = v & 2 };
		struct recall *r;
		assert_int_equal(recall_new(&o, &r), 0);
		enum { JOBS = 6 };
		size_t nf = SLOTS * slot_floats();
		float *slots[JOBS], *ref[JOBS];
		struct recall_unit units[JOBS][SLOTS * N_KV];
		int n[JOBS];
		uint64_t tickets[JOBS], seed = 1234 + c;
		for (int j = 0; j < JOBS; j++) {
			slots[j] = calloc(nf, sizeof(float));
			ref[j] = calloc(nf, sizeof(float));
			n[j] = random_units(&seed, slots[j], units[j], SLOTS * N_KV);
			expect_units(ref[j], slots[j], units[j], n[j]);
			assert_int_equal(recall_submit(r, units[j], n[j], NULL, NULL, &tickets[j]), 0);
		}
		/* Wait out of order: each ticket is its own event. */
		for (int j = JOBS - 1; j >= 0; j--) {
			struct recall_done dn;
			assert_int_equal(recall_wait(r, tickets[j], &dn), 0);
			assert_int_equal(dn.units, n[j]);
			assert_int_equal(dn.bytes, (int64_t)n[j] * (int64_t)layout_unit_bytes(&geom));
			assert_true(dn.ns_busy > 0);
			for (size_t i = 0; i < nf; i++)
				assert_false(isnan(slots[j][i]));
			assert_memory_equal(slots[j], ref[j], nf * sizeof(float));
		}
		/* A ticket is waited for once; 0 is always done. */
		assert_int_equal(recall_wait(r, tickets[0], NULL), -EINVAL);
		assert_int_equal(recall_wait(r, 0, NULL), 0);
		recall_free(r);
		for (int j = 0; j < JOBS; j++) {
			free(slots[j]);
			free(ref[j]);
		}
	}
}

/* More jobs than the ring holds, submitted and waited in a sliding window. */
static void test_many_jobs(void **state)
{
	(void)state;
	struct recall_opts o = { .g = geom, .units_per_buffer = 2, .src = src, .poison = true };
	struct recall *r;
	assert_int_equal(recall_new(&o, &r), 0);
	size_t nf = SLOTS * slot_floats();
	float *slots = calloc(nf, sizeof(float)), *ref = calloc(nf, sizeof(float));
	uint64_t seed = 99;
	for (int it = 0; it < 300; it++) {
		struct recall_unit u[SLOTS * N_KV];
		int n = random_units(&seed, slots, u, 5);
		uint64_t t;
		assert_int_equal(recall_submit(r, u, n, NULL, NULL, &t), 0);
		expect_units(ref, slots, u, n);
		assert_int_equal(recall_wait(r, t, NULL), 0);
	}
	assert_memory_equal(slots, ref, nf * sizeof(float));
	recall_free(r);
	free(slots);
	free(ref);
}

struct prep {
	float *slots;
	struct recall_unit u[4];
	int calls;
};

static int prepare(void *arg, struct recall_unit **units, int *n)
{
	struct prep *p = arg;
	p->calls++;
	for (int h = 0; h < 4; h++)
		p->u[h] = (struct recall_unit){ 1, 7 + h, h, p->slots + (size_t)h * slot_floats() };
	*units = p->u;
	*n = 4;
	return 0;
}

static void test_prepare_and_errors(void **state)
{
	(void)state;
	struct recall_opts o = { .g = geom, .units_per_buffer = 3, .src = src };
	struct recall *r;
	assert_int_equal(recall_new(&o, &r), 0);
	size_t nf = SLOTS * slot_floats();
	struct prep pr = { .slots = calloc(nf, sizeof(float)) };
	float *ref = calloc(nf, sizeof(float));
	uint64_t t1, t2, t3;
	assert_int_equal(recall_submit(r, NULL, 0, prepare, &pr, &t1), 0);
	/* A failing source fails its own job only. */
	struct recall_unit bad[2] = { { 0, 5, 0, pr.slots }, { 0, 6, 1, pr.slots } };
	fail_page = 6;
	assert_int_equal(recall_submit(r, bad, 2, NULL, NULL, &t2), 0);
	assert_int_equal(recall_wait(r, t1, NULL), 0);
	assert_int_equal(recall_wait(r, t2, NULL), -EIO);
	fail_page = -1;
	struct recall_unit empty;
	assert_int_equal(recall_submit(r, &empty, 0, NULL, NULL, &t3), 0);
	assert_int_equal(recall_wait(r, t3, NULL), 0);
	assert_int_equal(pr.calls, 1);
	/* Only the prepared units (and bad[0], written before the failure) landed. */
	expect_units(ref, pr.slots, pr.u, 4);
	expect_units(ref, pr.slots, bad, 1);
	assert_memory_equal(pr.slots, ref, nf * sizeof(float));
	assert_int_equal(recall_submit(r, NULL, 1, NULL, NULL, &t3), -EINVAL);
	recall_free(r);
	free(pr.slots);
	free(ref);
	struct recall_opts none = { .g = geom };
	assert_int_equal(recall_new(&none, &r), -EINVAL);
}

/* The accounting of a job whose prepare step takes long (speculative selection runs there):
 * ns_busy and ns_hidden count the copy and the conversion only, not the prepare step, which its
 * caller times itself (policy_freekv folds it into ns_select): the old accounting started the
 * clock before prepare and reported the selection as recall time a second time. */
static int slow_prepare(void *arg, struct recall_unit **units, int *n)
{
	struct prep *p = arg;
	p->calls++;
	usleep(200 * 1000);
	*units = p->u;
	*n = 0;
	return 0;
}

static void test_accounting_excludes_prepare(void **state)
{
	(void)state;
	struct recall_opts o = { .g = geom, .units_per_buffer = 3, .src = src };
	struct recall *r;
	assert_int_equal(recall_new(&o, &r), 0);
	struct prep pr = { 0 };
	uint64_t t;
	struct recall_done dn;
	assert_int_equal(recall_submit(r, NULL, 0, slow_prepare, &pr, &t), 0);
	assert_int_equal(recall_wait(r, t, &dn), 0);
	assert_int_equal(pr.calls, 1);
	assert_int_equal(dn.units, 0);
	assert_true(dn.ns_waited >= 150 * 1000 * 1000);
	assert_true(dn.ns_busy < 150 * 1000 * 1000);
	assert_true(dn.ns_hidden >= 0 && dn.ns_hidden < 150 * 1000 * 1000);
	/* A job waited for long after it finished: all of its wall time was hidden. */
	struct recall_unit u = { 1, 7, 0, NULL };
	float *slots = calloc(SLOTS * slot_floats(), sizeof(float));
	u.slot = slots;
	assert_int_equal(recall_submit(r, &u, 1, NULL, NULL, &t), 0);
	usleep(100 * 1000);
	assert_int_equal(recall_wait(r, t, &dn), 0);
	assert_int_equal(dn.units, 1);
	assert_true(dn.ns_hidden > 0);
	assert_true(dn.ns_hidden <= dn.ns_busy + dn.ns_waited + 100 * 1000 * 1000);
	recall_free(r);
	free(slots);
}

/* A CPU backend whose recall ops count units and fail on demand: the convert thread hands
 * whole staging buffers to the backend op — recall_units with the units copied (staged), or
 * recall_direct with where each unit lies (the default when the backend has it) — whose
 * failure fails the job. */
static const struct backend_ops *cpu_ops;
static int be_units, be_direct, be_fail;

static int counting_recall_units(void *ctx, void *const *slots, const int *heads,
				 const void *units, int n, int p, int n_kv, int d,
				 enum fkv_dtype dt, enum fkv_dtype sdt, void *done)
{
	be_units += n;
	if (be_fail)
		return -EIO;
	return cpu_ops->recall_units(ctx, slots, heads, units, n, p, n_kv, d, dt, sdt, done);
}

static int counting_recall_direct(void *ctx, void *const *slots, const int *heads,
				  const void *const *srcs, int n, int p, int n_kv, int d,
				  enum fkv_dtype dt, enum fkv_dtype sdt, void *done)
{
	be_direct += n;
	if (be_fail)
		return -EIO;
	return cpu_ops->recall_direct(ctx, slots, heads, srcs, n, p, n_kv, d, dt, sdt, done);
}

static int be_frag;

static int counting_recall_fragmented(void *ctx, void *const *slots, const int *heads,
				      const void *const *srcs, int n, int p, int n_kv, int d,
				      enum fkv_dtype dt, enum fkv_dtype sdt, void *done)
{
	be_frag += n;
	return cpu_ops->recall_fragmented(ctx, slots, heads, srcs, n, p, n_kv, d, dt, sdt, done);
}

static void test_backend_recall_units(void **state)
{
	(void)state;
	struct backend *cpu;
	assert_int_equal(backend_cpu_new(&cpu, 1), 0);
	cpu_ops = cpu->ops;
	assert_non_null(cpu_ops->recall_units);
	assert_non_null(cpu_ops->recall_direct);
	struct backend_ops ops = *cpu_ops;
	ops.recall_units = counting_recall_units;
	ops.recall_direct = counting_recall_direct;
	struct backend be = { .ops = &ops, .ctx = cpu->ctx };
	for (int staged = 0; staged < 2; staged++) {
		struct recall_opts o = { .g = geom, .units_per_buffer = 5, .src = src,
					 .poison = true, .be = &be,
					 .path = staged ? RECALL_STAGED : RECALL_DMA };
		struct recall *r;
		assert_int_equal(recall_new(&o, &r), 0);
		size_t nf = SLOTS * slot_floats();
		float *slots = calloc(nf, sizeof(float)), *ref = calloc(nf, sizeof(float));
		struct recall_unit units[SLOTS * N_KV];
		uint64_t seed = 99, ticket;
		int n = random_units(&seed, slots, units, SLOTS * N_KV);
		expect_units(ref, slots, units, n);
		be_units = be_direct = 0;
		assert_int_equal(recall_submit(r, units, n, NULL, NULL, &ticket), 0);
		assert_int_equal(recall_wait(r, ticket, NULL), 0);
		assert_int_equal(staged ? be_units : be_direct, n);
		assert_int_equal(staged ? be_direct : be_units, 0);
		assert_memory_equal(slots, ref, nf * sizeof(float));
		be_fail = 1;
		assert_int_equal(recall_submit(r, units, n, NULL, NULL, &ticket), 0);
		assert_int_equal(recall_wait(r, ticket, NULL), -EIO);
		be_fail = 0;
		recall_free(r);
		free(slots);
		free(ref);
	}
	/* The layout ablation: every unit through recall_fragmented, the same bytes. */
	ops.recall_fragmented = counting_recall_fragmented;
	{
		struct recall_opts o = { .g = geom, .units_per_buffer = 5, .src = src, .be = &be,
					 .fragmented = true, .path = RECALL_MAPPED };
		struct recall *r;
		assert_int_equal(recall_new(&o, &r), 0);
		size_t nf = SLOTS * slot_floats();
		float *slots = calloc(nf, sizeof(float)), *ref = calloc(nf, sizeof(float));
		struct recall_unit units[SLOTS * N_KV];
		uint64_t seed = 7, ticket;
		int n = random_units(&seed, slots, units, SLOTS * N_KV);
		expect_units(ref, slots, units, n);
		be_units = be_direct = be_frag = 0;
		assert_int_equal(recall_submit(r, units, n, NULL, NULL, &ticket), 0);
		assert_int_equal(recall_wait(r, ticket, NULL), 0);
		assert_int_equal(be_frag, n);
		assert_int_equal(be_units + be_direct, 0);
		assert_memory_equal(slots, ref, nf * sizeof(float));
		recall_free(r);
		free(slots);
		free(ref);
		/* Asked for without the op: refused up front. */
		ops.recall_fragmented = NULL;
		assert_int_equal(recall_new(&o, &r), -EOPNOTSUPP);
	}
	/* A backend without recall_units cannot carry a recall stream. */
	struct recall_opts o = { .g = geom, .units_per_buffer = 5, .src = src, .be = &be };
	struct recall *r;
	ops.recall_units = NULL;
	assert_int_equal(recall_new(&o, &r), -EOPNOTSUPP);
	backend_free(cpu);
}

/* The copy thread's fetch log: the layer of every unit's block, in fetch order; layer 0's
 * fetches are slow, so the jobs submitted after it are all queued while it runs. */
static int fetch_log[256], n_fetch;

static int slow_src(void *arg, int layer, int page, const void **block)
{
	(void)arg;
	if (n_fetch < 256)
		fetch_log[n_fetch++] = layer;
	if (layer == 0)
		usleep(3000);
	*block = blocks[layer][page];
	return 0;
}

/* Four units of one layer into distinct (slot, head) pairs of one slot row. */
static void layer_units(struct recall_unit *u, float *slots, int layer, int slot0)
{
	for (int i = 0; i < 4; i++)
		u[i] = (struct recall_unit){ .layer = layer, .page = 3 * i + layer, .head = i,
					     .slot = slots + (size_t)(slot0 + i % 2) * slot_floats() };
}

/* An urgent job (a correction's blocking recall) goes before every job not yet started: with a
 * slow job A (layer 0) being copied and jobs B, C (layer 1) queued behind it, an urgent job U
 * (layer 2) submitted last is fetched right after A, before B and C; every slot still lands
 * right, and the tickets of both kinds complete. */
static void test_urgent_first(void **state)
{
	(void)state;
	struct recall_opts o = { .g = geom, .units_per_buffer = 2, .src = slow_src };
	struct recall *r;
	assert_int_equal(recall_new(&o, &r), 0);
	size_t nf = SLOTS * slot_floats();
	float *slots = calloc(nf, sizeof(float)), *ref = calloc(nf, sizeof(float));
	struct recall_unit a[4], b[4], c[4], u[4];
	layer_units(a, slots, 0, 0);
	layer_units(b, slots, 1, 2);
	layer_units(c, slots, 1, 4);
	layer_units(u, slots, 2, 6);
	n_fetch = 0;
	uint64_t ta, tb, tc, tu;
	assert_int_equal(recall_submit(r, a, 4, NULL, NULL, &ta), 0);
	assert_int_equal(recall_submit(r, b, 4, NULL, NULL, &tb), 0);
	assert_int_equal(recall_submit(r, c, 4, NULL, NULL, &tc), 0);
	assert_int_equal(recall_submit_urgent(r, u, 4, &tu), 0);
	assert_int_equal(recall_wait(r, tu, NULL), 0);
	assert_int_equal(recall_wait(r, ta, NULL), 0);
	assert_int_equal(recall_wait(r, tb, NULL), 0);
	assert_int_equal(recall_wait(r, tc, NULL), 0);
	assert_int_equal(recall_wait(r, tu, NULL), -EINVAL); /* waited once */
	assert_int_equal(n_fetch, 16);
	int first2 = -1, first1 = -1;
	for (int i = 0; i < n_fetch; i++) {
		if (fetch_log[i] == 2 && first2 < 0)
			first2 = i;
		if (fetch_log[i] == 1 && first1 < 0)
			first1 = i;
	}
	assert_true(first2 >= 0 && first1 >= 0);
	if (first2 > first1)
		fail_msg("the urgent job was fetched at %d, after a queued job at %d", first2,
			 first1);
	expect_units(ref, slots, a, 4);
	expect_units(ref, slots, b, 4);
	expect_units(ref, slots, c, 4);
	expect_units(ref, slots, u, 4);
	assert_memory_equal(slots, ref, nf * sizeof(float));
	recall_free(r);
	free(slots);
	free(ref);
}

/* Units from a real host copy (hostkv's embedded store with a lease budget of 2 blocks, so most
 * blocks are released): a staging buffer's units, of several layers and with repeated pages,
 * are pinned a layer at a time — no more RECALL entries than (buffer, layer) groups, where a
 * pin per unit would send one per released page — copied right and unpinned; a unit of a page
 * with no block fails its job and leaves nothing pinned. */
static void test_host_pins(void **state)
{
	(void)state;
	struct hostkv_opts ho = { .embedded_bytes = 8u << 20, .lease_budget = 2 };
	struct hostkv *h;
	struct hostkv_seq *hs;
	char err[256];
	uint8_t fp[FKV_FINGERPRINT_BYTES] = { 0x7e };
	assert_int_equal(hostkv_open(&ho, &h, err, sizeof err), 0);
	assert_int_equal(hostkv_seq_open(h, "rc", fp, LAYERS, &geom, true, &hs, err, sizeof err),
			 0);
	size_t bb = layout_block_bytes(&geom);
	for (int p = 0; p < PAGES; p++)
		for (int l = 0; l < LAYERS; l++) {
			void *w;
			assert_int_equal(hostkv_block(hs, l, p, &w, err, sizeof err), 0);
			memcpy(w, blocks[l][p], bb);
		}
	static int32_t ids[PAGES * P];
	assert_int_equal(hostkv_commit(hs, PAGES * P, ids, 0, PAGES * P, err, sizeof err), 0);

	enum { CAP = 7 };
	struct recall_opts o = { .g = geom, .units_per_buffer = CAP, .host = hs, .poison = true };
	struct recall *r;
	assert_int_equal(recall_new(&o, &r), 0);
	size_t nf = SLOTS * slot_floats();
	float *slots = calloc(nf, sizeof(float)), *ref = calloc(nf, sizeof(float));
	struct recall_unit units[SLOTS * N_KV];
	uint64_t seed = 4242, ticket;
	int n = random_units(&seed, slots, units, SLOTS * N_KV);
	for (int i = 3; i < n; i += 3) { /* the page of the unit before, another head or slot */
		units[i].layer = units[i - 1].layer;
		units[i].page = units[i - 1].page;
	}
	expect_units(ref, slots, units, n);
	int groups = 0;
	for (int c = 0; c < n; c += CAP)
		for (int l = 0; l < LAYERS; l++)
			for (int i = c; i < c + CAP && i < n; i++)
				if (units[i].layer == l) {
					groups++;
					break;
				}
	struct hostkv_lease_stats st0, st;
	hostkv_seq_lease_stats(hs, &st0);
	assert_int_equal(recall_submit(r, units, n, NULL, NULL, &ticket), 0);
	assert_int_equal(recall_wait(r, ticket, NULL), 0);
	assert_memory_equal(slots, ref, nf * sizeof(float));
	hostkv_seq_lease_stats(hs, &st);
	assert_int_equal(st.pinned, 0);
	assert_true(st.evictable <= 2);
	assert_true(st.recall_ops - st0.recall_ops <= (uint64_t)groups);
	assert_true(st.recalls - st0.recalls > (uint64_t)groups);

	units[n / 2].page = PAGES + 100;
	assert_int_equal(recall_submit(r, units, n, NULL, NULL, &ticket), 0);
	assert_int_equal(recall_wait(r, ticket, NULL), -ENOENT);
	hostkv_seq_lease_stats(hs, &st);
	assert_int_equal(st.pinned, 0);
	assert_true(st.evictable <= 2);
	recall_free(r);
	free(slots);
	free(ref);
	assert_int_equal(hostkv_seq_close(hs, true), 0);
	hostkv_close(h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_jobs_in_flight),
		cmocka_unit_test(test_many_jobs),
		cmocka_unit_test(test_prepare_and_errors),
		cmocka_unit_test(test_accounting_excludes_prepare),
		cmocka_unit_test(test_backend_recall_units),
		cmocka_unit_test(test_host_pins),
		cmocka_unit_test(test_urgent_first),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
