package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

const ckptUsage = `usage:
  ppnode ckpt inspect [--json] FILE
      list the tensors of a checkpoint or safetensors file: names, shapes,
      dtypes, CRC-32C of each tensor's bytes, and the job, step and metadata
  ppnode ckpt export FILE --format safetensors OUT
      write a checkpoint's parameters (not its optimizer state) as safetensors`

func runCkpt(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("want a subcommand: inspect or export")
	}
	switch args[0] {
	case "inspect":
		return ckptInspect(args[1:], stdout, stderr)
	case "export":
		return ckptExport(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, ckptUsage)
		return flag.ErrHelp
	}
	return usagef("unknown subcommand %q: want inspect or export", args[0])
}

// parseInterspersed parses flags that may come before, between or after
// the positional arguments, and returns the positional ones; help and
// mistakes are as parseFlags says.
func parseInterspersed(fs *flag.FlagSet, args []string, stdout io.Writer) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args, stdout); err != nil {
			return nil, err
		}
		if used := len(args) - fs.NArg(); fs.NArg() == 0 || used > 0 && args[used-1] == "--" {
			return append(pos, fs.Args()...), nil // "--" ends the flags
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// ckptInfo is what inspect reports (and prints with --json).
type ckptInfo struct {
	File   string `json:"file"`
	Format string `json:"format"` // "checkpoint" or "safetensors"
	Bytes  int    `json:"bytes"`
	Job    string `json:"job,omitempty"`
	// Step is the checkpoint's step, or a safetensors file's "ppnode.step"
	// metadata; nil when unknown.
	Step     *int64            `json:"step,omitempty"`
	Plan     string            `json:"plan,omitempty"`
	Data     *tensorio.DataPos `json:"data,omitempty"`
	RNGBytes int               `json:"rng_bytes,omitempty"`
	Meta     map[string]string `json:"meta,omitempty"`
	// WeightsSHA256 fingerprints the parameters as float32 values (the
	// figure ppnode train reports); a checkpoint and its export agree.
	WeightsSHA256 string `json:"weights_sha256"`
	// Values counts the elements of the parameters (of a checkpoint) or
	// of every tensor (of a safetensors file).
	Values  int          `json:"values"`
	Tensors []tensorInfo `json:"tensors"`
}

type tensorInfo struct {
	Name  string `json:"name"`
	Slot  string `json:"slot,omitempty"` // optimizer slot; empty for a parameter
	DType string `json:"dtype"`
	Shape []int  `json:"shape"`
	// CRC32C is the CRC-32C of the tensor's stored little-endian bytes;
	// for a checkpoint it equals the checksum its frame carries.
	CRC32C string `json:"crc32c"`
}

// ckptMagic starts a checkpoint file (tensorio's package doc).
var ckptMagic = []byte("PPCK")

func ckptInspect(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ckpt inspect", "[--json] FILE")
	asJSON := fs.Bool("json", false, "print one JSON object")
	pos, err := parseInterspersed(fs, args, stdout)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("inspect takes one FILE")
	}
	info, err := inspectFile(pos[0])
	if err != nil {
		return err
	}
	if *asJSON {
		b, err := json.MarshalIndent(info, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "%s\n", b)
		return err
	}
	return printInfo(stdout, info)
}

