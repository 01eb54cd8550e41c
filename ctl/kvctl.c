/* kvctl — the operator's view of kvstored (docs/design.md §6). Each verb is one row of a table (name,
 * usage, handler); every handler sends control requests through libfreekv_store and prints a
 * human table, or one JSON object with --json (built with json-c; errors too: errout). Options
 * are parsed with getopt_long and may come before or after the verb. Exit codes: 0 ok, 1 the daemon
 * refused, 2 usage, 3 the daemon cannot be reached (a receive timeout bounds every request). */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "freekv_store.h"
#include "version.h"

enum { EXIT_OK = 0, EXIT_REFUSED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3 };

struct opts {
	const char *endpoint;
	const char *token_file;	/* tcp endpoints: the daemon's auth token ($FREEKV_TOKEN_FILE too) */
	int timeout_ms;
	bool json, tokens, detached, demote, remote;
	const char *worker;
	double interval;
	long count;
	const char *pos[4];
	int npos;
};

struct verb {
	const char *name;
	const char *usage;
	int min_pos, max_pos;
	int (*fn)(struct kvs *k, const struct opts *o);
};

static bool g_json; /* --json: errors too come out as JSON, on stdout */

static void emit(json_object *j)
{
	puts(json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN));
	json_object_put(j);
}

/* Says what went wrong and returns code: "kvctl: MESSAGE" on stderr, or with --json
 * {"error": {"message": ..., "kind": "refused"|"usage"|"unreachable", "exit_code": code}} on
 * stdout, so that a script reading stdout always gets one JSON object. */
