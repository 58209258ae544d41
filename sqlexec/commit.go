package sqlexec

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/rules"
)

// Committer ends transactions that span several data sources. The SQL core, the
// database/sql driver and the wire proxy all commit through it, in one of two modes.
//
// Best effort (the default) sends COMMIT to each data source in order. If data source
// 2 fails after data source 1 committed, data source 1's part stays committed and the
// error says so: the transaction is half applied. Nothing is in doubt, but nothing
// undoes it either.
//
// Two-phase (PostgreSQL's PREPARE TRANSACTION, which needs max_prepared_transactions
// above zero on every data source) first prepares the transaction on every data source,
// so that each has promised it can commit, then commits the prepared transactions. The
// decision is made durable in the transaction of the first data source (the
// transaction's coordinator part): before it prepares, it records the transaction's id
// in shardlab_2pc_decisions. Its COMMIT PREPARED is the moment of decision, and it
// comes first. A COMMIT PREPARED or ROLLBACK PREPARED that fails is tried again on
// fresh connections; what still fails is left in doubt for a Settler, which commits
// where the decision row exists and rolls back where it does not.
//
// Every transaction id (GID) carries the committer's instance id, which its Settler
// holds as a session advisory lock on every data source while the committer lives: so
// other coordinators over the same data sources know whose transactions they must not
// touch.
type Committer struct {
	rules    *rules.Compiled
	twoPhase bool
	hook     atomic.Pointer[func(stage string)]
	instance atomic.Uint32
	settler  atomic.Pointer[Settler]
	// inFlight holds the transactions this committer is preparing or committing right
	// now, by GID, with when they began: its own Settler leaves them alone.
	inFlight struct {
		sync.Mutex
		gids map[string]time.Time
	}
	retried atomic.Int64
}

// Two-phase commit stages, passed to a phase hook.
const (
	StagePrepared  = "prepared"  // every data source has prepared; nothing is decided
	StageCommitted = "committed" // the coordinator committed: the transaction is decided
)

// SetPhaseHook makes the committer call hook at each stage of a two-phase commit, in
// the committing goroutine; nil removes it. It is for tests that crash a process or
// fail a data source between the phases.
func (c *Committer) SetPhaseHook(hook func(stage string)) {
	if hook == nil {
		c.hook.Store(nil)
		return
	}
	c.hook.Store(&hook)
}

func (c *Committer) at(stage string) {
	if h := c.hook.Load(); h != nil {
		(*h)(stage)
	}
}

// NewCommitter returns a committer; twoPhase selects two-phase commit. A two-phase
// committer needs a Settler (NewSettler, then Start) to settle what it leaves in doubt
// and to show other coordinators that it is alive.
func NewCommitter(r *rules.Compiled, twoPhase bool) *Committer {
	c := &Committer{rules: r, twoPhase: twoPhase}
	c.inFlight.gids = map[string]time.Time{}
	c.newInstance()
	return c
}

// newInstance draws a new instance id.
func (c *Committer) newInstance() {
	var b [4]byte
	rand.Read(b[:])
	c.instance.Store(binary.BigEndian.Uint32(b[:]))
}

// Instance returns the committer's instance id, which its transactions' GIDs carry.
func (c *Committer) Instance() uint32 { return c.instance.Load() }

// TwoPhase reports whether the committer uses two-phase commit.
func (c *Committer) TwoPhase() bool { return c.twoPhase }

// DecisionTable is the table on every data source that records committed two-phase
// transactions until the commit's clean-up or a Settler deletes their rows.
const DecisionTable = "shardlab_2pc_decisions"

// GIDPrefix starts the transaction ids of shardlab's prepared transactions. A part's
// GID is GIDPrefix, the committer's instance id (8 hex digits), the transaction's
// random id (16 hex digits), the coordinator data source and the part's data source,
// joined by '_': shardlab_1a2b3c4d_0123456789abcdef_0_2. The decision row holds the GID
// without the last field.
const GIDPrefix = "shardlab_"

func (c *Committer) name(ds int) string { return sourceName(c.rules, ds) }