func inspectFile(path string) (*ckptInfo, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	info := &ckptInfo{File: path, Bytes: len(data)}
	if bytes.HasPrefix(data, ckptMagic) {
		c, err := tensorio.ReadCheckpoint(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		info.Format = "checkpoint"
		info.Job, info.Plan, info.Meta = c.JobID, c.PlanHash, c.Meta
		info.Step, info.Data, info.RNGBytes = &c.Step, &c.Data, len(c.RNG)
		info.WeightsSHA256 = tensorio.WeightsSHA256(c.Params)
		for _, p := range c.Params {
			ti, err := f32Info(p.Name, "", p)
			if err != nil {
				return nil, err
			}
			info.Values += len(p.T.Float32s())
			info.Tensors = append(info.Tensors, ti)
		}
		for _, o := range c.Optim {
			ti, err := f32Info(o.Param, o.Slot, tensorio.Named{Name: o.Param, T: o.T})
			if err != nil {
				return nil, err
			}
			info.Tensors = append(info.Tensors, ti)
		}
		return info, nil
	}
	entries, meta, err := tensorio.ParseSafetensors(data)
	if err != nil {
		if errors.Is(err, tensorio.ErrCorrupt) && !looksLikeSafetensors(data) {
			return nil, fmt.Errorf("%s: neither a ppnode checkpoint (magic %q) nor a safetensors file: %w", path, ckptMagic, err)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	info.Format = "safetensors"
	info.Meta = meta
	info.Job = meta["ppnode.job"]
	info.Plan = meta["ppnode.plan"]
	if s, ok := meta["ppnode.step"]; ok {
		var step int64
		if _, err := fmt.Sscan(s, &step); err == nil {
			info.Step = &step
		}
	}
	if info.WeightsSHA256, err = tensorio.EntriesSHA256(entries); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, e := range entries {
		n := 1
		for _, d := range e.Shape {
			n *= d
		}
		info.Values += n
		info.Tensors = append(info.Tensors, tensorInfo{
			Name: e.Name, DType: e.DType.String(), Shape: nonNil(e.Shape),
			CRC32C: fmt.Sprintf("%08x", tensorio.Checksum(e.Data)),
		})
	}
	return info, nil
}

// looksLikeSafetensors reports whether data starts as a safetensors file
// does: an 8-byte header length, then a JSON object.
func looksLikeSafetensors(data []byte) bool {
	return len(data) > 8 && data[8] == '{'
}

func f32Info(name, slot string, t tensorio.Named) (tensorInfo, error) {
	e, err := tensorio.F32Entry(name, t.T)
	if err != nil {
		return tensorInfo{}, err
	}
	return tensorInfo{
		Name: name, Slot: slot, DType: e.DType.String(), Shape: nonNil(e.Shape),
		CRC32C: fmt.Sprintf("%08x", tensorio.Checksum(e.Data)),
	}, nil
}

func nonNil(s []int) []int {
	if s == nil {
		return []int{}
	}
	return s
}

func printInfo(w io.Writer, info *ckptInfo) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "file\t%s (%s, %d bytes)\n", info.File, info.Format, info.Bytes)
	if info.Job != "" {
		fmt.Fprintf(tw, "job\t%s\n", info.Job)
	}
	if info.Step != nil {
		fmt.Fprintf(tw, "step\t%d\n", *info.Step)
	}
	if info.Plan != "" {
		fmt.Fprintf(tw, "plan\t%s\n", info.Plan)
	}
	if info.Data != nil {
		fmt.Fprintf(tw, "data\tepoch %d, step %d\n", info.Data.Epoch, info.Data.Step)
	}
	if info.RNGBytes > 0 {
		fmt.Fprintf(tw, "rng\t%d bytes\n", info.RNGBytes)
	}
	keys := make([]string, 0, len(info.Meta))
	for k := range info.Meta {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(tw, "meta\t%s = %s\n", k, info.Meta[k])
	}
	fmt.Fprintf(tw, "weights\tsha256 %s (%d values)\n", info.WeightsSHA256, info.Values)
	fmt.Fprintf(tw, "tensors\t%d\n", len(info.Tensors))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSLOT\tDTYPE\tSHAPE\tCRC32C")
	for _, t := range info.Tensors {
		slot := t.Slot
		if slot == "" {
			slot = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\n", t.Name, slot, t.DType, t.Shape, t.CRC32C)
	}
	return tw.Flush()
}

var exportFormats = []string{"safetensors"}

func ckptExport(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ckpt export", "FILE --format safetensors OUT")
	format := fs.String("format", "", "output format: "+strings.Join(exportFormats, ", "))
	pos, err := parseInterspersed(fs, args, stdout)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usagef("export takes FILE and OUT")
	}
	if !slices.Contains(exportFormats, *format) {
		return usagef("--format %q: want one of %v", *format, exportFormats)
	}
	in, out := pos[0], pos[1]
	data, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(data, ckptMagic) {
		if looksLikeSafetensors(data) {
			return fmt.Errorf("%s is already a safetensors file", in)
		}
		return fmt.Errorf("%s: not a ppnode checkpoint (no %q magic)", in, ckptMagic)
	}
	c, err := tensorio.ReadCheckpoint(data)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	sha, err := exportWeights(out, c)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	fmt.Fprintf(stdout, "wrote %s: %d parameters of job %s, step %d (weights sha256 %s)\n",
		out, len(c.Params), c.JobID, c.Step, sha)
	return nil
}

// exportWeights writes a cut's parameters as a weights file (names and
// layouts of the PyTorch state_dict, as `train --out` writes them) and
// returns their fingerprint.
func exportWeights(path string, c *tensorio.Checkpoint) (string, error) {
	cm, err := job.ParseCutMeta(c.Meta)
	if err != nil {
		return "", err
	}
	ps := make([]*nn.Param, len(c.Params))
	meta := map[string]string{"format": "pt"}
	for k, v := range c.Meta {
		if !job.IsParamKey(k) {
			meta[k] = v
		}
	}
	for i, n := range c.Params {
		ps[i] = &nn.Param{Name: n.Name, Value: n.T, Aliases: cm.Aliases[n.Name]}
		if l, ok := cm.Layouts[n.Name]; ok {
			if rank := len(n.T.Shape()); len(l) != rank {
				return "", fmt.Errorf("%s: layout %v of a %d-dimensional tensor", n.Name, l, rank)
			}
			ps[i].Layout = l
		}
	}
	es, err := job.WeightsEntries(ps, int(c.Step), cm.MicroBatches)
	if err != nil {
		return "", err
	}
	sha := nn.WeightsSHA256(ps)
	meta["ppnode.job"], meta["ppnode.step"], meta["weights_sha256"] = c.JobID, fmt.Sprint(c.Step), sha
	if c.PlanHash != "" {
		meta["ppnode.plan"] = c.PlanHash
	}
	return sha, tensorio.SaveSafetensorsEntries(path, es, meta)
}
