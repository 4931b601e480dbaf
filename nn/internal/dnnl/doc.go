// Package dnnl runs nn's convolutions and pooling through oneDNN (Intel's
// Deep Neural Network Library, which PyTorch uses on CPUs), and batch
// normalisation through vectorised C loops of its own, when built with the
// tag dnnl against Debian's libdnnl-dev (oneDNN 2.x, OpenMP runtime).
// Without the tag, or without cgo, Available is false, every New function
// returns ErrUnavailable and the kernels panic.
//
// The cgo code lives here rather than in nn because a package that uses
// cgo cannot hold Go assembly (the go command assembles its .s files with
// the C compiler), and nn's kernels are written in Go assembly.
//
// # Tensors
//
// Every tensor crosses in nn's layout: activations NHWC, convolution
// weights OHWI ([Out, KH, KW, In/Groups]), vectors plain. Weights are
// reordered into the layout oneDNN's kernels want inside a call, unless
// they equal (memcmp) the weights of the primitive's last reorder; weight
// gradients are reordered back and added into the caller's. Activations
// stay NHWC, which oneDNN's direct kernels take as they are.
//
// # Lifetime and concurrency
//
// A primitive (Conv, Pool) is made once per geometry and batch size and
// used for every pass of that shape. A call binds the caller's
// slices, executes and unbinds them before it returns, so oneDNN keeps no
// pointer into Go memory and a primitive holds no tensor of a pass. A
// primitive must not be used by two goroutines at once (it has one set of
// bindings); different primitives may run concurrently. oneDNN's OpenMP
// threads are set to the threads argument on every call, since OpenMP's
// setting belongs to the calling OS thread and Go moves goroutines between
// those. A primitive's C memory is freed when it is garbage collected.
//
// The batch normalisation kernels (BNStats and the others) run over a
// chunk of rows each and keep nothing; the caller splits a batch among its
// threads and adds the chunks' sums. Their Team forms, and ElementwiseTeam
// (ReLU, its gradient, Add; package nn has the same loops in Go for every
// other path), split the batch themselves and run the chunks on the OpenMP
// team of the calling OS thread, as oneDNN's primitives do with threads >
// 1: libgomp keeps a team per calling OS thread, so a caller that wants
// one team calls from one.
//
// # Errors
//
// Making a primitive returns an error when oneDNN has no kernel for the
// geometry; running one returns an error wrapping ErrExec if oneDNN fails.
// Tensors of the wrong length are the caller's bug and panic.
//
// Results are not bit-reproducible: oneDNN and the compiler's vector
// clones (target_clones) pick their code by CPU model, and the callers
// split their work by thread count.
package dnnl

import "errors"

// ErrUnavailable is returned by every New function of a build without
// oneDNN.
var ErrUnavailable = errors.New("dnnl: oneDNN is not compiled in (build with -tags dnnl and libdnnl-dev)")

// ConvGeom is a convolution's geometry: batch, input and output sizes,
// kernel, strides, dilations (1 is none), pads per side, groups, bias.
type ConvGeom struct {
	N, IC, IH, IW          int
	OC, OH, OW             int
	KH, KW, SH, SW, DH, DW int
	PadT, PadL, PadB, PadR int
	Groups                 int
	Bias                   bool
}

// PoolAlg is a pooling algorithm.
type PoolAlg int

const (
	PoolMax           PoolAlg = iota // maximum; padding never wins
	PoolAvgIncludePad                // sum divided by KH·KW
	PoolAvgExcludePad                // sum divided by the elements inside the input
)

// PoolGeom is a pooling's geometry.
type PoolGeom struct {
	N, C, IH, IW, OH, OW   int
	KH, KW, SH, SW         int
	PadT, PadL, PadB, PadR int
	Alg                    PoolAlg
}

// Elementwise operations of ElementwiseTeam.
const (
	OpReLU     = 0 // y = max(a, 0)
	OpReLUGrad = 1 // y = b where a > 0, else 0
	OpAdd      = 2 // y = a + b
)
