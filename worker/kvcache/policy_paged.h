/* policy_paged — the device-side paged KV state the retrieval policies share (streaming, quest,
 * freekv, hardkv; docs/design.md §3, §5), and the seam through which each of them decides what a
 * compressed decode step attends to.
 *
 * Per sequence and layer, on the backend: B/p NHD slots (2, p, n_kv, d) f32 — S/p sink slots
 * (pages 0..S/p-1), W/p window slots (a ring: page j >= S/p lives in ring slot (j - S/p) % (W/p)
 * while it is in the window) and k = (B-S-W)/p selected slots, each head's slice of which may
 * hold a different host page (res). A page leaving the window moves into the selected slots
 * while there is room (the sequence still fits the budget, so every policy attends to
 * everything), and afterwards only when the strategy keeps recent pages (streaming); otherwise
 * it stays in the host copy until selected. Also per layer: min/max key summaries of every full
 * page (host memory, from a download of the page's keys: selection runs on the host, select.c),
 * the last query, and the counters.
 *
 * Dense prefill reads the past from the slots while everything fits, else from the host copy.
 * The first `full_layers` layers are a nested `full` state. Slots are backend buffers (f32 on
 * every backend, whatever the KV dtype: the host copy keeps the dtype, the slots hold its values
 * exactly) touched only through backend ops — upload (appended prefill rows), copy and
 * round_to (appended decode rows, where the backend has round_to), copy (pages leaving the
 * window, dense prefill), download (page summaries, debug checks), recall_units (recall) and
 * decode attention — so the same code runs on the CPU and the CUDA backend. A decode step hands
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
	float *slots;	       /* backend buffer: (n_slots, 2, p, n_kv, d) f32 */
	int *res;	       /* (k_sel, n_kv): host page held by selected slot s for head h, -1 */
	int *target;	       /* (n_kv, k_sel): pages the last selection chose, ascending */
	int *fresh;	       /* (n_kv, k_sel): a selection not yet applied to every head */
	bool have_target;
	float *kmin, *kmax;    /* (n_kv, page_cap, d) summaries of full pages */
	int page_cap;	       /* pages the summaries hold (grown by doubling) */
	float *q_last;	       /* (n_q, d): the previous decode query at this layer */
	bool have_q;
	float *q_spec;	       /* (n_q, d): the query the copy thread selects with */
	float *scratch_c;      /* selection scratch of the compute thread */
	float *scratch_r;      /* ... and of the copy thread */
	int *att;	       /* (n_kv, k_sel): pages the current step attends to */
	/* For the debug checks, set by the strategy at each compressed decode step: */
	uint8_t *att_now;      /* (n_kv): att of the head was selected with this step's query */
	bool prev_valid;       /* the others' att was selected with q_last at prev_lay */
	struct select_layout prev_lay;
	struct recall_unit *units_c; /* (n_kv * k_sel) blocking recall plan */
	struct recall_unit *units_r; /* (n_kv * k_sel) speculative recall plan */
	uint64_t ticket;       /* pending speculative recall of this layer (0: none) */
	/* Set by the compute thread before submitting a speculative job, read by the copy thread. */
	bool spec_select;      /* the copy thread selects with q_spec first */
	uint8_t *spec_heads;   /* (n_kv): heads whose changed pages the job recalls */
	struct select_layout spec_lay; /* the layout that selection lays pages out for */
	int64_t spec_ns_select; /* written by the copy thread, folded in after the wait */
	struct paged *owner;
	int layer;
	struct kv_layer_stats st;
	/* Top-p selection on calibrated scores (policy_hardkv.c, docs/design.md §5 "hardkv"): */
	int8_t *theta_k;       /* (n_kv): head h's temperature is 2^(theta_k[h] / 2) */
	int8_t *theta_k_prev;  /* (n_kv): theta_k as the previous step's selections saw it */
	int since_cal;	       /* compressed steps since the last calibration; -1: none yet */
};

