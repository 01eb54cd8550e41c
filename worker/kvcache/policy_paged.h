/* policy_paged — the device-side paged KV state the retrieval policies share (streaming, quest,
 * freekv, hardkv; docs/design.md §3, §5), and the seam through which each of them decides what a
 * compressed decode step attends to.
 *
 * Per sequence and layer, on the backend: B/p NHD slots (2, p, n_kv, d) in the slot dtype
 * (the backend's slot_dtype: the KV dtype on CUDA, f32 on the CPU) — S/p sink slots
 * (pages 0..S/p-1), W/p window slots (a ring: page j >= S/p lives in ring slot (j - S/p) % (W/p)
 * while it is in the window) and k = (B-S-W)/p selected slots, each head's slice of which may
 * hold a different host page (res). A page leaving the window moves into the selected slots
 * while there is room (the sequence still fits the budget, so every policy attends to
 * everything), and afterwards only when the strategy keeps recent pages (streaming); otherwise
 * it stays in the host copy until selected. Also per layer: min/max key summaries of every full
 * page and the last query (backend buffers: summaries are built by the
 * page_summary op when a page fills, selection and the correction check are the select_pages
 * and group_cosine ops, so no page or query is downloaded in decode under top-k selection;
 * top-p selection and its calibration run topp.c on the host, so those runs also keep a host
 * copy of the summaries, downloaded page by page, and download the query at compressed
 * steps), and the counters.
 *
 * Dense prefill reads the past from the slots while everything fits, else from the host copy.
 * The first `full_layers` layers are a nested `full` state. Slots are backend buffers (in the
 * KV dtype on CUDA, f32 on the CPU: either way they hold the host copy's values exactly)
 * touched only through backend ops — upload (appended prefill rows, converted on the host),
 * copy and round_to (appended decode rows into f32 slots, where the backend has round_to) or
 * convert (into 16-bit slots), copy (pages leaving the
 * window, dense prefill), page_summary, select_pages, group_cosine (selection), download (the
 * selection's page lists, the debug checks), recall_units (recall) and decode attention — so the same code runs on the CPU and the CUDA backend. A decode step hands
 * each KV head's pages to attn_decode_slots as a slot list (sink, selected, window pages in
 * ascending page order, the partial tail last) and a token count per head (a head attends
 * between 1 and k selected pages under top-p selection, exactly k otherwise: rows of selected
 * pages are -1 past a head's count) when the backend has that op; attn_decode_heads
 * over the same pages as spans is the fallback (a backend without the op, or a page list that
 * breaks the op's contract, which the paged layout never produces).
 * Everything here is owned by the paged state (paged_create / destroy); strategies borrow it. */
#ifndef FREEKV_POLICY_PAGED_H
#define FREEKV_POLICY_PAGED_H

#include <stdbool.h>
#include <stdint.h>

#include "kv_writethrough.h"
#include "kvcache.h"
#include "recall.h"
#include "select.h"

struct paged;

struct paged_layer {
	char *slots;	       /* backend buffer: (n_slots, 2, p, n_kv, d) in the slot dtype */
	int *res;	       /* (k_sel, n_kv): host page held by selected slot s for head h, -1 */
	int *target;	       /* (n_kv, k_sel): pages the last selection chose, ascending */
	int *fresh;	       /* (n_kv, k_sel): a selection not yet applied to every head */
	bool have_target;
	float *kmin, *kmax;    /* backend buffers: (n_kv, page_cap, d) summaries of full pages */
	uint8_t *res_mask;     /* (n_kv, page_cap) select_pages' resident mask, rebuilt from res */
	int page_cap;	       /* pages the summaries hold (grown by doubling) */
	float *dq;	       /* backend buffer: (n_q, d) the previous query at this layer */
	bool have_q;
	int32_t *dsel;	       /* backend buffer: select_pages' pages, changed (n_kv, k_sel) each,
				* then n_changed (n_kv) */
	int32_t *hsel;	       /* host_alloc'd (or malloc'd) image of dsel */
	void *fence;	       /* download_async of dsel into hsel (NULL: downloads wait) */
	float *dcos;	       /* backend buffer: (n_kv) group_cosine's output */
	/* Debug checks only: the previous query on the host. */
	float *q_last;	       /* (n_q, d) */
	/* Host selection scratch (debug checks, top-p): of the compute thread, and of the copy
	 * thread (top-p only); floats, or doubles under top-p (topp_scratch_doubles). */
	float *scratch_c, *scratch_r;
	/* Top-p only (NULL under top-k): host copies of the summaries, (n_kv, page_cap, d) each,
	 * and the query and layout the copy thread selects with (paged_select_start). */
	float *hkmin, *hkmax;
	float *q_spec;	       /* (n_q, d) */
	struct select_layout spec_lay;
	int *att;	       /* (n_kv, k_sel): pages the current step attends to */
	/* For the debug checks, set by the strategy at each compressed decode step: */
	uint8_t *att_now;      /* (n_kv): att of the head was selected with this step's query */
	bool prev_valid;       /* the others' att was selected with q_last at prev_lay */
	struct select_layout prev_lay;
	struct recall_unit *units_c; /* (n_kv * k_sel) blocking recall plan */
	struct recall_unit *units_r; /* (n_kv * k_sel) speculative recall plan */
	uint64_t ticket;       /* pending speculative recall of this layer (0: none) */
	void *rc_done;	       /* its per-layer recall event (a backend fence), or NULL */
	/* Set by the compute thread before submitting a speculative job, read by the copy thread. */
	bool spec_select;      /* the copy thread takes paged_select_start's selection first */
	uint8_t *spec_heads;   /* (n_kv): heads whose changed pages the job recalls */
	int64_t spec_ns_select; /* written by the copy thread, folded in after the wait */
	struct paged *owner;
	int layer;
	struct kv_layer_stats st;
	/* Top-p selection on calibrated scores (policy_hardkv.c, docs/design.md §5 "hardkv"): */
	int8_t *theta_k;       /* (n_kv): head h's temperature is 2^(theta_k[h] / 2) */
	int8_t *theta_k_prev;  /* (n_kv): theta_k as the previous step's selections saw it */
	int since_cal;	       /* compressed steps since the last calibration; -1: none yet */
	/* Prefill: every position of the layer dense on the backend, (dense_cap, n_kv, d) in
	 * the slot dtype, the first dense_len valid; kept from one prefill step to the next (a
	 * long prompt's chunks never re-read the past), freed when decode begins. */
	char *dense_k, *dense_v;
	int64_t dense_cap, dense_len;
};

