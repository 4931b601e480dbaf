//go:build cgo && dnnl

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dnnl.h>

#include "ppn.h"

void omp_set_num_threads(int);

// The CPU engine, shared by every primitive (it holds no state that differs
// between layers or callers).
static dnnl_engine_t engine;
static dnnl_status_t engine_status = dnnl_runtime_error;

// user_scratch are the attributes of every primitive: its scratchpad is
// memory we give it (a buffer per layer), not oneDNN's default global one,
// which is per OS thread and would be another thread's, or freed, once Go
// has moved the goroutine or collected a primitive on another thread.
static dnnl_primitive_attr_t user_scratch;

static dnnl_status_t get_engine(void) {
	// Called from Go with the creation mutex held.
	if (engine == NULL) {
		engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0);
		if (engine_status == dnnl_success) engine_status = dnnl_primitive_attr_create(&user_scratch);
		if (engine_status == dnnl_success)
			engine_status = dnnl_primitive_attr_set_scratchpad_mode(user_scratch, dnnl_scratchpad_mode_user);
	}
	return engine_status;
}

#define TRY(call)                                                                 \
	do {                                                                          \
		dnnl_status_t st_ = (call);                                               \
		if (st_ != dnnl_success) {                                                \
			if (err != NULL) snprintf(err, errlen, "%s: status %d", #call, (int)st_); \
			return st_;                                                           \
		}                                                                         \
	} while (0)

// A primitive with its arguments: memory objects whose data handles are
// bound for one execution.
typedef struct {
	dnnl_primitive_t prim;
	int nargs;
	dnnl_exec_arg_t args[12];
	char impl[64];
	dnnl_memory_t scratch; // bound to the owner's buffer by scratch_attach
	size_t scratch_size;
} op;

static void op_arg(op *o, int arg, dnnl_memory_t m) {
	o->args[o->nargs].arg = arg;
	o->args[o->nargs].memory = m;
	o->nargs++;
}

static dnnl_status_t op_create(op *o, dnnl_primitive_desc_t pd, char *err, int errlen) {
	const char *impl = NULL;
	dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
	snprintf(o->impl, sizeof o->impl, "%s", impl != NULL ? impl : "?");
	const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
	o->scratch_size = smd != NULL ? dnnl_memory_desc_get_size(smd) : 0;
	if (o->scratch_size > 0) {
		TRY(dnnl_memory_create(&o->scratch, smd, engine, DNNL_MEMORY_NONE));
		o->args[o->nargs].arg = DNNL_ARG_SCRATCHPAD;
		o->args[o->nargs].memory = o->scratch;
		o->nargs++;
	}
	TRY(dnnl_primitive_create(&o->prim, pd));
	return dnnl_success;
}

// scratch_attach allocates one buffer for the scratchpads of ops (which
// never run at the same time) and binds it to each.
static dnnl_status_t scratch_attach(void **buf, op **ops, int n, char *err, int errlen) {
	size_t size = 0;
	for (int i = 0; i < n; i++)
		if (ops[i]->scratch_size > size) size = ops[i]->scratch_size;
	if (size == 0) return dnnl_success;
	*buf = aligned_alloc(64, (size + 63) / 64 * 64);
	if (*buf == NULL) {
		snprintf(err, errlen, "out of memory for a scratchpad of %zu bytes", size);
		return dnnl_out_of_memory;
	}
	for (int i = 0; i < n; i++)
		if (ops[i]->scratch != NULL) TRY(dnnl_memory_set_data_handle(ops[i]->scratch, *buf));
	return dnnl_success;
}

static dnnl_status_t op_run(op *o, dnnl_stream_t s) {
	if (o->prim == NULL) return dnnl_success;
	return dnnl_primitive_execute(o->prim, s, o->nargs, o->args);
}

static void op_free(op *o) {
	if (o->prim != NULL) dnnl_primitive_destroy(o->prim);
	o->prim = NULL;
	if (o->scratch != NULL) dnnl_memory_destroy(o->scratch);
	o->scratch = NULL;
}

static dnnl_status_t mem_new(dnnl_memory_t *m, const dnnl_memory_desc_t *md, void *handle, char *err, int errlen) {
	TRY(dnnl_memory_create(m, md, engine, handle));
	return dnnl_success;
}

static void mem_free(dnnl_memory_t *m) {
	if (*m != NULL) dnnl_memory_destroy(*m);
	*m = NULL;
}

// bind sets a memory object's buffer for one execution; unbind clears it.
static void bind(dnnl_memory_t m, const void *p) { dnnl_memory_set_data_handle(m, (void *)p); }
static void unbind(dnnl_memory_t m) {
	if (m != NULL) dnnl_memory_set_data_handle(m, NULL);
}

// reorder makes a primitive copying src into dst's layout; with accumulate
// it adds into dst instead. It makes none (o->prim stays NULL) when the
// layouts are equal and accumulate is not set.
static dnnl_status_t reorder_new(op *o, dnnl_memory_t src, dnnl_memory_t dst, int accumulate, char *err, int errlen) {
	const dnnl_memory_desc_t *smd, *dmd;
	TRY(dnnl_memory_get_memory_desc(src, &smd));
	TRY(dnnl_memory_get_memory_desc(dst, &dmd));
	if (!accumulate && dnnl_memory_desc_equal(smd, dmd)) return dnnl_success;
	dnnl_primitive_attr_t attr = NULL;
	dnnl_post_ops_t po = NULL;
	TRY(dnnl_primitive_attr_clone(&attr, user_scratch));
	if (accumulate) {
		TRY(dnnl_post_ops_create(&po));
		TRY(dnnl_post_ops_append_sum(po, 1.0f));
		TRY(dnnl_primitive_attr_set_post_ops(attr, po));
	}
	dnnl_primitive_desc_t pd = NULL;
	dnnl_status_t st = dnnl_reorder_primitive_desc_create(&pd, smd, engine, dmd, engine, attr);
	if (po != NULL) dnnl_post_ops_destroy(po);
	if (attr != NULL) dnnl_primitive_attr_destroy(attr);
	if (st != dnnl_success) {
		snprintf(err, errlen, "reorder: status %d", (int)st);
		return st;
	}
	st = op_create(o, pd, err, errlen);
	dnnl_primitive_desc_destroy(pd);
	if (st != dnnl_success) return st;
	op_arg(o, DNNL_ARG_FROM, src);
	op_arg(o, DNNL_ARG_TO, dst);
	return dnnl_success;
}

/* Convolution. */

struct ppn_conv {
	dnnl_stream_t stream;
	int oc, bias;
	// Memory objects in ppnode's layouts, bound per call.
	dnnl_memory_t x, y, w, b, dx, dy, dw;
	// oneDNN's copies: weights for the forward and backward-data passes,
	// the weight and bias gradients (allocated by oneDNN).
	dnnl_memory_t wf, wd, dwi, dbi;
	op fwd, bwd_data, bwd_weights;
	op to_wf, to_wd, add_dw;
	void *scratch;
	// The weights wf and wd were last made from (valid_f, valid_d): a pass
	// with equal weights (memcmp, a few microseconds) reuses the copy
	// instead of reordering again, so a step reorders once, after the
	// optimizer's update, however many micro-batches it has.
	size_t wbytes;
	float *seen_f, *seen_d;
	int valid_f, valid_d;
};

static dnnl_status_t conv_build(ppn_conv *c, const ppn_conv_geom *g, char *err, int errlen) {
	dnnl_memory_desc_t src_md, dst_md, w_md, b_md, any_w, any_src, any_dst;
	dnnl_dims_t src_dims = {g->n, g->ic, g->ih, g->iw};
	dnnl_dims_t dst_dims = {g->n, g->oc, g->oh, g->ow};
	dnnl_dims_t b_dims = {g->oc};
	dnnl_dims_t strides = {g->sh, g->sw}, dil = {g->dh - 1, g->dw - 1};
	dnnl_dims_t pad_l = {g->pt, g->pl}, pad_r = {g->pb, g->pr};
	TRY(dnnl_memory_desc_init_by_tag(&src_md, 4, src_dims, dnnl_f32, dnnl_nhwc));
	TRY(dnnl_memory_desc_init_by_tag(&dst_md, 4, dst_dims, dnnl_f32, dnnl_nhwc));
	TRY(dnnl_memory_desc_init_by_tag(&b_md, 1, b_dims, dnnl_f32, dnnl_a));
	if (g->groups == 1) {
		dnnl_dims_t w_dims = {g->oc, g->ic, g->kh, g->kw};
		TRY(dnnl_memory_desc_init_by_tag(&w_md, 4, w_dims, dnnl_f32, dnnl_ohwi));
		TRY(dnnl_memory_desc_init_by_tag(&any_w, 4, w_dims, dnnl_f32, dnnl_format_tag_any));
	} else {
		dnnl_dims_t w_dims = {g->groups, g->oc / g->groups, g->ic / g->groups, g->kh, g->kw};
		TRY(dnnl_memory_desc_init_by_tag(&w_md, 5, w_dims, dnnl_f32, dnnl_gohwi));
		TRY(dnnl_memory_desc_init_by_tag(&any_w, 5, w_dims, dnnl_f32, dnnl_format_tag_any));
	}
	// Activations stay NHWC: oneDNN's direct NHWC kernels beat a reorder
	// of every activation to a blocked layout and back.
	any_src = src_md;
	any_dst = dst_md;

	dnnl_convolution_desc_t fd, dd, wd;
	TRY(dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct, &any_src, &any_w,
			g->bias ? &b_md : NULL, &any_dst, strides, dil, pad_l, pad_r));
	TRY(dnnl_dilated_convolution_backward_data_desc_init(&dd, dnnl_convolution_direct, &any_src, &any_w, &any_dst, strides,
			dil, pad_l, pad_r));
	TRY(dnnl_dilated_convolution_backward_weights_desc_init(&wd, dnnl_convolution_direct, &any_src, &any_w,
			g->bias ? &b_md : NULL, &any_dst, strides, dil, pad_l, pad_r));
	dnnl_primitive_desc_t fpd = NULL, dpd = NULL, wpd = NULL;
	dnnl_status_t st = dnnl_success;
#define STEP(call)                                                            \
	do {                                                                      \
		st = (call);                                                          \
		if (st != dnnl_success) {                                             \
			snprintf(err, errlen, "%s: status %d", #call, (int)st);           \
			goto done;                                                        \
		}                                                                     \
	} while (0)
	STEP(dnnl_primitive_desc_create(&fpd, &fd, user_scratch, engine, NULL));
	STEP(dnnl_primitive_desc_create(&dpd, &dd, user_scratch, engine, fpd));
	STEP(dnnl_primitive_desc_create(&wpd, &wd, user_scratch, engine, fpd));

	STEP(mem_new(&c->x, &src_md, DNNL_MEMORY_NONE, err, errlen));
	STEP(mem_new(&c->y, &dst_md, DNNL_MEMORY_NONE, err, errlen));
	STEP(mem_new(&c->dx, &src_md, DNNL_MEMORY_NONE, err, errlen));
	STEP(mem_new(&c->dy, &dst_md, DNNL_MEMORY_NONE, err, errlen));
	STEP(mem_new(&c->w, &w_md, DNNL_MEMORY_NONE, err, errlen));
	STEP(mem_new(&c->dw, &w_md, DNNL_MEMORY_NONE, err, errlen));
	if (g->bias) {
		STEP(mem_new(&c->b, &b_md, DNNL_MEMORY_NONE, err, errlen));
		STEP(mem_new(&c->dbi, &b_md, DNNL_MEMORY_ALLOCATE, err, errlen));
	}
	// The kernels were chosen with src and dst fixed to NHWC: check.
	if (!dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(fpd, dnnl_query_src_md, 0), &src_md) ||
			!dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 0), &dst_md)) {
		snprintf(err, errlen, "convolution does not take NHWC");
		st = dnnl_unimplemented;
		goto done;
	}
	STEP(mem_new(&c->wf, dnnl_primitive_desc_query_md(fpd, dnnl_query_weights_md, 0), DNNL_MEMORY_ALLOCATE, err, errlen));
	STEP(mem_new(&c->wd, dnnl_primitive_desc_query_md(dpd, dnnl_query_weights_md, 0), DNNL_MEMORY_ALLOCATE, err, errlen));
	STEP(mem_new(&c->dwi, dnnl_primitive_desc_query_md(wpd, dnnl_query_diff_weights_md, 0), DNNL_MEMORY_ALLOCATE, err, errlen));
	STEP(reorder_new(&c->to_wf, c->w, c->wf, 0, err, errlen));
	STEP(reorder_new(&c->to_wd, c->w, c->wd, 0, err, errlen));
	STEP(reorder_new(&c->add_dw, c->dwi, c->dw, 1, err, errlen));

	STEP(op_create(&c->fwd, fpd, err, errlen));
	op_arg(&c->fwd, DNNL_ARG_SRC, c->x);
	op_arg(&c->fwd, DNNL_ARG_WEIGHTS, c->to_wf.prim != NULL ? c->wf : c->w);
	if (g->bias) op_arg(&c->fwd, DNNL_ARG_BIAS, c->b);
	op_arg(&c->fwd, DNNL_ARG_DST, c->y);

	STEP(op_create(&c->bwd_data, dpd, err, errlen));
	op_arg(&c->bwd_data, DNNL_ARG_DIFF_DST, c->dy);
	op_arg(&c->bwd_data, DNNL_ARG_WEIGHTS, c->to_wd.prim != NULL ? c->wd : c->w);
	op_arg(&c->bwd_data, DNNL_ARG_DIFF_SRC, c->dx);

	STEP(op_create(&c->bwd_weights, wpd, err, errlen));
	op_arg(&c->bwd_weights, DNNL_ARG_SRC, c->x);
	op_arg(&c->bwd_weights, DNNL_ARG_DIFF_DST, c->dy);
	op_arg(&c->bwd_weights, DNNL_ARG_DIFF_WEIGHTS, c->dwi);
	if (g->bias) op_arg(&c->bwd_weights, DNNL_ARG_DIFF_BIAS, c->dbi);
	op *ops[] = {&c->fwd, &c->bwd_data, &c->bwd_weights, &c->to_wf, &c->to_wd, &c->add_dw};
	STEP(scratch_attach(&c->scratch, ops, 6, err, errlen));
	c->wbytes = dnnl_memory_desc_get_size(&w_md);
	c->seen_f = malloc(c->wbytes);
	c->seen_d = malloc(c->wbytes);
	if (c->seen_f == NULL || c->seen_d == NULL) {
		snprintf(err, errlen, "out of memory");
		st = dnnl_out_of_memory;
		goto done;
	}
