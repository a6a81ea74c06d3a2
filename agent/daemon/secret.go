package daemon

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// Secret files: the daemon and every pmirun that submits to it read the
// same file, as munge and PRRTE read theirs. Its content, surrounding
// white space removed, is the secret (at least 16 bytes); a new one holds
// 32 random bytes in hex.
const (
	minSecret     = 16
	maxSecretFile = 4096
)

// ErrInsecureSecret is returned for a secret file that others could read
// or that another user owns.
var ErrInsecureSecret = errors.New("insecure secret file")

// LoadSecret reads the secret file at path. With create, a missing file
// is made (mode 0600, 32 random bytes in hex). A file that group or
// others may read or write, that is not a regular file, or that is not
// owned by this process's user is refused with ErrInsecureSecret.
func LoadSecret(path string, create bool) ([]byte, error) {
	if path == "" {
		return nil, errors.New("load secret: no secret file given")
	}
	if create {
		if err := createSecret(path); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("create secret file %s: %w", path, err)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load secret: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("load secret: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("load secret %s: not a regular file: %w", path, ErrInsecureSecret)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("load secret %s: mode %04o lets group or others at it (chmod 600 %s): %w", path, perm, path, ErrInsecureSecret)
	}
	if uid, ok := sys.FileOwner(st); ok && uid != os.Getuid() {
		return nil, fmt.Errorf("load secret %s: owned by uid %d, not by this user (uid %d): %w", path, uid, os.Getuid(), ErrInsecureSecret)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return nil, fmt.Errorf("load secret: %w", err)
	}
	if len(b) > maxSecretFile {
		return nil, fmt.Errorf("load secret %s: longer than %d bytes", path, maxSecretFile)
	}
	b = bytes.TrimSpace(b)
	if len(b) < minSecret {
		return nil, fmt.Errorf("load secret %s: %d bytes, want at least %d", path, len(b), minSecret)
	}
	return b, nil
}

// createSecret makes a new secret file at path; it fails with
// fs.ErrExist if there is one. The file appears whole or not at all:
// daemons started at once on the nodes of a shared home directory (srun
// pmid --daemon) each read the one that won, never an empty one another
// is still writing. It is written under a temporary name beside path and
// linked to path, which fails if path exists (also on NFS, where
// O_EXCL may not be atomic).
func createSecret(path string) error {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".new-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.WriteString(hex.EncodeToString(raw[:]) + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Link(f.Name(), path)
}
