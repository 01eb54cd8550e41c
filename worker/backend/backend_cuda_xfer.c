/* backend_cuda_xfer — the CUDA backend's transfers between the host and the device: recall
 * (recall_units; recall_direct, which DMAs each unit from where it lies in the registered pool
 * into the device staging — cudaMemcpyBatchAsync, else a run of cudaMemcpyAsync — with no
 * host copy, then steps 2-4 below as for page-locked units; recall_mapped, the zero-copy
 * variant: kernels/recall_gather reads each unit through the pool's device alias), offload (store_rows) and the page-locking of the kvstored pool mapping
 * (host_register, in CUDA_REGISTER_CHUNK chunks). The ops table and compute are in
 * backend_cuda.c; the shared state in backend_cuda_priv.h.
 *
 * Streams and events (docs/design.md §5 step 6). recall_units (the device half of a policy's recall,
 * called from a recall thread while the engine thread queues compute ops) runs on two streams
 * of its own with two staging sets (double buffering), each set a pinned host buffer and its
 * device twin: [units][(slot, head) table]. A call takes the next set and
 *   1. copies the units into its pinned buffer when they are pageable (a host memcpy, so the
 *      units are consumed on return without any wait), or leaves page-locked units (the
 *      registered pool) to be read by the DMA directly;
 *   2. on the copy stream: waits (device side) for the event "scattered" of the set's previous
 *      use, since the scatter then still read the device staging, and copies units and table
 *      host to device; records "copied";
 *   3. records "entry" on the compute stream; the recall stream waits for "entry" and "copied",
 *      scatters the units into the slots (recall_scatter), records "scattered"; the compute
 *      stream waits for "scattered". So the scatter runs after every op queued before the
 *      call, ops queued after it see the recalled slots, and the copy itself overlaps compute;
 *   4. for page-locked units only, waits on the host for "copied" (the promise that the
 *      caller may reuse the units on return).
 * A set's pinned buffer is rewritten only after its previous "copied" fired; staging growth
 * frees a set only after its previous "scattered" fired (the last event that read it), never
 * after a device-wide wait. recall_mu serialises recall calls (their staging state); CUDA
 * stream and event calls are thread-safe, so the engine thread queues ops meanwhile. sync()
 * and backend_free() drain every stream; download() waits for the compute stream, which has
 * already waited for every recall queued before it.
 *
 * Offload (store_rows, the write-through of appended K/V rows into the pool): the pool mapping
 * is registered Portable | Mapped, and each chunk's device alias (cudaHostGetDevicePointer) is
 * kept, so kernels/offload_gather writes the HND blocks straight into host memory. The rows'
 * buffers belong to the caller and are overwritten by the next layer's projections, so instead
 * of making the compute stream wait for the offload (which would put the PCIe writes on the
 * critical path) a call takes the next of CUDA_OFFLOAD_RING offload slots, each a device
 * buffer [k rows][v rows][block offsets] with a pinned twin of the offsets, and
 *   1. waits on the host for the slot's previous "done" (CUDA_OFFLOAD_RING calls ago, normally
 *      long fired), since that kernel read the device buffer and its copy read the pinned one;
 *   2. on the compute stream copies k, v into the slot (device to device: ordered after the ops
 *      that produced them, before any later op that overwrites them) and records "copied";
 *   3. on the offload stream waits for "copied", copies the offsets host to device, runs
 *      offload_store_rows from the slot into the aliases, records "done".
 * The compute stream never waits for the offload stream; sync() drains it, and that is the
 * fence before a COMMIT or any host read of the stored bytes. host_unregister drains first, so
 * no queued store writes a range being unregistered. A block outside every registration, or
 * across two chunks (their aliases need not be adjacent), is -EOPNOTSUPP before anything is
 * queued: the caller downloads instead. */
#include "backend_cuda_priv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "offload_gather.cuh"
#include "recall_gather.cuh"
#include "recall_scatter.cuh"
#include "spin.cuh"

static void unregister_all(struct cuda_ctx *c)
{
	for (size_t i = 0; i < c->n_regs; i++) {
		for (size_t off = 0; off < c->regs[i].bytes; off += CUDA_REGISTER_CHUNK)
			cudaHostUnregister(c->regs[i].ptr + off);
		free(c->regs[i].alias);
	}
	free(c->regs);
	c->regs = NULL;
	c->n_regs = 0;
}