done:
	if (fpd != NULL) dnnl_primitive_desc_destroy(fpd);
	if (dpd != NULL) dnnl_primitive_desc_destroy(dpd);
	if (wpd != NULL) dnnl_primitive_desc_destroy(wpd);
	return st;
#undef STEP
}

void ppn_conv_free(ppn_conv *c) {
	if (c == NULL) return;
	op_free(&c->fwd);
	op_free(&c->bwd_data);
	op_free(&c->bwd_weights);
	op_free(&c->to_wf);
	op_free(&c->to_wd);
	op_free(&c->add_dw);
	dnnl_memory_t *ms[] = {&c->x, &c->y, &c->w, &c->b, &c->dx, &c->dy, &c->dw, &c->wf, &c->wd, &c->dwi, &c->dbi};
	for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) mem_free(ms[i]);
	if (c->stream != NULL) dnnl_stream_destroy(c->stream);
	free(c->scratch);
	free(c->seen_f);
	free(c->seen_d);
	free(c);
}

int ppn_conv_new(const ppn_conv_geom *g, ppn_conv **out, char *err, int errlen) {
	*out = NULL;
	TRY(get_engine());
	ppn_conv *c = calloc(1, sizeof *c);
	if (c == NULL) {
		snprintf(err, errlen, "out of memory");
		return dnnl_out_of_memory;
	}
	c->oc = g->oc;
	c->bias = g->bias;
	dnnl_status_t st = dnnl_stream_create(&c->stream, engine, dnnl_stream_default_flags);
	if (st == dnnl_success) st = conv_build(c, g, err, errlen);
	if (st != dnnl_success) {
		ppn_conv_free(c);
		return st;
	}
	*out = c;
	return 0;
}

