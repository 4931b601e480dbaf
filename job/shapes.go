package job

import (
	"fmt"
	"math"

	"github.com/ppnode/ppnode/nn"
)

// shapes adds up a model's sizes layer by layer from the shapes nn would
// give them, without building a tensor: the memory estimate must not
// allocate what it is there to refuse. modelShapes follows nn/zoo's
// builders; TestModelShapes checks it against the graphs they build.
type shapes struct {
	// params counts the values of the parameters and buffers, trainable
	// those of the trainable parameters.
	params, trainable int64
	// Per sample: outs the layers' outputs, back their inputs' gradients
	// (and dropout masks), cols the im2col columns of convolutions.
	outs, back, cols int64
	err              error
}

// layer adds a layer of trainable and buffer values that reads in values
// per sample and writes out.
func (w *shapes) layer(trainable, buffers, in, out int64) {
	w.params += trainable + buffers
	w.trainable += trainable
	w.outs += out
	w.back += in
}

func (w *shapes) linear(in, out int) int {
	w.layer(int64(in)*int64(out)+int64(out), 0, int64(in), int64(out))
	return out
}

// conv is nn.Conv2D without bias on an [h, wd, c] input: it returns the
// output's height and width.
func (w *shapes) conv(h, wd, c, out, k, stride, pad int) (int, int) {
	ho, wo := (h+2*pad-k)/stride+1, (wd+2*pad-k)/stride+1
	if ho < 1 || wo < 1 {
		if w.err == nil {
			w.err = fmt.Errorf("a %dx%d input is smaller than the kernel %d", h, wd, k)
		}
		return 1, 1
	}
	w.layer(int64(k*k)*int64(c)*int64(out), 0, int64(h*wd)*int64(c), int64(ho*wo)*int64(out))
	if k != 1 || stride != 1 || pad != 0 {
		w.cols += int64(ho*wo) * int64(k*k) * int64(c)
	}
	return ho, wo
}

// batchNorm is nn.BatchNorm on size values of c channels.
func (w *shapes) batchNorm(size, c int) { w.layer(2*int64(c), 2*int64(c), int64(size), int64(size)) }

// same is a layer without parameters whose output has its input's size
// (ReLU, Flatten); add has two inputs, dropout keeps a mask.
func (w *shapes) same(size int)    { w.layer(0, 0, int64(size), int64(size)) }
func (w *shapes) add(size int)     { w.layer(0, 0, 2*int64(size), int64(size)) }
func (w *shapes) dropout(size int) { w.same(size); w.back += int64(size) }

// scaled is nn/zoo's channel count n at width factor f.
func scaled(n int, f float64) int { return max(1, int(math.Round(float64(n)*f))) }

// modelShapes walks the named zoo model (width 0: its default) for inputs
// of the given shape and classes.
func modelShapes(model string, width float64, input []int, classes int) (*shapes, error) {
	w := &shapes{}
	var err error
	switch model {
	case "mlp32":
		err = w.mlp32(width, input, classes)
	case "vgg16":
		err = w.vgg16(width, input, classes)
	case "resnet50":
		err = w.resnet50(width, input, classes)
	case "uno":
		err = w.uno(width, input, classes)
	default:
		return nil, fmt.Errorf("no memory estimate for model %q", model)
	}
	if err == nil {
		err = w.err
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", model, err)
	}
	return w, nil
}

// mlp32 is zoo.MLP32: 31 Linear+ReLU of width units, then the classes.
func (w *shapes) mlp32(width float64, input []int, classes int) error {
	if width == 0 {
		width = 512
	}
	units := int(width)
	if units < 1 {
		return fmt.Errorf("width %v is not a unit count", width)
	}
	in := int(size64(input))
	for range 31 {
		in = w.linear(in, units)
		w.same(units)
	}
	w.linear(in, classes)
	return nil
}

