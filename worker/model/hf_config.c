/* hf_config — config.json -> struct fkv_model_config. See hf_config.h. */
#include "hf_config.h"

#include "errmsg.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#define HF_CONFIG_MAX_BYTES (1u << 20)

static const struct {
	const char *arch;	/* "architectures"[0] */
	const char *model_type;
	bool qkv_bias;
} hf_archs[] = {
	{ "LlamaForCausalLM", "llama", false },
	{ "MistralForCausalLM", "mistral", false },
	{ "Qwen2ForCausalLM", "qwen2", true },
};

static const struct {
	const char *name;
	enum fkv_dtype dtype;
} hf_dtypes[] = {
	{ "float32", FKV_F32 },
	{ "float16", FKV_F16 },
	{ "bfloat16", FKV_BF16 },
};

static struct json_object *get(struct json_object *o, const char *key)
{
	struct json_object *v;
	if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null))
		return NULL;
	return v;
}

/* A positive int that fits in int: required (missing -> error) or optional (missing -> def). */
static int get_int(struct json_object *o, const char *key, bool required, int def, int *out,
		   char *err, size_t errlen)
{
	struct json_object *v = get(o, key);
	if (!v) {
		if (required)
			return errmsg(err, errlen, -EINVAL, "config.json: missing key '%s'", key);
		*out = def;
		return 0;
	}
	if (!json_object_is_type(v, json_type_int))
		return errmsg(err, errlen, -EINVAL, "config.json: key '%s' must be an integer", key);
	int64_t x = json_object_get_int64(v);
	if (x < 0 || x > INT_MAX)
		return errmsg(err, errlen, -EINVAL, "config.json: key '%s' = %lld is out of range", key, (long long)x);
	*out = (int)x;
	return 0;
}

static int get_float(struct json_object *o, const char *key, bool required, float def, float *out,
		     char *err, size_t errlen)
{
	struct json_object *v = get(o, key);
	if (!v) {
		if (required)
			return errmsg(err, errlen, -EINVAL, "config.json: missing key '%s'", key);
		*out = def;
		return 0;
	}
	if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double))
		return errmsg(err, errlen, -EINVAL, "config.json: key '%s' must be a number", key);
	double d = json_object_get_double(v);
	if (!isfinite(d) || fabs(d) > 3.0e38)
		return errmsg(err, errlen, -EINVAL, "config.json: key '%s' is out of range", key);
	*out = (float)d;
	return 0;
}

static int parse_arch(struct json_object *root, struct fkv_model_config *c, char *err, size_t errlen)
{
	struct json_object *a = get(root, "architectures");
	const char *name = NULL;
	if (a) {
		if (!json_object_is_type(a, json_type_array) || json_object_array_length(a) < 1 ||
		    !json_object_is_type(json_object_array_get_idx(a, 0), json_type_string))
			return errmsg(err, errlen, -EINVAL, "config.json: key 'architectures' must be a list of names");
		name = json_object_get_string(json_object_array_get_idx(a, 0));
		for (size_t i = 0; i < sizeof hf_archs / sizeof hf_archs[0]; i++) {
			if (!strcmp(name, hf_archs[i].arch)) {
				snprintf(c->arch, sizeof c->arch, "%s", hf_archs[i].model_type);
				c->qkv_bias = hf_archs[i].qkv_bias;
				return 0;
			}
		}
		return errmsg(err, errlen, -EPROTO,
			    "config.json: architecture '%s' is not supported (LlamaForCausalLM, "
			    "MistralForCausalLM, Qwen2ForCausalLM are)", name);
	}
	struct json_object *mt = get(root, "model_type");
	if (!mt || !json_object_is_type(mt, json_type_string))
		return errmsg(err, errlen, -EINVAL, "config.json: missing key 'architectures' (or 'model_type')");
	name = json_object_get_string(mt);
	for (size_t i = 0; i < sizeof hf_archs / sizeof hf_archs[0]; i++) {
		if (!strcmp(name, hf_archs[i].model_type)) {
			snprintf(c->arch, sizeof c->arch, "%s", hf_archs[i].model_type);
			c->qkv_bias = hf_archs[i].qkv_bias;
			return 0;
		}
	}
	return errmsg(err, errlen, -EPROTO, "config.json: model_type '%s' is not supported (llama, mistral, qwen2 are)",
		    name);
}

