/* config — the key table and its parser. See config.h. */
#include "config.h"

#include "conffile.h"
#include "slab.h"

#include "errmsg.h"
#include "sched_slice.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum cfg_type { CFG_T_STRING, CFG_T_BOOL, CFG_T_U64, CFG_T_BYTES, CFG_T_LEVEL };

struct cfg_key {
	const char *name;
	enum cfg_type type;
	size_t off;		/* offset of the field in struct cfg */
	uint64_t min, max;	/* numeric bounds (inclusive); for strings, max length */
	const char *def;
	bool runtime;		/* may change while running (ConfigSet, SIGHUP) */
	const char *help;
};

#define F(field) offsetof(struct cfg, field)

static const struct cfg_key keys[] = {
	{ "endpoint", CFG_T_STRING, F(endpoint), 1, CFG_STR_MAX - 1, CFG_DEFAULT_ENDPOINT, false,
	  "ZeroMQ ROUTER endpoint: ipc://PATH, or tcp:// on a loopback address only" },
	{ "shm_name", CFG_T_STRING, F(shm_name), 2, 200, "/freekv-pool", false,
	  "POSIX shared-memory name of the DRAM pool (rings are <shm_name>-ring-<worker>)" },
	{ "dram_bytes", CFG_T_BYTES, F(dram_bytes), SLAB_UNIT_DEFAULT, 1ull << 46, "1G", false,
	  "size of the DRAM pool (K/M/G/T suffixes; whole 2 MiB slab units are used)" },
	{ "hugetlbfs_path", CFG_T_STRING, F(hugetlbfs_path), 0, CFG_STR_MAX - 1, "", false,
	  "hugetlbfs mount to back the pool with huge pages (empty: /dev/shm)" },
	{ "lock_memory", CFG_T_BOOL, F(lock_memory), 0, 1, "true", false,
	  "mlock the pool (needs LimitMEMLOCK=infinity / ulimit -l unlimited)" },
	{ "group", CFG_T_STRING, F(group), 0, 64, "", false,
	  "group owning the pool, rings and ipc socket, mode 0660 (empty: the daemon's group)" },
	{ "admin_group", CFG_T_STRING, F(admin_group), 0, 64, "", false,
	  "group whose members may evict, demote, set config and touch any sequence (besides "
	  "root and the daemon's own user)" },
	{ "worker_group", CFG_T_STRING, F(worker_group), 0, 64, "freekv", false,
	  "group whose members may say Hello as workers and use their own sequences" },
	{ "auth_token_file", CFG_T_STRING, F(auth_token_file), 0, CFG_STR_MAX - 1, "", false,
	  "tcp endpoints: file (mode 0600) holding the token a client must send in Hello" },
	{ "tcp_insecure", CFG_T_BOOL, F(tcp_insecure), 0, 1, "false", false,
	  "serve a tcp endpoint without auth_token_file: every local user is admin" },
	{ "nvme_path", CFG_T_STRING, F(nvme_path), 0, CFG_STR_MAX - 1, "/var/lib/freekv/tier.bin", false,
	  "file or block device of the NVMe tier, opened O_DIRECT (empty: no tier)" },
	{ "nvme_bytes", CFG_T_BYTES, F(nvme_bytes), 0, 1ull << 50, "4G", false,
	  "size of the NVMe tier file (preallocated)" },
	{ "nvme_prewrite", CFG_T_BOOL, F(nvme_prewrite), 0, 1, "true", false,
	  "write zeros once, in the background, over the tier file's space never written, so that "
	  "a block's first write there is not also a filesystem metadata change the journal's "
	  "syncs wait for (a file tier only)" },
	{ "nvme_keep_copies", CFG_T_BOOL, F(nvme_keep_copies), 0, 1, "true", true,
	  "a block promoted from NVMe keeps its extent there while unchanged, so demoting it "
	  "again writes nothing (the copies give way when the tier fills)" },
	{ "persist", CFG_T_BOOL, F(persist), 0, 1, "true", false,
	  "journal sequence and block metadata and re-adopt the pool and tier at start, so a "
	  "restart loses no committed token (needs nvme_path or journal_path)" },
	{ "journal_path", CFG_T_STRING, F(journal_path), 0, CFG_STR_MAX - 1, "", false,
	  "metadata journal (empty: <nvme_path>.journal)" },
	{ "journal_compact_bytes", CFG_T_BYTES, F(journal_compact_bytes), 4096, 1ull << 40, "64M",
	  true, "compact the journal into a snapshot once it grows past this size" },
	{ "journal_compact_step", CFG_T_U64, F(journal_compact_step), 1, 1u << 20, "512", true,
	  "records of the snapshot written per data-plane pass while the journal is compacted "
	  "(larger: a compaction ends sooner, each step holds the rings up longer)" },
	{ "journal_preallocate", CFG_T_BYTES, F(journal_preallocate), 0, 1ull << 30, "16M", false,
	  "zeros kept written past the journal's end, so that a group commit's fdatasync does not "
	  "also commit the filesystem's metadata for a grown file (0: append)" },
	{ "dram_high_watermark", CFG_T_U64, F(dram_high_watermark), 1, 100, "90", true,
	  "percent of the pool in use above which blocks are demoted to NVMe" },
	{ "dram_low_watermark", CFG_T_U64, F(dram_low_watermark), 0, 99, "75", true,
	  "percent of the pool in use that demotion brings usage down to" },
	{ "alloc_wait_ms", CFG_T_U64, F(alloc_wait_ms), 0, 600000, "2000", true,
	  "an ALLOC, or a RECALL's promotion, that finds DRAM full of leased or uncommitted blocks "
	  "waits this long for them to be released or committed and demoted, then fails with "
	  "ENOSPC (0: fail at once)" },
	{ "heartbeat_timeout_ms", CFG_T_U64, F(heartbeat_timeout_ms), 100, 3600000, "5000", true,
	  "a worker silent this long is declared dead (its pid is also watched)" },
	{ "ring_entries", CFG_T_U64, F(ring_entries), 8, 65536, "1024", false,
	  "entries in each worker's submission and completion ring (a power of two)" },
	{ "max_workers", CFG_T_U64, F(max_workers), 1, 1024, "64", false,
	  "most clients (workers and kvctl sessions) registered at once" },
	{ "max_sequences", CFG_T_U64, F(max_sequences), 1, 1000000, "4096", false,
	  "most sequences kept at once" },
	{ "max_tokens", CFG_T_U64, F(max_tokens), 1, 1ull << 26, "1048576", true,
	  "most token ids kept per sequence" },
	{ "max_request_bytes", CFG_T_BYTES, F(max_request_bytes), 1024, 1ull << 30, "16M", true,
	  "control frames larger than this are refused without decoding" },
	{ "io_queue_depth", CFG_T_U64, F(io_queue_depth), 1, 4096, "64", false,
	  "io_uring queue depth of the NVMe tier" },
	{ "slice_us", CFG_T_U64, F(slice_us), 0, SCHED_SLICE_MAX_US, "0", false,
	  "scheduler time slice to ask for, in microseconds: 0 (the scheduler's own) or 100 to "
	  "100000 (Linux 6.12+); short slices let the daemon's threads, once woken, preempt "
	  "CPU-bound work on a busy host instead of waiting for a core" },
	{ "log_level", CFG_T_LEVEL, F(log_level), CFG_LOG_ERROR, CFG_LOG_DEBUG, "info", true,
	  "error, warn, info or debug" },
	{ "metrics_listen", CFG_T_STRING, F(metrics_listen), 0, CFG_STR_MAX - 1, "", false,
	  "loopback HOST:PORT serving Prometheus /metrics (empty: none)" },
	{ "remote_url", CFG_T_STRING, F(remote_url), 0, CFG_STR_MAX - 1, "", false,
	  "Redis server (redis://HOST:PORT), or seed nodes of a Redis Cluster "
	  "(redis://HOST:PORT,HOST:PORT...), where sequences are published for other hosts to "
	  "adopt (empty: none)" },
	{ "remote_namespace", CFG_T_STRING, F(remote_namespace), 1, 100, "freekv", false,
	  "prefix of every Redis key this daemon writes" },
	{ "remote_host_id", CFG_T_STRING, F(remote_host_id), 0, 120, "", false,
	  "this daemon's name in Redis leases (empty: <hostname>:<shm_name>)" },
	{ "remote_timeout_ms", CFG_T_U64, F(remote_timeout_ms), 10, 600000, "2000", false,
	  "a Redis call that takes longer fails (the local tiers are not affected)" },
	{ "remote_lease_ms", CFG_T_U64, F(remote_lease_ms), 1000, 86400000, "30000", false,
	  "how long a host's ownership of an adopted sequence's name lasts unless renewed" },
	{ "remote_publish", CFG_T_BOOL, F(remote_publish), 0, 1, "false", true,
	  "publish a sequence to Redis whenever its worker detaches it" },
	{ "remote_tier", CFG_T_BOOL, F(remote_tier), 0, 1, "false", false,
	  "a tier below NVMe in Redis (remote_url): cold NVMe blocks move there above "
	  "nvme_high_watermark and come back on recall" },
	{ "remote_prefix", CFG_T_BOOL, F(remote_prefix), 0, 1, "false", false,
	  "prefix pages published here are written to Redis too, and a prompt's pages not in the "
	  "pool are looked for there (needs remote_tier; hosts share only with the same build "
	  "and CPU model)" },
	{ "remote_prefix_ttl_s", CFG_T_U64, F(remote_prefix_ttl_s), 0, 315360000, "86400", false,
	  "seconds a prefix page stays in Redis after it was written or last found by a host "
	  "(0: until deleted by hand)" },
	{ "nvme_high_watermark", CFG_T_U64, F(nvme_high_watermark), 1, 100, "90", true,
	  "percent of the NVMe tier in use above which blocks move to the remote tier" },
	{ "nvme_low_watermark", CFG_T_U64, F(nvme_low_watermark), 0, 99, "75", true,
	  "percent of the NVMe tier in use that the move to the remote tier brings usage down to" },
};

