//go:build race

package wire_test

// raceEnabled: the race detector drops sync.Pool items at random, so the
// allocation counts allow for the pooled state made again.
const raceEnabled = true
