/* bench_pool — copies into and out of pool blocks (shared memory, slab-allocated, optionally
 * mlocked) against the same copies between private anonymous buffers, and the ratio; plus the
 * rate of the metadata operations the daemon runs per block (alloc + free, offset lookup).
 *
 * usage: bench_pool [--bytes SIZE] [--bs SIZE] [--passes N] [--lock]
 * Defaults: 256 MiB pool, 128 KiB blocks, 5 passes (the best pass is reported). */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "pool.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t parse_size(const char *s)
{
	char *end;
	uint64_t v = strtoull(s, &end, 10);
	switch (*end) {
	case 'k': case 'K': return v << 10;
	case 'm': case 'M': return v << 20;
	case 'g': case 'G': return v << 30;
	default: return v;
	}
}

/* Best-of-passes copy rate (bytes/s): n blocks of bs from src[i] to dst[i]. */
static double copy_rate(char **dst, char **src, uint64_t n, uint64_t bs, int passes)
{
	double best = 0;
	for (int p = 0; p < passes; p++) {
		double t0 = now_s();
		for (uint64_t i = 0; i < n; i++)
			memcpy(dst[i], src[i], bs);
		double dt = now_s() - t0;
		double rate = (double)(n * bs) / dt;
		if (rate > best)
			best = rate;
	}
	return best;
}

static void *anon(uint64_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	memset(p, 1, bytes); /* fault every page in before timing */
	return p;
}

int main(int argc, char **argv)
{
	uint64_t bytes = 256ull << 20, bs = 128 << 10;
	int passes = 5;
	bool lock = false;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--bytes") && i + 1 < argc)
			bytes = parse_size(argv[++i]);
		else if (!strcmp(argv[i], "--bs") && i + 1 < argc)
			bs = parse_size(argv[++i]);
		else if (!strcmp(argv[i], "--passes") && i + 1 < argc)
			passes = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--lock"))
			lock = true;
		else {
			fprintf(stderr, "usage: %s [--bytes SIZE] [--bs SIZE] [--passes N] [--lock]\n",
				argv[0]);
			return 2;
		}
	}
	if (bs == 0 || bs > UINT32_MAX || bytes < bs || passes < 1) {
		fprintf(stderr, "bad sizes\n");
		return 2;
	}
	char name[64];
	snprintf(name, sizeof name, "/freekv-bench-pool-%d", (int)getpid());
	struct pool_config cfg = { .shm_name = name, .dram_bytes = bytes, .lock_memory = lock };
	struct pool *p;
	char err[POOL_ERR_LEN];
	int ret = pool_create(&cfg, &p, err, sizeof err);
	if (ret < 0) {
		fprintf(stderr, "pool_create: %s\n", err);
		return 1;
	}
	unsigned cls;
	if (pool_class(p, bs, &cls) < 0) {
		fprintf(stderr, "block size %llu does not fit the pool\n", (unsigned long long)bs);
		pool_destroy(p);
		return 1;
	}
	uint64_t cap = bytes / bs;
	uint32_t *ids = malloc(sizeof *ids * cap);
	char **blk = malloc(sizeof *blk * cap);
	uint64_t n = 0;
	while (n < cap && pool_block_alloc(p, cls, &ids[n]) == 0) {
		blk[n] = pool_block_data(p, ids[n]);
		memset(blk[n], 1, bs);
		n++;
	}
	char *src = anon(n * bs), *dst = anon(n * bs), *priv = anon(n * bs);
	char **srcp = malloc(sizeof *srcp * n), **dstp = malloc(sizeof *dstp * n);
	char **privp = malloc(sizeof *privp * n);
	if (!src || !dst || !priv || !srcp || !dstp || !privp) {
		fprintf(stderr, "out of memory\n");
		pool_destroy(p);
		return 1;
	}
	for (uint64_t i = 0; i < n; i++) {
		srcp[i] = src + i * bs;
		dstp[i] = dst + i * bs;
		privp[i] = priv + i * bs;
	}
	printf("bench_pool: %llu blocks of %llu bytes (%llu MiB), mlock %s, best of %d passes\n",
	       (unsigned long long)n, (unsigned long long)bs,
	       (unsigned long long)(n * bs >> 20), lock ? "yes" : "no", passes);
	double pw = copy_rate(blk, srcp, n, bs, passes);
	double bw = copy_rate(privp, srcp, n, bs, passes);
	double pr = copy_rate(dstp, blk, n, bs, passes);
	double br = copy_rate(dstp, privp, n, bs, passes);
	printf("%-8s %14s %14s %8s\n", "copy", "pool MB/s", "memcpy MB/s", "ratio");
	printf("%-8s %14.1f %14.1f %8.3f\n", "write", pw / 1e6, bw / 1e6, pw / bw);
	printf("%-8s %14.1f %14.1f %8.3f\n", "read", pr / 1e6, br / 1e6, pr / br);

	/* Metadata: offset lookups (what validating a worker's offsets costs) and alloc + free. */
	double t0 = now_s();
	uint64_t found = 0;
	for (int r = 0; r < 20; r++) {
		for (uint64_t i = 0; i < n; i++) {
			uint32_t id;
			found += pool_block_at(p, pool_block_get(p, ids[i])->dram_off, &id) == 0;
		}
	}
	double lookup = (double)(20 * n) / (now_s() - t0);
	uint64_t half = n / 2;
	t0 = now_s();
	for (int r = 0; r < 20; r++) {
		for (uint64_t i = 0; i < half; i++)
			pool_block_free(p, ids[i]);
		for (uint64_t i = 0; i < half; i++)
			pool_block_alloc(p, cls, &ids[i]);
	}
	double churn = (double)(20 * half) / (now_s() - t0);
	printf("metadata: %.2f M offset lookups/s (%llu ok), %.2f M alloc+free pairs/s\n",
	       lookup / 1e6, (unsigned long long)found, churn / 1e6);
	pool_destroy(p);
	munmap(src, n * bs);
	munmap(dst, n * bs);
	munmap(priv, n * bs);
	free(ids);
	free(blk);
	free(srcp);
	free(dstp);
	free(privp);
	return 0;
}
