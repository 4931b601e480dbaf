package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/cgroup"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
	"github.com/ppnode/ppnode/onnx"
)

// planResult is the final JSON line of ppnode plan.
type planResult struct {
	Model          string          `json:"model"`
	Partitioner    string          `json:"partitioner"`
	Spec           string          `json:"spec"`
	Stages         []planStageJSON `json:"stages"`
	Schedule       string          `json:"schedule"`
	Chunks         int             `json:"chunks,omitempty"`
	MicroBatches   int             `json:"micro_batches"`
	MicroBatchSize int             `json:"micro_batch_size"`
	StepTime       float64         `json:"step_time_s"`
	Bubble         float64         `json:"bubble_fraction"`
	Throughput     float64         `json:"throughput_samples_per_s"`
	SearchTime     float64         `json:"search_time_s"`
	Simulated      int             `json:"plans_simulated"`
	PlanHash       string          `json:"plan_hash"`
	Profile        string          `json:"profile"`
}

// planStageJSON is one stage, or one replica of a stage (Group, Replica
// and its micro-batches set only in a plan with replicas).
type planStageJSON struct {
	ID           int      `json:"id"`
	Group        *int     `json:"group,omitempty"`
	Replica      int      `json:"replica,omitempty"`
	MicroBatches []int    `json:"micro_batches,omitempty"`
	Node         string   `json:"node"`
	Layers       []string `json:"layers"`
	Busy         float64  `json:"busy_fraction"`
	PeakMemory   float64  `json:"peak_memory_bytes"`
	Recompute    bool     `json:"recompute,omitempty"`
}

