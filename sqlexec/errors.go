package sqlexec

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// unsupported refuses what a merge cannot answer exactly (see sqlplan.Unsupported).
var unsupported = sqlplan.Unsupported

func pgErr(code, format string, args ...any) *pgconn.PgError {
	return &pgconn.PgError{Severity: "ERROR", Code: code, Message: fmt.Sprintf(format, args...)}
}

// ShardError is an error from one data source, naming it. It wraps what the data source
// said, so errors.As finds a *pgconn.PgError with the server's SQLSTATE.
type ShardError struct {
	DataSource int    // index in the rules
	Name       string // the data source's name in the rules
	Err        error
}

func (e *ShardError) Error() string { return fmt.Sprintf("data source %s: %v", e.Name, e.Err) }

// Unwrap returns the data source's error.
func (e *ShardError) Unwrap() error { return e.Err }

// SQLState returns the SQLSTATE a client should see: the server's when it sent one,
// 08006 (connection failure) when the data source could not be reached or dropped the
// connection.
func (e *ShardError) SQLState() string {
	var pe *pgconn.PgError
	if errors.As(e.Err, &pe) {
		switch pe.Code {
		case "57P01", "57P02", "57P03": // the server is shutting down or starting: it is down
			return "08006"
		}
		return pe.Code
	}
	return "08006"
}

// LogicalNames returns err as a client of the logical tables should see it: where a
// server's error names a physical table whose name differs from its logical table's
// (rules.Compiled.LogicalName: items_0 for items), it names the logical one, in the
// error's table and constraint fields and in the quoted names of its message, as one
// database would. A constraint or index name that PostgreSQL made from the physical
// table's (items_0_pkey) is made from the logical one's (items_pkey). Only errors of
// integrity constraints (class 23) and of a statement's analysis (class 42) have their
// message changed: others may quote the client's values, which stay as they are, and
// so does every error's detail but the text after the values of an integrity error's
// (the table a foreign key references). err is returned unchanged when nothing is renamed.
func LogicalNames(err error, r *rules.Compiled) error {
	var pe *pgconn.PgError
	if r == nil || !errors.As(err, &pe) {
		return err
	}
	var tables []string // physical names seen, each followed by its logical name
	logical := func(name string) (string, bool) {
		for i := 0; i < len(tables); i += 2 {
			if tables[i] == name {
				return tables[i+1], true
			}
		}
		l, ok := r.LogicalName(name)
		if ok {
			tables = append(tables, name, l)
		}
		return l, ok
	}
	// rename renames a table, a table's column (items_0.id), or a constraint or index
	// named after a table (items_0_pkey) once that table is known.
	rename := func(name string, constraint bool) string {
		if l, ok := logical(name); ok {
			return l
		}
		if table, col, ok := strings.Cut(name, "."); ok {
			if l, ok := logical(table); ok {
				return l + "." + col
			}
		}
		for i := 0; constraint && i < len(tables); i += 2 {
			if rest, ok := strings.CutPrefix(name, tables[i]+"_"); ok {
				return tables[i+1] + "_" + rest
			}
		}
		return name
	}
	out := *pe
	out.TableName = rename(pe.TableName, false)
	class := pe.Code[:min(2, len(pe.Code))]
	if class == "23" || class == "42" {
		out.Message = renameQuoted(pe.Message, rename)
	}
	if class == "42" {
		// "Perhaps you meant to reference the column "items_0.id"."
		out.Hint = renameQuoted(pe.Hint, rename)
	}
	out.ConstraintName = rename(pe.ConstraintName, true) // after the table's name is known
	if class == "23" {
		// A foreign key's detail names the referenced table after the key's values:
		// "Key (k)=(v) is not present in table "orders_1"." Only the text after the
		// values is the server's own.
		// Without the values (a client that may not read the columns), all of it is.
		i := strings.LastIndexByte(pe.Detail, ')')
		out.Detail = pe.Detail[:i+1] + renameQuoted(pe.Detail[i+1:], rename)
	}
	if out.TableName == pe.TableName && out.ConstraintName == pe.ConstraintName && out.Message == pe.Message && out.Detail == pe.Detail && out.Hint == pe.Hint {
		return err
	}
	return &renamedError{client: &out, server: pe, err: err}
}