const char *ppn_conv_impl(ppn_conv *c, int which) {
	switch (which) {
	case 0:
		return c->fwd.impl;
	case 1:
		return c->bwd_data.impl;
	default:
		return c->bwd_weights.impl;
	}
}

#define RUN(o)                                 \
	do {                                       \
		if (st == dnnl_success) st = op_run(o, s); \
	} while (0)

// reorder_weights runs the reorder o of the weights w into oneDNN's copy
// unless the copy was made from equal weights.
static dnnl_status_t reorder_weights(ppn_conv *c, op *o, dnnl_stream_t s, const float *w, float *seen, int *valid) {
	if (o->prim == NULL || (*valid && memcmp(w, seen, c->wbytes) == 0)) return dnnl_success;
	*valid = 0;
	dnnl_status_t st = op_run(o, s);
	if (st == dnnl_success) st = dnnl_stream_wait(s);
	if (st == dnnl_success) {
		memcpy(seen, w, c->wbytes);
		*valid = 1;
	}
	return st;
}

int ppn_conv_forward(ppn_conv *c, int threads, const float *x, const float *w, const float *b, float *y) {
	omp_set_num_threads(threads);
	dnnl_stream_t s = c->stream;
	dnnl_status_t st = dnnl_success;
	bind(c->x, x);
	bind(c->w, w);
	bind(c->y, y);
	if (c->bias) bind(c->b, b);
	st = reorder_weights(c, &c->to_wf, s, w, c->seen_f, &c->valid_f);
	RUN(&c->fwd);
	if (st == dnnl_success) st = dnnl_stream_wait(s);
	unbind(c->x);
	unbind(c->w);
	unbind(c->y);
	unbind(c->b);
	return st;
}

