/* pool — the shared-memory DRAM pool and its daemon-private block metadata. See pool.h. */
#include "pool.h"
#include "pool_map.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "slab.h"
#include "errmsg.h"
#include "log.h"

#define POOL_CHUNK 4096u /* descriptors per chunk; chunks never move */
#define POOL_MAX_IDS (1u << 30)

struct pool {
	char name[NAME_MAX + 1];
	char huge_dir[PATH_MAX];
	void *base;
	uint64_t bytes;
	int fd;
	bool locked;
	bool adopted;         /* the segment was a previous daemon's, mapped as it was */
	bool keep;            /* pool_destroy leaves the segment (a persistent pool) */
	struct slab_alloc *slab;
	struct pool_block **chunks;
	uint32_t n_chunks;
	uint32_t next_id;     /* ids below this have been handed out at least once */
	uint32_t *free_ids;
	uint32_t n_free_ids, cap_free_ids;
	uint64_t clock;
	uint32_t lru_head, lru_tail; /* DRAM blocks, coldest first (POOL_NO_BLOCK: none) */
	uint32_t kept_head, kept_tail; /* blocks with a kept extent, oldest first */
	struct pool_scan *scans;     /* victim scans under way, whose cursors follow unlinks */
	struct pool_usage u;  /* kept exact by every state change */
};

/* ---------------------------------------------------------------- creator side */

/* Why mlock of the pool failed, and what to change: the memlock limit when it is below the
 * pool, else the host's memory (MemAvailable), since raising the limit would not help. */
static void lock_error(uint64_t bytes, int ret, char *err, size_t err_len)
{
	struct rlimit rl;
	unsigned long long mib = (unsigned long long)(bytes >> 20);
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < bytes) {
		errmsg_set(err, err_len, "cannot lock the %llu MiB pool (%s): the memlock limit is "
			   "%llu KiB; raise it (LimitMEMLOCK=infinity in the unit, or ulimit -l "
			   "unlimited), lower dram_bytes, or set lock_memory=false to run without "
			   "locking", mib, strerror(-ret), (unsigned long long)(rl.rlim_cur >> 10));
		return;
	}
	unsigned long long avail_kib = 0;
	FILE *f = fopen("/proc/meminfo", "r");
	char line[128];
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "MemAvailable: %llu kB", &avail_kib) == 1)
			break;
	if (f)
		fclose(f);
	errmsg_set(err, err_len, "cannot lock the %llu MiB pool (%s) although the memlock limit "
		   "allows it: the host has %llu MiB available; lower dram_bytes to fit, or set "
		   "lock_memory=false to run without locking", mib, strerror(-ret), avail_kib >> 10);
}

int pool_create(const struct pool_config *cfg, struct pool **out, char *err, size_t err_len)
{
	*out = NULL;
	struct pool *p = calloc(1, sizeof *p);
	if (!p) {
		errmsg_set(err, err_len, "out of memory");
		return -ENOMEM;
	}
	p->fd = -1;
	p->lru_head = p->lru_tail = POOL_NO_BLOCK;
	p->kept_head = p->kept_tail = POOL_NO_BLOCK;
	if (cfg->shm_name && strlen(cfg->shm_name) < sizeof p->name)
		strcpy(p->name, cfg->shm_name);
	if (cfg->hugetlbfs_dir && cfg->hugetlbfs_dir[0]) {
		if (strlen(cfg->hugetlbfs_dir) >= sizeof p->huge_dir) {
			free(p);
			errmsg_set(err, err_len, "hugetlbfs path too long");
			return -ENAMETOOLONG;
		}
		strcpy(p->huge_dir, cfg->hugetlbfs_dir);
	}
	int ret = slab_init(&p->slab, cfg->dram_bytes, cfg->slab_unit_bytes);
	if (ret < 0) {
		errmsg_set(err, err_len, "dram_bytes %llu is smaller than one slab unit or the unit is "
			"not a multiple of 4096", (unsigned long long)cfg->dram_bytes);
		free(p);
		return ret;
	}
	struct pool_segment_config sc = {
		.name = cfg->shm_name,
		.hugetlbfs_dir = cfg->hugetlbfs_dir,
		.bytes = cfg->dram_bytes,
		.mode = cfg->mode,
		.group = cfg->group,
		.unlink_existing = cfg->unlink_existing,
	};
	ret = -ENOENT;
	if (cfg->adopt) {
		/* Restart without loss (docs/design.md §4): the previous daemon's segment holds the
		 * committed blocks; map it as it is. A different size cannot hold the same offsets. */
		uint64_t got = 0;
		char why[POOL_ERR_LEN] = "";
		ret = pool_segment_map(cfg->shm_name, cfg->hugetlbfs_dir, cfg->dram_bytes, &p->base,
				       &got, &p->fd, why, sizeof why);
		if (ret == 0)
			p->adopted = true;
		else if (ret != -ENOENT)
			log_warn("cannot adopt the pool segment %s (%s): making a new "
				"one; the blocks it held are lost", cfg->shm_name, why);
	}
	if (ret)
		ret = pool_segment_create(&sc, &p->base, &p->fd, err, err_len);
	if (ret < 0) {
		slab_shutdown(p->slab);
		free(p);
		return ret;
	}
	p->bytes = cfg->dram_bytes;
	if (cfg->lock_memory) {
		if (mlock(p->base, p->bytes) < 0) {
			ret = -errno;
			lock_error(p->bytes, ret, err, err_len);
			pool_segment_unmap(p->base, p->bytes, p->fd);
			if (!p->adopted) /* an adopted segment still holds the committed blocks */
				pool_segment_unlink(p->name, p->huge_dir);
			slab_shutdown(p->slab);
			free(p);
			return ret;
		}
		p->locked = true;
	}
	p->u.dram_bytes = p->bytes;
	p->u.locked = p->locked;
	*out = p;
	return 0;
}

