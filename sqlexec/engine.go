// Package sqlexec runs the plans of package sqlplan on PostgreSQL shards and merges
// their answers: targets on different data sources run concurrently, their rows are
// merge-sorted, grouped and aggregated, de-duplicated and limited exactly as one
// database would, and a statement that writes to several shards outside a transaction
// gets a transaction on each.
//
// The engine does not own connections. A caller (the database/sql driver, the wire
// proxy, or DB in this package) lends it one connection per data source through Conns,
// and keeps it for as long as its own transaction lasts.
package sqlexec

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/fanout"
	"github.com/shardlab/shardlab/routing"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// Conns lends the engine connections, one per data source for the length of a
// statement (or, when the caller holds a transaction, for as long as it lasts).
type Conns interface {
	// Run calls fn with the connection for data source ds. Until Release(ds), every Run
	// for ds gets the same connection; Run is called concurrently for different data
	// sources. The connection is valid only inside fn.
	Run(ctx context.Context, ds int, fn func(*pgconn.PgConn) error) error
	// Release ends the statement's use of data source ds; err is its error there, if any
	// (a broken connection should not be reused). It is called once for every data
	// source Run was called for, even when Run failed.
	Release(ds int, err error)
	// InTransaction reports whether the caller holds an open transaction on its
	// connections. Outside one, a statement that writes to several targets is wrapped
	// in a transaction on each data source, committed by the engine's Committer.
	InTransaction() bool
}

// Result is the answer to one statement.
type Result struct {
	Fields []pgconn.FieldDescription
	Rows   [][][]byte
	Tag    pgconn.CommandTag
}

// Engine executes bound plans. It is safe for concurrent use.
type Engine struct {
	rules     *rules.Compiled
	catalog   *Catalog
	committer *Committer
	// Concurrency bounds how many data sources one statement talks to at once.
	concurrency int
	// maxHeld bounds the bytes of rows one statement holds when its answer is read
	// whole (see SetMaxHeld).
	maxHeld int64
}

// DefaultMaxHeld is the default bound on the bytes of rows one statement holds in
// memory when its answer is read whole.
const DefaultMaxHeld = 1 << 30

// SetMaxHeld bounds the bytes of row values one statement holds in memory when its
// answer is read whole before it is merged or sent (aggregation and DISTINCT across
// shards, text ranked under a collation, an answer gathered for a caller that asked
// for it whole; not a write's RETURNING rows, which would answer as if the write had
// not run): past it, the statement fails with SQLSTATE 54000
// and the shards' rows are read and dropped, so that the connections stay usable.
// Streamed answers hold a few batches per shard whatever their size. 0 restores
// DefaultMaxHeld; a negative bound holds without limit.
func (e *Engine) SetMaxHeld(n int64) {
	if n == 0 {
		n = DefaultMaxHeld
	}
	e.maxHeld = n
}

// MaxHeld is the engine's bound on the bytes of rows one statement holds (negative: no
// bound).
func (e *Engine) MaxHeld() int64 { return e.maxHeld }

// HeldError is the failure of a statement that would hold more than limit bytes of rows.
func HeldError(limit int64) error { return heldError(limit) }

// heldBudget counts what one statement holds, against the engine's bound.
type heldBudget struct {
	limit int64
	used  atomic.Int64
}

func (e *Engine) budget() *heldBudget { return &heldBudget{limit: e.maxHeld} }

// take counts n more bytes, and reports whether they fit.
func (h *heldBudget) take(n int) bool {
	return h == nil || h.limit < 0 || h.used.Add(int64(n)) <= h.limit
}

// give counts n bytes no longer held.
func (h *heldBudget) give(n int) {
	if h != nil {
		h.used.Add(-int64(n))
	}
}

// heldError is the failure of a statement that would hold more than the bound.
func heldError(limit int64) error {
	return &pgconn.PgError{Severity: "ERROR", Code: "54000",
		Message: fmt.Sprintf("shardlab: the answer needs more than %s of rows held in memory to be merged", sizeOf(limit)),
		Hint:    "Aggregates, DISTINCT and sorts of text under a collation are merged from every shard's whole answer; narrow the statement, pin it to one shard, or raise the bound (shard-proxy --max-held-memory, sqlexec.Engine.SetMaxHeld)."}
}