int ppn_conv_backward_data(ppn_conv *c, int threads, const float *dy, const float *w, float *dx) {
	omp_set_num_threads(threads);
	dnnl_stream_t s = c->stream;
	dnnl_status_t st = dnnl_success;
	bind(c->dy, dy);
	bind(c->w, w);
	bind(c->dx, dx);
	st = reorder_weights(c, &c->to_wd, s, w, c->seen_d, &c->valid_d);
	RUN(&c->bwd_data);
	if (st == dnnl_success) st = dnnl_stream_wait(s);
	unbind(c->dy);
	unbind(c->w);
	unbind(c->dx);
	return st;
}

int ppn_conv_backward_weights(ppn_conv *c, int threads, const float *x, const float *dy) {
	omp_set_num_threads(threads);
	dnnl_stream_t s = c->stream;
	dnnl_status_t st = dnnl_success;
	bind(c->x, x);
	bind(c->dy, dy);
	RUN(&c->bwd_weights);
	if (st == dnnl_success) st = dnnl_stream_wait(s);
	unbind(c->x);
	unbind(c->dy);
	return st;
}

int ppn_conv_add_grads(ppn_conv *c, int threads, float *dw, float *db) {
	omp_set_num_threads(threads);
	dnnl_stream_t s = c->stream;
	dnnl_status_t st = dnnl_success;
	bind(c->dw, dw);
	RUN(&c->add_dw);
	if (st == dnnl_success) st = dnnl_stream_wait(s);
	if (st == dnnl_success && c->bias) {
		float *g = NULL;
		dnnl_memory_get_data_handle(c->dbi, (void **)&g);
		for (int i = 0; i < c->oc; i++) db[i] += g[i];
	}
	unbind(c->dw);
	return st;
}

/* Pooling. */

struct ppn_pool {
	dnnl_stream_t stream;
	size_t ws_size;
	dnnl_memory_t x, y, dx, dy, ws;
	op fwd, bwd;
	void *scratch;
};