void pool_destroy(struct pool *p)
{
	if (!p)
		return;
	if (p->locked)
		munlock(p->base, p->bytes);
	pool_segment_unmap(p->base, p->bytes, p->fd);
	if (!p->keep)
		pool_segment_unlink(p->name, p->huge_dir);
	for (uint32_t i = 0; i < p->n_chunks; i++)
		free(p->chunks[i]);
	free(p->chunks);
	free(p->free_ids);
	slab_shutdown(p->slab);
	free(p);
}

bool pool_adopted(const struct pool *p)
{
	return p->adopted;
}

void pool_keep_segment(struct pool *p, bool keep)
{
	p->keep = keep;
}

void *pool_base(const struct pool *p)
{
	return p->base;
}

uint64_t pool_bytes(const struct pool *p)
{
	return p->bytes;
}

int pool_fd(const struct pool *p)
{
	return p->fd;
}

const char *pool_name(const struct pool *p)
{
	return p->name;
}

uint64_t pool_block_bytes(uint32_t n_kv, uint32_t page, uint32_t head_dim, uint32_t dtype_size)
{
	/* Each factor is < 2^32, so every partial product below fits in 64 bits. */
	uint64_t b = (uint64_t)n_kv * 2u;
	b *= page;
	if (b > UINT32_MAX)
		return 0;
	b *= head_dim;
	if (b > UINT32_MAX)
		return 0;
	b *= dtype_size;
	return b > UINT32_MAX ? 0 : b;
}

int pool_class(struct pool *p, uint64_t block_bytes, unsigned *cls)
{
	if (block_bytes > UINT32_MAX)
		return -EINVAL;
	return slab_class_get(p->slab, block_bytes, cls);
}

/* ---------------------------------------------------------------- descriptors */

static struct pool_block *desc(const struct pool *p, uint32_t id)
{
	if (id >= p->next_id)
		return NULL;
	return &p->chunks[id / POOL_CHUNK][id % POOL_CHUNK];
}


struct pool_block *pool_block_get(struct pool *p, uint32_t id)
{
	struct pool_block *b = desc(p, id);
	return b && b->tier != POOL_TIER_FREE ? b : NULL;
}

static int desc_new(struct pool *p, uint32_t *id)
{
	if (p->n_free_ids) {
		*id = p->free_ids[--p->n_free_ids];
		return 0;
	}
	if (p->next_id == POOL_MAX_IDS)
		return -ENOSPC;
	if (p->next_id % POOL_CHUNK == 0 && p->next_id / POOL_CHUNK == p->n_chunks) {
		struct pool_block **nc = realloc(p->chunks, sizeof *nc * (p->n_chunks + 1));
		if (!nc)
			return -ENOMEM;
		p->chunks = nc;
		nc[p->n_chunks] = calloc(POOL_CHUNK, sizeof **nc);
		if (!nc[p->n_chunks])
			return -ENOMEM;
		p->n_chunks++;
	}
	/* Keep the free-id stack able to hold every id ever handed out, so freeing never fails. */
	if (p->cap_free_ids < p->next_id + 1) {
		uint32_t cap = p->cap_free_ids ? p->cap_free_ids * 2 : 1024;
		uint32_t *nf = realloc(p->free_ids, sizeof *nf * cap);
		if (!nf)
			return -ENOMEM;
		p->free_ids = nf;
		p->cap_free_ids = cap;
	}
	*id = p->next_id++;
	return 0;
}

