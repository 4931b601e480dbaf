package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nodes"
)

// buildInfo is what `ppnode version` prints: the version a node reports
// in its status (nodes.Version), and how the binary was built.
type buildInfo struct {
	// Version is the module's version (a pseudo-version with the commit
	// for a build from a checkout), as every node gossips and reports it.
	Version string `json:"version"`
	Module  string `json:"module,omitempty"`
	// Revision, Time and Modified describe the checkout it was built from
	// (empty when not built from one).
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Go       string `json:"go"`
	OS       string `json:"os"`
	Arch     string `json:"arch"`
	// Compute names what computes by default (nn.Describe), OpenMPSpin
	// the GOMP_SPINCOUNT its OpenMP threads run with (oneDNN builds).
	Compute    string `json:"compute"`
	OpenMPSpin string `json:"openmp_spin,omitempty"`
}

// readBuildInfo reads the binary's build information.
func readBuildInfo() buildInfo {
	b := buildInfo{Version: nodes.Version, Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
	if be, err := nn.NewBackend("", 0, false); err == nil {
		b.Compute = nn.Describe(be)
	}
	if nn.OneDNN {
		b.OpenMPSpin = os.Getenv("GOMP_SPINCOUNT")
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	b.Module = bi.Main.Path
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

func (b buildInfo) String() string {
	s := "ppnode " + b.Version
	if b.Revision != "" {
		s += "\n  revision " + b.Revision
		if b.Modified {
			s += " (modified)"
		}
	}
	if b.Time != "" {
		s += "\n  committed " + b.Time
	}
	if b.Module != "" {
		s += "\n  module " + b.Module
	}
	s += fmt.Sprintf("\n  built with %s for %s/%s", b.Go, b.OS, b.Arch)
	if b.Compute != "" {
		s += "\n  computes with " + b.Compute
	}
	if b.OpenMPSpin != "" {
		s += " (GOMP_SPINCOUNT=" + b.OpenMPSpin + ")"
	}
	return s
}

func runVersion(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", "[--json]")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	b := readBuildInfo()
	if *asJSON {
		js, err := json.Marshal(b)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(js))
		return nil
	}
	fmt.Fprintln(stdout, b)
	return nil
}
