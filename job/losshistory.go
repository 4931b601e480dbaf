package job

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// MaxLossPoints bounds a [LossHistory].
const MaxLossPoints = 500

// LossPoint is the mean training loss of one step. Step counts the steps
// done with it (the first step is 1, as [Status.Step] counts). Its JSON is
// a pair, [step, loss].
type LossPoint struct {
	Step int
	Loss float64
}

// MarshalJSON writes [step, loss] (a loss JSON cannot carry is null).
func (p LossPoint) MarshalJSON() ([]byte, error) {
	b := append(strconv.AppendInt([]byte{'['}, int64(p.Step), 10), ',')
	if math.IsNaN(p.Loss) || math.IsInf(p.Loss, 0) {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendFloat(b, p.Loss, 'g', -1, 64)
	}
	return append(b, ']'), nil
}

// UnmarshalJSON reads [step, loss].
func (p *LossPoint) UnmarshalJSON(b []byte) error {
	var pair []*float64
	if err := json.Unmarshal(b, &pair); err != nil {
		return err
	}
	if len(pair) != 2 || pair[0] == nil || *pair[0] != math.Trunc(*pair[0]) || math.Abs(*pair[0]) > math.MaxInt32 {
		return fmt.Errorf("job: loss point %s: want [step, loss]", b)
	}
	p.Step, p.Loss = int(*pair[0]), math.NaN()
	if pair[1] != nil {
		p.Loss = *pair[1]
	}
	return nil
}

// LossHistory is a job's training loss over its steps, downsampled: it
// keeps the loss of every k-th step, k a power of two, at most
// MaxLossPoints of them; when full, k doubles and every other point goes.
// Which steps it keeps depends only on the steps added, not on when: k is
// the smallest power of two with at most MaxLossPoints multiples up to
// the newest step ever added, and a step added again (replayed after a
// recovery) replaces the points from it on. The zero value is empty.
type LossHistory struct {
	every  int // k (0: 1)
	points []LossPoint
}

// Add records the loss of step (counting from 1); points at step or after
// are dropped first.
func (h *LossHistory) Add(step int, loss float64) {
	h.every = max(h.every, 1)
	i, _ := slices.BinarySearchFunc(h.points, step, func(p LossPoint, s int) int { return p.Step - s })
	h.points = h.points[:i]
	if step <= 0 || step%h.every != 0 {
		return
	}
	if len(h.points) == MaxLossPoints {
		h.every *= 2
		h.points = slices.DeleteFunc(h.points, func(p LossPoint) bool { return p.Step%h.every != 0 })
		if step%h.every != 0 {
			return
		}
	}
	h.points = append(h.points, LossPoint{Step: step, Loss: loss})
}

// Points returns a copy of the points, by step (nil if none).
func (h *LossHistory) Points() []LossPoint { return slices.Clone(h.points) }
