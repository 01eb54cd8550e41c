/* store_metrics — see store_metrics.h. */
#include "store_metrics.h"

#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "remote_seq.h"

int store_metrics_init(struct store_metrics *m)
{
	return prom_hist_init(&m->rpc_latency, prom_latency_buckets, prom_n_latency_buckets);
}

static void collect(void *ctx, struct prom_buf *b)
{
	struct store_metrics *m = ctx;
	struct dp_stats d;
	struct dp_prefix_stats px;
	struct remote_seq_stats rs;
	bool remote = m->remote && m->remote->r;
	size_t nc = rpc_n_commands();
	struct rpc_stat cmd[64], bad;
	dp_lock(m->dp);
	dp_stats(m->dp, &d);
	dp_prefix_stats(m->dp, &px);
	if (remote)
		remote_seq_stats(m->remote, &rs);
	size_t n_seqs = m->seqs->n, n_workers = m->workers->n;
	for (size_t i = 0; i < nc && i < 64; i++)
		cmd[i] = m->rpc->stats[i];
	bad = m->rpc->bad;
	dp_unlock(m->dp);

	prom_one(b, "freekv_store_dram_bytes", "gauge", "Size of the DRAM pool", (double)d.dram_bytes);
	prom_one(b, "freekv_store_dram_used_bytes", "gauge", "DRAM pool bytes holding blocks",
		 (double)d.dram_used_bytes);
	prom_one(b, "freekv_store_nvme_bytes", "gauge", "Size of the NVMe tier", (double)d.nvme_bytes);
	prom_one(b, "freekv_store_nvme_used_bytes", "gauge", "NVMe tier bytes holding blocks",
		 (double)d.nvme_used_bytes);
	prom_family(b, "freekv_store_blocks", "gauge", "KV blocks by where they are");
	struct prom_label l = { "tier", "dram" };
	prom_sample(b, "freekv_store_blocks", &l, 1, (double)d.blocks_dram);
	l.value = "nvme";
	prom_sample(b, "freekv_store_blocks", &l, 1, (double)d.blocks_nvme);
	l.value = "in_flight";
	prom_sample(b, "freekv_store_blocks", &l, 1, (double)d.blocks_inflight);
	prom_one(b, "freekv_store_leases", "gauge", "Block leases held by workers", (double)d.leases);
	prom_one(b, "freekv_store_pending_ring_ops", "gauge", "Ring ops waiting for a block",
		 (double)d.pending_ops);
	prom_one(b, "freekv_store_tier_io_in_flight", "gauge", "NVMe reads and writes in flight",
		 (double)d.tier_pending);
	prom_one(b, "freekv_store_sequences", "gauge", "Sequences kept", (double)n_seqs);
	uint64_t heap;
	if (rpc_heap_in_use(&heap))
		prom_one(b, "freekv_store_heap_in_use_bytes", "gauge",
			 "Bytes the daemon has malloc'd and not freed (its metadata)", (double)heap);
	prom_one(b, "freekv_store_workers", "gauge", "Registered clients", (double)n_workers);
	prom_one(b, "freekv_store_demoted_blocks_total", "counter", "Blocks moved DRAM to NVMe",
		 (double)d.demoted);
	prom_one(b, "freekv_store_demoted_unwritten_blocks_total", "counter",
		 "Of the blocks demoted, those that went back to the NVMe copy their promotion kept, "
		 "with no write", (double)d.demoted_unwritten);
	prom_one(b, "freekv_store_promoted_blocks_total", "counter", "Blocks moved NVMe to DRAM",
		 (double)d.promoted);
	prom_one(b, "freekv_store_nvme_kept_bytes", "gauge",
		 "NVMe tier bytes still holding copies of blocks promoted to DRAM (in nvme_used_bytes)",
		 (double)d.nvme_kept_bytes);
	prom_one(b, "freekv_store_nvme_unwritten_bytes", "gauge",
		 "Bytes of the NVMe tier file still to be written over with zeros once",
		 (double)d.nvme_unwritten_bytes);
	prom_one(b, "freekv_store_kept_reclaimed_total", "counter",
		 "Kept NVMe copies let go to make room on a full tier", (double)d.kept_reclaimed);
	prom_one(b, "freekv_store_swaps_total", "counter",
		 "DRAM/NVMe swaps done when both tiers were full", (double)d.swaps);
	prom_one(b, "freekv_store_swap_failures_total", "counter", "Swaps given up",
		 (double)d.swap_failures);
	prom_one(b, "freekv_store_checksum_failures_total", "counter",
		 "Blocks read from NVMe whose crc32c did not match", (double)d.crc_errors);
	/* Prefix sharing (docs/design.md §4). */
	prom_one(b, "freekv_store_prefix_lookups_total", "counter",
		 "Sequence opens that looked for their prompt's pages", (double)px.lookups);
	prom_one(b, "freekv_store_prefix_hits_total", "counter",
		 "Prefix lookups that attached one page or more", (double)px.hits);
	prom_one(b, "freekv_store_prefix_misses_total", "counter",
		 "Prefix lookups that found nothing", (double)px.misses);
	prom_one(b, "freekv_store_prefix_pages_attached_total", "counter",
		 "Pages attached by prefix hits and forks", (double)px.pages_attached);
	prom_one(b, "freekv_store_prefix_tokens_saved_total", "counter",
		 "Prompt tokens found in the pool and not prefilled", (double)px.tokens_saved);
	prom_one(b, "freekv_store_prefix_indexed_pages", "gauge", "Pages in the prefix index",
		 (double)px.indexed_pages);
	prom_one(b, "freekv_store_prefix_shared_blocks", "gauge",
		 "Blocks referenced by more than one sequence", (double)px.shared_blocks);
	prom_one(b, "freekv_store_prefix_cached_blocks", "gauge",
		 "Blocks kept only by the prefix index", (double)px.cached_blocks);
	prom_one(b, "freekv_store_prefix_evicted_pages_total", "counter",
		 "Cached pages let go to make room", (double)px.evicted_pages);
	if (remote) { /* the remote tier (docs/design.md §8) */
		prom_one(b, "freekv_store_remote_commands_total", "counter",
			 "Redis commands answered", (double)rs.io.ops);
		prom_one(b, "freekv_store_remote_errors_total", "counter",
			 "Redis calls that failed (unreachable, timed out, error replies)",
			 (double)rs.io.errors);
		prom_one(b, "freekv_store_remote_written_bytes_total", "counter",
			 "Block bytes written to Redis", (double)rs.io.bytes_put);
		prom_one(b, "freekv_store_remote_read_bytes_total", "counter",
			 "Block bytes read from Redis", (double)rs.io.bytes_got);
		prom_one(b, "freekv_store_remote_seconds_total", "counter",
			 "Time spent in Redis calls", rs.io.total_us / 1e6);
		prom_one(b, "freekv_store_remote_checksum_failures_total", "counter",
			 "Blocks read from Redis whose crc32c did not match", (double)rs.io.crc_errors);
		prom_one(b, "freekv_store_remote_published_total", "counter",
			 "Sequences published to Redis", (double)rs.published);
		prom_one(b, "freekv_store_remote_adopted_total", "counter",
			 "Sequences adopted from Redis", (double)rs.adopted);
		prom_one(b, "freekv_store_remote_owned_sequences", "gauge",
			 "Sequences whose Redis lease this daemon holds", (double)rs.owned);
	}
	if (d.remote_tier) { /* the tier below NVMe */
		prom_one(b, "freekv_store_remote_tier_blocks", "gauge",
			 "Blocks whose bytes are in Redis only", (double)d.blocks_remote);
		prom_one(b, "freekv_store_remote_tier_offloaded_blocks_total", "counter",
			 "Blocks moved from NVMe to Redis", (double)d.offloaded);
		prom_one(b, "freekv_store_remote_tier_fetched_blocks_total", "counter",
			 "Blocks brought back from Redis to DRAM", (double)d.fetched);
		prom_one(b, "freekv_store_remote_tier_failures_total", "counter",
			 "Moves to or from Redis that failed", (double)d.remote_errors);
		prom_one(b, "freekv_store_remote_tier_written_bytes_total", "counter",
			 "Block bytes written to Redis by the tier", (double)d.remote_io.bytes_put);
		prom_one(b, "freekv_store_remote_tier_read_bytes_total", "counter",
			 "Block bytes read from Redis by the tier", (double)d.remote_io.bytes_got);
	}
	prom_one(b, "freekv_store_uptime_seconds", "gauge", "Seconds since kvstored started",
		 (double)(clock_ms() - m->start_ms) / 1e3);

	static const char *const fam[3][3] = {
		{ "freekv_store_rpc_requests_total", "counter", "Control requests by command" },
		{ "freekv_store_rpc_errors_total", "counter", "Control requests answered with an error" },
		{ "freekv_store_rpc_seconds_total", "counter", "Time spent handling control requests" },
	};
	for (int f = 0; f < 3; f++) {
		prom_family(b, fam[f][0], fam[f][1], fam[f][2]);
		for (size_t i = 0; i <= nc && i <= 64; i++) {
			const struct rpc_stat *s = i < nc && i < 64 ? &cmd[i] : &bad;
			struct prom_label c = { "command", i < nc && i < 64 ? rpc_command_name(i) :
								       "malformed" };
			double v = f == 0 ? (double)s->calls : f == 1 ? (double)s->errors
							       : (double)s->total_us / 1e6;
			prom_sample(b, fam[f][0], &c, 1, v);
		}
	}
	prom_family(b, "freekv_store_rpc_duration_seconds", "histogram",
		    "Time to handle one control request");
	prom_hist_write(b, "freekv_store_rpc_duration_seconds", NULL, 0, &m->rpc_latency);
	static const char *const rfam[3][3] = {
		{ "freekv_store_ring_ops_total", "counter", "Data-plane ring ops by kind" },
		{ "freekv_store_ring_errors_total", "counter", "Ring ops that failed" },
		{ "freekv_store_ring_seconds_total", "counter", "Time spent serving ring ops" },
	};
	for (int f = 0; f < 3; f++) {
		prom_family(b, rfam[f][0], rfam[f][1], rfam[f][2]);
		for (int k = 0; k < DP_N_OPS; k++) {
			struct prom_label o = { "op", dp_op_name(k) };
			double v = f == 0 ? (double)d.ops[k].calls : f == 1 ? (double)d.ops[k].errors
								    : (double)d.ops[k].total_us / 1e6;
			prom_sample(b, rfam[f][0], &o, 1, v);
		}
	}
}

int store_metrics_start(struct store_metrics *m, const char *listen, char *err, size_t errlen)
{
	return prom_http_start(listen, false, collect, m, &m->http, err, errlen);
}

void store_metrics_shutdown(struct store_metrics *m)
{
	prom_http_stop(m->http);
	m->http = NULL;
	prom_hist_free(&m->rpc_latency);
}
