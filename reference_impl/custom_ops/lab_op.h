/* lab_op.h: the fixed C ABI between Python and a custom-op kernel.
 *
 * Python validates every array (dtype, rank, alignment, layout) and allocates the output
 * from the op's shape function before calling the kernel, so a kernel may trust the shapes
 * it is given.  Every kernel has this signature:
 *
 *   int kernel(const lab_tensor *in, int64_t n_in, lab_tensor *out,
 *              const lab_attr *attr, int64_t n_attr, char *msg, int64_t msg_len);
 *
 * It returns LAB_OK (0), or a non-zero status after writing a message into msg (at most
 * msg_len bytes including the terminating NUL); Python raises KernelError with that message.
 * Generic kernels use the element type T, which the build defines (-DT=float, -DT=double).
 */
#ifndef LAB_OP_H
#define LAB_OP_H
#include <stdint.h>
#include <stdio.h>

#define LAB_MAX_DIMS 8

typedef struct {
    void *data;                     /* address of element [0, 0, ...] */
    int64_t ndim;                   /* at most LAB_MAX_DIMS */
    int64_t shape[LAB_MAX_DIMS];    /* the first ndim entries are the sizes */
    int64_t strides[LAB_MAX_DIMS];  /* in ELEMENTS, not bytes; may be negative or zero */
} lab_tensor;

typedef struct {
    int64_t i;               /* the value of an integer attribute */
    double f;                /* the value of a float attribute */
} lab_attr;

typedef int (*lab_kernel_fn)(const lab_tensor *in, int64_t n_in, lab_tensor *out,
                             const lab_attr *attr, int64_t n_attr, char *msg, int64_t msg_len);

#define LAB_OK 0
#define LAB_ERROR 1

/* Element offset of [i] in a 1-D tensor and of [i, j] in a 2-D tensor. */
#define LAB_AT1(t, i) ((i) * (t)->strides[0])
#define LAB_AT2(t, i, j) ((i) * (t)->strides[0] + (j) * (t)->strides[1])

/* Write a printf-style message into msg and return LAB_ERROR. */
#define LAB_FAIL(...) (snprintf(msg, (size_t)msg_len, __VA_ARGS__), LAB_ERROR)

#endif