static dnnl_status_t pool_build(ppn_pool *p, const ppn_pool_geom *g, char *err, int errlen) {
	dnnl_memory_desc_t src_md, dst_md;
	dnnl_dims_t src_dims = {g->n, g->c, g->ih, g->iw};
	dnnl_dims_t dst_dims = {g->n, g->c, g->oh, g->ow};
	dnnl_dims_t strides = {g->sh, g->sw}, kernel = {g->kh, g->kw};
	dnnl_dims_t pad_l = {g->pt, g->pl}, pad_r = {g->pb, g->pr};
	TRY(dnnl_memory_desc_init_by_tag(&src_md, 4, src_dims, dnnl_f32, dnnl_nhwc));
	TRY(dnnl_memory_desc_init_by_tag(&dst_md, 4, dst_dims, dnnl_f32, dnnl_nhwc));
	dnnl_alg_kind_t alg = g->alg == 0 ? dnnl_pooling_max
			: g->alg == 1            ? dnnl_pooling_avg_include_padding
									 : dnnl_pooling_avg_exclude_padding;
	dnnl_pooling_desc_t fd, bd;
	TRY(dnnl_pooling_forward_desc_init(&fd, dnnl_forward_training, alg, &src_md, &dst_md, strides, kernel, pad_l, pad_r));
	TRY(dnnl_pooling_backward_desc_init(&bd, alg, &src_md, &dst_md, strides, kernel, pad_l, pad_r));
	dnnl_primitive_desc_t fpd = NULL, bpd = NULL;
	dnnl_status_t st = dnnl_success;
#define STEP(call)                                                            \
	do {                                                                      \
		st = (call);                                                          \
		if (st != dnnl_success) {                                             \
			snprintf(err, errlen, "%s: status %d", #call, (int)st);           \
			goto done;                                                        \
		}                                                                     \
	} while (0)
	STEP(dnnl_primitive_desc_create(&fpd, &fd, user_scratch, engine, NULL));
	STEP(dnnl_primitive_desc_create(&bpd, &bd, user_scratch, engine, fpd));
	STEP(mem_new(&p->x, &src_md, DNNL_MEMORY_NONE, err, errlen));
	STEP(mem_new(&p->y, &dst_md, DNNL_MEMORY_NONE, err, errlen));
	STEP(mem_new(&p->dx, &src_md, DNNL_MEMORY_NONE, err, errlen));
	STEP(mem_new(&p->dy, &dst_md, DNNL_MEMORY_NONE, err, errlen));
	const dnnl_memory_desc_t *ws_md = dnnl_primitive_desc_query_md(fpd, dnnl_query_workspace_md, 0);
	p->ws_size = ws_md != NULL ? dnnl_memory_desc_get_size(ws_md) : 0;
	if (p->ws_size > 0) STEP(mem_new(&p->ws, ws_md, DNNL_MEMORY_NONE, err, errlen));
	STEP(op_create(&p->fwd, fpd, err, errlen));
	op_arg(&p->fwd, DNNL_ARG_SRC, p->x);
	op_arg(&p->fwd, DNNL_ARG_DST, p->y);
	if (p->ws != NULL) op_arg(&p->fwd, DNNL_ARG_WORKSPACE, p->ws);
	STEP(op_create(&p->bwd, bpd, err, errlen));
	op_arg(&p->bwd, DNNL_ARG_DIFF_DST, p->dy);
	op_arg(&p->bwd, DNNL_ARG_DIFF_SRC, p->dx);
	if (p->ws != NULL) op_arg(&p->bwd, DNNL_ARG_WORKSPACE, p->ws);
	op *ops[] = {&p->fwd, &p->bwd};
	STEP(scratch_attach(&p->scratch, ops, 2, err, errlen));
done:
	if (fpd != NULL) dnnl_primitive_desc_destroy(fpd);
	if (bpd != NULL) dnnl_primitive_desc_destroy(bpd);
	return st;
#undef STEP
}

void ppn_pool_free(ppn_pool *p) {
	if (p == NULL) return;
	op_free(&p->fwd);
	op_free(&p->bwd);
	dnnl_memory_t *ms[] = {&p->x, &p->y, &p->dx, &p->dy, &p->ws};
	for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) mem_free(ms[i]);
	if (p->stream != NULL) dnnl_stream_destroy(p->stream);
	free(p->scratch);
	free(p);
}

int ppn_pool_new(const ppn_pool_geom *g, ppn_pool **out, char *err, int errlen) {
	*out = NULL;
	TRY(get_engine());
	ppn_pool *p = calloc(1, sizeof *p);
	if (p == NULL) {
		snprintf(err, errlen, "out of memory");
		return dnnl_out_of_memory;
	}
	dnnl_status_t st = dnnl_stream_create(&p->stream, engine, dnnl_stream_default_flags);
	if (st == dnnl_success) st = pool_build(p, g, err, errlen);
	if (st != dnnl_success) {
		ppn_pool_free(p);
		return st;
	}
	*out = p;
	return 0;
}

size_t ppn_pool_workspace(ppn_pool *p) { return p->ws_size; }

int ppn_pool_forward(ppn_pool *p, int threads, const float *x, float *y, void *ws) {
	omp_set_num_threads(threads);
	dnnl_stream_t s = p->stream;
	dnnl_status_t st = dnnl_success;
	bind(p->x, x);
	bind(p->y, y);
	if (p->ws != NULL) bind(p->ws, ws);
	RUN(&p->fwd);
	if (st == dnnl_success) st = dnnl_stream_wait(s);
	unbind(p->x);
	unbind(p->y);
	unbind(p->ws);
	return st;
}

