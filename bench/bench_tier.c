/* bench_tier — NVMe tier throughput (demotion writes, promotion reads) against fio on the same
 * file, with the same block size, queue depth, O_DIRECT and io_uring engine, and the ratio.
 *
 * usage: bench_tier [--file PATH] [--bs BYTES] [--qd N] [--size BYTES]
 * Defaults: a file in the build directory, 128 KiB blocks (one Llama-3.1-8B page block), queue
 * depth 32, 256 MiB. The buffers are one anonymous region registered with the tier, as the
 * pool is in kvstored. fio runs with --direct=1 --ioengine=io_uring --fixedbufs
 * --registerfiles so both sides use the same kernel paths. Three patterns: sequential write,
 * sequential read, random read (a shuffled block order, fio's randread). */
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

#include "crc32c.h"
#include "tier.h"

struct opts {
	const char *file;
	uint64_t bs, size;
	unsigned qd;
};

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

struct run {
	uint64_t done;
	int err;
};

static void on_done(void *ctx, const struct tier_result *r)
{
	struct run *run = ctx;
	run->done++;
	if (r->status && !run->err)
		run->err = r->status;
}

/* Runs n requests over block order `order`, at most qd outstanding. Returns bytes/s or -1. */
static double tier_pass(struct tier *t, bool write, char *buf, const uint64_t *order, uint64_t n,
			uint64_t bs, unsigned qd, const uint32_t *crcs)
{
	struct run run = { 0 };
	uint64_t sent = 0;
	double t0 = now_s();
	while (run.done < n) {
		while (sent < n && sent - run.done < qd) {
			uint64_t k = order[sent];
			int ret = write ? tier_write(t, buf + k * bs, k * bs, (uint32_t)bs, k)
					: tier_read(t, buf + k * bs, k * bs, (uint32_t)bs, crcs[k], k);
			if (ret < 0) {
				fprintf(stderr, "queue: %s\n", strerror(-ret));
				return -1;
			}
			sent++;
		}
		if (tier_flush(t) < 0 || tier_wait(t, 10000, on_done, &run) < 0)
			return -1;
	}
	double dt = now_s() - t0;
	if (run.err) {
		fprintf(stderr, "I/O error: %s\n", strerror(-run.err));
		return -1;
	}
	return (double)(n * bs) / dt;
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

int main(int argc, char **argv)
{
	static char default_file[512];
	snprintf(default_file, sizeof default_file, "%s/bench_tier-%d.img", FREEKV_BUILD_DIR,
		 (int)getpid());
	struct opts o = { .file = default_file, .bs = 128 << 10, .qd = 32, .size = 256ull << 20 };
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--file") && i + 1 < argc)
			o.file = argv[++i];
		else if (!strcmp(argv[i], "--bs") && i + 1 < argc)
			o.bs = parse_size(argv[++i]);
		else if (!strcmp(argv[i], "--qd") && i + 1 < argc)
			o.qd = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--size") && i + 1 < argc)
			o.size = parse_size(argv[++i]);
		else {
			fprintf(stderr, "usage: %s [--file PATH] [--bs BYTES] [--qd N] [--size BYTES]\n",
				argv[0]);
			return 2;
		}
	}
	if (o.bs == 0 || o.bs % TIER_ALIGN || o.bs > UINT32_MAX || o.qd == 0 || o.size < o.bs) {
		fprintf(stderr, "bs must be a multiple of %u, qd > 0, size >= bs\n", TIER_ALIGN);
		return 2;
	}
	uint64_t n = o.size / o.bs;
	o.size = n * o.bs;
	char *buf = mmap(NULL, o.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint64_t *order = malloc(sizeof *order * n);
	uint32_t *crcs = malloc(sizeof *crcs * n);
	if (buf == MAP_FAILED || !order || !crcs) {
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
	printf("bench_tier: file %s, bs %llu, qd %u, size %llu MiB, O_DIRECT %s, fixed buffers %s\n",
	       o.file, (unsigned long long)o.bs, o.qd, (unsigned long long)(o.size >> 20),
	       u.direct ? "yes" : "no", u.fixed_buffers ? "yes" : "no");
	for (uint64_t i = 0; i < n; i++)
		order[i] = i;
	/* Untimed pass first: the preallocated extents are "unwritten" until written once, and fio
	 * (which runs afterwards) only ever sees written ones. */
	double w = tier_pass(t, true, buf, order, n, o.bs, o.qd, NULL);
	if (w > 0)
		w = tier_pass(t, true, buf, order, n, o.bs, o.qd, NULL);
	/* Write checksums for the read passes: one more pass over what was just written. */
	for (uint64_t i = 0; i < n; i++)
		crcs[i] = crc32c(0, buf + i * o.bs, o.bs);
	double r = tier_pass(t, false, buf, order, n, o.bs, o.qd, crcs);
	for (uint64_t i = n - 1; i > 0; i--) {
		seed ^= seed << 13;
		seed ^= seed >> 7;
		seed ^= seed << 17;
		uint64_t j = seed % (i + 1), x = order[i];
		order[i] = order[j];
		order[j] = x;
	}
	double rr = tier_pass(t, false, buf, order, n, o.bs, o.qd, crcs);
	tier_close(t);
	if (w < 0 || r < 0 || rr < 0)
		return 1;
	double fw = fio_pass(&o, "write"), fr = fio_pass(&o, "read"), frr = fio_pass(&o, "randread");
	const char *names[3] = { "seq write (demote)", "seq read (promote)", "rand read (promote)" };
	double mine[3] = { w, r, rr }, theirs[3] = { fw, fr, frr };
	printf("%-22s %12s %12s %8s\n", "pattern", "tier MB/s", "fio MB/s", "ratio");
	for (int i = 0; i < 3; i++) {
		if (theirs[i] > 0)
			printf("%-22s %12.1f %12.1f %8.3f\n", names[i], mine[i] / 1e6, theirs[i] / 1e6,
			       mine[i] / theirs[i]);
		else
			printf("%-22s %12.1f %12s %8s\n", names[i], mine[i] / 1e6, "n/a", "n/a");
	}
	printf("tier read passes verify crc32c of every block (fio does not)\n");
	if (o.file == default_file)
		unlink(o.file);
	munmap(buf, o.size);
	free(order);
	free(crcs);
	return 0;
}
