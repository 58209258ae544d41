// Package admin is the proxy's view of itself: the admin database, which answers
// pgbouncer-style SHOW commands and a route preview over the wire, and the Prometheus
// collector behind /metrics. Both read the same snapshots: the pools' counters and the
// number of clients.
package admin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/proxy/router"
	"github.com/shardlab/shardlab/rules"
)

// Admin answers the admin database's statements. It is safe for concurrent use.
type Admin struct {
	router  *router.Router
	clients func() int
	reshard func(ctx context.Context, c Reshard) (*Result, error)
	// resharding reports whether a RESHARD command is running: PAUSE and RESUME are
	// refused meanwhile (its hold is a pause).
	resharding func() bool
}

// maxVerify bounds RESHARD CUTOVER's VERIFY: the comparison is a pause.
const maxVerify = time.Hour

// Reshard is a RESHARD command of the console, checked.
type Reshard struct {
	Verb string // CUTOVER, FINISH or REVERT
	// Rules is CUTOVER's target rules file.
	Rules string
	// Verify is CUTOVER's bound on comparing the destinations with the sources in
	// its hold (VERIFY seconds; 0: no comparison).
	Verify time.Duration
	// Rate is FINISH's bound on the delete, in rows a second (0: none).
	Rate int
}

// SetReshard sets what carries out RESHARD CUTOVER 'rules file' [VERIFY seconds],
// RESHARD FINISH [rate] and RESHARD REVERT, and what says whether one is running.
func (a *Admin) SetReshard(f func(ctx context.Context, c Reshard) (*Result, error), running func() bool) {
	a.reshard, a.resharding = f, running
}

// New returns an admin over r; clients reports the number of client sessions.
func New(r *router.Router, clients func() int) *Admin {
	return &Admin{router: r, clients: clients}
}

// Column types of answers.
const (
	Text   = 25
	Bigint = 20
)

// Result is an answer: columns (name and type OID), rows of text values, command tag.
type Result struct {
	Columns []string
	Types   []uint32
	Rows    [][]string
	Tag     string
}

func result(tag string, cols ...any) *Result {
	r := &Result{Tag: tag}
	for i := 0; i < len(cols); i += 2 {
		r.Columns = append(r.Columns, cols[i].(string))
		r.Types = append(r.Types, uint32(cols[i+1].(int)))
	}
	return r
}

// Help lists the commands.
const Help = `SHOW POOLS      server connections per data source (pgbouncer's columns)
SHOW DATABASES  the data sources
SHOW CLIENTS    how many client sessions there are
SHOW ROUTE sql  where a statement (values inline) would run: targets, rewritten SQL, merge
SHOW TWO_PHASE  two-phase transactions in doubt (how many, the oldest's age) and what the settler did
SHOW COORDINATOR the statements the coordinator database answered, and the rows and bytes they
                read from the shards (in all, and the last one's)
SHOW PAUSE      whether the proxy is paused, and how many clients are in a transaction (or hold
                server connections between them)
PAUSE [seconds] holds every client's next transaction (or statement outside one) and waits, up to
                seconds (default 30), until the transactions in progress end; if they do not, the
                pause is lifted and PAUSE fails
RESUME          ends the pause: the held clients go on
SHOW LAYOUT     the layout the proxy routes by: its digest, data sources, and the views a
                resharding move reads through between its cutover and its finish
RESHARD CUTOVER 'file' [VERIFY seconds]  switches to the target rules of the move under way
                (reshard start): holds new transactions on sharded and broadcast tables (others
                go on), lets those in flight end, waits until
                the new data sources caught up, switches, releases the held transactions; with
                VERIFY, compares the new data sources with the old in the hold, within that
                many seconds counted as pause (a difference gives the cutover up)
RESHARD FINISH [rows per second]  ends a move that was cut over: deletes the moved rows from
                where they were (at most that many a second on each data source), drops the
                views, streams and slots
RESHARD REVERT  returns a move that was cut over, and not finished, to the layout it came from,
                with the writes made since (the streams back): a hold as the cutover's, then
                removes what the move made
SHOW HELP       this list`