/* Takes the next recall set with room for bytes. Its pinned buffer is free once its previous
 * copy ran; growth also frees the device twin, last read by the previous scatter. */
static int recall_take(struct cuda_ctx *c, size_t bytes, struct recall_set **out)
{
	struct recall_set *s = &c->rc[c->rc_next];
	c->rc_next = (c->rc_next + 1) % CUDA_RECALL_SETS;
	if (s->used)
		CUDA_CHECK(cudaEventSynchronize(s->copied));
	if (bytes > s->cap) {
		if (s->used)
			CUDA_CHECK(cudaEventSynchronize(s->scattered));
		size_t cap = bytes < ((size_t)1 << 20) ? (size_t)1 << 20 : bytes + bytes / 2;
		cudaFreeHost(s->host);
		cudaFree(s->dev);
		s->host = NULL;
		s->dev = NULL;
		s->cap = 0;
		s->used = 0;
		CUDA_CHECK(cudaMallocHost((void **)&s->host, cap));
		CUDA_CHECK(cudaMalloc((void **)&s->dev, cap));
		s->cap = cap;
	}
	*out = s;
	return 0;
}

/* Step 3's last act: the compute stream waits for "scattered" now, or (a per-layer fence
 * `done`) the scatter's completion is marked on done for a later fence_stream_wait, and the
 * compute stream runs on meanwhile (docs/design.md §5 step 6). */
static cudaError_t order_after(struct cuda_ctx *c, cudaEvent_t scattered, cudaEvent_t done)
{
	if (!done)
		return cudaStreamWaitEvent(c->stream, scattered, 0);
	return cudaEventRecord(done, c->rc_stream);
}

/* The n units at srcs[i] (ub bytes each, where they lie in host memory) into dev, unit i at
 * i * ub, on stream: one batched call where the toolkit has cudaMemcpyBatchAsync (the sources
 * read in stream order), else a run of cudaMemcpyAsync. */
/* Units srcs[0..n) (ub bytes each) into dev back to back, in pieces of `piece` bytes (ub: one
 * transfer a unit; less: the per-token pieces of the layout ablation), as one batch where the
 * toolkit has cudaMemcpyBatchAsync, else one cudaMemcpyAsync a piece. */
static int dma_units(char *dev, const void *const *srcs, int n, size_t ub, size_t piece,
		     cudaStream_t stream)
{
	const size_t k = ub / piece, m = (size_t)n * k;
#if CUDART_VERSION >= 12080
	void **dsts = malloc(m * sizeof *dsts);
	const void **from = malloc(m * sizeof *from);
	size_t *sizes = malloc(m * sizeof *sizes);
	if (!dsts || !from || !sizes) {
		free(dsts);
		free(from);
		free(sizes);
		return -ENOMEM;
	}
	for (size_t i = 0; i < m; i++) {
		dsts[i] = dev + i * piece;
		from[i] = (const char *)srcs[i / k] + (i % k) * piece;
		sizes[i] = piece;
	}
	struct cudaMemcpyAttributes attr = { .srcAccessOrder = cudaMemcpySrcAccessOrderStream };
	size_t first = 0;
#if CUDART_VERSION >= 13000
	cudaError_t e = cudaMemcpyBatchAsync(dsts, from, sizes, m, &attr, &first, 1, stream);
#else
	size_t fail = 0;
	cudaError_t e = cudaMemcpyBatchAsync(dsts, (void **)from, sizes, m, &attr, &first, 1,
					     &fail, stream);
#endif
	free(dsts);
	free(from);
	free(sizes);
	if (e != cudaSuccess)
		return cuda_check_fail(e, "cudaMemcpyBatchAsync", __func__, __FILE__, __LINE__);
#else
	for (size_t i = 0; i < m; i++)
		CUDA_CHECK(cudaMemcpyAsync(dev + i * piece, (const char *)srcs[i / k] + (i % k) * piece,
					   piece, cudaMemcpyHostToDevice, stream));
#endif
	return 0;
}

/* With recall_mu held; the steps of the header comment. Slot indices count from the lowest slot
 * address when every slot lies a whole number of slots from it (one layer's slot buffer: one
 * launch); otherwise each unit is its own launch with its slot as the base. The units are
 * units[0..n) back to back, or (recall_direct, srcs not NULL) each where srcs[i] says, DMA'd
 * from there: no host copy, and the call waits for "copied" like page-locked units. */