static int errout(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int errout(int code, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (!g_json) {
		fprintf(stderr, "kvctl: %s\n", msg);
		return code;
	}
	static const char *const kinds[] = { [EXIT_OK] = "ok", [EXIT_REFUSED] = "refused",
					     [EXIT_USAGE] = "usage",
					     [EXIT_UNREACHABLE] = "unreachable" };
	json_object *e = json_object_new_object(), *j = json_object_new_object();
	json_object_object_add(e, "message", json_object_new_string(msg));
	json_object_object_add(e, "kind", json_object_new_string(kinds[code]));
	json_object_object_add(e, "exit_code", json_object_new_int(code));
	json_object_object_add(j, "error", e);
	emit(j);
	return code;
}

static int failed(struct kvs *k, int ret)
{
	bool gone = ret == -ETIMEDOUT || ret == -EHOSTUNREACH || ret == -ECONNREFUSED ||
		    ret == -ESHUTDOWN || ret == -ECONNRESET;
	return errout(gone ? EXIT_UNREACHABLE : EXIT_REFUSED, "%s", kvs_error(k));
}

/* A configuration value as JSON: numbers as numbers, true/false as booleans, the rest (sizes
 * with a unit, paths, names) as strings. */
static json_object *config_value_json(const char *v)
{
	char *end;
	if (!strcmp(v, "true") || !strcmp(v, "false"))
		return json_object_new_boolean(!strcmp(v, "true"));
	errno = 0;
	if (*v && (isdigit((unsigned char)*v) || (*v == '-' && isdigit((unsigned char)v[1])))) {
		long long i = strtoll(v, &end, 10);
		if (!*end && !errno)
			return json_object_new_int64(i);
		errno = 0;
		double d = strtod(v, &end);
		if (!*end && !errno)
			return json_object_new_double(d);
	}
	return json_object_new_string(v);
}

static void mib(char *buf, size_t n, uint64_t bytes)
{
	snprintf(buf, n, "%.1f MiB", (double)bytes / (1 << 20));
}

static const char *state_name(Freekv__SequenceState s)
{
	switch (s) {
	case FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_ATTACHED: return "attached";
	case FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_DETACHED: return "detached";
	case FREEKV__SEQUENCE_STATE__SEQUENCE_STATE_ORPHANED: return "orphaned";
	default: return "unknown";
	}
}

static const char *dtype_name(Freekv__DType d)
{
	switch (d) {
	case FREEKV__DTYPE__DTYPE_F32: return "f32";
	case FREEKV__DTYPE__DTYPE_F16: return "f16";
	case FREEKV__DTYPE__DTYPE_BF16: return "bf16";
	default: return "?";
	}
}

/* "id:N" names a sequence by id (N a positive decimal number), anything else by name. Returns
 * EXIT_OK, or EXIT_USAGE after saying what is wrong with a. */
static int seq_arg(const char *a, uint64_t *id, const char **name)
{
	*id = 0;
	*name = a;
	if (!*a)
		return errout(EXIT_USAGE, "SEQ is empty: give a sequence name, or id:N");
	if (!strncmp(a, "id:", 3)) {
		char *end;
		errno = 0;
		*id = strtoull(a + 3, &end, 10);
		*name = NULL;
		if (!isdigit((unsigned char)a[3]) || *end || errno || *id == 0)
			return errout(EXIT_USAGE, "'%s' is not a sequence id: id:N wants N a number "
				      "from 1 (`kvctl ls` lists the ids)", a);
	}
	return EXIT_OK;
}

static json_object *seq_json(const Freekv__SequenceInfo *s, bool tokens)
{
	json_object *j = json_object_new_object(), *g = json_object_new_object();
	char fp[2 * 64 + 1] = "";
	for (size_t i = 0; i < s->model_fingerprint.len && i < 64; i++)
		sprintf(fp + 2 * i, "%02x", s->model_fingerprint.data[i]);
	json_object_object_add(j, "id", json_object_new_uint64(s->seq_id));
	json_object_object_add(j, "name", json_object_new_string(s->name));
	json_object_object_add(j, "state", json_object_new_string(state_name(s->state)));
	if (s->has_worker_id)
		json_object_object_add(j, "worker", json_object_new_int64(s->worker_id));
	json_object_object_add(j, "committed_tokens", json_object_new_uint64(s->committed_tokens));
	json_object_object_add(j, "token_count", json_object_new_uint64(s->token_count));
	json_object_object_add(g, "n_layers", json_object_new_int64(s->geometry->n_layers));
	json_object_object_add(g, "n_kv_heads", json_object_new_int64(s->geometry->n_kv_heads));
	json_object_object_add(g, "head_dim", json_object_new_int64(s->geometry->head_dim));
	json_object_object_add(g, "page_size", json_object_new_int64(s->geometry->page_size));
	json_object_object_add(g, "dtype", json_object_new_string(dtype_name(s->geometry->dtype)));
	json_object_object_add(j, "geometry", g);
	json_object_object_add(j, "block_bytes", json_object_new_uint64(s->block_bytes));
	json_object_object_add(j, "pages_dram", json_object_new_uint64(s->pages->dram));
	json_object_object_add(j, "pages_nvme", json_object_new_uint64(s->pages->nvme));
	json_object_object_add(j, "pages_remote", json_object_new_uint64(s->pages->remote));
	json_object_object_add(j, "pages_in_flight", json_object_new_uint64(s->pages->in_flight));
	json_object_object_add(j, "leases", json_object_new_uint64(s->leases));
	json_object_object_add(j, "model_fingerprint", json_object_new_string(fp));
	json_object_object_add(j, "prefix_covered_tokens",
			       json_object_new_uint64(s->prefix_covered_tokens));
	json_object_object_add(j, "shared_pages", json_object_new_int64(s->shared_pages));
	if (s->has_damaged_blocks) {
		json_object_object_add(j, "damaged_blocks", json_object_new_int64(s->damaged_blocks));
		json_object_object_add(j, "damaged_cut_from", json_object_new_uint64(s->damaged_cut_from));
	}
	if (tokens) {
		json_object *t = json_object_new_array();
		for (size_t i = 0; i < s->n_token_ids; i++)
			json_object_array_add(t, json_object_new_int64(s->token_ids[i]));
		json_object_object_add(j, "token_ids", t);
	}
	return j;
}

/* ---------------------------------------------------------------- verbs */

static json_object *prefix_json(const Freekv__PrefixStats *p)
{
	json_object *o = json_object_new_object();
	json_object_object_add(o, "lookups", json_object_new_uint64(p->lookups));
	json_object_object_add(o, "hits", json_object_new_uint64(p->hits));
	json_object_object_add(o, "misses", json_object_new_uint64(p->misses));
	json_object_object_add(o, "pages_attached", json_object_new_uint64(p->pages_attached));
	json_object_object_add(o, "tokens_saved", json_object_new_uint64(p->tokens_saved));
	json_object_object_add(o, "indexed_pages", json_object_new_uint64(p->indexed_pages));
	json_object_object_add(o, "shared_blocks", json_object_new_uint64(p->shared_blocks));
	json_object_object_add(o, "forks", json_object_new_uint64(p->forks));
	json_object_object_add(o, "cached_blocks", json_object_new_uint64(p->cached_blocks));
	json_object_object_add(o, "evicted_pages", json_object_new_uint64(p->evicted_pages));
	json_object_object_add(o, "remote_published", json_object_new_uint64(p->remote_published));
	json_object_object_add(o, "remote_pages", json_object_new_uint64(p->remote_pages));
	return o;
}

static void prefix_line(const Freekv__PrefixStats *p)
{
	if (!p)
		return;
	printf("  prefix   %" PRIu64 " lookups: %" PRIu64 " hits, %" PRIu64 " misses; %" PRIu64
	       " pages attached, %" PRIu64 " tokens not prefilled; %" PRIu64 " pages indexed, %"
	       PRIu64 " blocks shared, %" PRIu64 " cached (no sequence), %" PRIu64 " pages let "
	       "go; %" PRIu64 " forks\n", p->lookups, p->hits, p->misses, p->pages_attached,
	       p->tokens_saved, p->indexed_pages, p->shared_blocks, p->cached_blocks,
	       p->evicted_pages, p->forks);
}

static json_object *status_json(const Freekv__StatsReply *s)
{
	json_object *j = json_object_new_object();
	json_object_object_add(j, "uptime_ms", json_object_new_uint64(s->uptime_ms));
	json_object_object_add(j, "workers", json_object_new_int64(s->workers));
	json_object_object_add(j, "sequences", json_object_new_int64(s->sequences));
	json_object_object_add(j, "dram_bytes", json_object_new_uint64(s->dram_bytes));
	json_object_object_add(j, "dram_used_bytes", json_object_new_uint64(s->dram_used_bytes));
	json_object_object_add(j, "nvme_bytes", json_object_new_uint64(s->nvme_bytes));
	json_object_object_add(j, "nvme_used_bytes", json_object_new_uint64(s->nvme_used_bytes));
	json_object_object_add(j, "nvme_kept_bytes", json_object_new_uint64(s->nvme_kept_bytes));
	json_object_object_add(j, "kept_blocks", json_object_new_uint64(s->kept_blocks));
	json_object_object_add(j, "nvme_unwritten_bytes", json_object_new_uint64(s->nvme_unwritten_bytes));
	json_object_object_add(j, "blocks_dram", json_object_new_uint64(s->blocks_dram));
	json_object_object_add(j, "blocks_nvme", json_object_new_uint64(s->blocks_nvme));
	json_object_object_add(j, "leases", json_object_new_uint64(s->leases));
	if (s->prefix)
		json_object_object_add(j, "prefix", prefix_json(s->prefix));
	if (s->remote) {
		const Freekv__RemoteStats *m = s->remote;
		json_object *o = json_object_new_object();
		json_object_object_add(o, "url", json_object_new_string(m->url));
		json_object_object_add(o, "ops", json_object_new_uint64(m->ops));
		json_object_object_add(o, "errors", json_object_new_uint64(m->errors));
		json_object_object_add(o, "bytes_put", json_object_new_uint64(m->bytes_put));
		json_object_object_add(o, "bytes_got", json_object_new_uint64(m->bytes_got));
		json_object_object_add(o, "total_us", json_object_new_uint64(m->total_us));
		json_object_object_add(o, "crc_errors", json_object_new_uint64(m->crc_errors));
		json_object_object_add(o, "published", json_object_new_uint64(m->published));
		json_object_object_add(o, "adopted", json_object_new_uint64(m->adopted));
		json_object_object_add(o, "owned", json_object_new_uint64(m->owned));
		json_object_object_add(o, "cluster", json_object_new_boolean(m->cluster));
		json_object_object_add(o, "tier", json_object_new_boolean(m->tier));
		json_object_object_add(o, "tier_blocks", json_object_new_uint64(m->tier_blocks));
		json_object_object_add(o, "offloaded", json_object_new_uint64(m->offloaded));
		json_object_object_add(o, "fetched", json_object_new_uint64(m->fetched));
		json_object_object_add(o, "tier_errors", json_object_new_uint64(m->tier_errors));
		json_object_object_add(o, "tier_bytes_put", json_object_new_uint64(m->tier_bytes_put));
		json_object_object_add(o, "tier_bytes_got", json_object_new_uint64(m->tier_bytes_got));
		json_object_object_add(o, "tier_us", json_object_new_uint64(m->tier_us));
		json_object_object_add(j, "remote", o);
	}
	if (s->journal) {
		const Freekv__JournalStats *jr = s->journal;
		json_object *o = json_object_new_object();
		json_object_object_add(o, "path", json_object_new_string(jr->path));
		json_object_object_add(o, "bytes", json_object_new_uint64(jr->bytes));
		json_object_object_add(o, "records", json_object_new_uint64(jr->records));
		json_object_object_add(o, "syncs", json_object_new_uint64(jr->syncs));
		json_object_object_add(o, "last_compaction_unix", json_object_new_uint64(jr->last_compaction_unix));
		json_object_object_add(o, "replayed", json_object_new_uint64(jr->replayed));
		json_object_object_add(o, "replay_ms", json_object_new_uint64(jr->replay_ms));
		json_object_object_add(o, "adopted_sequences", json_object_new_uint64(jr->adopted_sequences));
		json_object_object_add(o, "adopted_blocks", json_object_new_uint64(jr->adopted_blocks));
		json_object_object_add(o, "damaged_sequences", json_object_new_uint64(jr->damaged_sequences));
		json_object_object_add(o, "damaged_blocks", json_object_new_uint64(jr->damaged_blocks));
		json_object_object_add(o, "ignored_bytes", json_object_new_uint64(jr->ignored_bytes));
		json_object_object_add(o, "failed", json_object_new_boolean(jr->failed));
		json_object_object_add(j, "journal", o);
	}
	return j;
}

/* Fetches kvstored's stats, hands them to show (json: --json given), frees the reply. */
static int with_stats(struct kvs *k, const struct opts *o,
		      void (*show)(const Freekv__StatsReply *s, bool json))
{
	Freekv__Reply *r;
	int ret = kvs_stats(k, &r);
	if (ret)
		return failed(k, ret);
	show(r->stats, o->json);
	kvs_reply_free(r);
	return EXIT_OK;
}

static void show_status(const Freekv__StatsReply *s, bool json)
{
	if (json) {
		emit(status_json(s));
	} else {
		char a[32], b[32], c[32], d[32];
		mib(a, sizeof a, s->dram_used_bytes);
		mib(b, sizeof b, s->dram_bytes);
		mib(c, sizeof c, s->nvme_used_bytes);
		mib(d, sizeof d, s->nvme_bytes);
		printf("kvstored up %.1f s: %u workers, %u sequences, %" PRIu64 " leases\n", s->uptime_ms / 1e3,
		       s->workers, s->sequences, s->leases);
		printf("  DRAM  %12s / %-12s %8" PRIu64 " blocks\n", a, b, s->blocks_dram);
		printf("  NVMe  %12s / %-12s %8" PRIu64 " blocks", c, d, s->blocks_nvme);
		if (s->kept_blocks) {
			mib(c, sizeof c, s->nvme_kept_bytes);
			printf(" (and %s kept for %" PRIu64 " DRAM blocks)", c, s->kept_blocks);
		}
		if (s->nvme_unwritten_bytes) {
			mib(c, sizeof c, s->nvme_unwritten_bytes);
			printf("; zeros still to write over %s of the file", c);
		}
		printf("\n");
		prefix_line(s->prefix);
		if (s->remote) {
			const Freekv__RemoteStats *m = s->remote;
			mib(a, sizeof a, m->bytes_put);
			mib(b, sizeof b, m->bytes_got);
			printf("  remote   %s: %" PRIu64 " published, %" PRIu64 " adopted, %" PRIu64
			       " owned; %s out, %s in; %" PRIu64 " commands in %.1f ms, %" PRIu64
			       " errors, %" PRIu64 " checksum failures\n", m->url, m->published,
			       m->adopted, m->owned, a, b, m->ops, m->total_us / 1e3, m->errors,
			       m->crc_errors);
			if (m->tier)
				printf("  remote tier  %" PRIu64 " blocks in Redis; %" PRIu64 " moved there "
				       "from NVMe, %" PRIu64 " brought back, %" PRIu64 " failed moves\n",
				       m->tier_blocks, m->offloaded, m->fetched, m->tier_errors);
		}
		const Freekv__JournalStats *jr = s->journal;
		if (!jr) {
			printf("  journal  off (persist = false, or no nvme_path / journal_path): a restart "
			       "starts empty\n");
			return;
		}
		char when[64] = "none since start";
		if (jr->last_compaction_unix) {
			time_t t = (time_t)jr->last_compaction_unix;
			strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&t));
		}
		mib(a, sizeof a, jr->bytes);
		printf("  journal  %s: %s, %" PRIu64 " records, %" PRIu64 " syncs; last compaction %s\n",
		       jr->path, a, jr->records, jr->syncs, when);
		printf("  at start %" PRIu64 " records replayed, %" PRIu64 " sequences and %" PRIu64
		       " blocks adopted in %" PRIu64 " ms", jr->replayed, jr->adopted_sequences,
		       jr->adopted_blocks, jr->replay_ms);
		if (jr->damaged_sequences || jr->ignored_bytes)
			printf("; DAMAGE: %" PRIu64 " sequences (%" PRIu64 " blocks), %" PRIu64
			       " journal bytes ignored", jr->damaged_sequences, jr->damaged_blocks,
			       jr->ignored_bytes);
		printf("%s\n", jr->failed ? "; a record could not be journaled since start" : "");
	}
}

