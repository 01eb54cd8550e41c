/* bench_tier — NVMe tier throughput (demotion writes, promotion reads) against fio on the same
 * file, with the same block size, queue depth, O_DIRECT and io_uring engine, and the ratio.
 *
 * usage: bench_tier [--file PATH] [--bs BYTES] [--qd N] [--size BYTES] [--reps N]
 * Defaults: a file in the build directory, 128 KiB blocks (one Llama-3.1-8B page block), queue
 * depth 32, 256 MiB, 5 repetitions. The buffers are one anonymous region registered with the
 * tier, as the pool is in kvstored. fio runs with --direct=1 --ioengine=io_uring --fixedbufs
 * --registerfiles so both sides use the same kernel paths; like fio, the tier side keeps exactly
 * qd requests outstanding (a completion queues the next request from its callback). Three
 * patterns: sequential write, sequential read, random read (a shuffled block order, fio's
 * randread).
 *
 * Fairness on a shared machine: an untimed warm-up (every extent written once, one read pass),
 * then REPS repetitions in which the three patterns run on the tier, then under fio;
 * each repetition gives a ratio, and the report is the median over repetitions with the spread
 * (min..max). The tier computes a crc32c of every block it writes and verifies it on every read
 * (fio does neither): the report gives the time crc32c alone takes over the same bytes as a
 * fraction of the tier pass, measured in the same repetition. */
#include <errno.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "crc32c.h"
#include "tier.h"

struct opts {
	const char *file;
	uint64_t bs, size;
	unsigned qd;
};

struct run {
	struct tier *t;
	char *buf;
	const uint64_t *order;
	const uint32_t *crcs;
	uint64_t n, bs, sent, done;
	bool write;
	int err;
};

static int submit_next(struct run *run)
{
	uint64_t k = run->order[run->sent];
	int ret = run->write ? tier_write(run->t, run->buf + k * run->bs, k * run->bs, (uint32_t)run->bs, k)
			     : tier_read(run->t, run->buf + k * run->bs, k * run->bs, (uint32_t)run->bs,
					 run->crcs[k], k);
	if (ret == 0)
		run->sent++;
	return ret;
}

/* A completion frees one of the qd slots: the next request takes it at once. */
static void on_done(void *ctx, const struct tier_result *r)
{
	struct run *run = ctx;
	run->done++;
	if (r->status && !run->err)
		run->err = r->status;
	if (run->sent < run->n && !run->err) {
		int ret = submit_next(run);
		if (ret && !run->err)
			run->err = ret;
	}
}

/* Runs n requests over block order `order`, qd outstanding. Returns bytes/s or -1. */
static double tier_pass(struct tier *t, bool write, char *buf, const uint64_t *order, uint64_t n,
			uint64_t bs, unsigned qd, const uint32_t *crcs)
{
	struct run run = { .t = t, .buf = buf, .order = order, .crcs = crcs, .n = n, .bs = bs, .write = write };
	double t0 = bench_now_s();
	while (run.sent < n && run.sent < qd) {
		int ret = submit_next(&run);
		if (ret < 0) {
			fprintf(stderr, "queue: %s\n", strerror(-ret));
			return -1;
		}
	}
	while (run.done < n && !run.err) {
		if (tier_flush(t) < 0 || tier_wait(t, 10000, on_done, &run) < 0)
			return -1;
	}
	double dt = bench_now_s() - t0;
	if (run.err) {
		fprintf(stderr, "I/O error: %s\n", strerror(-run.err));
		while (tier_pending(t) && tier_wait(t, 1000, on_done, &run) >= 0)
			;
		return -1;
	}
	return (double)(n * bs) / dt;
}

/* Seconds crc32c alone takes over the n blocks. */
static double crc_pass(const char *buf, uint64_t n, uint64_t bs)
{
	uint32_t x = 0;
	double t0 = bench_now_s();
	for (uint64_t i = 0; i < n; i++)
		x ^= crc32c(0, buf + i * bs, bs);
	double dt = bench_now_s() - t0;
	__asm__ __volatile__("" : : "r"(x));
	return dt;
}

