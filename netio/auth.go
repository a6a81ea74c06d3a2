package netio

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
)

// Authentication, right after connect and before any other frame. Each end
// sends a hello carrying a fresh 32-byte nonce; on the peer's hello the
// dialer sends its proof, and the acceptor sends its own once the
// dialer's checked out (an empty proof if it did not),
//
//	HMAC-SHA256(secret, label || dialer nonce || acceptor nonce)
//
// with label "fastpmi netio v1 dialer" or "... acceptor" for its own role,
// and checks the peer's proof for the other role. Both ends prove
// knowledge of the secret to each other; the role label stops a proof from
// being reflected back to its maker, and the fresh nonces stop replay. The
// dialer is done one and a half round trips after it connected (a half
// more than when both proved themselves at once), and the secret never
// goes over the wire.
const (
	typeHello uint16 = 0xFFF0
	typeProof uint16 = 0xFFF1

	nonceSize     = 32
	helloVersion  = 1
	labelDialer   = "fastpmi netio v1 dialer"
	labelAcceptor = "fastpmi netio v1 acceptor"
)

// Handshake failures a caller tells apart (both also wrap ErrAuth).
var (
	// errWrongProof: the peer answered, and proved no knowledge of the
	// secret.
	errWrongProof = errors.New("wrong proof")
	// errHungUp: the connection ended before the peer proved itself,
	// as a listener's does when it drops a connection under load (see
	// listener.go); a dialer tries again.
	errHungUp = errors.New("peer hung up")
)

// hungUp marks a send or receive error of the handshake: the connection
// broke (errHungUp), unless ctx ended.
func hungUp(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err
	}
	return fmt.Errorf("%w: %w", errHungUp, err)
}

// handshake authenticates rc in the role given by dialer. Any failure wraps
// ErrAuth; the caller closes rc. An acceptor checks the dialer's proof
// before it proves itself, and calls commit, if not nil, in between:
// after its proof the dialer may hold a Conn, so the acceptor must not
// give up on the connection then but for a failure of its own; false
// from commit ends the handshake there.
func handshake(ctx context.Context, rc rawConn, secret []byte, dialer bool, commit func() bool) error {
	var hello [1 + nonceSize]byte
	hello[0] = helloVersion
	mine := hello[1:]
	if _, err := rand.Read(mine); err != nil {
		return fmt.Errorf("authenticate: draw nonce: %w", err)
	}
	if err := rc.send(ctx, Frame{Type: typeHello, Payload: hello[:]}); err != nil {
		return fmt.Errorf("authenticate: send hello: %w: %w", ErrAuth, hungUp(ctx, err))
	}
	f, err := rc.Recv(ctx)
	if err != nil {
		return fmt.Errorf("authenticate: receive hello: %w: %w", ErrAuth, hungUp(ctx, err))
	}
	if f.Type != typeHello || len(f.Payload) != len(hello) || f.Payload[0] != helloVersion {
		return fmt.Errorf("authenticate: bad hello (type %#04x, %d bytes): %w", f.Type, len(f.Payload), ErrAuth)
	}
	theirs := f.Payload[1:]
	if hmac.Equal(mine, theirs) {
		return fmt.Errorf("authenticate: peer echoed our nonce: %w", ErrAuth)
	}
	dn, an := mine, theirs
	if !dialer {
		dn, an = theirs, mine
	}
	ours, want := labelDialer, labelAcceptor
	if !dialer {
		ours, want = labelAcceptor, labelDialer
	}
	if !dialer {
		// The acceptor proves itself only to a dialer that proved
		// itself: once it has, the dialer may hold a Conn, and the
		// listener can no longer drop the connection for a newer one
		// (commit). Proving itself on a mere hello, which needs no
		// secret, let strangers hold every slot of the listener that
		// way and lock the job's agents out.
		f, err = rc.Recv(ctx)
		if err != nil {
			return fmt.Errorf("authenticate: receive proof: %w: %w", ErrAuth, hungUp(ctx, err))
		}
		if f.Type != typeProof || !hmac.Equal(f.Payload, proof(secret, want, dn, an)) {
			// Say so (an empty proof) rather than hang up: the dialer
			// would take that for a drop under load and try again.
			_ = rc.send(ctx, Frame{Type: typeProof})
			return fmt.Errorf("authenticate: %w (type %#04x, %d bytes): %w", errWrongProof, f.Type, len(f.Payload), ErrAuth)
		}
		if commit != nil && !commit() {
			return fmt.Errorf("authenticate: given up before proving: %w", ErrAuth)
		}
		// The dialer's frames may follow this proof at once.
		rc.unseal()
		if err := rc.send(ctx, Frame{Type: typeProof, Payload: proof(secret, ours, dn, an)}); err != nil {
			return fmt.Errorf("authenticate: send proof: %w: %w", ErrAuth, hungUp(ctx, err))
		}
		return nil
	}
	if err := rc.send(ctx, Frame{Type: typeProof, Payload: proof(secret, ours, dn, an)}); err != nil {
		return fmt.Errorf("authenticate: send proof: %w: %w", ErrAuth, hungUp(ctx, err))
	}
	f, err = rc.Recv(ctx)
	if err != nil {
		return fmt.Errorf("authenticate: receive proof: %w: %w", ErrAuth, hungUp(ctx, err))
	}
	if f.Type == typeProof && len(f.Payload) == 0 {
		return fmt.Errorf("authenticate: %w: the listener refused this end's proof (not the job's secret?): %w", errWrongProof, ErrAuth)
	}
	if f.Type != typeProof || !hmac.Equal(f.Payload, proof(secret, want, dn, an)) {
		return fmt.Errorf("authenticate: %w (type %#04x, %d bytes): %w", errWrongProof, f.Type, len(f.Payload), ErrAuth)
	}
	return nil
}

func proof(secret []byte, label string, dialerNonce, acceptorNonce []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	m.Write(dialerNonce)
	m.Write(acceptorNonce)
	return m.Sum(nil)
}
