package data

import (
	"archive/zip"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ppnode/ppnode/tensorio"
)

// FileShape is what a data file holds, read from its headers alone: the
// inputs (without their values), the labels' per-sample shape and the
// samples of each split.
type FileShape struct {
	Inputs      []Array
	Labels      []int
	Train, Test int
}

// Describe reads the headers of a data file (see LoadFile) without its
// arrays, for a memory estimate that must not allocate what it checks; open
// opens it (nil: os.Open).
func Describe(path string, open Opener) (*FileShape, error) {
	var heads map[string]*array
	var err error
	switch strings.ToLower(filepath.Ext(path)) {
	case ".npz":
		heads, err = npzHeaders(path, open)
	case ".safetensors":
		heads, err = safetensorsHeaders(path, open)
	default:
		return nil, fmt.Errorf("data: %s: want a .npz or .safetensors file", path)
	}
	if err != nil {
		return nil, err
	}
	names := []string{"x"}
	if heads["x"] == nil && heads["x0"] != nil {
		names = nil
		for k := 0; heads["x"+strconv.Itoa(k)] != nil; k++ {
			names = append(names, "x"+strconv.Itoa(k))
		}
	}
	y := heads["y"]
	if y == nil || heads[names[0]] == nil || len(y.shape) < 1 {
		return nil, corrupt(path, "want arrays %q (samples) and %q (labels)", names[0], "y")
	}
	fs := &FileShape{Labels: append([]int{}, y.shape[1:]...), Train: y.shape[0]}
	for _, n := range names {
		a := heads[n]
		if len(a.shape) < 2 {
			return nil, corrupt(path, "%s has shape %v: want [N, sample shape...]", n, a.shape)
		}
		fs.Inputs = append(fs.Inputs, Array{Name: n, Shape: append([]int(nil), a.shape[1:]...), Int: a.isInt()})
	}
	if yt := heads["y_test"]; yt != nil && len(yt.shape) >= 1 {
		fs.Test = yt.shape[0]
	} else {
		fs.Test = int(float64(fs.Train) * HeldOut)
		fs.Train -= fs.Test
	}
	return fs, nil
}

// npzHeaders reads the .npy headers of an .npz archive.
func npzHeaders(path string, open Opener) (map[string]*array, error) {
	f, err := open.open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	zr, err := zip.NewReader(f, fi.Size())
	if err != nil {
		return nil, corrupt(path, "not an .npz archive: %v", err)
	}
	out := map[string]*array{}
	for _, zf := range zr.File {
		name, ok := strings.CutSuffix(zf.Name, ".npy")
		if !ok {
			continue
		}
		rc, err := zf.Open()
		if err != nil {
			return nil, corrupt(path, "%s: %v", zf.Name, err)
		}
		a, err := readNPYHeader(rc, int64(zf.UncompressedSize64), path+": "+zf.Name)
		rc.Close()
		if err != nil {
			return nil, err
		}
		out[name] = a
	}
	return out, nil
}

// safetensorsHeaders reads the tensors' dtypes and shapes from a
// safetensors file's header.
func safetensorsHeaders(path string, open Opener) (map[string]*array, error) {
	f, err := open.open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	var n [8]byte
	if _, err := io.ReadFull(f, n[:]); err != nil {
		return nil, corrupt(path, "safetensors header: %v", err)
	}
	hlen := binary.LittleEndian.Uint64(n[:])
	if hlen > tensorio.MaxSafetensorsHeader {
		return nil, corrupt(path, "not a safetensors file: its header length is over %d bytes", tensorio.MaxSafetensorsHeader)
	}
	h := make([]byte, hlen)
	if _, err := io.ReadFull(f, h); err != nil {
		return nil, corrupt(path, "safetensors header: %v", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(h, &raw); err != nil {
		return nil, corrupt(path, "safetensors header: %v", jsonError(err))
	}
	out := map[string]*array{}
	for name, msg := range raw {
		var info struct {
			DType string `json:"dtype"`
			Shape []int  `json:"shape"`
		}
		if name == "__metadata__" || json.Unmarshal(msg, &info) != nil {
			continue
		}
		dt, ok := map[string]string{"F32": "f4", "F64": "f8", "U8": "u1", "I32": "i4", "I64": "i8"}[info.DType]
		if !ok {
			continue
		}
		if _, err := elements(info.Shape); err != nil {
			return nil, corrupt(path, "%s: %v", name, err)
		}
		out[name] = &array{dtype: dt, shape: info.Shape}
	}
	return out, nil
}

// jsonError is err, an error of encoding/json decoding a file's header,
// without the file's bytes: a syntax error names the offending character,
// which is replaced by its offset.
func jsonError(err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("not valid JSON at byte %d of the header", se.Offset)
	}
	return err
}