static int parse_rope_scaling(struct json_object *root, struct fkv_model_config *c, char *err, size_t errlen)
{
	struct json_object *rs = get(root, "rope_scaling");
	if (!rs)
		return 0;
	if (!json_object_is_type(rs, json_type_object))
		return errmsg(err, errlen, -EINVAL, "config.json: key 'rope_scaling' must be an object or null");
	struct json_object *t = get(rs, "rope_type");
	if (!t)
		t = get(rs, "type");
	if (!t || !json_object_is_type(t, json_type_string))
		return errmsg(err, errlen, -EINVAL, "config.json: missing key 'rope_scaling.rope_type'");
	const char *type = json_object_get_string(t);
	if (!strcmp(type, "default"))
		return 0;
	if (strcmp(type, "llama3"))
		return errmsg(err, errlen, -EPROTO, "config.json: rope_scaling type '%s' is not supported (llama3 is)", type);
	int ret;
	if ((ret = get_float(rs, "factor", true, 0, &c->rope_scaling_factor, err, errlen)) ||
	    (ret = get_float(rs, "low_freq_factor", true, 0, &c->rope_low_freq_factor, err, errlen)) ||
	    (ret = get_float(rs, "high_freq_factor", true, 0, &c->rope_high_freq_factor, err, errlen)) ||
	    (ret = get_int(rs, "original_max_position_embeddings", true, 0, &c->rope_original_ctx, err, errlen)))
		return errmsg(err, errlen, ret, "config.json: rope_scaling (llama3) needs factor, low_freq_factor, "
				"high_freq_factor and original_max_position_embeddings as numbers");
	if (c->rope_scaling_factor <= 0 || c->rope_low_freq_factor <= 0 ||
	    c->rope_high_freq_factor <= c->rope_low_freq_factor || c->rope_original_ctx <= 0)
		return errmsg(err, errlen, -EINVAL, "config.json: rope_scaling (llama3) values are inconsistent");
	return 0;
}

/* bos_token_id: int or absent; eos_token_id: int, list of ints, or absent. */
static int parse_special(struct json_object *root, struct fkv_model_config *c, char *err, size_t errlen)
{
	int ret = get_int(root, "bos_token_id", false, -1, &c->bos_id, err, errlen);
	if (ret)
		return ret;
	struct json_object *e = get(root, "eos_token_id");
	c->eos_id = -1;
	c->n_eos = 0;
	if (!e)
		return 0;
	if (json_object_is_type(e, json_type_array)) {
		size_t n = json_object_array_length(e);
		for (size_t i = 0; i < n; i++) {
			struct json_object *x = json_object_array_get_idx(e, i);
			int64_t v = json_object_get_int64(x);
			if (!json_object_is_type(x, json_type_int) || v < 0 || v > INT_MAX)
				return errmsg(err, errlen, -EINVAL, "config.json: key 'eos_token_id' must hold integer ids");
			if (c->n_eos < FKV_MAX_EOS)
				c->eos_ids[c->n_eos++] = (int)v;
		}
	} else {
		int id;
		if ((ret = get_int(root, "eos_token_id", true, -1, &id, err, errlen)))
			return ret;
		c->eos_ids[c->n_eos++] = id;
	}
	c->eos_id = c->n_eos ? c->eos_ids[0] : -1;
	return 0;
}

