// Package zoo builds ppnode's models as graphs of named layers: mlp32 (the
// seed paper's 32 fully connected layers), vgg16, resnet50 and uno (CANDLE-Uno
// shaped: input towers on feature slices joined into an MLP head, the
// multi-branch model of GraphPipe's evaluation). Each takes a width and an
// input shape so that it trains on a CPU.
package zoo

import (
	"fmt"
	"math"
	"sort"

	"github.com/ppnode/ppnode/nn"
)

// Options size a model. Zero fields take the model's defaults.
type Options struct {
	// Width is mlp32's hidden units (default 512) and the other models'
	// channel or unit factor (default 1).
	Width float64
	// Input is the per-sample input shape, NHWC for images (default
	// [28, 28, 1], MNIST).
	Input []int
	// Classes is the number of outputs (default 10).
	Classes int
	// Towers is uno's number of input towers (default 3).
	Towers int
}

func (o Options) withDefaults(width float64) Options {
	if o.Width == 0 {
		o.Width = width
	}
	if len(o.Input) == 0 {
		o.Input = []int{28, 28, 1}
	}
	if o.Classes == 0 {
		o.Classes = 10
	}
	if o.Towers == 0 {
		o.Towers = 3
	}
	return o
}

var builders = map[string]func(Options) (*nn.Graph, error){
	"mlp32":    MLP32,
	"vgg16":    VGG16,
	"resnet50": ResNet50,
	"uno":      Uno,
}

