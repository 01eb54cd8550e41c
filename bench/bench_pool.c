/* bench_pool — copies into and out of pool blocks (shared memory, slab-allocated, optionally
 * mlocked) against the same copies between private anonymous buffers, and the ratio; plus the
 * rate of the metadata operations the daemon runs per block (alloc + free, offset lookup).
 *
 * usage: bench_pool [--bytes SIZE] [--bs SIZE] [--passes N] [--lock]
 * Defaults: 256 MiB pool, 128 KiB blocks, 5 passes. Each pass copies through the pool and then
 * between private buffers back to back (so load drifts on a shared machine hit both alike) and
 * gives a ratio; the report is the median over passes with the spread (min..max). */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "pool.h"

#define MAX_PASSES 64

/* Copy rate of one pass (bytes/s): n blocks of bs from src[i] to dst[i]. */
static double copy_rate(char **dst, char **src, uint64_t n, uint64_t bs)
{
	double t0 = bench_now_s();
	for (uint64_t i = 0; i < n; i++)
		memcpy(dst[i], src[i], bs);
	return (double)(n * bs) / (bench_now_s() - t0);
}

/* Prints median [min..max] of v (sorts it). */
static void print_summary(const char *fmt_med, double scale, double *v, int n)
{
	struct bench_summary m = bench_summarize(v, n);
	printf(fmt_med, m.med * scale, m.lo * scale, m.hi * scale);
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
			bytes = bench_parse_size(argv[++i]);
		else if (!strcmp(argv[i], "--bs") && i + 1 < argc)
			bs = bench_parse_size(argv[++i]);
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
	if (bs == 0 || bs > UINT32_MAX || bytes < bs || passes < 1 || passes > MAX_PASSES) {
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
	printf("bench_pool: %llu blocks of %llu bytes (%llu MiB), mlock %s, %d passes\n",
	       (unsigned long long)n, (unsigned long long)bs,
	       (unsigned long long)(n * bs >> 20), lock ? "yes" : "no", passes);
	/* [0] write into the pool, [1] read out of it; rate pool, rate memcpy, ratio. */
	double pool_r[2][MAX_PASSES], base_r[2][MAX_PASSES], ratio[2][MAX_PASSES];
	copy_rate(blk, srcp, n, bs); /* warm-up */
	copy_rate(privp, srcp, n, bs);
	for (int k = 0; k < passes; k++) {
		pool_r[0][k] = copy_rate(blk, srcp, n, bs);
		base_r[0][k] = copy_rate(privp, srcp, n, bs);
		pool_r[1][k] = copy_rate(dstp, blk, n, bs);
		base_r[1][k] = copy_rate(dstp, privp, n, bs);
		for (int d = 0; d < 2; d++)
			ratio[d][k] = pool_r[d][k] / base_r[d][k];
	}
	printf("median over passes [min..max]\n");
	printf("%-6s %26s %26s %22s\n", "copy", "pool MB/s", "memcpy MB/s", "ratio");
	for (int d = 0; d < 2; d++) {
		printf("%-6s ", d ? "read" : "write");
		print_summary("%8.1f [%7.1f..%7.1f] ", 1e-6, pool_r[d], passes);
		print_summary("%8.1f [%7.1f..%7.1f] ", 1e-6, base_r[d], passes);
		print_summary("%6.3f [%5.3f..%5.3f]\n", 1, ratio[d], passes);
	}

	/* Metadata: offset lookups (what validating a worker's offsets costs) and alloc + free. */
	double t0 = bench_now_s();
	uint64_t found = 0;
	for (int r = 0; r < 20; r++) {
		for (uint64_t i = 0; i < n; i++) {
			uint32_t id;
			found += pool_block_at(p, pool_block_get(p, ids[i])->dram_off, &id) == 0;
		}
	}
	double lookup = (double)(20 * n) / (bench_now_s() - t0);
	uint64_t half = n / 2;
	t0 = bench_now_s();
	for (int r = 0; r < 20; r++) {
		for (uint64_t i = 0; i < half; i++)
			pool_block_free(p, ids[i]);
		for (uint64_t i = 0; i < half; i++)
			pool_block_alloc(p, cls, &ids[i]);
	}
	double churn = (double)(20 * half) / (bench_now_s() - t0);
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