static int recall_locked(struct cuda_ctx *c, void *const *slots, const int *heads,
			 const void *units, const void *const *srcs, int n, int p, int n_kv, int d,
			 enum fkv_dtype dt, enum fkv_dtype sdt, bool by_row, cudaEvent_t done)
{
	const size_t ub = (size_t)2 * p * d * dtype_size(dt);
	const size_t sb = (size_t)2 * p * n_kv * d * dtype_size(sdt);
	const size_t ubytes = (size_t)n * ub;
	const size_t toff = (ubytes + CUDA_RECALL_ALIGN - 1) / CUDA_RECALL_ALIGN * CUDA_RECALL_ALIGN;
	const size_t tbytes = (size_t)n * 2 * sizeof(int32_t);
	CUDA_CHECK(cudaSetDevice(c->device));
	struct cudaPointerAttributes at;
	const bool locked = srcs || (cudaPointerGetAttributes(&at, units) == cudaSuccess &&
				     at.type == cudaMemoryTypeHost);
	(void)cudaGetLastError();
	struct recall_set *s;
	int ret = recall_take(c, toff + tbytes, &s);
	if (ret)
		return ret;

	char *base = slots[0];
	for (int i = 1; i < n; i++)
		if ((char *)slots[i] < base)
			base = slots[i];
	bool one = true;
	for (int i = 0; i < n && one; i++) {
		size_t off = (size_t)((char *)slots[i] - base);
		one = off % sb == 0 && off / sb <= INT32_MAX;
	}
	int32_t *tab = (int32_t *)(s->host + toff);
	for (int i = 0; i < n; i++) {
		tab[2 * i] = one ? (int32_t)((size_t)((char *)slots[i] - base) / sb) : 0;
		tab[2 * i + 1] = heads[i];
	}
	if (!locked)
		memcpy(s->host, units, ubytes);

	if (s->used)
		CUDA_CHECK(cudaStreamWaitEvent(c->rc_copy, s->scattered, 0));
	s->used = 1;
	if (srcs) {
		int r2 = dma_units(s->dev, srcs, n, ub, by_row ? (size_t)d * dtype_size(dt) : ub,
				   c->rc_copy);
		if (r2)
			return r2;
		CUDA_CHECK(cudaMemcpyAsync(s->dev + toff, tab, tbytes, cudaMemcpyHostToDevice,
					   c->rc_copy));
	} else if (locked) {
		CUDA_CHECK(cudaMemcpyAsync(s->dev, units, ubytes, cudaMemcpyHostToDevice,
					   c->rc_copy));
		CUDA_CHECK(cudaMemcpyAsync(s->dev + toff, tab, tbytes, cudaMemcpyHostToDevice,
					   c->rc_copy));
	} else {
		CUDA_CHECK(cudaMemcpyAsync(s->dev, s->host, toff + tbytes, cudaMemcpyHostToDevice,
					   c->rc_copy));
	}
	CUDA_CHECK(cudaEventRecord(s->copied, c->rc_copy));

	CUDA_CHECK(cudaEventRecord(c->rc_entry, c->stream));
	CUDA_CHECK(cudaStreamWaitEvent(c->rc_stream, c->rc_entry, 0));
	CUDA_CHECK(cudaStreamWaitEvent(c->rc_stream, s->copied, 0));
	const int32_t *dtab = (const int32_t *)(s->dev + toff);
	cudaError_t se = spin_cycles(c->recall_lag, c->rc_stream);
	if (one && se == cudaSuccess)
		se = recall_scatter(base, sdt, s->dev, dt, dtab, n, n_kv, p, d, c->rc_stream);
	for (int i = 0; !one && i < n && se == cudaSuccess; i++)
		se = recall_scatter(slots[i], sdt, s->dev + i * ub, dt, dtab + 2 * i, 1, n_kv,
				    p, d, c->rc_stream);
	/* Recorded and waited for after a failed launch too: the launches before it still read
	 * the staging (the set's next use waits for them) and write slots (later ops wait). */
	CUDA_CHECK(cudaEventRecord(s->scattered, c->rc_stream));
	CUDA_CHECK(order_after(c, s->scattered, done));
	if (locked)
		CUDA_CHECK(cudaEventSynchronize(s->copied));
	if (se != cudaSuccess)
		return cuda_check_fail(se, "recall_scatter", __func__, __FILE__, __LINE__);
	return 0;
}

/* The checks every recall entry point shares, then recall_locked under recall_mu: units back to
 * back (srcs NULL) or each where srcs[i] says, moved whole or by_row. */
