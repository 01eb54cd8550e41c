/* slab — slab classes over the pool's byte range. See slab.h. */
#include "slab.h"

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define NO_SLAB UINT32_MAX
#define NO_CLASS UINT16_MAX

struct slab {
	uint64_t base;        /* byte offset of the first unit */
	uint32_t first_unit;
	uint32_t n_units;     /* 0: this slab record is unused */
	uint32_t nfree;
	uint32_t next_partial; /* singly linked list of the class's slabs with free blocks */
	uint32_t prev_partial;
	uint16_t cls;
	bool on_partial;
	bool draining;         /* giving its units to another class: no new blocks here */
	uint16_t drain_for;    /* the class it is drained for (its units go to that class) */
	uint32_t *free_stack;  /* (blocks_per_slab) indices of free blocks, nfree valid */
	uint32_t *tag;         /* (blocks_per_slab) caller tags */
	uint64_t *used;        /* (blocks_per_slab / 64 rounded up) allocation bitmap */
};

struct slab_class {
	struct slab_class_info info;
	uint32_t units_per_slab;
	uint32_t partial;      /* head of the partial list, NO_SLAB when empty */
};

struct slab_alloc {
	uint64_t unit;
	uint32_t n_units;
	uint32_t free_units;
	uint32_t *unit_slab;   /* (n_units) owning slab id or NO_SLAB */
	uint16_t *unit_for;    /* (n_units) class a free unit is kept for (drained for it), or
				* NO_CLASS: another class cannot take it (slab_unreserve) */
	struct slab *slabs;    /* grows; ids are indices, recycled via free_ids */
	uint32_t n_slabs, cap_slabs;
	uint32_t *free_ids;
	uint32_t n_free_ids;
	struct slab_class classes[SLAB_MAX_CLASSES];
	unsigned n_classes;
};

static uint64_t round_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

int slab_init(struct slab_alloc **out, uint64_t bytes, uint64_t unit_bytes)
{
	*out = NULL;
	if (unit_bytes == 0)
		unit_bytes = SLAB_UNIT_DEFAULT;
	if (unit_bytes % SLAB_ALIGN != 0 || bytes < unit_bytes)
		return -EINVAL;
	if (bytes / unit_bytes >= NO_SLAB)
		return -EINVAL;
	struct slab_alloc *sa = calloc(1, sizeof *sa);
	if (!sa)
		return -ENOMEM;
	sa->unit = unit_bytes;
	sa->n_units = (uint32_t)(bytes / unit_bytes);
	sa->free_units = sa->n_units;
	sa->unit_slab = malloc(sizeof *sa->unit_slab * sa->n_units);
	sa->unit_for = malloc(sizeof *sa->unit_for * sa->n_units);
	if (!sa->unit_slab || !sa->unit_for) {
		free(sa->unit_slab);
		free(sa->unit_for);
		free(sa);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < sa->n_units; i++) {
		sa->unit_slab[i] = NO_SLAB;
		sa->unit_for[i] = NO_CLASS;
	}
	*out = sa;
	return 0;
}

static void slab_release_arrays(struct slab *s)
{
	free(s->free_stack);
	free(s->tag);
	free(s->used);
	s->free_stack = NULL;
	s->tag = NULL;
	s->used = NULL;
}

void slab_shutdown(struct slab_alloc *sa)
{
	if (!sa)
		return;
	for (uint32_t i = 0; i < sa->n_slabs; i++)
		slab_release_arrays(&sa->slabs[i]);
	free(sa->slabs);
	free(sa->free_ids);
	free(sa->unit_slab);
	free(sa->unit_for);
	free(sa);
}

/* Smallest slab (in units) holding at least one block and wasting at most 1/8 of itself. */
static uint32_t units_for_stride(uint64_t stride, uint64_t unit, uint32_t max_units)
{
	uint32_t k = (uint32_t)((stride + unit - 1) / unit);
	for (uint32_t u = k; u <= max_units && u <= k * 8; u++) {
		uint64_t bytes = (uint64_t)u * unit;
		if ((bytes % stride) * 8 <= bytes)
			return u;
	}
	return k;
}

