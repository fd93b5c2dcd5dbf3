/* SparseSegmentSum: out[s, :] = the sum of data[i, :] over the rows i with segment_ids[i] == s.
 *
 * Summing a batch's embedding gradients per unique id before pushing them to a parameter
 * server is exactly this: data = per-lookup gradient rows, segment_ids = which unique id each
 * lookup hit.  One pass over data, no temporaries.  The ids come from the caller, so they are
 * checked here (an id out of range would write outside `out`) before anything is written.
 */
int sparse_segment_sum(const lab_tensor *in, int64_t n_in, lab_tensor *out,
                       const lab_attr *attr, int64_t n_attr, char *msg, int64_t msg_len)
{
    const lab_tensor *data = &in[0];     /* [n, d], any strides */
    const int64_t *ids = in[1].data;     /* [n], contiguous */
    const T *x = data->data;
    T *y = out->data;                    /* [num_segments, d], contiguous (allocated by Python) */
    int64_t n = data->shape[0], d = data->shape[1], k = out->shape[0];

    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= k)
            return LAB_FAIL("segment_ids[%lld] = %lld is out of range [0, %lld)",
                            (long long)i, (long long)ids[i], (long long)k);

    for (int64_t e = 0; e < k * d; e++)
        y[e] = 0;
    for (int64_t i = 0; i < n; i++) {
        T *row = y + ids[i] * d;
        if (data->strides[1] == 1) {     /* the common case: rows are contiguous */
            const T *src = x + i * data->strides[0];
            for (int64_t j = 0; j < d; j++)
                row[j] += src[j];
        } else {
            for (int64_t j = 0; j < d; j++)
                row[j] += x[LAB_AT2(data, i, j)];
        }
    }
    return LAB_OK;
}
