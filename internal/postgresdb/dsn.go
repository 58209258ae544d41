package postgresdb

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// ErrBadDSN is wrapped by errors about a connection string that cannot be used.
var ErrBadDSN = errors.New("postgres: invalid DSN")

// redactedPassword replaces passwords in DSNs shown to people.
const redactedPassword = "xxxxx"

// keywordPassword matches password=... and sslpassword=... in a keyword/value DSN,
// quoted or not.
var keywordPassword = regexp.MustCompile(`(?i)((?:^|\s)(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)`)

func isURL(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// RedactDSN returns dsn with any password replaced by "xxxxx", for logs, errors and
// reports. It accepts both the URL form (postgres://user:pw@host/db) and the
// keyword/value form (host=h password=pw dbname=db).
func RedactDSN(dsn string) string {
	if !isURL(dsn) {
		pairs, err := parseKeywordValue(dsn)
		if err != nil {
			// Best effort on a string libpq would refuse anyway.
			return keywordPassword.ReplaceAllString(dsn, "${1}"+redactedPassword)
		}
		var b strings.Builder
		for i, p := range pairs {
			if i > 0 {
				b.WriteByte(' ')
			}
			switch {
			case strings.EqualFold(p.key, "password") || strings.EqualFold(p.key, "sslpassword"):
				b.WriteString(p.key + "=" + redactedPassword)
			case p.value == "" || strings.ContainsAny(p.value, spaces+`'\`):
				b.WriteString(p.key + "=" + quoteValue(p.value))
			default:
				b.WriteString(p.key + "=" + p.value)
			}
		}
		return b.String()
	}
	u, err := url.Parse(dsn)
	if err != nil {
		// Too broken to find the password reliably: show only the scheme.
		return dsn[:strings.Index(dsn, "://")+3] + "(unparsable DSN, redacted)"
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), redactedPassword)
		}
	}
	q := u.Query()
	changed := false
	for k := range q {
		if strings.EqualFold(k, "password") || strings.EqualFold(k, "sslpassword") {
			q.Set(k, redactedPassword)
			changed = true
		}
	}
	if changed {
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// WithDatabase returns dsn with its database name replaced by name; everything else
// (hosts, user, password, parameters) is kept. It accepts both DSN forms.
func WithDatabase(dsn, name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%w: empty database name", ErrBadDSN)
	}
	if !isURL(dsn) {
		pairs, err := parseKeywordValue(dsn)
		if err != nil {
			return "", fmt.Errorf("%w: %s: %v", ErrBadDSN, RedactDSN(dsn), err)
		}
		var b strings.Builder
		for _, p := range pairs {
			if p.key == "dbname" || p.key == "database" {
				continue
			}
			b.WriteString(p.key + "=" + quoteValue(p.value) + " ")
		}
		b.WriteString("dbname=" + quoteValue(name))
		return b.String(), nil
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return "", fmt.Errorf("%w: %s: cannot parse URL", ErrBadDSN, RedactDSN(dsn))
	}
	u.Path = "/" + name
	u.RawPath = ""
	q := u.Query()
	if q.Has("dbname") || q.Has("database") {
		q.Del("dbname")
		q.Del("database")
		u.RawQuery = q.Encode()
	}
	return u.String(), nil
}

type keywordValue struct{ key, value string }

const spaces = " \t\n\r\v\f"

// parseKeywordValue splits a keyword/value DSN ("host=h dbname='my db'") into its
// pairs, in order, with quotes and backslash escapes removed, reading it the way
// libpq and pgx do.
func parseKeywordValue(s string) ([]keywordValue, error) {
	var out []keywordValue
	s = strings.TrimLeft(s, spaces)
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return nil, errors.New("keyword without \"=\"")
		}
		key := strings.Trim(s[:eq], spaces)
		if key == "" || strings.ContainsAny(key, spaces) {
			return nil, fmt.Errorf("bad keyword %q", key)
		}
		s = strings.TrimLeft(s[eq+1:], spaces)
		var val strings.Builder
		if strings.HasPrefix(s, "'") {
			i := 1
			for ; i < len(s) && s[i] != '\''; i++ {
				if s[i] == '\\' {
					i++
					if i == len(s) {
						break
					}
				}
				val.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, errors.New("unterminated quoted value")
			}
			s = s[i+1:]
		} else {
			i := 0
			for ; i < len(s) && !strings.ContainsRune(spaces, rune(s[i])); i++ {
				if s[i] == '\\' {
					i++
					if i == len(s) {
						break // a trailing backslash is dropped
					}
				}
				val.WriteByte(s[i])
			}
			s = s[min(i, len(s)):]
		}
		out = append(out, keywordValue{key, val.String()})
		s = strings.TrimLeft(s, spaces)
	}
	return out, nil
}

// quoteValue quotes v for a keyword/value DSN.
func quoteValue(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
