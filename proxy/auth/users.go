// Package auth authenticates the proxy's clients: a users file in pgbouncer's
// userlist.txt format and the server side of SCRAM-SHA-256 (RFC 5802 and 7677), the
// mechanism PostgreSQL itself uses.
//
// Passwords are never logged and never kept in plain text longer than needed: a plain
// password in the file is turned into a SCRAM secret (salt, StoredKey, ServerKey) when
// the file is read, as PostgreSQL does with password_encryption = scram-sha-256.
package auth

import (
	"bufio"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// ErrUsersFile is wrapped by every error about a malformed users file.
var ErrUsersFile = errors.New("auth: bad users file")

// DefaultIterations is the PBKDF2 iteration count for secrets made from plain
// passwords, PostgreSQL's default (scram_iterations).
const DefaultIterations = 4096

// Secret is a SCRAM-SHA-256 verifier: what a server keeps instead of a password.
type Secret struct {
	Iterations int
	Salt       []byte
	StoredKey  []byte // H(ClientKey)
	ServerKey  []byte
}

// String formats the secret as PostgreSQL stores it in pg_authid.rolpassword:
// SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>, all base64.
func (s Secret) String() string {
	b := base64.StdEncoding
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", s.Iterations, b.EncodeToString(s.Salt),
		b.EncodeToString(s.StoredKey), b.EncodeToString(s.ServerKey))
}

// NewSecret derives a secret from a password with a fresh random salt.
func NewSecret(password string, iterations int) (Secret, error) {
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return Secret{}, err
	}
	return deriveSecret(password, salt, iterations)
}

func deriveSecret(password string, salt []byte, iterations int) (Secret, error) {
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return Secret{}, err
	}
	clientKey := hmacSHA256(salted, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	return Secret{Iterations: iterations, Salt: salt, StoredKey: storedKey[:], ServerKey: hmacSHA256(salted, "Server Key")}, nil
}

// ParseSecret reads a secret in PostgreSQL's format (see Secret.String).
func ParseSecret(s string) (Secret, error) {
	rest, ok := strings.CutPrefix(s, "SCRAM-SHA-256$")
	if !ok {
		return Secret{}, errors.New("not a SCRAM-SHA-256 secret")
	}
	iterSalt, keys, ok := strings.Cut(rest, "$")
	if !ok {
		return Secret{}, errors.New("malformed SCRAM-SHA-256 secret")
	}
	iter, salt64, ok1 := strings.Cut(iterSalt, ":")
	stored64, server64, ok2 := strings.Cut(keys, ":")
	if !ok1 || !ok2 {
		return Secret{}, errors.New("malformed SCRAM-SHA-256 secret")
	}
	n, err := strconv.Atoi(iter)
	if err != nil || n < 1 {
		return Secret{}, errors.New("malformed SCRAM-SHA-256 secret: bad iteration count")
	}
	b := base64.StdEncoding
	salt, err1 := b.DecodeString(salt64)
	stored, err2 := b.DecodeString(stored64)
	server, err3 := b.DecodeString(server64)
	if err1 != nil || err2 != nil || err3 != nil || len(stored) != sha256.Size || len(server) != sha256.Size || len(salt) == 0 {
		return Secret{}, errors.New("malformed SCRAM-SHA-256 secret: bad base64 or key length")
	}
	return Secret{Iterations: n, Salt: salt, StoredKey: stored, ServerKey: server}, nil
}

// Users maps user names to their SCRAM secrets, and to the server login each runs
// as. The zero value has no users.
type Users struct {
	secrets map[string]Secret
	logins  map[string]Login
	// fake makes the secret of an unknown user: a client cannot tell from the exchange
	// whether a user exists, as with PostgreSQL.
	fakeKey []byte
}

// NewUsers returns an empty set of users.
func NewUsers() *Users {
	k := make([]byte, 32)
	rand.Read(k)
	return &Users{secrets: map[string]Secret{}, logins: map[string]Login{}, fakeKey: k}
}

// Add sets a user's secret, replacing what an earlier Add of the user set: the user
// runs on the servers as itself, with no password (see SetLogin).
func (u *Users) Add(name string, s Secret) {
	u.secrets[name] = s
	u.logins[name] = Login{User: name}
}

// Login is who a client runs as on the servers: a server user, and the password to
// log in with ("" for none: the server must let the user in without one, by trust,
// peer or certificate).
type Login struct {
	User     string
	Password string
}

// SetLogin sets the server login of a user added with Add.
func (u *Users) SetLogin(name string, l Login) { u.logins[name] = l }