static void count_tier(struct pool *p, uint8_t tier, int delta)
{
	switch (tier) {
	case POOL_TIER_DRAM:
		p->u.blocks_dram += (uint64_t)(int64_t)delta;
		break;
	case POOL_TIER_NVME:
		p->u.blocks_nvme += (uint64_t)(int64_t)delta;
		break;
	case POOL_TIER_REMOTE:
		p->u.blocks_remote += (uint64_t)(int64_t)delta;
		break;
	case POOL_TIER_DEMOTING:
	case POOL_TIER_PROMOTING:
	case POOL_TIER_OFFLOADING:
	case POOL_TIER_FETCHING:
		p->u.blocks_inflight += (uint64_t)(int64_t)delta;
		break;
	default:
		break;
	}
}

/* ---------------------------------------------------------------- the lru list */

static void lru_unlink(struct pool *p, struct pool_block *b)
{
	for (struct pool_scan *sc = p->scans; sc; sc = sc->next)
		if (sc->cursor == b->self)
			sc->cursor = b->lru_next;
	if (b->lru_prev != POOL_NO_BLOCK)
		desc(p, b->lru_prev)->lru_next = b->lru_next;
	else
		p->lru_head = b->lru_next;
	if (b->lru_next != POOL_NO_BLOCK)
		desc(p, b->lru_next)->lru_prev = b->lru_prev;
	else
		p->lru_tail = b->lru_prev;
	b->lru_prev = b->lru_next = POOL_NO_BLOCK;
}

/* Into the list at its lru's place: the tail, since a block enters DRAM touched; a demotion
 * that failed brings back an older one, placed by a walk from the end nearer its lru (one of
 * the coldest, as a victim: near the head). */
static void lru_insert(struct pool *p, struct pool_block *b)
{
	uint32_t id = b->self, after = p->lru_tail;
	uint64_t head_lru = p->lru_head == POOL_NO_BLOCK ? 0 : desc(p, p->lru_head)->lru;
	if (after != POOL_NO_BLOCK && desc(p, after)->lru > b->lru &&
	    (b->lru <= head_lru || b->lru - head_lru < desc(p, after)->lru - b->lru)) {
		/* From the head: after = the last block older than b. */
		after = POOL_NO_BLOCK;
		for (uint32_t x = p->lru_head; x != POOL_NO_BLOCK && desc(p, x)->lru < b->lru;
		     x = desc(p, x)->lru_next)
			after = x;
	}
	while (after != POOL_NO_BLOCK && desc(p, after)->lru > b->lru)
		after = desc(p, after)->lru_prev;
	b->lru_prev = after;
	b->lru_next = after == POOL_NO_BLOCK ? p->lru_head : desc(p, after)->lru_next;
	if (after == POOL_NO_BLOCK)
		p->lru_head = id;
	else
		desc(p, after)->lru_next = id;
	if (b->lru_next == POOL_NO_BLOCK)
		p->lru_tail = id;
	else
		desc(p, b->lru_next)->lru_prev = id;
}

static void set_tier(struct pool *p, struct pool_block *b, uint8_t tier)
{
	if (b->tier == POOL_TIER_DRAM && tier != POOL_TIER_DRAM)
		lru_unlink(p, b);
	count_tier(p, b->tier, -1);
	bool into = b->tier != POOL_TIER_DRAM && tier == POOL_TIER_DRAM;
	b->tier = tier;
	count_tier(p, tier, +1);
	if (into)
		lru_insert(p, b);
}

static uint64_t class_stride(const struct pool *p, unsigned cls)
{
	struct slab_class_info ci;
	int ret = slab_class_info(p->slab, cls, &ci);
	assert(ret == 0);
	(void)ret;
	return ci.stride;
}