/* What makes streaming, quest and freekv differ. */
struct paged_strategy {
	const char *name;
	bool recalls;	  /* selects and recalls from the host copy (needs host) */
	bool keep_recent; /* pages leaving the window stay in the selected slots, oldest out */
	/* A compressed decode step at a retrieval layer: fill L->att with the pages each head
	 * attends besides sink and window (n_kv rows of k_sel, ascending) and make them resident.
	 * q (n_q, d) host copy of the query; lay the layout at the current length. */
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
	size_t slot_floats;	/* 2 * p * n_kv * d */
	int64_t len, pending;
	int full_layers;
	void *full;		/* nested `full` state for layers < full_layers, or NULL */
	struct paged_layer *L;	/* n_layers; entries below full_layers unused */
	double top_p;		/* P of top-p selection; 0: top-k */
	int recal;		/* R: compressed steps between calibrations */
	struct kv_wt wt;
	struct recall *rc;	/* recall stream (strategies that recall) */
	float *hq;		/* (n_q, d) host copy of the step's query */
	struct backend_kv_span *spans; /* (n_kv * n_slots) */
	int *span_page;		/* (n_kv * n_slots): the page each span holds */
	int *first;		/* (n_kv + 1) */
	int32_t *slot_list;	/* (n_kv, n_slots): head h's i-th span is slot_list[h][i] */
	int32_t *head_tok;	/* (n_kv): tokens head h's slot list holds */
	float *dense_k, *dense_v; /* backend buffers for prefill: (dense_cap, n_kv, d) f32 */
	int64_t dense_cap;
	float *chk;		/* host scratch for the debug checks: (2, p, d) block dtype bytes */
	float *hslot;		/* host scratch: one slot downloaded, (2, p, n_kv, d) f32 */
	int64_t attended;
};

int paged_create(const struct kv_seq_params *p, const struct paged_strategy *strat, void **st);
void paged_destroy(void *st);
int paged_step_begin(void *st, int64_t n);
int paged_append(void *st, int layer, const float *k, const float *v, int64_t n);
int paged_attend(void *st, int layer, float *out, const float *q, int64_t n);
void paged_step_end(void *st);
int64_t paged_length(void *st);
void paged_stats(void *st, struct kv_stats *out);
int paged_layer_stats(void *st, int layer, struct kv_layer_stats *out);
int paged_restore(void *st, int64_t len);

/* Helpers for strategies. */
/* NHD slot s of a layer. */
float *paged_slot(const struct paged *s, const struct paged_layer *L, int slot);
/* The strategy's selection with q for every head at layout lay into pages (n_kv, k_sel): top-k,
 * or top-p on the calibrated scores of L->theta_k (rows -1 past each head's count); the time is
 * added to *ns. scratch: L->scratch_c on the compute thread, L->scratch_r on the copy thread. */
void paged_select(const struct paged *s, const struct paged_layer *L, const float *q,
		  const struct select_layout *lay, int *pages, float *scratch, int64_t *ns);
/* Makes head h's selected slots hold pages[0..k_sel) (ascending, -1 past its count): pages
 * already resident stay, the others take empty slots first, then those of pages no longer
 * wanted; appends one unit per page to recall to units at *n and updates L->res. With
 * debug_invariants, -EIO unless exactly the changed pages were planned. */
int paged_plan_head(const struct paged *s, struct paged_layer *L, int h, const int *pages,
		    struct recall_unit *units, int *n);
/* Recalls units on the stream and waits for them (recall on the critical path). */
int paged_recall_now(struct paged *s, struct paged_layer *L, struct recall_unit *units, int n);
/* Forgets the selection of a layer after a failed recall: every selected slot counts as empty. */
void paged_drop_selection(struct paged *s, struct paged_layer *L);

int64_t paged_now_ns(void);

/* policy_hardkv.c: calibrates the temperatures of a layer with q at lay when it is due (the
 * first compressed step, the first after a resume, then every R steps); 0 or -errno. */
int paged_calibrate(struct paged *s, struct paged_layer *L, const float *q,
		    const struct select_layout *lay);
/* kv_policy_ops.layer_select of the paged policies. */
int paged_layer_select(void *st, int layer, int *pages, float *theta);

/* The kv_policy_ops of a paged policy: every op but create is the shared paged_* one. */
#define PAGED_POLICY_OPS(NAME, CREATE)                                                        \
	{                                                                                       \
		.name = (NAME), .create = (CREATE), .destroy = paged_destroy,                  \
		.step_begin = paged_step_begin, .layer_begin = NULL, .append = paged_append,   \
		.attend = paged_attend, .layer_end = NULL, .step_end = paged_step_end,         \
		.length = paged_length, .stats = paged_stats, .layer_stats = paged_layer_stats, \
		.restore = paged_restore, .layer_select = paged_layer_select,                  \
	}

#endif