// vgg16 is zoo.VGG16: 13 convolutions with BatchNorm and ReLU in five
// blocks, each closed by 2x2 pooling while the image is 2x2 or more, then
// three Linear layers with ReLU and dropout between.
func (w *shapes) vgg16(width float64, input []int, classes int) error {
	if width == 0 {
		width = 1
	}
	if len(input) != 3 {
		return fmt.Errorf("takes an [H, W, C] input, got %v", input)
	}
	h, wd, c := input[0], input[1], input[2]
	for _, block := range [][]int{{64, 64}, {128, 128}, {256, 256, 256}, {512, 512, 512}, {512, 512, 512}} {
		for _, ch := range block {
			out := scaled(ch, width)
			h, wd = w.conv(h, wd, c, out, 3, 1, 1)
			w.batchNorm(h*wd*out, out)
			w.same(h * wd * out)
			c = out
		}
		if h >= 2 && wd >= 2 {
			w.layer(0, 0, int64(h*wd*c), int64((h/2)*(wd/2)*c))
			h, wd = h/2, wd/2
		}
	}
	hidden := scaled(4096, width)
	in := h * wd * c
	for range 2 {
		in = w.linear(in, hidden)
		w.same(hidden)
		w.dropout(hidden)
	}
	w.linear(in, classes)
	return nil
}

// resnet50 is zoo.ResNet50: a 3x3 stem, bottleneck blocks [3, 4, 6, 3]
// (stride on the 3x3 convolution, a projection on each stage's first
// block), global average pooling and a Linear layer.
func (w *shapes) resnet50(width float64, input []int, classes int) error {
	if width == 0 {
		width = 1
	}
	if len(input) != 3 {
		return fmt.Errorf("takes an [H, W, C] input, got %v", input)
	}
	h, wd := input[0], input[1]
	c := scaled(64, width)
	h, wd = w.conv(h, wd, input[2], c, 3, 1, 1)
	w.batchNorm(h*wd*c, c)
	w.same(h * wd * c)
	for li, blocks := range []int{3, 4, 6, 3} {
		planes := scaled(64<<li, width)
		for bi := range blocks {
			stride := 1
			if bi == 0 && li > 0 {
				stride = 2
			}
			h1, w1 := w.conv(h, wd, c, planes, 1, 1, 0)
			w.batchNorm(h1*w1*planes, planes)
			w.same(h1 * w1 * planes)
			h2, w2 := w.conv(h1, w1, planes, planes, 3, stride, 1)
			w.batchNorm(h2*w2*planes, planes)
			w.same(h2 * w2 * planes)
			h3, w3 := w.conv(h2, w2, planes, 4*planes, 1, 1, 0)
			out := h3 * w3 * 4 * planes
			w.batchNorm(out, 4*planes)
			if bi == 0 {
				hd, wdd := w.conv(h, wd, c, 4*planes, 1, stride, 0)
				w.batchNorm(hd*wdd*4*planes, 4*planes)
			}
			w.add(out)
			w.same(out)
			h, wd, c = h3, w3, 4*planes
		}
	}
	w.layer(0, 0, int64(h*wd*c), int64(c)) // global average pooling
	w.linear(c, classes)
	return nil
}

// uno is zoo.Uno: the flattened input cut into 3 feature slices, each
// into a tower of 3 Linear+ReLU, concatenated into a head of 3 Linear+ReLU
// and an output layer; widths 1000 units times the width factor.
func (w *shapes) uno(width float64, input []int, classes int) error {
	if width == 0 {
		width = 1
	}
	const towers = 3
	f := int(size64(input))
	if towers > f {
		return fmt.Errorf("needs 1 to %d towers, got %d", f, towers)
	}
	units := scaled(1000, width)
	if len(input) > 1 {
		w.same(f) // flatten
	}
	for t := range towers {
		lo, hi := t*f/towers, (t+1)*f/towers
		w.layer(0, 0, int64(f), int64(hi-lo)) // slice
		in := hi - lo
		for range 3 {
			in = w.linear(in, units)
			w.same(units)
		}
	}
	w.same(towers * units) // concat
	in := towers * units
	for range 3 {
		in = w.linear(in, units)
		w.same(units)
	}
	w.linear(in, classes)
	return nil
}

// graph adds up a built graph's activations per sample: every layer's
// output, its inputs' gradients where it needs them, and a convolution's
// im2col columns.
func (w *shapes) graph(g *nn.Graph) {
	for _, n := range g.Nodes {
		w.outs += size64(n.Shape)
		if !n.RequiresGrad {
			continue
		}
		for _, in := range n.Inputs {
			if g.IsInput(in) {
				continue
			}
			w.back += size64(g.Node(in).Shape)
		}
		if c, ok := n.Layer.(*nn.Conv2D); ok && !(c.KH == 1 && c.KW == 1 && c.SH == 1 && c.SW == 1) {
			w.cols += int64(n.Shape[0]*n.Shape[1]) * int64(c.KH*c.KW*c.In)
		}
	}
}

// size64 is the number of values of a shape.
func size64(shape []int) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= int64(d)
	}
	return n
}