func runPlan(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("plan", "[--model M] [--nodes a=1,b=0.5] [flags]")
	model := fs.String("model", "mlp32", "model: "+strings.Join(zoo.Names(), ", ")+", or an ONNX file")
	width := fs.Float64("width", 0, "mlp32: hidden units (default 512); other models: width factor (default 1)")
	input := fs.String("input", "", "per-sample input shape HxWxC (default 28x28x1)")
	classes := fs.Int("classes", 0, "classes (default 10)")
	dataFlag := fs.String("data", "", "an ONNX model's data file (.npz or .safetensors): its inputs, read from the file's headers, instead of --input")
	towers := fs.Int("towers", 0, "uno: input towers (default 3)")
	nodesFlag := fs.String("nodes", "a=1", `nodes "name=speed[:memory],..." (speed relative to this machine), or a cluster JSON file`)
	link := fs.String("link", "1Gbit", "link speed between nodes (Gbit, Mbit, GB/s ...)")
	latency := fs.Duration("latency", 100*time.Microsecond, "link latency")
	batch := fs.Int("batch", 64, "mini-batch size in samples")
	micro := fs.String("micro-batches", "auto", "micro-batches per mini-batch: auto or N (must divide --batch)")
	maxMicro := fs.Int("max-micro-batches", 32, "largest micro-batch count tried by auto")
	sched := fs.String("schedule", "auto", "schedule: auto (the fastest by simulation of gpipe, 1f1b or graph, and zb where it is 5% faster), gpipe, 1f1b, graph, zb (zero-bubble: backward passes split into input and weight gradients) or interleaved (1F1B with --chunks stages per node, Megatron-LM; never chosen by auto)")
	chunks := fs.Int("chunks", 0, "interleaved: stages (chunks) per node, 2 or more (default: 2, 3 or 4, whichever simulates fastest)")
	recompute := fs.String("recompute", "none", "recompute activations at the backward pass instead of keeping them: none, auto (the stages whose node's memory requires it) or all")
	partition := fs.String("partition", "balanced", `partitioner (balanced, uniform, params, graph) or a partition such as "fc1-fc8@a; fc9-fc32@b"`)
	profile := fs.String("profile", "measure", "layer profile: measure (on this machine), analytic (from FLOP counts) or a profile JSON file")
	saveProfile := fs.String("save-profile", "", "write the layer profile to this JSON file")
	threads := fs.Int("threads", 0, "threads for measuring (default: all CPUs)")
	backend := fs.String("backend", "", "GEMM backend for measuring (default: the fastest compiled in)")
	optimizer := fs.String("optimizer", "sgd", "optimizer whose state counts in memory: sgd, adam, adamw or none")
	jsonOut := fs.Bool("json", false, "print one JSON object as the last line")
	svg := fs.String("svg", "", "write a Gantt chart of the simulated step to this SVG file")
	trace := fs.String("trace", "", "write the simulated step as a Chrome trace to this JSON file")
	out := fs.String("out", "", "write the full plan (stages and programs) to this JSON file")
	compare := fs.Bool("compare", false, "plan with every partitioner on the same profile and compare them")
	replicas := fs.Bool("replicas", false, "let a stage run on several nodes (replicas), each on a share of the micro-batches, as a job's plans may")
	freeze := fs.String("freeze", "", "plan a fine-tuning: comma-separated prefixes of the parameters that do not train, as train's --freeze")
	deterministic := fs.Bool("deterministic", false, "replicas sum their gradients in the order of one process, as a --deterministic job must (their backward passes then run one after the other)")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if err := balance.CheckSchedule(*sched); err != nil {
		return usageError{err}
	}
	if err := balance.CheckRecompute(*recompute); err != nil {
		return usageError{err}
	}
	opts := balance.Options{Partitioner: *partition, Schedule: *sched, Batch: *batch, MaxMicroBatches: *maxMicro, Optimizer: *optimizer, Model: *model,
		Replicas: *replicas, ChainedSums: *deterministic, Recompute: *recompute, Chunks: *chunks}
	if *micro != "auto" {
		m, err := strconv.Atoi(*micro)
		if err != nil || m < 1 {
			return usagef("--micro-batches must be auto or a positive number, got %q", *micro)
		}
		opts.MicroBatches = m
	}
	if *batch < 1 {
		return usagef("--batch must be positive")
	}
	zo := zoo.Options{Width: *width, Classes: *classes, Towers: *towers}
	if *input != "" {
		for _, f := range strings.Split(*input, "x") {
			d, err := strconv.Atoi(f)
			if err != nil || d < 1 {
				return usagef("--input %q: want HxWxC", *input)
			}
			zo.Input = append(zo.Input, d)
		}
	}
	if len(zo.Input) == 0 {
		zo.Input = []int{28, 28, 1}
	}
	if zo.Classes == 0 {
		zo.Classes = 10
	}
	spec := job.Spec{Model: *model, Width: *width}
	var g *nn.Graph
	var err error
	if job.IsModelFile(*model) {
		d := job.Sample{Inputs: []onnx.Input{{Name: "x", Shape: zo.Input}}, Classes: zo.Classes}
		if *dataFlag != "" {
			spec.Data = *dataFlag
			if d, err = spec.DataSample(); err != nil {
				return usageError{err}
			}
		}
		g, err = spec.BuildModel(d)
	} else {
		g, err = zoo.Build(*model, zo)
	}
	if err == nil && *freeze != "" {
		err = g.Freeze(strings.Split(*freeze, ","))
	}
	if err != nil {
		return usageError{err}
	}
	cluster, err := loadCluster(*nodesFlag, *link, *latency)
	if err != nil {
		return usageError{err}
	}
	prof, err := loadProfile(g, *profile, opts, *threads, *backend, stderr)
	if err != nil {
		return err
	}
	prof.Model = *model
	if *saveProfile != "" {
		b, _ := json.MarshalIndent(prof, "", " ")
		if err := os.WriteFile(*saveProfile, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if *compare {
		return comparePartitioners(g, prof, cluster, opts, *jsonOut, stdout)
	}
	res, took, err := search(g, prof, cluster, opts)
	if err != nil {
		if errors.Is(err, balance.ErrSyntax) || errors.Is(err, balance.ErrUnknownLayer) || errors.Is(err, balance.ErrMissingLayer) ||
			errors.Is(err, balance.ErrDuplicateLayer) || errors.Is(err, balance.ErrUnknownNode) || errors.Is(err, balance.ErrEmptyStage) ||
			errors.Is(err, balance.ErrCycle) || errors.Is(err, balance.ErrNodeReused) {
			return usageError{err}
		}
		return err
	}
	if *out != "" {
		b, _ := json.MarshalIndent(res.Plan, "", " ")
		if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if *svg != "" {
		if err := writeFileWith(*svg, func(w io.Writer) error { return balance.WriteSVG(w, res.Plan, res.Report) }); err != nil {
			return err
		}
	}
	if *trace != "" {
		if err := writeFileWith(*trace, func(w io.Writer) error { return balance.WriteTrace(w, res.Plan, res.Report) }); err != nil {
			return err
		}
	}
	pr := summary(res, took, prof)
	printPlan(stdout, res, took, cluster, prof)
	printTied(stdout, res.Plan.TiedAcross(g))
	if *jsonOut {
		b, _ := json.Marshal(pr)
		fmt.Fprintln(stdout, string(b))
	}
	return nil
}

// search plans on every CPU (the planner's result does not depend on how
// many) and times the search.
func search(g *nn.Graph, prof *balance.ModelProfile, c *balance.Cluster, o balance.Options) (*balance.Result, time.Duration, error) {
	o.Workers = runtime.GOMAXPROCS(0)
	start := time.Now()
	res, err := balance.Search(g, prof, c, o)
	return res, time.Since(start), err
}

func summary(res *balance.Result, took time.Duration, prof *balance.ModelProfile) planResult {
	p, r := res.Plan, res.Report
	pr := planResult{Model: p.Model, Partitioner: p.Partitioner, Spec: res.Spec, Schedule: p.Schedule.String(), Chunks: p.Chunks,
		MicroBatches: p.MicroBatches, MicroBatchSize: p.MicroBatchSize, StepTime: r.StepTime, Bubble: r.BubbleFraction,
		Throughput: r.Throughput, SearchTime: took.Seconds(), Simulated: res.Simulated, PlanHash: p.Hash(), Profile: prof.Source}
	for i, s := range p.Stages {
		st := planStageJSON{ID: s.ID, Node: s.Node, Layers: s.Layers, Busy: r.Stages[i].BusyFraction, PeakMemory: r.Stages[i].PeakMemory, Recompute: s.Recompute}
		if p.Replicated() {
			st.Group, st.Replica, st.MicroBatches = &p.Stages[i].Group, s.Replica, s.Micros()
		}
		pr.Stages = append(pr.Stages, st)
	}
	return pr
}

// printTied names the tied tensors whose copies lie on several stages.
func printTied(w io.Writer, ts []balance.Tied) {
	for _, t := range ts {
		size := mib(float64(t.Bytes))
		if t.Bytes < 1<<20 {
			size = fmt.Sprintf("%.1f KiB", float64(t.Bytes)/(1<<10))
		}
		fmt.Fprintf(w, "tied: %s (%s): the copies' gradients are summed before each step\n", t, size)
	}
}

func printPlan(w io.Writer, res *balance.Result, took time.Duration, c *balance.Cluster, prof *balance.ModelProfile) {
	p, r := res.Plan, res.Report
	speed := map[string]float64{}
	for _, n := range c.Nodes {
		speed[n.Name] = n.Speed
		if n.Speed == 0 && prof.GFLOPS > 0 {
			speed[n.Name] = n.GFLOPS / prof.GFLOPS
		}
	}
	fmt.Fprintf(w, "plan: %s, %s partition, %s schedule, %d micro-batches of %d samples\n", p.Model, p.Partitioner, p.ScheduleText(), p.MicroBatches, p.MicroBatchSize)
	rep := p.Replicated()
	if rep {
		order := "fast order (replicas end equal, not bit-identical to one process)"
		if p.ChainedSums {
			order = "chained, as one process adds them"
		}
		fmt.Fprintf(w, "replicated stages: each replica runs the micro-batches shown; gradient sums %s\n", order)
	}
	specs := strings.Split(res.Spec, "; ")
	col := 5 // "s12", or "s1.0" with replicas
	if rep {
		col = 7
	}
	fmt.Fprintf(w, "  %-*s %-8s %6s %9s %9s %6s %11s  %s\n", col, "stage", "node", "speed", "fwd ms", "bwd ms", "busy", "peak mem", "layers")
	for i, s := range p.Stages {
		st := r.Stages[i]
		layers := specs[s.Group]
		if at := strings.LastIndex(layers, "@"); at >= 0 {
			layers = layers[:at]
		}
		name := fmt.Sprintf("s%d", s.ID)
		if rep {
			name = fmt.Sprintf("s%d.%d", s.Group, s.Replica)
			layers = fmt.Sprintf("%s  (micro-batches %s)", layers, microList(s.Micros()))
		}
		if s.Recompute {
			layers += "  (recomputes its activations)"
		}
		fmt.Fprintf(w, "  %-*s %-8s %6.3g %9.3f %9.3f %5.0f%% %11s  %s\n", col, name, s.Node, speed[s.Node], st.Forward*1e3, st.Backward*1e3, 100*st.BusyFraction, mib(st.PeakMemory), layers)
	}
	fmt.Fprintf(w, "step %.3f ms  bubble %.1f%%  throughput %.1f samples/s  search %.1f ms (%d plans simulated)  plan %s\n",
		r.StepTime*1e3, 100*r.BubbleFraction, r.Throughput, took.Seconds()*1e3, res.Simulated, p.Hash()[:16])
}

// microList writes ascending micro-batches as runs, "0-3,8-11", the first
// few of many as "0,2,4,6,... (16)".
func microList(ms []int) string {
	var runs []string
	for k := 0; k < len(ms); {
		e := k
		for e+1 < len(ms) && ms[e+1] == ms[e]+1 {
			e++
		}
		if e == k {
			runs = append(runs, strconv.Itoa(ms[k]))
		} else {
			runs = append(runs, fmt.Sprintf("%d-%d", ms[k], ms[e]))
		}
		k = e + 1
	}
	if len(runs) > 6 {
		return strings.Join(runs[:4], ",") + fmt.Sprintf(",... (%d)", len(ms))
	}
	return strings.Join(runs, ",")
}

func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

func comparePartitioners(g *nn.Graph, prof *balance.ModelProfile, c *balance.Cluster, opts balance.Options, jsonOut bool, stdout io.Writer) error {
	type row struct {
		Partitioner  string  `json:"partitioner"`
		Schedule     string  `json:"schedule"`
		MicroBatches int     `json:"micro_batches"`
		Stages       int     `json:"stages"`
		Sequential   bool    `json:"sequential"`
		StepTime     float64 `json:"step_time_s"`
		Throughput   float64 `json:"throughput_samples_per_s"`
		Bubble       float64 `json:"bubble_fraction"`
		SearchTime   float64 `json:"search_time_s"`
		Spec         string  `json:"spec"`
	}
	var rows []row
	fmt.Fprintf(stdout, "%-9s %-6s %4s %6s %-5s %10s %12s %7s %10s  %s\n", "partition", "sched", "M", "stages", "chain", "step ms", "samples/s", "bubble", "search ms", "spec")
	for _, name := range []string{balance.Uniform, balance.Params, balance.Balanced, balance.GraphPP} {
		o := opts
		o.Partitioner = name
		res, took, err := search(g, prof, c, o)
		if err != nil {
			fmt.Fprintf(stdout, "%-9s %v\n", name, err)
			continue
		}
		rw := row{name, res.Plan.Schedule.String(), res.Plan.MicroBatches, len(res.Plan.Stages), res.Plan.Sequential(), res.Report.StepTime, res.Report.Throughput,
			res.Report.BubbleFraction, took.Seconds(), res.Spec}
		rows = append(rows, rw)
		chain := "no"
		if rw.Sequential {
			chain = "yes"
		}
		fmt.Fprintf(stdout, "%-9s %-6s %4d %6d %-5s %10.3f %12.1f %6.1f%% %10.1f  %s\n", rw.Partitioner, rw.Schedule, rw.MicroBatches, rw.Stages, chain,
			rw.StepTime*1e3, rw.Throughput, 100*rw.Bubble, rw.SearchTime*1e3, rw.Spec)
	}
	if len(rows) == 0 {
		return fmt.Errorf("no partitioner found a plan")
	}
	if jsonOut {
		b, _ := json.Marshal(map[string]any{"compare": rows})
		fmt.Fprintln(stdout, string(b))
	}
	return nil
}

func loadCluster(nodes, link string, latency time.Duration) (*balance.Cluster, error) {
	bw, err := balance.ParseBandwidth(link)
	if err != nil {
		return nil, err
	}
	def := balance.LinkProfile{Bandwidth: bw, Latency: latency.Seconds()}
	if strings.HasSuffix(nodes, ".json") {
		b, err := os.ReadFile(nodes)
		if err != nil {
			return nil, err
		}
		var c balance.Cluster
		if err := json.Unmarshal(b, &c); err != nil {
			return nil, fmt.Errorf("%s: %w", nodes, err)
		}
		if c.DefaultLink.Bandwidth == 0 {
			c.DefaultLink = def
		}
		return &c, nil
	}
	ns, err := balance.ParseNodes(nodes)
	if err != nil {
		return nil, err
	}
	return &balance.Cluster{Nodes: ns, DefaultLink: def}, nil
}

func loadProfile(g *nn.Graph, how string, opts balance.Options, threads int, backend string, stderr io.Writer) (*balance.ModelProfile, error) {
	switch how {
	case "analytic":
		return balance.Analytic(g, balance.AnalyticOptions{}), nil
	case "measure":
		if threads <= 0 {
			threads = runtime.NumCPU()
		}
		runtime.GOMAXPROCS(max(threads, runtime.GOMAXPROCS(0)))
		be, err := nn.NewBackend(backend, threads, false)
		if err != nil {
			return nil, err
		}
		// Measure at the smallest and largest micro-batch the search tries.
		lo, hi := opts.Batch, opts.Batch
		if opts.MicroBatches > 0 {
			lo, hi = opts.Batch/opts.MicroBatches, opts.Batch/opts.MicroBatches
		} else {
			for m := 1; m <= min(opts.MaxMicroBatches, opts.Batch); m++ {
				if opts.Batch%m == 0 {
					lo = opts.Batch / m
				}
			}
		}
		start := time.Now()
		g.Init(1)
		cpus, held := cgroup.Throttled()
		p, err := balance.ProfileWith(g, be, balance.ProfileOptions{Sizes: []int{lo, hi}, Quota: balance.Quota{CPUs: cpus, Held: held},
			Available: job.AvailableMemory()})
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(stderr, "profiled %d layers at micro-batches %v on %s (%d threads) in %.1f s\n", len(g.Nodes), p.Sizes, be.Name(), threads, time.Since(start).Seconds())
		return p, nil
	}
	b, err := os.ReadFile(how)
	if err != nil {
		return nil, err
	}
	var p balance.ModelProfile
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("%s: %w", how, err)
	}
	return &p, p.Check(g)
}

func writeFileWith(path string, fn func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
