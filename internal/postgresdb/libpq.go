package postgresdb

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
)

// libpqKeywords are the connection parameters libpq knows (PostgreSQL 15 to 18). pgx
// sends any other parameter of a DSN to the server as a setting (search_path, as a
// schema shard's DSN names it); libpq refuses it ("invalid URI query parameter").
var libpqKeywords = map[string]bool{
	"host": true, "hostaddr": true, "port": true, "dbname": true, "user": true, "password": true, "passfile": true,
	"channel_binding": true, "connect_timeout": true, "client_encoding": true, "options": true, "application_name": true,
	"fallback_application_name": true, "keepalives": true, "keepalives_idle": true, "keepalives_interval": true,
	"keepalives_count": true, "tcp_user_timeout": true, "replication": true, "gssencmode": true, "sslmode": true,
	"requiressl": true, "sslcompression": true, "sslcert": true, "sslkey": true, "sslpassword": true, "sslcertmode": true,
	"sslrootcert": true, "sslcrl": true, "sslcrldir": true, "sslsni": true, "sslnegotiation": true, "requirepeer": true,
	"ssl_min_protocol_version": true, "ssl_max_protocol_version": true, "min_protocol_version": true,
	"max_protocol_version": true, "krbsrvname": true, "gsslib": true, "gssdelegation": true, "service": true,
	"target_session_attrs": true, "load_balance_hosts": true, "require_auth": true,
}

// pgxOnly are parameters pgx itself reads that change nothing of the session: a
// libpq client leaves them out.
var pgxOnly = map[string]bool{
	"statement_cache_capacity": true, "description_cache_capacity": true, "default_query_exec_mode": true,
	"min_read_buffer_size": true, "krbspn": true,
}

// LibpqDSN turns a DSN written for pgx into one that libpq takes (pg_dump, psql, a
// subscription's CONNECTION): the settings pgx sends from its
// other parameters go into libpq's options as -c name=value, so that pg_dump and psql
// see the schema a search_path names. A URL stays a URL, its other parameters as
// written (several hosts, escapes); keyword=value pairs stay pairs.
func LibpqDSN(dsn string) (string, error) {
	if isURL(dsn) {
		// The parameters follow the first ? after the user info, which ends at the
		// first @ before any / (as pgx and libpq read it: a password may hold a ?).
		scheme, rest, _ := strings.Cut(dsn, "://")
		after := 0
		if i := strings.IndexAny(rest, "@/"); i >= 0 && rest[i] == '@' {
			after = i + 1
		}
		base, query := dsn, ""
		if i := strings.IndexByte(rest[after:], '?'); i >= 0 {
			base, query = scheme+"://"+rest[:after+i], rest[after+i+1:]
		}
		settings := map[string]string{}
		var kept []string
		options, hasOptions := "", false
		for _, kv := range strings.Split(query, "&") {
			if kv == "" {
				continue
			}
			rawKey, rawVal, _ := strings.Cut(kv, "=")
			// libpq decodes %XX, and reads + as itself.
			key, err1 := url.PathUnescape(rawKey)
			val, err2 := url.PathUnescape(rawVal)
			if err1 != nil || err2 != nil {
				return "", fmt.Errorf("%w: %s: its parameter %q is not escaped as a URL's: %w", ErrBadDSN, RedactDSN(dsn), rawKey, errors.Join(err1, err2))
			}
			switch {
			case key == "options":
				options, hasOptions = val, true
			case key == "database":
				kept = append(kept, "dbname="+rawVal)
			case libpqKeywords[key] || key == "ssl": // libpq reads ssl=true in a URL
				kept = append(kept, kv)
			case unsupported[key] != "":
				return "", fmt.Errorf("%w: its parameter %s cannot be given to libpq (pg_dump, psql, subscriptions): %s", ErrBadDSN, key, unsupported[key])
			case !pgxOnly[key]:
				settings[key] = val
			}
		}
		if len(settings) > 0 || hasOptions {
			escaped := strings.ReplaceAll(url.QueryEscape(withSettings(options, settings)), "+", "%20")
			kept = append(kept, "options="+escaped)
		}
		if len(kept) == 0 {
			return base, nil
		}
		return base + "?" + strings.Join(kept, "&"), nil
	}
	pairs, err := parseKeywordValue(dsn)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrBadDSN, RedactDSN(dsn), err)
	}
	settings := map[string]string{}
	var kept []keywordValue
	options := ""
	for _, p := range pairs {
		switch k := p.key; {
		case k == "options":
			options = p.value
		case k == "database":
			kept = append(kept, keywordValue{"dbname", p.value})
		case libpqKeywords[k]:
			kept = append(kept, p)
		case unsupported[k] != "":
			return "", fmt.Errorf("%w: its parameter %s cannot be given to libpq (pg_dump, psql, subscriptions): %s", ErrBadDSN, k, unsupported[k])
		case !pgxOnly[k]:
			settings[k] = p.value
		}
	}
	if opts := withSettings(options, settings); opts != "" {
		kept = append(kept, keywordValue{"options", opts})
	}
	var b strings.Builder
	for i, p := range kept {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(p.key + "=" + quoteValue(p.value))
	}
	return b.String(), nil
}

// unsupported are parameters pgx reads that libpq would read otherwise, or not at
// all: refused, with what to write instead.
var unsupported = map[string]string{
	"servicefile": "write the service's parameters into the DSN",
	"ssl":         "write sslmode instead", // in keyword=value form; a URL keeps it
}

// withSettings appends -c name=value to libpq's options for each setting, in name
// order, escaping what the server splits its options on.
func withSettings(options string, settings map[string]string) string {
	parts := []string{}
	if options != "" {
		parts = append(parts, options)
	}
	// The server splits its options on any white space that no backslash escapes.
	esc := strings.NewReplacer(`\`, `\\`, " ", `\ `, "\t", "\\\t", "\n", "\\\n", "\r", "\\\r", "\v", "\\\v", "\f", "\\\f")
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		parts = append(parts, "-c "+esc.Replace(k)+"="+esc.Replace(settings[k]))
	}
	return strings.Join(parts, " ")
}
