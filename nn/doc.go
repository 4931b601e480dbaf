// Package nn is ppnode's compute core: float32 tensors (gorgonia.org/tensor
// *tensor.Dense used as the container; the hot loops are our own), the GEMM
// backend, layers with forward and backward passes, the losses (softmax
// cross-entropy, squared error, binary cross-entropy of logits), optimizers,
// and the model graph, a DAG of named layers.
//
// # Layout
//
// Activations are stored batch-first and channels-last (NHWC for images,
// [N, F] for features). Linear weights are [out, in] as in PyTorch (or [in,
// out] when Transposed); Conv2D weights are [out, kh, kw, in/groups] (OHWI),
// so that a 1x1 convolution is a plain GEMM and im2col rows are contiguous.
// A Param's Layout gives its exported (PyTorch) layout, OIHW for
// convolutions: weight files and fingerprints use it. Parameter names are
// stable: "<node>.<param>", for example "layer3.1.conv2.weight", or the
// names a model file gives.
//
// # Micro-batches and slots
//
// A pipeline stage runs the forward pass of several micro-batches before
// their backward passes (GPipe), so every layer keeps its saved tensors per
// slot. A [Stage] owns the slots; Forward(slot) and Backward(slot) may be
// interleaved in any order as long as each slot alternates forward and
// backward. All buffers are reused across steps: a steady-state training step
// allocates no tensors.
//
// # Determinism
//
// Parameter gradients accumulate in the order in which Backward is called;
// callers call it in ascending micro-batch order, which makes a pipelined
// step compute exactly what one process computes. So do BackwardInput and
// BackwardWeight, the halves of Backward for zero-bubble schedules, when the
// BackwardWeight calls come in ascending micro-batch order; a forward pass
// repeated with Ctx.Recompute computes the same outputs again. Every reduction in this
// package runs in a fixed order that does not depend on the thread count, and
// randomness (initialisation, dropout) comes from generators seeded by
// (seed, name) or (seed, step, micro-batch, layer). With a deterministic
// [Backend] the bits are the same on every run and every machine, amd64 and
// arm64 alike: its GEMM fixes each element's arithmetic (gemm.go), and the
// layers round every product before they add it, float32(x*y) + z, since Go
// may fuse x*y + z into one multiply-add on arm64 (and on amd64 from
// GOAMD64=v3), which rounds once instead of twice. Softmax, LogSoftmax,
// the softmax and binary cross-entropies, GELU, sigmoid, tanh, SiLU, Exp, ELU and the LSTM,
// GRU and RNN cells take their exp and log from fastmath.go, built the same
// way (its AVX2 kernels give its bits). One caveat: the math package's
// Exp, Log, Cos, Tanh, Erf and Pow are not bit-identical across
// architectures (nor is Exp across amd64 CPUs with and without FMA). What
// still uses them (Erf's forward pass, ONNX's Log, Sin, Cos, Pow and
// Softplus's log1p) calls them in float64 and rounds the result to
// float32, where a last-bit difference survives only when the value lies
// within a float64 ulp of a float32 rounding boundary: rare, but not
// impossible. The cosine schedule's rates come from fastmath.go's cosPi.
// integration/crossarch checks mlp32, resnet50, and a GPT, an LSTM, a GRU
// and an RNN exported from PyTorch under qemu.
//
// # Errors
//
// Shape mismatches inside a built graph are programmer errors and panic;
// building a graph from user input returns errors.
package nn