/* Runs fio and returns its bandwidth in bytes/s from the JSON report, or -1. */
static double fio_pass(const struct opts *o, const char *rw)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd,
		 "fio --name=bench --filename=%s --rw=%s --bs=%llu --iodepth=%u --size=%llu "
		 "--direct=1 --ioengine=io_uring --fixedbufs --registerfiles --randrepeat=0 "
		 "--norandommap --output-format=json 2>/dev/null",
		 o->file, rw, (unsigned long long)o->bs, o->qd, (unsigned long long)o->size);
	FILE *f = popen(cmd, "r");
	if (!f)
		return -1;
	size_t cap = 1 << 16, len = 0;
	char *out = malloc(cap);
	size_t n;
	while (out && (n = fread(out + len, 1, cap - len - 1, f)) > 0) {
		len += n;
		if (len + 1 == cap) {
			char *bigger = realloc(out, cap *= 2);
			if (!bigger)
				break;
			out = bigger;
		}
	}
	int rc = pclose(f);
	if (!out || rc != 0) {
		free(out);
		fprintf(stderr, "fio failed (exit %d): %s\n", rc, cmd);
		return -1;
	}
	out[len] = '\0';
	/* fio may print notes before the JSON object. */
	char *start = strchr(out, '{');
	json_object *root = start ? json_tokener_parse(start) : NULL;
	double bw = -1;
	json_object *jobs, *job, *part, *v;
	const char *key = strstr(rw, "write") ? "write" : "read";
	if (root && json_object_object_get_ex(root, "jobs", &jobs) &&
	    (job = json_object_array_get_idx(jobs, 0)) &&
	    json_object_object_get_ex(job, key, &part) &&
	    json_object_object_get_ex(part, "bw_bytes", &v))
		bw = (double)json_object_get_int64(v);
	json_object_put(root);
	free(out);
	return bw;
}

#define MAX_REPS 32

static void shuffle(uint64_t *order, uint64_t n, uint64_t *seed)
{
	for (uint64_t i = n - 1; i > 0; i--) {
		*seed ^= *seed << 13;
		*seed ^= *seed >> 7;
		*seed ^= *seed << 17;
		uint64_t j = *seed % (i + 1), x = order[i];
		order[i] = order[j];
		order[j] = x;
	}
}

