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
	return LoadFrom(f, path)
}

// LoadFrom reads and parses a model file opened as r; name is its path,
// for errors.
func LoadFrom(r io.Reader, name string) (*onnxpb.ModelProto, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxFileBytes {
		return nil, modelErr("%s is over %d bytes", name, MaxFileBytes)
	}
	m, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
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

// tensorOf decodes a TensorProto, checking the dims against the bytes that
// hold them before allocating.
func tensorOf(t *onnxpb.TensorProto) (*konst, error) {
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
	c := &konst{shape: shape, batch: -1}
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
				c.kind, c.f = kFloat, make([]float32, n)
				for i := range c.f {
					c.f[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:])))
				}
				break
			}
			c.kind, c.i = kInt, make([]sym, n)
			for i := range c.i {
				switch width {
				case 8:
					c.i[i].c = int64(binary.LittleEndian.Uint64(raw[8*i:]))
				case 4:
					c.i[i].c = int64(int32(binary.LittleEndian.Uint32(raw[4*i:])))
				default:
					c.i[i].c = int64(raw[i])
				}
			}
		case dt == onnxpb.TensorProto_INT64 && len(t.GetInt64Data()) == n:
			c.kind, c.i = kInt, make([]sym, n)
			for i, v := range t.GetInt64Data() {
				c.i[i].c = v
			}
		case dt == onnxpb.TensorProto_DOUBLE && len(t.GetDoubleData()) == n:
			c.kind, c.f = kFloat, make([]float32, n)
			for i, v := range t.GetDoubleData() {
				c.f[i] = float32(v)
			}
		case len(t.GetInt32Data()) == n:
			c.kind, c.i = kInt, make([]sym, n)
			for i, v := range t.GetInt32Data() {
				c.i[i].c = int64(v)
			}
		default:
			return nil, modelErr("tensor %q: no data for dims %v of %s", name, shape, dt)
		}
		if dt == onnxpb.TensorProto_BOOL {
			c.kind = kBool
		}
		if c.i == nil && c.f == nil {
			c.kind, c.i = kInt, []sym{}
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

// ParamCount counts the values of a model's float initializers, and of
// those that are not BatchNorm's running statistics, without decoding them.
func ParamCount(m *onnxpb.ModelProto) (all, trainable int64) {
	stats := map[string]bool{}
	for _, n := range m.GetGraph().GetNode() {
		if n.GetOpType() == "BatchNormalization" {
			for _, in := range n.GetInput()[min(3, len(n.GetInput())):] {
				stats[in] = true
			}
		}
	}
	for _, t := range m.GetGraph().GetInitializer() {
		if onnxpb.TensorProto_DataType(t.GetDataType()) != onnxpb.TensorProto_FLOAT {
			continue
		}
		n := int64(1)
		for _, d := range t.GetDims() {
			n = int64(satMul(int(n), int(max(d, 0))))
		}
		all += n
		if !stats[t.GetName()] {
			trainable += n
		}
	}
	return all, trainable
}
