package sqlexec

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/sqlplan"
)

// Lease is one connection borrowed from a data source's pool.
type Lease interface {
	// Run calls fn with the connection. It stays the lease's until Release: a Session
	// reads a one-target answer from it after Run returned (Engine.Query).
	Run(ctx context.Context, fn func(*pgconn.PgConn) error) error
	// Release returns the connection; reuse false closes it (it may be broken, or hold
	// state another user must not see).
	Release(reuse bool)
}

// Pool lends connections to the data sources of a set of rules.
type Pool interface {
	Acquire(ctx context.Context, ds int) (Lease, error)
}

// ErrTxAborted is returned by statements in a transaction after one failed, until
// ROLLBACK, as PostgreSQL does (SQLSTATE 25P02). The targets of one statement run at
// once: one that starts after a sibling failed meets it too, and the statement's error
// is then the sibling's, never this one.
var ErrTxAborted = &pgconn.PgError{Severity: "ERROR", Code: "25P02",
	Message: "current transaction is aborted, commands ignored until end of transaction block"}

// Session is one client's logical connection to the sharded database: it holds at most
// one connection per data source, and a transaction across the data sources it
// touches. Outside a transaction each statement borrows connections and gives them
// back; in one, a data source joins the transaction (BEGIN, then the savepoints made so
// far) the first time a statement needs it. It implements Conns.
//
// A Session is used by one goroutine at a time (a driver connection, a proxy client).
type Session struct {
	pool      Pool
	committer *Committer

	mu      sync.Mutex // guards held, begun, broken, touched and pids: Run is called concurrently per data source
	held    map[int]Lease
	begun   map[int]bool
	broken  map[int]bool // data sources whose connection saw an error that forbids reusing it
	inTx    bool
	failed  bool
	begin   string   // the BEGIN statement, with the transaction's options
	chained bool     // the transaction was started by COMMIT AND CHAIN or ROLLBACK AND CHAIN
	saves   []string // open savepoints, oldest first
	touched []int    // data sources in the transaction, in the order they joined
	pids    map[int]uint32
	begunAt time.Time
	txn     uint64 // counts the session's transactions

	detector *DeadlockDetector
	victim   atomic.Bool // the detector cancelled this transaction's wait
	outside  int         // see SetOutside; -1: none
}

// SetOutside keeps data source ds out of the session's transactions: a statement there
// runs in a transaction of its own even while one is open, and its connection goes
// back to the pool after it, as outside a transaction. It is for the coordinator
// database, whose reads see only committed rows and which no commit includes.
func (s *Session) SetOutside(ds int) { s.outside = ds }

// SetDeadlockDetector makes d watch this session's transactions for deadlocks that
// span data sources.
func (s *Session) SetDeadlockDetector(d *DeadlockDetector) { s.detector = d }

// backends returns the backend process of each data source in the transaction, when
// the transaction began, and its number among the session's transactions.
func (s *Session) backends() (map[int]int, time.Time, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int]int, len(s.pids))
	for ds, pid := range s.pids {
		out[ds] = int(pid)
	}
	return out, s.begunAt, s.txn
}

// markDeadlocked records that the detector chose this session as a deadlock's victim.
func (s *Session) markDeadlocked([]*Session) { s.victim.Store(true) }

var _ Conns = (*Session)(nil)

// NewSession returns a session borrowing from pool and committing through committer.
func NewSession(pool Pool, committer *Committer) *Session {
	return &Session{pool: pool, committer: committer, held: map[int]Lease{}, begun: map[int]bool{}, outside: -1}
}

// Run implements Conns.
func (s *Session) Run(ctx context.Context, ds int, fn func(*pgconn.PgConn) error) error {
	return s.RunJoining(ctx, ds, func(conn *pgconn.PgConn, join []string) (bool, error) {
		for _, q := range join {
			if err := conn.Exec(ctx, q).Close(); err != nil {
				return false, err
			}
		}
		return true, fn(conn)
	})
}