// renameQuoted applies rename to the double-quoted names of msg that the word before
// says are relations or constraints, as PostgreSQL's messages quote them: at the start
// of the message or after "relation", "table", "table name", "table reference", "view"
// or "sequence" a table's name, after "constraint" or
// "index" a constraint's (the constraint flag), and after "column" only a column
// qualified by its table (items_0.id). Other quoted names are the client's: a column
// named like a physical table (player_1), a value, a type. It runs twice, so that a
// constraint quoted before its table is renamed once the table is known.
func renameQuoted(msg string, rename func(name string, constraint bool) string) string {
	pass := func(msg string) string {
		var b strings.Builder
		for {
			i := strings.IndexByte(msg, '"')
			if i < 0 {
				b.WriteString(msg)
				return b.String()
			}
			j := strings.IndexByte(msg[i+1:], '"')
			if j < 0 {
				b.WriteString(msg)
				return b.String()
			}
			name := msg[i+1 : i+1+j]
			before := strings.TrimSuffix(msg[:i], " ")
			word := before[strings.LastIndexByte(before, ' ')+1:]
			if word == "name" || word == "reference" {
				// "table name "items_0" specified more than once", "table reference
				// "items_0" is ambiguous"; not a column reference.
				if rest := strings.TrimSuffix(before, word); strings.HasSuffix(rest, "table ") {
					word = "table"
				}
			}
			if i == 0 {
				word = "relation" // ""items_0" is not a view"
			}
			switch word {
			case "relation", "table", "view", "sequence":
				name = rename(name, false)
			case "constraint", "index":
				name = rename(name, true)
			case "column":
				if strings.Contains(name, ".") {
					name = rename(name, false)
				}
			}
			b.WriteString(msg[:i+1])
			b.WriteString(name)
			b.WriteByte('"')
			msg = msg[i+2+j:]
		}
	}
	return pass(pass(msg))
}

// renamedError is a server's error as the client sees it (logical names, LogicalNames;
// a position in the client's text, AtClient): errors.As finds the client's
// *pgconn.PgError first, and the original chain (a ShardError) after it.
type renamedError struct {
	client *pgconn.PgError
	server *pgconn.PgError // the one err holds
	err    error
}

// Error is the text of err, which names its data source and what went before, with the
// server's error renamed.
func (e *renamedError) Error() string {
	return strings.Replace(e.err.Error(), e.server.Error(), e.client.Error(), 1)
}

func (e *renamedError) Unwrap() []error { return []error{e.client, e.err} }

// MissingElsewhere judges an error of a statement's description on data source ds:
// when it says a table does not exist (42P01) and the rules place that table elsewhere
// (a default data source's table, beside shards of another), it returns the data source
// where they place it and the table's name there, for the caller to look for it
// (TableExists): a table missing there too is missing on one database, and its 42P01
// is the statement's; a table found there is one the statement names beside tables ds
// holds, which no one data source holds (NotHeld). ok is false for any other error,
// and for a table the rules place on ds, whose absence there is one database's error.
func MissingElsewhere(r *rules.Compiled, ds int, err error) (other int, table string, ok bool) {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42P01" {
		return 0, "", false
	}
	rest, quoted := strings.CutPrefix(pe.Message, `relation "`)
	name, quoted2 := strings.CutSuffix(rest, `" does not exist`)
	if !quoted || !quoted2 {
		return 0, "", false
	}
	if l, renamed := r.LogicalName(name); renamed {
		name = l
	}
	nodes := r.Placement(name).Nodes
	if len(nodes) == 0 || slices.ContainsFunc(nodes, func(n rules.Node) bool { return n.DataSource == ds }) {
		return 0, "", false
	}
	return nodes[0].DataSource, nodes[0].Table, true
}

// TableExists reports whether conn's server has the table named, as an error named it
// (a bare name is an identifier as written, a qualified one is read as SQL).
func TableExists(ctx context.Context, conn *pgconn.PgConn, table string) (bool, error) {
	res := conn.ExecParams(ctx, "SELECT to_regclass(CASE WHEN strpos($1, '.') > 0 THEN $1 ELSE quote_ident($1) END) IS NOT NULL",
		[][]byte{[]byte(table)}, []uint32{25}, nil, nil).Read()
	if res.Err != nil {
		return false, res.Err
	}
	return len(res.Rows) == 1 && string(res.Rows[0][0]) == "t", nil
}

// NotHeld is the refusal of a statement whose description on data source ds found no
// table that another data source holds (err, its 42P01; see MissingElsewhere): one
// database, holding every table, would describe it, and no one data source can.
func NotHeld(r *rules.Compiled, ds int, err error) error {
	var pe *pgconn.PgError
	if !errors.As(LogicalNames(err, r), &pe) {
		return err
	}
	return unsupported("a statement over tables that no one data source holds, which the coordinator database does not answer here (off, or not for such a statement): on data source %s, which holds its sharded tables, %s",
		sourceName(r, ds), pe.Message)
}

// AnalysisError returns the error of a statement's description (err) that PostgreSQL
// gives when it parses the statement, at Parse or at a driver's Prepare: its analysis
// (classes 42 and 22), a missing table included, since a description reports one only
// where one database would (see MissingElsewhere). Otherwise nil: the execution that
// needs the description reports it (a refusal, a data source out of reach).
func AnalysisError(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "42") || strings.HasPrefix(pe.Code, "22")) {
		return err
	}
	return nil
}

