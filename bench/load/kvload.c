/* kvload — a full host's load on one kvstored, with faults, and a verdict. See load.h and
 * bench/load/README.md.
 *
 *   kvload --quick [--faults] [--duration S]            what CI and the slow test run
 *   kvload --workers 32 --sequences 10000 --blocks 1000000 --duration 600 --faults
 *
 * It starts its own kvstored (temporary shm name, ipc endpoint and NVMe file) unless --endpoint
 * names a running one, measures a one-worker baseline, then runs N worker processes for the
 * steady phase while it injects faults: kill -9 of a worker (a replacement resumes its sequences
 * and checks them whole), a worker stopped past the liveness timeout and continued (it must
 * reconnect), a hostile ring client, and a pool smaller than the data (demotion and swaps).
 * Optionally real `kvworker generate` processes decode beside the load; their tokens must equal
 * their runs alone. At the end every committed block of every sequence is read back and checked.
 * Exit 0 only when nothing was lost or wrong, no forged op was accepted, every generation was
 * exact and the daemon is still up. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "load.h"
#include "sched_slice.h"

#ifndef FREEKV_BUILD_DIR
#define FREEKV_BUILD_DIR "build"
#endif

#define MAX_WORKERS 256
#define MAX_GENS 16

#define DAEMON_SETS_MAX 8

struct opts {
	struct load_cfg c;
	bool faults, json;
	double baseline_s;
	int daemon_nice;		/* kvstored's nice value (the unit's -10 by default) */
	uint64_t dram_mib, nvme_mib, heartbeat_ms;
	const char *kvstored, *kvworker, *model;
	unsigned generations;
	uint64_t blocks;	/* --blocks: sets pages per sequence */
	const char *daemon_sets[DAEMON_SETS_MAX];	/* --daemon-set KEY=VALUE, in order */
	unsigned n_daemon_sets;
};

struct child {
	pid_t pid;
	int fd;
	unsigned wi;
	bool hostile;
	bool killed;			/* by kvload (a fault) */
	struct load_slot *slot;		/* what a worker counted so far (NULL: hostile) */
};

static struct {
	pid_t daemon;
	char dir[64], endpoint[128], shm[64], nvme[128];
} g;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvload [--quick] [--workers N] [--sequences N] [--blocks N | --pages N]\n"
		"              [--layers N] [--duration S] [--rate OPS] [--faults] [--baseline S]\n"
		"              [--dram-mib N] [--nvme-mib N] [--heartbeat-ms N] [--seed N]\n"
		"              [--generations N --kvworker PATH --model PATH] [--kvstored PATH]\n"
		"              [--endpoint EP] [--daemon-nice N] [--daemon-set KEY=VALUE]...\n"
		"              [--worker-slice-us N] [--json]\n"
		"  --quick: 4 workers, 64 sequences x 16 pages x 2 layers (8 MiB), 10 s, a pool of 8 MiB\n"
		"  --daemon-nice: the kvstored it starts runs at this nice value, as kvstored.service\n"
		"    sets it (default -10; kept at 0 where lowering it is not permitted)\n"
		"  --daemon-set: one more kvstored --set for the daemon it starts (up to 8), e.g.\n"
		"    persist=false to measure without the journal\n"
		"  --worker-slice-us: the worker processes (the baselines' too) ask the scheduler for\n"
		"    slices of N us, %u to %u, as `kvworker --slice-us N` does (default 0: the\n"
		"    scheduler's own); the generations keep the scheduler's\n"
		"  exit 0: nothing lost or wrong, no forged op accepted, generations exact\n",
		SCHED_SLICE_MIN_US, SCHED_SLICE_MAX_US);
}

struct slice_try {
	unsigned us;
	int ret;
	char err[200];
};

static void *slice_try(void *arg)
{
	struct slice_try *t = arg;
	t->ret = sched_slice_request(0, t->us, t->err, sizeof t->err);
	return NULL;
}

/* Whether the workers' slice request will be taken, tried on a thread of its own so that
 * kvload's (and the daemon's and generations' it forks) stay the scheduler's. */
