/* backend_cuda_graph — the CUDA backend's graph_run and graph_free (backend.h; docs/design.md
 * "The GPU decode step", CUDA Graphs): the ops a function issues on the compute stream are
 * captured once (cudaStreamBeginCapture, thread-local mode, so the recall and offload threads
 * go on unhindered) into an executable graph, and later calls launch it whole — one launch for
 * dozens of kernels and GEMMs. Capture holds recall_mu: the recall ops, which other threads
 * call, queue marks on the compute stream under it, and a capture would take those in. A
 * graph holds the addresses its kernels were given; it is
 * recorded again once a workspace of the backend has moved (c->ws_gen), and the caller keys it
 * to its own buffers. While capturing, a workspace that would have to grow is refused
 * (cuda_ws_reserve: -EBUSY), which abandons the capture: the function then runs as plain ops,
 * and so does any capture the driver refuses. */
#include <stdlib.h>

#include "backend_cuda_priv.h"
#include "cuda_check.h"

struct backend_graph {
	cudaGraphExec_t exec;
	uint64_t ws_gen; /* c->ws_gen when recorded */
};

void cuda_graph_free(void *ctx, struct backend_graph *g)
{
	(void)ctx;
	if (!g)
		return;
	cudaGraphExecDestroy(g->exec);
	free(g);
}

/* fn as plain ops, after a capture that did not take: 1, or fn's error. */
static int run_plain(int (*fn)(void *arg), void *arg)
{
	(void)cudaGetLastError(); /* what the abandoned capture left */
	int ret = fn(arg);
	return ret ? ret : 1;
}

int cuda_graph_run(void *ctx, struct backend_graph **g, int (*fn)(void *arg), void *arg)
{
	struct cuda_ctx *c = ctx;
	if (*g && (*g)->ws_gen == c->ws_gen) {
		CUDA_CHECK(cudaGraphLaunch((*g)->exec, c->stream));
		return 0;
	}
	cuda_graph_free(c, *g);
	*g = NULL;
	const uint64_t gen = c->ws_gen;
	/* A capture takes whatever any thread queues on the stream: the recall ops mark the
	 * compute stream (rc_entry, order_after) with recall_mu held, so none may run now. */
	pthread_mutex_lock(&c->recall_mu);
	if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
		pthread_mutex_unlock(&c->recall_mu);
		return run_plain(fn, arg);
	}
	c->capturing = true;
	int ret = fn(arg);
	c->capturing = false;
	cudaGraph_t graph = NULL;
	cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
	pthread_mutex_unlock(&c->recall_mu);
	if (ret || e != cudaSuccess || !graph || gen != c->ws_gen) {
		if (graph)
			cudaGraphDestroy(graph);
		return run_plain(fn, arg);
	}
	cudaGraphExec_t exec;
	e = cudaGraphInstantiate(&exec, graph, 0);
	cudaGraphDestroy(graph);
	if (e != cudaSuccess)
		return run_plain(fn, arg);
	struct backend_graph *ng = malloc(sizeof *ng);
	if (!ng) {
		cudaGraphExecDestroy(exec);
		return run_plain(fn, arg);
	}
	*ng = (struct backend_graph){ exec, gen };
	if ((e = cudaGraphLaunch(exec, c->stream)) != cudaSuccess) {
		cuda_graph_free(c, ng);
		return cuda_check_fail(e, "cudaGraphLaunch", __func__, __FILE__, __LINE__);
	}
	*g = ng;
	return 2;
}
