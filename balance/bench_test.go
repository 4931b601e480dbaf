package balance

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// chainModel is a chain of n Linear layers with widths cycling through a
// few sizes, so that layers cost different amounts.
func chainModel(tb testing.TB, n int) *nn.Graph {
	b := nn.NewBuilder()
	x := b.Input("x", 8)
	in := 8
	widths := []int{8, 16, 12, 24, 8, 32}
	for i := 0; i < n; i++ {
		out := widths[i%len(widths)]
		x = b.Add(fmt.Sprintf("l%d", i), nn.NewLinear(in, out), x)
		in = out
	}
	g, err := b.Build(x)
	if err != nil {
		tb.Fatal(err)
	}
	return g
}

// unequalNodes returns n nodes with speeds spread over 0.25 to 2.
func unequalNodes(n int) *Cluster {
	c := &Cluster{DefaultLink: LinkProfile{Bandwidth: 1.25e9, Latency: 50e-6}}
	for i := 0; i < n; i++ {
		c.Nodes = append(c.Nodes, NodeProfile{Name: fmt.Sprintf("n%d", i), Speed: 0.25 + 1.75*float64((i*7)%n)/float64(n)})
	}
	return c
}

// rackCluster returns n nodes of speeds 0.25 to 2 in racks of 8: 10 Gbit/s
// and 20 µs within a rack, 1 Gbit/s and 200 µs between racks.
func rackCluster(n int) *Cluster {
	c := unequalNodes(n)
	c.DefaultLink = LinkProfile{Bandwidth: 125e6, Latency: 200e-6}
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			if i != j && i/8 == j/8 {
				c.Links = append(c.Links, LinkProfile{From: c.Nodes[i].Name, To: c.Nodes[j].Name, Bandwidth: 1.25e9, Latency: 20e-6})
			}
		}
	}
	return c
}

// The planner with replicated stages on 64 nodes of mixed speeds and links
// (every M from 1 to 32, both schedules).
func BenchmarkSearchReplicas(b *testing.B) {
	res, err := zoo.Build("resnet50", zoo.Options{Width: 0.25, Input: []int{32, 32, 3}})
	if err != nil {
		b.Fatal(err)
	}
	mlp, err := zoo.Build("mlp32", zoo.Options{Width: 512})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		g    *nn.Graph
	}{{"resnet50", res}, {"mlp32", mlp}} {
		prof := Analytic(c.g, AnalyticOptions{})
		cl := rackCluster(64)
		for _, workers := range []int{1, runtime.GOMAXPROCS(0)} {
			o := Options{Partitioner: Balanced, Batch: 64, Replicas: true, Workers: workers}
			b.Run(fmt.Sprintf("%s/nodes=64/workers=%d", c.name, workers), func(b *testing.B) {
				var r *Result
				for i := 0; i < b.N; i++ {
					var err error
					if r, err = Search(c.g, prof, cl, o); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(r.Plan.Stages)), "executors")
			})
		}
	}
}

func BenchmarkSearch(b *testing.B) {
	res, err := zoo.Build("resnet50", zoo.Options{Width: 0.25, Input: []int{32, 32, 3}})
	if err != nil {
		b.Fatal(err)
	}
	cases := []struct {
		name  string
		g     *nn.Graph
		nodes int
	}{
		{"resnet50/nodes=16", res, 16},
		{"chain1000/nodes=64", chainModel(b, 1000), 64},
	}
	for _, c := range cases {
		prof := Analytic(c.g, AnalyticOptions{})
		cl := unequalNodes(c.nodes)
		for _, sched := range []string{"1f1b", "auto"} {
			for _, workers := range []int{1, runtime.GOMAXPROCS(0)} {
				o := Options{Partitioner: Balanced, Batch: 64, Schedule: sched, Workers: workers}
				if sched != "auto" {
					o.MicroBatches = 8
				}
				b.Run(fmt.Sprintf("%s/schedule=%s/workers=%d", c.name, sched, workers), func(b *testing.B) {
					var r *Result
					for i := 0; i < b.N; i++ {
						var err error
						if r, err = Search(c.g, prof, cl, o); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(len(r.Plan.Stages)), "stages")
				})
			}
		}
	}
}
