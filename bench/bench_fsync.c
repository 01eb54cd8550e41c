/* bench_fsync — what one group commit of the journal costs on the file system it lives on
 * (docs/design.md §4, "zeros ahead of the records"), each way against appending, measured in the
 * same run:
 *
 *   files:  WRITES writes of BYTES, each followed by fdatasync, into a fresh file three ways:
 *           append (the file grows: its size and blocks are committed with the data),
 *           overwrite (over zeros written and synced before: data only) and fallocated (into
 *           fallocate()d space: unwritten extents to convert). Once on a quiet disk, once with
 *           LOAD threads doing random 4 KiB O_DIRECT reads and writes on a 256 MiB file
 *           (written first, so reads reach the disk) beside it, as the NVMe tier does.
 *   zeros:  the same records while a second thread keeps 4 MiB of zeros ahead of them (with
 *           the load): with synchronous O_DIRECT writes of 1 MiB, or buffered in 256 KiB
 *           pieces, each written back before the next (the journal's way); the records'
 *           write() time (a thread holding the inode's lock shows here) and their sync.
 *   syncers: 1, 2 and 4 threads, each writing WRITES records into its own stretch of one file
 *           of synced zeros, each record followed by fdatasync (quiet disk): whether syncs of
 *           one file overlap, i.e. what a second group commit in flight beside the first would
 *           gain (syncs/s) and cost (each sync's latency).
 *
 * usage: bench_fsync [WRITES [BYTES [LOAD [DIR]]]]   (default 3000 4096 2 /tmp) */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"

#define AHEAD (4l << 20)
#define PIECE (256l << 10)
#define DIRECT_IO (1l << 20)
#define MAX_LOAD 8

static char dir[256];
static _Atomic bool stop_load, stop_zero;
static _Atomic long zero_end, data_end;

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static int open_file(const char *name, int extra)
{
	char p[512];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	int fd = open(p, O_RDWR | O_CREAT | O_TRUNC | extra, 0600);
	if (fd < 0)
		die(p);
	unlink(p); /* gone at close */
	return fd;
}

#define LOAD_PAGES (1 << 16) /* 256 MiB */

/* Random 4 KiB O_DIRECT reads and writes on the load file, as the tier's I/O. */
static void *load_main(void *arg)
{
	int fd = *(int *)arg;
	void *b;
	if (posix_memalign(&b, 4096, 4096))
		die("posix_memalign");
	memset(b, 0x5a, 4096);
	unsigned seed = (unsigned)(uintptr_t)&b;
	for (long i = 0; !atomic_load(&stop_load); i++) {
		off_t o = (off_t)(rand_r(&seed) % LOAD_PAGES) * 4096;
		ssize_t n = i & 1 ? pwrite(fd, b, 4096, o) : pread(fd, b, 4096, o);
		if (n != 4096)
			die("load I/O");
	}
	free(b);
	return NULL;
}

struct pct {
	double p50, p99, p999, max;
};

static struct pct pcts(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, bench_cmp_d);
	return (struct pct){ v[n / 2], v[n * 99 / 100], v[n * 999 / 1000], v[n - 1] };
}

enum way { APPEND, OVERWRITE, FALLOCATED };

/* Times WRITES write+fdatasync of BYTES into fd from offset base; w[i] the write, s[i] the
 * sync. */
static void records(int fd, off_t base, int writes, int bytes, bool wait_zeros, double *w,
		    double *s)
{
	static char buf[1 << 16];
	memset(buf, 7, sizeof buf);
	for (int i = 0; i < writes; i++) {
		off_t off = base + (off_t)i * bytes;
		while (wait_zeros && off + bytes > atomic_load(&zero_end))
			usleep(10); /* the zeros are behind: the journal waits likewise */
		double t0 = bench_now_s();
		if (pwrite(fd, buf, (size_t)bytes, off) != bytes)
			die("pwrite");
		double t1 = bench_now_s();
		if (fdatasync(fd))
			die("fdatasync");
		w[i] = (t1 - t0) * 1e6;
		s[i] = (bench_now_s() - t1) * 1e6;
		atomic_store(&data_end, off + bytes);
	}
}