static int v_status(struct kvs *k, const struct opts *o)
{
	return with_stats(k, o, show_status);
}

static int v_workers(struct kvs *k, const struct opts *o)
{
	Freekv__Reply *r;
	int ret = kvs_list_workers(k, &r);
	if (ret)
		return failed(k, ret);
	json_object *arr = json_object_new_array();
	if (!o->json)
		printf("%-6s %-8s %-8s %-16s %8s %5s %10s  %s\n", "ID", "PID", "ROLE", "NAME", "LEASES", "SEQS",
		       "HB_AGO_MS", "STATS");
	for (size_t i = 0; i < r->workers->n_workers; i++) {
		const Freekv__WorkerInfo *w = r->workers->workers[i];
		if (w->worker_id == kvs_worker_id(k))
			continue; /* this kvctl's own control session */
		const char *role = w->role == FREEKV__CLIENT_ROLE__CLIENT_ROLE_WORKER ? "worker" : "control";
		if (o->json) {
			json_object *j = json_object_new_object();
			json_object_object_add(j, "id", json_object_new_int64(w->worker_id));
			json_object_object_add(j, "pid", json_object_new_int64(w->pid));
			json_object_object_add(j, "role", json_object_new_string(role));
			json_object_object_add(j, "name", json_object_new_string(w->name ? w->name : ""));
			json_object_object_add(j, "leases", json_object_new_uint64(w->leases));
			json_object_object_add(j, "sequences", json_object_new_int64(w->sequences));
			json_object_object_add(j, "last_heartbeat_ms_ago", json_object_new_uint64(w->last_heartbeat_ms_ago));
			if (w->stats && w->stats->has_decode_tok_s)
				json_object_object_add(j, "decode_tok_s", json_object_new_double(w->stats->decode_tok_s));
			if (w->stats) {
				json_object_object_add(j, "tokens_decoded", json_object_new_uint64(w->stats->tokens_decoded));
				json_object_object_add(j, "pages_recalled", json_object_new_uint64(w->stats->pages_recalled));
				json_object_object_add(j, "bytes_recalled", json_object_new_uint64(w->stats->bytes_recalled));
				json_object_object_add(j, "correction_rate", json_object_new_double(w->stats->correction_rate));
			}
			if (w->stats && w->stats->has_full_step_rate) {
				json_object *lr = json_object_new_array();
				for (size_t l = 0; l < w->stats->n_layer_full_step_rate; l++)
					json_object_array_add(lr, json_object_new_double(w->stats->layer_full_step_rate[l]));
				json_object_object_add(j, "full_step_rate", json_object_new_double(w->stats->full_step_rate));
				json_object_object_add(j, "tokens_fetched", json_object_new_uint64(w->stats->tokens_fetched));
				json_object_object_add(j, "full_step_ms", json_object_new_double(w->stats->full_step_ms));
				json_object_object_add(j, "layer_full_step_rate", lr);
			}
			json_object_array_add(arr, j);
		} else {
			char st[160] = "-";
			if (w->stats && w->stats->has_full_step_rate)
				snprintf(st, sizeof st, "%.0f tok/s, full steps %.3f (stride %.1f), %" PRIu64 " fetched, %.0f ms full",
					 w->stats->decode_tok_s, w->stats->full_step_rate,
					 w->stats->full_step_rate > 0 ? 1.0 / w->stats->full_step_rate : 0.0,
					 w->stats->tokens_fetched, w->stats->full_step_ms);
			else if (w->stats)
				snprintf(st, sizeof st, "%.0f tok/s, %" PRIu64 " recalled, corr %.2f", w->stats->decode_tok_s,
					 w->stats->pages_recalled, w->stats->correction_rate);
			printf("%-6u %-8u %-8s %-16s %8" PRIu64 " %5u %10" PRIu64 "  %s\n", w->worker_id, w->pid, role,
			       w->name ? w->name : "", w->leases, w->sequences, w->last_heartbeat_ms_ago, st);
			if (w->stats && w->stats->n_layer_full_step_rate) {
				printf("%-6s full-step rate per layer:", "");
				for (size_t l = 0; l < w->stats->n_layer_full_step_rate; l++)
					printf(" %.3f", w->stats->layer_full_step_rate[l]);
				printf("\n");
			}
		}
	}
	if (o->json) {
		json_object *j = json_object_new_object();
		json_object_object_add(j, "workers", arr);
		emit(j);
	} else {
		json_object_put(arr);
	}
	kvs_reply_free(r);
	return EXIT_OK;
}

