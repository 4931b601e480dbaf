package onnx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"

	"google.golang.org/protobuf/proto"

	"github.com/ppnode/ppnode/onnx/onnxpb"
)

// ErrModel wraps every problem with a model file.
var ErrModel = errors.New("onnx: bad model")

func modelErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrModel, fmt.Sprintf(format, a...))
}

// MaxFileBytes bounds a model file: protobuf messages are under 2 GiB.
const MaxFileBytes = 2<<30 - 1

// Load reads and parses the model file at path.
func Load(path string) (*onnxpb.ModelProto, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxFileBytes {
		return nil, modelErr("%s is over %d bytes", path, MaxFileBytes)
	}
	m, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// Parse decodes a model. The decoder allocates in proportion to b, never to
// a length the file claims.
func Parse(b []byte) (*onnxpb.ModelProto, error) {
	m := &onnxpb.ModelProto{}
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, modelErr("not an ONNX model (truncated or corrupt): %v", err)
	}
	if m.GetGraph() == nil || len(m.GetGraph().GetNode()) == 0 {
		return nil, modelErr("no graph (is this an ONNX model file?)")
	}
	return m, nil
}

// constant is a tensor known when the graph is built: an initializer, a
// Constant node's value, or a shape computed from shapes.
type constant struct {
	shape []int
	f     []float32 // for float tensors
	i     []int64   // for integer tensors
}

func (c *constant) size() int {
	if c.f != nil {
		return len(c.f)
	}
	return len(c.i)
}

// ints returns an integer constant's values (float constants converted when
// they are whole numbers).
func (c *constant) ints() ([]int64, bool) {
	if c.f == nil {
		return c.i, true
	}
	out := make([]int64, len(c.f))
	for j, v := range c.f {
		if v != float32(int64(v)) {
			return nil, false
		}
		out[j] = int64(v)
	}
	return out, true
}

// scalar returns a one-element constant's value.
func (c *constant) scalar() (float32, bool) {
	if c.size() != 1 {
		return 0, false
	}
	if c.f != nil {
		return c.f[0], true
	}
	return float32(c.i[0]), true
}

// tensorOf decodes a TensorProto, checking the dims against the bytes that
// hold them before allocating.
func tensorOf(t *onnxpb.TensorProto) (*constant, error) {
	name := t.GetName()
	if t.GetDataLocation() == onnxpb.TensorProto_EXTERNAL {
		return nil, modelErr("tensor %q is stored outside the file; export the model with its weights inside (no external data)", name)
	}
	shape := make([]int, len(t.GetDims()))
	n := 1
	for i, d := range t.GetDims() {
		if d < 0 || d > math.MaxInt32 {
			return nil, modelErr("tensor %q has dims %v", name, t.GetDims())
		}
		shape[i] = int(d)
		if n = satMul(n, int(d)); n > math.MaxInt32 {
			return nil, modelErr("tensor %q has dims %v", name, t.GetDims())
		}
	}
	raw := t.GetRawData()
	c := &constant{shape: shape}
	switch dt := onnxpb.TensorProto_DataType(t.GetDataType()); dt {
	case onnxpb.TensorProto_FLOAT:
		switch {
		case raw != nil:
			if len(raw) != 4*n {
				return nil, modelErr("tensor %q: %d bytes for dims %v", name, len(raw), shape)
			}
			c.f = make([]float32, n)
			for i := range c.f {
				c.f[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
			}
		case len(t.GetFloatData()) == n:
			c.f = append([]float32{}, t.GetFloatData()...)
		default:
			return nil, modelErr("tensor %q: %d values for dims %v", name, len(t.GetFloatData()), shape)
		}
	case onnxpb.TensorProto_INT64, onnxpb.TensorProto_INT32, onnxpb.TensorProto_BOOL, onnxpb.TensorProto_DOUBLE:
		width := map[onnxpb.TensorProto_DataType]int{onnxpb.TensorProto_INT64: 8, onnxpb.TensorProto_INT32: 4,
			onnxpb.TensorProto_BOOL: 1, onnxpb.TensorProto_DOUBLE: 8}[dt]
		switch {
		case raw != nil:
			if len(raw) != width*n {
				return nil, modelErr("tensor %q: %d bytes for dims %v of %s", name, len(raw), shape, dt)
			}
			if dt == onnxpb.TensorProto_DOUBLE {
				c.f = make([]float32, n)
				for i := range c.f {
					c.f[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:])))
				}
				break
			}
			c.i = make([]int64, n)
			for i := range c.i {
				switch width {
				case 8:
					c.i[i] = int64(binary.LittleEndian.Uint64(raw[8*i:]))
				case 4:
					c.i[i] = int64(int32(binary.LittleEndian.Uint32(raw[4*i:])))
				default:
					c.i[i] = int64(raw[i])
				}
			}
		case dt == onnxpb.TensorProto_INT64 && len(t.GetInt64Data()) == n:
			c.i = append([]int64{}, t.GetInt64Data()...)
		case dt == onnxpb.TensorProto_DOUBLE && len(t.GetDoubleData()) == n:
			c.f = make([]float32, n)
			for i, v := range t.GetDoubleData() {
				c.f[i] = float32(v)
			}
		case len(t.GetInt32Data()) == n:
			c.i = make([]int64, n)
			for i, v := range t.GetInt32Data() {
				c.i[i] = int64(v)
			}
		default:
			return nil, modelErr("tensor %q: no data for dims %v of %s", name, shape, dt)
		}
		if c.i == nil && c.f == nil {
			c.i = []int64{}
		}
	default:
		return nil, modelErr("tensor %q has data type %s; ppnode trains float32 models", name, dt)
	}
	return c, nil
}

func satMul(a, b int) int {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}
