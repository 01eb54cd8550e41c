/* access — rights from peer credentials or a token. See access.h. */
#include "access.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errmsg.h"
#include "log.h"

#define MAX_GROUPS 256

static int read_token(struct access *a, const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return errmsg(err, errlen, -errno, "auth_token_file %s: %s", path, strerror(errno));
	struct stat st;
	int ret = 0;
	if (fstat(fileno(f), &st) < 0) {
		ret = errmsg(err, errlen, -errno, "auth_token_file %s: %s", path, strerror(errno));
	} else if (!S_ISREG(st.st_mode)) {
		ret = errmsg(err, errlen, -EINVAL, "auth_token_file %s: not a regular file", path);
	} else if (st.st_mode & 077) {
		ret = errmsg(err, errlen, -EPERM, "auth_token_file %s: mode %03o lets other users read "
			     "it (chmod 600)", path, (unsigned)(st.st_mode & 0777));
	} else if (!fgets(a->token, sizeof a->token, f)) {
		ret = errmsg(err, errlen, -EINVAL, "auth_token_file %s: empty", path);
	} else {
		a->token[strcspn(a->token, "\r\n")] = '\0';
		if (!a->token[0])
			ret = errmsg(err, errlen, -EINVAL, "auth_token_file %s: empty first line", path);
		else if (strlen(a->token) == sizeof a->token - 1)
			ret = errmsg(err, errlen, -EINVAL, "auth_token_file %s: token longer than %d "
				     "bytes", path, ACCESS_TOKEN_MAX - 2);
	}
	fclose(f);
	a->has_token = ret == 0;
	return ret;
}

int access_init(struct access *a, const struct cfg *cfg, char *err, size_t errlen)
{
	memset(a, 0, sizeof *a);
	a->daemon_uid = geteuid();
	a->tcp_insecure = cfg->tcp_insecure;
	snprintf(a->admin_group, sizeof a->admin_group, "%s", cfg->admin_group);
	snprintf(a->worker_group, sizeof a->worker_group, "%s", cfg->worker_group);
	if (cfg->admin_group[0]) {
		struct group *g = getgrnam(cfg->admin_group);
		if (!g)
			return errmsg(err, errlen, -ENOENT, "admin_group %s: no such group",
				      cfg->admin_group);
		a->has_admin_gid = true;
		a->admin_gid = g->gr_gid;
	}
	if (cfg->worker_group[0]) {
		struct group *g = getgrnam(cfg->worker_group);
		if (g) {
			a->has_worker_gid = true;
			a->worker_gid = g->gr_gid;
		} else {
			log_warn("worker_group %s does not exist: only admins may "
				"connect as workers", cfg->worker_group);
		}
	}
	if (cfg->auth_token_file[0])
		return read_token(a, cfg->auth_token_file, err, errlen);
	return 0;
}

/* The connection's primary gid, or one of the user's supplementary groups. */
static bool in_group(uid_t uid, gid_t primary, gid_t want)
{
	if (primary == want)
		return true;
	struct passwd pw, *res = NULL;
	char buf[4096];
	if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) != 0 || !res)
		return false;
	gid_t groups[MAX_GROUPS];
	int n = MAX_GROUPS;
	if (getgrouplist(pw.pw_name, pw.pw_gid, groups, &n) < 0)
		return false;
	for (int i = 0; i < n; i++)
		if (groups[i] == want)
			return true;
	return false;
}

/* Compares without an early exit, so the time taken says nothing about the token. */
static bool token_equal(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	unsigned char d = la != lb;
	for (size_t i = 0; i < la; i++)
		d |= (unsigned char)a[i] ^ (unsigned char)b[i < lb ? i : 0];
	return d == 0;
}

enum access_right access_of(const struct access *a, bool ipc, bool has_cred, uid_t uid, gid_t gid,
			    const char *token, char *why, size_t whylen)
{
	if (ipc) {
		if (!has_cred) {
			errmsg_set(why, whylen, "the ipc connection carries no peer credentials");
			return ACCESS_NONE;
		}
		if (uid == 0 || uid == a->daemon_uid ||
		    (a->has_admin_gid && in_group(uid, gid, a->admin_gid)))
			return ACCESS_ADMIN;
		if (a->has_worker_gid && in_group(uid, gid, a->worker_gid))
			return ACCESS_WORKER;
		errmsg_set(why, whylen, "uid %u is in neither worker_group '%s' nor admin_group '%s'",
			   (unsigned)uid, a->worker_group, a->admin_group);
		return ACCESS_NONE;
	}
	if (a->has_token) {
		if (token && token_equal(token, a->token))
			return ACCESS_ADMIN;
		errmsg_set(why, whylen, "unauthorised: this tcp endpoint needs the token of the "
			   "daemon's auth_token_file (kvctl --token-file, or FREEKV_TOKEN_FILE)");
		return ACCESS_NONE;
	}
	if (a->tcp_insecure)
		return ACCESS_ADMIN;
	errmsg_set(why, whylen, "tcp clients are refused: no auth_token_file and tcp_insecure is off");
	return ACCESS_NONE;
}

const char *access_admin_hint(const struct access *a, char *buf, size_t len)
{
	if (a->admin_group[0])
		snprintf(buf, len, "admin rights come from admin_group '%s' (or the daemon's own "
			 "user)", a->admin_group);
	else
		snprintf(buf, len, "admin rights belong to the daemon's own user and root (set "
			 "admin_group to grant them to a group)");
	return buf;
}

const char *access_name(enum access_right r)
{
	return r == ACCESS_ADMIN ? "admin" : r == ACCESS_WORKER ? "worker" : "none";
}