// RunJoining is Run for a caller that sends what a data source owes the transaction
// when it joins (BEGIN with the transaction's options, then the savepoints made so far)
// itself, ahead of its own statement and in the same round trip, which saves one round
// trip per data source and transaction. fn gets those statements in join (none when
// the data source has joined already, or outside a transaction) and reports whether
// they all ran; it must send them so that their failure keeps its statement from
// running (in one Sync block of the extended protocol, or first in one simple query).
func (s *Session) RunJoining(ctx context.Context, ds int, fn func(conn *pgconn.PgConn, join []string) (joined bool, err error)) error {
	s.mu.Lock()
	lease := s.held[ds]
	join := s.inTx && !s.begun[ds] && ds != s.outside
	failed := s.inTx && s.failed
	s.mu.Unlock()
	if failed {
		return ErrTxAborted
	}
	if lease == nil {
		var err error
		if lease, err = s.pool.Acquire(ctx, ds); err != nil {
			return err
		}
		s.mu.Lock()
		s.held[ds] = lease
		s.mu.Unlock()
	}
	err := lease.Run(ctx, func(conn *pgconn.PgConn) error {
		var stmts []string
		if join {
			stmts = append([]string{s.begin}, savepointStmts(s.saves)...)
			// The deadlock detector watches the backend from the first statement on,
			// which may wait for a lock in the same round trip as the BEGIN.
			s.mu.Lock()
			if s.pids == nil {
				s.pids = map[int]uint32{}
			}
			s.pids[ds] = conn.PID()
			s.mu.Unlock()
		}
		joined, err := fn(conn, stmts)
		if join {
			s.mu.Lock()
			if joined {
				s.begun[ds] = true
				s.touched = append(s.touched, ds)
			} else {
				delete(s.pids, ds)
			}
			s.mu.Unlock()
		}
		return err
	})
	return s.statementError(ds, err)
}

// statementError records a statement's error on data source ds, met inside Run or
// after it (the rest of a one-target answer, read as the caller asks), and returns it
// as the caller should see it: the cancel the deadlock detector sent its victim
// becomes 40P01. Inside a transaction the transaction has failed, and a connection
// that must not serve anyone else is dropped when the transaction ends: one whose
// aborted answer may still meet a cancel request sent late (errAborted). A cancelled
// statement (57014) used its cancel up, and a broken connection its pool drops anyway.
func (s *Session) statementError(ds int, err error) error {
	if err == nil {
		return nil
	}
	// Judged on the server's error, before a victim's cancel becomes 40P01.
	drop := !Reusable(err) && !isCancel(err)
	if s.victim.Load() && isCancel(err) {
		var names []string
		for _, ds := range s.Touched() {
			names = append(names, s.committer.name(ds))
		}
		err = deadlockError(names)
	}
	if s.inTx && ds != s.outside {
		// An error of the data source kept outside fails the transaction only as the
		// caller decides (its error may be checked against a data source inside it
		// first, or become a refusal).
		s.mu.Lock()
		s.failed = true
		if drop {
			if s.broken == nil {
				s.broken = map[int]bool{}
			}
			s.broken[ds] = true
		}
		s.mu.Unlock()
	}
	return err
}

func savepointStmts(saves []string) []string {
	out := make([]string, len(saves))
	for i, name := range saves {
		out[i] = "SAVEPOINT " + name
	}
	return out
}

// Release implements Conns: outside a transaction (or from the data source kept
// outside, see SetOutside) the connection goes back to its pool.
func (s *Session) Release(ds int, err error) {
	if s.inTx && ds != s.outside {
		return
	}
	s.mu.Lock()
	lease := s.held[ds]
	delete(s.held, ds)
	s.mu.Unlock()
	if lease != nil {
		lease.Release(reusable(err))
	}
}

// isCancel reports whether err is a query cancelled by pg_cancel_backend.
func isCancel(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "57014"
}

// Reusable reports whether a connection that saw err may serve someone else: after a
// server's answer to a statement yes; after a network error, or a cancelled statement
// (a cancel request sent late could reach the next user's statement), no. The driver,
// the proxy and the engine all decide by it.
func Reusable(err error) bool {
	if err == nil {
		return true
	}
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code != "57014" && pe.Severity != "FATAL" && pe.Severity != "PANIC"
}