static int parse_root(struct json_object *root, struct fkv_model_config *c, char *err, size_t errlen)
{
	int ret;
	if ((ret = parse_arch(root, c, err, errlen)) ||
	    (ret = get_int(root, "hidden_size", true, 0, &c->dim, err, errlen)) ||
	    (ret = get_int(root, "intermediate_size", true, 0, &c->ffn_dim, err, errlen)) ||
	    (ret = get_int(root, "num_hidden_layers", true, 0, &c->n_layers, err, errlen)) ||
	    (ret = get_int(root, "num_attention_heads", true, 0, &c->n_heads, err, errlen)) ||
	    (ret = get_int(root, "vocab_size", true, 0, &c->vocab_size, err, errlen)) ||
	    (ret = get_float(root, "rms_norm_eps", true, 0, &c->norm_eps, err, errlen)) ||
	    (ret = get_int(root, "max_position_embeddings", true, 0, &c->ctx_len, err, errlen)) ||
	    (ret = get_int(root, "num_key_value_heads", false, c->n_heads, &c->n_kv_heads, err, errlen)) ||
	    (ret = get_float(root, "rope_theta", false, 10000.0f, &c->rope_theta, err, errlen)) ||
	    (ret = get_int(root, "sliding_window", false, 0, &c->sliding_window, err, errlen)) ||
	    (ret = parse_rope_scaling(root, c, err, errlen)) || (ret = parse_special(root, c, err, errlen)))
		return ret;
	if (c->n_heads == 0)
		return errmsg(err, errlen, -EINVAL, "config.json: key 'num_attention_heads' must be positive");
	if ((ret = get_int(root, "head_dim", false, c->dim / c->n_heads, &c->head_dim, err, errlen)))
		return ret;
	if (!get(root, "head_dim") && c->dim % c->n_heads)
		return errmsg(err, errlen, -EINVAL,
			    "config.json: hidden_size %d is not a multiple of num_attention_heads %d (give head_dim)",
			    c->dim, c->n_heads);
	struct json_object *v;
	if ((v = get(root, "use_sliding_window")) && json_object_is_type(v, json_type_boolean) &&
	    !json_object_get_boolean(v))
		c->sliding_window = 0;
	else if (!v && !strcmp(c->arch, "qwen2"))
		c->sliding_window = 0; /* Qwen2 configs carry a window they do not use by default */
	if ((v = get(root, "tie_word_embeddings"))) {
		if (!json_object_is_type(v, json_type_boolean))
			return errmsg(err, errlen, -EINVAL, "config.json: key 'tie_word_embeddings' must be true or false");
		c->tied_embeddings = json_object_get_boolean(v);
	}
	if ((v = get(root, "attention_bias"))) {
		if (!json_object_is_type(v, json_type_boolean))
			return errmsg(err, errlen, -EINVAL, "config.json: key 'attention_bias' must be true or false");
		c->qkv_bias = c->qkv_bias || json_object_get_boolean(v);
	}
	c->dtype = FKV_F32;
	if ((v = get(root, "torch_dtype"))) {
		const char *s = json_object_get_string(v);
		size_t i;
		for (i = 0; i < sizeof hf_dtypes / sizeof hf_dtypes[0]; i++) {
			if (json_object_is_type(v, json_type_string) && !strcmp(s, hf_dtypes[i].name))
				break;
		}
		if (i == sizeof hf_dtypes / sizeof hf_dtypes[0])
			return errmsg(err, errlen, -EPROTO,
				    "config.json: torch_dtype '%s' is not supported (float32, float16, bfloat16 are)", s);
		c->dtype = hf_dtypes[i].dtype;
	}
	c->rope_style = FKV_ROPE_HALVES;
	return model_config_validate(c, err, errlen);
}

int hf_config_parse(const char *json, size_t len, struct fkv_model_config *cfg, char *err, size_t errlen)
{
	if (len > HF_CONFIG_MAX_BYTES)
		return errmsg(err, errlen, -EINVAL, "config.json: larger than %u bytes", HF_CONFIG_MAX_BYTES);
	struct json_tokener *tok = json_tokener_new();
	if (!tok)
		return errmsg(err, errlen, -ENOMEM, "config.json: out of memory");
	struct json_object *root = json_tokener_parse_ex(tok, json, (int)len);
	enum json_tokener_error je = json_tokener_get_error(tok);
	json_tokener_free(tok);
	if (!root || je != json_tokener_success) {
		json_object_put(root);
		return errmsg(err, errlen, -EINVAL, "config.json: invalid JSON (%s)",
			    je == json_tokener_continue ? "unexpected end" : json_tokener_error_desc(je));
	}
	if (!json_object_is_type(root, json_type_object)) {
		json_object_put(root);
		return errmsg(err, errlen, -EINVAL, "config.json: not a JSON object");
	}
	struct fkv_model_config c;
	memset(&c, 0, sizeof c);
	int ret = parse_root(root, &c, err, errlen);
	json_object_put(root);
	if (!ret)
		*cfg = c;
	return ret;
}

int hf_config_load(const char *dir, struct fkv_model_config *cfg, char *err, size_t errlen)
{
	char path[4096];
	if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
		return errmsg(err, errlen, -ENAMETOOLONG, "config.json: path too long");
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return errmsg(err, errlen, -errno, "cannot open %s: %s", path, strerror(errno));
	char *buf = malloc(HF_CONFIG_MAX_BYTES + 1);
	if (!buf) {
		fclose(fp);
		return errmsg(err, errlen, -ENOMEM, "config.json: out of memory");
	}
	size_t n = fread(buf, 1, HF_CONFIG_MAX_BYTES + 1, fp);
	int rerr = ferror(fp);
	fclose(fp);
	int ret = rerr ? errmsg(err, errlen, -EIO, "error reading %s", path)
		       : hf_config_parse(buf, n, cfg, err, errlen);
	free(buf);
	return ret;
}
