package shardsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// conn is one database/sql connection: a session over the data sources.
type conn struct {
	c      *Connector
	s      *sqlexec.Session // PostgreSQL data sources
	sq     *sqliteSession   // SQLite data sources
	closed bool
	// txDDL: the open transaction ran DDL: its statements are planned on its own
	// connections' view of the schema (planContext), and plans made meanwhile are
	// forgotten when it ends (endTx).
	txDDL bool
	// streaming: the statement running now is a query whose rows the caller reads one
	// by one; a SELECT on PostgreSQL shards then leaves its rows in streamed, to be read
	// as they arrive, instead of gathering them.
	streaming bool
	streamed  *sqlexec.Rows
	// streamFail turns the errors of a coordinated answer's rows into what the program
	// sees (see coordinated); nil for any other answer.
	streamFail func(error) error
	// open is the last answer handed out as a stream; it may still hold connections
	// (see finishOpen).
	open *sqlexec.Rows
	// localTxn is the transaction (sqlexec.Session.Transaction) that ran a statement
	// which may change a setting for itself alone (set_config, DO, CALL): the
	// coordinator database's reads would not carry it. Zero: none.
	localTxn uint64
}

// finishOpen reads the rest of an answer still streaming into memory and frees the
// connections it holds, before another statement, a commit or a rollback on this
// connection: database/sql allows them while rows are open (tx.Exec inside a
// rows.Next loop), and they need those connections.
func (cn *conn) finishOpen() {
	if cn.open != nil {
		cn.open.Buffer() // an error stays with the rows, for their reader
		cn.open = nil
	}
}

var (
	_ driver.Conn               = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.QueryerContext     = (*conn)(nil)
	_ driver.ExecerContext      = (*conn)(nil)
	_ driver.SessionResetter    = (*conn)(nil)
	_ driver.Validator          = (*conn)(nil)
)

// typeMap encodes parameters and decodes results as pgx's own driver does.
var typeMap = pgtype.NewMap()

func (cn *conn) Prepare(query string) (driver.Stmt, error) {
	return cn.PrepareContext(context.Background(), query)
}

// PrepareContext plans the statement once; every execution binds that plan, and each
// shard prepares the statement it runs once per connection.
func (cn *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	cn.finishOpen()
	stmts := sqlplan.SplitStatements(query)
	if len(stmts) > 1 {
		return &stmt{cn: cn, query: query, multi: true}, nil
	}
	plan, err := cn.c.planner.Prepare(cn.planContext(ctx), query)
	if err != nil {
		return nil, err
	}
	if err := cn.analyse(ctx, plan); err != nil {
		return nil, err
	}
	return &stmt{cn: cn, query: query, plan: plan}, nil
}

// analyse reports at Prepare what PostgreSQL's analysis of the statement finds wrong,
// as pgx's driver does on one database: a column or function that does not exist, a
// constant of the wrong type (classes 42 and 22), a table that does not exist where
// the data source that describes the statement holds every other table it names (a
// statement may name tables that no one data source holds, which only the coordinator
// database describes: those report a missing table when they run). The description is
// kept for the executions.
// Inside a transaction nothing is described at Prepare: a pooled connection would not
// see the transaction's own tables, and the statement reports its errors when it runs.
func (cn *conn) analyse(ctx context.Context, plan *sqlplan.Plan) error {
	if cn.s == nil || cn.s.InTransaction() || cn.txDDL {
		return nil
	}
	switch plan.Kind {
	case sqlplan.KindSelect, sqlplan.KindInsert, sqlplan.KindUpdate, sqlplan.KindDelete, sqlplan.KindCoordinator:
	default:
		return nil // PostgreSQL analyses the others when they run
	}
	_, err := cn.describe(ctx, plan)
	return sqlexec.AnalysisError(err)
}

func (cn *conn) Close() error {
	if cn.closed {
		return nil
	}
	cn.closed = true
	if cn.open != nil {
		cn.open.Abort()
		cn.open = nil
	}
	if cn.sq != nil {
		return cn.sq.end(false)
	}
	return cn.s.Close(context.Background())
}

