package tensorio

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/ppnode/ppnode/nn"
)

// nativeLE reports whether the machine stores integers little-endian, in
// which case float32 slices are viewed as bytes without copying.
var nativeLE = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// f32View returns the bytes of s on little-endian machines and nil
// elsewhere.
func f32View(s []float32) []byte {
	if !nativeLE || len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), 4*len(s))
}

// leBytes returns src as little-endian bytes: a view of src itself where
// the machine is little-endian, else a copy into *scratch (grown as needed).
func leBytes(src []float32, scratch *[]byte) []byte {
	if b := f32View(src); b != nil {
		return b
	}
	*scratch = resize(*scratch, 4*len(src))
	putF32s(*scratch, src)
	return *scratch
}

// putF32s stores src as little-endian bytes in dst[:4*len(src)].
func putF32s(dst []byte, src []float32) {
	if v := f32View(src); v != nil {
		copy(dst, v)
		return
	}
	dst = dst[:4*len(src)]
	for i, x := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(x))
	}
}

// getF32s loads dst from the little-endian bytes src[:4*len(dst)].
func getF32s(dst []float32, src []byte) {
	if v := f32View(dst); v != nil {
		copy(v, src[:4*len(dst)])
		return
	}
	src = src[:4*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// tensorData returns the contiguous float32 data of t, checking that the
// backing slice holds exactly the elements of its shape (views and
// transposed tensors are rejected).
func tensorData(t *nn.Tensor) ([]float32, error) {
	if t == nil {
		return nil, fmt.Errorf("tensorio: nil tensor")
	}
	if !contiguous(t) {
		return nil, fmt.Errorf("tensorio: tensor is a non-contiguous view; materialize it first")
	}
	d := nn.F32(t)
	if n, ok := shapeSize(t.Shape()); !ok || n != len(d) {
		return nil, fmt.Errorf("tensorio: tensor of shape %v has %d elements", t.Shape(), len(d))
	}
	return d, nil
}

// shapeSize is the product of the dimensions; ok is false when a dimension
// is negative or the product overflows an int.
func shapeSize(shape []int) (n int, ok bool) {
	n = 1
	for _, d := range shape {
		if d < 0 {
			return 0, false
		}
		if d != 0 && n > math.MaxInt/d {
			return 0, false
		}
		n *= d
	}
	return n, true
}

// grow returns b with room for n more bytes after len(b).
func grow(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b
	}
	nb := make([]byte, len(b), len(b)+n+len(b)/4)
	copy(nb, b)
	return nb
}

// resize returns b with length n, reusing its storage when it is large
// enough.
func resize(b []byte, n int) []byte {
	if cap(b) >= n {
		return b[:n]
	}
	return make([]byte, n, n+n/8)
}

// tensorFor returns dst when it has the given shape, or a tensor of that
// shape reusing dst's storage when the size matches, or a new tensor. The
// result may keep shape.
func tensorFor(dst *nn.Tensor, shape []int, n int) *nn.Tensor {
	if dst != nil && contiguous(dst) {
		if nn.SameShape(dst.Shape(), shape) && len(nn.F32(dst)) == n {
			return dst
		}
		if len(nn.F32(dst)) == n && len(shape) > 0 {
			if err := dst.Reshape(shape...); err == nil {
				return dst
			}
		}
	}
	if len(shape) == 0 {
		return nn.FromData(make([]float32, n), 1)
	}
	return nn.FromData(make([]float32, n), shape...)
}

// contiguous reports whether t's elements are its backing slice in order.
// (gorgonia reports empty tensors as masked, hence the first test.)
func contiguous(t *nn.Tensor) bool {
	return len(nn.F32(t)) == 0 || !t.RequiresIterator()
}