func reusable(err error) bool { return Reusable(err) }

// InTransaction implements Conns.
func (s *Session) InTransaction() bool { return s.inTx }

// Failed reports whether a statement of the open transaction failed.
func (s *Session) Failed() bool { return s.inTx && s.failed }

// Fail marks the open transaction failed, as PostgreSQL does after any error in it: a
// statement of several steps that failed outside Run (between batches it had already
// written) leaves nothing the transaction can commit. txn is the transaction the
// failed statement ran in (Transaction, read before it ran): one begun since (COMMIT
// AND CHAIN) is left alone. Outside a transaction it does nothing.
func (s *Session) Fail(txn uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inTx && s.txn == txn {
		s.failed = true
	}
}

// Transaction numbers the session's transactions: the open one's, or the last one's.
func (s *Session) Transaction() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.txn
}

// Begin opens a transaction; beginSQL is the BEGIN statement each data source runs
// when it joins ("BEGIN", or with options such as ISOLATION LEVEL).
func (s *Session) Begin(beginSQL string) error {
	if s.inTx {
		return &pgconn.PgError{Severity: "WARNING", Code: "25001", Message: "there is already a transaction in progress"}
	}
	if beginSQL == "" {
		beginSQL = "BEGIN"
	}
	s.inTx, s.failed, s.chained, s.begin, s.saves, s.touched = true, false, false, beginSQL, nil, nil
	s.mu.Lock()
	s.pids, s.begunAt = nil, time.Now()
	s.txn++
	s.mu.Unlock()
	s.victim.Store(false)
	if s.detector != nil {
		s.detector.watch(s)
	}
	return nil
}

// Carry takes over the transaction old has open, if it has begun on no data source
// yet (its BEGIN and savepoints are still to be sent): the transaction goes on in s,
// and old is left outside one. It reports false, and changes nothing, if a data
// source has joined old's transaction, or old holds a connection.
func (s *Session) Carry(old *Session) bool {
	if !old.inTx {
		return true
	}
	old.mu.Lock()
	joined := len(old.begun) > 0 || len(old.held) > 0
	old.mu.Unlock()
	if joined {
		return false
	}
	begin, chained, failed, saves := old.begin, old.chained, old.failed, old.saves
	old.end()
	_ = s.Begin(begin) // s is outside a transaction: Begin does not refuse
	s.chained, s.failed, s.saves = chained, failed, saves
	return true
}

// Touched returns the data sources the open transaction has joined, in order.
func (s *Session) Touched() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.touched)
}

// Commit commits the transaction on every data source it touched (through the
// committer: best effort or two-phase). After a failed statement it rolls back instead
// and returns ErrTxAborted's cousin, as PostgreSQL answers COMMIT with ROLLBACK.
func (s *Session) Commit(ctx context.Context) error {
	if !s.inTx {
		return nil
	}
	defer s.end()
	if s.failed {
		s.failed = false // let ROLLBACK through
		s.committer.Rollback(context.WithoutCancel(ctx), s, s.touched)
		return &pgconn.PgError{Severity: "ERROR", Code: "40000", Message: "the transaction was rolled back: a statement in it failed"}
	}
	return s.committer.Commit(ctx, s, s.touched)
}

// CommitEach commits the transaction on each data source on its own, in data source
// order, never in two phases: for a transaction that stands for one statement that
// does not write (a SELECT fetched in parts), which autocommit would have run so.
func (s *Session) CommitEach(ctx context.Context) error {
	if !s.inTx {
		return nil
	}
	if s.failed {
		return s.Commit(ctx)
	}
	defer s.end()
	dss := slices.Clone(s.touched)
	slices.Sort(dss)
	return s.committer.bestEffort(ctx, s, dss)
}

// Rollback rolls the transaction back everywhere it went.
func (s *Session) Rollback(ctx context.Context) error {
	if !s.inTx {
		return nil
	}
	defer s.end()
	s.failed = false // let ROLLBACK through
	return s.committer.Rollback(ctx, s, s.touched)
}