// Names lists the models.
func Names() []string {
	var n []string
	for k := range builders {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Build returns the named model, or an error naming the known ones.
func Build(name string, o Options) (*nn.Graph, error) {
	b, ok := builders[name]
	if !ok {
		return nil, fmt.Errorf("zoo: unknown model %q (have %v)", name, Names())
	}
	if o.Width < 0 || math.IsNaN(o.Width) || o.Classes < 0 {
		return nil, fmt.Errorf("zoo: bad options width=%v classes=%d", o.Width, o.Classes)
	}
	for _, d := range o.Input {
		if d < 1 {
			return nil, fmt.Errorf("zoo: bad input shape %v", o.Input)
		}
	}
	return b(o)
}

func scaled(n int, w float64) int { return max(1, int(math.Round(float64(n)*w))) }

// MLP32 is the seed paper's network: 784 -> width, 30 x (width -> width),
// width -> classes, ReLU after all but the last. Its Linear layers are fc1 to
// fc32 and the ReLU after fcN is reluN.
func MLP32(o Options) (*nn.Graph, error) {
	o = o.withDefaults(512)
	width := int(o.Width)
	if width < 1 {
		return nil, fmt.Errorf("zoo: mlp32 width %v is not a unit count", o.Width)
	}
	b := nn.NewBuilder()
	x := b.Input("x", o.Input...)
	in := nn.Size(o.Input)
	for i := 1; i <= 32; i++ {
		out := width
		if i == 32 {
			l := nn.NewLinear(in, o.Classes)
			l.He = false
			x = b.Add("fc32", l, x)
			break
		}
		x = b.Add(fmt.Sprintf("fc%d", i), nn.NewLinear(in, out), x)
		x = b.Add(fmt.Sprintf("relu%d", i), nn.ReLU{}, x)
		in = out
	}
	return b.Build(x)
}

// VGG16 is VGG-16 with batch normalisation: 13 3x3 convolutions in five
// blocks, each block closed by 2x2 max pooling (skipped once the image is a
// single pixel), then three fully connected layers with dropout 0.5. Layers:
// conv1..conv13 with bn1..bn13 and relu1..relu13, pool1..pool5, fc1..fc3.
func VGG16(o Options) (*nn.Graph, error) {
	o = o.withDefaults(1)
	if len(o.Input) != 3 {
		return nil, fmt.Errorf("zoo: vgg16 takes an [H, W, C] input, got %v", o.Input)
	}
	cfg := [][]int{{64, 64}, {128, 128}, {256, 256, 256}, {512, 512, 512}, {512, 512, 512}}
	b := nn.NewBuilder()
	x := b.Input("x", o.Input...)
	h, w, c := o.Input[0], o.Input[1], o.Input[2]
	k := 0
	for blk, convs := range cfg {
		for _, ch := range convs {
			k++
			out := scaled(ch, o.Width)
			x = b.Add(fmt.Sprintf("conv%d", k), nn.NewConv2D(c, out, 3, 1, 1), x)
			x = b.Add(fmt.Sprintf("bn%d", k), nn.NewBatchNorm(), x)
			x = b.Add(fmt.Sprintf("relu%d", k), nn.ReLU{}, x)
			c = out
		}
		if h >= 2 && w >= 2 {
			x = b.Add(fmt.Sprintf("pool%d", blk+1), &nn.MaxPool2D{K: 2, Stride: 2}, x)
			h, w = h/2, w/2
		}
	}
	hidden := scaled(4096, o.Width)
	x = b.Add("fc1", nn.NewLinear(h*w*c, hidden), x)
	x = b.Add("fc1.relu", nn.ReLU{}, x)
	x = b.Add("fc1.dropout", nn.NewDropout(0.5), x)
	x = b.Add("fc2", nn.NewLinear(hidden, hidden), x)
	x = b.Add("fc2.relu", nn.ReLU{}, x)
	x = b.Add("fc2.dropout", nn.NewDropout(0.5), x)
	last := nn.NewLinear(hidden, o.Classes)
	last.He = false
	x = b.Add("fc3", last, x)
	return b.Build(x)
}

// ResNet50 is ResNet-50 (bottleneck blocks [3, 4, 6, 3], stride on the 3x3
// convolution as in torchvision) with the small-image stem used for CIFAR: one
// 3x3 convolution, no max pooling. Names follow torchvision:
// layer3.1.conv2, layer2.0.downsample.0 (conv) and .1 (BatchNorm).
func ResNet50(o Options) (*nn.Graph, error) {
	o = o.withDefaults(1)
	if len(o.Input) != 3 {
		return nil, fmt.Errorf("zoo: resnet50 takes an [H, W, C] input, got %v", o.Input)
	}
	b := nn.NewBuilder()
	x := b.Input("x", o.Input...)
	c := scaled(64, o.Width)
	x = b.Add("conv1", nn.NewConv2D(o.Input[2], c, 3, 1, 1), x)
	x = b.Add("bn1", nn.NewBatchNorm(), x)
	x = b.Add("relu", nn.ReLU{}, x)
	for li, blocks := range []int{3, 4, 6, 3} {
		planes := scaled(64<<li, o.Width)
		for bi := 0; bi < blocks; bi++ {
			stride := 1
			if bi == 0 && li > 0 {
				stride = 2
			}
			p := fmt.Sprintf("layer%d.%d.", li+1, bi)
			in := x
			y := b.Add(p+"conv1", nn.NewConv2D(c, planes, 1, 1, 0), in)
			y = b.Add(p+"bn1", nn.NewBatchNorm(), y)
			y = b.Add(p+"relu1", nn.ReLU{}, y)
			y = b.Add(p+"conv2", nn.NewConv2D(planes, planes, 3, stride, 1), y)
			y = b.Add(p+"bn2", nn.NewBatchNorm(), y)
			y = b.Add(p+"relu2", nn.ReLU{}, y)
			y = b.Add(p+"conv3", nn.NewConv2D(planes, 4*planes, 1, 1, 0), y)
			y = b.Add(p+"bn3", nn.NewBatchNorm(), y)
			if bi == 0 {
				in = b.Add(p+"downsample.0", nn.NewConv2D(c, 4*planes, 1, stride, 0), in)
				in = b.Add(p+"downsample.1", nn.NewBatchNorm(), in)
			}
			y = b.Add(p+"add", nn.Add{}, y, in)
			x = b.Add(p+"relu3", nn.ReLU{}, y)
			c = 4 * planes
		}
	}
	x = b.Add("avgpool", &nn.GlobalAvgPool{}, x)
	fc := nn.NewLinear(c, o.Classes)
	fc.He = false
	x = b.Add("fc", fc, x)
	return b.Build(x)
}

// Uno has the shape of CANDLE-Uno: the flattened input is cut into Towers
// feature slices, each feeding its own 3-layer MLP tower (towerT.fc1..fc3);
// the towers are concatenated into a 3-layer MLP head and an output layer.
// Widths are 1000 units times Width, as in Uno's defaults.
func Uno(o Options) (*nn.Graph, error) {
	o = o.withDefaults(1)
	f := nn.Size(o.Input)
	if o.Towers < 1 || o.Towers > f {
		return nil, fmt.Errorf("zoo: uno needs 1 to %d towers, got %d", f, o.Towers)
	}
	width := scaled(1000, o.Width)
	b := nn.NewBuilder()
	x := b.Input("x", o.Input...)
	if len(o.Input) > 1 {
		x = b.Add("flatten", nn.Flatten{}, x)
	}
	var towers []string
	for t := 0; t < o.Towers; t++ {
		lo, hi := t*f/o.Towers, (t+1)*f/o.Towers
		p := fmt.Sprintf("tower%d.", t+1)
		y := b.Add(p+"slice", &nn.Slice{From: lo, To: hi}, x)
		in := hi - lo
		for i := 1; i <= 3; i++ {
			y = b.Add(fmt.Sprintf("%sfc%d", p, i), nn.NewLinear(in, width), y)
			y = b.Add(fmt.Sprintf("%srelu%d", p, i), nn.ReLU{}, y)
			in = width
		}
		towers = append(towers, y)
	}
	x = b.Add("concat", &nn.Concat{}, towers...)
	in := width * o.Towers
	for i := 1; i <= 3; i++ {
		x = b.Add(fmt.Sprintf("head.fc%d", i), nn.NewLinear(in, width), x)
		x = b.Add(fmt.Sprintf("head.relu%d", i), nn.ReLU{}, x)
		in = width
	}
	out := nn.NewLinear(in, o.Classes)
	out.He = false
	x = b.Add("out", out, x)
	return b.Build(x)
}
