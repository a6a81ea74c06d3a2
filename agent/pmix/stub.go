//go:build !pmix

package pmix

import "github.com/fastpmi/fastpmi/agent"

// Supported reports whether this build serves PMIx ranks.
const Supported = false

func serverAcquire() error                        { return ErrNotSupported }
func serverRelease()                              {}
func registerNspace(*Config) error                { return ErrNotSupported }
func deregisterNspace(string) error               { return nil }
func registerForeign(string, *agent.Layout) error { return ErrNotSupported }
func clientEnv(string, int) ([]string, error)     { return nil, ErrNotSupported }
func rankDataRequest(string, int, uint64) error   { return ErrNotSupported }

// Shutdown does nothing: this build has no server.
func Shutdown() {}
