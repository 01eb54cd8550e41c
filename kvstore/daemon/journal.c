/* journal — framing, group commit and compaction of the metadata journal. See journal.h. */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "errmsg.h"
#include "log.h"

#define JOURNAL_MAGIC "FKVJRNL1"
#define JOURNAL_VERSION 1u
#define JOURNAL_FLUSH_BYTES (1u << 20)	/* write the buffer out (unsynced) past this */
#define ZERO_PIECE (256u << 10)		/* zeros written, and written back, at a time */
#define ZERO_GAP (2u << 20)		/* records that outran the zeros keep this much room */
#define ZERO_ALIGN 4096u

struct journal {
	char path[PATH_MAX];
	int fd;
	uint64_t file_bytes;	/* written to the file */
	uint8_t *buf;		/* (cap,) records not written yet */
	size_t len, cap;
	uint64_t records, compactions;
	uint64_t appended;	/* records appended since open (compaction does not reset it) */
	_Atomic uint64_t syncs;
	time_t last_compaction;
	bool stream;		/* a compaction's new journal: writeback starts at every write */
	/* Sync generations. written counts the buffer's writes to the file (and failed syncs, whose
	 * writes need another); a sync, in the caller or on the sync thread, covers the count read
	 * as it began, and done is the largest count one has covered. want: the count the caller
	 * asked the thread to cover; the thread syncs again, at once, while want is above done. */
	_Atomic uint64_t written, done, want;
	/* The sync thread (journal_sync_start), made at the first asynchronous sync. */
	pthread_t thread;
	bool thread_made;
	pthread_mutex_t mu;
	pthread_cond_t cv;	/* a sync ended, or want, stop or close_fd changed */
	_Atomic bool running;	/* the thread is syncing (set and cleared by it, under mu) */
	bool stop;		/* under mu */
	int close_fd;		/* under mu: a replaced journal file the thread closes (-1: none) */
	_Atomic int async_err;	/* a failed thread sync, not yet reported */
	journal_synced_fn on_synced;
	void *on_synced_ctx;
	/* The compaction under way (journal_compact_begin): the new journal, written at <path>.tmp,
	 * and the generation of its sync started at journal_compact_seal (0: not sealed). */
	struct journal *snap;
	uint64_t snap_gen;
	/* Zeros ahead of the records (journal_preallocate, zero_main): ahead is what the caller
	 * keeps zeroed past the records' end (0: none); zero_end, the end of the zeros on the disk
	 * (0 for a file whose zeros are unknown). A stretch [zero_from, zero_to) is being written
	 * while zero_busy, through zero_fd, a duplicate of the file's descriptor that the thread
	 * closes; zero_epoch counts the files the journal has had, zero_req_epoch is the stretch's
	 * (under mu). */
	uint64_t ahead;
	_Atomic uint64_t zero_end;
	_Atomic bool zero_busy;
	uint64_t zero_from, zero_to;
	int zero_fd;
	uint32_t zero_epoch, zero_req_epoch;
	int zero_err;		/* the last stretch failed (read once zero_busy is clear) */
	pthread_t zero_thread;
	bool zero_made;
};

static const uint8_t zeros[ZERO_PIECE];

static uint32_t record_crc(uint32_t type, const void *payload, uint32_t len)
{
	uint32_t c = crc32c(0, &type, sizeof type);
	return crc32c(c, payload, len);
}

