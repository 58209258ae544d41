package postgres

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
		return keywordPassword.ReplaceAllString(dsn, "${1}"+redactedPassword)
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
		// In the keyword/value form the last setting of a keyword wins (libpq and pgx
		// agree), so appending is enough and never disturbs quoted values.
		quoted := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(name)
		return strings.TrimSpace(dsn) + " dbname='" + quoted + "'", nil
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
