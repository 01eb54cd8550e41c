/* bench_kernels — GPU kernel micro-benchmarks, each printed against a baseline measured in the
 * same run (STYLE "Tests"):
 *   recall   16 KiB head units from scattered offsets of host memory (pinned with
 *            cudaHostAlloc, and mmap'ed + cudaHostRegister'ed like the kvstored pool), moved
 *            one cudaMemcpyAsync each, as one cudaMemcpyBatchAsync (the DMA recall) and by the
 *            recall_gather kernel through the memory's device alias (the zero-copy recall), vs
 *            one cudaMemcpyAsync of the same bytes; ratio = one / units time (1.0: the units
 *            move as fast as one large copy), and registered units vs the pinned single copy
 *            (target >= 0.85).
 *   decode   decode_attention at B=2048 (64 pages of 32 per KV head), 32 query / 8 KV heads,
 *            d=128, bf16, batch 1/4/8, vs its floor: the bytes it must read over the HBM
 *            bandwidth of a device-to-device cudaMemcpy measured here.
 * Times come from CUDA events over repeated launches after a warm-up. Exit status 0, or 1 with
 * the failing call printed (cuda_check.h). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cuda_runtime.h>

#include "cuda_check.h"
#include "decode_attention.cuh"
#include "recall_gather.cuh"

#define UNIT_BYTES (16u << 10)
#define RECALL_BYTES (64u << 20)      /* one step's worth of recalled units */
#define POOL_BYTES (512ull << 20)     /* host region the units are scattered over */
#define HBM_BYTES (1ull << 30)	      /* d2d copy size for the bandwidth baseline */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ull;
}

/* Milliseconds per repetition of the work queued by fn on stream (after one warm-up call). */
typedef int (*bench_fn)(void *arg, cudaStream_t s);

static int time_ms(bench_fn fn, void *arg, cudaStream_t s, int reps, float *ms)
{
	cudaEvent_t a, b;
	int ret = fn(arg, s);
	if (ret)
		return ret;
	CUDA_CHECK(cudaEventCreate(&a));
	CUDA_CHECK(cudaEventCreate(&b));
	CUDA_CHECK(cudaEventRecord(a, s));
	for (int i = 0; i < reps; i++)
		if ((ret = fn(arg, s)))
			return ret;
	CUDA_CHECK(cudaEventRecord(b, s));
	CUDA_CHECK(cudaEventSynchronize(b));
	CUDA_CHECK(cudaEventElapsedTime(ms, a, b));
	*ms /= (float)reps;
	CUDA_CHECK(cudaEventDestroy(a));
	CUDA_CHECK(cudaEventDestroy(b));
	return 0;
}

struct recall {
	uint8_t *host;	/* POOL_BYTES, pinned or registered */
	uint8_t *dev;	/* RECALL_BYTES staging */
	size_t *off;	/* per unit: offset in host */
	size_t n_units;
	/* the batched copy: per unit destination, source and size */
	void **dsts;
	const void **srcs;
	size_t *sizes;
	/* the gather kernel: device arrays of unit sources (through host's device alias) and of
	 * (slot, head) targets in dev, read as (n_units / GATHER_NKV) slots of 2 x p x n_kv x d */
	const void **g_srcs;
	int32_t *g_dst;
};

/* The gather kernel's geometry: a bf16 unit of 2 x 32 x 128 is 16 KiB. */
enum { GATHER_P = 32, GATHER_D = 128, GATHER_NKV = 8 };

static int recall_units(void *arg, cudaStream_t s)
{
	struct recall *r = arg;
	for (size_t i = 0; i < r->n_units; i++)
		CUDA_CHECK(cudaMemcpyAsync(r->dev + i * UNIT_BYTES, r->host + r->off[i], UNIT_BYTES,
					   cudaMemcpyHostToDevice, s));
	return 0;
}

/* The same units as one cudaMemcpyBatchAsync (backend_cuda_xfer.c's DMA recall). */
static int recall_batch(void *arg, cudaStream_t s)
{
	struct recall *r = arg;
#if CUDART_VERSION >= 13000
	struct cudaMemcpyAttributes attr = { .srcAccessOrder = cudaMemcpySrcAccessOrderStream };
	size_t first = 0;
	CUDA_CHECK(cudaMemcpyBatchAsync(r->dsts, r->srcs, r->sizes, r->n_units, &attr, &first, 1,
					s));
	return 0;
#else
	(void)r;
	(void)s;
	return -ENOTSUP;
#endif
}

/* The same units read by kernels/recall_gather through the host memory's device alias and
 * scattered into slots (backend_cuda_xfer.c's zero-copy recall). */
