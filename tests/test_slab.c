/* Tests kvstore/daemon/slab.c: class geometry, exhaustion, random alloc/free checked against a simple
 * reference model (a map of live blocks), offset validation, tags, and units moving between
 * classes when slabs empty, kept for the class they were drained for. */
#include "test_util.h"

#include <errno.h>
#include <stdbool.h>

#include "slab.h"

#define UNIT (64u << 10)

static void test_bad_arguments(void **state)
{
	(void)state;
	struct slab_alloc *sa;
	assert_int_equal(slab_init(&sa, UNIT - 1, UNIT), -EINVAL);
	assert_int_equal(slab_init(&sa, 4 * UNIT, 1000), -EINVAL);
	assert_int_equal(slab_init(&sa, 4 * UNIT, UNIT), 0);
	unsigned c;
	assert_int_equal(slab_class_get(sa, 0, &c), -EINVAL);
	assert_int_equal(slab_class_get(sa, 4 * UNIT + 1, &c), -EINVAL);
	for (unsigned i = 0; i < SLAB_MAX_CLASSES; i++)
		assert_int_equal(slab_class_get(sa, 4096 * (i + 1), &c), 0);
	assert_int_equal(slab_class_get(sa, 4096 * 50, &c), -ENOSPC);
	assert_int_equal(slab_class_get(sa, 4096 * 3, &c), 0); /* existing one still found */
	assert_int_equal(c, 2);
	uint64_t off;
	assert_int_equal(slab_alloc(sa, SLAB_MAX_CLASSES, &off), -EINVAL);
	slab_shutdown(sa);
}

static void test_class_geometry(void **state)
{
	(void)state;
	struct slab_alloc *sa;
	assert_int_equal(slab_init(&sa, 64 * UNIT, UNIT), 0);
	unsigned a, b, a2;
	assert_int_equal(slab_class_get(sa, 5000, &a), 0);
	assert_int_equal(slab_class_get(sa, 5000, &a2), 0);
	assert_int_equal(a, a2);
	struct slab_class_info ci;
	assert_int_equal(slab_class_info(sa, a, &ci), 0);
	assert_int_equal(ci.stride, 8192);
	assert_int_equal(ci.slab_bytes % UNIT, 0);
	assert_int_equal(ci.blocks_per_slab, ci.slab_bytes / 8192);
	/* A block bigger than a unit spans units; waste stays within 1/8 of the slab. */
	assert_int_equal(slab_class_get(sa, UNIT + UNIT / 2, &b), 0);
	assert_int_equal(slab_class_info(sa, b, &ci), 0);
	assert_true(ci.slab_bytes >= ci.stride);
	assert_true((ci.slab_bytes % ci.stride) * 8 <= ci.slab_bytes);
	assert_int_equal(slab_class_count(sa), 2);
	slab_shutdown(sa);
}

static void test_fill_until_full(void **state)
{
	(void)state;
	const uint64_t bytes = 16 * UNIT + 12345; /* the tail that is not a whole unit is unused */
	struct slab_alloc *sa;
	assert_int_equal(slab_init(&sa, bytes, UNIT), 0);
	unsigned c;
	assert_int_equal(slab_class_get(sa, 12 * 1024, &c), 0); /* stride 12 KiB */
	struct slab_class_info ci;
	slab_class_info(sa, c, &ci);
	uint64_t expect = (16 * UNIT / ci.slab_bytes) * ci.blocks_per_slab;
	uint8_t *seen = calloc(16 * UNIT / 4096, 1);
	uint64_t n = 0, off;
	int ret;
	while ((ret = slab_alloc(sa, c, &off)) == 0) {
		assert_int_equal(off % 4096, 0);
		assert_true(off + ci.stride <= 16 * UNIT);
		for (uint64_t pg = off / 4096; pg < (off + ci.stride) / 4096; pg++) {
			assert_int_equal(seen[pg], 0); /* no overlap */
			seen[pg] = 1;
		}
		n++;
	}
	assert_int_equal(ret, -ENOSPC);
	assert_int_equal(n, expect);
	slab_class_info(sa, c, &ci);
	assert_int_equal(ci.used, n);
	assert_int_equal(ci.free, 0);
	free(seen);
	slab_shutdown(sa);
}