// Commit commits the open transaction of every data source in dss (sorted, as Run
// touched them), through conns.
func (c *Committer) Commit(ctx context.Context, conns Conns, dss []int) error {
	dss = slices.Clone(dss)
	slices.Sort(dss)
	if !c.twoPhase || len(dss) < 2 {
		return c.bestEffort(ctx, conns, dss)
	}
	return c.twoPhaseCommit(ctx, conns, dss)
}

// Rollback rolls back the open transaction of every data source in dss; it reports the
// first failure but tries them all.
func (c *Committer) Rollback(ctx context.Context, conns Conns, dss []int) error {
	var first error
	for _, ds := range dss {
		err := conns.Run(ctx, ds, func(conn *pgconn.PgConn) error {
			if conn.IsClosed() || conn.TxStatus() == 'I' {
				// Nothing to roll back: a data source that a write failing before it
				// never began, where ROLLBACK would only warn the client (25P01).
				return nil
			}
			return conn.Exec(ctx, "ROLLBACK").Close()
		})
		if err != nil && first == nil {
			first = &ShardError{DataSource: ds, Name: c.name(ds), Err: err}
		}
	}
	return first
}

func (c *Committer) bestEffort(ctx context.Context, conns Conns, dss []int) error {
	var committed []string
	for i, ds := range dss {
		err := conns.Run(ctx, ds, func(conn *pgconn.PgConn) error {
			return expectTag(conn.Exec(ctx, "COMMIT"), "COMMIT")
		})
		if err != nil {
			c.Rollback(context.WithoutCancel(ctx), conns, dss[i+1:])
			if len(committed) > 0 {
				err = fmt.Errorf("commit failed after %s committed (best-effort commit: their part of the transaction stays applied): %w",
					strings.Join(committed, ", "), err)
			}
			return LogicalNames(&ShardError{DataSource: ds, Name: c.name(ds), Err: err}, c.rules)
		}
		committed = append(committed, c.name(ds))
	}
	return nil
}

// expectTag reads a transaction-control result: PostgreSQL answers COMMIT of a failed
// transaction with the tag ROLLBACK, which is a failure.
func expectTag(mrr *pgconn.MultiResultReader, want string) error {
	res, err := mrr.ReadAll()
	if err != nil {
		return err
	}
	if len(res) == 1 && res[0].CommandTag.String() != want {
		return pgErr("40000", "the transaction was rolled back (%s)", res[0].CommandTag)
	}
	return nil
}

