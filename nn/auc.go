package nn

import (
	"cmp"
	"math"
	"slices"
)

// AUC is the area under the ROC curve of scores against binary targets
// (1 positive, 0 negative): the chance that a random positive scores above
// a random negative, a tie counting a half (the Mann-Whitney statistic, as
// scikit-learn's roc_auc_score over all the values). Scores rank as
// logits or as their sigmoids alike. It is NaN when the targets have no
// positive or no negative, or one that is neither 0 nor 1 (soft targets
// have no ROC curve). The result depends only on the values, not on their
// order.
func AUC(scores, targets []float32) float64 {
	if len(scores) != len(targets) {
		panic("nn: AUC of scores and targets of different lengths")
	}
	type pair struct {
		s   float32
		pos bool
	}
	ps := make([]pair, len(scores))
	var pos, neg float64
	for i, y := range targets {
		switch y {
		case 1:
			pos++
		case 0:
			neg++
		default:
			return math.NaN()
		}
		ps[i] = pair{scores[i], y == 1}
	}
	if pos == 0 || neg == 0 {
		return math.NaN()
	}
	slices.SortFunc(ps, func(a, b pair) int { return cmp.Compare(a.s, b.s) })
	// The ranks of the positives, each run of equal scores at its mean rank.
	var rankSum float64
	for i := 0; i < len(ps); {
		j, p := i, 0.0
		for ; j < len(ps) && ps[j].s == ps[i].s; j++ {
			if ps[j].pos {
				p++
			}
		}
		rankSum += p * float64(i+j+1) / 2 // ranks i+1 .. j
		i = j
	}
	return (rankSum - pos*(pos+1)/2) / (pos * neg)
}