int ppn_pool_backward(ppn_pool *p, int threads, const float *dy, const void *ws, float *dx) {
	omp_set_num_threads(threads);
	dnnl_stream_t s = p->stream;
	dnnl_status_t st = dnnl_success;
	bind(p->dy, dy);
	bind(p->dx, dx);
	if (p->ws != NULL) bind(p->ws, ws);
	RUN(&p->bwd);
	if (st == dnnl_success) st = dnnl_stream_wait(s);
	unbind(p->dy);
	unbind(p->dx);
	unbind(p->ws);
	return st;
}

/* Batch normalisation: loops of our own, not oneDNN's.
 *
 * Each kernel runs over a chunk of rows (the caller splits a batch among
 * threads) of c channels: nn's BatchNorm loops, vectorised for the CPU at
 * hand (target_clones). A row's channels go in blocks of up to four vectors
 * of 16, whose sums stay in registers over a tile of rows; the tile's float
 * sums are added into double ones, so that sums over many rows keep the
 * precision of nn's own loops (oneDNN sums them in float, which moves
 * activations that sit near a ReLU's kink to its other side more often).
 * Channels beyond the last multiple of 16 go one at a time. */

#define KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#define INLINE static inline __attribute__((always_inline))
#define TILE 32 // rows summed in float before the sums go into double

typedef float v16 __attribute__((vector_size(64)));
typedef int vi16 __attribute__((vector_size(64)));
// KEEP(v, m) is v where the mask m (a comparison) holds, else 0.
#define KEEP(v, m) ((v16)((vi16)(v) & (m)))
#define LOAD(p)                                  \
	({                                           \
		v16 v_;                                  \
		__builtin_memcpy(&v_, (p), sizeof v_);   \
		v_;                                      \
	})
#define STORE(p, v)                              \
	do {                                         \
		v16 v_ = (v);                            \
		__builtin_memcpy((p), &v_, sizeof v_);   \
	} while (0)

// BLOCKS calls fn(j0, NV) for the channel blocks of a row of c channels,
// NV (vectors of 16) a constant in every call, then tail(j) for the rest.
#define BLOCKS(c, fn, tail)                                    \
	do {                                                       \
		int j0_ = 0;                                           \
		for (; j0_ + 64 <= (c); j0_ += 64) fn(j0_, 4);          \
		switch (((c) - j0_) / 16) {                            \
		case 3: fn(j0_, 3); j0_ += 48; break;                  \
		case 2: fn(j0_, 2); j0_ += 32; break;                  \
		case 1: fn(j0_, 1); j0_ += 16; break;                  \
		}                                                      \
		for (; j0_ < (c); j0_++) tail(j0_);                    \
	} while (0)

INLINE void stats_block(const float *restrict x, int rows, int c, const float *restrict shift, double *restrict s1,
		double *restrict s2, int j0, const int nv) {
	v16 sh[4], f1[4], f2[4];
	for (int v = 0; v < nv; v++) sh[v] = LOAD(shift + j0 + 16 * v);
	for (int r0 = 0; r0 < rows; r0 += TILE) {
		int r1 = r0 + TILE < rows ? r0 + TILE : rows;
		for (int v = 0; v < nv; v++) f1[v] = f2[v] = (v16){0};
		for (int r = r0; r < r1; r++)
			for (int v = 0; v < nv; v++) {
				v16 d = LOAD(x + (size_t)r * c + j0 + 16 * v) - sh[v];
				f1[v] += d;
				f2[v] += d * d;
			}
		for (int v = 0; v < nv; v++)
			for (int j = 0; j < 16; j++) {
				s1[j0 + 16 * v + j] += f1[v][j];
				s2[j0 + 16 * v + j] += f2[v][j];
			}
	}
}

INLINE void stats_tail(const float *restrict x, int rows, int c, const float *restrict shift, double *restrict s1,
		double *restrict s2, int j) {
	for (int r = 0; r < rows; r++) {
		double d = (double)x[(size_t)r * c + j] - (double)shift[j];
		s1[j] += d;
		s2[j] += d * d;
	}
}

KERNEL void ppn_bn_stats(const float *restrict x, int rows, int c, const float *restrict shift, double *restrict s1,
		double *restrict s2) {
#define FN(j0, nv) stats_block(x, rows, c, shift, s1, s2, j0, nv)
#define TAIL(j) stats_tail(x, rows, c, shift, s1, s2, j)
	BLOCKS(c, FN, TAIL);
#undef FN
#undef TAIL
}

INLINE void normalize_block(const float *restrict x, float *restrict y, int rows, int c, const float *restrict mean,
		const float *restrict scale, const float *restrict bias, int relu, int j0, const int nv) {
	v16 m[4], s[4], b[4];
	for (int v = 0; v < nv; v++) {
		m[v] = LOAD(mean + j0 + 16 * v);
		s[v] = LOAD(scale + j0 + 16 * v);
		b[v] = LOAD(bias + j0 + 16 * v);
	}
	for (int r = 0; r < rows; r++)
		for (int v = 0; v < nv; v++) {
			size_t o = (size_t)r * c + j0 + 16 * v;
			v16 z = (LOAD(x + o) - m[v]) * s[v] + b[v];
			STORE(y + o, relu ? KEEP(z, z > 0) : z);
		}
}

