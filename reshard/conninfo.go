package reshard

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/shardlab/shardlab/rules"
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

// libpqConninfo turns a data source's DSN, written for pgx, into one that libpq takes
// (pg_dump, psql, and a subscription's CONNECTION): the settings pgx sends from its
// other parameters go into libpq's options as -c name=value, so that pg_dump and psql
// see the schema a search_path names. A URL stays a URL, its other parameters as
// written (several hosts, escapes); keyword=value pairs stay pairs.
func libpqConninfo(dsn string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
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
				return "", fmt.Errorf("the DSN's parameter %q is not escaped as a URL's: %w", kv, errors.Join(err1, err2))
			}
			switch {
			case key == "options":
				options, hasOptions = val, true
			case key == "database":
				kept = append(kept, "dbname="+rawVal)
			case libpqKeywords[key] || key == "ssl": // libpq reads ssl=true in a URL
				kept = append(kept, kv)
			case unsupported[key] != "":
				return "", fmt.Errorf("the DSN's parameter %s cannot be given to libpq (pg_dump, psql, subscriptions): %s", key, unsupported[key])
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
	pairs, err := keywordValues(dsn)
	if err != nil {
		return "", err
	}
	settings := map[string]string{}
	var kept [][2]string
	options := ""
	for _, kv := range pairs {
		switch k := kv[0]; {
		case k == "options":
			options = kv[1]
		case k == "database":
			kept = append(kept, [2]string{"dbname", kv[1]})
		case libpqKeywords[k]:
			kept = append(kept, kv)
		case unsupported[k] != "":
			return "", fmt.Errorf("the DSN's parameter %s cannot be given to libpq (pg_dump, psql, subscriptions): %s", k, unsupported[k])
		case !pgxOnly[k]:
			settings[k] = kv[1]
		}
	}
	if opts := withSettings(options, settings); opts != "" {
		kept = append(kept, [2]string{"options", opts})
	}
	var b strings.Builder
	for i, kv := range kept {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(kv[0] + "='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(kv[1]) + "'")
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

// keywordValues splits a keyword=value connection string as libpq reads it: values
// bare or in single quotes, with backslash escapes.
func keywordValues(s string) ([][2]string, error) {
	var out [][2]string
	isSpace := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' }
	i := 0
	skip := func() {
		for i < len(s) && isSpace(s[i]) {
			i++
		}
	}
	for skip(); i < len(s); skip() {
		start := i
		for i < len(s) && s[i] != '=' && !isSpace(s[i]) {
			i++
		}
		key := s[start:i]
		skip()
		if key == "" || i >= len(s) || s[i] != '=' {
			return nil, fmt.Errorf("the DSN is not a connection string libpq can read: missing \"=\" after %q", key)
		}
		i++
		skip()
		var val strings.Builder
		quoted := i < len(s) && s[i] == '\''
		if quoted {
			i++
		}
		for ; i < len(s); i++ {
			c := s[i]
			if quoted && c == '\'' || !quoted && isSpace(c) {
				break
			}
			if c == '\\' && i+1 < len(s) {
				i++
				c = s[i]
			}
			val.WriteByte(c)
		}
		if quoted {
			if i >= len(s) {
				return nil, fmt.Errorf("the DSN is not a connection string libpq can read: unterminated quoted value of %q", key)
			}
			i++
		}
		out = append(out, [2]string{key, val.String()})
	}
	return out, nil
}

// searchSchema is the first schema data source ds's DSN names in its search_path (a
// schema shard's), or "" when it names none.
func searchSchema(l *rules.Compiled, ds string) string {
	cfg, err := pgconn.ParseConfig(fromDSN(l, ds))
	if err != nil {
		return ""
	}
	first, _, _ := strings.Cut(cfg.RuntimeParams["search_path"], ",")
	first = strings.TrimSpace(first)
	if len(first) >= 2 && first[0] == '"' && first[len(first)-1] == '"' {
		return strings.ReplaceAll(first[1:len(first)-1], `""`, `"`)
	}
	return strings.ToLower(first)
}

// broadcastSource is where broadcast table name is copied from to data source dst of
// layout to: a data source of from whose DSN names the schema dst's does (logical
// replication carries a table into the one of the same schema and name), else the
// first that has the table.
func broadcastSource(from, to *rules.Compiled, name, dst string) Place {
	nodes := from.Lookup(name).Nodes
	want := searchSchema(to, dst)
	for _, n := range nodes {
		if at := place(from, n); searchSchema(from, at.DataSource) == want {
			return at
		}
	}
	return place(from, nodes[0])
}
