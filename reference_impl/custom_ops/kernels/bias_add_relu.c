/* BiasAddRelu: y[i, j] = max(x[i, j] + b[j], 0), fused: one read of x, one write of y.
 * BiasAddReluGrad: dx[i, j] = g[i, j] where y[i, j] > 0, else 0 (y is the forward output).
 */
int bias_add_relu(const lab_tensor *in, int64_t n_in, lab_tensor *out,
                  const lab_attr *attr, int64_t n_attr, char *msg, int64_t msg_len)
{
    const lab_tensor *x = &in[0];        /* [n, d], any strides */
    const T *xd = x->data;
    const T *b = in[1].data;             /* [d], contiguous */
    T *y = out->data;                    /* [n, d], contiguous */
    int64_t n = x->shape[0], d = x->shape[1];

    for (int64_t i = 0; i < n; i++) {
        T *yrow = y + i * d;
        if (x->strides[1] == 1) {
            const T *xrow = xd + i * x->strides[0];
            for (int64_t j = 0; j < d; j++) {
                T v = xrow[j] + b[j];
                yrow[j] = v > 0 ? v : 0;
            }
        } else {
            for (int64_t j = 0; j < d; j++) {
                T v = xd[LAB_AT2(x, i, j)] + b[j];
                yrow[j] = v > 0 ? v : 0;
            }
        }
    }
    return LAB_OK;
}

int bias_add_relu_grad(const lab_tensor *in, int64_t n_in, lab_tensor *out,
                       const lab_attr *attr, int64_t n_attr, char *msg, int64_t msg_len)
{
    const lab_tensor *g = &in[0], *y = &in[1];   /* both [n, d], any strides */
    const T *gd = g->data, *yd = y->data;
    T *dx = out->data;                           /* [n, d], contiguous */
    int64_t n = g->shape[0], d = g->shape[1];

    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < d; j++)
            dx[i * d + j] = yd[LAB_AT2(y, i, j)] > 0 ? gd[LAB_AT2(g, i, j)] : 0;
    return LAB_OK;
}
