// The C side of package dnnl (dnnl.go, ppn.c): oneDNN's convolution and
// pooling primitives created once per layer geometry and batch size, each
// run by one call that binds the caller's buffers, executes and unbinds
// them, so that oneDNN keeps no pointer into Go memory after the call
// returns; and batch normalisation kernels of our own.
//
// Every tensor the caller passes is in ppnode's layout: activations NHWC,
// convolution weights OHWI ([Out, KH, KW, In/Groups]), vectors plain. Weights
// and their gradients are reordered to and from the layouts oneDNN prefers
// inside the calls.
//
// Functions return 0 or a dnnl_status_t; the _new functions write a message
// into err on failure.

#ifndef PPNODE_DNNL_H
#define PPNODE_DNNL_H

#include <stddef.h>

typedef struct {
	int n, ic, ih, iw;
	int oc, oh, ow;
	int kh, kw, sh, sw, dh, dw; // dilations as in ppnode: 1 is none
	int pt, pl, pb, pr;
	int groups, bias;
} ppn_conv_geom;

typedef struct ppn_conv ppn_conv;
int ppn_conv_new(const ppn_conv_geom *g, ppn_conv **out, char *err, int errlen);
void ppn_conv_free(ppn_conv *c);
// ppn_conv_impl names the implementations oneDNN chose (for tests and
// profiles): forward, backward data, backward weights.
const char *ppn_conv_impl(ppn_conv *c, int which);
int ppn_conv_forward(ppn_conv *c, int threads, const float *x, const float *w, const float *b, float *y);
int ppn_conv_backward_data(ppn_conv *c, int threads, const float *dy, const float *w, float *dx);
// ppn_conv_backward_weights computes the weight and bias gradients into
// the primitive's own buffers; ppn_conv_add_grads adds them into dw and db
// (NULL without bias).
int ppn_conv_backward_weights(ppn_conv *c, int threads, const float *x, const float *dy);
int ppn_conv_add_grads(ppn_conv *c, int threads, float *dw, float *db);

typedef struct {
	int n, c, ih, iw, oh, ow;
	int kh, kw, sh, sw;
	int pt, pl, pb, pr;
	int alg; // 0 max, 1 average counting padding, 2 average without padding
} ppn_pool_geom;

typedef struct ppn_pool ppn_pool;
int ppn_pool_new(const ppn_pool_geom *g, ppn_pool **out, char *err, int errlen);
void ppn_pool_free(ppn_pool *p);
// ppn_pool_workspace is the size in bytes of the workspace a forward pass
// writes for its backward pass (0 for average pooling).
size_t ppn_pool_workspace(ppn_pool *p);
int ppn_pool_forward(ppn_pool *p, int threads, const float *x, float *y, void *ws);
int ppn_pool_backward(ppn_pool *p, int threads, const float *dy, const void *ws, float *dx);

// Batch normalisation kernels over rows of c channels (ppn.c). With relu,
// normalize writes max(y, 0); with y not NULL (that output), the gradient
// kernels take dy as 0 where y is not positive: BatchNorm and a ReLU after
// it in one pass.
void ppn_bn_stats(const float *x, int rows, int c, const float *shift, double *s1, double *s2);
void ppn_bn_normalize(const float *x, float *y, int rows, int c, const float *mean, const float *scale, const float *bias,
		int relu);
void ppn_bn_grad_sums(const float *x, const float *y, const float *dy, int rows, int c, const float *mean,
		const float *inv, double *sdy, double *sdyx);
void ppn_bn_dx(const float *x, const float *y, const float *dy, float *dx, int rows, int c, const float *mean,
		const float *inv, const float *k, const float *a, const float *b);

// Elementwise kernels over n floats: y = max(x, 0); dx = dy where y > 0,
// else 0; y = a + b (y may be a).
void ppn_relu(const float *x, float *y, size_t n);
void ppn_relu_grad(const float *y, const float *dy, float *dx, size_t n);
void ppn_add(const float *a, const float *b, float *y, size_t n);

// The kernels above over a whole tensor in chunks, each chunk on a thread
// of an OpenMP team (ppn.c gives the split).
void ppn_bn_stats_team(int chunks, const float *x, int rows, int c, const float *shift, double *parts);
void ppn_bn_normalize_team(int chunks, const float *x, float *y, int rows, int c, const float *mean, const float *scale,
		const float *bias, int relu);
void ppn_bn_grad_sums_team(int chunks, const float *x, const float *y, const float *dy, int rows, int c,
		const float *mean, const float *inv, double *parts);
void ppn_bn_dx_team(int chunks, const float *x, const float *y, const float *dy, float *dx, int rows, int c,
		const float *mean, const float *inv, const float *k, const float *a, const float *b);
void ppn_ew_team(int chunks, int op, const float *a, const float *b, float *y, size_t n);

#endif
