/* serve_batch — the request side of `kvworker serve` (cmd_serve.c is the process: flags, config
 * file, model, store, socket, signals, main loop). This module owns the table of active
 * requests and runs continuous batching over engine_forward: serve_handle() admits a request
 * frame (Generate, Resume, Cancel, Status of proto/worker.proto) or answers it with an error;
 * serve_step() runs one engine step over every active request (a new request's prompt and the
 * others' last sampled token in one batch), samples, keeps each sampled id with its sequence
 * before streaming it, and ends the requests that are done; serve_shutdown() ends every
 * request and keeps its sequence in kvstored (detached, resumable). While max_seqs requests
 * are active, up to max_queue more wait (first come, first served) and are admitted as slots
 * free up; beyond that a request is refused with -EBUSY.
 *
 * Ownership: struct serve is the caller's; serve_init() allocates the request table and the
 * logits buffer, serve_free() frees them. The model, tokenizer, engine, store handle and the
 * ROUTER socket are borrowed for the lifetime of struct serve. Every function runs on the one
 * thread that owns the socket. Bad input is answered with an error reply, never fatal. */
#ifndef FREEKV_SERVE_BATCH_H
#define FREEKV_SERVE_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "hostkv.h"
#include "model.h"

struct fkv_tokenizer;
struct serve_metrics;
struct serve_req;
struct serve_wait;

struct serve {
	/* Borrowed. */
	const struct fkv_model *m;
	const struct fkv_tokenizer *tok;
	struct engine *e;
	struct hostkv *hk;
	void *sock;			/* ZeroMQ ROUTER */
	const char *model_path, *backend_name;
	const char *chat_template;	/* the model's, for Status (NULL: none) */
	struct serve_metrics *metrics;	/* (optional) --metrics figures */
	int gpu;			/* --gpu, -1 when not given */
	int max_seqs, max_queue;
	size_t max_request_bytes;
	/* Owned. */
	struct serve_req *reqs;		/* max_seqs slots */
	int n_active;
	struct serve_wait *wait;	/* max_queue slots, a FIFO ring */
	int wait_head, n_wait;
	float *logits;			/* (max_seqs, vocab) */
	int *b_seqs, *b_ns;		/* one engine step's batch, max_seqs entries each */
	const int32_t **b_ids;
	struct serve_req **b_reqs;
	int32_t *b_next;		/* the ids sampled after it, and whether each was kept */
	int *b_kept;
	uint64_t name_counter;
	/* Counters since start. */
	uint64_t tokens_generated, requests_served, steps, step_tokens;
	double t_start, ms_in_steps;
};

int serve_init(struct serve *s);
void serve_free(struct serve *s);

/* Takes one message from the socket (identity, optional empty delimiter, payload) and handles
 * it: admission, cancel, status, or an error reply. 0, or -errno when the socket failed. */
int serve_handle(struct serve *s);
/* Admits waiting requests while slots are free, then one engine step over all active
 * requests; nothing when none is active. */
void serve_step(struct serve *s);
/* Ends every active request with reason "shutdown", keeping its sequence; waiting requests
 * get -ESHUTDOWN. */
void serve_shutdown(struct serve *s);

/* A one-line JSON object of the counters (for kvstored's `kvctl workers`); caller frees. */
char *serve_stats_json(const struct serve *s);

#endif