/* Gets a DRAM slot for descriptor id. */
static int slot_alloc(struct pool *p, uint32_t id, unsigned cls, uint64_t *off)
{
	int ret = slab_alloc(p->slab, cls, off);
	if (ret < 0)
		return ret;
	ret = slab_set_tag(p->slab, *off, id);
	assert(ret == 0);
	p->u.dram_used_bytes += class_stride(p, cls);
	return 0;
}

static void slot_free(struct pool *p, struct pool_block *b)
{
	int ret = slab_free(p->slab, b->dram_off);
	assert(ret == 0);
	(void)ret;
	p->u.dram_used_bytes -= class_stride(p, b->cls);
	b->dram_off = POOL_NO_OFFSET;
}

int pool_block_alloc(struct pool *p, unsigned cls, uint32_t *id_out)
{
	struct slab_class_info ci;
	if (slab_class_info(p->slab, cls, &ci) < 0)
		return -EINVAL;
	uint32_t id;
	int ret = desc_new(p, &id);
	if (ret < 0)
		return ret;
	uint64_t off;
	ret = slot_alloc(p, id, cls, &off);
	if (ret < 0) {
		p->free_ids[p->n_free_ids++] = id;
		return ret;
	}
	struct pool_block *b = desc(p, id);
	memset(b, 0, sizeof *b);
	b->self = id;
	b->dram_off = off;
	b->nvme_off = POOL_NO_OFFSET;
	b->kept_off = POOL_NO_OFFSET;
	b->bytes = (uint32_t)ci.block_bytes;
	b->cls = (uint16_t)cls;
	b->lru = ++p->clock;
	b->tier = POOL_TIER_FREE;
	set_tier(p, b, POOL_TIER_DRAM);
	p->u.blocks++;
	*id_out = id;
	return 0;
}

/* A fresh descriptor with no location yet (adoption fills it in). */
static int desc_adopt(struct pool *p, unsigned cls, uint32_t *id_out, struct slab_class_info *ci)
{
	if (slab_class_info(p->slab, cls, ci) < 0)
		return -EINVAL;
	int ret = desc_new(p, id_out);
	if (ret < 0)
		return ret;
	struct pool_block *b = desc(p, *id_out);
	memset(b, 0, sizeof *b);
	b->self = *id_out;
	b->dram_off = POOL_NO_OFFSET;
	b->nvme_off = POOL_NO_OFFSET;
	b->kept_off = POOL_NO_OFFSET;
	b->bytes = (uint32_t)ci->block_bytes;
	b->cls = (uint16_t)cls;
	b->lru = ++p->clock;
	b->committed = true;
	return 0;
}

int pool_block_adopt_dram(struct pool *p, unsigned cls, uint64_t slab_base, uint64_t off,
			  uint32_t *id_out)
{
	struct slab_class_info ci;
	uint32_t id;
	int ret = desc_adopt(p, cls, &id, &ci);
	if (ret < 0)
		return ret;
	ret = slab_adopt(p->slab, cls, slab_base, off);
	if (ret < 0) {
		p->free_ids[p->n_free_ids++] = id;
		return ret;
	}
	slab_set_tag(p->slab, off, id);
	p->u.dram_used_bytes += ci.stride;
	struct pool_block *b = desc(p, id);
	b->dram_off = off;
	set_tier(p, b, POOL_TIER_DRAM);
	p->u.blocks++;
	p->u.blocks_committed++;
	*id_out = id;
	return 0;
}

/* A committed block a previous daemon left outside DRAM (NVMe extent or remote id), with its
 * crc32c. */
static int adopt_outside(struct pool *p, unsigned cls, uint8_t tier, uint64_t where, uint32_t crc,
			 uint32_t *id_out)
{
	struct slab_class_info ci;
	uint32_t id;
	int ret = desc_adopt(p, cls, &id, &ci);
	if (ret < 0)
		return ret;
	struct pool_block *b = desc(p, id);
	if (tier == POOL_TIER_NVME)
		b->nvme_off = where;
	else
		b->remote_id = where;
	b->crc = crc;
	b->has_crc = true;
	set_tier(p, b, tier);
	p->u.blocks++;
	p->u.blocks_committed++;
	*id_out = id;
	return 0;
}

int pool_block_adopt_nvme(struct pool *p, unsigned cls, uint64_t nvme_off, uint32_t crc,
			  uint32_t *id_out)
{
	return adopt_outside(p, cls, POOL_TIER_NVME, nvme_off, crc, id_out);
}