// Ended leaves the transaction that a statement of the caller's ended on the server
// (PREPARE TRANSACTION, which ends it whether it succeeds or fails), returning every
// connection without a COMMIT or ROLLBACK.
func (s *Session) Ended() {
	if s.inTx {
		s.end()
	}
}

// end leaves the transaction and returns every connection.
func (s *Session) end() {
	if s.detector != nil {
		s.detector.forget(s)
	}
	s.mu.Lock()
	held, broken := s.held, s.broken
	s.held = map[int]Lease{}
	s.begun, s.broken = map[int]bool{}, nil
	s.inTx, s.failed, s.saves, s.touched, s.pids = false, false, nil, nil, nil
	s.mu.Unlock()
	s.victim.Store(false)
	for ds, lease := range held {
		lease.Release(!broken[ds])
	}
}

// Savepoint sets a savepoint on every data source in the transaction; data sources
// that join later set it too, right after BEGIN, so that rolling back to it undoes
// their part as well.
func (s *Session) Savepoint(ctx context.Context, name string) error {
	if !s.inTx {
		return &pgconn.PgError{Severity: "ERROR", Code: "25P01", Message: "SAVEPOINT can only be used in transaction blocks"}
	}
	if err := s.onBegun(ctx, "SAVEPOINT "+name); err != nil {
		return err
	}
	s.saves = append(s.saves, name)
	return nil
}

// RollbackTo rolls every data source back to a savepoint, which stays; it also clears
// the failed state, as in PostgreSQL.
func (s *Session) RollbackTo(ctx context.Context, name string) error {
	i := lastIndex(s.saves, name)
	if !s.inTx || i < 0 {
		return &pgconn.PgError{Severity: "ERROR", Code: "3B001", Message: fmt.Sprintf("savepoint \"%s\" does not exist", sqlplan.UnquoteIdent(name))}
	}
	s.failed = false
	if err := s.onBegun(ctx, "ROLLBACK TO SAVEPOINT "+name); err != nil {
		s.failed = true
		return err
	}
	s.saves = s.saves[:i+1]
	// A deadlock victim that rolled back to a savepoint goes on: a later cancel (a
	// statement timeout) is not the detector's.
	s.victim.Store(false)
	return nil
}

// ReleaseSavepoint releases a savepoint and those after it.
func (s *Session) ReleaseSavepoint(ctx context.Context, name string) error {
	i := lastIndex(s.saves, name)
	if !s.inTx || i < 0 {
		return &pgconn.PgError{Severity: "ERROR", Code: "3B001", Message: fmt.Sprintf("savepoint \"%s\" does not exist", sqlplan.UnquoteIdent(name))}
	}
	if err := s.onBegun(ctx, "RELEASE SAVEPOINT "+name); err != nil {
		return err
	}
	s.saves = s.saves[:i]
	return nil
}

// lastIndex finds the latest savepoint named name: a savepoint statement names the
// latest of several with one name, as in PostgreSQL.
func lastIndex(saves []string, name string) int {
	for i := len(saves) - 1; i >= 0; i-- {
		if saves[i] == name {
			return i
		}
	}
	return -1
}

func (s *Session) onBegun(ctx context.Context, sql string) error {
	for _, ds := range s.touched {
		if err := s.Run(ctx, ds, func(conn *pgconn.PgConn) error { return conn.Exec(ctx, sql).Close() }); err != nil {
			return err
		}
	}
	return nil
}

// Close rolls back an open transaction and returns every connection.
func (s *Session) Close(ctx context.Context) error {
	var err error
	if s.inTx {
		err = s.Rollback(ctx)
	}
	s.end()
	return err
}

// Rebegin replaces the open transaction's BEGIN statement, for a BEGIN with options
// that turns an implicit transaction into the client's own; it reports false, and
// changes nothing, when a data source has joined the transaction already.
func (s *Session) Rebegin(beginSQL string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.inTx || len(s.begun) > 0 {
		return false
	}
	s.begin = beginSQL
	return true
}