INLINE void normalize_tail(const float *restrict x, float *restrict y, int rows, int c, const float *restrict mean,
		const float *restrict scale, const float *restrict bias, int relu, int j) {
	for (int r = 0; r < rows; r++) {
		size_t o = (size_t)r * c + j;
		float z = (x[o] - mean[j]) * scale[j] + bias[j];
		y[o] = relu && !(z > 0) ? 0 : z;
	}
}

KERNEL void ppn_bn_normalize(const float *restrict x, float *restrict y, int rows, int c, const float *restrict mean,
		const float *restrict scale, const float *restrict bias, int relu) {
	if (c > 64) { // rows of many vectors: one row after another
		for (int r = 0; r < rows; r++) {
			const float *restrict xr = x + (size_t)r * c;
			float *restrict yr = y + (size_t)r * c;
			if (relu)
				for (int j = 0; j < c; j++) {
					float z = (xr[j] - mean[j]) * scale[j] + bias[j];
					yr[j] = z > 0 ? z : 0;
				}
			else
				for (int j = 0; j < c; j++) yr[j] = (xr[j] - mean[j]) * scale[j] + bias[j];
		}
		return;
	}
#define FN(j0, nv) normalize_block(x, y, rows, c, mean, scale, bias, relu, j0, nv)
#define TAIL(j) normalize_tail(x, y, rows, c, mean, scale, bias, relu, j)
	BLOCKS(c, FN, TAIL);
#undef FN
#undef TAIL
}

INLINE void grad_sums_block(const float *restrict x, const float *restrict y, const float *restrict dy, int rows,
		int c, const float *restrict mean, const float *restrict inv, double *restrict sdy, double *restrict sdyx, int j0,
		const int nv) {
	v16 m[4], iv[4], f1[4], f2[4];
	for (int v = 0; v < nv; v++) {
		m[v] = LOAD(mean + j0 + 16 * v);
		iv[v] = LOAD(inv + j0 + 16 * v);
	}
	for (int r0 = 0; r0 < rows; r0 += TILE) {
		int r1 = r0 + TILE < rows ? r0 + TILE : rows;
		for (int v = 0; v < nv; v++) f1[v] = f2[v] = (v16){0};
		for (int r = r0; r < r1; r++)
			for (int v = 0; v < nv; v++) {
				size_t o = (size_t)r * c + j0 + 16 * v;
				v16 d = LOAD(dy + o);
				if (y != NULL) d = KEEP(d, LOAD(y + o) > 0);
				f1[v] += d;
				f2[v] += d * ((LOAD(x + o) - m[v]) * iv[v]);
			}
		for (int v = 0; v < nv; v++)
			for (int j = 0; j < 16; j++) {
				sdy[j0 + 16 * v + j] += f1[v][j];
				sdyx[j0 + 16 * v + j] += f2[v][j];
			}
	}
}

INLINE void grad_sums_tail(const float *restrict x, const float *restrict y, const float *restrict dy, int rows,
		int c, const float *restrict mean, const float *restrict inv, double *restrict sdy, double *restrict sdyx, int j) {
	for (int r = 0; r < rows; r++) {
		size_t o = (size_t)r * c + j;
		float xhat = (x[o] - mean[j]) * inv[j];
		float d = y != NULL && !(y[o] > 0) ? 0 : dy[o];
		sdy[j] += (double)d;
		sdyx[j] += (double)d * (double)xhat;
	}
}

KERNEL void ppn_bn_grad_sums(const float *restrict x, const float *restrict y, const float *restrict dy, int rows, int c,
		const float *restrict mean, const float *restrict inv, double *restrict sdy, double *restrict sdyx) {
#define FN(j0, nv) grad_sums_block(x, y, dy, rows, c, mean, inv, sdy, sdyx, j0, nv)
#define TAIL(j) grad_sums_tail(x, y, dy, rows, c, mean, inv, sdy, sdyx, j)
	BLOCKS(c, FN, TAIL);
#undef FN
#undef TAIL
}

INLINE void dx_block(const float *restrict x, const float *restrict y, const float *restrict dy, float *restrict dx, int rows, int c,
		const float *restrict mean, const float *restrict inv, const float *restrict k, const float *restrict a,
		const float *restrict b, int j0, const int nv) {
	v16 m[4], iv[4], kk[4], aa[4], bb[4];
	for (int v = 0; v < nv; v++) {
		int j = j0 + 16 * v;
		m[v] = LOAD(mean + j);
		iv[v] = LOAD(inv + j);
		kk[v] = LOAD(k + j);
		aa[v] = LOAD(a + j);
		bb[v] = LOAD(b + j);
	}
	for (int r = 0; r < rows; r++)
		for (int v = 0; v < nv; v++) {
			size_t o = (size_t)r * c + j0 + 16 * v;
			v16 xhat = (LOAD(x + o) - m[v]) * iv[v];
			v16 d = LOAD(dy + o);
			if (y != NULL) d = KEEP(d, LOAD(y + o) > 0);
			STORE(dx + o, kk[v] * (d - aa[v] - xhat * bb[v]));
		}
}

INLINE void dx_tail(const float *restrict x, const float *restrict y, const float *restrict dy, float *restrict dx, int rows, int c,
		const float *restrict mean, const float *restrict inv, const float *restrict k, const float *restrict a,
		const float *restrict b, int j) {
	for (int r = 0; r < rows; r++) {
		size_t o = (size_t)r * c + j;
		float xhat = (x[o] - mean[j]) * inv[j];
		float d = y != NULL && !(y[o] > 0) ? 0 : dy[o];
		dx[o] = k[j] * (d - a[j] - xhat * b[j]);
	}
}