struct model_block {
	uint64_t off;
	uint32_t tag;
	unsigned cls;
};

static void test_random_against_model(void **state)
{
	(void)state;
	struct slab_alloc *sa;
	assert_int_equal(slab_init(&sa, 32 * UNIT, UNIT), 0);
	unsigned cls[3];
	const uint64_t sizes[3] = { 8192, 20000, 3 * UNIT / 2 };
	for (int i = 0; i < 3; i++)
		assert_int_equal(slab_class_get(sa, sizes[i], &cls[i]), 0);
	struct model_block live[4096];
	size_t n_live = 0;
	uint64_t rng = 42;
	for (int step = 0; step < 20000; step++) {
		bool do_alloc = n_live == 0 || (test_rand(&rng) % 100 < 55 && n_live < 4096);
		if (do_alloc) {
			unsigned k = (unsigned)(test_rand(&rng) % 3);
			uint64_t off;
			int ret = slab_alloc(sa, cls[k], &off);
			if (ret == -ENOSPC)
				continue;
			assert_int_equal(ret, 0);
			struct slab_class_info ci;
			slab_class_info(sa, cls[k], &ci);
			/* The reference: a fresh block overlaps no live block. */
			for (size_t i = 0; i < n_live; i++) {
				struct slab_class_info cj;
				slab_class_info(sa, live[i].cls, &cj);
				assert_true(off + ci.stride <= live[i].off ||
					    live[i].off + cj.stride <= off);
			}
			uint32_t tag = (uint32_t)test_rand(&rng);
			assert_int_equal(slab_set_tag(sa, off, tag), 0);
			live[n_live++] = (struct model_block){ off, tag, cls[k] };
		} else {
			size_t i = test_rand(&rng) % n_live;
			uint32_t tag;
			unsigned got;
			assert_int_equal(slab_lookup(sa, live[i].off, &got), 0);
			assert_int_equal(got, live[i].cls);
			assert_int_equal(slab_get_tag(sa, live[i].off, &tag), 0);
			assert_int_equal(tag, live[i].tag);
			assert_int_equal(slab_lookup(sa, live[i].off + 4096, NULL), -EINVAL);
			assert_int_equal(slab_free(sa, live[i].off), 0);
			assert_int_equal(slab_free(sa, live[i].off), -EINVAL); /* double free */
			live[i] = live[--n_live];
		}
		if (step % 1000 == 0) {
			uint64_t used = 0;
			for (int k = 0; k < 3; k++) {
				struct slab_class_info ci;
				slab_class_info(sa, cls[k], &ci);
				used += ci.used;
			}
			assert_int_equal(used, n_live);
		}
	}
	assert_int_equal(slab_lookup(sa, 32 * UNIT, NULL), -ERANGE);
	assert_int_equal(slab_free(sa, UINT64_MAX - 5), -ERANGE);
	while (n_live)
		assert_int_equal(slab_free(sa, live[--n_live].off), 0);
	assert_int_equal(slab_free_units(sa), 32);
	slab_shutdown(sa);
}

