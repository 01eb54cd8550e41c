/* config — kvstored's configuration: one declarative table of keys, one parser.
 *
 * Every key (name, type, bounds, default, whether it may change at run time, help) is one row of
 * the table in config.c. The same cfg_set() parses a config file line (`key = value`, `#`
 * comments), a `--set key=value` argument, a SIGHUP reload and a ConfigSet request, so the four
 * can never disagree. struct cfg is a plain value owned by the caller (no heap): the daemon keeps
 * one, tests make their own. Errors are 0 / -errno with a message naming the key in `err`. */
#ifndef FREEKV_CONFIG_H
#define FREEKV_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CFG_STR_MAX 256
#define CFG_ERR_MAX 256
#define CFG_DEFAULT_ENDPOINT "ipc:///run/freekv/kvstored.sock"

enum cfg_log_level { CFG_LOG_ERROR = 0, CFG_LOG_WARN, CFG_LOG_INFO, CFG_LOG_DEBUG };

struct cfg {
	char endpoint[CFG_STR_MAX];
	char shm_name[CFG_STR_MAX];
	uint64_t dram_bytes;
	char hugetlbfs_path[CFG_STR_MAX];
	bool lock_memory;
	char group[CFG_STR_MAX];
	char admin_group[CFG_STR_MAX];	/* docs/design.md §4 "Access" */
	char worker_group[CFG_STR_MAX];
	char auth_token_file[CFG_STR_MAX];
	bool tcp_insecure;
	char nvme_path[CFG_STR_MAX];
	uint64_t nvme_bytes;
	bool persist;			/* journal metadata, re-adopt at start (docs/design.md §4) */
	char journal_path[CFG_STR_MAX];	/* empty: <nvme_path>.journal */
	uint64_t journal_compact_bytes;	/* compact by snapshot once the journal grows past this */
	uint64_t journal_compact_step;	/* snapshot records per data-plane pass */
	uint64_t journal_preallocate;	/* bytes of zeros kept past the journal's end */
	uint64_t dram_high_watermark;	/* percent of the pool in use that starts demotion */
	uint64_t dram_low_watermark;	/* percent demotion brings usage down to */
	uint64_t alloc_wait_ms;		/* a full pool's ALLOC waits this long for room */
	uint64_t heartbeat_timeout_ms;
	uint64_t ring_entries;
	uint64_t max_workers;
	uint64_t max_sequences;
	uint64_t max_tokens;		/* token ids kept per sequence */
	uint64_t max_request_bytes;	/* larger control frames are refused undecoded */
	uint64_t io_queue_depth;
	uint64_t slice_us;		/* scheduler slice to ask for (common/sched_slice.h); 0: its own */
	uint64_t log_level;		/* enum cfg_log_level */
	char metrics_listen[CFG_STR_MAX]; /* HOST:PORT of /metrics; empty: not served */
	/* Beyond one host (docs/design.md §8, remote.h). */
	char remote_url[CFG_STR_MAX];	/* redis://HOST:PORT; empty: no remote tier */
	char remote_namespace[CFG_STR_MAX];
	char remote_host_id[CFG_STR_MAX]; /* empty: <hostname>:<shm_name> */
	uint64_t remote_timeout_ms;
	uint64_t remote_lease_ms;
	bool remote_publish;		/* publish a sequence when its worker detaches it */
	bool remote_tier;		/* demote cold NVMe blocks to Redis (docs/design.md §8) */
	bool remote_prefix;		/* prefix pages found across hosts through Redis */
	uint64_t remote_prefix_ttl_s;	/* their expiry in Redis, renewed when found; 0: none */
	uint64_t nvme_high_watermark;	/* percent of the NVMe tier in use that starts it */
	uint64_t nvme_low_watermark;	/* percent it brings usage down to */
	bool nvme_prewrite;		/* zeros over the tier file's unwritten space, once */
	bool nvme_keep_copies;		/* a promoted block's extent kept for its next demotion */
};

/* Fill every key with its default. */
void cfg_defaults(struct cfg *c);

/* Parse and store one value. `runtime` true refuses keys that cannot change while running
 * (-EPERM) and checks the result with cfg_validate(). Unknown key -ENOENT, bad value or out of
 * bounds -EINVAL. On error *c is unchanged. */
int cfg_set(struct cfg *c, const char *key, const char *value, bool runtime, char *err, size_t errlen);

/* Parse "key=value" (as given to --set); cross-key checks are left to cfg_validate(). */
int cfg_set_arg(struct cfg *c, const char *kv, char *err, size_t errlen);

/* Read a config file. With `runtime` only run-time keys are applied and the others are checked
 * but ignored (the SIGHUP reload). Error messages name the file and line. */
int cfg_load_file(struct cfg *c, const char *path, bool runtime, char *err, size_t errlen);
/* The SIGHUP reload: cfg_load_file with runtime, and in restart (comma-separated) the keys whose
 * value in the file differs from the running one but that only a restart applies. */
int cfg_reload_file(struct cfg *c, const char *path, char *restart, size_t rlen, char *err,
		    size_t errlen);

/* Cross-key checks (watermarks ordered, tcp endpoints on loopback only). */
int cfg_validate(const struct cfg *c, char *err, size_t errlen);

/* Format one key's current value into buf. -ENOENT for an unknown key. */
int cfg_get(const struct cfg *c, const char *key, char *buf, size_t len);

/* Table iteration: number of keys, and the i-th key's name / help / run-time flag. */
size_t cfg_count(void);
const char *cfg_key(size_t i);
const char *cfg_help(size_t i);
bool cfg_runtime(size_t i);

/* Write every key as `key = value` with its help as a comment (what --print-config shows, and
 * valid input for cfg_load_file). */
void cfg_print(const struct cfg *c, FILE *f);

/* "1G" -> 1073741824; plain numbers and K/M/G/T suffixes (powers of 1024). */
int cfg_parse_bytes(const char *s, uint64_t *out);

#endif