static struct pct file_way(enum way way, int writes, int bytes, double *w, double *s)
{
	int fd = open_file("fsync.j", 0);
	long size = (long)writes * bytes + (1l << 20);
	if (way == OVERWRITE) {
		static char z[1 << 20];
		for (long o = 0; o < size; o += (long)sizeof z)
			if (write(fd, z, sizeof z) != (ssize_t)sizeof z)
				die("write");
	} else if (way == FALLOCATED && fallocate(fd, 0, 0, size)) {
		die("fallocate");
	}
	if (fsync(fd))
		die("fsync");
	records(fd, 0, writes, bytes, false, w, s);
	close(fd);
	return pcts(s, writes);
}

struct zeroer {
	int fd;
	bool direct;
};

/* Keeps AHEAD of zeros past the records, a stretch at a time, then syncs them. */
static void *zero_main(void *arg)
{
	struct zeroer *z = arg;
	char p[64];
	snprintf(p, sizeof p, "/proc/self/fd/%d", z->fd);
	int dfd = z->direct ? open(p, O_WRONLY | O_DIRECT) : z->fd;
	void *buf;
	if (dfd < 0 || posix_memalign(&buf, 4096, DIRECT_IO))
		die("zeroing thread");
	memset(buf, 0, DIRECT_IO);
	while (!atomic_load(&stop_zero)) {
		long from = atomic_load(&zero_end);
		if (from - atomic_load(&data_end) > AHEAD / 2) {
			usleep(200);
			continue;
		}
		for (long o = from; o < from + AHEAD / 2; o += z->direct ? DIRECT_IO : PIECE) {
			if (z->direct) {
				if (pwrite(dfd, buf, DIRECT_IO, o) != DIRECT_IO)
					die("O_DIRECT zeros");
				continue;
			}
			if (pwrite(dfd, buf, PIECE, o) != PIECE ||
			    sync_file_range(dfd, o, PIECE, SYNC_FILE_RANGE_WAIT_BEFORE |
					    SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER))
				die("zeros");
		}
		if (fdatasync(dfd))
			die("fdatasync zeros");
		atomic_store(&zero_end, from + AHEAD / 2);
	}
	if (z->direct)
		close(dfd);
	free(buf);
	return NULL;
}

/* Records appended while a thread writes zeros ahead of them (direct or in pieces), or with
 * none (zeros false): the records' write and sync. */
static void zero_way(bool zeros, bool direct, int writes, int bytes, double *w, double *s,
		     struct pct *pw, struct pct *ps)
{
	int fd = open_file("zeros.j", 0);
	struct zeroer z = { fd, direct };
	pthread_t t;
	atomic_store(&zero_end, 0);
	atomic_store(&data_end, 0);
	atomic_store(&stop_zero, false);
	if (zeros && pthread_create(&t, NULL, zero_main, &z))
		die("pthread_create");
	records(fd, 0, writes, bytes, zeros, w, s);
	if (zeros) {
		atomic_store(&stop_zero, true);
		pthread_join(t, NULL);
	}
	close(fd);
	*pw = pcts(w, writes);
	*ps = pcts(s, writes);
}

struct syncer {
	pthread_t t;
	int fd, writes, bytes;
	off_t base;
	double *w, *s;
};

static void *syncer_main(void *arg)
{
	struct syncer *y = arg;
	records(y->fd, y->base, y->writes, y->bytes, false, y->w, y->s);
	return NULL;
}

/* n threads at once, each its own stretch of one file of synced zeros; w and s hold n * writes.
 * Returns the syncs' percentiles, *rate the syncs a second over all threads. */
static struct pct syncers(int n, int writes, int bytes, double *w, double *s, double *rate)
{
	int fd = open_file("syncers.j", 0);
	long stretch = (long)writes * bytes + (1l << 20);
	static char z[1 << 20];
	for (long o = 0; o < stretch * n; o += (long)sizeof z)
		if (write(fd, z, sizeof z) != (ssize_t)sizeof z)
			die("write");
	if (fsync(fd))
		die("fsync");
	struct syncer y[4];
	double t0 = bench_now_s();
	for (int i = 0; i < n; i++) {
		y[i] = (struct syncer){ .fd = fd, .writes = writes, .bytes = bytes,
					.base = (off_t)i * stretch, .w = w + (size_t)i * writes,
					.s = s + (size_t)i * writes };
		if (pthread_create(&y[i].t, NULL, syncer_main, &y[i]))
			die("pthread_create");
	}
	for (int i = 0; i < n; i++)
		pthread_join(y[i].t, NULL);
	*rate = (double)n * writes / (bench_now_s() - t0);
	close(fd);
	return pcts(s, n * writes);
}

