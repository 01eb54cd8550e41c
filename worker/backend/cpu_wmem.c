/* cpu_wmem — see cpu_wmem.h. */
#include "cpu_wmem.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cpu_switch.h"

static int g_enabled = -1; /* cpu_switch.h */

void cpu_wmem_enable(bool on)
{
	g_enabled = on;
}

/* The kernel's transparent_hugepage setting is not "never" (read once). */
static bool thp_available(void)
{
	static int avail = -1;
	if (avail < 0) {
		char buf[128] = "";
		FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
		if (f) {
			if (!fgets(buf, sizeof buf, f))
				buf[0] = '\0';
			fclose(f);
		}
		avail = buf[0] && !strstr(buf, "[never]");
	}
	return avail;
}

bool cpu_wmem_usable(void)
{
	return cpu_switch_on(&g_enabled, "FREEKV_CPU_HUGE_WEIGHTS") && thp_available();
}

struct cpu_wmem_chunk {
	char *base;  /* CPU_WMEM_HUGE-aligned */
	size_t len;  /* a multiple of CPU_WMEM_HUGE */
	size_t used;
	int refs;    /* allocations out, plus one while it is the arena's current chunk */
};

struct cpu_wmem {
	pthread_mutex_t mu;
	struct cpu_wmem_chunk *cur;
};

int cpu_wmem_new(struct cpu_wmem **out)
{
	struct cpu_wmem *a = calloc(1, sizeof *a);
	if (!a)
		return -ENOMEM;
	pthread_mutex_init(&a->mu, NULL);
	*out = a;
	return 0;
}

/* With a->mu held. */
static void put_locked(struct cpu_wmem_chunk *ch)
{
	if (--ch->refs)
		return;
	munmap(ch->base, ch->len);
	free(ch);
}

void cpu_wmem_free(struct cpu_wmem *a)
{
	if (!a)
		return;
	if (a->cur)
		put_locked(a->cur);
	pthread_mutex_destroy(&a->mu);
	free(a);
}

/* A mapping of len bytes (a multiple of CPU_WMEM_HUGE) aligned to CPU_WMEM_HUGE, advised for
 * huge pages: mapped with one huge page to spare, the unaligned ends unmapped. */
static struct cpu_wmem_chunk *chunk_new(size_t len)
{
	struct cpu_wmem_chunk *ch = calloc(1, sizeof *ch);
	if (!ch)
		return NULL;
	char *p = mmap(NULL, len + CPU_WMEM_HUGE, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		free(ch);
		return NULL;
	}
	const size_t head = (CPU_WMEM_HUGE - (uintptr_t)p % CPU_WMEM_HUGE) % CPU_WMEM_HUGE;
	if (head)
		munmap(p, head);
	if (CPU_WMEM_HUGE - head)
		munmap(p + head + len, CPU_WMEM_HUGE - head);
	ch->base = p + head;
	ch->len = len;
	/* Refused only where the kernel has no transparent huge pages: then 4 KiB pages. */
	(void)madvise(ch->base, len, MADV_HUGEPAGE);
	return ch;
}

void *cpu_wmem_alloc(struct cpu_wmem *a, size_t bytes, struct cpu_wmem_chunk **chunk)
{
	const size_t need = (bytes + 63) / 64 * 64;
	if (!need || need > SIZE_MAX - 2 * CPU_WMEM_HUGE)
		return NULL;
	pthread_mutex_lock(&a->mu);
	struct cpu_wmem_chunk *ch = a->cur;
	if (!ch || ch->len - ch->used < need) {
		size_t len = need > CPU_WMEM_CHUNK
				     ? (need + CPU_WMEM_HUGE - 1) / CPU_WMEM_HUGE * CPU_WMEM_HUGE
				     : CPU_WMEM_CHUNK;
		struct cpu_wmem_chunk *fresh = chunk_new(len);
		if (!fresh) {
			pthread_mutex_unlock(&a->mu);
			return NULL;
		}
		if (need > CPU_WMEM_CHUNK) {
			ch = fresh; /* a weight of its own: the arena stays on its chunk */
		} else {
			if (a->cur)
				put_locked(a->cur);
			fresh->refs = 1;
			a->cur = ch = fresh;
		}
	}
	void *p = ch->base + ch->used;
	ch->used += need;
	ch->refs++;
	pthread_mutex_unlock(&a->mu);
	*chunk = ch;
	return p;
}

void cpu_wmem_put(struct cpu_wmem *a, struct cpu_wmem_chunk *chunk)
{
	if (!chunk)
		return;
	pthread_mutex_lock(&a->mu);
	put_locked(chunk);
	pthread_mutex_unlock(&a->mu);
}
