package shardsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/fanout"
	"github.com/shardlab/shardlab/internal/sqlitedb"
	"github.com/shardlab/shardlab/routing"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// SQLite shards.
//
// A data source whose DSN is "sqlite:PATH" is a SQLite file, opened the way every part
// of shardlab opens SQLite (package sqlite: WAL, one writer, a pool of readers). The
// rules, the planner and the merge are the same as for PostgreSQL; the statements
// the shards run are PostgreSQL's SQL with $n placeholders, so SQLite shards take the
// part of it that SQLite also accepts:
//
//   - no :: casts (write CAST(x AS type)), no ILIKE, no E'...' or $$...$$ strings, no
//     ARRAY[...], no DISTINCT ON, no FOR UPDATE or FOR SHARE, no LIMIT ALL, no OFFSET
//     without LIMIT: these are refused before any shard sees them (SQLSTATE 0A000);
//   - anything else SQLite's own parser rejects is refused with its message;
//   - types are SQLite's: a column holds what was stored, and values come back as
//     int64, float64, string, []byte or time.Time, as the SQLite driver gives them;
//   - avg across shards is a double precision division, as SQLite computes it, in a
//     column named avg (SQLite would name it after the expression, avg(x)); sum and
//     avg of REAL values across shards are refused (SQLite adds floating-point values
//     with compensated summation, which shard sums cannot reproduce);
//   - text compares by bytes (SQLite's BINARY collation); a table whose columns
//     declare another collation cannot be sorted across shards;
//   - no two-phase commit, and no mixing of SQLite and PostgreSQL data sources.

// sqlitePrefix starts the DSN of a SQLite data source.
const sqlitePrefix = "sqlite:"

// isSQLite reports whether every data source is SQLite (true), none is (false), or they
// are mixed (an error).
func isSQLite(r *rules.Compiled) (bool, error) {
	n := 0
	for _, ds := range r.DataSources() {
		if strings.HasPrefix(ds.DSN, sqlitePrefix) {
			n++
		}
	}
	switch n {
	case 0:
		return false, nil
	case r.NumDataSources():
		return true, nil
	}
	return false, errors.New("shardsql: data sources mix SQLite and PostgreSQL; use one kind")
}

// sqliteShards are the SQLite files of a rules set.
type sqliteShards struct {
	rules *rules.Compiled
	dbs   []*sqlitedb.DB

	// What a statement text needs before SQLite runs it, worked out once: the subset
	// check (checked), the text with ? placeholders and whether it returns rows (texts),
	// and a prepared statement per data source, reader or writer (stmts). A repeated
	// statement then costs what it costs through the SQLite driver directly. Each memo
	// stops growing at maxSQLiteMemo entries; beyond that, statements run unprepared.
	checked, texts, stmts sync.Map
	memoSize              atomic.Int64
}

// maxSQLiteMemo bounds each memo of sqliteShards (statement shapes are bounded by the
// planner's cache, but literals in statement texts are not).
const maxSQLiteMemo = 4096

// liteText is a target's statement as SQLite takes it.
type liteText struct {
	text string // $n placeholders numbered ?n
	rows bool   // returns rows
}

// liteStmtKey names a prepared statement: a data source's reader or writer pool.
type liteStmtKey struct {
	ds    int
	write bool
	sql   string
}

// memo returns m's value for key, computing and keeping it while the memos are small.
func memo[V any](s *sqliteShards, m *sync.Map, key any, compute func() (V, error)) (V, error) {
	if v, ok := m.Load(key); ok {
		return v.(V), nil
	}
	v, err := compute()
	if err != nil || s.memoSize.Load() >= 3*maxSQLiteMemo {
		return v, err
	}
	if _, loaded := m.LoadOrStore(key, v); !loaded {
		s.memoSize.Add(1)
	}
	return v, nil
}

// subsetError is the subset check of a statement text, memoised.
func (s *sqliteShards) subsetError(sql string) error {
	type checkResult struct{ err error }
	r, _ := memo(s, &s.checked, sql, func() (checkResult, error) { return checkResult{checkSQLiteSubset(sql)}, nil })
	return r.err
}