#undef F

static const char *const level_names[] = { "error", "warn", "info", "debug" };

static const struct cfg_key *find_key(const char *name)
{
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
		if (strcmp(keys[i].name, name) == 0)
			return &keys[i];
	return NULL;
}

int cfg_parse_bytes(const char *s, uint64_t *out)
{
	char *end;
	if (!s || !isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno)
		return -EINVAL;
	unsigned shift = 0;
	switch (toupper((unsigned char)*end)) {
	case 'K': shift = 10; end++; break;
	case 'M': shift = 20; end++; break;
	case 'G': shift = 30; end++; break;
	case 'T': shift = 40; end++; break;
	default: break;
	}
	if (shift && (*end == 'i' || *end == 'I') && (end[1] == 'B' || end[1] == 'b'))
		end += 2;
	else if (shift && (*end == 'B' || *end == 'b'))
		end++;
	if (*end != '\0')
		return -EINVAL;
	if (shift && v > (UINT64_MAX >> shift))
		return -ERANGE;
	*out = (uint64_t)v << shift;
	return 0;
}

static int parse_bool(const char *s, bool *out)
{
	static const char *const yes[] = { "true", "yes", "on", "1" };
	static const char *const no[] = { "false", "no", "off", "0" };
	for (size_t i = 0; i < 4; i++) {
		if (strcasecmp(s, yes[i]) == 0)
			return *out = true, 0;
		if (strcasecmp(s, no[i]) == 0)
			return *out = false, 0;
	}
	return -EINVAL;
}

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;
	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end)
		return -EINVAL;
	*out = v;
	return 0;
}