static int recall_checked(struct cuda_ctx *c, void *const *slots, const int *heads,
			  const void *units, const void *const *srcs, int n, int p, int n_kv,
			  int d, enum fkv_dtype unit_dt, enum fkv_dtype slot_dt, bool by_row,
			  void *done)
{
	if (n < 0 || p <= 0 || n_kv <= 0 || d <= 0 ||
	    (unit_dt != FKV_F32 && unit_dt != FKV_F16 && unit_dt != FKV_BF16) ||
	    (slot_dt != FKV_F32 && slot_dt != FKV_F16 && slot_dt != FKV_BF16))
		return -EINVAL;
	for (int i = 0; i < n; i++)
		if (heads[i] < 0 || heads[i] >= n_kv || !slots[i] || (srcs && !srcs[i]))
			return -EINVAL;
	if (!n)
		return 0;
	pthread_mutex_lock(&c->recall_mu);
	int ret = recall_locked(c, slots, heads, units, srcs, n, p, n_kv, d, unit_dt, slot_dt,
				by_row, (cudaEvent_t)done);
	pthread_mutex_unlock(&c->recall_mu);
	return ret;
}

int cuda_recall_units(void *ctx, void *const *slots, const int *heads, const void *units,
		      int n, int p, int n_kv, int d, enum fkv_dtype unit_dt,
		      enum fkv_dtype slot_dt, void *done)
{
	return recall_checked(ctx, slots, heads, units, NULL, n, p, n_kv, d, unit_dt, slot_dt,
			      false, done);
}

int cuda_recall_direct(void *ctx, void *const *slots, const int *heads, const void *const *srcs,
		       int n, int p, int n_kv, int d, enum fkv_dtype unit_dt,
		       enum fkv_dtype slot_dt, void *done)
{
	return recall_checked(ctx, slots, heads, NULL, srcs, n, p, n_kv, d, unit_dt, slot_dt,
			      false, done);
}

int cuda_recall_fragmented(void *ctx, void *const *slots, const int *heads,
			   const void *const *srcs, int n, int p, int n_kv, int d,
			   enum fkv_dtype unit_dt, enum fkv_dtype slot_dt, void *done)
{
	return recall_checked(ctx, slots, heads, NULL, srcs, n, p, n_kv, d, unit_dt, slot_dt,
			      true, done);
}

/* The device alias of the host range [p, p + bytes), inside one chunk of one registration. */
static char *alias_of(const struct cuda_ctx *c, const char *p, size_t bytes)
{
	for (size_t i = 0; i < c->n_regs; i++) {
		const struct host_reg *r = &c->regs[i];
		if (p < r->ptr || p - r->ptr > (ptrdiff_t)r->bytes ||
		    bytes > r->bytes - (size_t)(p - r->ptr))
			continue;
		size_t off = (size_t)(p - r->ptr), ch = off / CUDA_REGISTER_CHUNK;
		if ((off + bytes - 1) / CUDA_REGISTER_CHUNK != ch || !r->alias[ch])
			return NULL;
		return r->alias[ch] + (off - ch * CUDA_REGISTER_CHUNK);
	}
	return NULL;
}

/* With recall_mu held: the zero-copy recall. The table [n device aliases][(n, 2) (slot, head)]
 * goes through a recall set like the units' table (steps 2-3 of the header comment, with no
 * units staged); recall_gather reads every unit through its alias. The units are read by the
 * kernel, so the call waits on the host for "scattered" (the caller unpins them on return). */