// liteTextOf is a target's SQLite text, memoised.
func (s *sqliteShards) liteTextOf(pl *sqlplan.Plan, sql string) liteText {
	t, _ := memo(s, &s.texts, sql, func() (liteText, error) {
		return liteText{text: sqlplan.NumberedParams(sql, "?"), rows: returnsRows(pl, sql)}, nil
	})
	return t
}

// prepared is the writer's statement for text if one was prepared already, else nil.
func (s *sqliteShards) prepared(ds int, text string) *sql.Stmt {
	if v, ok := s.stmts.Load(liteStmtKey{ds, true, text}); ok {
		return v.(*sql.Stmt)
	}
	return nil
}

// stmt is the statement text prepared on a data source's reader or writer pool (kept,
// and safe for concurrent use); nil when the memo is full, to run it unprepared.
func (s *sqliteShards) stmt(ctx context.Context, ds int, write bool, text string) (*sql.Stmt, error) {
	key := liteStmtKey{ds, write, text}
	if v, ok := s.stmts.Load(key); ok {
		return v.(*sql.Stmt), nil
	}
	if s.memoSize.Load() >= 3*maxSQLiteMemo {
		return nil, nil
	}
	db := s.dbs[ds].Reader()
	if write {
		db = s.dbs[ds].Writer()
	}
	st, err := db.PrepareContext(context.WithoutCancel(ctx), text)
	if err != nil {
		return nil, err
	}
	if v, loaded := s.stmts.LoadOrStore(key, st); loaded {
		st.Close()
		return v.(*sql.Stmt), nil
	}
	s.memoSize.Add(1)
	return st, nil
}

func openSQLite(ctx context.Context, r *rules.Compiled) (*sqliteShards, error) {
	s := &sqliteShards{rules: r}
	for _, ds := range r.DataSources() {
		db, err := sqlitedb.OpenDB(ctx, strings.TrimPrefix(ds.DSN, sqlitePrefix), sqlitedb.Options{})
		if err != nil {
			s.close()
			return nil, fmt.Errorf("shardsql: data source %s: %w", ds.Name, err)
		}
		s.dbs = append(s.dbs, db)
	}
	return s, nil
}

func (s *sqliteShards) close() error {
	var first error
	s.stmts.Range(func(_, v any) bool {
		v.(*sql.Stmt).Close()
		return true
	})
	for _, db := range s.dbs {
		if err := db.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// sqliteCatalog answers the planner's questions from SQLite's own schema.
type sqliteCatalog struct{ shards *sqliteShards }

var _ sqlplan.Catalog = sqliteCatalog{}

func (c sqliteCatalog) tableInfo(ctx context.Context, t *rules.TableRule) ([][2]string, error) {
	n := t.Nodes[0]
	rows, err := c.shards.dbs[n.DataSource].Reader().QueryContext(ctx, "SELECT name, type FROM pragma_table_info(?)", n.Table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out [][2]string
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return nil, err
		}
		out = append(out, [2]string{name, typ})
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, &pgconn.PgError{Severity: "ERROR", Code: sqlplan.CodeUndefinedTable, Message: fmt.Sprintf("relation %q does not exist", t.Name)}
	}
	return out, nil
}

// KeyType reads a sharding column's declared type: integer types, text types, uuid.
func (c sqliteCatalog) KeyType(ctx context.Context, t *rules.TableRule, column string) (rules.KeyType, error) {
	cols, err := c.tableInfo(ctx, t)
	if err != nil {
		return "", err
	}
	for _, col := range cols {
		if col[0] != column {
			continue
		}
		decl := strings.ToLower(col[1])
		if i := strings.IndexByte(decl, '('); i >= 0 {
			decl = strings.TrimSpace(decl[:i])
		}
		if strings.Contains(decl, "int") {
			if decl == "smallint" || decl == "int2" {
				return rules.TypeInt2, nil
			}
			return rules.TypeInt8, nil // SQLite integers are 64-bit
		}
		if t, err := rules.ParseKeyType(decl); err == nil {
			return t, nil
		}
		if strings.Contains(decl, "char") || strings.Contains(decl, "text") || decl == "" {
			return rules.TypeText, nil
		}
		return "", sqlplan.Unsupported("sharding column %s.%s is declared %q; declare it an integer, text or uuid type", t.Name, column, col[1])
	}
	return "", &pgconn.PgError{Severity: "ERROR", Code: sqlplan.CodeUndefinedColumn, Message: fmt.Sprintf("column %q of relation %q does not exist", column, t.Name)}
}

// Columns lists a table's columns in order.
func (c sqliteCatalog) Columns(ctx context.Context, t *rules.TableRule) ([]string, error) {
	cols, err := c.tableInfo(ctx, t)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(cols))
	for i, col := range cols {
		out[i] = col[0]
	}
	return out, nil
}

