package balance

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

// NodeProfile describes one machine to the planner.
type NodeProfile struct {
	Name string `json:"name"`
	// Speed is the node's compute speed relative to the reference node of
	// the model profile (2 = twice as fast). If zero, it is GFLOPS divided
	// by the model profile's GFLOPS.
	Speed float64 `json:"speed,omitempty"`
	// GFLOPS is the node's measured sustained GEMM speed (see
	// MeasureGEMMSpeeds).
	GFLOPS float64 `json:"gflops,omitempty"`
	// Memory is the memory available for training, in bytes (0: no limit).
	Memory int64 `json:"memory_bytes,omitempty"`
}

// LinkProfile is the link from one node to another: a transfer of n bytes
// occupies it for n/Bandwidth seconds and arrives Latency seconds later.
// Act, Grad and Input, if set, price the codecs of the activations,
// gradients and inputs sent over it.
type LinkProfile struct {
	From      string    `json:"from,omitempty"`
	To        string    `json:"to,omitempty"`
	Bandwidth float64   `json:"bytes_per_s"`
	Latency   float64   `json:"latency_s"`
	Act       *WireCost `json:"act,omitempty"`
	Grad      *WireCost `json:"grad,omitempty"`
	Input     *WireCost `json:"input,omitempty"`
}

// flow is what a transfer carries.
type flow int

const (
	flowAct flow = iota
	flowGrad
	flowInput
)

func (l LinkProfile) cost(f flow) *WireCost {
	switch f {
	case flowGrad:
		return l.Grad
	case flowInput:
		return l.Input
	}
	return l.Act
}

// WireCost is what a codec makes of a transfer of n raw bytes: n·Ratio
// bytes on the link, and n·Seconds of encoding and decoding.
type WireCost struct {
	Ratio   float64 `json:"ratio"`
	Seconds float64 `json:"s_per_byte"`
}

func (w *WireCost) valid() bool {
	return w == nil || w.Ratio > 0 && w.Ratio <= 2 && w.Seconds >= 0 && w.Seconds < 1
}

// occupies is how long n raw bytes of f occupy the link.
func (l LinkProfile) occupies(n float64, f flow) float64 {
	w := l.cost(f)
	if w == nil {
		return n / l.Bandwidth
	}
	return n*w.Seconds + n*w.Ratio/l.Bandwidth
}

// wire is the bytes n raw bytes of f take on the link.
func (l LinkProfile) wire(n float64, f flow) float64 {
	if w := l.cost(f); w != nil {
		return n * w.Ratio
	}
	return n
}

// Cluster is the machines a plan may use and the links between them.
type Cluster struct {
	Nodes []NodeProfile `json:"nodes"`
	// Links are directed; a pair given in one direction only is taken to be
	// symmetric, and pairs not given use DefaultLink.
	Links       []LinkProfile `json:"links,omitempty"`
	DefaultLink LinkProfile   `json:"default_link"`
	// Feeder, if set, is the node that sends the stages that read the
	// model's input their micro-batches (the job's coordinator); its
	// links count like the others. Empty, or not one of Nodes: inputs
	// cost nothing.
	Feeder string `json:"feeder,omitempty"`
}

// DefaultLink is 1 Gbit/s with 100 µs latency.
var DefaultLink = LinkProfile{Bandwidth: 125e6, Latency: 100e-6}

// network is a cluster resolved against a model profile: speeds filled in
// and links indexed.
type network struct {
	nodes []NodeProfile
	index map[string]int
	links map[[2]int]LinkProfile
	def   LinkProfile
	// feeder is the index of Cluster.Feeder, or -1.
	feeder int
}

// NameSpecials are the characters a node name may not hold: plans and
// partition descriptions ("fc1-fc16@a; fc17-fc32@b") use them.
const NameSpecials = " ,;@=:+"

func (c *Cluster) resolve(p *ModelProfile) (*network, error) {
	if len(c.Nodes) == 0 {
		return nil, fmt.Errorf("%w: no nodes", ErrCluster)
	}
	n := &network{index: map[string]int{}, links: map[[2]int]LinkProfile{}, def: c.DefaultLink, feeder: -1}
	if n.def.Bandwidth == 0 {
		n.def = DefaultLink
	}
	if !(n.def.Bandwidth > 0) || !(n.def.Latency >= 0) || math.IsInf(n.def.Bandwidth, 0) || !n.def.Act.valid() || !n.def.Grad.valid() {
		return nil, fmt.Errorf("%w: default link %+v", ErrCluster, c.DefaultLink)
	}
	for _, nd := range c.Nodes {
		if nd.Name == "" || strings.ContainsAny(nd.Name, NameSpecials) {
			return nil, fmt.Errorf("%w: bad node name %q", ErrCluster, nd.Name)
		}
		if _, dup := n.index[nd.Name]; dup {
			return nil, fmt.Errorf("%w: node %q given twice", ErrCluster, nd.Name)
		}
		if nd.Speed == 0 && nd.GFLOPS > 0 {
			if p == nil || p.GFLOPS <= 0 {
				return nil, fmt.Errorf("%w: node %q has GFLOPS but the model profile has no reference GFLOPS", ErrCluster, nd.Name)
			}
			nd.Speed = nd.GFLOPS / p.GFLOPS
		}
		if !(nd.Speed > 0) || math.IsInf(nd.Speed, 0) {
			return nil, fmt.Errorf("%w: node %q has speed %v", ErrCluster, nd.Name, nd.Speed)
		}
		if nd.Memory < 0 {
			return nil, fmt.Errorf("%w: node %q has memory %d", ErrCluster, nd.Name, nd.Memory)
		}
		n.index[nd.Name] = len(n.nodes)
		n.nodes = append(n.nodes, nd)
	}
	if i, ok := n.index[c.Feeder]; ok {
		n.feeder = i
	}
	for _, l := range c.Links {
		i, ok1 := n.index[l.From]
		j, ok2 := n.index[l.To]
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%w: link %s->%s names an unknown node", ErrCluster, l.From, l.To)
		}
		if !(l.Bandwidth > 0) || !(l.Latency >= 0) || math.IsInf(l.Bandwidth, 0) {
			return nil, fmt.Errorf("%w: link %s->%s has bandwidth %v, latency %v", ErrCluster, l.From, l.To, l.Bandwidth, l.Latency)
		}
		if !l.Act.valid() || !l.Grad.valid() || !l.Input.valid() {
			return nil, fmt.Errorf("%w: link %s->%s has wire costs %+v, %+v", ErrCluster, l.From, l.To, l.Act, l.Grad)
		}
		n.links[[2]int{i, j}] = l
	}
	for k, l := range n.links {
		if _, ok := n.links[[2]int{k[1], k[0]}]; !ok {
			n.links[[2]int{k[1], k[0]}] = l
		}
	}
	return n, nil
}