/* Parse `value` for key k into a scratch value; store only when it is valid. */
static int set_key(struct cfg *c, const struct cfg_key *k, const char *value, char *err, size_t errlen)
{
	char *field = (char *)c + k->off;
	uint64_t v = 0;
	bool b;
	int ret = 0;

	switch (k->type) {
	case CFG_T_STRING: {
		size_t n = strlen(value);
		if (n < k->min || n > k->max) {
			errmsg_set(err, errlen, "%s: length %zu outside [%" PRIu64 ", %" PRIu64 "]",
			       k->name, n, k->min, k->max);
			return -EINVAL;
		}
		memcpy(field, value, n + 1);
		return 0;
	}
	case CFG_T_BOOL:
		if (parse_bool(value, &b) < 0) {
			errmsg_set(err, errlen, "%s: '%s' is not a boolean (true/false)", k->name, value);
			return -EINVAL;
		}
		*(bool *)field = b;
		return 0;
	case CFG_T_LEVEL:
		ret = -EINVAL;
		for (uint64_t i = 0; i < sizeof level_names / sizeof level_names[0]; i++)
			if (strcasecmp(value, level_names[i]) == 0)
				v = i, ret = 0;
		if (ret) {
			errmsg_set(err, errlen, "%s: '%s' is not one of error, warn, info, debug", k->name, value);
			return ret;
		}
		break;
	case CFG_T_BYTES:
		ret = cfg_parse_bytes(value, &v);
		break;
	case CFG_T_U64:
		ret = parse_u64(value, &v);
		break;
	}
	if (ret) {
		errmsg_set(err, errlen, "%s: '%s' is not a %s", k->name, value,
		       k->type == CFG_T_BYTES ? "size (number with optional K/M/G/T)" : "number");
		return -EINVAL;
	}
	if (v < k->min || v > k->max) {
		errmsg_set(err, errlen, "%s: %" PRIu64 " outside [%" PRIu64 ", %" PRIu64 "]", k->name, v,
		       k->min, k->max);
		return -EINVAL;
	}
	*(uint64_t *)field = v;
	return 0;
}