// sqliteAggregates are SQLite's aggregate functions.
var sqliteAggregates = map[string]bool{"avg": true, "count": true, "group_concat": true, "max": true, "min": true,
	"sum": true, "total": true, "string_agg": true, "json_group_array": true, "json_group_object": true,
	"jsonb_group_array": true, "jsonb_group_object": true, "median": true, "percentile": true}

func (sqliteCatalog) IsAggregate(_ context.Context, name string) (bool, error) {
	return sqliteAggregates[strings.ToLower(name)], nil
}

// checkSQLiteSubset refuses PostgreSQL constructs SQLite does not have, with a clear
// error, before any shard sees the statement.
func checkSQLiteSubset(sql string) error {
	refuse := func(what string) error {
		return sqlplan.Unsupported("SQLite shards do not take %s (they take the part of PostgreSQL's SQL that SQLite accepts)", what)
	}
	words := sqlplan.Tokens(sql)
	offset, limit := false, false
	for _, w := range words {
		offset = offset || strings.EqualFold(w, "offset")
		limit = limit || strings.EqualFold(w, "limit")
	}
	if offset && !limit {
		return refuse("OFFSET without LIMIT")
	}
	for i, w := range words {
		lw := strings.ToLower(w)
		next := ""
		if i+1 < len(words) {
			next = strings.ToLower(words[i+1])
		}
		switch {
		case w == "::":
			return refuse(":: casts (write CAST(x AS type))")
		case lw == "ilike":
			return refuse("ILIKE")
		case strings.HasPrefix(lw, "e'") || strings.HasPrefix(w, "$$") || (strings.HasPrefix(w, "$") && strings.HasSuffix(w, "$") && len(w) > 1 && !isParam(w)):
			return refuse("E'...' or dollar-quoted strings")
		case lw == "array" && next == "[":
			return refuse("ARRAY[...]")
		case lw == "distinct" && next == "on":
			return refuse("DISTINCT ON")
		case lw == "for" && (next == "update" || next == "share" || next == "no" || next == "key"):
			return refuse("FOR UPDATE and FOR SHARE")
		case lw == "limit" && next == "all":
			return refuse("LIMIT ALL")
		}
	}
	return nil
}

func isParam(w string) bool {
	_, err := strconv.Atoi(w[1:])
	return strings.HasPrefix(w, "$") && err == nil
}

// sqliteSession runs a connection's statements on SQLite shards: reads on the readers,
// writes on each file's writer, and a transaction as a transaction per file touched.
type sqliteSession struct {
	c      *Connector
	mu     sync.Mutex
	inTx   bool
	txs    map[int]*sql.Tx
	failed bool
}

func (s *sqliteSession) begin() error {
	if s.inTx {
		return &pgconn.PgError{Severity: "WARNING", Code: "25001", Message: "there is already a transaction in progress"}
	}
	s.inTx, s.failed, s.txs = true, false, map[int]*sql.Tx{}
	return nil
}

// end commits (in data source order, best effort) or rolls back every file's part.
func (s *sqliteSession) end(commit bool) error {
	if !s.inTx {
		return nil
	}
	txs := s.txs
	s.inTx, s.txs = false, nil
	if s.failed {
		commit = false
	}
	var committed []string
	var first error
	names := s.c.cfg.Rules.DataSources()
	for ds := range s.c.cfg.Rules.NumDataSources() {
		tx := txs[ds]
		if tx == nil {
			continue
		}
		if !commit || first != nil {
			tx.Rollback()
			continue
		}
		if err := tx.Commit(); err != nil {
			first = &sqlexec.ShardError{DataSource: ds, Name: names[ds].Name, Err: err}
			if len(committed) > 0 {
				first = &sqlexec.ShardError{DataSource: ds, Name: names[ds].Name,
					Err: fmt.Errorf("commit failed after %s committed (best effort): %w", strings.Join(committed, ", "), err)}
			}
			continue
		}
		committed = append(committed, names[ds].Name)
	}
	if s.failed && commit {
		return &pgconn.PgError{Severity: "ERROR", Code: "40000", Message: "the transaction was rolled back: a statement in it failed"}
	}
	return first
}