static void test_units_move_between_classes(void **state)
{
	(void)state;
	struct slab_alloc *sa;
	assert_int_equal(slab_init(&sa, 8 * UNIT, UNIT), 0);
	unsigned a, b;
	assert_int_equal(slab_class_get(sa, 4096, &a), 0);
	assert_int_equal(slab_class_get(sa, UNIT, &b), 0);
	uint64_t offs[8 * UNIT / 4096], off;
	size_t n = 0;
	while (slab_alloc(sa, a, &off) == 0)
		offs[n++] = off;
	assert_int_equal(n, 8 * UNIT / 4096);
	assert_int_equal(slab_alloc(sa, b, &off), -ENOSPC);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(slab_free(sa, offs[i]), 0);
	assert_int_equal(slab_free_units(sa), 8);
	for (int i = 0; i < 8; i++)
		assert_int_equal(slab_alloc(sa, b, &off), 0);
	assert_int_equal(slab_alloc(sa, b, &off), -ENOSPC);
	slab_shutdown(sa);
}

/* A slab drained for another class keeps its units for that class once it empties: the
 * draining slab's own class, which frees blocks and allocates again at once, cannot take them
 * back (it would starve the waiting class); slab_unreserve gives them to everyone. */
static void test_drained_units_kept_for_waiting_class(void **state)
{
	(void)state;
	struct slab_alloc *sa;
	assert_int_equal(slab_init(&sa, 4 * UNIT, UNIT), 0);
	unsigned a, b;
	assert_int_equal(slab_class_get(sa, 4096, &a), 0);
	assert_int_equal(slab_class_get(sa, 8192, &b), 0);
	enum { PER = UNIT / 4096 };
	uint64_t offs[4 * PER], off, base, bytes, stride;
	size_t n = 0;
	while (slab_alloc(sa, a, &off) == 0)
		offs[n++] = off;
	assert_int_equal(n, 4 * PER);
	assert_int_equal(slab_alloc(sa, b, &off), -ENOSPC);
	assert_int_equal(slab_free_units_for(sa, b), 0);
	assert_int_equal(slab_reclaim_pick(sa, b, &base, &bytes, &stride), 0);
	assert_int_equal(bytes, UNIT);
	assert_int_equal(stride, 4096);
	/* The drained slab empties; class a frees a block elsewhere too and keeps allocating. */
	bool freed[4 * PER] = { false };
	for (size_t i = 0; i < n; i++)
		if (offs[i] >= base && offs[i] < base + bytes) {
			assert_int_equal(slab_free(sa, offs[i]), 0);
			freed[i] = true;
		}
	assert_int_equal(slab_free_units(sa), 1);
	assert_int_equal(slab_free_units_for(sa, a), 0);
	assert_int_equal(slab_free_units_for(sa, b), 1);
	assert_int_equal(slab_alloc(sa, a, &off), -ENOSPC);
	assert_int_equal(slab_alloc(sa, b, &off), 0);
	assert_true(off >= base && off < base + bytes);
	assert_int_equal(slab_free(sa, off), 0); /* b's slab empties: the unit is everyone's */
	assert_int_equal(slab_free_units_for(sa, a), 1);
	/* Drained again for b, given back by slab_unreserve: a takes the unit. */
	assert_int_equal(slab_alloc(sa, a, &off), 0);
	assert_int_equal(slab_reclaim_pick(sa, b, &base, &bytes, &stride), 0);
	uint64_t more[PER];
	size_t m = 0;
	for (size_t i = 0; i < n; i++)
		if (!freed[i] && offs[i] >= base && offs[i] < base + bytes)
			assert_int_equal(slab_free(sa, offs[i]), 0);
	if (off >= base && off < base + bytes)
		assert_int_equal(slab_free(sa, off), 0);
	assert_int_equal(slab_free_units_for(sa, a), 0);
	slab_unreserve(sa, b);
	assert_int_equal(slab_free_units_for(sa, a), 1);
	while (m < PER && slab_alloc(sa, a, &more[m]) == 0)
		m++;
	assert_int_equal(m, PER);
	slab_shutdown(sa);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_arguments),
		cmocka_unit_test(test_class_geometry),
		cmocka_unit_test(test_fill_until_full),
		cmocka_unit_test(test_random_against_model),
		cmocka_unit_test(test_units_move_between_classes),
		cmocka_unit_test(test_drained_units_kept_for_waiting_class),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
