// Package sqldiff is the differential test of the SQL sharding layer: it loads the same
// data into one unsharded PostgreSQL database and into a sharded layout, runs the same
// statements on both, and requires the same answer (columns, types, and every value's
// bytes, in text and in binary format) or, for what the sharding layer cannot answer
// exactly, a refusal with SQLSTATE 0A000. The unsharded database is the judge.
//
// The suite runs against anything that implements Runner: the SQL core on its own, the
// database/sql driver, and the wire proxy.
package sqldiff

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/rules"
)

// Answer is a statement's result as compared: column names and types, rows of raw
// values, and the command tag.
type Answer struct {
	Columns []string
	OIDs    []uint32
	Rows    [][][]byte
	Tag     string
}

// Runner runs statements on a database, sharded or not.
type Runner interface {
	// Extended runs one statement with the extended protocol: params are text values
	// (nil is NULL) for $1, $2 ...; binary asks for every result column in binary.
	Extended(ctx context.Context, sql string, params []*string, binary bool) (*Answer, error)
	// Simple runs one statement with the simple protocol (literals in its text).
	Simple(ctx context.Context, sql string) (*Answer, error)
}

// PgConnRunner runs statements on one PostgreSQL connection: the unsharded reference.
type PgConnRunner struct{ Conn *pgconn.PgConn }

// Extended implements Runner.
func (r PgConnRunner) Extended(ctx context.Context, sql string, params []*string, binary bool) (*Answer, error) {
	vals := make([][]byte, len(params))
	for i, p := range params {
		if p != nil {
			vals[i] = []byte(*p)
		}
	}
	var formats []int16
	if binary {
		formats = []int16{1}
	}
	return FromResultReader(r.Conn.ExecParams(ctx, sql, vals, nil, nil, formats))
}

// Simple implements Runner.
func (r PgConnRunner) Simple(ctx context.Context, sql string) (*Answer, error) {
	mrr := r.Conn.Exec(ctx, sql)
	var answers []*Answer
	var firstErr error
	for mrr.NextResult() {
		// pgconn's own Read keeps the columns only when there are rows.
		a, err := FromResultReader(mrr.ResultReader())
		if err != nil && firstErr == nil {
			firstErr = err
		}
		answers = append(answers, a)
	}
	if err := mrr.Close(); err != nil {
		return nil, err
	}
	if firstErr != nil {
		return nil, firstErr
	}
	if len(answers) != 1 {
		return nil, fmt.Errorf("sqldiff: %d results for one statement", len(answers))
	}
	return answers[0], nil
}

// FromResultReader reads a whole extended-protocol result.
func FromResultReader(rr *pgconn.ResultReader) (*Answer, error) {
	fields := slices.Clone(rr.FieldDescriptions())
	var rows [][][]byte
	for rr.NextRow() {
		var row [][]byte
		for _, v := range rr.Values() {
			if v == nil {
				row = append(row, nil)
			} else {
				row = append(row, bytes.Clone(v))
			}
		}
		rows = append(rows, row)
	}
	tag, err := rr.Close()
	if err != nil {
		return nil, err
	}
	return FromFields(fields, rows, tag.String()), nil
}

// FromFields makes an Answer.
func FromFields(fields []pgconn.FieldDescription, rows [][][]byte, tag string) *Answer {
	a := &Answer{Rows: rows, Tag: tag}
	for _, f := range fields {
		a.Columns = append(a.Columns, f.Name)
		a.OIDs = append(a.OIDs, f.DataTypeOID)
	}
	return a
}

// Query is one statement of the suite.
type Query struct {
	SQL    string
	Params []*string // extended protocol only; the simple form inlines them as literals
	// Ordered: the ORDER BY fixes the order of every row, so order is compared too.
	Ordered bool
	// Refused: the sharding layer must refuse it with 0A000 (it spans shards).
	Refused bool
	// MayRefuse: an exact answer or a 0A000 refusal are both right (whether it spans
	// shards depends on the layout).
	MayRefuse bool
	// InSteps, on a write that must be Refused, says that a runner that evaluates
	// subqueries first (Env.InSteps) answers it instead.
	InSteps bool
	// OtherDatabase: refused only because a table of the default data source meets
	// shards on other databases; where every shard is a schema of one database
	// (Layout.Schemas) it may be answered, exactly.
	OtherDatabase bool
	// TextOrder: the answer depends on text comparison across shards, which a layout
	// whose collation is not byte order refuses.
	TextOrder bool
}

// P makes a parameter list.
func P(vals ...string) []*string {
	out := make([]*string, len(vals))
	for i := range vals {
		out[i] = &vals[i]
	}
	return out
}

