//go:build race

package data

// raceEnabled is true when the tests run under the race detector, which
// makes decoding the 60000-image training files take tens of seconds.
const raceEnabled = true
