// rope — rotary position embedding in place, both pairings, with Llama 3.1 ("llama3")
// frequency scaling. Frequencies and angles are computed in double per (token, pair) so that a
// 128K-token position keeps full angle precision, like the CPU backend.
#pragma once
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

// Values match enum fkv_rope_style (worker/model/model.h).
enum rope_pairing {
	ROPE_PAIR_INTERLEAVED = 0, // pairs (2i, 2i+1)
	ROPE_PAIR_HALVES = 1,	   // pairs (i, i + d/2)
};

// freq_i = theta^(-2i/d); with scaling_factor > 0, llama3 scaling: wavelengths shorter than
// original_ctx/high_freq_factor keep freq_i, longer than original_ctx/low_freq_factor use
// freq_i/factor, and the band between interpolates smoothly.
struct rope_cfg {
	enum rope_pairing pairing;
	float theta;
	float scaling_factor; // 0: no scaling
	float low_freq_factor;
	float high_freq_factor;
	int original_ctx;
};

// x: (n, n_heads, d) f32, rotated in place; pos: (n) device int32 positions, one per token.
// d must be even. Returns cudaErrorInvalidValue for an odd d, else the launch error.
cudaError_t rope_f32(float *x, const int32_t *pos, int n, int n_heads, int d,
		     struct rope_cfg cfg, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