void cfg_defaults(struct cfg *c)
{
	memset(c, 0, sizeof *c);
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
		int ret = set_key(c, &keys[i], keys[i].def, NULL, 0);
		assert(ret == 0); /* a bad default is a bug in the table */
		(void)ret;
	}
}

int cfg_set(struct cfg *c, const char *key, const char *value, bool runtime, char *err, size_t errlen)
{
	const struct cfg_key *k = find_key(key);
	if (!k) {
		errmsg_set(err, errlen, "unknown key '%s'", key);
		return -ENOENT;
	}
	if (runtime && !k->runtime) {
		errmsg_set(err, errlen, "%s cannot change while kvstored runs (restart it)", key);
		return -EPERM;
	}
	struct cfg next = *c;
	int ret = set_key(&next, k, value, err, errlen);
	if (ret)
		return ret;
	/* While running, the result must hold together now; at start-up cfg_validate() runs once
	 * after every --set, so their order does not matter. */
	if (runtime && (ret = cfg_validate(&next, err, errlen)))
		return ret;
	*c = next;
	return 0;
}

static char *trim(char *s)
{
	while (isspace((unsigned char)*s))
		s++;
	char *e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

int cfg_set_arg(struct cfg *c, const char *kv, char *err, size_t errlen)
{
	char buf[CFG_STR_MAX * 2];
	if (strlen(kv) >= sizeof buf) {
		errmsg_set(err, errlen, "--set argument too long");
		return -EINVAL;
	}
	strcpy(buf, kv);
	char *eq = strchr(buf, '=');
	if (!eq) {
		errmsg_set(err, errlen, "'%s' is not key=value", kv);
		return -EINVAL;
	}
	*eq = '\0';
	return cfg_set(c, trim(buf), trim(eq + 1), false, err, errlen);
}

/* cfg_load_file; with runtime, the keys that differ from the running value but cannot change
 * while running are listed in restart (comma-separated; may be NULL). */
static int load_file(struct cfg *c, const char *path, bool runtime, char *restart, size_t rlen,
		     char *err, size_t errlen)
{
	if (restart && rlen)
		restart[0] = '\0';
	struct cfg next = *c;
	char sub[CFG_ERR_MAX];
	int ret = 0;
	/* The lines are read by the one `key = value` reader (common/conffile), which hands each as
	 * the pair "--key", "value"; this table gives the keys their types. */
	struct conffile cf;
	ret = conffile_read(path, &cf, err, errlen);
	if (ret)
		return ret;
	for (int n = 0; n < cf.n && !ret; n++) {
		const char *key = cf.argv[2 * n] + 2, *value = cf.argv[2 * n + 1];
		int lineno = cf.line[n];
		const struct cfg_key *k = find_key(key);
		if (!k) {
			errmsg_set(err, errlen, "%s:%d: unknown key '%s'", path, lineno, key);
			ret = -ENOENT;
			break;
		}
		struct cfg probe = next;
		ret = set_key(&probe, k, value, sub, sizeof sub);
		if (ret) {
			errmsg_set(err, errlen, "%s:%d: %s", path, lineno, sub);
			break;
		}
		if (!runtime || k->runtime) {
			next = probe;
		} else if (restart) {
			char was[256], now[256];
			if (cfg_get(&next, key, was, sizeof was) >= 0 &&
			    cfg_get(&probe, key, now, sizeof now) >= 0 && strcmp(was, now)) {
				size_t l = strlen(restart);
				snprintf(restart + l, rlen - l, "%s%s", l ? ", " : "", key);
			}
		}
	}
	conffile_free(&cf);
	if (ret)
		return ret;
	ret = cfg_validate(&next, sub, sizeof sub);
	if (ret) {
		errmsg_set(err, errlen, "%s: %s", path, sub);
		return ret;
	}
	*c = next;
	return 0;
}

/* tcp endpoints must name a loopback host: the trust boundary is the host (docs/design.md §4). */
int cfg_load_file(struct cfg *c, const char *path, bool runtime, char *err, size_t errlen)
{
	return load_file(c, path, runtime, NULL, 0, err, errlen);
}

int cfg_reload_file(struct cfg *c, const char *path, char *restart, size_t rlen, char *err,
		    size_t errlen)
{
	return load_file(c, path, true, restart, rlen, err, errlen);
}

static bool tcp_is_loopback(const char *hostport)
{
	static const char *const ok[] = { "127.", "localhost:", "[::1]:" };
	for (size_t i = 0; i < 3; i++)
		if (strncmp(hostport, ok[i], strlen(ok[i])) == 0)
			return true;
	return false;
}

int cfg_validate(const struct cfg *c, char *err, size_t errlen)
{
	if (c->dram_low_watermark >= c->dram_high_watermark) {
		errmsg_set(err, errlen, "dram_low_watermark (%" PRIu64 ") must be below dram_high_watermark (%" PRIu64 ")",
		       c->dram_low_watermark, c->dram_high_watermark);
		return -EINVAL;
	}
	if (strncmp(c->endpoint, "tcp://", 6) == 0) {
		if (!tcp_is_loopback(c->endpoint + 6)) {
			errmsg_set(err, errlen, "endpoint %s: tcp is accepted only on a loopback address", c->endpoint);
			return -EINVAL;
		}
		/* tcp carries no peer credentials: without a token any local user would be admin. */
		if (!c->auth_token_file[0] && !c->tcp_insecure) {
			errmsg_set(err, errlen, "endpoint %s: a tcp endpoint needs auth_token_file (or "
				   "tcp_insecure = true to let every local user in as admin)", c->endpoint);
			return -EINVAL;
		}
	} else if (strncmp(c->endpoint, "ipc://", 6) != 0 || !c->endpoint[6]) {
		errmsg_set(err, errlen, "endpoint %s: use ipc://PATH or tcp://127.0.0.1:PORT", c->endpoint);
		return -EINVAL;
	}
	if (c->shm_name[0] != '/' || strchr(c->shm_name + 1, '/')) {
		errmsg_set(err, errlen, "shm_name %s: must be /NAME with no other '/'", c->shm_name);
		return -EINVAL;
	}
	if (!sched_slice_valid(c->slice_us)) {
		errmsg_set(err, errlen, "slice_us %" PRIu64 ": must be 0 or %u to %u", c->slice_us,
			   SCHED_SLICE_MIN_US, SCHED_SLICE_MAX_US);
		return -EINVAL;
	}
	if (c->ring_entries & (c->ring_entries - 1)) {
		errmsg_set(err, errlen, "ring_entries %" PRIu64 ": must be a power of two", c->ring_entries);
		return -EINVAL;
	}
	return 0;
}

int cfg_get(const struct cfg *c, const char *key, char *buf, size_t len)
{
	const struct cfg_key *k = find_key(key);
	if (!k)
		return -ENOENT;
	const char *field = (const char *)c + k->off;
	switch (k->type) {
	case CFG_T_STRING:
		snprintf(buf, len, "%s", field);
		break;
	case CFG_T_BOOL:
		snprintf(buf, len, "%s", *(const bool *)field ? "true" : "false");
		break;
	case CFG_T_LEVEL:
		snprintf(buf, len, "%s", level_names[*(const uint64_t *)field]);
		break;
	case CFG_T_BYTES:
	case CFG_T_U64:
		snprintf(buf, len, "%" PRIu64, *(const uint64_t *)field);
		break;
	}
	return 0;
}

size_t cfg_count(void)
{
	return sizeof keys / sizeof keys[0];
}

const char *cfg_key(size_t i)
{
	return i < cfg_count() ? keys[i].name : NULL;
}

const char *cfg_help(size_t i)
{
	return i < cfg_count() ? keys[i].help : NULL;
}

bool cfg_runtime(size_t i)
{
	return i < cfg_count() && keys[i].runtime;
}

void cfg_print(const struct cfg *c, FILE *f)
{
	char buf[CFG_STR_MAX];
	for (size_t i = 0; i < cfg_count(); i++) {
		cfg_get(c, keys[i].name, buf, sizeof buf);
		fprintf(f, "# %s%s\n%s = %s\n", keys[i].help, keys[i].runtime ? " (run-time)" : "",
			keys[i].name, buf);
	}
}