int slab_class_get(struct slab_alloc *sa, uint64_t block_bytes, unsigned *cls)
{
	if (block_bytes == 0)
		return -EINVAL;
	for (unsigned i = 0; i < sa->n_classes; i++) {
		if (sa->classes[i].info.block_bytes == block_bytes) {
			*cls = i;
			return 0;
		}
	}
	uint64_t stride = round_up(block_bytes, SLAB_ALIGN);
	if (stride > (uint64_t)sa->n_units * sa->unit)
		return -EINVAL;
	if (sa->n_classes == SLAB_MAX_CLASSES)
		return -ENOSPC;
	struct slab_class *c = &sa->classes[sa->n_classes];
	memset(c, 0, sizeof *c);
	c->units_per_slab = units_for_stride(stride, sa->unit, sa->n_units);
	c->info.block_bytes = block_bytes;
	c->info.stride = stride;
	c->info.slab_bytes = (uint64_t)c->units_per_slab * sa->unit;
	uint64_t per = c->info.slab_bytes / stride;
	c->info.blocks_per_slab = per > UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)per;
	c->partial = NO_SLAB;
	*cls = sa->n_classes++;
	return 0;
}

int slab_class_info(const struct slab_alloc *sa, unsigned cls, struct slab_class_info *info)
{
	if (cls >= sa->n_classes)
		return -EINVAL;
	*info = sa->classes[cls].info;
	return 0;
}

unsigned slab_class_count(const struct slab_alloc *sa)
{
	return sa->n_classes;
}

static void partial_push(struct slab_alloc *sa, uint32_t id)
{
	struct slab *s = &sa->slabs[id];
	struct slab_class *c = &sa->classes[s->cls];
	s->prev_partial = NO_SLAB;
	s->next_partial = c->partial;
	if (c->partial != NO_SLAB)
		sa->slabs[c->partial].prev_partial = id;
	c->partial = id;
	s->on_partial = true;
}

static void partial_remove(struct slab_alloc *sa, uint32_t id)
{
	struct slab *s = &sa->slabs[id];
	struct slab_class *c = &sa->classes[s->cls];
	if (s->prev_partial != NO_SLAB)
		sa->slabs[s->prev_partial].next_partial = s->next_partial;
	else
		c->partial = s->next_partial;
	if (s->next_partial != NO_SLAB)
		sa->slabs[s->next_partial].prev_partial = s->prev_partial;
	s->on_partial = false;
}

/* First run of n free units, or NO_SLAB. */
/* Whether unit u is free for class cls: owned by no slab, and not kept for another class. */
static bool unit_free_for(const struct slab_alloc *sa, uint32_t u, unsigned cls)
{
	return sa->unit_slab[u] == NO_SLAB &&
	       (sa->unit_for[u] == NO_CLASS || sa->unit_for[u] == cls);
}

static uint32_t find_units(const struct slab_alloc *sa, uint32_t n, unsigned cls)
{
	uint32_t run = 0;
	for (uint32_t i = 0; i < sa->n_units; i++) {
		run = unit_free_for(sa, i, cls) ? run + 1 : 0;
		if (run == n)
			return i + 1 - n;
	}
	return NO_SLAB;
}

/* Makes a slab of class cls on the free units [first, first + units_per_slab). */
static int slab_new_at(struct slab_alloc *sa, unsigned cls, uint32_t first, uint32_t *out_id)
{
	struct slab_class *c = &sa->classes[cls];
	uint32_t id;
	if (sa->n_free_ids) {
		id = sa->free_ids[--sa->n_free_ids];
	} else {
		if (sa->n_slabs == sa->cap_slabs) {
			uint32_t cap = sa->cap_slabs ? sa->cap_slabs * 2 : 16;
			struct slab *ns = realloc(sa->slabs, sizeof *ns * cap);
			if (!ns)
				return -ENOMEM;
			uint32_t *nf = realloc(sa->free_ids, sizeof *nf * cap);
			if (!nf) {
				sa->slabs = ns;
				return -ENOMEM;
			}
			sa->slabs = ns;
			sa->free_ids = nf;
			sa->cap_slabs = cap;
		}
		id = sa->n_slabs++;
		memset(&sa->slabs[id], 0, sizeof sa->slabs[id]);
	}
	struct slab *s = &sa->slabs[id];
	uint32_t per = c->info.blocks_per_slab;
	s->free_stack = malloc(sizeof *s->free_stack * per);
	s->tag = calloc(per, sizeof *s->tag);
	s->used = calloc((per + 63) / 64, sizeof *s->used);
	if (!s->free_stack || !s->tag || !s->used) {
		slab_release_arrays(s);
		s->n_units = 0;
		sa->free_ids[sa->n_free_ids++] = id;
		return -ENOMEM;
	}
	/* Pop order gives ascending offsets: simple to reason about and to test. */
	for (uint32_t i = 0; i < per; i++)
		s->free_stack[i] = per - 1 - i;
	s->nfree = per;
	s->first_unit = first;
	s->n_units = c->units_per_slab;
	s->base = (uint64_t)first * sa->unit;
	s->cls = (uint16_t)cls;
	s->draining = false;
	for (uint32_t u = 0; u < s->n_units; u++)
		sa->unit_slab[first + u] = id;
	slab_unreserve(sa, cls); /* it has its slab: what else was kept for it goes back */
	sa->free_units -= s->n_units;
	c->info.slabs++;
	c->info.free += per;
	partial_push(sa, id);
	*out_id = id;
	return 0;
}

