/* cmd_common — what the kvworker commands share: strict number parsing for flags, reading a
 * prompt or text file, loading a model with its tokenizer, and the command table entry type.
 *
 * Exit codes of every command: 0 done, 1 failed (message on stderr), 2 usage error. Commands
 * print results to stdout and everything else to stderr. Helpers that allocate say so; the
 * caller frees. */
#ifndef FREEKV_CMD_COMMON_H
#define FREEKV_CMD_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"

#define CMD_OK 0
#define CMD_FAIL 1
#define CMD_USAGE 2

struct fkv_tokenizer;

/* One kvworker command: run() gets argv with argv[0] = the command name. */
struct cmd {
	const char *name;
	const char *summary;
	int (*run)(int argc, char **argv);
};

int cmd_generate(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_synth(int argc, char **argv);

/* Parse a whole decimal number within [lo, hi]; 0 or -EINVAL. */
int cmd_parse_long(const char *s, long lo, long hi, long *out);
int cmd_parse_float(const char *s, double lo, double hi, double *out);
int cmd_parse_u64(const char *s, uint64_t *out);

/* Reads a whole file ("-" = stdin) into a NUL-terminated malloc'ed string; 0 or -errno. */
int cmd_read_text(const char *path, char **out);

/* Loads the model at path (a .gguf file or a Hugging Face folder) and its tokenizer, printing
 * the reason to stderr on failure. Returns 0 or a negative errno; on failure nothing is held. */
int cmd_load(const char *path, struct fkv_model *m, struct fkv_tokenizer **tok);

/* Milliseconds on the monotonic clock. */
double cmd_now_ms(void);

#endif