// BeginStatement returns the BEGIN statement of the open transaction, as data sources
// run it when they join ("" outside a transaction).
func (s *Session) BeginStatement() string {
	if !s.inTx {
		return ""
	}
	return s.begin
}

// chainProbe reads the characteristics of a data source's open transaction.
const chainProbe = "SELECT current_setting('transaction_isolation'), current_setting('transaction_read_only'), current_setting('transaction_deferrable')"

// ChainBegin returns the BEGIN statement of a transaction with the open one's
// characteristics (isolation level, read only, deferrable), which COMMIT AND CHAIN and
// ROLLBACK AND CHAIN start, as PostgreSQL has them:
//   - The server knows them as they are now, with SET TRANSACTION and the defaults at
//     the transaction's start, so ChainBegin asks, through conns (the caller's view of
//     this session), a data source the transaction has touched; when it has touched
//     none, it asks data source idle, which then joins, or with idle < 0 returns the
//     transaction's own BEGIN statement.
//   - A transaction that failed (failed: the caller's view) inside a savepoint keeps
//     what it set before that savepoint: ChainBegin rolls back to it, which the
//     transaction's end would undo anyway, and asks then.
//   - One that failed at its top level has had what it set itself (its BEGIN options,
//     SET TRANSACTION) undone by the server, back to what it started with: the
//     defaults, or for a chained transaction, what it was chained with.
func (s *Session) ChainBegin(ctx context.Context, conns Conns, idle int, failed bool) (string, error) {
	if !s.inTx {
		return "", errors.New("sqlexec: no transaction to chain")
	}
	switch {
	case failed && len(s.saves) > 0:
		if err := s.RollbackTo(ctx, s.saves[len(s.saves)-1]); err != nil {
			return "", err
		}
	case failed && s.chained:
		return s.begin, nil
	case failed:
		return "BEGIN", nil
	}
	ds := idle
	if t := s.Touched(); len(t) > 0 {
		ds = t[0]
	}
	if ds < 0 {
		return s.begin, nil
	}
	var row [][]byte
	err := conns.Run(ctx, ds, func(c *pgconn.PgConn) error {
		res, err := c.Exec(ctx, chainProbe).ReadAll()
		if err == nil && len(res) == 1 && len(res[0].Rows) == 1 && len(res[0].Rows[0]) == 3 {
			row = res[0].Rows[0]
		}
		return err
	})
	conns.Release(ds, err)
	if err != nil {
		return "", err
	}
	if row == nil {
		return "", fmt.Errorf("sqlexec: data source %s did not say its transaction's characteristics", s.committer.name(ds))
	}
	return chainBeginOf(string(row[0]), string(row[1]), string(row[2]))
}

// BeginChained opens the transaction that COMMIT AND CHAIN or ROLLBACK AND CHAIN
// starts, with the BEGIN statement ChainBegin returned.
func (s *Session) BeginChained(begin string) error {
	if err := s.Begin(begin); err != nil {
		return err
	}
	s.chained = true
	return nil
}

// chainBeginOf writes the BEGIN statement of a transaction with the characteristics
// PostgreSQL reports as transaction_isolation, transaction_read_only and
// transaction_deferrable.
func chainBeginOf(isolation, readOnly, deferrable string) (string, error) {
	switch isolation {
	case "read uncommitted", "read committed", "repeatable read", "serializable":
	default:
		return "", fmt.Errorf("sqlexec: unknown transaction isolation level %q", isolation)
	}
	if (readOnly != "on" && readOnly != "off") || (deferrable != "on" && deferrable != "off") {
		return "", fmt.Errorf("sqlexec: unknown transaction_read_only %q or transaction_deferrable %q", readOnly, deferrable)
	}
	begin := "BEGIN ISOLATION LEVEL " + strings.ToUpper(isolation)
	if readOnly == "on" {
		begin += " READ ONLY"
	} else {
		begin += " READ WRITE"
	}
	if deferrable == "off" {
		begin += " NOT"
	}
	return begin + " DEFERRABLE", nil
}