// Layout is one sharded arrangement of the suite's tables.
type Layout struct {
	Name string
	// Rules builds the rules over the given data source DSNs.
	Rules func(dsns []string) rules.Rules
	// DataSources is how many databases the layout needs.
	DataSources int
	// ByteOrder is false when the databases' collation does not order text by bytes.
	ByteOrder bool
	// Schemas makes the data sources schemas s0, s1 ... of one database (DSNs with
	// search_path), instead of databases of their own.
	Schemas bool
}

// Outcome tallies a run.
type Outcome struct {
	Equal, Refused, Total int
	// Coordinated counts the queries the merge refuses that a coordinator answered
	// equal (Env.Coordinated).
	Coordinated int
}

// Compare runs q on ref and on sharded, in the given protocol form, and reports any
// difference on t. It returns whether sharded refused.
func Compare(ctx context.Context, t testing.TB, label string, q Query, ref, sharded Runner, mode string, byteOrder bool) (refused bool) {
	t.Helper()
	var want, got *Answer
	var wantErr, gotErr error
	switch mode {
	case "simple":
		sql := Inline(q.SQL, q.Params)
		want, wantErr = ref.Simple(ctx, sql)
		got, gotErr = sharded.Simple(ctx, sql)
	case "text", "binary":
		want, wantErr = ref.Extended(ctx, q.SQL, q.Params, mode == "binary")
		got, gotErr = sharded.Extended(ctx, q.SQL, q.Params, mode == "binary")
	}
	expectRefusal := q.Refused || (q.TextOrder && !byteOrder)
	if code(gotErr) == "0A000" {
		if expectRefusal || q.MayRefuse {
			return true
		}
		t.Errorf("%s [%s]: refused but should be answered: %s\n  %v", label, mode, q.SQL, gotErr)
		return true
	}
	if q.Refused {
		t.Errorf("%s [%s]: answered but must be refused with 0A000: %s (err %v)", label, mode, q.SQL, gotErr)
		return false
	}
	if wantErr != nil || gotErr != nil {
		if code(wantErr) != code(gotErr) || (wantErr == nil) != (gotErr == nil) {
			t.Errorf("%s [%s]: %s\n  unsharded: %v\n  sharded:   %v", label, mode, q.SQL, wantErr, gotErr)
		}
		return false
	}
	if diff := Diff(want, got, q.Ordered); diff != "" {
		t.Errorf("%s [%s]: %s\n  %s", label, mode, q.SQL, diff)
	}
	return false
}

func code(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	if err != nil {
		return "?" + err.Error()
	}
	return ""
}

// Diff describes how got differs from want ("" when equal). Unordered answers compare
// as multisets of rows.
func Diff(want, got *Answer, ordered bool) string {
	if !slices.Equal(want.Columns, got.Columns) {
		return fmt.Sprintf("columns %q, want %q", got.Columns, want.Columns)
	}
	if !slices.Equal(want.OIDs, got.OIDs) {
		return fmt.Sprintf("column types %v, want %v", got.OIDs, want.OIDs)
	}
	if want.Tag != got.Tag {
		return fmt.Sprintf("command tag %q, want %q", got.Tag, want.Tag)
	}
	w, g := rowStrings(want.Rows), rowStrings(got.Rows)
	if !ordered {
		sort.Strings(w)
		sort.Strings(g)
	}
	if len(w) != len(g) {
		return fmt.Sprintf("%d rows, want %d\n  got  %s\n  want %s", len(g), len(w), head(g), head(w))
	}
	for i := range w {
		if w[i] != g[i] {
			return fmt.Sprintf("row %d is %s, want %s", i, g[i], w[i])
		}
	}
	return ""
}

func head(rows []string) string {
	if len(rows) > 6 {
		return strings.Join(rows[:6], " ") + " ..."
	}
	return strings.Join(rows, " ")
}

func rowStrings(rows [][][]byte) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		var b strings.Builder
		b.WriteByte('(')
		for j, v := range r {
			if j > 0 {
				b.WriteByte(',')
			}
			if v == nil {
				b.WriteString("NULL")
			} else {
				fmt.Fprintf(&b, "%q", v)
			}
		}
		b.WriteByte(')')
		out[i] = b.String()
	}
	return out
}

// Inline writes a parameterised statement's simple-protocol form: $n replaced by the
// value as a quoted literal (or NULL).
func Inline(sql string, params []*string) string {
	for i := len(params); i >= 1; i-- {
		lit := "NULL"
		if p := params[i-1]; p != nil {
			lit = "'" + strings.ReplaceAll(*p, "'", "''") + "'"
		}
		sql = strings.ReplaceAll(sql, fmt.Sprintf("$%d", i), lit)
	}
	return sql
}