// JudgeDescription judges the error of a statement's description on data source ds:
// genuine when one database would give it too (an analysis error where ds holds every
// table the statement names; a table missing where the rules place it, or, looked for
// with run on the data source where they place it elsewhere, missing there too);
// notHeld when the missing table is found there, so that no one data source holds
// every table the statement names (NotHeld). Neither when it cannot tell (that data
// source out of reach).
func JudgeDescription(ctx context.Context, plan *sqlplan.Plan, r *rules.Compiled, ds int, err error,
	run func(ds int, fn func(*pgconn.PgConn) error) error) (genuine, notHeld bool) {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || !strings.HasPrefix(pe.Code, "42") {
		return false, false
	}
	other, table, elsewhere := MissingElsewhere(r, ds, err)
	if !elsewhere {
		return pe.Code == "42P01" || plan.HoldsEveryTable(ds), false
	}
	var exists bool
	if run(other, func(conn *pgconn.PgConn) error {
		var err error
		exists, err = TableExists(ctx, conn, table)
		return err
	}) != nil {
		return false, false
	}
	return !exists, exists
}

// AtClient returns err, a statement's error, with a server's position (a caret under
// the word it is about) counted in client, the statement as the client sent it: sent
// are the texts the data source that raised it ran (see SentTexts), rewritten from the
// client's. Where they disagree on the word, or none is known, the error has no
// position, rather than one under another word (sqlplan.ClientPosition).
//
// An error AtClient returned has its position counted in the text it was given then:
// from that text alone, whatever sent says.
func AtClient(err error, client string, sent []string) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Position <= 0 {
		return err
	}
	var done *atClientError
	if errors.As(err, &done) {
		if done.text == client {
			return err
		}
		sent = []string{done.text}
	}
	pos := 0
	for i, s := range sent {
		p := sqlplan.ClientPosition(s, client, int(pe.Position))
		if i > 0 && p != pos {
			pos = 0
			break
		}
		pos = p
	}
	out := *pe
	out.Position = int32(pos)
	return &atClientError{renamedError{client: &out, server: pe, err: err}, client}
}

// atClientError is an error whose position counts in text, the client's (AtClient).
type atClientError struct {
	renamedError
	text string
}

// SentTexts returns the texts b sent to the data source that raised err (a
// ShardError's), or to any of its data sources when err names none.
func SentTexts(b *sqlplan.Bound, err error) []string {
	if b == nil {
		return nil
	}
	var se *ShardError
	named := errors.As(err, &se)
	var out []string
	for _, t := range b.Targets {
		if !named || t.DataSource == se.DataSource {
			out = append(out, t.SQL)
		}
	}
	return out
}

// ShiftPosition returns err with its position, if it has one, moved by n characters:
// where the statement starts in the query string the client sent, several statements
// in one, from which PostgreSQL counts.
func ShiftPosition(err error, n int) error {
	var pe *pgconn.PgError
	if n == 0 || !errors.As(err, &pe) || pe.Position <= 0 {
		return err
	}
	return withPosition(err, pe, pe.Position+int32(n))
}

// withPosition returns err, whose error for the client is pe, with pe at position pos.
func withPosition(err error, pe *pgconn.PgError, pos int32) error {
	if pos == pe.Position {
		return err
	}
	out := *pe
	out.Position = pos
	return &renamedError{client: &out, server: pe, err: err}
}

// OneDatabase analyses (describes) the statement of plan, which the coordinator
// database failed, as one database would, for coordinator.ClientError: where the default
// data source holds every table it names under its logical name (logical), sql, the
// client's text, there; else, where a data source holds every table, the statement as
// its first shard runs it (Plan.DescribeSQL), its error renamed to logical names and
// its position counted in sql. analysed is false where neither can be done.
//
// b is the statement's bound form, nil for an extended-protocol statement described
// before it is bound (its plan is its own).
func OneDatabase(plan *sqlplan.Plan, b *sqlplan.Bound, r *rules.Compiled, sql string, logical bool, describe func(ds int, sql string) error) (analysed bool, err error) {
	if logical {
		return true, AtClient(describe(r.DefaultDataSource(), sql), sql, []string{sql})
	}
	if plan.Kind == sqlplan.KindCoordinator {
		return false, nil
	}
	describeSQL := plan.DescribeSQL
	if b != nil {
		describeSQL = b.DescribeSQL
	}
	ds, shardSQL := describeSQL()
	if ds == sqlplan.CoordinatorSource(r) || !plan.HoldsEveryTable(ds) {
		return false, nil
	}
	err = describe(ds, shardSQL)
	return true, AtClient(LogicalNames(err, r), sql, []string{shardSQL})
}