/* What makes streaming, quest, freekv and hardkv differ. */
struct paged_strategy {
	const char *name;
	bool recalls;	  /* selects and recalls from the host copy (needs host) */
	bool keep_recent; /* pages leaving the window stay in the selected slots, oldest out */
	/* A compressed decode step at a retrieval layer: fill L->att with the pages each head
	 * attends besides sink and window (n_kv rows of k_sel, ascending) and make them resident.
	 * q (n_q, d) is the step's query, a backend buffer (docs/design.md "The GPU decode step":
	 * no query download in decode under top-k; select with paged_select; under top-p s->hq
	 * holds its host copy); lay the layout at the current length. */
	int (*before_attend)(struct paged *s, struct paged_layer *L, const float *q,
			     const struct select_layout *lay);
	/* (optional) After the step's attention at that layer. */
	int (*after_attend)(struct paged *s, struct paged_layer *L, const float *q,
			    const struct select_layout *lay);
	bool top_p;	      /* --kv-top-p applies: selection by calibrated mass (policy_hardkv.c) */
	float top_p_default;  /* P when --kv-top-p is not given; 0: top-k */
};

struct paged {
	struct kv_seq_params p;
	const struct paged_strategy *strat;
	struct select_geom g;
	int n_sink, n_win, k_sel, n_slots; /* pages / slots */
	size_t slot_floats;	/* elements of a slot: 2 * p * n_kv * d */
	enum fkv_dtype sdt;	/* the slots' dtype: the backend's slot_dtype, else f32 */
	size_t es;		/* bytes of an sdt element */
	size_t slot_bytes;	/* slot_floats elements of sdt */
	int64_t len, pending;
	int full_layers;
	void *full;		/* nested `full` state for layers < full_layers, or NULL */
	struct paged_layer *L;	/* n_layers; entries below full_layers unused */
	double top_p;		/* P of top-p selection; 0: top-k */
	int recal;		/* R: compressed steps between calibrations */
	struct kv_wt wt;
	struct recall *rc;	/* recall stream (strategies that recall) */
	float *hq;		/* (n_q, d) host copy of the step's query (debug checks, top-p) */
	struct backend_kv_span *spans; /* (n_kv * n_slots) */
	int *span_page;		/* (n_kv * n_slots): the page each span holds */
	int *first;		/* (n_kv + 1) */
	int32_t *slot_list;	/* (n_kv, n_slots): head h's i-th span is slot_list[h][i] */
	int32_t *head_tok;	/* (n_kv): tokens head h's slot list holds */
	float *chk;		/* host scratch for the debug checks: (2, p, d) block dtype bytes */
	float *hslot;		/* host scratch: one slot downloaded, (2, p, n_kv, d) f32 */
	void *hraw;		/* ... as the backend holds it, slot_bytes */
	int64_t attended;
	/* The layout of the decode step paged_attend_prepare left for paged_attend_finish. */
	struct select_layout batch_lay;
};