static int recall_kernel(void *arg, cudaStream_t s)
{
	struct recall *r = arg;
	CUDA_CHECK(recall_gather(r->dev, FKV_BF16, r->g_srcs, 1, FKV_BF16, r->g_dst,
				 (int)r->n_units, GATHER_NKV, GATHER_P, GATHER_D, s));
	return 0;
}

static int recall_one(void *arg, cudaStream_t s)
{
	struct recall *r = arg;
	CUDA_CHECK(cudaMemcpyAsync(r->dev, r->host, r->n_units * UNIT_BYTES,
				   cudaMemcpyHostToDevice, s));
	return 0;
}

/* Times the units and the single copy from host; *ms_units, *ms_one: per repetition. */
/* ms_out: units one copy each, one large copy, units as one batch, units by the gather
 * kernel. */
static int bench_recall_on(const char *what, uint8_t *host, uint8_t *dev, cudaStream_t s,
			   float ms_out[4])
{
	struct recall r = { .host = host, .dev = dev, .n_units = RECALL_BYTES / UNIT_BYTES };
	r.off = malloc(r.n_units * sizeof *r.off);
	if (!r.off)
		return -ENOMEM;
	/* distinct random units of the pool, like the pages a selection names */
	const size_t slots = POOL_BYTES / UNIT_BYTES;
	for (size_t i = 0; i < r.n_units; i++)
		r.off[i] = ((i * (slots / r.n_units)) + rng() % (slots / r.n_units)) * UNIT_BYTES;
	for (size_t i = r.n_units - 1; i > 0; i--) {
		size_t j = rng() % (i + 1), t = r.off[i];
		r.off[i] = r.off[j];
		r.off[j] = t;
	}
	r.dsts = malloc(r.n_units * sizeof *r.dsts);
	r.srcs = malloc(r.n_units * sizeof *r.srcs);
	r.sizes = malloc(r.n_units * sizeof *r.sizes);
	const void **g_srcs = malloc(r.n_units * sizeof *g_srcs);
	int32_t *g_dst = malloc(r.n_units * 2 * sizeof *g_dst);
	uint8_t *alias = NULL;
	int ret = !r.dsts || !r.srcs || !r.sizes || !g_srcs || !g_dst ? -ENOMEM : 0;
	if (!ret && cudaHostGetDevicePointer((void **)&alias, host, 0) != cudaSuccess)
		ret = -ENOTSUP;
	for (size_t i = 0; !ret && i < r.n_units; i++) {
		r.dsts[i] = dev + i * UNIT_BYTES;
		r.srcs[i] = host + r.off[i];
		r.sizes[i] = UNIT_BYTES;
		g_srcs[i] = alias + r.off[i];
		g_dst[2 * i] = (int32_t)(i / GATHER_NKV);
		g_dst[2 * i + 1] = (int32_t)(i % GATHER_NKV);
	}
	if (!ret) {
		CUDA_CHECK(cudaMalloc((void **)&r.g_srcs, r.n_units * sizeof *g_srcs));
		CUDA_CHECK(cudaMalloc((void **)&r.g_dst, r.n_units * 2 * sizeof *g_dst));
		CUDA_CHECK(cudaMemcpy(r.g_srcs, g_srcs, r.n_units * sizeof *g_srcs,
				      cudaMemcpyHostToDevice));
		CUDA_CHECK(cudaMemcpy(r.g_dst, g_dst, r.n_units * 2 * sizeof *g_dst,
				      cudaMemcpyHostToDevice));
	}
	float ms_units = 0, ms_one = 0, ms_batch = 0, ms_kernel = 0;
	if (!ret)
		ret = time_ms(recall_units, &r, s, 10, &ms_units);
	if (!ret)
		ret = time_ms(recall_one, &r, s, 10, &ms_one);
	if (!ret)
		ret = time_ms(recall_batch, &r, s, 10, &ms_batch);
	if (!ret)
		ret = time_ms(recall_kernel, &r, s, 10, &ms_kernel);
	if (!ret) {
		printf("recall %-10s %zu x 16 KiB: %7.3f ms %6.2f GB/s | one %u MiB copy: %7.3f ms "
		       "%6.2f GB/s | ratio %.3f\n",
		       what, r.n_units, ms_units, RECALL_BYTES / ms_units / 1e6, RECALL_BYTES >> 20,
		       ms_one, RECALL_BYTES / ms_one / 1e6, ms_one / ms_units);
		printf("recall %-10s %zu x 16 KiB, one cudaMemcpyBatchAsync: %7.3f ms %6.2f GB/s | "
		       "ratio %.3f\n", what, r.n_units, ms_batch, RECALL_BYTES / ms_batch / 1e6,
		       ms_one / ms_batch);
		printf("recall %-10s %zu x 16 KiB, recall_gather kernel (zero-copy): %7.3f ms "
		       "%6.2f GB/s | ratio %.3f\n", what, r.n_units, ms_kernel,
		       RECALL_BYTES / ms_kernel / 1e6, ms_one / ms_kernel);
	}
	ms_out[0] = ms_units;
	ms_out[1] = ms_one;
	ms_out[2] = ms_batch;
	ms_out[3] = ms_kernel;
	cudaFree(r.g_srcs);
	cudaFree(r.g_dst);
	free(g_srcs);
	free(g_dst);
	free(r.dsts);
	free(r.srcs);
	free(r.sizes);
	free(r.off);
	return ret;
}

