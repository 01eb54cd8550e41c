/* rpc_peer — parsing libzmq's "Peer-Address" property of an ipc connection into the peer's
 * kernel credentials (rpc.h). Its own file: pure string handling, unit-tested on its own. */
#include "rpc.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

int rpc_peer_parse(const char *a, struct rpc_peer *p)
{
	uint32_t v[3];
	if (!a)
		return -EINVAL;
	const char *end = a + strlen(a);
	for (int k = 2; k >= 0; k--) {
		const char *f = end;
		uint64_t x = 0;
		while (f > a && f[-1] >= '0' && f[-1] <= '9')
			f--;
		if (f == end || end - f > 10 || f == a || f[-1] != ':')
			return -EINVAL;
		for (const char *q = f; q < end; q++)
			x = x * 10 + (uint64_t)(*q - '0');
		if (x > UINT32_MAX)
			return -EINVAL;
		v[k] = (uint32_t)x;
		end = f - 1;
	}
	p->uid = v[0];
	p->gid = v[1];
	p->pid = v[2];
	p->has_cred = true;
	return 0;
}