static int slab_new(struct slab_alloc *sa, unsigned cls, uint32_t *out_id)
{
	struct slab_class *c = &sa->classes[cls];
	if (c->units_per_slab > sa->free_units)
		return -ENOSPC;
	uint32_t first = find_units(sa, c->units_per_slab, cls);
	if (first == NO_SLAB)
		return -ENOSPC;
	return slab_new_at(sa, cls, first, out_id);
}

static void slab_retire(struct slab_alloc *sa, uint32_t id)
{
	struct slab *s = &sa->slabs[id];
	struct slab_class *c = &sa->classes[s->cls];
	if (s->on_partial)
		partial_remove(sa, id);
	for (uint32_t u = 0; u < s->n_units; u++) {
		sa->unit_slab[s->first_unit + u] = NO_SLAB;
		sa->unit_for[s->first_unit + u] = s->draining ? s->drain_for : NO_CLASS;
	}
	sa->free_units += s->n_units;
	c->info.slabs--;
	c->info.free -= c->info.blocks_per_slab;
	slab_release_arrays(s);
	s->n_units = 0;
	sa->free_ids[sa->n_free_ids++] = id;
}

int slab_adopt(struct slab_alloc *sa, unsigned cls, uint64_t base, uint64_t off)
{
	if (cls >= sa->n_classes || base % sa->unit || off < base)
		return -EINVAL;
	struct slab_class *c = &sa->classes[cls];
	uint64_t first = base / sa->unit;
	if (first + c->units_per_slab > sa->n_units)
		return -ERANGE;
	uint32_t id = sa->unit_slab[first];
	if (id == NO_SLAB) {
		for (uint32_t u = 0; u < c->units_per_slab; u++)
			if (sa->unit_slab[first + u] != NO_SLAB)
				return -EEXIST;
		int ret = slab_new_at(sa, cls, (uint32_t)first, &id);
		if (ret < 0)
			return ret;
		assert(sa->slabs[id].first_unit == first);
	}
	struct slab *s = &sa->slabs[id];
	if (s->base != base || s->cls != cls)
		return -EEXIST; /* the units belong to a slab of another class or start */
	uint64_t rel = off - base;
	if (rel % c->info.stride || rel / c->info.stride >= c->info.blocks_per_slab)
		return -EINVAL;
	uint32_t idx = (uint32_t)(rel / c->info.stride);
	if (s->used[idx / 64] & (1ull << (idx % 64)))
		return -EEXIST;
	for (uint32_t i = 0; i < s->nfree; i++) {
		if (s->free_stack[i] == idx) {
			memmove(s->free_stack + i, s->free_stack + i + 1,
				(s->nfree - i - 1) * sizeof *s->free_stack);
			break;
		}
	}
	s->nfree--;
	s->used[idx / 64] |= 1ull << (idx % 64);
	s->tag[idx] = 0;
	if (s->nfree == 0 && s->on_partial)
		partial_remove(sa, id);
	c->info.used++;
	c->info.free--;
	return 0;
}

int slab_base_of(const struct slab_alloc *sa, uint64_t off, uint64_t *base)
{
	uint64_t unit = off / sa->unit;
	if (unit >= sa->n_units)
		return -ERANGE;
	uint32_t sid = sa->unit_slab[unit];
	if (sid == NO_SLAB)
		return -EINVAL;
	*base = sa->slabs[sid].base;
	return 0;
}

int slab_alloc(struct slab_alloc *sa, unsigned cls, uint64_t *off)
{
	if (cls >= sa->n_classes)
		return -EINVAL;
	struct slab_class *c = &sa->classes[cls];
	uint32_t id = c->partial;
	if (id == NO_SLAB) {
		int ret = slab_new(sa, cls, &id);
		if (ret < 0)
			return ret;
	}
	struct slab *s = &sa->slabs[id];
	assert(s->nfree > 0);
	uint32_t idx = s->free_stack[--s->nfree];
	s->used[idx / 64] |= 1ull << (idx % 64);
	s->tag[idx] = 0;
	if (s->nfree == 0)
		partial_remove(sa, id);
	c->info.used++;
	c->info.free--;
	*off = s->base + (uint64_t)idx * c->info.stride;
	return 0;
}