// Answer runs one admin statement.
func (a *Admin) Answer(ctx context.Context, sql string) (*Result, error) {
	q := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(sql), ";"))
	words := strings.Fields(q)
	if len(words) >= 1 && (strings.EqualFold(words[0], "PAUSE") || strings.EqualFold(words[0], "RESUME")) && a.resharding != nil && a.resharding() {
		return nil, &pgconn.PgError{Severity: "ERROR", Code: "55006", Message: "a RESHARD command is running, and its hold is a pause: " + strings.ToUpper(words[0]) + " waits until it ends"}
	}
	switch {
	case len(words) >= 1 && len(words) <= 2 && strings.EqualFold(words[0], "PAUSE"):
		return a.pause(ctx, words[1:])
	case len(words) >= 2 && strings.EqualFold(words[0], "RESHARD") && a.reshard != nil:
		verb := strings.ToUpper(words[1])
		arg := strings.TrimSpace(q[strings.Index(strings.ToUpper(q), verb)+len(verb):])
		if verb == "CUTOVER" {
			c, ok := parseCutover(arg)
			if !ok {
				return nil, &pgconn.PgError{Severity: "ERROR", Code: "42601", Message: "RESHARD CUTOVER takes the target rules file, quoted, and optionally VERIFY and a bound in seconds (0.001 to 3600): RESHARD CUTOVER '/path/to/rules.toml' [VERIFY 30]"}
			}
			return a.reshard(ctx, c)
		}
		if verb == "FINISH" && arg != "" {
			n, err := strconv.Atoi(arg)
			if err != nil || n <= 0 {
				return nil, &pgconn.PgError{Severity: "ERROR", Code: "42601", Message: "RESHARD FINISH takes a bound on the delete in rows a second, a positive integer: RESHARD FINISH 50000"}
			}
			return a.reshard(ctx, Reshard{Verb: verb, Rate: n})
		}
		if arg != "" {
			return nil, unknown(q)
		}
		return a.reshard(ctx, Reshard{Verb: verb})
	case len(words) == 1 && strings.EqualFold(words[0], "RESUME"):
		if err := a.router.Current().Resume(); err != nil {
			return nil, &pgconn.PgError{Severity: "ERROR", Code: "55000", Message: "the proxy is not paused"}
		}
		return &Result{Tag: "RESUME"}, nil
	}
	if len(words) < 2 || !strings.EqualFold(words[0], "SHOW") {
		return nil, unknown(q)
	}
	switch strings.ToUpper(words[1]) {
	case "POOLS":
		return a.pools(), nil
	case "DATABASES":
		return a.databases(), nil
	case "CLIENTS":
		r := result("SHOW", "clients", Bigint)
		r.Rows = [][]string{{strconv.Itoa(a.clients())}}
		return r, nil
	case "TWO_PHASE":
		return a.twoPhase(), nil
	case "COORDINATOR":
		return a.coordinator(), nil
	case "LAYOUT":
		return a.layout(), nil
	case "PAUSE":
		paused, active := a.router.Current().Paused()
		r := result("SHOW", "paused", Text, "clients_in_transactions", Bigint)
		r.Rows = [][]string{{map[bool]string{true: "yes", false: "no"}[paused], strconv.Itoa(active)}}
		return r, nil
	case "HELP":
		r := result("SHOW", "command", Text)
		for line := range strings.SplitSeq(Help, "\n") {
			r.Rows = append(r.Rows, []string{line})
		}
		return r, nil
	case "ROUTE":
		// The statement is what follows the keyword ROUTE, as written.
		i := strings.Index(strings.ToUpper(q), "ROUTE")
		text, err := a.router.Current().Route(ctx, strings.TrimSpace(q[i+len("ROUTE"):]))
		if err != nil {
			return nil, err
		}
		r := result("SHOW", "route", Text)
		for line := range strings.SplitSeq(strings.TrimRight(text, "\n"), "\n") {
			r.Rows = append(r.Rows, []string{line})
		}
		return r, nil
	}
	return nil, unknown(q)
}