static int slice_probe(unsigned us)
{
	struct slice_try t = { .us = us };
	pthread_t th;
	if (pthread_create(&th, NULL, slice_try, &t) || pthread_join(th, NULL))
		return -1;
	if (t.ret)
		fprintf(stderr, "kvload: --worker-slice-us: %s\n", t.err);
	return t.ret;
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "quick", no_argument, NULL, 'q' },	{ "workers", required_argument, NULL, 'w' },
		{ "sequences", required_argument, NULL, 's' }, { "blocks", required_argument, NULL, 'b' },
		{ "pages", required_argument, NULL, 'p' }, { "layers", required_argument, NULL, 'l' },
		{ "duration", required_argument, NULL, 'd' }, { "rate", required_argument, NULL, 'r' },
		{ "faults", no_argument, NULL, 'f' },	{ "baseline", required_argument, NULL, 'B' },
		{ "dram-mib", required_argument, NULL, 'D' }, { "nvme-mib", required_argument, NULL, 'N' },
		{ "heartbeat-ms", required_argument, NULL, 'H' }, { "seed", required_argument, NULL, 'S' },
		{ "generations", required_argument, NULL, 'g' }, { "kvworker", required_argument, NULL, 'K' },
		{ "model", required_argument, NULL, 'm' }, { "kvstored", required_argument, NULL, 'k' },
		{ "endpoint", required_argument, NULL, 'e' }, { "json", no_argument, NULL, 'j' },
		{ "daemon-nice", required_argument, NULL, 'n' },
		{ "daemon-set", required_argument, NULL, 'x' },
		{ "worker-slice-us", required_argument, NULL, 'L' },
		{ "help", no_argument, NULL, 'h' },	{ 0, 0, 0, 0 },
	};
	int c;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 'q':
			o->c.workers = 4, o->c.sequences = 64, o->c.pages = 16, o->c.duration_s = 10;
			o->dram_mib = 8, o->nvme_mib = 64, o->baseline_s = 1;
			break;
		case 'w': o->c.workers = (unsigned)atoi(optarg); break;
		case 's': o->c.sequences = (unsigned)atoi(optarg); break;
		case 'b': o->blocks = strtoull(optarg, NULL, 10); break;
		case 'p': o->c.pages = (unsigned)atoi(optarg); break;
		case 'l': o->c.geo.n_layers = (uint32_t)atoi(optarg); break;
		case 'd': o->c.duration_s = atof(optarg); break;
		case 'r': o->c.rate = atof(optarg); break;
		case 'f': o->faults = true; break;
		case 'B': o->baseline_s = atof(optarg); break;
		case 'D': o->dram_mib = strtoull(optarg, NULL, 10); break;
		case 'N': o->nvme_mib = strtoull(optarg, NULL, 10); break;
		case 'H': o->heartbeat_ms = strtoull(optarg, NULL, 10); break;
		case 'S': o->c.seed = strtoull(optarg, NULL, 10); break;
		case 'g': o->generations = (unsigned)atoi(optarg); break;
		case 'K': o->kvworker = optarg; break;
		case 'm': o->model = optarg; break;
		case 'k': o->kvstored = optarg; break;
		case 'e': o->c.endpoint = optarg; break;
		case 'j': o->json = true; break;
		case 'n': o->daemon_nice = atoi(optarg); break;
		case 'x':
			if (o->n_daemon_sets == DAEMON_SETS_MAX || !strchr(optarg, '=')) {
				fprintf(stderr, "kvload: --daemon-set takes KEY=VALUE, at most %d times\n",
					DAEMON_SETS_MAX);
				return -1;
			}
			o->daemon_sets[o->n_daemon_sets++] = optarg;
			break;
		case 'L': o->c.slice_us = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'h': usage(stdout); exit(0);
		default: return -1;
		}
	}
	if (optind != argc)
		return -1;
	if (o->c.slice_us && slice_probe(o->c.slice_us))
		return -1;
	if (o->blocks && o->c.sequences)
		o->c.pages = (unsigned)(o->blocks / ((uint64_t)o->c.sequences * o->c.geo.n_layers));
	if (!o->c.workers || o->c.workers > MAX_WORKERS || !o->c.sequences || !o->c.pages ||
	    !o->c.geo.n_layers || o->c.geo.n_layers > 64 || o->c.duration_s <= 0 ||
	    o->generations > MAX_GENS || (o->generations && (!o->kvworker || !o->model))) {
		fprintf(stderr, "kvload: workers in [1, %d], sequences, pages and layers >= 1, duration "
			"> 0, generations <= %d with --kvworker and --model\n", MAX_WORKERS, MAX_GENS);
		return -1;
	}
	return 0;
}

/* ---------------------------------------------------------------- the daemon */

static int start_daemon(const struct opts *o)
{
	strcpy(g.dir, "/tmp/kvload-XXXXXX");
	if (!mkdtemp(g.dir))
		return -errno;
	snprintf(g.endpoint, sizeof g.endpoint, "ipc://%s/kvstored.sock", g.dir);
	snprintf(g.shm, sizeof g.shm, "/kvload-%d", (int)getpid());
	snprintf(g.nvme, sizeof g.nvme, "%s/tier.bin", g.dir);
	char sets[8][200];
	snprintf(sets[0], 200, "endpoint=%s", g.endpoint);
	snprintf(sets[1], 200, "shm_name=%s", g.shm);
	snprintf(sets[2], 200, "nvme_path=%s", g.nvme);
	snprintf(sets[3], 200, "dram_bytes=%" PRIu64 "M", o->dram_mib);
	snprintf(sets[4], 200, "nvme_bytes=%" PRIu64 "M", o->nvme_mib);
	snprintf(sets[5], 200, "heartbeat_timeout_ms=%" PRIu64, o->heartbeat_ms);
	snprintf(sets[6], 200, "max_sequences=%u", o->c.sequences + 64);
	snprintf(sets[7], 200, "max_workers=%u", o->c.workers + 16 + MAX_GENS);
	const char *argv[24 + 2 * DAEMON_SETS_MAX];
	int n = 0;
	argv[n++] = o->kvstored;
	for (int i = 0; i < 8; i++)
		argv[n++] = "--set", argv[n++] = sets[i];
	argv[n++] = "--set", argv[n++] = "lock_memory=false";
	argv[n++] = "--set", argv[n++] = "log_level=warn";
	for (unsigned i = 0; i < o->n_daemon_sets; i++) /* after ours: the user's win */
		argv[n++] = "--set", argv[n++] = o->daemon_sets[i];
	argv[n] = NULL;
	g.daemon = fork();
	if (g.daemon < 0)
		return -errno;
	if (g.daemon == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (o->daemon_nice && setpriority(PRIO_PROCESS, 0, o->daemon_nice))
			fprintf(stderr, "kvload: kvstored keeps nice 0 (%s)\n", strerror(errno));
		execv(argv[0], (char *const *)argv);
		perror("kvload: exec kvstored");
		_exit(127);
	}
	for (double t0 = load_now_s(); load_now_s() - t0 < 20;) {
		struct kvs *k;
		if (kvs_connect(g.endpoint, 500, &k) == 0) {
			int ret = kvs_stats(k, NULL);
			kvs_close(k);
			if (!ret)
				return 0;
		}
		if (waitpid(g.daemon, NULL, WNOHANG) == g.daemon)
			return -ECHILD;
		usleep(50 * 1000);
	}
	return -ETIMEDOUT;
}