// ServerLogin returns the server login of a user in the file.
func (u *Users) ServerLogin(name string) (Login, bool) {
	l, ok := u.logins[name]
	return l, ok
}

// Len returns the number of users.
func (u *Users) Len() int { return len(u.secrets) }

// lookup returns a user's secret, and for an unknown user a made-up one (ok false).
func (u *Users) lookup(name string) (Secret, bool) {
	if s, ok := u.secrets[name]; ok {
		return s, true
	}
	salt := hmacSHA256(u.fakeKey, "salt:"+name)[:16]
	return Secret{Iterations: DefaultIterations, Salt: salt, StoredKey: make([]byte, 32), ServerKey: make([]byte, 32)}, false
}

// LoadUsers reads a users file (see ParseUsers).
func LoadUsers(path string) (*Users, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	u, err := ParseUsers(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return u, nil
}

// ParseUsers reads pgbouncer's userlist.txt format: one user a line, `"name" "secret"`,
// where the secret is a SCRAM-SHA-256 verifier as PostgreSQL stores it (`SELECT
// rolpassword FROM pg_authid`) or a plain password. A doubled quote inside quotes
// stands for one. Blank lines and lines starting with ; or # are skipped. Errors name
// the line, never the secret.
//
// Each user runs on the servers as itself, logging in with its password when the file
// gives it in plain text (as pgbouncer does), else with none. Two more fields map it to
// another server login, as PgDog's server_user and server_password do:
// `"name" "secret" "server user"` or `"name" "secret" "server user" "server password"`.
// A user on several lines is the last line's, as in pgbouncer.
func ParseUsers(r io.Reader) (*Users, error) {
	u := NewUsers()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || text[0] == ';' || text[0] == '#' {
			continue
		}
		name, rest, err := quoted(text)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: user name: %v", ErrUsersFile, line, err)
		}
		secret, rest, err := quoted(strings.TrimLeft(rest, " \t"))
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: password of %q: %v", ErrUsersFile, line, name, err)
		}
		var login *Login
		if rest = strings.TrimLeft(rest, " \t"); rest != "" {
			var serverUser, serverPassword string
			if serverUser, rest, err = quoted(rest); err != nil || serverUser == "" {
				return nil, fmt.Errorf("%w: line %d: unexpected text after the password of %q (a server user, quoted, may follow)", ErrUsersFile, line, name)
			}
			if rest = strings.TrimLeft(rest, " \t"); rest != "" {
				if serverPassword, rest, err = quoted(rest); err != nil {
					return nil, fmt.Errorf("%w: line %d: server password of %q: %v", ErrUsersFile, line, name, err)
				}
			}
			if strings.TrimSpace(rest) != "" {
				return nil, fmt.Errorf("%w: line %d: unexpected text after the server login of %q", ErrUsersFile, line, name)
			}
			login = &Login{User: serverUser, Password: serverPassword}
		}
		if name == "" {
			return nil, fmt.Errorf("%w: line %d: empty user name", ErrUsersFile, line)
		}
		var s Secret
		switch {
		case strings.HasPrefix(secret, "SCRAM-SHA-256$"):
			if s, err = ParseSecret(secret); err != nil {
				return nil, fmt.Errorf("%w: line %d: password of %q: %v", ErrUsersFile, line, name, err)
			}
		case strings.HasPrefix(secret, "md5") && len(secret) == 35:
			return nil, fmt.Errorf("%w: line %d: password of %q is an MD5 hash; the proxy speaks SCRAM-SHA-256 only (give a SCRAM secret or a plain password)", ErrUsersFile, line, name)
		case secret == "":
			return nil, fmt.Errorf("%w: line %d: empty password for %q", ErrUsersFile, line, name)
		default:
			if s, err = NewSecret(secret, DefaultIterations); err != nil {
				return nil, err
			}
			if login == nil {
				login = &Login{User: name, Password: secret}
			}
		}
		u.Add(name, s)
		if login != nil {
			u.SetLogin(name, *login)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: line %d: %v", ErrUsersFile, line+1, err)
	}
	return u, nil
}

// quoted reads a double-quoted string at the start of s.
func quoted(s string) (string, string, error) {
	if !strings.HasPrefix(s, `"`) {
		return "", "", errors.New(`want a double-quoted string`)
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		if s[i] != '"' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '"' {
			b.WriteByte('"')
			i++
			continue
		}
		return b.String(), s[i+1:], nil
	}
	return "", "", errors.New("missing closing quote")
}

func hmacSHA256(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}
