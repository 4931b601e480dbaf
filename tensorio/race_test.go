//go:build race

package tensorio

const raceEnabled = true
