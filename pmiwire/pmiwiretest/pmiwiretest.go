// Package pmiwiretest plays a PMI-2 server for tests of PMI clients (the
// Go client, libfastpmi): one rank's connection, answered as a launcher
// without fastpmi's extensions answers it (Slurm's, Hydra's), over a real
// socket whose other end the rank finds in PMI_FD.
package pmiwiretest

import (
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/fastpmi/fastpmi/pmiwire"
)

// RankSocket returns a connected pair of Unix sockets: the server's end,
// and the rank's end as a file to hand a rank as PMI_FD (ExtraFiles, or
// its descriptor in this process). Both close when the test ends.
func RankSocket(tb testing.TB) (server net.Conn, rank *os.File) {
	tb.Helper()
	l, err := net.Listen("unix", filepath.Join(tb.TempDir(), "launcher"))
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close() // its file is a descriptor of its own
	server, err = l.Accept()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { server.Close() })
	if rank, err = c.(*net.UnixConn).File(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { rank.Close() })
	return server, rank
}

// Serve answers the rank on c until the connection ends: PMI-1's init
// line with PMI-2, fullinit as rank 0 of 1, and every other request with
// rc=0, the pairs answer returns (nil for none) and the request's thrid.
// answer runs on Serve's goroutine, one request at a time.
func Serve(c net.Conn, answer func(m *pmiwire.Msg) []pmiwire.Pair) {
	var d pmiwire.Decoder
	var out []byte
	for {
		m, ok, err := d.Next()
		if err != nil {
			return
		}
		if !ok {
			if _, err := d.Fill(c); err != nil {
				return
			}
			continue
		}
		if m.Cmd == "init" { // PMI-1's line, before PMI-2's frames
			out = pmiwire.AppendV1(out[:0], "response_to_init", pmiwire.Pair{Key: "rc", Val: "0"},
				pmiwire.Pair{Key: "pmi_version", Val: "2"}, pmiwire.Pair{Key: "pmi_subversion", Val: "0"})
		} else {
			pairs := []pmiwire.Pair{{Key: "rc", Val: "0"}}
			if id, ok := m.Get("thrid"); ok {
				pairs = append(pairs, pmiwire.Pair{Key: "thrid", Val: id})
			}
			if m.Cmd == "fullinit" {
				pairs = append(pairs, pmiwire.Pair{Key: "rank", Val: "0"}, pmiwire.Pair{Key: "size", Val: "1"},
					pmiwire.Pair{Key: "appnum", Val: "0"})
			}
			pairs = append(pairs, answer(&m)...)
			out = pmiwire.AppendV2(out[:0], m.Cmd+"-response", pairs...)
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// Start runs Serve on c on a goroutine of its own and returns stop, which
// closes c and returns once Serve has (what answer wrote is then the
// test's to read); the test's end calls it too.
func Start(tb testing.TB, c net.Conn, answer func(m *pmiwire.Msg) []pmiwire.Pair) (stop func()) {
	served := make(chan struct{})
	go func() {
		defer close(served)
		Serve(c, answer)
	}()
	stop = sync.OnceFunc(func() {
		c.Close()
		<-served
	})
	tb.Cleanup(stop)
	return stop
}