static int mapped_locked(struct cuda_ctx *c, void *const *slots, const int *heads,
			 char *const *alias, bool aligned, int n, int p, int n_kv, int d,
			 enum fkv_dtype dt, enum fkv_dtype sdt, cudaEvent_t done)
{
	const size_t sb = (size_t)2 * p * n_kv * d * dtype_size(sdt);
	const size_t pbytes = (size_t)n * sizeof(void *), tbytes = (size_t)n * 2 * sizeof(int32_t);
	struct recall_set *s;
	int ret = recall_take(c, pbytes + tbytes, &s);
	if (ret)
		return ret;
	char *base = slots[0];
	for (int i = 1; i < n; i++)
		if ((char *)slots[i] < base)
			base = slots[i];
	bool one = true;
	for (int i = 0; i < n && one; i++) {
		size_t off = (size_t)((char *)slots[i] - base);
		one = off % sb == 0 && off / sb <= INT32_MAX;
	}
	memcpy(s->host, alias, pbytes);
	int32_t *tab = (int32_t *)(s->host + pbytes);
	for (int i = 0; i < n; i++) {
		tab[2 * i] = one ? (int32_t)((size_t)((char *)slots[i] - base) / sb) : 0;
		tab[2 * i + 1] = heads[i];
	}
	if (s->used)
		CUDA_CHECK(cudaStreamWaitEvent(c->rc_copy, s->scattered, 0));
	s->used = 1;
	CUDA_CHECK(cudaMemcpyAsync(s->dev, s->host, pbytes + tbytes, cudaMemcpyHostToDevice,
				   c->rc_copy));
	CUDA_CHECK(cudaEventRecord(s->copied, c->rc_copy));
	CUDA_CHECK(cudaEventRecord(c->rc_entry, c->stream));
	CUDA_CHECK(cudaStreamWaitEvent(c->rc_stream, c->rc_entry, 0));
	CUDA_CHECK(cudaStreamWaitEvent(c->rc_stream, s->copied, 0));
	const void *const *dsrc = (const void *const *)s->dev;
	const int32_t *dtab = (const int32_t *)(s->dev + pbytes);
	cudaError_t ge = spin_cycles(c->recall_lag, c->rc_stream);
	if (one && ge == cudaSuccess)
		ge = recall_gather(base, sdt, dsrc, aligned, dt, dtab, n, n_kv, p, d, c->rc_stream);
	for (int i = 0; !one && i < n && ge == cudaSuccess; i++)
		ge = recall_gather(slots[i], sdt, dsrc + i, aligned, dt, dtab + 2 * i, 1, n_kv, p,
				   d, c->rc_stream);
	CUDA_CHECK(cudaEventRecord(s->scattered, c->rc_stream));
	CUDA_CHECK(order_after(c, s->scattered, done));
	CUDA_CHECK(cudaEventSynchronize(s->scattered));
	if (ge != cudaSuccess)
		return cuda_check_fail(ge, "recall_gather", __func__, __FILE__, __LINE__);
	return 0;
}

int cuda_recall_mapped(void *ctx, void *const *slots, const int *heads, const void *const *srcs,
		       int n, int p, int n_kv, int d, enum fkv_dtype unit_dt,
		       enum fkv_dtype slot_dt, void *done)
{
	struct cuda_ctx *c = ctx;
	if (n < 0 || p <= 0 || n_kv <= 0 || d <= 0 ||
	    (unit_dt != FKV_F32 && unit_dt != FKV_F16 && unit_dt != FKV_BF16) ||
	    (slot_dt != FKV_F32 && slot_dt != FKV_F16 && slot_dt != FKV_BF16))
		return -EINVAL;
	for (int i = 0; i < n; i++)
		if (heads[i] < 0 || heads[i] >= n_kv || !slots[i] || !srcs[i])
			return -EINVAL;
	if (!n)
		return 0;
	const size_t ub = (size_t)2 * p * d * dtype_size(unit_dt);
	char **alias = malloc((size_t)n * sizeof *alias);
	if (!alias)
		return -ENOMEM;
	pthread_mutex_lock(&c->recall_mu);
	int ret = cudaSetDevice(c->device) == cudaSuccess ? 0 : -EIO;
	bool aligned = true;
	for (int i = 0; i < n && !ret; i++) {
		alias[i] = alias_of(c, srcs[i], ub);
		if (!alias[i])
			ret = -EOPNOTSUPP; /* not in a mapped registration: nothing queued */
		else
			aligned &= (uintptr_t)alias[i] % 16 == 0;
	}
	if (!ret)
		ret = mapped_locked(c, slots, heads, alias, aligned, n, p, n_kv, d, unit_dt,
				    slot_dt, (cudaEvent_t)done);
	pthread_mutex_unlock(&c->recall_mu);
	free(alias);
	return ret;
}

/* Takes the next offload slot with room for dev_bytes on the device and nb offsets; step 1 of
 * the header comment. Growth frees buffers whose last readers have run (done fired). */
