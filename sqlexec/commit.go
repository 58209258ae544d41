package sqlexec

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

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
// decision is made durable in the transaction of the first data source: before it
// prepares, it records the transaction's id in shardlab_2pc_decisions. Its COMMIT
// PREPARED is the moment of decision, and it comes first. After a crash, Recover finds
// prepared transactions left behind and finishes them: commit where the decision row
// exists, roll back where it does not (the first data source never committed, so no
// data source did).
type Committer struct {
	rules    *rules.Compiled
	twoPhase bool
	hook     func(stage string)
}

// Two-phase commit stages, passed to a phase hook.
const (
	StagePrepared  = "prepared"  // every data source has prepared; nothing is decided
	StageCommitted = "committed" // the coordinator committed: the transaction is decided
)

// SetPhaseHook makes the committer call hook at each stage of a two-phase commit. It
// is for tests that crash a process between the phases; set it before use.
func (c *Committer) SetPhaseHook(hook func(stage string)) { c.hook = hook }

func (c *Committer) at(stage string) {
	if c.hook != nil {
		c.hook(stage)
	}
}

// NewCommitter returns a committer; twoPhase selects two-phase commit.
func NewCommitter(r *rules.Compiled, twoPhase bool) *Committer {
	return &Committer{rules: r, twoPhase: twoPhase}
}

// TwoPhase reports whether the committer uses two-phase commit.
func (c *Committer) TwoPhase() bool { return c.twoPhase }

// DecisionTable is the table on every data source that records committed two-phase
// transactions until Recover or the next commit's clean-up deletes their rows.
const DecisionTable = "shardlab_2pc_decisions"

// GIDPrefix starts the transaction ids of shardlab's prepared transactions.
const GIDPrefix = "shardlab_"

func (c *Committer) name(ds int) string { return c.rules.DataSources()[ds].Name }

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
			if conn.IsClosed() {
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
			return &ShardError{DataSource: ds, Name: c.name(ds), Err: err}
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
	var b [8]byte
	rand.Read(b[:])
	gid := GIDPrefix + hex.EncodeToString(b[:])
	coordinator := dss[0]
	var prepared []int
	for _, ds := range dss {
		err := conns.Run(ctx, ds, func(conn *pgconn.PgConn) error {
			if ds == coordinator {
				// The decision row commits with the coordinator's part, or not at all.
				if err := conn.Exec(ctx, "INSERT INTO "+DecisionTable+" (gid) VALUES ('"+gid+"')").Close(); err != nil {
					return fmt.Errorf("record the commit decision (is the table there? Recover creates it): %w", err)
				}
			}
			return expectTag(conn.Exec(ctx, "PREPARE TRANSACTION '"+gidFor(gid, ds)+"'"), "PREPARE TRANSACTION")
		})
		if err != nil {
			// Nothing is decided: roll back what was prepared and what was not.
			bg := context.WithoutCancel(ctx)
			for _, p := range prepared {
				conns.Run(bg, p, func(conn *pgconn.PgConn) error {
					return conn.Exec(bg, "ROLLBACK PREPARED '"+gidFor(gid, p)+"'").Close()
				})
			}
			c.Rollback(bg, conns, dss[len(prepared)+1:])
			return &ShardError{DataSource: ds, Name: c.name(ds), Err: fmt.Errorf("prepare transaction: %w", err)}
		}
		prepared = append(prepared, ds)
	}
	c.at(StagePrepared)
	// Commit the coordinator first: from here on the transaction is committed.
	if err := conns.Run(ctx, coordinator, func(conn *pgconn.PgConn) error {
		return conn.Exec(ctx, "COMMIT PREPARED '"+gidFor(gid, coordinator)+"'").Close()
	}); err != nil {
		// Whether it committed is unknown; Recover decides from the decision row.
		return &ShardError{DataSource: coordinator, Name: c.name(coordinator),
			Err: fmt.Errorf("commit prepared %s: %w (the outcome is in doubt until Recover runs)", gid, err)}
	}
	c.at(StageCommitted)
	var errs []error
	for _, ds := range dss[1:] {
		if err := conns.Run(ctx, ds, func(conn *pgconn.PgConn) error {
			return conn.Exec(ctx, "COMMIT PREPARED '"+gidFor(gid, ds)+"'").Close()
		}); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.name(ds), err))
		}
	}
	if len(errs) > 0 {
		// Committed, durably decided; the stragglers commit when Recover runs.
		return nil
	}
	conns.Run(ctx, coordinator, func(conn *pgconn.PgConn) error {
		return conn.Exec(ctx, "DELETE FROM "+DecisionTable+" WHERE gid = '"+gid+"'").Close()
	})
	return nil
}

// gidFor is the prepared-transaction id of one data source's part.
func gidFor(gid string, ds int) string { return fmt.Sprintf("%s_%d", gid, ds) }

// Recover creates the decision table where it is missing and finishes every prepared
// transaction shardlab left behind on the data sources: COMMIT PREPARED where the
// coordinator recorded the decision, ROLLBACK PREPARED where it did not. acquire lends
// a connection outside any transaction. Run it at start-up, before taking traffic, and
// after a crash; it returns how many prepared transactions it committed and rolled back.
func (c *Committer) Recover(ctx context.Context, pool Pool) (committed, rolledBack int, err error) {
	n := c.rules.NumDataSources()
	type prep struct {
		gid string // the transaction id (without the data source suffix)
		ds  int
	}
	var found []prep
	decided := map[string]bool{}
	for ds := range n {
		err := withConn(ctx, pool, ds, func(conn *pgconn.PgConn) error {
			if err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+DecisionTable+" (gid text PRIMARY KEY, decided_at timestamptz NOT NULL DEFAULT now())").Close(); err != nil {
				return err
			}
			res, err := conn.Exec(ctx, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE '"+GIDPrefix+"%'").ReadAll()
			if err != nil {
				return err
			}
			for _, row := range res[0].Rows {
				g := string(row[0])
				if i := strings.LastIndexByte(g, '_'); i > 0 {
					found = append(found, prep{gid: g[:i], ds: ds})
				}
			}
			res, err = conn.Exec(ctx, "SELECT gid FROM "+DecisionTable).ReadAll()
			if err != nil {
				return err
			}
			for _, row := range res[0].Rows {
				decided[string(row[0])] = true
			}
			return nil
		})
		if err != nil {
			return committed, rolledBack, &ShardError{DataSource: ds, Name: c.name(ds), Err: fmt.Errorf("recover: %w", err)}
		}
	}
	for _, p := range found {
		verb := "ROLLBACK PREPARED"
		if decided[p.gid] {
			verb = "COMMIT PREPARED"
		}
		err := withConn(ctx, pool, p.ds, func(conn *pgconn.PgConn) error {
			return conn.Exec(ctx, verb+" '"+gidFor(p.gid, p.ds)+"'").Close()
		})
		if err != nil {
			return committed, rolledBack, &ShardError{DataSource: p.ds, Name: c.name(p.ds), Err: fmt.Errorf("recover %s: %w", p.gid, err)}
		}
		if decided[p.gid] {
			committed++
		} else {
			rolledBack++
		}
	}
	// Decisions whose every part has committed are no longer needed.
	still := map[string]bool{}
	for _, p := range found {
		still[p.gid] = true
	}
	for ds := range n {
		withConn(ctx, pool, ds, func(conn *pgconn.PgConn) error {
			for gid := range decided {
				if !still[gid] {
					conn.Exec(ctx, "DELETE FROM "+DecisionTable+" WHERE gid = '"+gid+"'").Close()
				}
			}
			return nil
		})
	}
	return committed, rolledBack, nil
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
