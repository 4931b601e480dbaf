package tensorio

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"unicode/utf8"

	"github.com/ppnode/ppnode/nn"
)

// Named is a float32 tensor with its name.
type Named struct {
	Name string
	T    *nn.Tensor
}

// Entry is one tensor of a safetensors file as stored: its dtype, shape
// and little-endian bytes. Entries returned by ParseSafetensors alias the
// parsed buffer.
type Entry struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte
}

// MaxSafetensorsHeader is the largest JSON header ReadSafetensors accepts
// (the reference implementation's limit).
const MaxSafetensorsHeader = 100 << 20

const safetensorsMetadataKey = "__metadata__"

// F32Entry returns the entry of a float32 tensor. On little-endian
// machines Data aliases the tensor's memory.
func F32Entry(name string, t *nn.Tensor) (Entry, error) {
	data, err := tensorData(t)
	if err != nil {
		return Entry{}, fmt.Errorf("tensorio: tensor %q: %w", name, err)
	}
	b := f32View(data)
	if b == nil && len(data) > 0 {
		b = make([]byte, 4*len(data))
		putF32s(b, data)
	}
	return Entry{Name: name, DType: F32, Shape: append([]int{}, t.Shape()...), Data: b}, nil
}

// I64Entry returns the entry of an int64 tensor, such as labels. With no
// shape the tensor is one-dimensional.
func I64Entry(name string, v []int64, shape ...int) Entry {
	if len(shape) == 0 {
		shape = []int{len(v)}
	}
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return Entry{Name: name, DType: I64, Shape: append([]int{}, shape...), Data: b}
}

// Float32s converts the entry's data to float32 (exactly, except F64 and
// large I32/I64 values, which round to nearest).
func (e Entry) Float32s() ([]float32, error) {
	n, ok := shapeSize(e.Shape)
	if !ok || e.DType.Size() == 0 || len(e.Data) != n*e.DType.Size() {
		return nil, corruptf("tensor %q: %d bytes of %v for shape %v", e.Name, len(e.Data), e.DType, e.Shape)
	}
	out := make([]float32, n)
	b := e.Data
	switch e.DType {
	case F32:
		getF32s(out, b)
	case F64:
		for i := range out {
			out[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:])))
		}
	case I32:
		for i := range out {
			out[i] = float32(int32(binary.LittleEndian.Uint32(b[4*i:])))
		}
	case I64:
		for i := range out {
			out[i] = float32(int64(binary.LittleEndian.Uint64(b[8*i:])))
		}
	case U8:
		for i := range out {
			out[i] = float32(b[i])
		}
	case BF16:
		bf16Decode(out, b)
	case F16:
		for i := range out {
			out[i] = f16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	}
	return out, nil
}

// Tensor converts the entry to a float32 tensor. A rank-0 (scalar) entry
// becomes a tensor of shape [1].
func (e Entry) Tensor() (*nn.Tensor, error) {
	data, err := e.Float32s()
	if err != nil {
		return nil, err
	}
	if len(e.Shape) == 0 {
		return nn.FromData(data, 1), nil
	}
	return nn.FromData(data, append([]int{}, e.Shape...)...), nil
}

// Int64s returns the values of an integer entry (I64, I32 or U8).
func (e Entry) Int64s() ([]int64, error) {
	n, ok := shapeSize(e.Shape)
	if !ok || len(e.Data) != n*e.DType.Size() {
		return nil, corruptf("tensor %q: %d bytes of %v for shape %v", e.Name, len(e.Data), e.DType, e.Shape)
	}
	out := make([]int64, n)
	switch e.DType {
	case I64:
		for i := range out {
			out[i] = int64(binary.LittleEndian.Uint64(e.Data[8*i:]))
		}
	case I32:
		for i := range out {
			out[i] = int64(int32(binary.LittleEndian.Uint32(e.Data[4*i:])))
		}
	case U8:
		for i := range out {
			out[i] = int64(e.Data[i])
		}
	default:
		return nil, fmt.Errorf("tensorio: tensor %q has dtype %v, not an integer", e.Name, e.DType)
	}
	return out, nil
}