func (n *network) link(from, to int) LinkProfile {
	if l, ok := n.links[[2]int{from, to}]; ok {
		return l
	}
	return n.def
}

// transfer is the time to move bytes of f from node i to node j (0 for
// none).
func (n *network) transfer(from, to int, bytes float64, f flow) float64 {
	if bytes <= 0 || from == to {
		return 0
	}
	l := n.link(from, to)
	return l.occupies(bytes, f) + l.Latency
}

// ParseNodes reads "a=1.0,b=0.5:4GiB,c=0.25": node names with speeds
// relative to the reference node and optional memory limits.
func ParseNodes(s string) ([]NodeProfile, error) {
	var out []NodeProfile
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name, rest, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("%w: node %q: want name=speed[:memory]", ErrCluster, f)
		}
		sp, mem, hasMem := strings.Cut(rest, ":")
		v, err := strconv.ParseFloat(sp, 64)
		if err != nil || !(v > 0) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("%w: node %q: speed %q is not a positive number", ErrCluster, name, sp)
		}
		nd := NodeProfile{Name: strings.TrimSpace(name), Speed: v}
		if hasMem {
			b, err := ParseBytes(mem)
			if err != nil {
				return nil, fmt.Errorf("%w: node %q: %v", ErrCluster, name, err)
			}
			nd.Memory = b
		}
		out = append(out, nd)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no nodes in %q", ErrCluster, s)
	}
	return out, nil
}

// splitNumber cuts "12.5GiB" into 12.5 and "GiB".
func splitNumber(s string) (float64, string, error) {
	s = strings.TrimSpace(s)
	i := strings.IndexFunc(s, func(r rune) bool { return !(unicode.IsDigit(r) || r == '.' || r == 'e' || r == '+' || r == '-') })
	if i < 0 {
		i = len(s)
	}
	// "e" may start a unit ("1e9" is a number, "exa" is not used).
	v, err := strconv.ParseFloat(s[:i], 64)
	if err != nil || v < 0 || math.IsInf(v, 0) {
		return 0, "", fmt.Errorf("%q is not a size", s)
	}
	return v, strings.TrimSpace(s[i:]), nil
}

var byteUnits = map[string]float64{
	"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}

// ParseBytes reads a size such as "512MiB", "4GB" or "1000".
func ParseBytes(s string) (int64, error) {
	v, unit, err := splitNumber(s)
	if err != nil {
		return 0, err
	}
	m, ok := byteUnits[strings.ToLower(unit)]
	if !ok {
		return 0, fmt.Errorf("unknown size unit %q in %q (want B, kB, MB, GB, KiB, MiB, GiB)", unit, s)
	}
	return int64(v * m), nil
}

// ParseBandwidth reads a link speed in bits ("1Gbit", "100Mbit", "10Gbps")
// or bytes per second ("125MB/s", "1GiB/s") and returns bytes per second.
func ParseBandwidth(s string) (float64, error) {
	v, unit, err := splitNumber(s)
	if err != nil {
		return 0, err
	}
	u := strings.ToLower(unit)
	bits := map[string]float64{"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
		"bps": 1, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "tbps": 1e12}
	if m, ok := bits[u]; ok && v > 0 {
		return v * m / 8, nil
	}
	if strings.HasSuffix(u, "/s") {
		if m, ok := byteUnits[strings.TrimSuffix(u, "/s")]; ok && v > 0 {
			return v * m, nil
		}
	}
	return 0, fmt.Errorf("link speed %q: want a positive number with Gbit, Mbit, GB/s, MiB/s ...", s)
}

// sortedNodes returns node indices fastest first (then more memory, then
// given order): the planner's canonical order, whose first nodes are used
// first and which runs from the pipeline's last stage backwards.
func (n *network) sortedNodes() []int {
	idx := make([]int, len(n.nodes))
	for i := range idx {
		idx[i] = i
	}
	mem := func(i int) float64 {
		if n.nodes[i].Memory == 0 {
			return math.Inf(1)
		}
		return float64(n.nodes[i].Memory)
	}
	sort.SliceStable(idx, func(a, b int) bool {
		x, y := idx[a], idx[b]
		if n.nodes[x].Speed != n.nodes[y].Speed {
			return n.nodes[x].Speed > n.nodes[y].Speed
		}
		return mem(x) > mem(y)
	})
	return idx
}

func (n *network) memLimit(i int) float64 {
	if n.nodes[i].Memory == 0 {
		return math.Inf(1)
	}
	return float64(n.nodes[i].Memory)
}