// sizeOf writes a byte count for people: in MB from 1 MB up, else in kB or bytes.
func sizeOf(n int64) string {
	switch {
	case n >= 1<<20:
		return strconv.FormatInt(n>>20, 10) + " MB"
	case n >= 1<<10:
		return strconv.FormatInt(n>>10, 10) + " kB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// NewEngine returns an engine for rules; cat answers collation questions (it may be
// nil, and then text is never compared across shards); committer commits the
// transactions the engine opens for writes to several data sources (nil: best effort).
func NewEngine(r *rules.Compiled, cat *Catalog, committer *Committer) *Engine {
	if committer == nil {
		committer = NewCommitter(r, false)
	}
	return &Engine{rules: r, catalog: cat, committer: committer, concurrency: fanout.DefaultLimit, maxHeld: DefaultMaxHeld}
}

// targetResult is what one target answered.
type targetResult struct {
	fields []pgconn.FieldDescription
	rows   [][][]byte
	tag    pgconn.CommandTag
}

// Execute runs a bound statement. args are the client's parameters (extended
// protocol); resultFormats the client's result formats (none: all text; one: for all;
// else one per column).
func (e *Engine) Execute(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, resultFormats []int16, conns Conns) (*Result, error) {
	if len(b.Targets) == 0 {
		return nil, fmt.Errorf("sqlexec: a %s statement has no targets; the session handles it", b.Plan.Kind)
	}
	var shardFormats []int16
	if b.Merge != nil {
		shardFormats = b.Merge.ShardFormats(resultFormats)
	} else {
		shardFormats = resultFormats
	}
	wrap := b.MultiTarget() && b.Plan.Write && !conns.InTransaction() && !b.Plan.NoTransaction
	results, err := e.run(ctx, b, args, shardFormats, conns, wrap)
	if err != nil {
		return nil, err
	}
	return e.combine(ctx, b, results, resultFormats, CombineOptions{})
}

// ShardResult is what one target answered, for Combine.
type ShardResult struct {
	Fields []pgconn.FieldDescription
	Rows   [][][]byte
	Tag    pgconn.CommandTag
}

// CombineOptions adapt the merge to shards that are not PostgreSQL.
type CombineOptions struct {
	// FloatAvg computes avg as a double precision division, as SQLite's avg does,
	// instead of PostgreSQL's numeric division.
	FloatAvg bool
	// TextByteOrder vouches that text compares byte by byte on every shard (SQLite's
	// BINARY collation), so no catalog is asked.
	TextByteOrder bool
	// NullsSmallest sorts NULL below every value where the statement does not say NULLS
	// FIRST or LAST, as SQLite does (PostgreSQL sorts it above).
	NullsSmallest bool
}

// Combine answers a bound statement from its targets' results, gathered by the caller
// in target order (an executor for shards that do not speak PostgreSQL's protocol): the
// same merge, concatenation or broadcast rule as Execute.
func (e *Engine) Combine(ctx context.Context, b *sqlplan.Bound, results []ShardResult, resultFormats []int16, opts CombineOptions) (*Result, error) {
	rs := make([]targetResult, len(results))
	for i, r := range results {
		rs[i] = targetResult{fields: r.Fields, rows: r.Rows, tag: r.Tag}
	}
	return e.combine(ctx, b, rs, resultFormats, opts)
}

func (e *Engine) combine(ctx context.Context, b *sqlplan.Bound, results []targetResult, resultFormats []int16, opts CombineOptions) (*Result, error) {
	switch {
	case len(results) == 1:
		r := results[0]
		return &Result{Fields: r.fields, Rows: r.rows, Tag: r.tag}, nil
	case b.Broadcast:
		r := results[0] // every copy answered the same write
		return &Result{Fields: r.fields, Rows: r.rows, Tag: r.tag}, nil
	case b.Merge != nil:
		return e.merge(ctx, b, results, resultFormats, opts)
	default:
		return concat(b, results)
	}
}

// run executes every target: targets on one data source in order on its connection,
// data sources concurrently. With wrap, each data source runs its part in a transaction
// that commits only when every data source succeeded.
func (e *Engine) run(ctx context.Context, b *sqlplan.Bound, args sqlplan.Args, formats []int16, conns Conns, wrap bool) ([]targetResult, error) {
	held := e.budget()
	if b.Plan.Write {
		// A write's RETURNING rows are not bounded: past a bound, a write that ran
		// (and, alone on one data source, committed) would answer as if it had not.
		held = nil
	}
	if len(b.Targets) == 1 {
		// The usual statement: one target, no fan-out to arrange.
		t := b.Targets[0]
		var r targetResult
		err := conns.Run(ctx, t.DataSource, func(conn *pgconn.PgConn) error {
			var err error
			r, err = execTarget(ctx, conn, t, args, formats, b.Plan.Reusable(), held)
			return err
		})
		conns.Release(t.DataSource, err)
		if err != nil {
			return nil, e.shardErr(t.DataSource, err)
		}
		return []targetResult{r}, nil
	}
	byDS := map[int][]int{}
	var order []int
	for i, t := range b.Targets {
		if _, ok := byDS[t.DataSource]; !ok {
			order = append(order, t.DataSource)
		}
		byDS[t.DataSource] = append(byDS[t.DataSource], i)
	}
	slices.Sort(order) // a fixed order: writes to several data sources take them alike
	results := make([]targetResult, len(b.Targets))
	nds := e.rules.NumDataSources()
	errsBy := make([]error, nds)
	reuse := b.Plan.Reusable()

	runDS := func(gctx context.Context, ds int) error {
		err := conns.Run(gctx, ds, func(conn *pgconn.PgConn) error {
			if wrap {
				if err := conn.Exec(gctx, "BEGIN").Close(); err != nil {
					return err
				}
			}
			for _, i := range byDS[ds] {
				r, err := execTarget(gctx, conn, b.Targets[i], args, formats, reuse, held)
				if err != nil {
					return err
				}
				results[i] = r
			}
			return nil
		})
		errsBy[ds] = err
		return err
	}
	// Every data source the statement needs, concurrently; the first failure cancels the
	// rest, since a merge or a multi-shard write is useless without every part. A write
	// takes the data sources one at a time, in order: two writes to the same rows on
	// several data sources then lock them in the same order and cannot deadlock each
	// other across data sources.
	limit := e.concurrency
	if b.Plan.Write {
		limit = 1
	}
	opts := []fanout.DoOption{fanout.WithLimit(limit)}
	if b.Plan.Write || !conns.InTransaction() {
		// Inside the caller's transaction the data sources still answering a read
		// answer to the end: cancelling breaks a connection (see stream.stop), and
		// with it that data source's part of the transaction. A write runs one data
		// source at a time, none to cancel.
		opts = append(opts, fanout.FailFast())
	}
	err := fanout.Do(ctx, routing.NewShards(order...), nds, runDS, opts...)
	var failed fanout.Errors
	if errors.As(err, &failed) && len(failed) > 0 {
		first := failed[0]
		for _, f := range failed {
			if !errors.Is(f.Err, ErrTxAborted) {
				first = f // the cause: see ErrTxAborted
				break
			}
		}
		err = e.shardErr(first.Shard, first.Err)
	}
	if wrap {
		if err != nil {
			e.committer.Rollback(context.WithoutCancel(ctx), conns, order)
		} else {
			err = e.committer.Commit(ctx, conns, order)
		}
	}
	for _, ds := range order {
		conns.Release(ds, errsBy[ds])
	}
	if err != nil {
		return nil, err
	}
	return results, nil
}

// execTarget runs one target's statement on conn.
// With reuse, the statement is prepared once per connection and then executed by name.
func execTarget(ctx context.Context, conn *pgconn.PgConn, t sqlplan.Target, args sqlplan.Args, formats []int16, reuse bool, held *heldBudget) (targetResult, error) {
	values, oids, pformats := TargetParams(t, args)
	if !reuse {
		return readResult(conn.ExecParams(ctx, t.SQL, values, oids, pformats, formats), held)
	}
	for attempt := 0; ; attempt++ {
		desc, err := prepared(ctx, conn, t.SQL, oids)
		if err != nil {
			return targetResult{}, err
		}
		r, err := readResult(conn.ExecStatement(ctx, desc, values, pformats, formats), held)
		if err != nil && attempt == 0 && stale(err) && conn.TxStatus() == 'I' {
			forget(conn, t.SQL, oids)
			continue
		}
		return r, err
	}
}

// readResult reads a whole result, copying the rows out of the connection's buffer,
// within the statement's budget of held bytes: past it, the rest is read and dropped.
func readResult(rr *pgconn.ResultReader, held *heldBudget) (targetResult, error) {
	var r targetResult
	r.fields = slices.Clone(rr.FieldDescriptions())
	for rr.NextRow() {
		src := rr.Values()
		row := make([][]byte, len(src))
		size := 0
		for _, v := range src {
			size += len(v)
		}
		if !held.take(size + 24*len(src)) {
			_, err := rr.Close() // drains the rest; the connection stays usable
			if err != nil {
				return targetResult{}, err
			}
			return targetResult{}, heldError(held.limit)
		}
		buf := make([]byte, 0, size)
		for i, v := range src {
			if v == nil {
				continue
			}
			start := len(buf)
			buf = append(buf, v...)
			row[i] = buf[start:len(buf):len(buf)]
		}
		r.rows = append(r.rows, row)
	}
	tag, err := rr.Close()
	r.tag = tag
	return r, err
}

// TargetParams selects and orders the client's parameters for a target: the values,
// their type OIDs (nil when the client gave none for some) and their formats.
func TargetParams(t sqlplan.Target, args sqlplan.Args) ([][]byte, []uint32, []int16) {
	if t.Params == nil {
		var oids []uint32
		if len(args.OIDs) == len(args.Values) {
			oids = args.OIDs
		}
		return args.Values, oids, args.Formats
	}
	values := make([][]byte, len(t.Params))
	var oids []uint32
	if len(args.OIDs) == len(args.Values) && len(args.OIDs) > 0 {
		oids = make([]uint32, len(t.Params))
	}
	var formats []int16
	if len(args.Formats) > 1 {
		formats = make([]int16, len(t.Params))
	} else {
		formats = args.Formats
	}
	for i, p := range t.Params {
		values[i] = args.Values[p]
		if oids != nil {
			oids[i] = args.OIDs[p]
		}
		if len(args.Formats) > 1 {
			formats[i] = args.Formats[p]
		}
	}
	return values, oids, formats
}

// concat combines the answers of a write on several shards: row counts add up, and
// RETURNING rows of a split INSERT come back in the client's row order.
func concat(b *sqlplan.Bound, results []targetResult) (*Result, error) {
	out := &Result{Fields: results[0].fields}
	var n int64
	reorder := b.Plan.Kind == sqlplan.KindInsert
	for i, r := range results {
		n += r.tag.RowsAffected()
		if reorder && len(r.rows) != len(b.Targets[i].RowOrder) {
			reorder = false // ON CONFLICT DO NOTHING returned fewer rows: keep shard order
		}
	}
	if reorder {
		total := 0
		for _, t := range b.Targets {
			total += len(t.RowOrder)
		}
		rows := make([][][]byte, total)
		for i, r := range results {
			for j, row := range r.rows {
				rows[b.Targets[i].RowOrder[j]] = row
			}
		}
		out.Rows = rows
	} else {
		for _, r := range results {
			out.Rows = append(out.Rows, r.rows...)
		}
	}
	out.Tag = CommandTag(b.Plan.Kind, n, results[0].tag)
	return out, nil
}

// CommandTag is the command tag PostgreSQL sends for a statement of kind that touched
// n rows; other kinds keep other (the first target's tag).
func CommandTag(kind sqlplan.Kind, n int64, other pgconn.CommandTag) pgconn.CommandTag {
	c := strconv.FormatInt(n, 10)
	switch kind {
	case sqlplan.KindInsert:
		return pgconn.NewCommandTag("INSERT 0 " + c)
	case sqlplan.KindUpdate:
		return pgconn.NewCommandTag("UPDATE " + c)
	case sqlplan.KindDelete:
		return pgconn.NewCommandTag("DELETE " + c)
	case sqlplan.KindSelect:
		return pgconn.NewCommandTag("SELECT " + c)
	}
	return other
}

func (e *Engine) name(ds int) string { return sourceName(e.rules, ds) }

// sourceName names data source ds; the index past the data sources stands for the
// coordinator database (sqlplan.CoordinatorSource).
func sourceName(r *rules.Compiled, ds int) string {
	if ds == sqlplan.CoordinatorSource(r) {
		return "coordinator"
	}
	return r.DataSources()[ds].Name
}

// shardErr names the data source an error came from (once), and the logical tables
// its server's error names (LogicalNames).
func (e *Engine) shardErr(ds int, err error) error {
	var se *ShardError
	if errors.As(err, &se) {
		return LogicalNames(err, e.rules)
	}
	return LogicalNames(&ShardError{DataSource: ds, Name: e.name(ds), Err: err}, e.rules)
}
