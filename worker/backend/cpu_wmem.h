/* cpu_wmem — where the CPU backend keeps the weights it holds itself (docs/quant.md "Weights in
 * huge pages"): anonymous mappings advised for transparent huge pages (MADV_HUGEPAGE), filled
 * as a bump arena in chunks of CPU_WMEM_CHUNK bytes (a larger weight gets a chunk of its own).
 *
 * Why: decode reads every weight once per token, a stream far larger than the TLB covers. From
 * the model file's mapping (4 KiB page-cache pages) each 4 KiB costs a page walk; from 2 MiB
 * pages the walks all but vanish (bench/RESULTS.md, "Weights in huge pages"). The price is a private copy of the weights per process, where the file
 * mapping is shared by every process that maps it: FREEKV_CPU_HUGE_WEIGHTS=0 keeps the
 * mapping (cpu_switch.h), and without transparent huge pages (the kernel's setting "never")
 * nothing is copied.
 *
 * Ownership: cpu_wmem_alloc returns memory of a chunk and a reference to that chunk; each
 * allocation is given back with cpu_wmem_put(chunk), and a chunk is unmapped once the arena has
 * moved past it and its last allocation is put; every allocation is put before cpu_wmem_free,
 * which drops the arena's own reference. Thread-safe. Untouched parts of a chunk are address
 * space only. */
#ifndef FREEKV_CPU_WMEM_H
#define FREEKV_CPU_WMEM_H

#include <stdbool.h>
#include <stddef.h>

#define CPU_WMEM_CHUNK ((size_t)64 << 20)
#define CPU_WMEM_HUGE ((size_t)2 << 20)

struct cpu_wmem;
struct cpu_wmem_chunk;

/* Whether weights should be copied into huge pages: the switch is on and the kernel's
 * transparent_hugepage setting is not "never". */
bool cpu_wmem_usable(void);
/* Sets the switch for the whole process (tests and benchmarks). */
void cpu_wmem_enable(bool on);

int cpu_wmem_new(struct cpu_wmem **out);
void cpu_wmem_free(struct cpu_wmem *a);
/* bytes of 64-byte-aligned memory, or NULL (out of address space); *chunk takes a reference. */
void *cpu_wmem_alloc(struct cpu_wmem *a, size_t bytes, struct cpu_wmem_chunk **chunk);
void cpu_wmem_put(struct cpu_wmem *a, struct cpu_wmem_chunk *chunk);

#endif
