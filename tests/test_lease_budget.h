/* Helpers for the lease-budget integration tests (test_lease_budget.c, test_lease_resume.c): a
 * real kvstored whose DRAM pool (2 MiB, one slab unit) is smaller than one stories260K
 * sequence's KV of LB_N tokens (5 layers x 256 bytes a token: 1700 tokens are 2.1 MiB, plus the
 * pages allocated ahead), with an 8 MiB NVMe tier; the real kvworker run against it, its stderr
 * captured; the daemon's demotion and promotion counters. Header-only. */
#ifndef FREEKV_TEST_LEASE_BUDGET_H
#define FREEKV_TEST_LEASE_BUDGET_H

#include "test_kvworker_proc.h"

#include <fcntl.h>
#include <time.h>

#define LB_PROMPT "Once upon a time"
#define LB_N 1700
#define LB_CTX "1800"
#define LB_LEASES "64"

static const char *const lb_small_pool[] = { "--set", "dram_bytes=2M", "--set", "nvme_bytes=8M",
					     NULL };

/* Runs kvworker to completion with its stderr in err (NUL-terminated, truncated to errlen). */
static inline int lb_run(struct proc *p, const char *const *args, char *err, size_t errlen)
{
	char path[] = "/tmp/fkv-lb-err-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	unlink(path);
	fflush(stderr);
	int saved = dup(2);
	assert_true(saved >= 0);
	assert_int_equal(dup2(fd, 2), 2);
	p_start(p, args);
	assert_int_equal(dup2(saved, 2), 2);
	close(saved);
	int st = p_wait(p);
	ssize_t n = pread(fd, err, errlen - 1, 0);
	err[n > 0 ? n : 0] = '\0';
	close(fd);
	if (st)
		fprintf(stderr, "kvworker exited with %d: %s\n", st, err);
	return st;
}

/* A number from kvworker's --stats JSON line in err; -1 when absent. */
static inline long long lb_stat(const char *err, const char *key)
{
	char k[64];
	snprintf(k, sizeof k, "\"%s\":", key);
	const char *at = strstr(err, k);
	return at ? atoll(at + strlen(k)) : -1;
}

static inline void lb_tier_stats(const char *endpoint, uint64_t *dram_bytes, uint64_t *demoted,
				 uint64_t *promoted)
{
	struct kvs *k;
	Freekv__Reply *r;
	assert_int_equal(kvs_connect(endpoint, 5000, &k), 0);
	assert_int_equal(kvs_stats(k, &r), 0);
	*dram_bytes = r->stats->dram_bytes;
	*demoted = r->stats->demoted_blocks;
	*promoted = r->stats->promoted_blocks;
	kvs_reply_free(r);
	kvs_close(k);
}

/* Blocks a detached sequence holds in each tier, and its block size. */
/* Where a sequence's blocks are, once the daemon's demotion has settled: demotion runs beside
 * the worker (and after it detaches), so this polls until some blocks are on NVMe and two reads
 * 50 ms apart agree, for at most 10 s; the caller asserts what it expects. */
static inline void lb_seq_pages(const char *endpoint, const char *name, uint64_t *dram,
				uint64_t *nvme, uint64_t *block_bytes)
{
	struct kvs *k;
	assert_int_equal(kvs_connect(endpoint, 5000, &k), 0);
	uint64_t last_dram = UINT64_MAX, last_nvme = UINT64_MAX;
	for (int i = 0; i < 200; i++) {
		Freekv__Reply *r;
		assert_int_equal(kvs_show_sequence(k, 0, name, false, &r), 0);
		*dram = r->sequence->pages->dram;
		*nvme = r->sequence->pages->nvme;
		*block_bytes = r->sequence->block_bytes;
		kvs_reply_free(r);
		if (*nvme > 0 && *dram == last_dram && *nvme == last_nvme)
			break;
		last_dram = *dram;
		last_nvme = *nvme;
		nanosleep(&(struct timespec){ .tv_nsec = 50 * 1000 * 1000 }, NULL);
	}
	kvs_close(k);
}

/* The ids of an uninterrupted greedy run of n tokens in an embedded store (no kvstored). */
static inline int lb_reference(const char *model, const char *policy, const char *n, int *ids)
{
	struct proc p;
	char err[1 << 14];
	const char *ref[] = { "generate", "-m", model, "-p", LB_PROMPT, "-n", n, "-c", LB_CTX,
			      "--temp", "0", "--ids", "--policy", policy, NULL };
	assert_int_equal(lb_run(&p, ref, err, sizeof err), 0);
	memcpy(ids, p.ids, (size_t)p.n_ids * sizeof *ids);
	return p.n_ids;
}

#endif