static void ls_table(const Freekv__SequenceList *l)
{
	printf("%-6s %-24s %-9s %-6s %8s %8s %6s %6s %6s %6s %6s\n", "ID", "NAME", "STATE", "WORKER",
	       "TOKENS", "KV", "DRAM", "NVME", "IO", "LEASES", "SHARED");
	for (size_t i = 0; i < l->n_sequences; i++) {
		const Freekv__SequenceInfo *s = l->sequences[i];
		char w[16] = "-";
		if (s->has_worker_id)
			snprintf(w, sizeof w, "%u", s->worker_id);
		printf("%-6" PRIu64 " %-24s %-9s %-6s %8" PRIu64 " %8" PRIu64 " %6" PRIu64 " %6" PRIu64
		       " %6" PRIu64 " %6" PRIu64 " %6u%s\n", s->seq_id, s->name, state_name(s->state), w,
		       s->token_count, s->committed_tokens, s->pages->dram, s->pages->nvme,
		       s->pages->in_flight, s->leases, s->shared_pages,
		       s->has_damaged_blocks ? "  DAMAGED" : "");
	}
}

static int v_ls(struct kvs *k, const struct opts *o)
{
	Freekv__Reply *r;
	int ret = kvs_list_sequences(k, &r);
	if (ret)
		return failed(k, ret);
	if (o->json) {
		json_object *j = json_object_new_object(), *arr = json_object_new_array();
		for (size_t i = 0; i < r->sequences->n_sequences; i++)
			json_object_array_add(arr, seq_json(r->sequences->sequences[i], false));
		json_object_object_add(j, "sequences", arr);
		emit(j);
	} else {
		ls_table(r->sequences);
	}
	kvs_reply_free(r);
	return EXIT_OK;
}