KERNEL void ppn_bn_dx(const float *restrict x, const float *restrict y, const float *restrict dy, float *restrict dx,
		int rows, int c, const float *restrict mean, const float *restrict inv, const float *restrict k,
		const float *restrict a, const float *restrict b) {
	if (c > 64) {
		for (int r = 0; r < rows; r++) {
			const float *restrict xr = x + (size_t)r * c, *restrict dr = dy + (size_t)r * c;
			float *restrict o = dx + (size_t)r * c;
			if (y != NULL) {
				const float *restrict yr = y + (size_t)r * c;
				for (int j = 0; j < c; j++) {
					float d = yr[j] > 0 ? dr[j] : 0;
					o[j] = k[j] * (d - a[j] - ((xr[j] - mean[j]) * inv[j]) * b[j]);
				}
			} else
				for (int j = 0; j < c; j++) o[j] = k[j] * (dr[j] - a[j] - ((xr[j] - mean[j]) * inv[j]) * b[j]);
		}
		return;
	}
#define FN(j0, nv) dx_block(x, y, dy, dx, rows, c, mean, inv, k, a, b, j0, nv)
#define TAIL(j) dx_tail(x, y, dy, dx, rows, c, mean, inv, k, a, b, j)
	BLOCKS(c, FN, TAIL);
#undef FN
#undef TAIL
}

/* Elementwise kernels over n floats, vectorised like the ones above. */

KERNEL void ppn_relu(const float *restrict x, float *restrict y, size_t n) {
	for (size_t i = 0; i < n; i++) y[i] = x[i] <= 0 ? 0 : x[i]; // -0 gives +0, NaN stays, as Go's max(x, 0)
}

KERNEL void ppn_relu_grad(const float *restrict y, const float *restrict dy, float *restrict dx, size_t n) {
	for (size_t i = 0; i < n; i++) dx[i] = y[i] > 0 ? dy[i] : 0;
}

// ppn_add writes y = a + b; y may be a.
KERNEL void ppn_add(const float *a, const float *restrict b, float *y, size_t n) {
	for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

/* The same kernels over a whole tensor on an OpenMP team: chunk k of
   chunks takes rows [k·rows/chunks, (k+1)·rows/chunks) (the split of
   package nn's chunked path), and its sums go to parts[2kc..2kc+c) and
   parts[(2k+1)c..(2k+2)c). */

#define CHUNK_ROWS(k) int r0 = (int)((long)(k) * rows / chunks), nr = (int)((long)((k) + 1) * rows / chunks) - r0; \
	size_t o = (size_t)r0 * c

void ppn_bn_stats_team(int chunks, const float *x, int rows, int c, const float *shift, double *parts) {
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
	for (int k = 0; k < chunks; k++) {
		CHUNK_ROWS(k);
		ppn_bn_stats(x + o, nr, c, shift, parts + 2 * (size_t)k * c, parts + (2 * (size_t)k + 1) * c);
	}
}

void ppn_bn_normalize_team(int chunks, const float *x, float *y, int rows, int c, const float *mean, const float *scale,
		const float *bias, int relu) {
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
	for (int k = 0; k < chunks; k++) {
		CHUNK_ROWS(k);
		ppn_bn_normalize(x + o, y + o, nr, c, mean, scale, bias, relu);
	}
}

void ppn_bn_grad_sums_team(int chunks, const float *x, const float *y, const float *dy, int rows, int c,
		const float *mean, const float *inv, double *parts) {
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
	for (int k = 0; k < chunks; k++) {
		CHUNK_ROWS(k);
		ppn_bn_grad_sums(x + o, y != NULL ? y + o : NULL, dy + o, nr, c, mean, inv, parts + 2 * (size_t)k * c,
				parts + (2 * (size_t)k + 1) * c);
	}
}

void ppn_bn_dx_team(int chunks, const float *x, const float *y, const float *dy, float *dx, int rows, int c,
		const float *mean, const float *inv, const float *k_, const float *a, const float *b) {
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
	for (int k = 0; k < chunks; k++) {
		CHUNK_ROWS(k);
		ppn_bn_dx(x + o, y != NULL ? y + o : NULL, dy + o, dx + o, nr, c, mean, inv, k_, a, b);
	}
}

// ppn_ew_team runs an elementwise kernel (0 relu, 1 relu_grad, 2 add) in
// chunks of step values.
void ppn_ew_team(int chunks, int op, const float *a, const float *b, float *y, size_t n) {
	size_t step = (n + chunks - 1) / chunks;
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
	for (int k = 0; k < chunks; k++) {
		size_t lo = (size_t)k * step, hi = lo + step < n ? lo + step : n;
		if (lo >= hi) continue;
		switch (op) {
		case 0: ppn_relu(a + lo, y + lo, hi - lo); break;
		case 1: ppn_relu_grad(a + lo, b + lo, y + lo, hi - lo); break;
		case 2: ppn_add(a + lo, b + lo, y + lo, hi - lo); break;
		}
	}
}
