package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/job"
)

// `train --local` ends with an error, not a result, when the loss
// diverges or the job cannot fit this machine.
func TestTrainLocalRefusals(t *testing.T) {
	type refusal struct {
		args []string
		code int
		msg  string
	}
	cases := []refusal{{[]string{"train", "--local", "--data", "synthetic:8x8x1:4", "--synthetic-samples", "96", "--width", "16",
		"--batch", "24", "--steps", "4", "--threads", "1", "--lr", "1e308"}, 1, "ppnode train: diverged at step 1: loss NaN"}}
	// 120 GiB: refused before any of it is allocated, unless this machine
	// has it.
	if job.AvailableMemory() < 200<<30 {
		cases = append(cases, refusal{[]string{"train", "--local", "--width", "16384"}, 2, "preparing the job needs about 121.1 GiB in this process"})
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		code := run(c.args, &out, &errb)
		if code != c.code || !strings.Contains(errb.String(), c.msg) || out.Len() > 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d mentioning %q", c.args, code, out.String(), errb.String(), c.code, c.msg)
		}
	}
}