func (cn *conn) Begin() (driver.Tx, error) {
	return cn.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx opens a transaction; data sources join it when a statement first needs them.
func (cn *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	begin := "BEGIN"
	switch sqlIsolation(opts.Isolation) {
	case "":
	case "?":
		return nil, fmt.Errorf("shardsql: isolation level %d is not supported by PostgreSQL", opts.Isolation)
	default:
		begin += " ISOLATION LEVEL " + sqlIsolation(opts.Isolation)
	}
	if opts.ReadOnly {
		begin += " READ ONLY"
	}
	cn.finishOpen()
	if cn.sq != nil {
		return tx{cn}, cn.sq.begin()
	}
	if err := cn.s.Begin(begin); err != nil {
		return nil, err
	}
	return tx{cn}, nil
}

// sqlIsolation maps database/sql's isolation levels (sql.IsolationLevel) to
// PostgreSQL's: "" for the default, "?" for one PostgreSQL does not have.
func sqlIsolation(level driver.IsolationLevel) string {
	switch level {
	case 0:
		return ""
	case 1, 2: // read uncommitted, read committed
		return "READ COMMITTED"
	case 4: // repeatable read
		return "REPEATABLE READ"
	case 6: // serializable
		return "SERIALIZABLE"
	}
	return "?"
}

type tx struct{ cn *conn }

func (t tx) Commit() error {
	t.cn.finishOpen()
	if t.cn.sq != nil {
		return t.cn.sq.end(true)
	}
	defer t.cn.endTx()
	return t.cn.s.Commit(context.Background())
}

func (t tx) Rollback() error {
	t.cn.finishOpen()
	if t.cn.sq != nil {
		return t.cn.sq.end(false)
	}
	defer t.cn.endTx()
	return t.cn.s.Rollback(context.Background())
}

// planContext is the context a statement is planned under: in a transaction that ran
// DDL, the catalog's lookups go through the transaction's own connections, which see
// the schema it has not committed (sqlexec.WithCatalogPool).
func (cn *conn) planContext(ctx context.Context) context.Context {
	if !cn.txDDL || cn.sq != nil {
		return ctx
	}
	return sqlexec.WithCatalogPool(ctx, sqlexec.TransactionPool(cn.s))
}

// endTx forgets what lived for the transaction alone: plans made on its view of the
// schema, whether it committed or not.
func (cn *conn) endTx() {
	if cn.txDDL {
		cn.txDDL = false
		if cn.c.catalog != nil {
			cn.c.catalog.Invalidate()
		}
		cn.c.planner.Invalidate()
		if cn.c.coord != nil {
			// The schema others see changed at the commit (or not at all): the
			// coordinator database is built again for it.
			cn.c.coord.generation.Add(1)
		}
	}
}

// ResetSession rolls back what a previous user left open.
func (cn *conn) ResetSession(ctx context.Context) error {
	cn.finishOpen()
	if cn.sq != nil {
		return cn.sq.end(false)
	}
	if cn.s.InTransaction() {
		return cn.s.Rollback(ctx)
	}
	return nil
}

func (cn *conn) IsValid() bool { return !cn.closed }

func (cn *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return cn.query(func() (*sqlexec.Result, error) { return cn.run(ctx, query, args) })
}

// query runs a statement (run) whose rows the caller reads: those of a SELECT on
// PostgreSQL shards as they arrive (sqlexec.Engine.Query), any other's as gathered.
func (cn *conn) query(run func() (*sqlexec.Result, error)) (driver.Rows, error) {
	cn.finishOpen()
	cn.streaming = true
	res, err := run()
	cn.streaming = false
	streamed, fail := cn.streamed, cn.streamFail
	cn.streamed, cn.streamFail = nil, nil
	if err != nil {
		if streamed != nil {
			streamed.Close()
		}
		return nil, err
	}
	if streamed == nil {
		streamed = sqlexec.RowsOf(res)
	} else {
		cn.open = streamed
	}
	r, err := newRows(streamed, cn.sq != nil)
	if r != nil {
		r.fail = fail
	}
	return r, err
}

func (cn *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	cn.finishOpen()
	res, err := cn.run(ctx, query, args)
	if err != nil {
		return nil, err
	}
	return result(res.Tag), nil
}

// failStatement fails the open transaction after a statement's error, as PostgreSQL
// does after any error in a transaction block (a warning aside): one that failed
// before or between the data sources' work (its planning, a refusal, a step of a
// statement of several) must not let the transaction commit as if it had not run.
// txn is the transaction the statement began in (sqlexec.Session.Transaction): a
// transaction the statement began itself (COMMIT AND CHAIN) is not failed by its error.
// An error of the arguments, found before anything was sent (notSent), fails nothing,
// as pgx's driver fails nothing on one database.
func (cn *conn) failStatement(txn uint64, err error) error {
	var pe *pgconn.PgError
	var unsent notSent
	if err != nil && cn.s != nil && !(errors.As(err, &pe) && pe.Severity == "WARNING") && !errors.As(err, &unsent) {
		cn.s.Fail(txn)
	}
	return err
}

// notSent is an error of a statement's arguments, found before the statement was sent
// anywhere.
type notSent struct{ error }

func (e notSent) Unwrap() error { return e.error }

// txnNumber is the session's current transaction number (see failStatement).
func (cn *conn) txnNumber() uint64 {
	if cn.s == nil {
		return 0
	}
	return cn.s.Transaction()
}

// run executes a statement string: a single statement through a cached plan, several
// (allowed without arguments, as pgx allows them) one after another.
func (cn *conn) run(ctx context.Context, query string, args []driver.NamedValue) (*sqlexec.Result, error) {
	txn := cn.txnNumber()
	res, err := cn.runStatement(ctx, query, args)
	return res, cn.failStatement(txn, err)
}

func (cn *conn) runStatement(ctx context.Context, query string, args []driver.NamedValue) (*sqlexec.Result, error) {
	if len(args) == 0 {
		stmts := sqlplan.SplitStatementsAt(query)
		if len(stmts) != 1 {
			return cn.runMany(ctx, stmts)
		}
		return cn.runSimple(ctx, query)
	}
	plan, err := cn.c.planner.Prepare(cn.planContext(ctx), query)
	if err != nil {
		return nil, err
	}
	return cn.runPlan(ctx, plan, args)
}

// runMany runs the statements of one string as PostgreSQL runs them: one after the
// other, each planned after the one before ran, in one transaction (unless the
// caller's is open, or the string controls transactions itself), so that an error
// rolls the whole string back. It answers with the last statement's result.
func (cn *conn) runMany(ctx context.Context, stmts []sqlplan.Statement) (*sqlexec.Result, error) {
	cn.streaming = false // each statement ends before the next: the last one's rows are gathered
	implicit := cn.sq == nil && !cn.s.InTransaction() && !controlsTransactions(stmts)
	if implicit {
		if err := cn.s.Begin("BEGIN"); err != nil {
			return nil, err
		}
	}
	last := &sqlexec.Result{}
	for _, q := range stmts {
		r, err := cn.runSimple(ctx, q.SQL)
		if err != nil {
			if implicit {
				cn.s.Rollback(context.WithoutCancel(ctx))
				cn.endTx()
			}
			// PostgreSQL counts an error's position from the start of the string.
			return nil, sqlexec.ShiftPosition(err, q.Offset)
		}
		last = r
	}
	if implicit {
		err := cn.s.Commit(ctx)
		cn.endTx()
		if err != nil {
			return nil, err
		}
	}
	return last, nil
}

// controlsTransactions reports whether one of the statements is BEGIN, COMMIT,
// ROLLBACK or another transaction statement, which then runs as written.
func controlsTransactions(stmts []sqlplan.Statement) bool {
	for _, q := range stmts {
		switch strings.ToUpper(firstWord(q.SQL)) {
		case "BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE", "PREPARE":
			return true
		}
	}
	return false
}

// firstWord returns the first keyword of a statement, past comments and blanks.
func firstWord(q string) string {
	if w := sqlplan.Tokens(q); len(w) > 0 {
		return w[0]
	}
	return ""
}

// runSimple runs a statement without arguments: its literals are normalised so that
// statements differing only in values share a plan.
func (cn *conn) runSimple(ctx context.Context, query string) (*sqlexec.Result, error) {
	plan, lits, err := cn.c.planner.PlanSimple(cn.planContext(ctx), query)
	if err != nil {
		return nil, err
	}
	if plan.Feed != nil {
		// Its query and batches are planned from its own text (Feed.Query).
		res, err := cn.execute(ctx, &sqlplan.Bound{Plan: plan}, sqlplan.Args{}, nil)
		return res, sqlexec.AtClient(err, query, nil)
	}
	var a sqlplan.Args
	if a.Keys, err = cn.drawKeys(ctx, plan); err != nil {
		return nil, err
	}
	b, err := plan.BindSimpleArgs(query, lits, a)
	if cn.preRefused(plan, err) {
		res, err := cn.runPre(ctx, plan, query, err, a, nil)
		return res, sqlexec.AtClient(err, query, nil) // its steps are statements of their own
	}
	if err != nil {
		return nil, err
	}
	res, err := cn.execute(ctx, b, a, nil)
	if err != nil {
		return res, sqlexec.AtClient(err, query, sqlexec.SentTexts(b, err))
	}
	return res, nil
}

// drawKeys draws the keys an INSERT leaves to its key's sequence (sqlplan.Plan.Keys);
// none for any other statement.
func (cn *conn) drawKeys(ctx context.Context, plan *sqlplan.Plan) ([]string, error) {
	if plan.Keys == nil {
		return nil, nil
	}
	if cn.s == nil {
		return nil, sqlplan.Unsupported("an INSERT that draws its sharding key from a sequence, on SQLite data sources")
	}
	keys, err := sqlexec.DrawKeys(ctx, cn.s, plan.Keys)
	if errors.Is(err, sqlexec.ErrKeyDefaultChanged) {
		cn.c.catalog.Invalidate()
		cn.c.planner.Invalidate()
		return nil, sqlplan.UnsupportedHint("Run it again.", "the default of sharding key %s.%s changed since the statement was planned", plan.Keys.Table, plan.Keys.Column)
	}
	return keys, err
}

// description is what a statement's parameters are, learned once from a shard.
type description struct {
	paramOIDs []uint32
}

type describeKey struct{}

func (cn *conn) describe(ctx context.Context, plan *sqlplan.Plan) (*description, error) {
	v, err := plan.Memo(describeKey{}, func() (any, error) {
		coord := sqlplan.CoordinatorSource(cn.c.cfg.Rules)
		ds, sql := plan.DescribeSQL()
		if ds == coord && (cn.c.coord == nil || plan.Kind != sqlplan.KindCoordinator && plan.Feed == nil && plan.Pre == nil) {
			// Only the coordinator database could describe it (its tables are on no
			// one data source), and it does not answer it here (without one, or a
			// write whose subqueries run first): the statement's own refusal.
			if plan.Feed != nil {
				return nil, sqlplan.Unsupported("INSERT ... SELECT into sharded table %s over tables that no one data source holds, without the coordinator database (shardsql.Config.Coordinate)", plan.Feed.Table)
			}
			if _, err := plan.Bind(sqlplan.Args{}); err != nil {
				return nil, err
			}
			return nil, sqlplan.Unsupported("a statement over tables that no one data source holds, without the coordinator database (shardsql.Config.Coordinate)")
		}
		var d description
		var described string // the text the last description sent
		describeOn := func(ds int, sql string) error {
			described = sql
			if ds == coord {
				// Described by the coordinator database, which must be built first.
				if err := cn.readyCoordinator(ctx, plan.Refused); err != nil {
					return err
				}
			}
			err := runOn(ctx, cn.c.pools, ds, func(pc *pgconn.PgConn) error {
				sd, err := pc.Prepare(ctx, "", sql, nil)
				if err != nil {
					return err
				}
				d.paramOIDs = sd.ParamOIDs
				return nil
			})
			if err == nil {
				return nil
			}
			if ds == coord {
				return cn.coordinatorFailure(ctx, plan.Refused, plan, nil, sql, nil, err)
			}
			return sqlexec.LogicalNames(&sqlexec.ShardError{DataSource: ds, Name: cn.c.cfg.Rules.DataSources()[ds].Name, Err: err}, cn.c.cfg.Rules)
		}
		err := describeOn(ds, sql)
		var genuine, notHeld bool // the error is one database's; a table the statement names is elsewhere
		if err != nil && ds != coord {
			genuine, notHeld = sqlexec.JudgeDescription(ctx, plan, cn.c.cfg.Rules, ds, err, func(ds int, fn func(*pgconn.PgConn) error) error {
				return runOn(ctx, cn.c.pools, ds, fn)
			})
		}
		var pe *pgconn.PgError
		if err != nil && !genuine && ds != coord && cn.c.coord != nil && plan.MayCoordinate() && plan.Feed == nil && plan.Pre == nil &&
			errors.As(err, &pe) && strings.HasPrefix(pe.Code, "42") {
			// A statement the coordinator may answer can name tables that no one data
			// source holds (a default data source's table beside shards elsewhere).
			ds = coord
			err = describeOn(ds, plan.SQL)
		}
		if err != nil && notHeld && ds != coord {
			return nil, sqlexec.NotHeld(cn.c.cfg.Rules, ds, err)
		}
		if err != nil {
			return nil, sqlexec.AtClient(err, plan.SQL, []string{described})
		}
		return &d, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*description), nil
}

// runOn runs fn on a connection of data source ds borrowed from p.
func runOn(ctx context.Context, p sqlexec.Pool, ds int, fn func(*pgconn.PgConn) error) error {
	l, err := p.Acquire(ctx, ds)
	if err != nil {
		return err
	}
	err = l.Run(ctx, fn)
	l.Release(sqlexec.Reusable(err))
	return err
}

// runPlan binds a plan to database/sql arguments and runs it.
func (cn *conn) runPlan(ctx context.Context, plan *sqlplan.Plan, args []driver.NamedValue) (*sqlexec.Result, error) {
	if len(args) != plan.NumParams {
		return nil, notSent{fmt.Errorf("shardsql: the statement takes %d arguments, got %d", plan.NumParams, len(args))}
	}
	var a sqlplan.Args
	if cn.sq != nil {
		// SQLite shards take the Go values; the text form only routes.
		for _, arg := range args {
			v, err := encodeArg(arg.Value, 0)
			if err != nil {
				return nil, notSent{err}
			}
			a.Values = append(a.Values, v)
		}
	} else if len(args) > 0 {
		d, err := cn.describe(ctx, plan)
		if err != nil {
			return nil, err
		}
		a.OIDs = d.paramOIDs
		a.Values = make([][]byte, len(args))
		for i, arg := range args {
			v, err := encodeArg(arg.Value, d.paramOIDs[i])
			if err != nil {
				return nil, notSent{fmt.Errorf("shardsql: argument $%d: %w", i+1, err)}
			}
			a.Values[i] = v
		}
	}
	keys, err := cn.drawKeys(ctx, plan)
	if err != nil {
		return nil, err
	}
	a.Keys = keys
	b, err := plan.Bind(a)
	if cn.preRefused(plan, err) {
		res, err := cn.runPre(ctx, plan, plan.SQL, err, a, a.OIDs)
		return res, sqlexec.AtClient(err, plan.SQL, nil)
	}
	if err != nil {
		return nil, err
	}
	res, err := cn.execute(ctx, b, a, args)
	if err != nil {
		var sent []string
		if plan.Feed == nil {
			sent = sqlexec.SentTexts(b, err)
		}
		return res, sqlexec.AtClient(err, plan.SQL, sent)
	}
	return res, nil
}

// execute runs a bound statement; transaction statements act on the session.
func (cn *conn) execute(ctx context.Context, b *sqlplan.Bound, a sqlplan.Args, args []driver.NamedValue) (*sqlexec.Result, error) {
	pl := b.Plan
	if cn.s != nil && cn.s.InTransaction() && pl.Session&(sqlplan.EffectSetConfig|sqlplan.EffectOpaque) != 0 {
		cn.localTxn = cn.s.Transaction()
	}
	switch pl.Kind {
	case sqlplan.KindEmpty:
		return &sqlexec.Result{}, nil
	case sqlplan.KindTransaction:
		return cn.transaction(ctx, pl)
	case sqlplan.KindSet, sqlplan.KindDiscard:
		return nil, sqlplan.Unsupported("SET, RESET and DISCARD on a database/sql handle (its connections are pooled per data source): set run-time parameters in the data sources' DSNs")
	case sqlplan.KindCopy:
		return nil, sqlplan.Unsupported("COPY through database/sql; use INSERT, or the wire proxy")
	case sqlplan.KindListen:
		return nil, sqlplan.Unsupported("LISTEN, UNLISTEN and NOTIFY through database/sql (its connections are pooled): listen on a connection of your own to the first data source, or through the wire proxy; SELECT pg_notify(channel, payload) sends")
	}
	if pl.Feed != nil {
		if cn.sq != nil {
			return nil, feedRefused(pl.Feed)
		}
		return cn.insertSelect(ctx, pl, a, a.OIDs)
	}
	if b.Coordinated() && cn.sq == nil {
		return cn.coordinated(ctx, b, a, nil)
	}
	var res *sqlexec.Result
	var err error
	if cn.streaming && cn.sq == nil && pl.Kind == sqlplan.KindSelect {
		cn.streamed, err = cn.c.engine.Query(ctx, b, a, nil, cn.s)
		if err != nil {
			return nil, err
		}
		return &sqlexec.Result{Fields: cn.streamed.Fields()}, nil
	}
	if cn.sq != nil {
		res, err = cn.sq.run(ctx, b, args)
	} else {
		res, err = cn.c.engine.Execute(ctx, b, a, nil, cn.s)
	}
	if pl.Kind == sqlplan.KindDDL {
		if cn.c.catalog != nil {
			cn.c.catalog.Invalidate()
		}
		cn.c.planner.Invalidate()
		if cn.c.coord != nil {
			cn.c.coord.generation.Add(1)
		}
		if cn.c.sqliteCoord != nil {
			cn.c.sqliteCoord.generation.Add(1)
		}
		if cn.sq == nil && cn.s.InTransaction() {
			cn.txDDL = true
		}
	}
	return res, err
}

// transaction carries out BEGIN, COMMIT, ROLLBACK and savepoints sent as statements.
func (cn *conn) transaction(ctx context.Context, pl *sqlplan.Plan) (*sqlexec.Result, error) {
	tag := ""
	var err error
	if cn.sq != nil {
		if pl.Chain {
			return nil, sqlplan.Unsupported("COMMIT AND CHAIN and ROLLBACK AND CHAIN on SQLite shards")
		}
		switch pl.Tx {
		case sqlplan.TxBegin:
			tag, err = "BEGIN", cn.sq.begin()
		case sqlplan.TxCommit:
			tag, err = "COMMIT", cn.sq.end(true)
		case sqlplan.TxRollback:
			tag, err = "ROLLBACK", cn.sq.end(false)
		default:
			return nil, sqlplan.Unsupported("savepoints on SQLite shards")
		}
		if err != nil {
			return nil, err
		}
		return &sqlexec.Result{Tag: pgconn.NewCommandTag(tag)}, nil
	}
	switch pl.Tx {
	case sqlplan.TxBegin:
		// The statement as written: its options (ISOLATION LEVEL, READ ONLY) hold on
		// every data source the transaction joins.
		tag, err = "BEGIN", cn.s.Begin(pl.SQL)
	case sqlplan.TxCommit, sqlplan.TxRollback:
		return cn.endTransaction(ctx, pl)
	default:
		name := pl.Savepoint
		switch pl.Tx {
		case sqlplan.TxSavepoint:
			tag, err = "SAVEPOINT", cn.s.Savepoint(ctx, name)
		case sqlplan.TxRelease:
			tag, err = "RELEASE", cn.s.ReleaseSavepoint(ctx, name)
		case sqlplan.TxRollbackTo:
			tag, err = "ROLLBACK", cn.s.RollbackTo(ctx, name)
		}
	}
	if err != nil {
		return nil, err
	}
	return &sqlexec.Result{Tag: pgconn.NewCommandTag(tag)}, nil
}

// endTransaction carries out COMMIT and ROLLBACK sent as statements, AND CHAIN
// included, answering with PostgreSQL's command tags.
func (cn *conn) endTransaction(ctx context.Context, pl *sqlplan.Plan) (*sqlexec.Result, error) {
	if pl.Chain && !cn.s.InTransaction() {
		name := "COMMIT AND CHAIN"
		if pl.Tx == sqlplan.TxRollback {
			name = "ROLLBACK AND CHAIN"
		}
		return nil, &pgconn.PgError{Severity: "ERROR", Code: "25P01", Message: name + " can only be used in transaction blocks"}
	}
	var begin string
	if pl.Chain {
		var err error
		if begin, err = cn.s.ChainBegin(ctx, cn.s, -1, cn.s.Failed()); err != nil {
			return nil, err
		}
	}
	// COMMIT of a failed transaction rolls it back and says so with an error (40000):
	// a database/sql caller sees no command tag. The chained transaction starts all
	// the same, as on PostgreSQL; after a commit that failed, it does not.
	failed := cn.s.Failed()
	tag := "COMMIT"
	var err error
	if pl.Tx == sqlplan.TxRollback {
		tag, err = "ROLLBACK", cn.s.Rollback(ctx)
	} else {
		err = cn.s.Commit(ctx)
	}
	cn.endTx()
	if pl.Chain && (err == nil || failed) {
		if berr := cn.s.BeginChained(begin); berr != nil {
			return nil, berr
		}
	}
	if err != nil {
		return nil, err
	}
	return &sqlexec.Result{Tag: pgconn.NewCommandTag(tag)}, nil
}

// encodeArg writes a database/sql value as PostgreSQL text for a parameter of type oid
// (0 when the server could not tell).
func encodeArg(v any, oid uint32) ([]byte, error) {
	if v == nil {
		return nil, nil
	}
	// The common cases without pgtype's plan lookup, which costs more than the work.
	switch x := v.(type) {
	case int64:
		switch oid {
		case 0, 20, 21, 23, 1700, 25, 1043:
			return strconv.AppendInt(nil, x, 10), nil
		}
	case string:
		switch oid {
		case 0, 25, 1043, 1042, 19, 705:
			return append([]byte{}, x...), nil
		}
	}
	if oid != 0 {
		if _, ok := typeMap.TypeForOID(oid); ok {
			buf, err := typeMap.Encode(oid, pgtype.TextFormatCode, v, nil)
			if err == nil {
				if buf == nil {
					buf = []byte{} // an empty value, not NULL
				}
				return buf, nil
			}
		}
	}
	switch x := v.(type) {
	case string:
		return append([]byte{}, x...), nil
	case []byte:
		return append([]byte{}, x...), nil
	case int64:
		return strconv.AppendInt(nil, x, 10), nil
	case float64:
		return strconv.AppendFloat(nil, x, 'g', -1, 64), nil
	case bool:
		if x {
			return []byte("t"), nil
		}
		return []byte("f"), nil
	case time.Time:
		return []byte(x.Format("2006-01-02 15:04:05.999999999Z07:00")), nil
	}
	return nil, fmt.Errorf("cannot send a %T", v)
}

// stmt is a prepared statement: one plan, bound at each execution.
type stmt struct {
	cn    *conn
	query string
	plan  *sqlplan.Plan
	multi bool // several statements: run as a string, without arguments
}

var (
	_ driver.StmtQueryContext = (*stmt)(nil)
	_ driver.StmtExecContext  = (*stmt)(nil)
)

func (s *stmt) Close() error { return nil }

func (s *stmt) NumInput() int {
	if s.multi {
		return 0
	}
	return s.plan.NumParams
}

func (s *stmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.ExecContext(context.Background(), named(args))
}

func (s *stmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.QueryContext(context.Background(), named(args))
}

func (s *stmt) exec(ctx context.Context, args []driver.NamedValue) (*sqlexec.Result, error) {
	txn := s.cn.txnNumber()
	res, err := s.run(ctx, args)
	return res, s.cn.failStatement(txn, err)
}

func (s *stmt) run(ctx context.Context, args []driver.NamedValue) (*sqlexec.Result, error) {
	if s.multi {
		return s.cn.run(ctx, s.query, nil)
	}
	if s.plan.Keys != nil {
		// The key's default may have changed since Prepare (a draw that finds it so
		// drops the planner's cache): the planner holds the current plan.
		plan, err := s.cn.c.planner.Prepare(s.cn.planContext(ctx), s.query)
		if err != nil {
			return nil, err
		}
		s.plan = plan
	}
	return s.cn.runPlan(ctx, s.plan, args)
}

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.cn.finishOpen()
	res, err := s.exec(ctx, args)
	if err != nil {
		return nil, err
	}
	return result(res.Tag), nil
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return s.cn.query(func() (*sqlexec.Result, error) { return s.exec(ctx, args) })
}

func named(args []driver.Value) []driver.NamedValue {
	out := make([]driver.NamedValue, len(args))
	for i, a := range args {
		out[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
	}
	return out
}

// result is a statement's row count.
type result pgconn.CommandTag

func (r result) LastInsertId() (int64, error) {
	return 0, errors.New("shardsql: LastInsertId is not supported; use INSERT ... RETURNING")
}

func (r result) RowsAffected() (int64, error) { return pgconn.CommandTag(r).RowsAffected(), nil }

// rows reads an answer, streamed or gathered (sqlexec.Rows).
type rows struct {
	src    *sqlexec.Rows
	fields []pgconn.FieldDescription
	decode []func([]byte) (driver.Value, error)
	fail   func(error) error // a coordinated answer's (see conn.streamFail)
}

// failed is err as the program sees it.
func (r *rows) failed(err error) error {
	if r.fail != nil {
		return r.fail(err)
	}
	return err
}

var _ driver.RowsColumnTypeDatabaseTypeName = (*rows)(nil)

// newRows reads an answer; lite marks SQLite shards, whose numbers come back as the
// int64 or float64 SQLite gave.
func newRows(src *sqlexec.Rows, lite bool) (*rows, error) {
	r := &rows{src: src, fields: src.Fields()}
	for _, f := range r.fields {
		oid, format := f.DataTypeOID, f.Format
		if lite && (oid == oidNumeric || oid == 701) {
			r.decode = append(r.decode, sqliteNumber)
			continue
		}
		// The common text-format cases without pgtype's plan lookup; the values are the
		// ones pgx's driver gives.
		if format == 0 {
			switch oid {
			case 20, 21, 23:
				r.decode = append(r.decode, decodeInt)
				continue
			case 25, 1043, 1042, 19:
				r.decode = append(r.decode, decodeString)
				continue
			}
		}
		t, ok := typeMap.TypeForOID(oid)
		if !ok {
			r.decode = append(r.decode, func(b []byte) (driver.Value, error) { return string(b), nil })
			continue
		}
		codec := t.Codec
		r.decode = append(r.decode, func(b []byte) (driver.Value, error) {
			return codec.DecodeDatabaseSQLValue(typeMap, oid, format, b)
		})
	}
	return r, nil
}

func decodeInt(b []byte) (driver.Value, error)    { return strconv.ParseInt(string(b), 10, 64) }
func decodeString(b []byte) (driver.Value, error) { return string(b), nil }

func (r *rows) Columns() []string {
	out := make([]string, len(r.fields))
	for i, f := range r.fields {
		out[i] = f.Name
	}
	return out
}

// Close ends the answer; shards still sending rows stop.
func (r *rows) Close() error {
	_, err := r.src.Close()
	return r.failed(err)
}

func (r *rows) Next(dest []driver.Value) error {
	if !r.src.Next() {
		if _, err := r.src.Close(); err != nil {
			return r.failed(err)
		}
		return io.EOF
	}
	for i, v := range r.src.Values() {
		if v == nil {
			dest[i] = nil
			continue
		}
		val, err := r.decode[i](v)
		if err != nil {
			return fmt.Errorf("shardsql: column %s: %w", r.fields[i].Name, err)
		}
		dest[i] = val
	}
	return nil
}

// ColumnTypeDatabaseTypeName returns the column's PostgreSQL type name, upper case.
func (r *rows) ColumnTypeDatabaseTypeName(i int) string {
	if t, ok := typeMap.TypeForOID(r.fields[i].DataTypeOID); ok {
		return strings.ToUpper(t.Name)
	}
	return ""
}

// Explain describes where and how a statement would run with these arguments: the
// shards, the SQL each would run, and the merge (sqlplan.Bound.Explain). It plans and
// binds the statement without running it.
//
//	conn, _ := db.Conn(ctx)
//	defer conn.Close()
//	text, err := shardsql.Explain(ctx, conn, "SELECT * FROM t_order WHERE order_id = $1", 42)
func Explain(ctx context.Context, c *sql.Conn, query string, args ...any) (string, error) {
	var out string
	err := c.Raw(func(dc any) error {
		cn, ok := dc.(*conn)
		if !ok {
			return fmt.Errorf("shardsql: Explain needs a connection of the %q driver, not %T", DriverName, dc)
		}
		var b *sqlplan.Bound
		if len(args) == 0 {
			plan, lits, err := cn.c.planner.PlanSimple(ctx, query)
			if err != nil {
				return err
			}
			if plan.Keys != nil {
				out = plan.ExplainKeys() // explaining draws no keys
				return nil
			}
			if b, err = plan.BindSimple(query, lits); err != nil {
				return err
			}
		} else {
			plan, err := cn.c.planner.Prepare(ctx, query)
			if err != nil {
				return err
			}
			a := sqlplan.Args{}
			for _, v := range args {
				dv, err := driver.DefaultParameterConverter.ConvertValue(v)
				if err != nil {
					return err
				}
				enc, err := encodeArg(dv, 0)
				if err != nil {
					return err
				}
				a.Values = append(a.Values, enc)
			}
			if plan.Keys != nil {
				out = plan.ExplainKeys()
				return nil
			}
			if b, err = plan.Bind(a); err != nil {
				return err
			}
		}
		out = b.Explain()
		return nil
	})
	return out, err
}

// feedRefused refuses an INSERT ... SELECT into a sharded table on SQLite data
// sources (sqlplan.Feed), which only PostgreSQL data sources run so far.
func feedRefused(f *sqlplan.Feed) error {
	return sqlplan.UnsupportedHint("Select the rows and insert them with VALUES.",
		"INSERT ... SELECT into sharded table %s on SQLite data sources: its rows must be read, then routed one by one, which only PostgreSQL data sources do so far", f.Table)
}
