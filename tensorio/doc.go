// Package tensorio moves ppnode's tensors across machine boundaries and
// onto disk: compressed, checksummed frames for activations and gradients,
// crash-safe checkpoint files, and safetensors import and export for
// weights shared with PyTorch.
//
// # Frames
//
// A frame carries one float32 tensor. Integers are little-endian; r is the
// rank:
//
//	+-------+-----+-------+-------+------+---------+---------+---------+-------------+------------+---------+
//	| magic | ver | dtype | codec | rank | dims    | raw len | enc len | payload CRC | header CRC | payload |
//	| PPTF  |  1  |  u8   |  u8   | u8 r | r x u32 |   u64   |   u64   |     u32     |    u32     |         |
//	+-------+-----+-------+-------+------+---------+---------+---------+-------------+------------+---------+
//	0       4     5       6       7      8         8+4r      16+4r     24+4r         28+4r        32+4r
//
// The raw length is 4 x the element count; the encoded length is the
// payload's. The header checksum covers bytes [0, 28+4r), so a reader
// trusts the shape and lengths before it allocates anything; the payload
// checksum covers the encoded bytes. Checksums are CRC-32C (Castagnoli,
// [Checksum]); on amd64 with AVX-512 they fold 256-byte blocks with
// carry-less multiplications while CRC32 instructions take three more
// streams of the input (63-80 GB/s on one core here, about three times
// hash/crc32), elsewhere hash/crc32 computes them.
//
// [AppendFrame] and [DecodeFrame] work on byte slices; [Writer] and
// [Reader] on streams. All of them reuse their buffers and the codecs'
// state, so frames of a steady shape cost no allocation, and decoding
// into a tensor of the right shape fills that tensor in place. A raw
// frame's payload is copied and checksummed in one pass ([AppendFrame],
// [DecodeFrame]), which costs about what the copy alone costs on tensors
// larger than the L2 cache; [Writer] and [Reader] write and read it
// straight from and into the tensor's memory, and checksum it in a pass
// of their own.
//
// # Codecs
//
// All codecs but bf16 and int8 are lossless: decoding returns every bit, NaN
// payloads and -0 included. Only the bit pattern of +0 counts as zero.
//
//	raw           the float32 bytes
//	sparse        bitmap of non-zero elements + the non-zero values
//	sparse+huff   bitmap + the values' top bytes (sign, exponent), both
//	              Huffman-coded in 128 KiB blocks, + their low three bytes
//	sparse+zstd   as sparse+huff, with bitmap and top bytes through zstd
//	shuffle+zstd  byte planes (all first bytes, then all second ...) + zstd
//	s2            S2 (Snappy successor) block
//	zstd          zstd at its fastest level
//	bf16          lossy: bfloat16, round to nearest, ties to even; opt-in
//	int8          lossy: a float32 scale per 64 values + one byte each; opt-in
//
// The sparse codecs suit ReLU activations. On amd64 with AVX-512 (VBMI)
// their bitmap and packing run as compress and expand instructions. On
// one core, on activations recorded from training (testdata/real, see
// BENCHMARKS.md): mlp32's ReLU outputs (55% zeros) go as sparse at a
// ratio of 2.1 and about 30 GB/s, as sparse+huff at 2.5 and 3.7 GB/s;
// ResNet-50's block outputs (a quarter zeros) reach 1.6 with sparse+huff.
// Both are at their order-0 entropy. Dense gradients barely compress
// (1.19).
// bf16 has a relative error of at most 2^-8 for normal values and an
// absolute error of at most 2^-134 for subnormal ones; values beyond the
// largest bfloat16 round to infinity, NaNs stay NaN.
// int8 stores each value as round(x/scale), scale being its block's
// largest finite magnitude over 127: the error is at most half a scale
// (plus 127 * 2^-150 where the scale is subnormal); Inf and NaN decode as
// NaN. Its payload is 0.266 of raw.
//
// # Codec choice
//
// [SpeedTable.Choose] picks, for a sample of the data and a link speed,
// the lossless codec that minimises encode + transfer + decode time, from
// the sample's compression ratio (measured by encoding it) and each
// codec's speed (measured once per process by [MeasureSpeeds], or given
// as a [SpeedTable]). Incompressible data gets raw; on the recorded
// activations sparse wins up to 10 Gbit/s at least (its cost per byte is
// below the transfer time it saves), stronger codecs on slow links.
//
// # Checkpoints
//
// A [Checkpoint] holds a job's parameters and optimizer state after a
// step, with the job ID, step, plan hash, data position, RNG state and
// free-form metadata. Its file is the tensors' frames, then a JSON index,
// then a footer:
//
//	+------+-----+--------+-------------------------+------------+--------------------------------+
//	| PPCK | ver | 3 zero | frames, one per tensor  | index JSON | index len u32, index CRC-32C   |
//	|      | (1) |        | (raw codec)             |            | u32, "PPCKEND\n"               |
//	+------+-----+--------+-------------------------+------------+--------------------------------+
//
// Every byte is covered by a checksum and the footer comes last, so a
// truncated or damaged file is detected; the error names the damaged
// tensor. Files are written atomically (temporary file, fsync, rename,
// fsync of the directory): after a crash a reader sees the old file or
// the new one, never a torn one. A consistent cut of a pipelined job is
// one whole-model checkpoint, gathered from the stages by the coordinator.
// A [Store] keeps the last N checkpoints of each job in a directory and
// finds the newest complete one.
//
// [VerifyCheckpointAt] checks a file through an io.ReaderAt without
// holding it: header, footer, index (its length bounded by the file and
// [MaxCheckpointIndex], its checksum computed before it is read in), then
// each frame, its payload checksummed 1 MiB at a time. [Store.SaveFrom]
// streams a received file to disk, refusing it at the first bytes that
// are not a checkpoint header, and verifies it there: a 64 MiB upload
// costs about 2 MiB of heap besides its index, garbage or not. [LoadCheckpoint] reads each
// frame straight into its tensor.
//
// # Safetensors
//
// [WriteSafetensors] and [ReadSafetensors] speak the safetensors format
// (8-byte header length, JSON header, raw little-endian data) laid out as
// the reference implementation does, so weights move between ppnode and
// PyTorch. Reading refuses, as the reference does, a header that is not
// valid UTF-8; it accepts F32, F64, I32, I64, U8, BF16 and F16 and
// converts to float32 on demand ([Entry.Float32s]); writing produces F32,
// and I64 through [I64Entry]. [WeightsSHA256] fingerprints a set of
// weights bit for bit.
//
// # Errors
//
// Anything wrong with bytes that came from the network or from disk is
// reported as an error wrapping [ErrCorrupt] (a truncated input also wraps
// io.ErrUnexpectedEOF); decoders never panic on bad input. Sizes are
// checked against limits ([MaxElements], [MaxRank],
// [MaxSafetensorsHeader], [MaxCheckpointIndex]) before any allocation: a
// frame header claiming 2^40 elements is rejected, not allocated. Invalid
// arguments from the caller (a non-contiguous tensor, an unknown codec, a
// checkpoint with duplicate names) are plain errors.
package tensorio
