package job

import (
	"errors"
	"fmt"
	"math"
)

// ErrDiverged is the error of a job whose training loss became NaN or
// infinite ([StateDiverged]).
var ErrDiverged = errors.New("diverged")

// CheckLoss is the one rule for a step's loss, in the core and in
// [Job.TrainLocal]: a NaN or infinite loss at step (counting from 0) ends
// the job with an error wrapping ErrDiverged ("diverged at step 12: loss
// NaN"). Its weights are then NaN or infinite too, and steps are
// deterministic, so nothing is gained by going back to a cut.
func CheckLoss(step int, loss float64) error {
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return fmt.Errorf("%w at step %d: loss %v", ErrDiverged, step, loss)
	}
	return nil
}