int pool_block_adopt_remote(struct pool *p, unsigned cls, uint64_t remote_id, uint32_t crc,
			    uint32_t *id_out)
{
	return adopt_outside(p, cls, POOL_TIER_REMOTE, remote_id, crc, id_out);
}

int pool_block_offload_begin(struct pool *p, uint32_t id)
{
	struct pool_block *b = pool_block_get(p, id);
	if (!b || b->tier != POOL_TIER_NVME)
		return -EINVAL;
	set_tier(p, b, POOL_TIER_OFFLOADING);
	return 0;
}

int pool_block_offload_end(struct pool *p, uint32_t id, bool ok, uint64_t remote_id)
{
	struct pool_block *b = pool_block_get(p, id);
	if (!b || b->tier != POOL_TIER_OFFLOADING)
		return -EINVAL;
	if (ok) {
		b->nvme_off = POOL_NO_OFFSET;
		b->remote_id = remote_id;
		set_tier(p, b, POOL_TIER_REMOTE);
	} else {
		set_tier(p, b, POOL_TIER_NVME);
	}
	return 0;
}

/* A read into DRAM (promotion from NVMe, fetch from the remote tier) begins: from -> moving,
 * with a DRAM slot; and ends: ok -> DRAM (touched), failed -> from (the slot, if any, freed). */
static int into_dram_begin(struct pool *p, uint32_t id, uint8_t from, uint8_t moving)
{
	struct pool_block *b = pool_block_get(p, id);
	if (!b || b->tier != from)
		return -EINVAL;
	uint64_t off;
	int ret = slot_alloc(p, id, b->cls, &off);
	if (ret < 0)
		return ret;
	b->dram_off = off;
	set_tier(p, b, moving);
	return 0;
}

static int into_dram_end(struct pool *p, uint32_t id, uint8_t moving, uint8_t from, bool ok)
{
	struct pool_block *b = pool_block_get(p, id);
	if (!b || b->tier != moving)
		return -EINVAL;
	if (ok) {
		b->lru = ++p->clock;
		set_tier(p, b, POOL_TIER_DRAM);
	} else {
		if (b->dram_off != POOL_NO_OFFSET)
			slot_free(p, b);
		set_tier(p, b, from);
	}
	return 0;
}

int pool_block_fetch_begin(struct pool *p, uint32_t id)
{
	return into_dram_begin(p, id, POOL_TIER_REMOTE, POOL_TIER_FETCHING);
}

int pool_block_fetch_end(struct pool *p, uint32_t id, bool ok)
{
	return into_dram_end(p, id, POOL_TIER_FETCHING, POOL_TIER_REMOTE, ok);
}

int pool_block_slab_base(const struct pool *p, uint32_t id, uint64_t *base)
{
	const struct pool_block *b = desc(p, id);
	if (!b || b->tier == POOL_TIER_FREE || b->dram_off == POOL_NO_OFFSET)
		return -EINVAL;
	return slab_base_of(p->slab, b->dram_off, base);
}

int pool_block_free(struct pool *p, uint32_t id)
{
	struct pool_block *b = pool_block_get(p, id);
	if (!b)
		return -EINVAL;
	if (b->leases || b->tier == POOL_TIER_DEMOTING || b->tier == POOL_TIER_PROMOTING ||
	    b->tier == POOL_TIER_OFFLOADING || b->tier == POOL_TIER_FETCHING)
		return -EBUSY;
	if (b->kept_off != POOL_NO_OFFSET) {
		log_error("block %u freed with its kept NVMe extent at %llu still named: that extent "
			  "is lost until a restart", id, (unsigned long long)b->kept_off);
		pool_block_unkeep(p, id);
	}
	if (b->dram_off != POOL_NO_OFFSET)
		slot_free(p, b);
	if (b->committed)
		p->u.blocks_committed--;
	set_tier(p, b, POOL_TIER_FREE);
	b->committed = false;
	p->u.blocks--;
	p->free_ids[p->n_free_ids++] = id;
	return 0;
}

void *pool_block_data(struct pool *p, uint32_t id)
{
	struct pool_block *b = pool_block_get(p, id);
	if (!b || b->dram_off == POOL_NO_OFFSET)
		return NULL;
	return (char *)p->base + b->dram_off;
}

