//go:build !race

package e2e

// raceEnabled: this test binary runs under the race detector (the
// programs it starts do not).
const raceEnabled = false