// f16ToF32 converts an IEEE 754 binary16 to binary32 exactly.
func f16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN; keep the payload
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
	case man == 0: // ±0
		return math.Float32frombits(sign)
	}
	// Subnormal half: normalise.
	e := uint32(113)
	for man&0x400 == 0 {
		man <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (man&0x3ff)<<13)
}

// safetensorsInfo is one tensor's entry in the JSON header.
type safetensorsInfo struct {
	DType   string   `json:"dtype"`
	Shape   []int64  `json:"shape"`
	Offsets []uint64 `json:"data_offsets"`
}

// ParseSafetensors parses a safetensors file held in data and returns its
// entries, sorted by name, and its metadata. The entries' Data alias data.
// The file is validated as the reference implementation does: a header
// of valid UTF-8, known dtypes, non-negative shapes whose size matches the
// data offsets, and offsets that tile the data section exactly, without
// gaps or overlaps.
// Errors wrap ErrCorrupt.
func ParseSafetensors(data []byte) ([]Entry, map[string]string, error) {
	if len(data) < 8 {
		return nil, nil, corruptWrap(io.ErrUnexpectedEOF, "safetensors file of %d bytes", len(data))
	}
	hlen := binary.LittleEndian.Uint64(data)
	if hlen > MaxSafetensorsHeader {
		// The length is the file's first 8 bytes: it is not echoed (a
		// file that is no safetensors file must not leak them).
		return nil, nil, corruptf("not a safetensors file: its header length is over %d bytes", MaxSafetensorsHeader)
	}
	if hlen > uint64(len(data)-8) {
		return nil, nil, corruptWrap(io.ErrUnexpectedEOF, "not a safetensors file: its header is longer than the file of %d bytes", len(data))
	}
	header := data[8 : 8+hlen]
	body := data[8+hlen:]
	// encoding/json would turn invalid bytes into U+FFFD (a name that is
	// not the file's); the reference implementation refuses them.
	if i := invalidUTF8(header); i < len(header) {
		return nil, nil, corruptf("safetensors header is not valid UTF-8 at byte %d of the file", 8+i)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(header, &raw); err != nil {
		return nil, nil, corruptWrap(jsonError(err), "safetensors header")
	}
	if raw == nil {
		return nil, nil, corruptf("safetensors header is not a JSON object")
	}
	var meta map[string]string
	entries := make([]Entry, 0, len(raw))
	begins := make(map[string]int, len(raw))
	for name, msg := range raw {
		if name == safetensorsMetadataKey {
			if err := json.Unmarshal(msg, &meta); err != nil {
				return nil, nil, corruptWrap(err, "safetensors metadata")
			}
			continue
		}
		var info safetensorsInfo
		if err := json.Unmarshal(msg, &info); err != nil {
			return nil, nil, corruptWrap(err, "safetensors tensor %q", name)
		}
		e, err := info.entry(name, body)
		if err != nil {
			return nil, nil, err
		}
		entries = append(entries, e)
		begins[name] = int(info.Offsets[0])
	}
	// The data must be tiled exactly: sort by offset and check that each
	// tensor starts where the previous one ended.
	slices.SortFunc(entries, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(begins[a.Name], begins[b.Name]), cmp.Compare(len(a.Data), len(b.Data)))
	})
	end := 0
	for _, e := range entries {
		if s := begins[e.Name]; s != end {
			return nil, nil, corruptf("safetensors tensor %q starts at byte %d, the previous one ends at %d", e.Name, s, end)
		}
		end += len(e.Data)
	}
	if end != len(body) {
		return nil, nil, corruptf("safetensors data section has %d bytes, tensors cover %d", len(body), end)
	}
	slices.SortFunc(entries, func(a, b Entry) int { return cmp.Compare(a.Name, b.Name) })
	return entries, meta, nil
}

