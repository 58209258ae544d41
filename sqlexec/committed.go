package sqlexec

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/sqlplan"
)

// CommittedReads says why a statement that reads the data sources' committed rows in a
// transaction of its own (the coordinator database's, through postgres_fdw) would not
// read what the same statement reads inside the session's open transaction on one
// database; nil when it would, or outside a transaction.
//
// It reads the same in a READ COMMITTED transaction, where each statement sees the rows
// committed before it starts, as long as the transaction has written nothing (its
// writes would be unseen) and holds no lock that keeps readers out, nor a lock another
// session waits for (a reader would queue behind that session, which waits for the
// session's own transaction: a wait no deadlock detector sees). Each data
// source in the transaction answers for itself, the default one when none has joined
// yet (its BEGIN says the isolation level): the server assigns a transaction id at the
// first write or row lock, in a savepoint too, and that is its own record of them.
// Settings of the transaction alone (SET LOCAL) are the caller's to check. conns runs
// the check, joining the transaction (the caller's Conns, or the session itself).
func (s *Session) CommittedReads(ctx context.Context, conns Conns) error {
	if !s.inTx {
		return nil
	}
	dss := s.Touched()
	if len(dss) == 0 {
		dss = []int{s.committer.rules.DefaultDataSource()}
	}
	for _, ds := range dss {
		var row [][]byte
		err := conns.Run(ctx, ds, func(pg *pgconn.PgConn) error {
			res, err := pg.Exec(ctx, committedReadsSQL).ReadAll()
			if err == nil && (len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 4) {
				err = fmt.Errorf("sqlexec: %s: the transaction's check returned no row of 4 columns", s.committer.name(ds))
			}
			if err == nil {
				row = res[0].Rows[0]
			}
			return err
		})
		conns.Release(ds, err)
		if err != nil {
			return err
		}
		name := s.committer.name(ds)
		switch {
		case string(row[0]) != "read committed" && string(row[0]) != "read uncommitted": // PostgreSQL's READ UNCOMMITTED is READ COMMITTED
			return sqlplan.UnsupportedHint("Run it outside a transaction block, or in a READ COMMITTED one.",
				"the transaction is %s on data source %s, and reads in transactions of their own would not see its snapshot",
				strings.ToUpper(string(row[0])), name)
		case string(row[1]) == "t":
			return sqlplan.UnsupportedHint("Run it outside a transaction block, or before the transaction's writes.",
				"the transaction wrote (or locked rows) on data source %s, and reads in transactions of their own see only committed rows", name)
		case string(row[2]) == "t":
			return sqlplan.UnsupportedHint("Run it outside a transaction block, or before LOCK TABLE.",
				"the transaction holds an ACCESS EXCLUSIVE lock on data source %s, which reads in transactions of their own would wait for", name)
		case string(row[3]) == "t":
			return sqlplan.UnsupportedHint("Run it outside a transaction block, or again once the other session's statement ends.",
				"another session waits for a lock the transaction holds on data source %s (ALTER TABLE, say), and reads in transactions of their own would queue behind it", name)
		}
	}
	return nil
}

// committedReadsSQL asks a data source in the session's transaction its isolation
// level, whether the transaction has a transaction id (it wrote, or locked rows), and
// whether it holds a lock that conflicts with a reader's ACCESS SHARE, and whether
// another session waits for one of its locks.
const committedReadsSQL = `SELECT current_setting('transaction_isolation'), pg_current_xact_id_if_assigned() IS NOT NULL, ` +
	`EXISTS (SELECT FROM pg_locks WHERE pid = pg_backend_pid() AND mode = 'AccessExclusiveLock' AND granted), ` +
	`EXISTS (SELECT FROM pg_locks w WHERE NOT w.granted AND pg_backend_pid() = ANY (pg_blocking_pids(w.pid)))`
