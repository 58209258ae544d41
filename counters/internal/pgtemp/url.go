package pgtemp

import (
	"net/url"
	"strings"
)

// parseURL returns the parsed DSN if it is in URL form, or nil.
func parseURL(dsn string) (*url.URL, error) {
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return nil, nil
	}
	return url.Parse(dsn)
}
