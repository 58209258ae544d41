package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Mechanism is the SASL mechanism name the proxy offers.
const Mechanism = "SCRAM-SHA-256"

// ErrAuthFailed is returned when a client's proof does not match, or the user is not
// in the users file (the two are not told apart, as in PostgreSQL).
var ErrAuthFailed = errors.New("auth: password authentication failed")

// ErrProtocol is wrapped by errors about malformed SCRAM messages.
var ErrProtocol = errors.New("auth: malformed SCRAM message")

// Exchange is the server side of one SCRAM-SHA-256 authentication:
//
//	first := x.ServerFirst(clientFirst)   // AuthenticationSASLContinue
//	final, err := x.ServerFinal(clientFinal) // AuthenticationSASLFinal, or ErrAuthFailed
//
// Channel binding (SCRAM-SHA-256-PLUS) is not offered; a client that insists on it
// fails.
type Exchange struct {
	users  *Users
	user   string
	secret Secret
	known  bool

	clientFirstBare string
	serverFirst     string
	nonce           string
	step            int
}

// NewExchange starts an exchange for the user named in the startup message.
// (SCRAM's own user name field is ignored, as PostgreSQL does.)
func (u *Users) NewExchange(user string) *Exchange {
	s, ok := u.lookup(user)
	return &Exchange{users: u, user: user, secret: s, known: ok}
}

// ServerFirst reads the client-first-message and returns the server-first-message.
func (x *Exchange) ServerFirst(clientFirst []byte) ([]byte, error) {
	if x.step != 0 {
		return nil, fmt.Errorf("%w: unexpected client-first-message", ErrProtocol)
	}
	x.step = 1
	msg := string(clientFirst)
	// gs2-header: "n,," or "y,," (no channel binding); "p=..." asks for binding.
	var bare string
	switch {
	case strings.HasPrefix(msg, "n,") || strings.HasPrefix(msg, "y,"):
		rest := msg[2:]
		i := strings.IndexByte(rest, ',')
		if i < 0 {
			return nil, fmt.Errorf("%w: no gs2 header", ErrProtocol)
		}
		if rest[:i] != "" && !strings.HasPrefix(rest[:i], "a=") {
			return nil, fmt.Errorf("%w: bad authzid", ErrProtocol)
		}
		bare = rest[i+1:]
	case strings.HasPrefix(msg, "p="):
		return nil, fmt.Errorf("%w: channel binding is not supported (connect with channel_binding=disable or prefer)", ErrProtocol)
	default:
		return nil, fmt.Errorf("%w: bad gs2 header", ErrProtocol)
	}
	attrs, err := parseAttrs(bare)
	if err != nil {
		return nil, err
	}
	clientNonce := attrs['r']
	if clientNonce == "" || !printable(clientNonce) {
		return nil, fmt.Errorf("%w: missing or bad client nonce", ErrProtocol)
	}
	var raw [18]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, err
	}
	x.clientFirstBare = bare
	x.nonce = clientNonce + base64.StdEncoding.EncodeToString(raw[:])
	x.serverFirst = "r=" + x.nonce + ",s=" + base64.StdEncoding.EncodeToString(x.secret.Salt) + ",i=" + strconv.Itoa(x.secret.Iterations)
	return []byte(x.serverFirst), nil
}

// ServerFinal checks the client-final-message's proof and returns the
// server-final-message, or ErrAuthFailed.
func (x *Exchange) ServerFinal(clientFinal []byte) ([]byte, error) {
	if x.step != 1 {
		return nil, fmt.Errorf("%w: unexpected client-final-message", ErrProtocol)
	}
	x.step = 2
	msg := string(clientFinal)
	i := strings.LastIndex(msg, ",p=")
	if i < 0 {
		return nil, fmt.Errorf("%w: no proof", ErrProtocol)
	}
	withoutProof := msg[:i]
	attrs, err := parseAttrs(msg)
	if err != nil {
		return nil, err
	}
	if attrs['r'] != x.nonce {
		return nil, fmt.Errorf("%w: nonce mismatch", ErrProtocol)
	}
	// Without channel binding, c= is the base64 of the gs2 header "n,," or "y,,".
	if cb := attrs['c']; cb != "biws" && cb != "eSws" {
		return nil, fmt.Errorf("%w: unexpected channel binding", ErrProtocol)
	}
	proof, err := base64.StdEncoding.DecodeString(attrs['p'])
	if err != nil || len(proof) != sha256.Size {
		return nil, fmt.Errorf("%w: bad proof", ErrProtocol)
	}
	authMessage := x.clientFirstBare + "," + x.serverFirst + "," + withoutProof
	signature := hmacSHA256(x.secret.StoredKey, authMessage)
	clientKey := make([]byte, sha256.Size)
	for k := range clientKey {
		clientKey[k] = proof[k] ^ signature[k]
	}
	stored := sha256.Sum256(clientKey)
	if subtle.ConstantTimeCompare(stored[:], x.secret.StoredKey) != 1 || !x.known {
		return nil, ErrAuthFailed
	}
	serverSig := hmacSHA256(x.secret.ServerKey, authMessage)
	return []byte("v=" + base64.StdEncoding.EncodeToString(serverSig)), nil
}

// parseAttrs reads comma-separated k=v attributes.
func parseAttrs(s string) (map[byte]string, error) {
	out := map[byte]string{}
	for part := range strings.SplitSeq(s, ",") {
		if len(part) < 2 || part[1] != '=' {
			return nil, fmt.Errorf("%w: bad attribute", ErrProtocol)
		}
		if part[0] == 'm' {
			return nil, fmt.Errorf("%w: unsupported mandatory extension", ErrProtocol)
		}
		out[part[0]] = part[2:]
	}
	return out, nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e || s[i] == ',' {
			return false
		}
	}
	return true
}
