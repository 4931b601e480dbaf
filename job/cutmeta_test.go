package job

import (
	"math"
	"reflect"
	"strings"
	"testing"
)

// A cut's metadata reads back as it was written; missing keys read as
// zero; a value that does not parse is an error naming its key.
func TestCutMeta(t *testing.T) {
	full := CutMeta{Model: "vgg16", Optimizer: "adam", Generation: 1<<32 + 7, MicroBatches: 4,
		TrainLoss: 0.125, TrainCorrect: 90, TrainSeen: 128, Run: "r-1",
		Layouts: map[string][]int{"conv1.weight": {3, 0, 1, 2}, "fc.weight": {1, 0}},
		Aliases: map[string][]string{"tok.weight": {"head.weight", "lm.weight"}}}
	for name, m := range map[string]CutMeta{
		"full":        full,
		"no run":      {Model: "mlp32", Optimizer: "sgd", Generation: 1, MicroBatches: 1},
		"zero":        {},
		"huge counts": {TrainCorrect: math.MaxInt64, TrainSeen: math.MaxInt64, Generation: math.MaxUint64},
	} {
		got, err := ParseCutMeta(m.Encode())
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Errorf("%s: %+v read back as %+v (%v)", name, m, got, err)
		}
	}
	if enc := full.Encode(); enc["layout.conv1.weight"] != "3,0,1,2" || enc["alias.tok.weight"] != "head.weight,lm.weight" || enc["generation"] != "4294967303" || !IsParamKey("layout.fc.weight") || !IsParamKey("alias.tok.weight") || IsParamKey("model") {
		t.Errorf("encoded as %v", enc)
	}
	if got, err := ParseCutMeta(nil); err != nil || !reflect.DeepEqual(got, CutMeta{}) {
		t.Errorf("no metadata: %+v (%v), want zero", got, err)
	}
	got, err := ParseCutMeta(map[string]string{"generation": "3", "other": "kept aside"})
	if err != nil || got.Generation != 3 {
		t.Errorf("an unknown key: %+v (%v), want it ignored", got, err)
	}
	if got, err := ParseCutMeta(map[string]string{"train_loss": "NaN"}); err != nil || !math.IsNaN(got.TrainLoss) {
		t.Errorf("a diverged loss: %+v (%v)", got, err)
	}
	for _, c := range []struct{ key, value string }{
		{"generation", ""},
		{"generation", "-1"},
		{"generation", "18446744073709551616"},
		{"generation", "3 "},
		{"micro_batches", "x"},
		{"micro_batches", "-2"},
		{"micro_batches", "1000000"},
		{"train_loss", "low"},
		{"train_correct", "1.5"},
		{"train_seen", "-1"},
		{"run", ""},
		{"layout.w", ""},
		{"layout.w", "0,0"},
		{"layout.w", "0,2"},
		{"layout.w", "1,,0"},
		{"layout.w", "-1"},
		{"layout.", "0"},
		{"alias.w", ""},
		{"alias.w", "a,,b"},
		{"alias.", "a"},
	} {
		_, err := ParseCutMeta(map[string]string{c.key: c.value})
		if err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%s = %q: %v, want an error naming the key", c.key, c.value, err)
		}
	}
}