func (info *safetensorsInfo) entry(name string, body []byte) (Entry, error) {
	dt, ok := parseDType(info.DType)
	if !ok {
		return Entry{}, corruptf("safetensors tensor %q has unsupported dtype %q", name, info.DType)
	}
	if info.Shape == nil {
		return Entry{}, corruptf("safetensors tensor %q has no shape", name)
	}
	if len(info.Offsets) != 2 {
		return Entry{}, corruptf("safetensors tensor %q has %d data offsets, want 2", name, len(info.Offsets))
	}
	// n is the element count; nz the product of the non-zero dimensions,
	// bounded too so that an empty tensor cannot carry absurd dimensions.
	n, nz := uint64(1), uint64(1)
	for _, d := range info.Shape {
		if d < 0 {
			return Entry{}, corruptf("safetensors tensor %q has a negative dimension in shape %v", name, info.Shape)
		}
		n = satMul(n, uint64(d))
		if d != 0 {
			nz = satMul(nz, uint64(d))
		}
	}
	if nz > 1<<48 {
		return Entry{}, corruptf("safetensors tensor %q has shape %v beyond 2^48 elements", name, info.Shape)
	}
	size := satMul(n, uint64(dt.Size()))
	begin, end := info.Offsets[0], info.Offsets[1]
	if begin > end || end > uint64(len(body)) {
		return Entry{}, corruptf("safetensors tensor %q has data offsets [%d, %d] outside the %d-byte data section", name, begin, end, len(body))
	}
	if size != end-begin {
		return Entry{}, corruptf("safetensors tensor %q: shape %v of %s needs %d bytes, offsets give %d", name, info.Shape, info.DType, size, end-begin)
	}
	shape := make([]int, len(info.Shape))
	for i, d := range info.Shape {
		shape[i] = int(d)
	}
	return Entry{Name: name, DType: dt, Shape: shape, Data: body[begin:end:end]}, nil
}

// invalidUTF8 returns the offset of the first invalid UTF-8 sequence in b,
// or len(b).
func invalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// satMul multiplies, saturating at MaxUint64.
func satMul(a, b uint64) uint64 {
	if a != 0 && b > math.MaxUint64/a {
		return math.MaxUint64
	}
	return a * b
}

// ReadSafetensors parses a safetensors file and converts every tensor to
// float32 (see Entry.Float32s). Tensors come sorted by name and do not
// alias data. Errors wrap ErrCorrupt.
func ReadSafetensors(data []byte) ([]Named, map[string]string, error) {
	entries, meta, err := ParseSafetensors(data)
	if err != nil {
		return nil, nil, err
	}
	ts := make([]Named, len(entries))
	for i, e := range entries {
		t, err := e.Tensor()
		if err != nil {
			return nil, nil, err
		}
		ts[i] = Named{Name: e.Name, T: t}
	}
	return ts, meta, nil
}

// LoadSafetensors reads a safetensors file from disk.
func LoadSafetensors(path string) ([]Named, map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	ts, meta, err := ReadSafetensors(data)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return ts, meta, nil
}

// WriteSafetensors writes float32 tensors and metadata in the safetensors
// format (see WriteSafetensorsEntries).
func WriteSafetensors(w io.Writer, ts []Named, meta map[string]string) error {
	es := make([]Entry, len(ts))
	for i, t := range ts {
		e, err := F32Entry(t.Name, t.T)
		if err != nil {
			return err
		}
		es[i] = e
	}
	return WriteSafetensorsEntries(w, es, meta)
}