static int v_show(struct kvs *k, const struct opts *o)
{
	Freekv__Reply *r;
	uint64_t id;
	const char *name;
	if (seq_arg(o->pos[0], &id, &name))
		return EXIT_USAGE;
	int ret = kvs_show_sequence(k, id, name, o->tokens, &r);
	if (ret)
		return failed(k, ret);
	const Freekv__SequenceInfo *s = r->sequence;
	if (o->json) {
		emit(seq_json(s, o->tokens));
	} else {
		printf("sequence   %s (id %" PRIu64 ")\n", s->name, s->seq_id);
		printf("state      %s", state_name(s->state));
		if (s->has_worker_id)
			printf(" (worker %u)", s->worker_id);
		printf("\ngeometry   %u layers, %u KV heads, head dim %u, page %u, %s (%" PRIu64 " B/block)\n",
		       s->geometry->n_layers, s->geometry->n_kv_heads, s->geometry->head_dim, s->geometry->page_size,
		       dtype_name(s->geometry->dtype), s->block_bytes);
		printf("length     %" PRIu64 " token ids kept (prompt and generated), %" PRIu64
		       " with K/V committed\n", s->token_count, s->committed_tokens);
		if (s->has_damaged_blocks)
			printf("damaged    a block failed its checksum at a restart: %u blocks are never "
			       "served, committed cut from %" PRIu64 " tokens (the token ids are kept: "
			       "resume runs them again)\n", s->damaged_blocks, s->damaged_cut_from);
		printf("pages      %" PRIu64 " DRAM, %" PRIu64 " NVMe, %" PRIu64 " remote, %" PRIu64
		       " in flight\n", s->pages->dram, s->pages->nvme, s->pages->remote,
		       s->pages->in_flight);
		printf("leases     %" PRIu64 "\n", s->leases);
		printf("shared     %u pages shared with other sequences; %" PRIu64 " tokens found "
		       "in the pool when it was opened\n", s->shared_pages, s->prefix_covered_tokens);
		if (o->tokens) {
			printf("tokens    ");
			for (size_t i = 0; i < s->n_token_ids; i++)
				printf(" %u", s->token_ids[i]);
			printf("\n");
		}
	}
	kvs_reply_free(r);
	return EXIT_OK;
}

/* A new sequence DST sharing every full page of SRC (docs/design.md §4 "Prefix sharing"). */
static int v_fork(struct kvs *k, const struct opts *o)
{
	Freekv__Reply *r;
	uint64_t id, dst;
	const char *name;
	if (seq_arg(o->pos[0], &id, &name))
		return EXIT_USAGE;
	int ret = kvs_show_sequence(k, id, name, false, &r);
	if (ret)
		return failed(k, ret);
	const Freekv__SequenceInfo *s = r->sequence;
	struct kvs_geometry g = { s->geometry->n_layers, s->geometry->n_kv_heads,
				  s->geometry->head_dim, s->geometry->page_size,
				  (uint32_t)s->geometry->dtype };
	struct kvs_prefix_req px = { .fork_from = s->name };
	uint64_t covered = 0;
	ret = kvs_open_sequence_px(k, o->pos[1], s->model_fingerprint.data,
				   s->model_fingerprint.len, &g, NULL, 0, true, &px, &dst, &covered);
	if (ret) {
		kvs_reply_free(r);
		return failed(k, ret);
	}
	if (o->json) {
		json_object *j = json_object_new_object();
		json_object_object_add(j, "source", json_object_new_string(s->name));
		json_object_object_add(j, "name", json_object_new_string(o->pos[1]));
		json_object_object_add(j, "seq_id", json_object_new_uint64(dst));
		json_object_object_add(j, "committed_tokens", json_object_new_uint64(covered));
		emit(j);
	} else {
		printf("forked %s into %s (id %" PRIu64 "): %" PRIu64 " tokens of K/V, full pages "
		       "shared\n", s->name, o->pos[1], dst, covered);
	}
	kvs_reply_free(r);
	return EXIT_OK;
}