int paged_create(const struct kv_seq_params *p, const struct paged_strategy *strat, void **st);
void paged_destroy(void *st);
int paged_step_begin(void *st, int64_t n);
int paged_append(void *st, int layer, const float *k, const float *v, int64_t n);
int paged_attend(void *st, int layer, float *out, const float *q, int64_t n);
int paged_attend_prepare(void *st, int layer, float *out, const float *q, int64_t n,
			 struct backend_attn_item *it);
int paged_attend_finish(void *st, int layer, const float *q, int64_t ns);
void paged_step_end(void *st);
int64_t paged_length(void *st);
void paged_stats(void *st, struct kv_stats *out);
int paged_layer_stats(void *st, int layer, struct kv_layer_stats *out);
int paged_restore(void *st, int64_t len);

/* Helpers for strategies. */
/* NHD slot s of a layer. */
void *paged_slot(const struct paged *s, const struct paged_layer *L, int slot);
/* The strategy's selection with q (n_q, d), the step's query (a backend buffer), for every head
 * at layout lay into pages (n_kv, k_sel) host memory; the time is added to *ns. Compute thread.
 * Top-k runs on the backend (select_pages, with L->res as the resident mask) and the result is
 * downloaded (a wait for the device: the blocking paths); with debug_invariants, -EIO unless
 * the op's changed lists are exactly the selected pages L->res does not hold. Top-p (s->top_p
 * > 0) runs topp.c on the host over s->hq (the step's query, which paged_attend downloads
 * then) and the host summaries, with the temperatures L->theta_k: rows -1 past each head's
 * count. */
int paged_select(struct paged *s, struct paged_layer *L, const float *q,
		 const struct select_layout *lay, int *pages, int64_t *ns);
/* The same selection without a wait (freekv's speculative path): paged_select_start queues it
 * on the compute thread (top-k: the op and the download of its result; top-p: a copy of s->hq
 * and lay for the recall thread; L->res must not change until paged_select_finish);
 * paged_select_finish, on the recall thread, waits for the download's fence and copies the
 * pages out (top-k), or selects on the host (top-p, with L->scratch_r). */
int paged_select_start(struct paged *s, struct paged_layer *L, const float *q,
		       const struct select_layout *lay, int64_t *ns);
int paged_select_finish(struct paged *s, struct paged_layer *L, int *pages, int64_t *ns);
/* The strategy's selection on the host (select.c's top-k, or topp.c's top-p with temperatures
 * theta_k (n_kv)): q (n_q, d), kmin, kmax (n_kv, L->page_cap, d) host memory; pages as for
 * paged_select; scratch L->scratch_c on the compute thread, L->scratch_r on the recall thread.
 * The top-p paths and the debug checks. */
void paged_select_host(const struct paged *s, const struct paged_layer *L, const float *q,
		       const struct select_layout *lay, const float *kmin, const float *kmax,
		       const int8_t *theta_k, int *pages, float *scratch);
/* Makes head h's selected slots hold pages[0..k_sel) (ascending, -1 past its count): pages
 * already resident stay, the others take empty slots first, then those of pages no longer
 * wanted; appends one unit per page to recall to units at *n and updates L->res. With
 * debug_invariants, -EIO unless exactly the changed pages were planned. */
int paged_plan_head(const struct paged *s, struct paged_layer *L, int h, const int *pages,
		    struct recall_unit *units, int *n);
/* Recalls units on the stream as an urgent job (ahead of queued speculative jobs) and waits
 * for them (recall on the critical path). */
int paged_recall_now(struct paged *s, struct paged_layer *L, struct recall_unit *units, int n);
/* Forgets the selection of a layer after a failed recall: every selected slot counts as empty. */
void paged_drop_selection(struct paged *s, struct paged_layer *L);

int64_t paged_now_ns(void);

/* policy_hardkv.c: calibrates the temperatures of a layer with q (n_q, d), host memory (s->hq),
 * at lay when it is due (the first compressed step, the first after a resume, then every R
 * steps), over the host summaries; 0 or -errno. */
int paged_calibrate(struct paged *s, struct paged_layer *L, const float *q,
		    const struct select_layout *lay);
/* kv_policy_ops.layer_select of the paged policies. */
int paged_layer_select(void *st, int layer, int *pages, float *theta);

/* The kv_policy_ops of a paged policy: every op but create is the shared paged_* one. */
#define PAGED_POLICY_OPS(NAME, CREATE)                                                        \
	{                                                                                       \
		.name = (NAME), .create = (CREATE), .destroy = paged_destroy,                  \
		.step_begin = paged_step_begin, .layer_begin = NULL, .append = paged_append,   \
		.attend = paged_attend, .attend_prepare = paged_attend_prepare,                \
		.attend_finish = paged_attend_finish, .layer_end = NULL,                       \
		.step_end = paged_step_end,                                                     \
		.length = paged_length, .stats = paged_stats, .layer_stats = paged_layer_stats, \
		.restore = paged_restore, .layer_select = paged_layer_select,                  \
	}

#endif