func (c *Committer) twoPhaseCommit(ctx context.Context, conns Conns, dss []int) error {
	coordinator := dss[0]
	gid := c.newGID(coordinator)
	since := c.track(gid)
	defer c.untrack(gid)
	var prepared []int
	for _, ds := range dss {
		err := conns.Run(ctx, ds, func(conn *pgconn.PgConn) error {
			if ds == coordinator {
				// The decision row commits with the coordinator's part, or not at all.
				if err := conn.Exec(ctx, "INSERT INTO "+DecisionTable+" (gid) VALUES ('"+gid+"')").Close(); err != nil {
					return fmt.Errorf("record the commit decision (is the table there? a Settler creates it): %w", err)
				}
			}
			return expectTag(conn.Exec(ctx, "PREPARE TRANSACTION '"+gidFor(gid, ds)+"'"), "PREPARE TRANSACTION")
		})
		if err != nil {
			// Nothing is decided: roll back what was prepared, the coordinator's part
			// first, and what was not. A PREPARE whose answer was lost may have
			// happened: its part is rolled back too, if it is there.
			bg := context.WithoutCancel(ctx)
			undo := prepared
			if !answered(err) {
				undo = append(slices.Clone(prepared), ds)
			}
			left := false
			for _, p := range undo {
				if ferr := c.finish(bg, conns, p, "ROLLBACK PREPARED", gidFor(gid, p)); ferr != nil && !errors.Is(ferr, errNotPrepared) {
					left = true
				}
			}
			c.Rollback(bg, conns, dss[len(prepared)+1:])
			if left {
				c.noteInDoubt(gid, since)
			}
			return LogicalNames(&ShardError{DataSource: ds, Name: c.name(ds), Err: fmt.Errorf("prepare transaction: %w", err)}, c.rules)
		}
		prepared = append(prepared, ds)
	}
	c.at(StagePrepared)
	// Commit the coordinator first: from here on the transaction is committed.
	err := c.finish(ctx, conns, coordinator, "COMMIT PREPARED", gidFor(gid, coordinator))
	if errors.Is(err, errNotPrepared) {
		// Our own first try committed it and its answer was lost, or a settler that
		// took this coordinator for dead rolled it back: the decision row says which.
		var decided bool
		decided, err = c.decided(context.WithoutCancel(ctx), coordinator, gid)
		if err == nil && !decided {
			for _, ds := range dss[1:] {
				c.finish(context.WithoutCancel(ctx), conns, ds, "ROLLBACK PREPARED", gidFor(gid, ds))
			}
			return &ShardError{DataSource: coordinator, Name: c.name(coordinator),
				Err: pgErr("40000", "the transaction was rolled back: its prepared part was settled while its commit was under way")}
		}
	}
	if err != nil {
		// Whether it committed is unknown until the data source answers again.
		c.noteInDoubt(gid, since)
		return &ShardError{DataSource: coordinator, Name: c.name(coordinator),
			Err: pgErr("08007", "commit prepared %s: %v (the outcome is in doubt until the coordinator's settler reaches the data source)", gid, err)}
	}
	c.at(StageCommitted)
	left := false
	for _, ds := range dss[1:] {
		if err := c.finish(ctx, conns, ds, "COMMIT PREPARED", gidFor(gid, ds)); err != nil && !errors.Is(err, errNotPrepared) {
			left = true
		}
	}
	if left {
		// Committed, durably decided; the settler commits the stragglers.
		c.noteInDoubt(gid, since)
		return nil
	}
	conns.Run(ctx, coordinator, func(conn *pgconn.PgConn) error {
		return conn.Exec(ctx, "DELETE FROM "+DecisionTable+" WHERE gid = '"+gid+"'").Close()
	})
	return nil
}

// newGID returns a fresh transaction id (without the data source suffix).
func (c *Committer) newGID(coordinator int) string {
	var b [8]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s%08x_%s_%d", GIDPrefix, c.instance.Load(), hex.EncodeToString(b[:]), coordinator)
}

// gidFor is the prepared-transaction id of one data source's part.
func gidFor(gid string, ds int) string { return fmt.Sprintf("%s_%d", gid, ds) }

// track records that the committer is preparing or committing gid, and returns when.
func (c *Committer) track(gid string) time.Time {
	now := time.Now()
	c.inFlight.Lock()
	c.inFlight.gids[gid] = now
	c.inFlight.Unlock()
	return now
}

func (c *Committer) untrack(gid string) {
	c.inFlight.Lock()
	delete(c.inFlight.gids, gid)
	c.inFlight.Unlock()
}

// busy reports whether the committer is preparing or committing gid right now.
func (c *Committer) busy(gid string) bool {
	c.inFlight.Lock()
	defer c.inFlight.Unlock()
	_, ok := c.inFlight.gids[gid]
	return ok
}

// noteInDoubt tells the settler that gid was left prepared somewhere, so that it is
// counted in doubt before the settler's next pass finds it.
func (c *Committer) noteInDoubt(gid string, since time.Time) {
	if s := c.settler.Load(); s != nil {
		s.noteInDoubt(gid, since)
	}
}

// errNotPrepared is a COMMIT PREPARED or ROLLBACK PREPARED of a GID that is not (or no
// longer) prepared: someone finished it.
var errNotPrepared = errors.New("sqlexec: no such prepared transaction")

// retryDelays are the pauses before each try of finish on a fresh connection: a
// terminated backend is replaced at once, a data source that is down is left to the
// settler after a fraction of a second.
var retryDelays = []time.Duration{0, 100 * time.Millisecond, 400 * time.Millisecond}