// querier is what runs one target: a transaction, a writer or a reader pool.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// run executes a bound statement on SQLite shards and combines the answers.
func (s *sqliteSession) run(ctx context.Context, b *sqlplan.Bound, args []driver.NamedValue) (*sqlexec.Result, error) {
	if s.inTx && s.failed {
		return nil, sqlexec.ErrTxAborted
	}
	pl := b.Plan
	shards := s.c.sqlite
	if err := shards.subsetError(pl.SQL); err != nil {
		return nil, err
	}
	if b.Coordinated() {
		return s.coordinated(ctx, b, args)
	}
	results := make([]sqlexec.ShardResult, len(b.Targets))
	write := pl.Write
	wrap := write && b.MultiTarget() && !s.inTx
	local := map[int]*sql.Tx{}
	byDS := map[int][]int{}
	var order []int
	for i, t := range b.Targets {
		if _, ok := byDS[t.DataSource]; !ok {
			order = append(order, t.DataSource)
		}
		byDS[t.DataSource] = append(byDS[t.DataSource], i)
	}
	names := s.c.cfg.Rules.DataSources()
	// Transactions outlive the fan-out's context (database/sql rolls a transaction back
	// when the context it began with ends), so they begin without its cancellation.
	runDS := func(ctx context.Context, ds int) error {
		var q querier = s.c.sqlite.dbs[ds].Reader()
		var tx *sql.Tx
		onWriter := write || s.inTx
		switch {
		case s.inTx:
			s.mu.Lock()
			tx = s.txs[ds]
			s.mu.Unlock()
			if tx == nil {
				var err error
				if tx, err = s.c.sqlite.dbs[ds].Writer().BeginTx(context.WithoutCancel(ctx), nil); err != nil {
					return err
				}
				s.mu.Lock()
				s.txs[ds] = tx
				s.mu.Unlock()
			}
			q = tx
		case wrap:
			var err error
			if tx, err = s.c.sqlite.dbs[ds].Writer().BeginTx(context.WithoutCancel(ctx), nil); err != nil {
				return err
			}
			s.mu.Lock()
			local[ds] = tx
			s.mu.Unlock()
			q = tx
		case write:
			q = s.c.sqlite.dbs[ds].Writer()
		}
		for _, i := range byDS[ds] {
			lt := shards.liteTextOf(pl, b.Targets[i].SQL)
			var st *sql.Stmt
			var err error
			if tx == nil {
				st, err = shards.stmt(ctx, ds, onWriter, lt.text)
			} else {
				// A transaction holds the writer's one connection: preparing on the
				// writer pool would wait for it. Take a statement prepared earlier, bound
				// to the transaction's connection, or run the text.
				st = shards.prepared(ds, lt.text)
			}
			if err != nil {
				return err
			}
			var r sqlexec.ShardResult
			if st == nil {
				r, err = runSQLiteTarget(ctx, q, nil, pl, lt, b.Targets[i], args)
			} else {
				if tx != nil {
					st = tx.StmtContext(ctx, st)
				}
				r, err = runSQLiteTarget(ctx, nil, st, pl, lt, b.Targets[i], args)
				if tx != nil {
					st.Close()
				}
			}
			if err != nil {
				return err
			}
			results[i] = r
		}
		return nil
	}
	// A statement that writes, or runs in a transaction, takes each data source's one
	// writer connection and keeps it until it ends: it takes them one at a time, in
	// data source order, as the engine does on PostgreSQL, so that two such statements
	// over the same data sources cannot each hold one the other waits for.
	limit := fanout.DefaultLimit
	if write || s.inTx {
		limit = 1
	}
	err := fanout.Do(ctx, routing.NewShards(order...), s.c.cfg.Rules.NumDataSources(), runDS, fanout.FailFast(), fanout.WithLimit(limit))
	var failed fanout.Errors
	if errors.As(err, &failed) && len(failed) > 0 {
		err = &sqlexec.ShardError{DataSource: failed[0].Shard, Name: names[failed[0].Shard].Name, Err: sqliteError(failed[0].Err)}
	}
	for ds := range s.c.cfg.Rules.NumDataSources() {
		if tx := local[ds]; tx != nil {
			if err != nil {
				tx.Rollback()
			} else if cerr := tx.Commit(); cerr != nil {
				err = &sqlexec.ShardError{DataSource: ds, Name: names[ds].Name, Err: cerr}
			}
		}
	}
	if err != nil {
		if s.inTx {
			s.failed = true
		}
		return nil, err
	}
	if err := unifyTypes(results); err != nil {
		return nil, err
	}
	if err := checkSQLiteSums(b, results); err != nil {
		return nil, err
	}
	return s.c.engine.Combine(ctx, b, results, nil, sqlexec.CombineOptions{FloatAvg: true, TextByteOrder: true, NullsSmallest: true})
}

