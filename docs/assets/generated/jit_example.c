#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const float W_0[12] = {
    5.0e-01f, 1.5e+00f, -5.0e-01f, 1.25e-01f, -1.0e+00f, 0.0e+00f, 2.0e+00f, -2.5e-01f,
    2.5e-01f, -7.5e-01f, 1.0e+00f, 5.0e-01f
};
static const float c2[3] = {
    1.0e-01f, -2.0e-01f, 3.0e-01f
};

static void W_1_0(const float *restrict xr, float *restrict yr) {
    yr[0] = xr[1]*-2.0e+00f;
    yr[1] = xr[0]*1.25e+00f + xr[2]*5.0e-01f;
}

int graph_main(int64_t n, const float *restrict x0, float *restrict y0) {
    /* intermediates: one block, on the stack for small batches, else malloc'd */
    _Alignas(64) float on_stack[8192];
    const int64_t t4_at = 0;
    const int64_t t5_at = t4_at + ((((int64_t)1*n*3) + 15) & ~(int64_t)15);
    const int64_t t6_at = t5_at + ((((int64_t)1*n*3) + 15) & ~(int64_t)15);
    const int64_t scratch_floats = t6_at + ((((int64_t)1*n*2) + 15) & ~(int64_t)15);
    float *scratch = scratch_floats <= 8192 ? on_stack : malloc(sizeof(float) * scratch_floats);
    if (!scratch) return 1;
    float *t4 = scratch + t4_at;
    float *t5 = scratch + t5_at;
    float *t6 = scratch + t6_at;
    /* x (Placeholder) */
    /* W1 (Const) */
    /* b1 (Const) */
    /* W2 (Const) */
    /* MatMul (MatMul) */
    for (int64_t i = 0; i < n; i++) {
        const float *restrict xr = x0 + i*4;
        for (int64_t j = 0; j < 3; j++) {
            const float *restrict wj = W_0 + j*4;
            float s = 0.0f;
            for (int64_t k = 0; k < 4; k++) s += xr[k] * wj[k];
            t4[i*3 + j] = s;
        }
    }
    /* Relu (FusedElementwise) */
    for (int64_t i0 = 0; i0 < n; i0++) {
        for (int64_t i1 = 0; i1 < 3; i1++) {
            const float a0 = t4[i1*1 + i0*1*3];
            const float a1 = c2[i1*1];
            const float s0 = a0 + a1;
            const float s1 = (s0 > 0.0f ? s0 : 0.0f);
            t5[i0*3 + i1*1] = s1;
        }
    }
    /* logits (MatMul) */
    for (int64_t i = 0; i < n; i++) {
        const float *restrict xr = t5 + i*3;
        float *restrict yr = t6 + i*2;
        W_1_0(xr, yr);
    }
    memcpy(y0, t6, sizeof(float) * ((int64_t)1*n*2));
    if (scratch != on_stack) free(scratch);
    return 0;
}
