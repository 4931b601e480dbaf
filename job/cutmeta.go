package job

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// CutMeta is what the checkpoint of a consistent cut records besides its
// tensors, as its string metadata (tensorio.Checkpoint.Meta); this file is
// the one place that knows the keys. A key that is missing reads as the
// zero value (a coordinator's own copy has no run; a cut of an earlier
// ppnode may lack a key); a key that is present must parse.
type CutMeta struct {
	Model     string
	Optimizer string
	// Generation is the plan generation whose stages the cut was gathered
	// from.
	Generation uint64
	// MicroBatches is the job's micro-batches a step (0: unknown).
	MicroBatches int
	// TrainLoss is the last step's mean training loss; TrainCorrect and
	// TrainSeen count the right predictions and the samples so far.
	TrainLoss               float64
	TrainCorrect, TrainSeen int64
	// Run is the run of the job a replica is of (the nodes' job records
	// say which); "" for the coordinator's own copy.
	Run string
	// Layouts are the exported layouts of the parameters that have one
	// (nn.Param.Layout), by name: a cut exports without its model.
	Layouts map[string][]int
	// Aliases are the further state_dict names of tied tensors
	// (nn.Param.Aliases), by name.
	Aliases map[string][]string
}

// The metadata keys of a cut.
const (
	metaModel        = "model"
	metaOptimizer    = "optimizer"
	metaGeneration   = "generation"
	metaMicroBatches = "micro_batches"
	metaTrainLoss    = "train_loss"
	metaTrainCorrect = "train_correct"
	metaTrainSeen    = "train_seen"
	metaRun          = "run"
	metaLayout       = "layout." // followed by the parameter's name
	metaAlias        = "alias."  // followed by the parameter's name
)

// IsParamKey reports whether a metadata key is a parameter's layout or
// aliases (a cut's own bookkeeping, not for a weights file).
func IsParamKey(key string) bool {
	return strings.HasPrefix(key, metaLayout) || strings.HasPrefix(key, metaAlias)
}

// Encode writes m as checkpoint metadata: the model, optimizer,
// generation, micro-batches and training progress always, the run, the
// layouts and the aliases when set.
func (m CutMeta) Encode() map[string]string {
	out := map[string]string{
		metaModel:        m.Model,
		metaOptimizer:    m.Optimizer,
		metaGeneration:   strconv.FormatUint(m.Generation, 10),
		metaMicroBatches: strconv.Itoa(m.MicroBatches),
		metaTrainLoss:    strconv.FormatFloat(m.TrainLoss, 'g', -1, 64),
		metaTrainCorrect: strconv.FormatInt(m.TrainCorrect, 10),
		metaTrainSeen:    strconv.FormatInt(m.TrainSeen, 10),
	}
	if m.Run != "" {
		out[metaRun] = m.Run
	}
	for name, l := range m.Layouts {
		s := make([]string, len(l))
		for i, a := range l {
			s[i] = strconv.Itoa(a)
		}
		out[metaLayout+name] = strings.Join(s, ",")
	}
	for name, as := range m.Aliases {
		out[metaAlias+name] = strings.Join(as, ",")
	}
	return out
}

// ParseCutMeta reads the metadata of a cut's checkpoint (from disk or the
// network: it may be anything). Keys it does not know are ignored; an
// error names the key whose value does not parse.
func ParseCutMeta(meta map[string]string) (CutMeta, error) {
	var m CutMeta
	var err error
	bad := func(key, want string) error {
		return fmt.Errorf("cut metadata %s = %q: want %s", key, meta[key], want)
	}
	m.Model, m.Optimizer = meta[metaModel], meta[metaOptimizer]
	if v, ok := meta[metaGeneration]; ok {
		if m.Generation, err = strconv.ParseUint(v, 10, 64); err != nil {
			return CutMeta{}, bad(metaGeneration, "a plan generation")
		}
	}
	if v, ok := meta[metaMicroBatches]; ok {
		if m.MicroBatches, err = strconv.Atoi(v); err != nil || m.MicroBatches < 0 || m.MicroBatches > MaxBatch {
			return CutMeta{}, bad(metaMicroBatches, fmt.Sprintf("0 to %d", MaxBatch))
		}
	}
	if v, ok := meta[metaTrainLoss]; ok {
		if m.TrainLoss, err = strconv.ParseFloat(v, 64); err != nil {
			return CutMeta{}, bad(metaTrainLoss, "a number")
		}
	}
	for _, c := range []struct {
		key string
		dst *int64
	}{{metaTrainCorrect, &m.TrainCorrect}, {metaTrainSeen, &m.TrainSeen}} {
		if v, ok := meta[c.key]; ok {
			if *c.dst, err = strconv.ParseInt(v, 10, 64); err != nil || *c.dst < 0 {
				return CutMeta{}, bad(c.key, "a count")
			}
		}
	}
	if v, ok := meta[metaRun]; ok {
		if v == "" {
			return CutMeta{}, bad(metaRun, "a run")
		}
		m.Run = v
	}
	for _, key := range slices.Sorted(maps.Keys(meta)) { // the first bad key named
		name, ok := strings.CutPrefix(key, metaLayout)
		if !ok {
			continue
		}
		l, err := parseLayout(meta[key])
		if name == "" || err != nil {
			return CutMeta{}, bad(key, "a parameter's layout, a permutation such as 0,3,1,2")
		}
		if m.Layouts == nil {
			m.Layouts = map[string][]int{}
		}
		m.Layouts[name] = l
	}
	for _, key := range slices.Sorted(maps.Keys(meta)) {
		name, ok := strings.CutPrefix(key, metaAlias)
		if !ok {
			continue
		}
		as := strings.Split(meta[key], ",")
		if name == "" || slices.Contains(as, "") {
			return CutMeta{}, bad(key, "a parameter's further names, comma-separated")
		}
		if m.Aliases == nil {
			m.Aliases = map[string][]string{}
		}
		m.Aliases[name] = as
	}
	return m, nil
}

// parseLayout reads a layout written by Encode: a permutation of 0..n-1.
func parseLayout(text string) ([]int, error) {
	parts := strings.Split(text, ",")
	l := make([]int, len(parts))
	for i, p := range parts {
		a, err := strconv.Atoi(p)
		if err != nil || a < 0 || a >= len(parts) {
			return nil, fmt.Errorf("layout %q", text)
		}
		l[i] = a
	}
	if len(slices.Compact(slices.Sorted(slices.Values(l)))) != len(l) {
		return nil, fmt.Errorf("layout %q", text)
	}
	return l, nil
}