static int print_evicted(Freekv__Reply *r, const struct opts *o, const char *verb)
{
	if (o->json) {
		json_object *j = json_object_new_object();
		json_object_object_add(j, "sequences", json_object_new_uint64(r->evicted->sequences));
		json_object_object_add(j, "blocks", json_object_new_uint64(r->evicted->blocks));
		emit(j);
	} else {
		printf("%s %" PRIu64 " sequence(s), %" PRIu64 " block(s)\n", verb, r->evicted->sequences,
		       r->evicted->blocks);
	}
	kvs_reply_free(r);
	return EXIT_OK;
}

static int v_evict(struct kvs *k, const struct opts *o)
{
	Freekv__Reply *r;
	int ret;
	if ((o->npos == 1) + (o->worker != NULL) + o->detached != 1)
		return errout(EXIT_USAGE, "evict takes exactly one of SEQ, --worker ID, --detached");
	if (o->npos == 1) {
		uint64_t id;
		const char *name;
		if (seq_arg(o->pos[0], &id, &name))
			return EXIT_USAGE;
		ret = kvs_evict(k, FREEKV__EVICT_TARGET__EVICT_TARGET_SEQUENCE, id, name, 0, o->demote, &r);
	} else if (o->worker) {
		char *end;
		unsigned long w = strtoul(o->worker, &end, 10);
		if (*end || !*o->worker)
			return errout(EXIT_USAGE, "--worker wants a worker id (a number, as `kvctl "
				      "workers` lists them), not '%s'", o->worker);
		ret = kvs_evict(k, FREEKV__EVICT_TARGET__EVICT_TARGET_WORKER, 0, NULL, (uint32_t)w, true, &r);
	} else {
		ret = kvs_evict(k, FREEKV__EVICT_TARGET__EVICT_TARGET_DETACHED, 0, NULL, 0, o->demote, &r);
	}
	if (ret)
		return failed(k, ret);
	return print_evicted(r, o, o->demote || o->worker ? "demoting" : "evicted");
}

static int v_publish(struct kvs *k, const struct opts *o)
{
	Freekv__Reply *r;
	uint64_t id;
	const char *name;
	if (seq_arg(o->pos[0], &id, &name))
		return EXIT_USAGE;
	int ret = kvs_publish(k, id, name, &r);
	if (ret)
		return failed(k, ret);
	return print_evicted(r, o, "published");
}

static int v_demote(struct kvs *k, const struct opts *o)
{
	Freekv__Reply *r;
	uint64_t id;
	const char *name;
	if (seq_arg(o->pos[0], &id, &name))
		return EXIT_USAGE;
	int ret = kvs_demote_to(k, id, name, o->remote, &r);
	if (ret)
		return failed(k, ret);
	return print_evicted(r, o, o->remote ? "moving to the remote tier" : "demoting");
}

static json_object *stat_rows(Freekv__CommandStat **v, size_t n, bool print, const char *title)
{
	json_object *arr = json_object_new_array();
	if (print)
		printf("%-16s %10s %8s %8s %10s\n", title, "CALLS", "ERRORS", "REFUSED", "AVG_US");
	for (size_t i = 0; i < n; i++) {
		double avg = v[i]->calls ? (double)v[i]->total_us / (double)v[i]->calls : 0;
		if (print) {
			printf("%-16s %10" PRIu64 " %8" PRIu64 " %8" PRIu64 " %10.1f\n", v[i]->name,
			       v[i]->calls, v[i]->errors, v[i]->refused, avg);
			continue;
		}
		json_object *j = json_object_new_object();
		json_object_object_add(j, "name", json_object_new_string(v[i]->name));
		json_object_object_add(j, "calls", json_object_new_uint64(v[i]->calls));
		json_object_object_add(j, "errors", json_object_new_uint64(v[i]->errors));
		json_object_object_add(j, "refused", json_object_new_uint64(v[i]->refused));
		json_object_object_add(j, "total_us", json_object_new_uint64(v[i]->total_us));
		json_object_array_add(arr, j);
	}
	return arr;
}

static void show_stats(const Freekv__StatsReply *s, bool json)
{
	if (json) {
		json_object *j = json_object_new_object();
		json_object_object_add(j, "demoted_blocks", json_object_new_uint64(s->demoted_blocks));
		json_object_object_add(j, "demoted_unwritten", json_object_new_uint64(s->demoted_unwritten));
		json_object_object_add(j, "promoted_blocks", json_object_new_uint64(s->promoted_blocks));
		json_object_object_add(j, "kept_reclaimed", json_object_new_uint64(s->kept_reclaimed));
		json_object_object_add(j, "crc_errors", json_object_new_uint64(s->crc_errors));
		json_object_object_add(j, "pending_ops", json_object_new_uint64(s->pending_ops));
		json_object_object_add(j, "tier_in_flight", json_object_new_uint64(s->tier_in_flight));
		json_object_object_add(j, "swaps", json_object_new_uint64(s->swaps));
		json_object_object_add(j, "swap_failures", json_object_new_uint64(s->swap_failures));
		if (s->has_heap_in_use_bytes)
			json_object_object_add(j, "heap_in_use_bytes",
					       json_object_new_uint64(s->heap_in_use_bytes));
		json_object_object_add(j, "commands", stat_rows(s->commands, s->n_commands, false, NULL));
		json_object_object_add(j, "ring_ops", stat_rows(s->ring_ops, s->n_ring_ops, false, NULL));
		if (s->prefix)
			json_object_object_add(j, "prefix", prefix_json(s->prefix));
		emit(j);
	} else {
		printf("demoted %" PRIu64 " (%" PRIu64 " unwritten, onto kept copies), promoted %" PRIu64
		       ", kept copies let go for room %" PRIu64 ", swapped %" PRIu64 " (%" PRIu64
		       " failed), crc errors %" PRIu64 ", pending ops %" PRIu64 ", tier I/O %" PRIu64
		       "\n\n", s->demoted_blocks, s->demoted_unwritten, s->promoted_blocks,
		       s->kept_reclaimed, s->swaps, s->swap_failures, s->crc_errors, s->pending_ops,
		       s->tier_in_flight);
		if (s->has_heap_in_use_bytes)
			printf("heap in use %.1f MiB (kvstored's metadata)\n\n",
			       (double)s->heap_in_use_bytes / (1 << 20));
		if (s->prefix) {
			prefix_line(s->prefix);
			printf("\n");
		}
		json_object_put(stat_rows(s->commands, s->n_commands, true, "REQUEST"));
		printf("\n");
		json_object_put(stat_rows(s->ring_ops, s->n_ring_ops, true, "RING OP"));
	}
}

