package client

// NewPlayed is newPlayed for the external tests: a rank played by a
// goroutine over a segment the test holds.
var NewPlayed = newPlayed