static void stop_daemon(void)
{
	if (g.daemon <= 0)
		return;
	kill(g.daemon, SIGTERM);
	waitpid(g.daemon, NULL, 0);
	/* What the daemon leaves for a restart to adopt (persist is on): the tier, its journal,
	 * the socket, and the pool segment with its lock. */
	DIR *dir = opendir(g.dir);
	for (struct dirent *e; dir && (e = readdir(dir));) {
		char p[400];
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
			snprintf(p, sizeof p, "%s/%s", g.dir, e->d_name);
			unlink(p);
		}
	}
	if (dir)
		closedir(dir);
	rmdir(g.dir);
	char lock[sizeof g.shm + 8];
	snprintf(lock, sizeof lock, "%s.lock", g.shm);
	shm_unlink(g.shm);
	shm_unlink(lock);
}

/* Anonymous resident memory (the daemon's heap: metadata; the pool is shared memory) and CPU
 * seconds of a process. */
static void proc_usage(pid_t pid, uint64_t *anon_kb, double *cpu_s)
{
	char path[64], line[256];
	*anon_kb = 0;
	*cpu_s = 0;
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	if (f) {
		while (fgets(line, sizeof line, f))
			if (sscanf(line, "RssAnon: %" SCNu64, anon_kb) == 1)
				break;
		fclose(f);
	}
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (f) {
		unsigned long ut = 0, st = 0;
		if (fscanf(f, "%*d %*s %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2)
			*cpu_s = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
		fclose(f);
	}
}

/* ---------------------------------------------------------------- children */

static int spawn(struct child *ch, const struct load_cfg *c, unsigned wi, bool hostile,
		 double deadline)
{
	int p[2];
	if (pipe(p) < 0)
		return -errno;
	if (c->slots && !hostile)
		memset(&c->slots[wi], 0, sizeof c->slots[wi]);
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		close(p[0]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		char err[200];
		if (sched_slice_request(0, c->slice_us, err, sizeof err)) {
			fprintf(stderr, "kvload: worker %u: %s\n", wi, err);
			_exit(4);
		}
		_exit(hostile ? load_hostile_run(c, deadline, p[1]) :
				load_worker_run(c, wi, deadline, p[1]));
	}
	close(p[1]);
	*ch = (struct child){ .pid = pid, .fd = p[0], .wi = wi, .hostile = hostile,
			      .slot = c->slots && !hostile ? &c->slots[wi] : NULL };
	return 0;
}

/* Reads all of one struct load_stats from fd; false when the child sent none. */
static bool read_stats(int fd, struct load_stats *got)
{
	size_t at = 0;
	while (at < sizeof *got) {
		ssize_t n = read(fd, (char *)got + at, sizeof *got - at);
		if (n <= 0)
			return false;
		at += (size_t)n;
	}
	return true;
}

/* Adds what a killed worker's slot holds: the fill, once done, and the steady phase up to its
 * last copy (at most LOAD_SLOT_PERIOD_S before the kill). */
static void merge_slot(const struct child *ch, struct load_stats *fill, struct load_stats *s)
{
	if (!ch->slot)
		return;
	if (atomic_load_explicit(&ch->slot->fill_done, memory_order_acquire))
		stats_merge(fill, &ch->slot->fill);
	unsigned n = atomic_load_explicit(&ch->slot->seq, memory_order_acquire);
	if (n)
		stats_merge(s, &ch->slot->steady[(n - 1) & 1]);
}

/* Waits for a child and adds what it sent (its fill, then its steady phase), or, for a worker
 * killed before it could send them, what its slot holds (merge_slot). */
static int reap(struct child *ch, struct load_stats *fill, struct load_stats *s)
{
	int st = 0;
	static struct load_stats got;
	/* Read before waiting: the two reports are larger than a pipe holds. */
	bool sent = read_stats(ch->fd, &got);
	if (sent) {
		stats_merge(fill, &got);
		if (read_stats(ch->fd, &got))
			stats_merge(s, &got);
	}
	close(ch->fd);
	waitpid(ch->pid, &st, 0);
	if (!sent)
		merge_slot(ch, fill, s);
	ch->pid = 0;
	int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	if (rc && !(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && ch->killed))
		fprintf(stderr, "kvload: %s %u ended %s %d\n", ch->hostile ? "hostile client" : "worker",
			ch->wi, WIFEXITED(st) ? "with status" : "by signal",
			WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	return rc;
}

/* ---------------------------------------------------------------- real generations */

static const char *const PROMPTS[MAX_GENS] = {
	"Once upon a time", "One day, a little girl", "Tom and his dog", "There was a big red ball",
	"Mom said it was time", "The sun was shining", "A small bird sat", "Lily wanted to play",
	"Once upon a time, there was a cat", "Ben liked to run", "The little boat", "In the garden",
	"Sue had a red hat", "The old tree", "A tiny mouse", "The rain came down",
};

/* Every odd-numbered generation starts with this text (about 700 tokens of stories260K), so that
 * under load they find one another's prompt pages in kvstored (prefix sharing, docs/design.md
 * §4) and must still print the tokens of their run alone. */
static const char SHARED_PREFIX[] =
	"Once upon a time, there was a little girl named Lily. She loved to play with her toys. "
	"One day, Lily and her mom went to the park to play. They saw a big tree with red apples. "
	"Lily wanted to climb the tree, but her mom said it was too high. Lily was sad, but then "
	"she saw a little dog. The dog was brown and white and had a long tail. Lily and the dog "
	"played with a ball all day. When the sun went down, Lily and her mom went home. Lily "
	"told her dad about the dog and the ball and the big tree. Her dad smiled and said that "
	"tomorrow they could go to the park again. Lily was very happy and went to bed with a "
	"smile. The next day, Lily woke up early. She ate her breakfast and put on her red shoes. "
	"She ran to the door and waited for her mom. They walked to the park and looked for the "
	"little dog. At first they could not find him, but then Lily heard a bark. The dog was "
	"behind the big tree! Lily ran to him and gave him a hug. The dog licked her face and "
	"wagged his tail. Lily and her mom and the dog played all morning. They had a picnic "
	"under the tree and shared their sandwiches with the dog. Lily said the dog was her best "
	"friend. Her mom said that friends are the best thing in the world. ";

/* Runs kvworker generate greedily (store: NULL embedded, else that endpoint) and keeps its
 * stdout (the ids). Returns the pid; the output lands in out_path. */
static pid_t generate(const struct opts *o, unsigned i, const char *store, const char *out_path)
{
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	char err_path[96];
	snprintf(err_path, sizeof err_path, "%.80s.err", out_path);
	if (!freopen(out_path, "w", stdout) || !freopen(err_path, "w", stderr))
		_exit(126);
	char seq[32];
	snprintf(seq, sizeof seq, "gen-%u", i);
	static char prompt[sizeof SHARED_PREFIX + 128];
	snprintf(prompt, sizeof prompt, "%s%s", i % 2 ? SHARED_PREFIX : "", PROMPTS[i]);
	const char *argv[32] = { o->kvworker, "generate", "-m", o->model, "-p", prompt, "-n", "96",
				 "--temp", "0", "--ids", "-t", "1", "--policy", "freekv",
				 "--page-size", "8", "--budget", "64", "--sink", "8", "--window", "16",
				 "-c", "2048" };
	int n = 25;
	if (store) {
		argv[n++] = "--store", argv[n++] = store;
		argv[n++] = "--seq", argv[n++] = seq;
	}
	argv[n] = NULL;
	execv(argv[0], (char *const *)argv);
	_exit(127);
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	static char buf[1 << 16];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	return strdup(buf);
}

/* ---------------------------------------------------------------- report */

static void print_hist_row(const char *name, const struct hist *h, uint64_t ops, double secs)
{
	printf("  %-8s %10" PRIu64 " %10.0f/s  p50 %8.1f us  p99 %8.1f us  p999 %8.1f us\n", name,
	       ops, secs > 0 ? (double)ops / secs : 0, hist_pct(h, 0.5) / 1e3, hist_pct(h, 0.99) / 1e3,
	       hist_pct(h, 0.999) / 1e3);
}

/* Where the ring round trips of s went (ring.h "Timing"). */
static void print_ring_parts(const char *name, const struct load_stats *s)
{
	static const char *const part[PART_N] = { "queued", "served", "woken" };
	printf("  %-8s", name);
	for (int i = 0; i < PART_N; i++)
		printf(" %s p50 %.1f p99 %.1f us%s", part[i], hist_pct(&s->part[i], 0.5) / 1e3,
		       hist_pct(&s->part[i], 0.99) / 1e3, i + 1 < PART_N ? ";" : "");
	uint64_t sum = s->slow_ns[PART_QUEUED] + s->slow_ns[PART_SERVED] + s->slow_ns[PART_WOKEN];
	printf("\n           %" PRIu64 " slower than %.0f ms", s->slow_n, LOAD_SLOW_NS / 1e6);
	if (sum)
		for (int i = 0; i < PART_N; i++)
			printf("%s %.0f%% %s", i ? "," : ":", 100.0 * (double)s->slow_ns[i] / (double)sum, part[i]);
	printf("\n");
}

static uint64_t ring_p99(const struct load_stats *s)
{
	struct hist h = { 0 };
	for (int i = OP_ALLOC; i <= OP_RELEASE; i++)
		hist_merge(&h, &s->h[i]);
	return hist_pct(&h, 0.99);
}

static void stats_of_daemon(Freekv__StatsReply **out, Freekv__Reply **keep)
{
	struct kvs *k;
	*out = NULL;
	*keep = NULL;
	if (kvs_connect(g.endpoint, 5000, &k))
		return;
	if (kvs_stats(k, keep) == 0)
		*out = (*keep)->stats;
	kvs_close(k);
}

/* The daemon writes zeros once over a new tier file (nvme_prewrite): nothing is measured until
 * that is done, so that no figure, the baseline's least, runs beside it. */
static void wait_prewrite(void)
{
	double t0 = load_now_s();
	uint64_t first = 0, left = 1;
	while (left && load_now_s() - t0 < 600) {
		Freekv__StatsReply *s;
		Freekv__Reply *keep;
		stats_of_daemon(&s, &keep);
		left = s ? s->nvme_unwritten_bytes : 0;
		if (!first)
			first = left;
		kvs_reply_free(keep);
		if (left)
			usleep(100 * 1000);
	}
	if (first)
		fprintf(stderr, "kvload: kvstored wrote zeros over %.0f MiB of its new tier file in "
			"%.1f s first%s\n", (double)first / (1 << 20), load_now_s() - t0,
			left ? " (not done after 600 s: going on)" : "");
}

int main(int argc, char **argv)
{
	static struct opts o = {
		.c = { .workers = 32, .sequences = 10000, .pages = 50, .duration_s = 600, .seed = 1,
		       .geo = { .n_layers = 2, .n_kv_heads = 1, .head_dim = 64, .page_size = 16,
				.dtype = 2 } },
		.baseline_s = 5, .dram_mib = 2048, .nvme_mib = 6144, .heartbeat_ms = 2000,
		.daemon_nice = -10,
		.kvstored = FREEKV_BUILD_DIR "/kvstore/kvstored",
	};
	if (parse(argc, argv, &o)) {
		usage(stderr);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	int ret = 0;
	if (!o.c.endpoint) {
		if ((ret = start_daemon(&o))) {
			fprintf(stderr, "kvload: kvstored did not start: %s\n", strerror(-ret));
			stop_daemon();
			return 1;
		}
		o.c.endpoint = g.endpoint;
	}
	wait_prewrite();
	uint64_t blocks = (uint64_t)o.c.sequences * o.c.pages * o.c.geo.n_layers;
	fprintf(stderr, "kvload: %u workers, %u sequences, %" PRIu64 " blocks of %zu bytes (%.2f GiB), "
		"pool %" PRIu64 " MiB + NVMe %" PRIu64 " MiB, %s\n", o.c.workers, o.c.sequences, blocks,
		load_block_bytes(&o.c), (double)blocks * load_block_bytes(&o.c) / (1 << 30), o.dram_mib,
		o.nvme_mib, o.faults ? "faults on" : "no faults");

	/* Reference generations, alone (embedded store), before any load. */
	char *ref[MAX_GENS] = { 0 };
	char outp[MAX_GENS][64];
	for (unsigned i = 0; i < o.generations; i++) {
		snprintf(outp[i], sizeof outp[i], "/tmp/kvload-%d-gen%u.txt", (int)getpid(), i);
		int st;
		waitpid(generate(&o, i, NULL, outp[i]), &st, 0);
		ref[i] = slurp(outp[i]);
		char ep[96];
		snprintf(ep, sizeof ep, "%.80s.err", outp[i]);
		unlink(ep);
		if (!WIFEXITED(st) || WEXITSTATUS(st) || !ref[i] || !ref[i][0]) {
			fprintf(stderr, "kvload: reference generation %u failed\n", i);
			ret = 1;
		}
	}

	/* Which workers have filled their sequences: shared with every child. */
	uint8_t *filled = mmap(NULL, MAX_WORKERS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
			       -1, 0);
	if (filled == MAP_FAILED) {
		fprintf(stderr, "kvload: mmap: %s\n", strerror(errno));
		stop_daemon();
		return 1;
	}
	o.c.filled = filled;
	/* Each worker's counts so far, for those a fault kills. */
	struct load_slot *slots = mmap(NULL, MAX_WORKERS * sizeof *slots, PROT_READ | PROT_WRITE,
				       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (slots == MAP_FAILED) {
		fprintf(stderr, "kvload: mmap: %s\n", strerror(errno));
		stop_daemon();
		return 1;
	}
	o.c.slots = slots;

	/* Baseline: one worker alone on a few sequences of its own. */
	static struct load_stats base, base_fill;
	struct load_cfg bc = o.c;
	bc.workers = 1;
	bc.sequences = 8;
	bc.duration_s = o.baseline_s;
	bc.seed = o.c.seed + 99;
	struct child b;
	double t0 = load_now_s();
	if (!ret && (ret = spawn(&b, &bc, 0, false, t0 + bc.duration_s)) == 0 && reap(&b, &base_fill, &base))
		ret = 1;
	/* The baseline's sequences ("w0-s0".."w0-s7") are the load's too: drop them. */
	{
		struct kvs *k;
		if (kvs_connect(o.c.endpoint, 5000, &k) == 0) {
			Freekv__Reply *r;
			if (kvs_evict(k, FREEKV__EVICT_TARGET__EVICT_TARGET_DETACHED, 0, NULL, 0, false, &r) == 0)
				kvs_reply_free(r);
			kvs_close(k);
		}
	}

	/* The load. */
	memset(filled, 0, MAX_WORKERS);
	static struct child ch[MAX_WORKERS + 1];
	static struct load_stats all, fill;
	uint64_t anon0 = 0, anon_warm = 0, anon_end = 0, faults_kill = 0, faults_stop = 0, fenced = 0;
	uint64_t heap_warm = 0; /* the daemon's malloc'd bytes in use at the warm-up mark */
	double cpu0 = 0, cpu1 = 0;
	if (g.daemon > 0)
		proc_usage(g.daemon, &anon0, &cpu0);
	double start = load_now_s(), deadline = start + o.c.duration_s;
	for (unsigned i = 0; !ret && i < o.c.workers; i++)
		ret = spawn(&ch[i], &o.c, i, false, deadline);
	unsigned n_ch = o.c.workers;
	if (!ret && o.faults)
		ret = spawn(&ch[n_ch++], &o.c, 0, true, deadline);
	pid_t gens[MAX_GENS] = { 0 };
	bool gens_started = false;
	uint64_t rng = o.c.seed * 0x9e3779b97f4a7c15ull | 1;
	double next_fault = start + 2.0, t_filled = 0;
	while (!ret && load_now_s() < deadline) {
		usleep(100 * 1000);
		double now = load_now_s();
		if (!t_filled && load_all_filled(&o.c))
			t_filled = now;
		/* Warm: filled, and a while into the steady phase. */
		bool warm = t_filled && now - start > 0.25 * o.c.duration_s &&
			    now - t_filled > 0.1 * (deadline - t_filled);
		if (!anon_warm && warm) {
			Freekv__Reply *hk;
			Freekv__StatsReply *hs;
			proc_usage(g.daemon, &anon_warm, &cpu1);
			stats_of_daemon(&hs, &hk);
			heap_warm = hs && hs->has_heap_in_use_bytes ? hs->heap_in_use_bytes : 0;
			kvs_reply_free(hk);
		}
		if (o.generations && !gens_started && warm) {
			for (unsigned i = 0; i < o.generations; i++) {
				char p[80];
				snprintf(p, sizeof p, "%.64s.load", outp[i]);
				gens[i] = generate(&o, i, o.c.endpoint, p);
			}
			gens_started = true;
		}
		if (!o.faults || now < next_fault || now > deadline - 2.0)
			continue;
		rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
		struct child *v = &ch[(rng >> 8) % o.c.workers];
		if ((rng >> 3) % 2 == 0) { /* kill -9, and a replacement resumes its sequences */
			kill(v->pid, SIGKILL);
			v->killed = true;
			reap(v, &fill, &all);
			faults_kill++;
			ret = spawn(v, &o.c, v->wi, false, deadline);
		} else { /* stalled past the liveness timeout: the daemon must fence it (kill it
			  * before its blocks go to others); a replacement resumes its sequences */
			kill(v->pid, SIGSTOP);
			usleep((useconds_t)(o.heartbeat_ms * 1500));
			kill(v->pid, SIGCONT);
			faults_stop++;
			int st = 0;
			double until = load_now_s() + 3.0 * (double)o.heartbeat_ms / 1000.0;
			while (waitpid(v->pid, &st, WNOHANG) == 0 && load_now_s() < until)
				usleep(20 * 1000);
			if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
				merge_slot(v, &fill, &all);
				close(v->fd);
				v->pid = 0;
				fenced++;
				ret = spawn(v, &o.c, v->wi, false, deadline);
			}
		}
		next_fault = load_now_s() + 1.0 + (double)((rng >> 20) % 3000) / 1000.0;
	}
	int bad_children = 0;
	for (unsigned i = 0; i < n_ch; i++)
		if (ch[i].pid && reap(&ch[i], &fill, &all) != 0)
			bad_children++;
	double end = load_now_s(), secs = end - start;
	/* The steady phase: from the last worker's fill to the end (0: the fill did not end). */
	double steady = t_filled ? end - t_filled : 0;
	proc_usage(g.daemon, &anon_end, &cpu1);
	cpu1 -= cpu0;
	/* The counters of both phases (the verdict covers the fill too). */
	static struct load_stats tot;
	tot = fill;
	stats_merge(&tot, &all);

	unsigned gen_exact = 0;
	for (unsigned i = 0; i < o.generations && gens_started; i++) {
		int st;
		waitpid(gens[i], &st, 0);
		char p[80];
		snprintf(p, sizeof p, "%.64s.load", outp[i]);
		char *got = slurp(p);
		bool same = got && ref[i] && WIFEXITED(st) && !WEXITSTATUS(st) && !strcmp(got, ref[i]);
		gen_exact += same;
		char ep[96];
		snprintf(ep, sizeof ep, "%.80s.err", p);
		if (!same) {
			char *why = slurp(ep);
			char *last = why ? strrchr(why, '\n') : NULL;
			while (last && last > why && last[-1] != '\n' && last[1] == '\0')
				last--;
			fprintf(stderr, "kvload: generation %u under load differs from its run alone "
				"(exit %d): %s\n", i, WIFEXITED(st) ? WEXITSTATUS(st) : -1,
				why ? why : "");
			free(why);
		}
		free(got);
		unlink(p);
		unlink(ep);
	}

	/* The baseline again, alone, on the full pool: worker 0's sequences of the load (half of
	 * their pages on NVMe now), no other client, no faults. Its worker first checks every block
	 * it owns, which promotes those on NVMe, and is measured only after that, back to back: its
	 * recalls hit DRAM, on a disk gone quiet, in a pool as full as the load left it. So it pays
	 * for no promotion, which the loaded figures do (bench/RESULTS.md, 2026-12-02). */
	static struct load_stats full, full_fill;
	double full_steady = 0;
	if (!ret) {
		struct load_cfg fc = o.c;
		fc.rate = 0;
		fc.seed = o.c.seed + 7;
		fc.steady_s = o.baseline_s; /* after its check of every block it owns */
		struct child fb;
		if (spawn(&fb, &fc, 0, false, load_now_s() + 600) == 0 && reap(&fb, &full_fill, &full))
			ret = 1;
		full_steady = o.baseline_s;
	}
	struct load_stats tot_full = full_fill;
	stats_merge(&tot_full, &full);
	stats_merge(&tot, &tot_full);

	/* Every committed block of every sequence, read back. */
	struct load_stats ver = { 0 };
	double tv = load_now_s();
	int vret = ret ? 0 : load_verify_all(&o.c, &ver);
	tv = load_now_s() - tv;
	Freekv__Reply *keep;
	Freekv__StatsReply *ds;
	stats_of_daemon(&ds, &keep);
	/* Every worker has exited (killed, fenced or done): none of their leases may remain. The
	 * daemon lets a dead worker's go when it sees the death (pidfd, or the liveness timeout for a
	 * silent one), so wait for that, bounded. */
	double lease_deadline = load_now_s() + 3.0 * (double)o.heartbeat_ms / 1000.0 + 2.0;
	while (ds && ds->has_leases && ds->leases && load_now_s() < lease_deadline) {
		kvs_reply_free(keep);
		usleep(50 * 1000);
		stats_of_daemon(&ds, &keep);
	}
	uint64_t leases_left = ds && ds->has_leases ? ds->leases : 0;
	bool daemon_up = ds != NULL;

	char slice[48] = "";
	if (o.c.slice_us)
		snprintf(slice, sizeof slice, ", worker slices %u us", o.c.slice_us);
	printf("kvload: %u workers, %u sequences, %" PRIu64 " blocks, %.1f s%s%s\n", o.c.workers,
	       o.c.sequences, blocks, secs, o.faults ? ", with faults" : "", slice);
	printf("baseline (1 worker, 8 sequences, %.1f s):\n", o.baseline_s);
	for (int i = 0; i < OP_N; i++)
		print_hist_row(load_op_name(i), &base.h[i], base.ops[i], o.baseline_s);
	if (t_filled) {
		printf("fill (every worker as fast as it can): %.1f s, written %.3f GB/s\n",
		       t_filled - start, (double)fill.bytes_written / (t_filled - start) / 1e9);
	} else {
		printf("fill: not finished by the end of the run: no steady phase\n");
	}
	for (int i = 0; i < OP_N; i++)
		print_hist_row(load_op_name(i), &fill.h[i], fill.ops[i], t_filled ? t_filled - start : secs);
	printf("load (steady phase, %.1f s, target %.0f ops/s%s):\n", steady, o.c.rate,
	       o.c.rate > 0 ? "" : " = unlimited");
	for (int i = 0; i < OP_N; i++)
		print_hist_row(load_op_name(i), &all.h[i], all.ops[i], steady);
	printf("baseline on the full pool (1 worker alone on worker 0's sequences after the load; "
	       "its check of them, then back to back):\n");
	for (int i = 0; i < OP_N; i++)
		print_hist_row(load_op_name(i), &full.h[i], full.ops[i], full_steady);
	uint64_t p99b = ring_p99(&base), p99l = ring_p99(&all), p99f = ring_p99(&full);
	uint64_t all_ops = all.ops[OP_ALLOC] + all.ops[OP_COMMIT] + all.ops[OP_RECALL] +
			   all.ops[OP_RELEASE] + all.ops[OP_RPC];
	printf("ring round trip p99: %.1f us loaded (steady) vs %.1f us alone on an empty pool "
	       "(%.2fx), %.1f us alone on the full pool (%.2fx)\n", p99l / 1e3, p99b / 1e3,
	       p99b ? (double)p99l / (double)p99b : 0, p99f / 1e3,
	       p99f ? (double)p99l / (double)p99f : 0);
	printf("ring round trips split (pushed -> popped by kvstored -> posted -> seen by the worker):\n");
	print_ring_parts("alone", &base);
	print_ring_parts("loaded", &all);
	print_ring_parts("full", &full);
	printf("throughput (steady): %.0f ops/s, written %.3f GB/s, read %.3f GB/s\n",
	       steady > 0 ? (double)all_ops / steady : 0,
	       steady > 0 ? (double)all.bytes_written / steady / 1e9 : 0,
	       steady > 0 ? (double)all.bytes_read / steady / 1e9 : 0);
	printf("daemon: heap (RssAnon) %" PRIu64 " KiB at start, %" PRIu64 " KiB after warm-up, %" PRIu64
	       " KiB at the end (%+" PRId64 " KiB since warm-up); CPU %.0f%%\n",
	       anon0, anon_warm, anon_end, (int64_t)anon_end - (int64_t)anon_warm, 100.0 * cpu1 / secs);
	if (ds && ds->has_heap_in_use_bytes && heap_warm)
		printf("daemon: malloc'd in use %" PRIu64 " KiB after warm-up, %" PRIu64 " KiB at the end "
		       "(%+" PRId64 " KiB)\n", heap_warm >> 10, ds->heap_in_use_bytes >> 10,
		       ((int64_t)ds->heap_in_use_bytes - (int64_t)heap_warm) / 1024);
	if (ds)
		printf("pool: %" PRIu64 " of %" PRIu64 " MiB DRAM, %" PRIu64 " of %" PRIu64 " MiB NVMe; blocks "
		       "%" PRIu64 " DRAM, %" PRIu64 " NVMe; demoted %" PRIu64 " (%" PRIu64 " unwritten), "
		       "promoted %" PRIu64 ", swaps %" PRIu64 ", crc errors %" PRIu64 "\n",
		       ds->dram_used_bytes >> 20, ds->dram_bytes >> 20, ds->nvme_used_bytes >> 20,
		       ds->nvme_bytes >> 20, ds->blocks_dram, ds->blocks_nvme, ds->demoted_blocks,
		       ds->demoted_unwritten, ds->promoted_blocks, ds->swaps, ds->crc_errors);
	if (ds && ds->journal)
		printf("journal: %" PRIu64 " MiB, %" PRIu64 " syncs, %" PRIu64 " compactions since start\n",
		       ds->journal->bytes >> 20, ds->journal->syncs, ds->journal->compactions);
	printf("faults: %" PRIu64 " workers killed, %" PRIu64 " stalled past the liveness timeout (%"
	       PRIu64 " fenced by kvstored), %" PRIu64 " forged ring ops (%" PRIu64 " accepted); %"
	       PRIu64 " errors, %" PRIu64 " recoveries, %" PRIu64 " sequences churned\n",
	       faults_kill, faults_stop, fenced, tot.forged, tot.forged_accepted, tot.errors,
	       tot.recoveries, tot.sequences_churned);
	printf("verified: %" PRIu64 " blocks during the load, %" PRIu64 " blocks (%.3f GB) at the end "
	       "in %.1f s; wrong %" PRIu64 ", lost %" PRIu64 "\n",
	       tot.pages_verified, ver.pages_verified, (double)ver.bytes_read / 1e9, tv,
	       tot.mismatches + ver.mismatches, tot.lost + ver.lost);
	printf("leases left after every worker exited: %" PRIu64 "\n", leases_left);
	if (o.generations)
		printf("generations: %u of %u equal to their runs alone; prefix sharing: %" PRIu64
		       " lookups, %" PRIu64 " hits, %" PRIu64 " prompt tokens found in the pool\n",
		       gen_exact, o.generations, ds && ds->prefix ? ds->prefix->lookups : 0,
		       ds && ds->prefix ? ds->prefix->hits : 0,
		       ds && ds->prefix ? ds->prefix->tokens_saved : 0);
	if (tot.first_error)
		printf("first error: %s (%s)\n", tot.first_error_msg, strerror(-tot.first_error));
	if (ver.first_error)
		printf("verify: %s\n", ver.first_error_msg);

	bool ok = !ret && !vret && daemon_up && !bad_children && !tot.mismatches && !ver.mismatches &&
		  !tot.lost && !ver.lost && !tot.forged_accepted && gen_exact == o.generations &&
		  !leases_left;
	if (o.json)
		printf("{\"ok\": %s, \"ops_per_s\": %.1f, \"ring_p99_us\": %.1f, \"ring_p99_alone_us\": %.1f, "
		       "\"ring_p99_alone_full_us\": %.1f, "
		       "\"rss_growth_kib\": %" PRId64 ", \"heap_growth_kib\": %" PRId64 ", \"verified_blocks\": %" PRIu64 ", \"wrong\": %" PRIu64
		       ", \"lost\": %" PRIu64 ", \"kills\": %" PRIu64 ", \"stalls\": %" PRIu64 "}\n",
		       ok ? "true" : "false",
		       steady > 0 ? (double)all_ops / steady : 0,
		       p99l / 1e3, p99b / 1e3, p99f / 1e3, (int64_t)anon_end - (int64_t)anon_warm,
		       ds && heap_warm ? ((int64_t)ds->heap_in_use_bytes - (int64_t)heap_warm) / 1024 : 0,
		       tot.pages_verified + ver.pages_verified, tot.mismatches + ver.mismatches,
		       tot.lost + ver.lost, faults_kill, faults_stop);
	if (!ok)
		printf("FAILED:%s%s%s%s%s%s%s%s\n", ret || vret ? " errors" : "", daemon_up ? "" : " daemon down",
		       bad_children ? " a worker could not recover" : "",
		       tot.mismatches + ver.mismatches ? " wrong bytes" : "", tot.lost + ver.lost ? " lost blocks" : "",
		       tot.forged_accepted ? " forged op accepted" : "",
		       gen_exact != o.generations ? " generation differs" : "",
		       leases_left ? " leases of exited workers left" : "");
	kvs_reply_free(keep);
	for (unsigned i = 0; i < o.generations; i++) {
		free(ref[i]);
		unlink(outp[i]);
	}
	stop_daemon();
	return ok ? 0 : 1;
}