static int v_stats(struct kvs *k, const struct opts *o)
{
	return with_stats(k, o, show_stats);
}

static int v_config(struct kvs *k, const struct opts *o)
{
	Freekv__Reply *r;
	int ret;
	if (!strcmp(o->pos[0], "get") && o->npos <= 2) {
		ret = kvs_config_get(k, o->npos == 2 ? o->pos[1] : NULL, &r);
	} else if (!strcmp(o->pos[0], "set") && o->npos == 3) {
		ret = kvs_config_set(k, o->pos[1], o->pos[2], &r);
	} else {
		return errout(EXIT_USAGE, "usage: config get [KEY] | config set KEY VALUE");
	}
	if (ret)
		return failed(k, ret);
	json_object *j = json_object_new_object();
	for (size_t i = 0; i < r->config->n_entries; i++) {
		const Freekv__ConfigEntry *e = r->config->entries[i];
		if (o->json)
			json_object_object_add(j, e->key, config_value_json(e->value));
		else
			printf("%-22s = %-32s%s\n", e->key, e->value, e->runtime ? " (run-time)" : "");
	}
	if (o->json)
		emit(j);
	else
		json_object_put(j);
	kvs_reply_free(r);
	return EXIT_OK;
}

/* One JSON object per refresh with --json: {"status": {...}, "sequences": [...]}. */
static int watch_json(struct kvs *k)
{
	Freekv__Reply *st, *ls;
	int ret = kvs_stats(k, &st);
	if (ret)
		return failed(k, ret);
	ret = kvs_list_sequences(k, &ls);
	if (ret) {
		kvs_reply_free(st);
		return failed(k, ret);
	}
	json_object *j = json_object_new_object(), *arr = json_object_new_array();
	json_object_object_add(j, "status", status_json(st->stats));
	for (size_t i = 0; i < ls->sequences->n_sequences; i++)
		json_object_array_add(arr, seq_json(ls->sequences->sequences[i], false));
	json_object_object_add(j, "sequences", arr);
	emit(j);
	kvs_reply_free(st);
	kvs_reply_free(ls);
	return EXIT_OK;
}

static int v_watch(struct kvs *k, const struct opts *o)
{
	struct opts plain = *o;
	plain.npos = 0;
	for (long i = 0; o->count <= 0 || i < o->count; i++) {
		int rc;
		if (o->json) {
			rc = watch_json(k);
		} else {
			/* Clear the screen only on a terminal, and not with NO_COLOR set. */
			bool tty = isatty(STDOUT_FILENO) && !getenv("NO_COLOR");
			printf(tty ? "\033[H\033[2J" : i ? "\n" : "");
			rc = v_status(k, &plain);
			if (!rc) {
				printf("\n");
				rc = v_ls(k, &plain);
			}
		}
		if (rc)
			return rc;
		fflush(stdout);
		if (o->count > 0 && i + 1 == o->count)
			break;
		struct timespec ts = { (time_t)o->interval, (long)((o->interval - (double)(time_t)o->interval) * 1e9) };
		nanosleep(&ts, NULL);
	}
	return EXIT_OK;
}

static const struct verb verbs[] = {
	{ "status", "status", 0, 0, v_status },
	{ "workers", "workers", 0, 0, v_workers },
	{ "ls", "ls", 0, 0, v_ls },
	{ "show", "show SEQ [--tokens]", 1, 1, v_show },
	{ "evict", "evict SEQ | --worker ID | --detached  [--demote]", 0, 1, v_evict },
	{ "demote", "demote SEQ [--remote]", 1, 1, v_demote },
	{ "fork", "fork SRC DST", 2, 2, v_fork },
	{ "publish", "publish SEQ", 1, 1, v_publish },
	{ "stats", "stats", 0, 0, v_stats },
	{ "config", "config get [KEY] | config set KEY VALUE", 1, 3, v_config },
	{ "watch", "watch [--interval SECONDS] [--count N]", 0, 0, v_watch },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: kvctl [-e ENDPOINT] [--token-file PATH] [--json] [--timeout MS] VERB ...\n"
		   "       kvctl --version\n"
		   "  SEQ is a sequence name, or id:N\n"
		   "  evict, demote and config set need admin rights (docs/design.md §4 \"Access\")\n"
		   "  ls columns: TOKENS token ids kept (the prompt and every generated id: the\n"
		   "  prompt_tokens + generated_tokens of kvworker's statistics), KV\n"
		   "  tokens whose K/V is committed (the id sampled last gets its K/V at the next\n"
		   "  step, so KV is TOKENS - 1 after a generate), DRAM/NVME pages by tier, IO pages\n"
		   "  moving between tiers, LEASES blocks leased by workers, SHARED pages\n"
		   "  shared with other sequences (prefix sharing, fork)\n"
		   "  fork makes DST share every full page of SRC and copy its tail page;\n"
		   "  `kvworker resume --seq DST` continues it\n"
		   "  publish writes a detached sequence to kvstored's Redis tier (remote_url) and\n"
		   "  hands its name over: `kvworker resume` on another host's kvstored adopts it\n");
	for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
		fprintf(f, "  kvctl %s\n", verbs[i].usage);
	fprintf(f, "exit codes: 0 ok, 1 refused by kvstored, 2 usage, 3 kvstored unreachable\n");
}