// WriteSafetensorsEntries writes entries and metadata in the safetensors
// format as the reference implementation lays it out: tensors ordered by
// dtype (widest first, in the reference's dtype order) then by name, data
// contiguous in that order, "__metadata__" first in the header, the header
// padded with spaces to a multiple of 8 bytes.
func WriteSafetensorsEntries(w io.Writer, es []Entry, meta map[string]string) error {
	order := make([]Entry, len(es))
	copy(order, es)
	slices.SortFunc(order, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(safetensorsRank(b.DType), safetensorsRank(a.DType)), cmp.Compare(a.Name, b.Name))
	})
	var hdr bytes.Buffer
	hdr.WriteByte('{')
	if len(meta) > 0 {
		writeJSONString(&hdr, safetensorsMetadataKey)
		hdr.WriteString(":{")
		keys := make([]string, 0, len(meta))
		for k := range meta {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			if i > 0 {
				hdr.WriteByte(',')
			}
			writeJSONString(&hdr, k)
			hdr.WriteByte(':')
			writeJSONString(&hdr, meta[k])
		}
		hdr.WriteByte('}')
	}
	off := 0
	for i, e := range order {
		if e.Name == safetensorsMetadataKey || e.Name == "" {
			return fmt.Errorf("tensorio: invalid safetensors tensor name %q", e.Name)
		}
		if i > 0 && order[i-1].Name == e.Name {
			return fmt.Errorf("tensorio: duplicate tensor name %q", e.Name)
		}
		if safetensorsRank(e.DType) == 0 {
			return fmt.Errorf("tensorio: tensor %q has invalid dtype %v", e.Name, e.DType)
		}
		if n, ok := shapeSize(e.Shape); !ok || n*e.DType.Size() != len(e.Data) {
			return fmt.Errorf("tensorio: tensor %q: %d bytes for shape %v of %v", e.Name, len(e.Data), e.Shape, e.DType)
		}
		if i > 0 || len(meta) > 0 {
			hdr.WriteByte(',')
		}
		writeJSONString(&hdr, e.Name)
		fmt.Fprintf(&hdr, `:{"dtype":"%s","shape":[`, e.DType)
		for j, d := range e.Shape {
			if j > 0 {
				hdr.WriteByte(',')
			}
			fmt.Fprint(&hdr, d)
		}
		fmt.Fprintf(&hdr, `],"data_offsets":[%d,%d]}`, off, off+len(e.Data))
		off += len(e.Data)
	}
	hdr.WriteByte('}')
	for hdr.Len()%8 != 0 {
		hdr.WriteByte(' ')
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(hdr.Len()))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(hdr.Bytes()); err != nil {
		return err
	}
	for _, e := range order {
		if _, err := w.Write(e.Data); err != nil {
			return err
		}
	}
	return nil
}

// writeJSONString writes s as a JSON string, without the HTML escaping of
// encoding/json's default.
func writeJSONString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // strings always encode
	b.Truncate(b.Len() - 1)
}

// SaveSafetensors writes a safetensors file atomically: to a temporary
// file in the same directory, synced, then renamed over path, and the
// directory synced.
func SaveSafetensors(path string, ts []Named, meta map[string]string) error {
	return writeFileAtomic(path, func(w io.Writer) error { return WriteSafetensors(w, ts, meta) })
}

// SaveSafetensorsEntries is SaveSafetensors of entries of any dtype.
func SaveSafetensorsEntries(path string, es []Entry, meta map[string]string) error {
	return writeFileAtomic(path, func(w io.Writer) error { return WriteSafetensorsEntries(w, es, meta) })
}

// WeightsSHA256 returns the hex SHA-256 of the tensors' little-endian
// float32 bytes, concatenated in name order; names and shapes are not
// hashed. Two sets of weights have the same digest exactly when their
// tensors, matched by name order, hold the same bits.
func WeightsSHA256(ts []Named) string {
	names := make([]string, len(ts))
	tensors := make([]*nn.Tensor, len(ts))
	for i, t := range ts {
		names[i], tensors[i] = t.Name, t.T
	}
	return nn.TensorsSHA256(names, tensors)
}

// EntriesSHA256 is WeightsSHA256 of a file's float32 tensors: a weights
// file's other entries (BatchNorm's int64 num_batches_tracked) are counts,
// not weights.
func EntriesSHA256(es []Entry) (string, error) {
	var names []string
	var tensors []*nn.Tensor
	for _, e := range es {
		if e.DType != F32 {
			continue
		}
		t, err := e.Tensor()
		if err != nil {
			return "", err
		}
		names, tensors = append(names, e.Name), append(tensors, t)
	}
	return nn.TensorsSHA256(names, tensors), nil
}

// jsonError is err, an error of encoding/json decoding a file, without
// the file's bytes: a syntax error names the offending character, which is
// replaced by its offset.
func jsonError(err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("not valid JSON at byte %d of the header", se.Offset)
	}
	return err
}
