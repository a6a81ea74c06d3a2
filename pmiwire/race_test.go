//go:build race

package pmiwire

const raceEnabled = true