/* A number option's value: *out, or EXIT_USAGE naming the option and what it wants. */
static int num_arg(const char *opt, const char *val, double min, double *out)
{
	char *end;
	errno = 0;
	*out = strtod(val, &end);
	if (!*val || *end || errno || !(*out >= min))
		return errout(EXIT_USAGE, "%s wants a number >= %g, not '%s'", opt, min, val);
	return EXIT_OK;
}

/* getopt_long: options may appear anywhere (before or after the verb). Returns 0 parsed, 1
 * after --help or --version, -1 after saying what is wrong. */
static int parse(int argc, char **argv, struct opts *o, const char **verb)
{
	enum { O_TIMEOUT = 256, O_TOKEN, O_WORKER, O_INTERVAL, O_COUNT, O_JSON, O_TOKENS,
	       O_DETACHED, O_DEMOTE, O_VERSION, O_REMOTE };
	static const struct option lo[] = {
		{ "endpoint", required_argument, NULL, 'e' },
		{ "timeout", required_argument, NULL, O_TIMEOUT },
		{ "token-file", required_argument, NULL, O_TOKEN },
		{ "worker", required_argument, NULL, O_WORKER },
		{ "interval", required_argument, NULL, O_INTERVAL },
		{ "count", required_argument, NULL, O_COUNT },
		{ "json", no_argument, NULL, O_JSON },
		{ "tokens", no_argument, NULL, O_TOKENS },
		{ "detached", no_argument, NULL, O_DETACHED },
		{ "demote", no_argument, NULL, O_DEMOTE },
		{ "remote", no_argument, NULL, O_REMOTE },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, O_VERSION },
		{ 0, 0, 0, 0 },
	};
	*verb = NULL;
	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
		if (!strcmp(argv[i], "--json"))
			g_json = true; /* errors met while parsing come out as JSON too */
	opterr = 0;
	optind = 1;
	int c;
	double d;
	while ((c = getopt_long(argc, argv, ":e:h", lo, NULL)) != -1) {
		switch (c) {
		case 'e': o->endpoint = optarg; break;
		case O_TIMEOUT:
			if (num_arg("--timeout", optarg, 1, &d))
				return -1;
			o->timeout_ms = d > 3600000 ? 3600000 : (int)d;
			break;
		case O_TOKEN: o->token_file = optarg; break;
		case O_WORKER: o->worker = optarg; break;
		case O_INTERVAL:
			if (num_arg("--interval", optarg, 0.001, &o->interval))
				return -1;
			break;
		case O_COUNT:
			if (num_arg("--count", optarg, 1, &d))
				return -1;
			o->count = (long)d;
			break;
		case O_JSON: o->json = true; break;
		case O_TOKENS: o->tokens = true; break;
		case O_DETACHED: o->detached = true; break;
		case O_DEMOTE: o->demote = true; break;
		case O_REMOTE: o->remote = true; break;
		case 'h': usage(stdout); return 1;
		case O_VERSION: fkv_version_print(stdout, "kvctl"); return 1;
		case ':':
			errout(EXIT_USAGE, "%s needs a value", argv[optind - 1]);
			return -1;
		default:
			errout(EXIT_USAGE, "unknown option %s (kvctl --help lists them)",
			       argv[optind - 1]);
			return -1;
		}
	}
	if (optind >= argc) {
		errout(EXIT_USAGE, "no verb given (kvctl --help lists them)");
		return -1;
	}
	*verb = argv[optind++];
	for (; optind < argc; optind++) {
		if (o->npos == 4) {
			errout(EXIT_USAGE, "too many arguments from '%s' on", argv[optind]);
			return -1;
		}
		o->pos[o->npos++] = argv[optind];
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o = { .endpoint = KVS_DEFAULT_ENDPOINT, .timeout_ms = 2000, .interval = 1.0 };
	const char *verb;
	int ret = parse(argc, argv, &o, &verb);
	if (ret > 0)
		return EXIT_OK;
	if (ret < 0)
		return EXIT_USAGE;
	const struct verb *v = NULL;
	for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
		if (!strcmp(verbs[i].name, verb))
			v = &verbs[i];
	if (!v)
		return errout(EXIT_USAGE, "unknown verb '%s' (kvctl --help lists them)", verb);
	if (o.npos < v->min_pos || o.npos > v->max_pos)
		return errout(EXIT_USAGE, "%s takes %s arguments: kvctl %s", v->name,
			      o.npos < v->min_pos ? "more" : "fewer", v->usage);
	struct kvs *k;
	ret = kvs_connect(o.endpoint, o.timeout_ms, &k);
	if (ret)
		return errout(ret == -EINVAL || ret == -EPROTONOSUPPORT ? EXIT_USAGE : EXIT_UNREACHABLE,
			      "cannot connect to %s: %s", o.endpoint, strerror(-ret));
	if (o.token_file && kvs_set_token_file(k, o.token_file)) {
		errout(EXIT_USAGE, "%s", kvs_error(k));
		kvs_close(k);
		return EXIT_USAGE;
	}
	int rc = v->fn(k, &o);
	kvs_close(k);
	return rc;
}
