//go:build !race

package pmiwire

const raceEnabled = false