int pool_block_at(const struct pool *p, uint64_t off, uint32_t *id)
{
	if (off >= p->bytes)
		return -ERANGE;
	int ret = slab_get_tag(p->slab, off, id);
	if (ret < 0)
		return ret;
	/* A slot in use always belongs to a live descriptor that points back at it. */
	assert(desc(p, *id) && desc(p, *id)->dram_off == off);
	return 0;
}

void pool_block_touch(struct pool *p, uint32_t id)
{
	struct pool_block *b = pool_block_get(p, id);
	if (!b)
		return;
	b->lru = ++p->clock;
	if (b->tier == POOL_TIER_DRAM && p->lru_tail != id) {
		lru_unlink(p, b);
		lru_insert(p, b);
	}
}

int pool_block_lease(struct pool *p, uint32_t id)
{
	struct pool_block *b = pool_block_get(p, id);
	if (!b || b->leases == UINT32_MAX)
		return -EINVAL;
	if (b->leases++ == 0)
		p->u.blocks_leased++;
	return 0;
}

int pool_block_unlease(struct pool *p, uint32_t id)
{
	struct pool_block *b = pool_block_get(p, id);
	if (!b || b->leases == 0)
		return -EINVAL;
	if (--b->leases == 0)
		p->u.blocks_leased--;
	return 0;
}

int pool_block_set_committed(struct pool *p, uint32_t id, bool committed)
{
	struct pool_block *b = pool_block_get(p, id);
	if (!b)
		return -EINVAL;
	if (b->committed != committed) {
		if (committed)
			p->u.blocks_committed++;
		else
			p->u.blocks_committed--;
	}
	b->committed = committed;
	return 0;
}

int pool_block_demote_begin(struct pool *p, uint32_t id, uint64_t nvme_off)
{
	struct pool_block *b = pool_block_get(p, id);
	if (!b || b->tier != POOL_TIER_DRAM || nvme_off == POOL_NO_OFFSET)
		return -EINVAL;
	if (b->leases)
		return -EBUSY;
	b->nvme_off = nvme_off;
	set_tier(p, b, POOL_TIER_DEMOTING);
	return 0;
}

int pool_block_demote_end(struct pool *p, uint32_t id, bool ok, uint32_t crc)
{
	struct pool_block *b = pool_block_get(p, id);
	if (!b || b->tier != POOL_TIER_DEMOTING)
		return -EINVAL;
	if (ok) {
		slot_free(p, b);
		b->crc = crc;
		b->has_crc = true;
		set_tier(p, b, POOL_TIER_NVME);
	} else {
		b->nvme_off = POOL_NO_OFFSET;
		set_tier(p, b, POOL_TIER_DRAM);
	}
	return 0;
}

int pool_block_promote_begin(struct pool *p, uint32_t id)
{
	return into_dram_begin(p, id, POOL_TIER_NVME, POOL_TIER_PROMOTING);
}

static void kept_link(struct pool *p, struct pool_block *b, uint64_t off)
{
	b->kept_off = off;
	b->kept_prev = p->kept_tail;
	b->kept_next = POOL_NO_BLOCK;
	if (p->kept_tail != POOL_NO_BLOCK)
		desc(p, p->kept_tail)->kept_next = b->self;
	else
		p->kept_head = b->self;
	p->kept_tail = b->self;
	p->u.blocks_kept++;
	p->u.kept_bytes += b->bytes;
}

uint64_t pool_block_unkeep(struct pool *p, uint32_t id)
{
	struct pool_block *b = pool_block_get(p, id);
	if (!b || b->kept_off == POOL_NO_OFFSET)
		return POOL_NO_OFFSET;
	if (b->kept_prev != POOL_NO_BLOCK)
		desc(p, b->kept_prev)->kept_next = b->kept_next;
	else
		p->kept_head = b->kept_next;
	if (b->kept_next != POOL_NO_BLOCK)
		desc(p, b->kept_next)->kept_prev = b->kept_prev;
	else
		p->kept_tail = b->kept_prev;
	uint64_t off = b->kept_off;
	b->kept_off = POOL_NO_OFFSET;
	b->kept_prev = b->kept_next = POOL_NO_BLOCK;
	p->u.blocks_kept--;
	p->u.kept_bytes -= b->bytes;
	return off;
}

uint32_t pool_kept_newest(const struct pool *p)
{
	return p->kept_tail;
}

