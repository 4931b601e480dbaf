package tensorio

//go:generate stringer -type=DType

// DType is the element type of stored tensor data. The values are part of
// the frame and checkpoint formats; never renumber them.
type DType uint8

// Element types. ppnode computes in F32; the others are read from
// safetensors files and converted to float32 on demand.
const (
	F32  DType = iota + 1 // IEEE 754 binary32
	F64                   // IEEE 754 binary64
	I32                   // two's complement int32
	I64                   // two's complement int64
	U8                    // unsigned byte
	BF16                  // bfloat16: the upper 16 bits of a binary32
	F16                   // IEEE 754 binary16
)

// Size is the size of one element in bytes, or 0 for an unknown DType.
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case F64, I64:
		return 8
	case BF16, F16:
		return 2
	case U8:
		return 1
	}
	return 0
}

// parseDType maps the safetensors dtype names to DType.
func parseDType(s string) (DType, bool) {
	for d := F32; d <= F16; d++ {
		if d.String() == s {
			return d, true
		}
	}
	return 0, false
}

// safetensorsRank orders dtypes as the safetensors reference implementation
// (Rust enum Dtype, derive(Ord)) does, so that files we write lay out data
// in the same order as files it writes: higher rank first.
func safetensorsRank(d DType) int {
	switch d {
	case U8:
		return 1
	case F16:
		return 7
	case BF16:
		return 8
	case I32:
		return 9
	case F32:
		return 11
	case F64:
		return 12
	case I64:
		return 13
	}
	return 0
}