int main(int argc, char **argv)
{
	static char default_file[512];
	snprintf(default_file, sizeof default_file, "%s/bench_tier-%d.img", FREEKV_BUILD_DIR,
		 (int)getpid());
	struct opts o = { .file = default_file, .bs = 128 << 10, .qd = 32, .size = 256ull << 20 };
	int reps = 5;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--file") && i + 1 < argc)
			o.file = argv[++i];
		else if (!strcmp(argv[i], "--bs") && i + 1 < argc)
			o.bs = bench_parse_size(argv[++i]);
		else if (!strcmp(argv[i], "--qd") && i + 1 < argc)
			o.qd = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--size") && i + 1 < argc)
			o.size = bench_parse_size(argv[++i]);
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			reps = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: %s [--file PATH] [--bs BYTES] [--qd N] [--size BYTES] [--reps N]\n",
				argv[0]);
			return 2;
		}
	}
	if (o.bs == 0 || o.bs % TIER_ALIGN || o.bs > UINT32_MAX || o.qd == 0 || o.size < o.bs ||
	    reps < 1 || reps > MAX_REPS) {
		fprintf(stderr, "bs must be a multiple of %u, qd > 0, size >= bs, 1 <= reps <= %d\n", TIER_ALIGN,
			MAX_REPS);
		return 2;
	}
	uint64_t n = o.size / o.bs;
	o.size = n * o.bs;
	char *buf = mmap(NULL, o.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint64_t *seq_order = malloc(sizeof *seq_order * n), *rand_order = malloc(sizeof *rand_order * n);
	uint32_t *crcs = malloc(sizeof *crcs * n);
	if (buf == MAP_FAILED || !seq_order || !rand_order || !crcs) {
		fprintf(stderr, "out of memory\n");
		return 1;
	}
	uint64_t seed = 0x1234567;
	for (uint64_t i = 0; i < o.size / 8; i++) {
		seed ^= seed << 13;
		seed ^= seed >> 7;
		seed ^= seed << 17;
		((uint64_t *)buf)[i] = seed;
	}
	for (uint64_t i = 0; i < n; i++)
		seq_order[i] = rand_order[i] = i;
	shuffle(rand_order, n, &seed);
	for (uint64_t i = 0; i < n; i++)
		crcs[i] = crc32c(0, buf + i * o.bs, o.bs);
	struct tier_config cfg = { .path = o.file, .bytes = o.size, .queue_depth = o.qd,
				   .reg_base = buf, .reg_bytes = o.size };
	struct tier *t;
	char err[TIER_ERR_LEN];
	int ret = tier_open(&cfg, &t, err, sizeof err);
	if (ret < 0) {
		fprintf(stderr, "tier_open: %s\n", err);
		return 1;
	}
	struct tier_usage u;
	tier_usage(t, &u);
	printf("bench_tier: file %s, bs %llu, qd %u, size %llu MiB, O_DIRECT %s, fixed buffers %s, %d repetitions\n",
	       o.file, (unsigned long long)o.bs, o.qd, (unsigned long long)(o.size >> 20),
	       u.direct ? "yes" : "no", u.fixed_buffers ? "yes" : "no", reps);
	fflush(stdout);
	int rc = 1;
	/* Warm-up, untimed: preallocated extents are "unwritten" until written once (fio only ever
	 * sees written ones), and a first read pass. */
	if (tier_pass(t, true, buf, seq_order, n, o.bs, o.qd, NULL) < 0 ||
	    tier_pass(t, false, buf, seq_order, n, o.bs, o.qd, crcs) < 0)
		goto out;
	static const char *const names[3] = { "seq write (demote)", "seq read (promote)", "rand read (promote)" };
	static const char *const fio_rw[3] = { "write", "read", "randread" };
	double mine[3][MAX_REPS], theirs[3][MAX_REPS], ratio[3][MAX_REPS], crc_frac[3][MAX_REPS];
	for (int r = 0; r < reps; r++) {
		/* The tier's three passes first: fio's write pass overwrites the file with its own
		 * bytes, and the tier's write pass at the start of a repetition restores them. */
		for (int p = 0; p < 3; p++) {
			const uint64_t *order = p == 2 ? rand_order : seq_order;
			mine[p][r] = tier_pass(t, p == 0, buf, order, n, o.bs, o.qd, crcs);
			if (mine[p][r] < 0)
				goto out;
			crc_frac[p][r] = crc_pass(buf, n, o.bs) / ((double)o.size / mine[p][r]);
		}
		for (int p = 0; p < 3; p++) {
			theirs[p][r] = fio_pass(&o, fio_rw[p]);
			if (theirs[p][r] <= 0)
				goto out;
			ratio[p][r] = mine[p][r] / theirs[p][r];
		}
	}
	printf("median over repetitions [min..max]\n");
	printf("%-20s %24s %24s %22s %10s\n", "pattern", "tier MB/s", "fio MB/s", "ratio", "crc share");
	for (int p = 0; p < 3; p++) {
		struct bench_summary a = bench_summarize(mine[p], reps);
		struct bench_summary b = bench_summarize(theirs[p], reps);
		struct bench_summary q = bench_summarize(ratio[p], reps);
		struct bench_summary c = bench_summarize(crc_frac[p], reps);
		printf("%-20s %7.1f [%6.1f..%6.1f] %7.1f [%6.1f..%6.1f] %6.3f [%5.3f..%5.3f] %9.1f%%\n", names[p],
		       a.med / 1e6, a.lo / 1e6, a.hi / 1e6, b.med / 1e6, b.lo / 1e6, b.hi / 1e6, q.med, q.lo, q.hi,
		       100 * c.med);
	}
	printf("crc share: time crc32c alone takes over the pass's bytes / tier pass time (the tier\n"
	       "checksums every write and verifies every read; fio does neither)\n");
	rc = 0;
out:
	tier_close(t);
	if (o.file == default_file)
		unlink(o.file);
	munmap(buf, o.size);
	free(seq_order);
	free(rand_order);
	free(crcs);
	return rc;
}