// finish runs verb (COMMIT PREPARED or ROLLBACK PREPARED) for the prepared part on data
// source ds, on the transaction's connection and, when that fails for any reason but a
// final answer of the server, on fresh connections. It returns errNotPrepared when the
// part is not prepared (any more).
func (c *Committer) finish(ctx context.Context, conns Conns, ds int, verb, part string) error {
	run := func(conn *pgconn.PgConn) error { return conn.Exec(ctx, verb+" '"+part+"'").Close() }
	err := classifyFinish(conns.Run(ctx, ds, run))
	if !retryable(err) {
		return err
	}
	for _, delay := range retryDelays {
		if !sleepCtx(ctx, delay) {
			return err
		}
		err = classifyFinish(c.onFresh(ctx, ds, run))
		if !retryable(err) {
			if err == nil {
				c.retried.Add(1)
			}
			return err
		}
	}
	return err
}

// decided reports whether gid's decision row exists on its coordinator data source,
// asking on fresh connections.
func (c *Committer) decided(ctx context.Context, coordinator int, gid string) (bool, error) {
	var found bool
	var err error
	for _, delay := range retryDelays {
		if !sleepCtx(ctx, delay) {
			break
		}
		err = c.onFresh(ctx, coordinator, func(conn *pgconn.PgConn) error {
			res, err := conn.Exec(ctx, "SELECT 1 FROM "+DecisionTable+" WHERE gid = '"+gid+"'").ReadAll()
			if err == nil {
				found = len(res) == 1 && len(res[0].Rows) > 0
			}
			return err
		})
		if err == nil {
			return found, nil
		}
	}
	return false, err
}

// classifyFinish maps the server's "does not exist" to errNotPrepared.
func classifyFinish(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42704" {
		return errNotPrepared
	}
	return err
}

// retryable reports whether a failed finish may succeed on a fresh connection: not
// after success, "not prepared", or the server's refusal (no privilege to finish
// another user's prepared transaction, another database's).
func retryable(err error) bool {
	if err == nil || errors.Is(err, errNotPrepared) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42501" || pe.Code == "0A000") {
		return false
	}
	return true
}

// answered reports whether err is the server's answer to a statement, which therefore
// ran and failed; otherwise (a network error, a connection the server ended) whether
// the statement ran is unknown.
func answered(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Severity != "FATAL" && pe.Severity != "PANIC"
}

// onFresh runs fn on a new connection to data source ds, closed afterwards.
func (c *Committer) onFresh(ctx context.Context, ds int, fn func(*pgconn.PgConn) error) error {
	conn, err := c.dial(ctx, ds)
	if err != nil {
		return err
	}
	defer closeConn(conn)
	return fn(conn)
}

// dial opens a connection of its own to data source ds, as its DSN says, within the
// settler's connect timeout.
func (c *Committer) dial(ctx context.Context, ds int) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(c.rules.DataSources()[ds].DSN)
	if err != nil {
		return nil, err
	}
	timeout := DefaultSettleConnectTimeout
	if s := c.settler.Load(); s != nil {
		timeout = s.connectTimeout
		if s.dialFunc != nil {
			cfg.DialFunc = s.dialFunc
		}
	}
	if cfg.ConnectTimeout == 0 || cfg.ConnectTimeout > timeout {
		cfg.ConnectTimeout = timeout
	}
	return pgconn.ConnectConfig(ctx, cfg)
}

// closeConn closes a connection without waiting long for a server that is gone.
func closeConn(conn *pgconn.PgConn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn.Close(ctx)
}

// sleepCtx waits d, or less if ctx ends first (then it returns false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// withConn runs fn on a connection of data source ds borrowed from pool.
func withConn(ctx context.Context, pool Pool, ds int, fn func(*pgconn.PgConn) error) error {
	lease, err := pool.Acquire(ctx, ds)
	if err != nil {
		return err
	}
	err = lease.Run(ctx, fn)
	lease.Release(reusable(err))
	return err
}

// ErrTwoPhaseUnavailable is returned when a data source cannot prepare transactions.
var ErrTwoPhaseUnavailable = errors.New("sqlexec: two-phase commit needs max_prepared_transactions > 0 on every data source")