static int offload_take(struct cuda_ctx *c, size_t dev_bytes, int nb, struct offload_slot **out)
{
	struct offload_slot *s = &c->off[c->off_next];
	c->off_next = (c->off_next + 1) % CUDA_OFFLOAD_RING;
	if (s->used)
		CUDA_CHECK(cudaEventSynchronize(s->done));
	if ((size_t)nb > s->host_cap) {
		size_t cap = nb < 64 ? 64 : 2 * (size_t)nb;
		cudaFreeHost(s->host);
		s->host = NULL;
		s->host_cap = 0;
		CUDA_CHECK(cudaMallocHost((void **)&s->host, cap * sizeof *s->host));
		s->host_cap = cap;
	}
	if (dev_bytes > s->dev_cap) {
		size_t cap = dev_bytes < ((size_t)1 << 16) ? (size_t)1 << 16 : 2 * dev_bytes;
		cudaFree(s->dev);
		s->dev = NULL;
		s->dev_cap = 0;
		CUDA_CHECK(cudaMalloc((void **)&s->dev, cap));
		s->dev_cap = cap;
	}
	*out = s;
	return 0;
}

/* Steps 2 and 3 of the header comment for n_tok <= CUDA_OFFLOAD_TOKENS tokens, the first at row
 * t0 of blocks[0]; every block has an alias (checked by the caller). Block i is written at
 * element offset off[i] of the first block's alias. */
static int store_piece(struct cuda_ctx *c, void *const *blocks, int t0, const float *k,
		       const float *v, int n_tok, int p, int n_kv, int d, enum fkv_dtype dt)
{
	const size_t es = dtype_size(dt);
	const size_t block_bytes = (size_t)n_kv * 2 * p * d * es;
	const size_t rows = (size_t)n_tok * n_kv * d * sizeof(float);
	const size_t toff = (2 * rows + CUDA_RECALL_ALIGN - 1) / CUDA_RECALL_ALIGN *
			    CUDA_RECALL_ALIGN;
	const int nb = (t0 + n_tok + p - 1) / p;
	struct offload_slot *s;
	int ret = offload_take(c, toff + (size_t)nb * sizeof(int64_t), nb, &s);
	if (ret)
		return ret;
	char *base = alias_of(c, blocks[0], block_bytes);
	for (int b = 0; b < nb; b++)
		s->host[b] = (int64_t)((alias_of(c, blocks[b], block_bytes) - base) /
				       (ptrdiff_t)es);
	float *dk = (float *)s->dev, *dv = (float *)(s->dev + rows);
	int64_t *dtab = (int64_t *)(s->dev + toff);
	CUDA_CHECK(cudaMemcpyAsync(dk, k, rows, cudaMemcpyDeviceToDevice, c->stream));
	CUDA_CHECK(cudaMemcpyAsync(dv, v, rows, cudaMemcpyDeviceToDevice, c->stream));
	CUDA_CHECK(cudaEventRecord(s->copied, c->stream));
	CUDA_CHECK(cudaStreamWaitEvent(c->off_stream, s->copied, 0));
	s->used = 1;
	CUDA_CHECK(cudaMemcpyAsync(dtab, s->host, (size_t)nb * sizeof(int64_t),
				   cudaMemcpyHostToDevice, c->off_stream));
	cudaError_t le = offload_store_rows(base, dt, dtab, dk, dv, n_tok, t0, n_kv, p, d,
					    c->off_stream);
	/* Recorded after a failed launch too: the table copy before it still reads s->host. */
	CUDA_CHECK(cudaEventRecord(s->done, c->off_stream));
	if (le != cudaSuccess)
		return cuda_check_fail(le, "offload_store_rows", __func__, __FILE__, __LINE__);
	return 0;
}

/* Every block is checked before anything is queued (-EOPNOTSUPP leaves nothing behind); the
 * rows then go in pieces of CUDA_OFFLOAD_TOKENS, so a prefill's slots stay small. */