static void print(const char *name, struct pct p, struct pct base)
{
	printf("    %-34s p50 %7.1f  p99 %7.1f  p999 %8.1f us   p50 %.2fx  p99 %.2fx\n", name,
	       p.p50, p.p99, p.p999, p.p50 / base.p50, p.p99 / base.p99);
}

int main(int argc, char **argv)
{
	int writes = argc > 1 ? atoi(argv[1]) : 3000;
	int bytes = argc > 2 ? atoi(argv[2]) : 4096;
	int load = argc > 3 ? atoi(argv[3]) : 2;
	snprintf(dir, sizeof dir, "%s", argc > 4 ? argv[4] : "/tmp");
	if (writes < 100 || bytes < 1 || bytes > 1 << 16 || load < 0 || load > MAX_LOAD) {
		fprintf(stderr, "usage: bench_fsync [WRITES>=100 [BYTES<=65536 [LOAD<=%d [DIR]]]]\n",
			MAX_LOAD);
		return 2;
	}
	/* Room for the four syncers' records. */
	double *w = malloc(sizeof *w * 4 * (size_t)writes), *s = malloc(sizeof *s * 4 * (size_t)writes);
	static const char *const names[] = { "append", "overwrite of synced zeros",
					     "fallocated" };
	int lfd = -1;
	pthread_t lt[MAX_LOAD];
	for (int loaded = 0; loaded < 2; loaded++) {
		if (loaded) {
			if (!load)
				break;
			lfd = open_file("load.bin", 0);
			static char fill[1 << 20];
			memset(fill, 0x33, sizeof fill);
			for (long o = 0; o < (long)LOAD_PAGES * 4096; o += (long)sizeof fill)
				if (write(lfd, fill, sizeof fill) != (ssize_t)sizeof fill)
					die("write load file");
			if (fsync(lfd) || fcntl(lfd, F_SETFL, O_DIRECT))
				die("load file");
			for (int i = 0; i < load; i++)
				if (pthread_create(&lt[i], NULL, load_main, &lfd))
					die("pthread_create");
		}
		printf("bench_fsync files: %d writes of %d bytes + fdatasync in %s, %s\n", writes,
		       bytes, dir, loaded ? "with random 4 KiB O_DIRECT I/O beside it" : "quiet");
		struct pct base = file_way(APPEND, writes, bytes, w, s);
		for (int way = APPEND; way <= FALLOCATED; way++)
			print(names[way], way == APPEND ? base : file_way(way, writes, bytes, w, s),
			      base);
		if (loaded)
			continue;
		printf("bench_fsync syncers: threads each writing %d records into their own stretch "
		       "of one file of synced zeros, each record + fdatasync, quiet\n", writes);
		double rate1;
		struct pct one = syncers(1, writes, bytes, w, s, &rate1);
		for (int n = 1; n <= 4; n *= 2) {
			double rate = rate1;
			struct pct p = n == 1 ? one : syncers(n, writes, bytes, w, s, &rate);
			char name[64];
			snprintf(name, sizeof name, "%d thread%s, %.0f syncs/s (%.2fx)", n,
				 n > 1 ? "s" : "", rate, rate / rate1);
			print(name, p, one);
		}
	}
	if (load) {
		printf("bench_fsync zeros: the same records while a thread keeps %ld MiB of zeros "
		       "ahead, with the load; write() and its fdatasync\n", AHEAD >> 20);
		struct pct bw, bs, pw, ps;
		zero_way(false, false, writes, bytes, w, s, &bw, &bs);
		static const char *const zn[] = { "none (append)", "O_DIRECT 1 MiB, synchronous",
						  "buffered 256 KiB pieces" };
		for (int m = 0; m < 3; m++) {
			if (m)
				zero_way(true, m == 1, writes, bytes, w, s, &pw, &ps);
			else
				pw = bw, ps = bs;
			printf("  %s: write max %.1f us p99 %.1f us\n", zn[m], pw.max, pw.p99);
			print("    its sync", ps, bs);
		}
		atomic_store(&stop_load, true);
		for (int i = 0; i < load; i++)
			pthread_join(lt[i], NULL);
		close(lfd);
	}
	free(w);
	free(s);
	return 0;
}