int pool_block_promote_end(struct pool *p, uint32_t id, bool ok, bool keep)
{
	struct pool_block *b = pool_block_get(p, id);
	if (b && b->tier == POOL_TIER_PROMOTING && ok) {
		if (keep && b->dram_off != POOL_NO_OFFSET)
			kept_link(p, b, b->nvme_off);
		b->nvme_off = POOL_NO_OFFSET;
	}
	return into_dram_end(p, id, POOL_TIER_PROMOTING, POOL_TIER_NVME, ok);
}

int pool_block_demote_kept(struct pool *p, uint32_t id)
{
	struct pool_block *b = pool_block_get(p, id);
	if (!b || b->tier != POOL_TIER_DRAM || b->kept_off == POOL_NO_OFFSET || !b->has_crc)
		return -EINVAL;
	if (b->leases)
		return -EBUSY;
	uint64_t off = pool_block_unkeep(p, id);
	slot_free(p, b);
	b->nvme_off = off;
	set_tier(p, b, POOL_TIER_NVME);
	return 0;
}

int pool_block_swap_begin(struct pool *p, uint32_t a, uint32_t v)
{
	struct pool_block *ba = pool_block_get(p, a), *bv = pool_block_get(p, v);
	if (!ba || !bv || a == v || ba->tier != POOL_TIER_NVME || bv->tier != POOL_TIER_DRAM ||
	    ba->cls != bv->cls)
		return -EINVAL;
	if (bv->leases)
		return -EBUSY;
	if (bv->kept_off != POOL_NO_OFFSET)
		return -EINVAL; /* its kept extent goes first (pool_block_unkeep) */
	assert(ba->dram_off == POOL_NO_OFFSET && ba->nvme_off != POOL_NO_OFFSET);
	set_tier(p, ba, POOL_TIER_PROMOTING);
	bv->nvme_off = ba->nvme_off;
	set_tier(p, bv, POOL_TIER_DEMOTING);
	return 0;
}

int pool_block_swap_commit(struct pool *p, uint32_t a, uint32_t v, uint32_t v_crc)
{
	struct pool_block *ba = pool_block_get(p, a), *bv = pool_block_get(p, v);
	if (!ba || !bv || ba->tier != POOL_TIER_PROMOTING || ba->dram_off != POOL_NO_OFFSET ||
	    bv->tier != POOL_TIER_DEMOTING || bv->nvme_off != ba->nvme_off)
		return -EINVAL;
	int ret = slab_set_tag(p->slab, bv->dram_off, a);
	assert(ret == 0);
	(void)ret;
	ba->dram_off = bv->dram_off;
	ba->nvme_off = POOL_NO_OFFSET;
	ba->lru = ++p->clock;
	set_tier(p, ba, POOL_TIER_DRAM);
	bv->dram_off = POOL_NO_OFFSET;
	bv->crc = v_crc;
	bv->has_crc = true;
	set_tier(p, bv, POOL_TIER_NVME);
	return 0;
}

/* ---------------------------------------------------------------- victims */

struct victim {
	int rank;
	uint64_t lru;
	uint32_t id;
};

static bool victim_less(const struct victim *a, const struct victim *b)
{
	if (a->rank != b->rank)
		return a->rank < b->rank;
	if (a->lru != b->lru)
		return a->lru < b->lru;
	return a->id < b->id;
}

/* Max-heap on victim_less: the root is the worst of the best `max` seen so far. */
static void heap_down(struct victim *h, size_t n, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < n && victim_less(&h[m], &h[l]))
			m = l;
		if (r < n && victim_less(&h[m], &h[r]))
			m = r;
		if (m == i)
			return;
		struct victim t = h[i];
		h[i] = h[m];
		h[m] = t;
		i = m;
	}
}

static void heap_up(struct victim *h, size_t i)
{
	while (i > 0) {
		size_t parent = (i - 1) / 2;
		if (!victim_less(&h[parent], &h[i]))
			return;
		struct victim t = h[i];
		h[i] = h[parent];
		h[parent] = t;
		i = parent;
	}
}