int cuda_store_rows(void *ctx, void *const *blocks, int t0, const float *k, const float *v,
			   int n_tok, int p, int n_kv, int d, enum fkv_dtype dt)
{
	struct cuda_ctx *c = ctx;
	if (t0 < 0 || t0 >= p || n_tok < 0 || n_kv <= 0 || d <= 0 ||
	    (dt != FKV_F32 && dt != FKV_F16 && dt != FKV_BF16))
		return -EINVAL;
	if (!n_tok)
		return 0;
	const ptrdiff_t es = (ptrdiff_t)dtype_size(dt);
	const size_t block_bytes = (size_t)n_kv * 2 * p * d * (size_t)es;
	const int nb = (int)(((int64_t)t0 + n_tok + p - 1) / p);
	const char *a0 = alias_of(c, blocks[0], block_bytes);
	for (int b = 0; b < nb; b++) {
		const char *a = alias_of(c, blocks[b], block_bytes);
		if (!a || !a0 || (a - a0) % es)
			return -EOPNOTSUPP;
	}
	const size_t row = (size_t)n_kv * d;
	for (int i = 0; i < n_tok;) {
		int m = n_tok - i < CUDA_OFFLOAD_TOKENS ? n_tok - i : CUDA_OFFLOAD_TOKENS;
		int64_t at = (int64_t)t0 + i;
		int ret = store_piece(c, blocks + at / p, (int)(at % p), k + i * row, v + i * row,
				      m, p, n_kv, d, dt);
		if (ret)
			return ret;
		i += m;
	}
	return 0;
}

int cuda_host_register(void *ctx, void *ptr, size_t bytes, char *err, size_t errlen)
{
	struct cuda_ctx *c = ctx;
	struct host_reg *nr = realloc(c->regs, (c->n_regs + 1) * sizeof *nr);
	if (!nr)
		return -ENOMEM;
	c->regs = nr;
	char **alias = calloc((bytes + CUDA_REGISTER_CHUNK - 1) / CUDA_REGISTER_CHUNK + 1,
			      sizeof *alias);
	if (!alias) {
		snprintf(err, errlen, "out of memory for the registration of %zu bytes", bytes);
		return -ENOMEM;
	}
	for (size_t off = 0; off < bytes; off += CUDA_REGISTER_CHUNK) {
		size_t len = bytes - off < CUDA_REGISTER_CHUNK ? bytes - off : CUDA_REGISTER_CHUNK;
		cudaError_t e = cudaHostRegister((char *)ptr + off, len,
						 cudaHostRegisterPortable | cudaHostRegisterMapped);
		if (e == cudaSuccess) {
			/* Without an alias the chunk still serves DMA; store_rows falls back. */
			void *dp = NULL;
			if (cudaHostGetDevicePointer(&dp, (char *)ptr + off, 0) == cudaSuccess)
				alias[off / CUDA_REGISTER_CHUNK] = dp;
			(void)cudaGetLastError();
			continue;
		}
		(void)cudaGetLastError();
		free(alias);
		for (size_t o = 0; o < off; o += CUDA_REGISTER_CHUNK)
			cudaHostUnregister((char *)ptr + o);
		if (e == cudaErrorHostMemoryAlreadyRegistered) {
			snprintf(err, errlen, "host range at offset %zu is already page-locked", off);
			return -EEXIST;
		}
		snprintf(err, errlen,
			 "cannot page-lock %zu bytes of the KV pool for DMA (cudaHostRegister at "
			 "offset %zu: %s); raise the locked-memory limit: LimitMEMLOCK=infinity "
			 "in the unit, or ulimit -l / memlock in limits.conf",
			 bytes, off, cudaGetErrorString(e));
		return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
	}
	c->regs[c->n_regs++] = (struct host_reg){ ptr, bytes, alias };
	return 0;
}

int cuda_host_unregister(void *ctx, void *ptr)
{
	struct cuda_ctx *c = ctx;
	for (size_t i = 0; i < c->n_regs; i++) {
		if (c->regs[i].ptr != ptr)
			continue;
		int ret = cuda_drain(c); /* queued stores may still write the range */
		if (ret)
			return ret;
		for (size_t off = 0; off < c->regs[i].bytes; off += CUDA_REGISTER_CHUNK)
			cudaHostUnregister(c->regs[i].ptr + off);
		free(c->regs[i].alias);
		c->regs[i] = c->regs[--c->n_regs];
		return 0;
	}
	return -ENOENT;
}

void cuda_xfer_free(struct cuda_ctx *c)
{
	for (int i = 0; i < CUDA_RECALL_SETS; i++) {
		cudaFreeHost(c->rc[i].host);
		cudaFree(c->rc[i].dev);
		cuda_event_destroy(c->rc[i].copied);
		cuda_event_destroy(c->rc[i].scattered);
	}
	cuda_event_destroy(c->rc_entry);
	for (int i = 0; i < CUDA_OFFLOAD_RING; i++) {
		cudaFreeHost(c->off[i].host);
		cudaFree(c->off[i].dev);
		cuda_event_destroy(c->off[i].copied);
		cuda_event_destroy(c->off[i].done);
	}
	unregister_all(c);
}