// unifyTypes gives each column one type across the targets: a target whose column held
// only NULLs takes the others' type, text when none had a value.
func unifyTypes(results []sqlexec.ShardResult) error {
	if len(results) == 0 || results[0].Fields == nil {
		return nil
	}
	for i := range results[0].Fields {
		var oid uint32
		for _, r := range results {
			if i >= len(r.Fields) {
				return fmt.Errorf("shardsql: shards returned different columns; are their schemas the same?")
			}
			got := r.Fields[i].DataTypeOID
			switch {
			case got == 0:
			case oid == 0:
				oid = got
			case got != oid:
				return fmt.Errorf("shardsql: column %s holds values of several types across shards (SQLite is dynamically typed)", r.Fields[i].Name)
			}
		}
		if oid == 0 {
			oid = 25
		}
		for _, r := range results {
			r.Fields[i].DataTypeOID = oid
		}
	}
	return nil
}

// checkSQLiteSums refuses sums and averages of REAL values across shards: SQLite adds
// floating-point values with compensated summation, which shard sums cannot reproduce.
func checkSQLiteSums(b *sqlplan.Bound, results []sqlexec.ShardResult) error {
	if b.Merge == nil || !b.Merge.Aggregate || len(results) < 2 {
		return nil
	}
	for _, c := range b.Merge.Columns {
		if c.Kind != sqlplan.AggSum && c.Kind != sqlplan.AggAvg {
			continue
		}
		for _, r := range results {
			for _, row := range r.Rows {
				if v := row[c.Shard]; v != nil && strings.ContainsAny(string(v), ".eEIN") {
					return sqlplan.Unsupported("sum() or avg() of REAL values across SQLite shards (SQLite adds them with compensated summation, which shard sums cannot reproduce)")
				}
			}
		}
	}
	return nil
}

// sqliteError turns SQLite's complaints about PostgreSQL syntax into a refusal that
// says what happened.
func sqliteError(err error) error {
	msg := err.Error()
	if strings.Contains(msg, "syntax error") || strings.Contains(msg, "no such function") {
		return sqlplan.Unsupported("the SQLite shard cannot run this statement (%s); SQLite shards take the part of PostgreSQL's SQL that SQLite accepts", msg)
	}
	return err
}