/* Resolves off to (slab id, block index) when it is the start of an allocated block. */
static int resolve(const struct slab_alloc *sa, uint64_t off, uint32_t *id, uint32_t *idx)
{
	uint64_t unit = off / sa->unit;
	if (unit >= sa->n_units)
		return -ERANGE;
	uint32_t sid = sa->unit_slab[unit];
	if (sid == NO_SLAB)
		return -EINVAL;
	const struct slab *s = &sa->slabs[sid];
	const struct slab_class *c = &sa->classes[s->cls];
	uint64_t rel = off - s->base;
	if (rel % c->info.stride != 0)
		return -EINVAL;
	uint64_t i = rel / c->info.stride;
	if (i >= c->info.blocks_per_slab)
		return -EINVAL;
	if (!(s->used[i / 64] & (1ull << (i % 64))))
		return -EINVAL;
	*id = sid;
	*idx = (uint32_t)i;
	return 0;
}

int slab_free(struct slab_alloc *sa, uint64_t off)
{
	uint32_t id, idx;
	int ret = resolve(sa, off, &id, &idx);
	if (ret < 0)
		return ret;
	struct slab *s = &sa->slabs[id];
	struct slab_class *c = &sa->classes[s->cls];
	s->used[idx / 64] &= ~(1ull << (idx % 64));
	s->free_stack[s->nfree++] = idx;
	c->info.used--;
	c->info.free++;
	if (s->nfree == c->info.blocks_per_slab)
		slab_retire(sa, id);
	else if (!s->on_partial && !s->draining)
		partial_push(sa, id);
	return 0;
}

int slab_lookup(const struct slab_alloc *sa, uint64_t off, unsigned *cls)
{
	uint32_t id, idx;
	int ret = resolve(sa, off, &id, &idx);
	if (ret < 0)
		return ret;
	if (cls)
		*cls = sa->slabs[id].cls;
	return 0;
}

int slab_set_tag(struct slab_alloc *sa, uint64_t off, uint32_t tag)
{
	uint32_t id, idx;
	int ret = resolve(sa, off, &id, &idx);
	if (ret < 0)
		return ret;
	sa->slabs[id].tag[idx] = tag;
	return 0;
}

int slab_get_tag(const struct slab_alloc *sa, uint64_t off, uint32_t *tag)
{
	uint32_t id, idx;
	int ret = resolve(sa, off, &id, &idx);
	if (ret < 0)
		return ret;
	*tag = sa->slabs[id].tag[idx];
	return 0;
}

uint64_t slab_free_units(const struct slab_alloc *sa)
{
	return sa->free_units;
}

uint64_t slab_free_units_for(const struct slab_alloc *sa, unsigned cls)
{
	uint64_t n = 0;
	for (uint32_t u = 0; sa->free_units && u < sa->n_units; u++)
		n += unit_free_for(sa, u, cls);
	return n;
}

void slab_unreserve(struct slab_alloc *sa, unsigned cls)
{
	for (uint32_t u = 0; u < sa->n_units; u++)
		if (sa->unit_for[u] == cls)
			sa->unit_for[u] = NO_CLASS;
}

uint64_t slab_unit_bytes(const struct slab_alloc *sa)
{
	return sa->unit;
}

int slab_reclaim_pick(struct slab_alloc *sa, unsigned cls, uint64_t *base, uint64_t *bytes,
		      uint64_t *stride)
{
	uint32_t best = NO_SLAB;
	uint64_t best_used = UINT64_MAX;
	for (uint32_t id = 0; id < sa->n_slabs; id++) {
		const struct slab *s = &sa->slabs[id];
		if (!s->n_units || s->cls == cls)
			continue;
		if (s->draining) { /* one already gives its units up: keep emptying that one */
			best = id;
			break;
		}
		uint64_t used = sa->classes[s->cls].info.blocks_per_slab - s->nfree;
		if (used < best_used) {
			best = id;
			best_used = used;
		}
	}
	if (best == NO_SLAB)
		return -ENOENT;
	struct slab *s = &sa->slabs[best];
	/* From now on its class allocates elsewhere, so the slab can only empty. */
	if (s->on_partial)
		partial_remove((struct slab_alloc *)sa, best);
	if (!s->draining)
		s->drain_for = (uint16_t)cls;
	s->draining = true;
	*base = s->base;
	*bytes = (uint64_t)s->n_units * sa->unit;
	*stride = sa->classes[s->cls].info.stride;
	return 0;
}
