package coordinator

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// What a client of the coordinator database sees, the same through every adapter (the
// wire proxy, the database/sql driver): a statement cut off for what it moved, and the
// coordinator's errors judged against one database.

// RelayHost returns the address of this machine that the server of dsn reaches it by:
// the relay listens there. A server on a Unix socket is this machine's: loopback.
func RelayHost(dsn string) (string, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "", err
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return "127.0.0.1", nil
	}
	c, err := net.Dial("udp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	if err != nil {
		return "", fmt.Errorf("no route to the coordinator's server %s: %v", cfg.Host, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}

// MovedError is the failure of a statement that read more than bound bytes from the
// shards and was cut off (Movement.Exceeded); setting names how the user raises the
// bound (a flag, a configuration field).
func MovedError(m *Movement, bound int64, setting string) error {
	return &pgconn.PgError{Severity: "ERROR", Code: "54000",
		Message: fmt.Sprintf("shardlab: the statement read more than %s from the shards into the coordinator database (%s)", ByteSize(bound), setting),
		Detail:  fmt.Sprintf("It was stopped after %d rows, %d bytes.", m.Rows(), m.Bytes()),
		Hint:    fmt.Sprintf("Narrow the statement (a condition the shards can apply), pin it to one shard, or raise the bound (%s).", setting)}
}

// ByteSize writes a bound in the largest unit that keeps it whole.
func ByteSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// ClientError decides what a client sees of err, the error the coordinator database
// gave a statement the merge refused (why) over tables. An error of the statement's
// analysis (SQLSTATE class 42: an unknown column, a grouping error) may be the
// coordinator's own: its tables have no keys, so a GROUP BY a primary key is not one
// there, and its database has none of the shards' functions and types. oneDatabase
// then analyses the statement as one database would (logical says whether the default
// data source holds every table it names under its logical name; see
// sqlexec.OneDatabase), and reports whether it could: that database's error is the
// client's answer, and when it accepts the statement, or none could analyse it, the
// coordinator's failure is a refusal (0A000), never an error one database would not
// raise. An error of the
// coordinator's own making (its login to a shard) is a refusal too. Other errors (a
// division by zero, a cancel, an unreachable shard) are the statement's.
func (c *Coordinator) ClientError(why string, tables []string, err error, oneDatabase func(logical bool) (analysed bool, err error)) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	cannot := func() error {
		detail := pe.Code + ": " + pe.Message
		for _, t := range tables {
			if reason, ok := c.Skipped()[t]; ok {
				detail = fmt.Sprintf("table %s is not in the coordinator database: %s", t, reason)
			}
		}
		return sqlplan.Unsupported("%s; the coordinator database could not answer it as one database would (%s)", why, detail)
	}
	switch {
	case pe.Code == "2F003" || pe.Code == "28000" || pe.Code == "28P01":
		return cannot() // the coordinator's login to a shard
	case !strings.HasPrefix(pe.Code, "42"):
		return err
	}
	analysed, oneDB := oneDatabase(namesLogical(c.rules, tables, c.rules.DefaultDataSource()))
	var one *pgconn.PgError
	if analysed && errors.As(oneDB, &one) && one.Code != "42P18" {
		return oneDB
	}
	return cannot()
}

// namesLogical reports whether data source ds holds every table of names under its
// logical name, so that a statement naming them means there what it means to the
// client.
func namesLogical(r *rules.Compiled, names []string, ds int) bool {
	for _, name := range names {
		t := r.Lookup(name)
		if t == nil || t.Kind != rules.KindSharded && t.Kind != rules.KindBroadcast {
			continue
		}
		found := false
		for _, n := range t.Nodes {
			if n.DataSource == ds && n.Table == name && n.Schema == "" {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// CarriesSetting reports whether the coordinator's sessions take a setting of a
// client (or of the data sources' connection strings) as it is: how values are
// written and read, limits and planner choices. Any other (search_path, a role,
// postgres_fdw.*, default_transaction_read_only, custom settings) would reach the
// coordinator's own schemas or its reading of the shards there.
func CarriesSetting(name string) bool {
	switch name {
	case "datestyle", "timezone", "intervalstyle", "extra_float_digits", "lc_monetary", "lc_numeric", "lc_time",
		"bytea_output", "client_encoding", "standard_conforming_strings", "application_name", "client_min_messages",
		"statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout", "work_mem", "hash_mem_multiplier",
		"xmloption", "xmlbinary", "jit", "geqo", "from_collapse_limit", "join_collapse_limit", "random_page_cost",
		"seq_page_cost", "cpu_tuple_cost", "max_parallel_workers_per_gather", "default_text_search_config":
		return true
	}
	return strings.HasPrefix(name, "enable_")
}

// carriedOptions splits a connection string's options ("-c name=value --name=value
// ...", as PostgreSQL reads them at startup) into what the coordinator's sessions
// take: the settings it carries, written again as options, and the first other
// setting (search_path aside: a data source's schema is the layout's, and the
// coordinator reads each shard in its own), which it cannot.
func carriedOptions(options string) (kept, other string) {
	var out []string
	fields := splitOptions(options)
	for i := 0; i < len(fields); i++ {
		f := fields[i]
		var setting string
		switch {
		case f == "-c" && i+1 < len(fields):
			i++
			setting = fields[i]
		case strings.HasPrefix(f, "-c") && len(f) > 2:
			setting = f[2:]
		case strings.HasPrefix(f, "--") && len(f) > 2:
			setting = f[2:]
		default:
			if other == "" {
				other = f
			}
			continue
		}
		name, _, _ := strings.Cut(setting, "=")
		name = strings.ToLower(strings.ReplaceAll(name, "-", "_"))
		switch {
		case name == "search_path":
		case CarriesSetting(name):
			out = append(out, "-c "+escapeOption(setting))
		case other == "":
			other = name
		}
	}
	return strings.Join(out, " "), other
}

// splitOptions splits a startup packet's options as PostgreSQL does: at blanks, a
// backslash taking the next character as it is (an escaped blank stays in its word).
func splitOptions(s string) []string {
	var out []string
	var word strings.Builder
	in := false
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '\\' && i+1 < len(s):
			i++
			word.WriteByte(s[i])
			in = true
		case ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r':
			if in {
				out = append(out, word.String())
				word.Reset()
				in = false
			}
		default:
			word.WriteByte(ch)
			in = true
		}
	}
	if in {
		out = append(out, word.String())
	}
	return out
}

// escapeOption writes a word of the options again, its blanks and backslashes escaped.
func escapeOption(w string) string {
	var b strings.Builder
	for i := 0; i < len(w); i++ {
		if c := w[i]; c == '\\' || c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			b.WriteByte('\\')
		}
		b.WriteByte(w[i])
	}
	return b.String()
}
