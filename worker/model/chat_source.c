/* chat_source — see chat_source.h. */
#include "chat_source.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gguf.h"

static int from_gguf(const char *path, char **out, char *err, size_t errlen)
{
	struct gguf_ctx *g;
	int ret = gguf_open(path, &g, err, errlen);
	if (ret)
		return ret;
	const char *s;
	size_t len;
	if (gguf_get_str(g, "tokenizer.chat_template", &s, &len) == 0 &&
	    !(*out = strndup(s, len)))
		ret = -ENOMEM;
	gguf_close(g);
	return ret;
}

static int from_folder(const char *dir, char **out, char *err, size_t errlen)
{
	char p[4096];
	snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
	struct stat st;
	if (stat(p, &st))
		return 0; /* no tokenizer_config.json: no template */
	struct json_object *root = json_object_from_file(p), *t;
	if (!root) {
		snprintf(err, errlen, "%s: %s", p, json_util_get_last_err());
		return -EINVAL;
	}
	int ret = 0;
	const char *src = NULL;
	if (json_object_object_get_ex(root, "chat_template", &t)) {
		if (json_object_get_type(t) == json_type_string) {
			src = json_object_get_string(t);
		} else if (json_object_get_type(t) == json_type_array) {
			for (size_t i = 0; i < json_object_array_length(t); i++) {
				struct json_object *e = json_object_array_get_idx(t, i), *n, *v;
				if (!json_object_object_get_ex(e, "template", &v) ||
				    json_object_get_type(v) != json_type_string)
					continue;
				bool dflt = json_object_object_get_ex(e, "name", &n) &&
					    !strcmp(json_object_get_string(n), "default");
				if (!src || dflt)
					src = json_object_get_string(v);
			}
		}
	}
	if (src && !(*out = strdup(src)))
		ret = -ENOMEM;
	json_object_put(root);
	if (!ret && !src) {
		/* Newer exports write the template beside the config instead. */
		snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
		FILE *f = fopen(p, "r");
		if (f) {
			char *buf = malloc(1 << 20);
			size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
			fclose(f);
			if (!buf)
				return -ENOMEM;
			buf[n] = '\0';
			*out = buf;
		}
	}
	return ret;
}

int model_chat_template(const char *path, char **out, char *err, size_t errlen)
{
	*out = NULL;
	struct stat st;
	if (stat(path, &st)) {
		int e = errno;
		snprintf(err, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	int ret = S_ISDIR(st.st_mode) ? from_folder(path, out, err, errlen)
				       : from_gguf(path, out, err, errlen);
	if (ret == -ENOMEM)
		snprintf(err, errlen, "out of memory");
	return ret;
}