static int bench_recall(cudaStream_t s)
{
	uint8_t *dev, *pinned;
	CUDA_CHECK(cudaMalloc((void **)&dev, RECALL_BYTES));
	CUDA_CHECK(cudaHostAlloc((void **)&pinned, POOL_BYTES, cudaHostAllocMapped));
	memset(pinned, 1, POOL_BYTES);
	float pin[4] = { 0 }, reg[4] = { 0 };
	int ret = bench_recall_on("pinned", pinned, dev, s, pin);
	CUDA_CHECK(cudaFreeHost(pinned));
	if (ret)
		return ret;
	uint8_t *pool = mmap(NULL, POOL_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			     -1, 0);
	if (pool == MAP_FAILED)
		return -errno;
	memset(pool, 1, POOL_BYTES);
	cudaError_t e = cudaHostRegister(pool, POOL_BYTES, cudaHostRegisterMapped);
	if (e != cudaSuccess) {
		fprintf(stderr, "recall: cudaHostRegister of %llu MiB failed: %s (memlock limit?)\n",
			POOL_BYTES >> 20, cudaGetErrorString(e));
		munmap(pool, POOL_BYTES);
		return -ENOMEM;
	}
	ret = bench_recall_on("registered", pool, dev, s, reg);
	if (!ret) /* the target: pool-style units against the best single pinned copy */
		printf("recall registered 16 KiB units vs one pinned copy: ratio %.3f one copy "
		       "each, %.3f batched DMA, %.3f gather kernel (target >= 0.85)\n",
		       pin[1] / reg[0], pin[1] / reg[2], pin[1] / reg[3]);
	CUDA_CHECK(cudaHostUnregister(pool));
	munmap(pool, POOL_BYTES);
	CUDA_CHECK(cudaFree(dev));
	return ret;
}

struct d2d {
	void *a, *b;
};

static int d2d_copy(void *arg, cudaStream_t s)
{
	struct d2d *c = arg;
	CUDA_CHECK(cudaMemcpyAsync(c->b, c->a, HBM_BYTES, cudaMemcpyDeviceToDevice, s));
	return 0;
}

/* HBM bandwidth in bytes/ms: a d2d copy reads and writes HBM_BYTES each. */
static int bench_hbm(cudaStream_t s, double *bytes_per_ms)
{
	struct d2d c;
	CUDA_CHECK(cudaMalloc(&c.a, HBM_BYTES));
	CUDA_CHECK(cudaMalloc(&c.b, HBM_BYTES));
	CUDA_CHECK(cudaMemset(c.a, 1, HBM_BYTES));
	float ms = 0;
	int ret = time_ms(d2d_copy, &c, s, 20, &ms);
	if (!ret) {
		*bytes_per_ms = 2.0 * HBM_BYTES / ms;
		printf("hbm d2d cudaMemcpy %llu MiB: %.3f ms, %.0f GB/s (read + write)\n",
		       HBM_BYTES >> 20, ms, *bytes_per_ms / 1e6);
	}
	CUDA_CHECK(cudaFree(c.a));
	CUDA_CHECK(cudaFree(c.b));
	return ret;
}

struct dec {
	float *out, *q;
	void *slots, *ws;
	int32_t *list, *n_tok;
	size_t ws_bytes;
	int batch;
};

enum { DEC_NQ = 32, DEC_NKV = 8, DEC_D = 128, DEC_P = 32, DEC_BUDGET = 2048 };

static int dec_run(void *arg, cudaStream_t s)
{
	struct dec *d = arg;
	CUDA_CHECK(decode_attention(d->out, d->q, d->slots, FKV_BF16, d->list, d->n_tok, d->batch,
				    DEC_NQ, DEC_NKV, DEC_D, DEC_P, DEC_BUDGET / DEC_P,
				    0.08838834764831845f, d->ws, d->ws_bytes, s));
	return 0;
}