int pool_scan_begin(struct pool *p, struct pool_scan *s, size_t max)
{
	*s = (struct pool_scan){ .cursor = p->lru_head, .max = max };
	if (max && (!(s->ids0 = malloc(sizeof *s->ids0 * max)) ||
		    !(s->lru0 = malloc(sizeof *s->lru0 * max)) ||
		    !(s->heap = malloc(sizeof(struct victim) * max)))) {
		free(s->ids0);
		free(s->lru0);
		s->ids0 = NULL;
		s->lru0 = NULL;
		return -ENOMEM;
	}
	s->next = p->scans;
	p->scans = s;
	return 0;
}

int pool_scan_step(struct pool *p, struct pool_scan *s, pool_rank_fn rank, void *ctx,
		   size_t budget)
{
	/* Coldest first: rank-0 blocks come in their final order, so max of them end the walk;
	 * the others wait in a heap of the best max, used only if rank 0 runs short. */
	struct victim *h = s->heap;
	for (; s->cursor != POOL_NO_BLOCK && s->n0 < s->max && budget; budget--) {
		const struct pool_block *b = desc(p, s->cursor);
		s->cursor = b->lru_next;
		int r = b->leases ? -1 : rank(ctx, b);
		if (r == 0) {
			s->lru0[s->n0] = b->lru;
			s->ids0[s->n0++] = b->self;
		} else if (r > 0) {
			struct victim v = { r, b->lru, b->self };
			if (s->n < s->max) {
				h[s->n] = v;
				heap_up(h, s->n++);
			} else if (victim_less(&v, &h[0])) {
				h[0] = v;
				heap_down(h, s->n, 0);
			}
		}
	}
	return s->cursor == POOL_NO_BLOCK || s->n0 >= s->max;
}

size_t pool_scan_end(struct pool *p, struct pool_scan *s, uint32_t *ids, uint64_t *lrus)
{
	for (struct pool_scan **pp = &p->scans; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	struct victim *h = s->heap;
	/* Heap sort: repeatedly move the largest to the end. */
	for (size_t end = s->n; end > 1; end--) {
		struct victim t = h[0];
		h[0] = h[end - 1];
		h[end - 1] = t;
		heap_down(h, end - 1, 0);
	}
	size_t n = s->n0;
	if (n)
		memcpy(ids, s->ids0, n * sizeof *ids);
	if (n && lrus)
		memcpy(lrus, s->lru0, n * sizeof *lrus);
	for (size_t i = 0; i < s->n && n < s->max; i++) {
		if (lrus)
			lrus[n] = h[i].lru;
		ids[n++] = h[i].id;
	}
	free(s->ids0);
	free(s->lru0);
	free(s->heap);
	*s = (struct pool_scan){ .cursor = POOL_NO_BLOCK };
	return n;
}

int pool_victims(struct pool *p, pool_rank_fn rank, void *ctx, uint32_t *ids, size_t max,
		 size_t *n_out)
{
	*n_out = 0;
	if (max == 0)
		return 0;
	struct pool_scan s;
	int ret = pool_scan_begin(p, &s, max);
	if (ret)
		return ret;
	pool_scan_step(p, &s, rank, ctx, SIZE_MAX);
	*n_out = pool_scan_end(p, &s, ids, NULL);
	return 0;
}

int pool_each(struct pool *p, pool_each_fn fn, void *ctx)
{
	for (uint32_t id = 0; id < p->next_id; id++) {
		struct pool_block *b = desc(p, id);
		if (b->tier == POOL_TIER_FREE)
			continue;
		int ret = fn(ctx, id, b);
		if (ret)
			return ret;
	}
	return 0;
}

void pool_usage(const struct pool *p, struct pool_usage *u)
{
	*u = p->u;
	u->slabs = 0;
	u->classes = slab_class_count(p->slab);
	uint64_t free_bytes = slab_free_units(p->slab) * slab_unit_bytes(p->slab);
	for (unsigned c = 0; c < u->classes; c++) {
		struct slab_class_info ci;
		slab_class_info(p->slab, c, &ci);
		u->slabs += ci.slabs;
		free_bytes += ci.free * ci.stride;
	}
	u->dram_free_bytes = free_bytes;
}

int pool_reclaim_pick(struct pool *p, unsigned cls, uint64_t *base, uint64_t *bytes,
		      uint64_t *stride)
{
	if (slab_free_units_for(p->slab, cls))
		return -EAGAIN; /* a unit is free for it: no other class need give one up */
	return slab_reclaim_pick(p->slab, cls, base, bytes, stride);
}

void pool_unreserve(struct pool *p, unsigned cls)
{
	slab_unreserve(p->slab, cls);
}