// runSQLiteTarget runs one target and turns its rows into the wire's text form, with
// PostgreSQL type OIDs, so that the merge reads them as it reads a PostgreSQL shard's.
// It runs st, a prepared statement, or else the text on q.
func runSQLiteTarget(ctx context.Context, q querier, st *sql.Stmt, pl *sqlplan.Plan, lt liteText, t sqlplan.Target, args []driver.NamedValue) (sqlexec.ShardResult, error) {
	vals := make([]any, 0, len(args))
	if t.Params == nil {
		for _, a := range args {
			vals = append(vals, a.Value)
		}
	} else {
		for _, p := range t.Params {
			vals = append(vals, args[p].Value)
		}
	}
	var r sqlexec.ShardResult
	if !lt.rows {
		var res sql.Result
		var err error
		if st != nil {
			res, err = st.ExecContext(ctx, vals...)
		} else {
			res, err = q.ExecContext(ctx, lt.text, vals...)
		}
		if err != nil {
			return r, err
		}
		n, _ := res.RowsAffected()
		r.Tag = tagFor(pl.Kind, n)
		return r, nil
	}
	var rows *sql.Rows
	var err error
	if st != nil {
		rows, err = st.QueryContext(ctx, vals...)
	} else {
		rows, err = q.QueryContext(ctx, lt.text, vals...)
	}
	if err != nil {
		return r, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return r, err
	}
	oids := make([]uint32, len(cols))
	for rows.Next() {
		raw := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range raw {
			ptrs[i] = &raw[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return r, err
		}
		row := make([][]byte, len(cols))
		for i, v := range raw {
			text, oid, err := sqliteText(v)
			if err != nil {
				return r, err
			}
			if oid != 0 {
				switch {
				case oids[i] == 0:
					oids[i] = oid
				case oids[i] != oid:
					return r, fmt.Errorf("column %s holds values of several types (SQLite is dynamically typed); the merge cannot compare them", cols[i])
				}
			}
			row[i] = text
		}
		r.Rows = append(r.Rows, row)
	}
	if err := rows.Err(); err != nil {
		return r, err
	}
	for i, c := range cols {
		// 0: no value told the type (yet); unifyTypes settles it across targets.
		r.Fields = append(r.Fields, pgconn.FieldDescription{Name: c, DataTypeOID: oids[i], DataTypeSize: -1, TypeModifier: -1})
	}
	r.Tag = tagFor(pl.Kind, int64(len(r.Rows)))
	return r, nil
}

// returnsRows reports whether a target's statement returns rows (a SELECT, or a write
// with RETURNING).
func returnsRows(pl *sqlplan.Plan, sql string) bool {
	if pl.Kind == sqlplan.KindSelect || pl.Kind == sqlplan.KindCoordinator {
		return true
	}
	for _, w := range sqlplan.Tokens(sql) {
		if strings.EqualFold(w, "returning") {
			return true
		}
	}
	return false
}

func tagFor(k sqlplan.Kind, n int64) pgconn.CommandTag {
	return sqlexec.CommandTag(k, n, pgconn.NewCommandTag(strings.ToUpper(k.String())))
}

// Numbers from SQLite travel as PostgreSQL numerics: a column of NUMERIC affinity holds
// integers and reals side by side, and numeric compares and adds both exactly. A real
// is written with a decimal point, an integer without, so that each comes back as the
// Go type SQLite gave (see sqliteNumber).
const oidNumeric = 1700

func sqliteFloat(f float64) []byte {
	switch {
	case math.IsNaN(f):
		return []byte("NaN")
	case math.IsInf(f, 1):
		return []byte("Infinity")
	case math.IsInf(f, -1):
		return []byte("-Infinity")
	}
	b := strconv.AppendFloat(nil, f, 'f', -1, 64)
	if !strings.ContainsRune(string(b), '.') {
		b = append(b, ".0"...)
	}
	return b
}

// sqliteNumber reads a number sqliteText wrote, or a merged sum or avg.
func sqliteNumber(b []byte) (driver.Value, error) {
	s := string(b)
	switch s {
	case "NaN":
		return math.NaN(), nil
	case "Infinity":
		return math.Inf(1), nil
	case "-Infinity":
		return math.Inf(-1), nil
	}
	if strings.ContainsAny(s, ".eE") {
		return strconv.ParseFloat(s, 64)
	}
	return strconv.ParseInt(s, 10, 64)
}

// sqliteText writes a SQLite value in PostgreSQL's text form with the OID of the type
// it reads back as (0 for NULL).
func sqliteText(v any) ([]byte, uint32, error) {
	switch x := v.(type) {
	case nil:
		return nil, 0, nil
	case int64:
		return strconv.AppendInt(nil, x, 10), oidNumeric, nil
	case float64:
		return sqliteFloat(x), oidNumeric, nil
	case string:
		return []byte(x), 25, nil
	case []byte:
		return []byte(`\x` + fmt.Sprintf("%x", x)), 17, nil
	case bool:
		if x {
			return []byte("t"), 16, nil
		}
		return []byte("f"), 16, nil
	case time.Time:
		return []byte(x.UTC().Format("2006-01-02 15:04:05.999999Z07:00")), 1184, nil
	}
	return nil, 0, fmt.Errorf("a SQLite value of type %T", v)
}