static int bench_decode(cudaStream_t s, double hbm_bytes_per_ms, int batch)
{
	const int pages = DEC_BUDGET / DEC_P;
	const size_t slot_bytes = 2ull * DEC_P * DEC_NKV * DEC_D * 2;
	const int n_slots = batch * pages;
	struct dec d = { .batch = batch };
	int32_t *list = malloc((size_t)batch * DEC_NKV * pages * 4);
	int32_t *n_tok = malloc((size_t)batch * DEC_NKV * 4); /* (batch, n_kv) */
	if (!list || !n_tok)
		return -ENOMEM;
	/* each head of each sequence reads every one of its sequence's slots once, in a shuffled
	 * order: per-head indirection with no slice read twice */
	for (int b = 0; b < batch; b++) {
		for (int h = 0; h < DEC_NKV; h++) {
			n_tok[b * DEC_NKV + h] = DEC_BUDGET;
			int32_t *l = list + ((size_t)b * DEC_NKV + h) * pages;
			for (int i = 0; i < pages; i++)
				l[i] = b * pages + i;
			for (int i = pages - 1; i > 0; i--) {
				int j = (int)(rng() % (i + 1)), t = l[i];
				l[i] = l[j];
				l[j] = t;
			}
		}
	}
	CUDA_CHECK(cudaMalloc((void **)&d.out, (size_t)batch * DEC_NQ * DEC_D * 4));
	CUDA_CHECK(cudaMalloc((void **)&d.q, (size_t)batch * DEC_NQ * DEC_D * 4));
	CUDA_CHECK(cudaMemset(d.q, 0x3c, (size_t)batch * DEC_NQ * DEC_D * 4));
	CUDA_CHECK(cudaMalloc(&d.slots, n_slots * slot_bytes));
	CUDA_CHECK(cudaMemset(d.slots, 0x3c, n_slots * slot_bytes));
	CUDA_CHECK(cudaMalloc((void **)&d.list, (size_t)batch * DEC_NKV * pages * 4));
	CUDA_CHECK(cudaMemcpy(d.list, list, (size_t)batch * DEC_NKV * pages * 4,
			      cudaMemcpyHostToDevice));
	CUDA_CHECK(cudaMalloc((void **)&d.n_tok, (size_t)batch * DEC_NKV * 4));
	CUDA_CHECK(cudaMemcpy(d.n_tok, n_tok, (size_t)batch * DEC_NKV * 4,
			      cudaMemcpyHostToDevice));
	d.ws_bytes = decode_attention_workspace_bytes(batch, DEC_NQ, DEC_NKV, DEC_D, pages);
	d.ws = NULL;
	if (d.ws_bytes)
		CUDA_CHECK(cudaMalloc(&d.ws, d.ws_bytes));
	float ms = 0;
	int ret = time_ms(dec_run, &d, s, 200, &ms);
	if (!ret) {
		const double bytes = (double)n_slots * slot_bytes +
				     2.0 * batch * DEC_NQ * DEC_D * 4; /* KV read, q in, out */
		const double floor_ms = bytes / hbm_bytes_per_ms;
		printf("decode_attention bf16 B=%d batch %d (splits %d): %8.2f us | floor %.2f MiB "
		       "at HBM %.2f us | ratio %.2f\n",
		       DEC_BUDGET, batch, decode_attention_splits(batch, DEC_NKV, pages), ms * 1e3,
		       bytes / (1 << 20), floor_ms * 1e3, ms / floor_ms);
	}
	CUDA_CHECK(cudaFree(d.out));
	CUDA_CHECK(cudaFree(d.q));
	CUDA_CHECK(cudaFree(d.slots));
	CUDA_CHECK(cudaFree(d.list));
	CUDA_CHECK(cudaFree(d.n_tok));
	CUDA_CHECK(cudaFree(d.ws));
	free(list);
	free(n_tok);
	return ret;
}

int main(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		fprintf(stderr, "bench_kernels: no CUDA device\n");
		return 1;
	}
	struct cudaDeviceProp prop;
	if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
		printf("device: %s, %d SMs, %.0f GiB\n", prop.name, prop.multiProcessorCount,
		       prop.totalGlobalMem / 1073741824.0);
	cudaStream_t s;
	if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
		return 1;
	double hbm = 0;
	int ret = bench_recall(s);
	if (!ret)
		ret = bench_hbm(s, &hbm);
	const int batches[] = { 1, 4, 8 };
	for (int i = 0; !ret && i < 3; i++)
		ret = bench_decode(s, hbm, batches[i]);
	cudaStreamDestroy(s);
	if (ret)
		fprintf(stderr, "bench_kernels: %s\n", strerror(-ret));
	return ret ? 1 : 0;
}