static int write_all(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;
	while (n) {
		ssize_t w = write(fd, b, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

static uint64_t first_nonzero(const uint8_t *p, uint64_t n)
{
	uint64_t i = 0;
	while (i < n && !p[i])
		i++;
	return i;
}

static bool all_zero(const uint8_t *p, uint64_t n)
{
	return first_nonzero(p, n) == n;
}

static void header(uint8_t h[JOURNAL_HEADER_BYTES])
{
	memset(h, 0, JOURNAL_HEADER_BYTES);
	memcpy(h, JOURNAL_MAGIC, 8);
	uint32_t v = JOURNAL_VERSION;
	memcpy(h + 8, &v, sizeof v);
}

int journal_replay(const char *path, journal_record_fn fn, void *ctx, struct journal_replay *r,
		   char *err, size_t errlen)
{
	memset(r, 0, sizeof *r);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		if (e != ENOENT)
			errmsg_set(err, errlen, "cannot open the journal %s: %s", path, strerror(e));
		return -e;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return errmsg(err, errlen, -e, "journal %s: %s", path, strerror(e));
	}
	r->file_bytes = (uint64_t)st.st_size;
	if (r->file_bytes == 0) {
		close(fd);
		return -ENOENT; /* created but never written: nothing to replay */
	}
	uint8_t *data = malloc(r->file_bytes);
	if (!data) {
		close(fd);
		return errmsg(err, errlen, -ENOMEM, "journal %s: out of memory for %" PRIu64 " bytes",
			      path, r->file_bytes);
	}
	size_t got = 0;
	while (got < r->file_bytes) {
		ssize_t n = read(fd, data + got, r->file_bytes - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			int e = n < 0 ? errno : EIO;
			free(data);
			close(fd);
			return errmsg(err, errlen, -e, "reading the journal %s: %s", path, strerror(e));
		}
		got += (size_t)n;
	}
	close(fd);
	uint8_t h[JOURNAL_HEADER_BYTES];
	header(h);
	if (r->file_bytes < JOURNAL_HEADER_BYTES || memcmp(data, h, 12) != 0) {
		free(data);
		return errmsg(err, errlen, -EINVAL, "%s is not a freekv journal (format %u)", path,
			      JOURNAL_VERSION);
	}
	uint64_t off = JOURNAL_HEADER_BYTES, *aligned = NULL;
	size_t aligned_cap = 0;
	bool zero_tail = false;
	while (off < r->file_bytes) {
		uint32_t len, crc, type;
		/* Zeros where a record header would be: the end of the records, when only zeros
		 * follow (written ahead of them, journal_preallocate). No record is all zeros:
		 * the checksum of an empty record is not 0. */
		uint64_t left = r->file_bytes - off;
		if (all_zero(data + off, left < JOURNAL_RECORD_HEADER ? left : JOURNAL_RECORD_HEADER)) {
			uint64_t nz = first_nonzero(data + off, left);
			if (nz == left) {
				zero_tail = true;
				break;
			}
			snprintf(r->why, sizeof r->why, "zeros at byte %" PRIu64 ", then data at byte %"
				 PRIu64, off, off + nz);
			break;
		}
		if (r->file_bytes - off < JOURNAL_RECORD_HEADER) {
			snprintf(r->why, sizeof r->why, "a record header cut short at byte %" PRIu64, off);
			break;
		}
		memcpy(&len, data + off, 4);
		memcpy(&crc, data + off + 4, 4);
		memcpy(&type, data + off + 8, 4);
		if (len > JOURNAL_MAX_RECORD) {
			snprintf(r->why, sizeof r->why, "record at byte %" PRIu64 " claims %u bytes", off,
				 len);
			break;
		}
		if (r->file_bytes - off - JOURNAL_RECORD_HEADER < len) {
			snprintf(r->why, sizeof r->why, "record at byte %" PRIu64 " cut short (%u bytes "
				 "claimed, %" PRIu64 " left)", off, len,
				 r->file_bytes - off - JOURNAL_RECORD_HEADER);
			break;
		}
		const uint8_t *payload = data + off + JOURNAL_RECORD_HEADER;
		if (record_crc(type, payload, len) != crc) {
			snprintf(r->why, sizeof r->why, "record at byte %" PRIu64 " fails its checksum",
				 off);
			break;
		}
		/* Records are packed: hand each payload over 8-byte aligned, so the reader can
		 * look at it through its struct. */
		if ((uintptr_t)payload % 8) {
			if (len > aligned_cap) {
				free(aligned);
				aligned_cap = len;
				aligned = malloc(len);
				if (!aligned) {
					free(data);
					return errmsg(err, errlen, -ENOMEM, "replaying %s: out of memory",
						      path);
				}
			}
			memcpy(aligned, payload, len);
			payload = (const uint8_t *)aligned;
		}
		char msg[200] = "";
		int ret = fn(ctx, type, payload, len, msg, sizeof msg);
		if (ret) {
			snprintf(r->why, sizeof r->why, "record at byte %" PRIu64 " (type %u): %s", off,
				 type, msg[0] ? msg : strerror(ret < 0 ? -ret : ret));
			break;
		}
		off += JOURNAL_RECORD_HEADER + len;
		r->records++;
	}
	r->valid_bytes = off;
	r->damaged = off < r->file_bytes && !zero_tail;
	uint64_t end = zero_tail ? off : r->file_bytes;
	while (end > off && !data[end - 1])
		end--;
	r->zero_bytes = r->file_bytes - end;
	free(aligned);
	free(data);
	return 0;
}

/* Opens (creating) path and makes it a journal of exactly keep bytes (0: a header only). */
static int open_at(const char *path, uint64_t keep, int *fd_out, uint64_t *bytes, char *err,
		   size_t errlen)
{
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "cannot open the journal %s: %s", path,
			      strerror(errno));
	int ret = 0;
	if (keep < JOURNAL_HEADER_BYTES) {
		uint8_t h[JOURNAL_HEADER_BYTES];
		header(h);
		if (ftruncate(fd, 0) < 0 || pwrite(fd, h, sizeof h, 0) != (ssize_t)sizeof h)
			ret = -errno;
		keep = JOURNAL_HEADER_BYTES;
	} else if (ftruncate(fd, (off_t)keep) < 0) {
		ret = -errno;
	}
	if (!ret && (lseek(fd, (off_t)keep, SEEK_SET) < 0 || fdatasync(fd) < 0))
		ret = -errno;
	if (ret) {
		close(fd);
		return errmsg(err, errlen, ret, "cannot prepare the journal %s: %s", path,
			      strerror(-ret));
	}
	*fd_out = fd;
	*bytes = keep;
	return 0;
}

int journal_open(const char *path, uint64_t append_at, struct journal **out, char *err,
		 size_t errlen)
{
	*out = NULL;
	struct journal *j = calloc(1, sizeof *j);
	if (!j)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	if (strlen(path) >= sizeof j->path) {
		free(j);
		return errmsg(err, errlen, -ENAMETOOLONG, "journal path too long");
	}
	strcpy(j->path, path);
	j->close_fd = -1;
	int ret = open_at(path, append_at, &j->fd, &j->file_bytes, err, errlen);
	if (ret) {
		free(j);
		return ret;
	}
	*out = j;
	return 0;
}

static uint64_t round_up(uint64_t x)
{
	return (x + ZERO_ALIGN - 1) / ZERO_ALIGN * ZERO_ALIGN;
}

/* Writes zeros over [from, to) of fd a piece at a time, each written back before the next, so
 * that a group commit's fdatasync finds at most one piece of them to write or wait for; then
 * syncs the file's new size and blocks. */
static int write_zeros(int fd, uint64_t from, uint64_t to)
{
	for (uint64_t off = from; off < to;) {
		size_t n = to - off < ZERO_PIECE ? (size_t)(to - off) : ZERO_PIECE;
		ssize_t w = pwrite(fd, zeros, n, (off_t)off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		if (sync_file_range(fd, (off_t)off, w, SYNC_FILE_RANGE_WAIT_BEFORE |
				    SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) < 0)
			return -errno;
		off += (uint64_t)w;
	}
	return fdatasync(fd) < 0 ? -errno : 0;
}

/* The zeroing thread. A record written over zeros already on the disk changes neither the
 * file's size nor its blocks, so the fdatasync of a group commit is a flush of data alone, not
 * a commit of the filesystem's own journal as well (docs/design.md §4; bench/bench_fsync.c). */
static void *zero_main(void *arg)
{
	struct journal *j = arg;
	pthread_mutex_lock(&j->mu);
	for (;;) {
		while (!atomic_load(&j->zero_busy) && !j->stop)
			pthread_cond_wait(&j->cv, &j->mu);
		if (!atomic_load(&j->zero_busy))
			break; /* stop, nothing asked */
		int fd = j->zero_fd;
		uint64_t from = j->zero_from, to = j->zero_to;
		uint32_t epoch = j->zero_req_epoch;
		pthread_mutex_unlock(&j->mu);
		int ret = write_zeros(fd, from, to);
		close(fd);
		pthread_mutex_lock(&j->mu);
		j->zero_err = ret;
		if (!ret && epoch == j->zero_epoch)
			atomic_store(&j->zero_end, to);
		atomic_store(&j->zero_busy, false);
		pthread_cond_broadcast(&j->cv);
	}
	pthread_mutex_unlock(&j->mu);
	return NULL;
}

/* Records are about to go to [file_bytes, file_bytes + n) of the file: a stretch of zeros being
 * written there is waited for, or the zeros would land over them. */
static void zero_before(struct journal *j, size_t n)
{
	if (!atomic_load(&j->zero_busy))
		return;
	pthread_mutex_lock(&j->mu);
	if (atomic_load(&j->zero_busy) && j->zero_req_epoch == j->zero_epoch &&
	    j->file_bytes + n > j->zero_from) {
		while (atomic_load(&j->zero_busy))
			pthread_cond_wait(&j->cv, &j->mu);
	}
	pthread_mutex_unlock(&j->mu);
}

/* After a write: when less than half of ahead is zeroed past the records' end, the next
 * stretch, up to ahead past it, is handed to the zeroing thread (made here, the first time).
 * Records that outran the zeros get ZERO_GAP of room before the stretch begins. */
static void zero_after(struct journal *j)
{
	if (!j->ahead || j->stream || !j->thread_made || atomic_load(&j->zero_busy))
		return;
	if (j->zero_err) {
		log_warn("journal %s: writing zeros ahead of the records failed (%s); records are "
			 "appended to the file's end from now on", j->path, strerror(-j->zero_err));
		j->ahead = 0;
		return;
	}
	uint64_t end = j->file_bytes, ze = atomic_load(&j->zero_end);
	if (ze >= end + j->ahead / 2)
		return;
	uint64_t from = ze >= end ? ze : round_up(end + ZERO_GAP), to = round_up(end + j->ahead);
	if (to <= from)
		return;
	if (!j->zero_made) {
		if (pthread_create(&j->zero_thread, NULL, zero_main, j)) {
			log_warn("journal %s: no thread to write zeros ahead of the records; they are "
				 "appended to the file's end", j->path);
			j->ahead = 0;
			return;
		}
		j->zero_made = true;
	}
	int fd = fcntl(j->fd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		return; /* asked again after the next write */
	pthread_mutex_lock(&j->mu);
	j->zero_fd = fd;
	j->zero_from = from;
	j->zero_to = to;
	j->zero_req_epoch = j->zero_epoch;
	atomic_store(&j->zero_busy, true);
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
}

void journal_preallocate(struct journal *j, uint64_t ahead)
{
	j->ahead = ahead ? round_up(ahead < 2 * ZERO_GAP ? 2 * ZERO_GAP : ahead) : 0;
}

static int flush_buf(struct journal *j)
{
	if (!j->len)
		return 0;
	zero_before(j, j->len);
	int ret = write_all(j->fd, j->buf, j->len);
	if (ret)
		return ret; /* what was written stays; the buffer is kept for the next try */
	/* A snapshot's pages go to the disk as they are written, not in one burst at its sync
	 * that every group commit of the journal would wait behind. */
	if (j->stream)
		sync_file_range(j->fd, (off_t)j->file_bytes, (off_t)j->len, SYNC_FILE_RANGE_WRITE);
	j->file_bytes += j->len;
	j->len = 0;
	atomic_fetch_add(&j->written, 1);
	zero_after(j);
	return 0;
}

int journal_append(struct journal *j, uint32_t type, const void *payload, uint32_t len)
{
	if (len > JOURNAL_MAX_RECORD)
		return -E2BIG;
	size_t need = JOURNAL_RECORD_HEADER + (size_t)len;
	if (j->len + need > j->cap) {
		size_t cap = j->cap ? j->cap : 64 * 1024;
		while (cap < j->len + need)
			cap *= 2;
		uint8_t *b = realloc(j->buf, cap);
		if (!b)
			return -ENOMEM;
		j->buf = b;
		j->cap = cap;
	}
	uint32_t crc = record_crc(type, payload, len);
	uint8_t *p = j->buf + j->len;
	memcpy(p, &len, 4);
	memcpy(p + 4, &crc, 4);
	memcpy(p + 8, &type, 4);
	if (len)
		memcpy(p + JOURNAL_RECORD_HEADER, payload, len);
	j->len += need;
	j->records++;
	j->appended++;
	if (j->len >= JOURNAL_FLUSH_BYTES)
		return flush_buf(j);
	return 0;
}

/* A failed thread sync, once: what it covered is synced again by the next sync. */
static int take_async_err(struct journal *j)
{
	int e = atomic_exchange(&j->async_err, 0);
	if (e)
		atomic_fetch_add(&j->written, 1);
	return e;
}

static void done_max(struct journal *j, uint64_t gen)
{
	uint64_t d = atomic_load(&j->done);
	while (d < gen && !atomic_compare_exchange_weak(&j->done, &d, gen))
		;
}

/* The thread syncs, or will at once. */
static bool thread_busy(struct journal *j)
{
	return atomic_load(&j->running) || atomic_load(&j->want) > atomic_load(&j->done);
}

static int wait_idle(struct journal *j)
{
	if (j->thread_made) {
		pthread_mutex_lock(&j->mu);
		while (thread_busy(j))
			pthread_cond_wait(&j->cv, &j->mu);
		pthread_mutex_unlock(&j->mu);
	}
	return take_async_err(j);
}

/* j's file becomes fd (the thread reads it under mu); its zeros are unknown. */
static void set_fd(struct journal *j, int fd)
{
	if (j->thread_made)
		pthread_mutex_lock(&j->mu);
	j->fd = fd;
	j->zero_epoch++; /* a stretch under way is the old file's */
	atomic_store(&j->zero_end, 0);
	if (j->thread_made)
		pthread_mutex_unlock(&j->mu);
}

int journal_sync(struct journal *j)
{
	int err = wait_idle(j);
	int ret = flush_buf(j);
	if (ret)
		return ret;
	uint64_t gen = atomic_load(&j->written);
	if (gen <= atomic_load(&j->done))
		return err;
	if (fdatasync(j->fd) < 0) {
		err = -errno;
		atomic_fetch_add(&j->written, 1); /* the next sync goes again */
	} else {
		j->syncs++;
	}
	/* A failed sync ends its generation too (its waiters are told, and the error logged, as
	 * before there was a thread). */
	done_max(j, gen);
	return err;
}

/* The sync thread: syncs while the caller wants more than is done, each sync covering every
 * write made before it began, one after the other without waiting for the caller to ask again
 * (the caller is told of each through on_synced). */
static void *sync_main(void *arg)
{
	struct journal *j = arg;
	pthread_mutex_lock(&j->mu);
	for (;;) {
		while (atomic_load(&j->want) <= atomic_load(&j->done) && !j->stop &&
		       j->close_fd < 0)
			pthread_cond_wait(&j->cv, &j->mu);
		if (j->close_fd >= 0) {
			/* The last reference to a replaced journal: the kernel frees its blocks
			 * here, tens of milliseconds for a large one, off the caller's lock. */
			int fd = j->close_fd;
			j->close_fd = -1;
			pthread_mutex_unlock(&j->mu);
			close(fd);
			pthread_mutex_lock(&j->mu);
			continue;
		}
		if (atomic_load(&j->want) <= atomic_load(&j->done))
			break; /* stop, nothing asked */
		int fd = j->fd;
		uint64_t gen = atomic_load(&j->written);
		atomic_store(&j->running, true);
		pthread_mutex_unlock(&j->mu);
		if (fdatasync(fd) < 0) {
			int none = 0;
			atomic_compare_exchange_strong(&j->async_err, &none, -errno);
		} else {
			j->syncs++;
		}
		done_max(j, gen);
		pthread_mutex_lock(&j->mu);
		atomic_store(&j->running, false);
		pthread_cond_broadcast(&j->cv);
		if (j->on_synced) /* under mu: journal_on_synced(NULL) waits it out */
			j->on_synced(j->on_synced_ctx);
	}
	pthread_mutex_unlock(&j->mu);
	return NULL;
}

int journal_sync_start(struct journal *j)
{
	int err = take_async_err(j);
	int ret = flush_buf(j);
	if (ret)
		return ret;
	uint64_t gen = atomic_load(&j->written);
	if (gen <= atomic_load(&j->done) || gen <= atomic_load(&j->want))
		return err; /* nothing to sync, or asked for already */
	if (!j->thread_made) {
		pthread_condattr_t ca;
		bool ok = !pthread_condattr_init(&ca) && !pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) &&
			  !pthread_mutex_init(&j->mu, NULL) && !pthread_cond_init(&j->cv, &ca) &&
			  !pthread_create(&j->thread, NULL, sync_main, j);
		pthread_condattr_destroy(&ca);
		if (!ok) {
			log_warn("journal %s: no sync thread; syncing in the caller", j->path);
			return journal_sync(j);
		}
		j->thread_made = true;
		zero_after(j); /* the first stretch, now that there is a lock to share with it */
	}
	atomic_store(&j->want, gen);
	/* A thread that is syncing looks at want when it ends (want is stored before running is
	 * read, running cleared before want is read): only an idle one needs waking. */
	if (!atomic_load(&j->running)) {
		pthread_mutex_lock(&j->mu);
		pthread_cond_broadcast(&j->cv);
		pthread_mutex_unlock(&j->mu);
	}
	return err;
}

int journal_write(struct journal *j)
{
	return flush_buf(j);
}

uint64_t journal_need(const struct journal *j)
{
	return atomic_load(&((struct journal *)j)->written) + (j->len ? 1 : 0);
}

uint64_t journal_appended(const struct journal *j)
{
	return j->appended;
}

void journal_wait_synced(struct journal *j, uint64_t gen, int timeout_ms)
{
	if (!j->thread_made)
		return;
	struct timespec until;
	clock_gettime(CLOCK_MONOTONIC, &until); /* the clock the condition was made with */
	until.tv_nsec += (long)timeout_ms * 1000000L;
	until.tv_sec += until.tv_nsec / 1000000000L;
	until.tv_nsec %= 1000000000L;
	pthread_mutex_lock(&j->mu);
	while (atomic_load(&j->done) < gen && thread_busy(j))
		if (pthread_cond_timedwait(&j->cv, &j->mu, &until))
			break;
	pthread_mutex_unlock(&j->mu);
}

uint64_t journal_synced(const struct journal *j)
{
	return atomic_load(&((struct journal *)j)->done);
}

void journal_on_synced(struct journal *j, journal_synced_fn fn, void *ctx)
{
	if (j->thread_made)
		pthread_mutex_lock(&j->mu);
	j->on_synced = fn;
	j->on_synced_ctx = ctx;
	if (j->thread_made)
		pthread_mutex_unlock(&j->mu);
}

bool journal_dirty(const struct journal *j)
{
	return j->len || journal_synced(j) < journal_need(j);
}

static int sync_dir(const char *path)
{
	char tmp[PATH_MAX];
	snprintf(tmp, sizeof tmp, "%s", path);
	int fd = open(dirname(tmp), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int ret = fsync(fd) < 0 ? -errno : 0;
	close(fd);
	return ret;
}

/* <path>.tmp into out (PATH_MAX bytes); -ENAMETOOLONG when it does not fit. */
static int snap_path_of(const struct journal *j, char *out)
{
	size_t n = strlen(j->path);
	if (n + 5 > PATH_MAX)
		return -ENAMETOOLONG;
	memcpy(out, j->path, n);
	memcpy(out + n, ".tmp", 5);
	return 0;
}

static void free_journal(struct journal *j);

/* Drops the compaction under way, if any: its file is removed, the journal goes on. */
void journal_compact_abort(struct journal *j)
{
	struct journal *n = j->snap;
	if (!n)
		return;
	j->snap = NULL;
	j->snap_gen = 0;
	unlink(n->path);
	free_journal(n);
}

int journal_compact(struct journal *j, journal_fill_fn fill, void *ctx, char *err, size_t errlen)
{
	journal_compact_abort(j);
	int ret = journal_sync(j);
	if (ret)
		return errmsg(err, errlen, ret, "journal %s: %s", j->path, strerror(-ret));
	struct journal snap = { .fd = -1 };
	if (snap_path_of(j, snap.path))
		return errmsg(err, errlen, -ENAMETOOLONG, "journal path too long");
	ret = open_at(snap.path, 0, &snap.fd, &snap.file_bytes, err, errlen);
	if (ret)
		return ret;
	ret = fill(ctx, &snap);
	if (!ret)
		ret = journal_sync(&snap);
	if (!ret && rename(snap.path, j->path) < 0)
		ret = -errno;
	if (!ret)
		ret = sync_dir(j->path);
	free(snap.buf);
	if (ret) {
		close(snap.fd);
		unlink(snap.path);
		return errmsg(err, errlen, ret, "compacting the journal %s: %s", j->path,
			      strerror(-ret));
	}
	close(j->fd);
	set_fd(j, snap.fd);
	j->file_bytes = snap.file_bytes;
	j->records = snap.records;
	j->compactions++;
	j->last_compaction = time(NULL);
	return 0;
}

int journal_compact_begin(struct journal *j, struct journal **snap, char *err, size_t errlen)
{
	*snap = NULL;
	if (j->snap)
		return errmsg(err, errlen, -EBUSY, "journal %s: a compaction is under way", j->path);
	char path[PATH_MAX];
	if (snap_path_of(j, path))
		return errmsg(err, errlen, -ENAMETOOLONG, "journal path too long");
	char why[PATH_MAX + 128];
	int ret = journal_open(path, 0, &j->snap, why, sizeof why);
	if (ret)
		return errmsg(err, errlen, ret, "compacting the journal: %s", why);
	j->snap->stream = true;
	*snap = j->snap;
	return 0;
}

bool journal_compacting(const struct journal *j)
{
	return j->snap != NULL;
}

int journal_compact_seal(struct journal *j)
{
	if (!j->snap || j->snap_gen)
		return -EINVAL;
	int ret = journal_sync_start(j->snap);
	if (ret)
		return ret;
	j->snap_gen = journal_need(j->snap);
	if (!j->snap_gen) /* nothing to sync (cannot happen: the header is unsynced) */
		j->snap_gen = journal_synced(j->snap);
	return 0;
}

bool journal_compact_sealed(const struct journal *j)
{
	return j->snap && j->snap_gen;
}

/* Closes fd on the sync thread (one there is, else here); one waiting is closed first. */
static void close_later(struct journal *j, int fd)
{
	if (!j->thread_made) {
		close(fd);
		return;
	}
	pthread_mutex_lock(&j->mu);
	int old = j->close_fd;
	j->close_fd = fd;
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
	if (old >= 0)
		close(old);
}

int journal_compact_finish(struct journal *j, char *err, size_t errlen)
{
	struct journal *n = j->snap;
	if (!n || !j->snap_gen)
		return errmsg(err, errlen, -EINVAL, "journal %s: no sealed compaction", j->path);
	if (journal_synced(n) < j->snap_gen)
		return JOURNAL_COMPACT_RUNNING;
	/* A failed sync of the old file is no matter here: what it covered is in the new one,
	 * which the sync below makes durable. */
	(void)wait_idle(j);
	int ret = journal_sync(n);
	if (!ret && rename(n->path, j->path) < 0)
		ret = -errno;
	if (ret) {
		journal_compact_abort(j);
		return errmsg(err, errlen, ret, "compacting the journal %s: %s", j->path,
			      strerror(-ret));
	}
	/* Renamed: the new file is the journal now, whatever the directory's sync says. */
	int dir = sync_dir(j->path);
	close_later(j, j->fd);
	set_fd(j, n->fd);
	n->fd = -1;
	j->file_bytes = n->file_bytes;
	j->records = n->records;
	j->len = 0;		/* every record the buffer held is in the new file, or its state is */
	/* A generation ends: everything so far is durable in the new file. */
	uint64_t gen = atomic_fetch_add(&j->written, 1) + 1;
	j->syncs++;
	done_max(j, gen);
	if (dir) /* then the next sync tries again (it syncs the file only) */
		atomic_fetch_add(&j->written, 1);
	j->compactions++;
	j->last_compaction = time(NULL);
	j->snap = NULL;
	j->snap_gen = 0;
	free_journal(n);
	if (dir)
		return errmsg(err, errlen, dir, "journal %s: compacted, but syncing its directory "
			      "failed: %s", j->path, strerror(-dir));
	return JOURNAL_COMPACT_DONE;
}

/* Ends the sync thread, if any (it finishes a sync under way and a close asked first), and the
 * zeroing thread (after its stretch under way). */
static void stop_thread(struct journal *j)
{
	if (!j->thread_made)
		return;
	pthread_mutex_lock(&j->mu);
	j->stop = true;
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
	pthread_join(j->thread, NULL);
	if (j->zero_made)
		pthread_join(j->zero_thread, NULL); /* after the stretch under way */
	j->zero_made = false;
	pthread_cond_destroy(&j->cv);
	pthread_mutex_destroy(&j->mu);
	j->thread_made = false;
}

/* Stops the sync thread and frees j; its file is closed unless it was handed on (fd -1). */
static void free_journal(struct journal *j)
{
	stop_thread(j);
	if (j->fd >= 0)
		close(j->fd);
	free(j->buf);
	free(j);
}

void journal_close(struct journal *j)
{
	if (!j)
		return;
	journal_compact_abort(j);
	stop_thread(j);
	int ret = journal_sync(j);
	if (ret)
		log_error("journal %s: final sync failed: %s", j->path,
			strerror(-ret));
	free_journal(j);
}

void journal_stats(const struct journal *j, struct journal_stats *st)
{
	st->bytes = j->file_bytes + j->len;
	st->records = j->records;
	st->syncs = j->syncs;
	st->compactions = j->compactions;
	st->last_compaction = j->last_compaction;
}

const char *journal_path(const struct journal *j)
{
	return j->path;
}