// pause carries out PAUSE [seconds].
func (a *Admin) pause(ctx context.Context, args []string) (*Result, error) {
	wait := 30 * time.Second
	if len(args) == 1 {
		secs, err := strconv.ParseFloat(args[0], 64)
		if err != nil || secs <= 0 || secs > 3600 {
			return nil, &pgconn.PgError{Severity: "ERROR", Code: "22023", Message: fmt.Sprintf("PAUSE takes a number of seconds from 0 to 3600, got %q", args[0])}
		}
		wait = time.Duration(secs * float64(time.Second))
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := a.router.Current().Pause(ctx); err != nil {
		if errors.Is(err, router.ErrPaused) {
			return nil, &pgconn.PgError{Severity: "ERROR", Code: "55000", Message: "the proxy is paused already (RESUME ends it)"}
		}
		if errors.Is(err, router.ErrNotPaused) {
			return nil, &pgconn.PgError{Severity: "ERROR", Code: "57014", Message: "PAUSE ended by a RESUME before the transactions in progress had ended"}
		}
		return nil, &pgconn.PgError{Severity: "ERROR", Code: "57014", Message: "PAUSE gave up: " + err.Error()}
	}
	return &Result{Tag: "PAUSE"}, nil
}

// layout answers SHOW LAYOUT.
func (a *Admin) layout() *Result {
	l := a.router.Current().Rules()
	r := result("SHOW", "item", Text, "value", Text)
	r.Rows = append(r.Rows, []string{"digest", l.Digest()})
	for _, d := range l.DataSources() {
		r.Rows = append(r.Rows, []string{"data_source", d.Name})
	}
	names := l.TableNames()
	keys := slices.SortedFunc(maps.Keys(names), func(a, b rules.TableAt) int {
		return cmp.Or(cmp.Compare(a.DataSource, b.DataSource), cmp.Compare(a.Table, b.Table))
	})
	for _, k := range keys {
		r.Rows = append(r.Rows, []string{"view", k.DataSource + "." + k.Table + " -> " + names[k]})
	}
	return r
}

func unknown(q string) error {
	return &pgconn.PgError{Severity: "ERROR", Code: "42601",
		Message: fmt.Sprintf("unknown admin command %q; SHOW HELP lists them", q)}
}

// pools answers SHOW POOLS with pgbouncer's columns, one row per pool (a data source
// and the server user its connections log in as), and three of the proxy's own at the
// end. cl_active counts the clients holding one of its connections,
// cl_waiting those waiting for one or for a turn to take one (--max-transactions).
// cl_pinned counts the clients that keep a connection between transactions because
// their session holds state that lives there (a temporary table, a session advisory
// lock); sv_resets and sv_state_checks what keeping clients apart cost (see
// backend.Stats).
func (a *Admin) pools() *Result {
	r := result("SHOW", "database", Text, "user", Text, "cl_active", Bigint, "cl_waiting", Bigint,
		"cl_active_cancel_req", Bigint, "cl_waiting_cancel_req", Bigint, "sv_active", Bigint,
		"sv_active_cancel", Bigint, "sv_being_canceled", Bigint, "sv_idle", Bigint, "sv_used", Bigint,
		"sv_tested", Bigint, "sv_login", Bigint, "maxwait", Bigint, "maxwait_us", Bigint, "pool_mode", Text,
		"cl_pinned", Bigint, "sv_resets", Bigint, "sv_state_checks", Bigint)
	i := strconv.FormatInt
	for _, st := range a.allStats() {
		r.Rows = append(r.Rows, []string{st.DataSource, st.User, i(st.InUse, 10), i(st.Waiting+st.TurnWaiting, 10), "0", "0",
			i(st.InUse, 10), "0", "0", i(st.Idle, 10), "0", "0", "0", "0", "0", a.router.Current().Mode().String(),
			i(st.Pinned, 10), i(st.Resets, 10), i(st.StateChecks, 10)})
	}
	return r
}

// databases answers SHOW DATABASES: each data source, where it is (no password), and
// its pools' counters, summed over the server users.
func (a *Admin) databases() *Result {
	r := result("SHOW", "name", Text, "host", Text, "port", Text, "database", Text, "schema", Text,
		"pool_size", Bigint, "pool_mode", Text, "opened", Bigint, "closed", Bigint, "checkout_timeouts", Bigint)
	dss := a.router.Current().Rules().DataSources()
	sums := a.stats()
	for _, st := range a.allStats()[len(sums):] {
		for k := range sums {
			if sums[k].DataSource == st.DataSource {
				sums[k].Opened += st.Opened
				sums[k].Closed += st.Closed
				sums[k].Timeouts += st.Timeouts
			}
		}
	}
	for k, st := range sums {
		host, port, db, schema := "", "", "", ""
		if u, err := url.Parse(dss[k].DSN); err == nil {
			host, port, db = u.Hostname(), u.Port(), strings.TrimPrefix(u.Path, "/")
			schema = u.Query().Get("search_path")
		}
		r.Rows = append(r.Rows, []string{st.DataSource, host, port, db, schema, strconv.Itoa(st.Size),
			a.router.Current().Mode().String(), strconv.FormatInt(st.Opened, 10), strconv.FormatInt(st.Closed, 10),
			strconv.FormatInt(st.Timeouts, 10)})
	}
	return r
}

// twoPhase answers SHOW TWO_PHASE: one row of the settler's counters (see
// sqlexec.SettleStats). in_doubt counts the transactions prepared and not yet finished
// as of the settler's last pass, and those commits left since; oldest_in_doubt_ms is
// the age of the oldest. Without --two-phase the row says off, with zeros.
func (a *Admin) twoPhase() *Result {
	r := result("SHOW", "two_phase", Text, "in_doubt", Bigint, "oldest_in_doubt_ms", Bigint, "committed", Bigint,
		"rolled_back", Bigint, "retried", Bigint, "passes", Bigint, "failed_passes", Bigint,
		"unreachable_data_sources", Bigint, "interval_ms", Bigint, "last_pass_ms_ago", Bigint)
	s := a.router.Current().Settler()
	if s == nil {
		r.Rows = [][]string{{"off", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0"}}
		return r
	}
	st := s.Stats()
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	ago := int64(-1)
	if !st.LastPass.IsZero() {
		ago = time.Since(st.LastPass).Milliseconds()
	}
	r.Rows = [][]string{{"on", i(int64(st.InDoubt)), i(st.OldestInDoubt.Milliseconds()), i(st.Committed), i(st.RolledBack),
		i(st.Retried), i(st.Passes), i(st.FailedPasses), i(int64(st.Unreachable)), i(st.Interval.Milliseconds()), i(ago)}}
	return r
}

// coordinator answers SHOW COORDINATOR: one row of the coordinator's counters (see
// router.CoordinatorStats); without --coordinator the row says off, with zeros.
func (a *Admin) coordinator() *Result {
	r := result("SHOW", "coordinator", Text, "statements", Bigint, "rows_moved", Bigint, "bytes_moved", Bigint,
		"last_rows_moved", Bigint, "last_bytes_moved", Bigint, "stopped_past_bound", Bigint, "max_moved_bytes", Bigint)
	st, ok := a.router.Current().CoordinatorStats()
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	on := map[bool]string{true: "on", false: "off"}[ok]
	r.Rows = [][]string{{on, i(st.Statements), i(st.Rows), i(st.Bytes), i(st.LastRows), i(st.LastBytes), i(st.Cut), i(st.MaxMoved)}}
	return r
}

// stats returns the data sources' own user's pools, in data source order.
func (a *Admin) stats() []backend.Stats {
	var out []backend.Stats
	for _, p := range a.router.Current().Pools() {
		out = append(out, p.Stats())
	}
	return out
}

// allStats returns every pool's: the data sources' own user's, then other logins'.
func (a *Admin) allStats() []backend.Stats {
	var out []backend.Stats
	for _, p := range a.router.Current().AllPools() {
		out = append(out, p.Stats())
	}
	return out
}

// parseCutover reads RESHARD CUTOVER's arguments: a quoted rules file (a quote in it
// doubled, as in an SQL string), then nothing or VERIFY and a number of seconds from
// a millisecond to maxVerify.
func parseCutover(arg string) (Reshard, bool) {
	c := Reshard{Verb: "CUTOVER"}
	rest, ok := strings.CutPrefix(arg, "'")
	if !ok {
		return c, false
	}
	var path strings.Builder
	for {
		i := strings.IndexByte(rest, '\'')
		if i < 0 {
			return c, false
		}
		path.WriteString(rest[:i])
		rest = rest[i+1:]
		if !strings.HasPrefix(rest, "'") {
			break
		}
		path.WriteByte('\'')
		rest = rest[1:]
	}
	if c.Rules = path.String(); c.Rules == "" {
		return c, false
	}
	words := strings.Fields(rest)
	switch {
	case len(words) == 0:
		return c, true
	case len(words) == 2 && strings.EqualFold(words[0], "VERIFY"):
		secs, err := strconv.ParseFloat(words[1], 64)
		if err != nil || !(secs <= maxVerify.Seconds()) {
			return c, false
		}
		c.Verify = time.Duration(secs * float64(time.Second))
		return c, c.Verify >= time.Millisecond
	}
	return c, false
}
