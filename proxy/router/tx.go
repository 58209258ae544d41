package router

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"
	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/sqlplan"
)

// beginImplicit opens the implicit transaction of statements sent together, unless a
// transaction is open already. Data sources join it lazily, so a batch that touches
// one data source costs a BEGIN and a COMMIT there and nothing elsewhere.
func (s *Session) beginImplicit() {
	if s.explicit || s.implicit {
		return
	}
	s.tx.Begin("BEGIN")
	s.implicit = true
}

// endImplicit ends the implicit transaction: commit when ok, else roll back.
func (s *Session) endImplicit(ctx context.Context, ok bool) error {
	if !s.implicit {
		return nil
	}
	s.implicit = false
	var err error
	if ok && !s.tx.Failed() {
		if s.reading {
			err = s.tx.CommitEach(ctx)
		} else {
			err = s.tx.Commit(ctx)
		}
		s.endTx(err == nil)
	} else {
		s.tx.Rollback(ctx)
		s.endTx(false)
	}
	return err
}

// endTx forgets what lived for the transaction only; committed says whether its SETs
// stay.
func (s *Session) endTx(committed bool) {
	if s.txChanged {
		if committed {
			s.settings = s.txSettings
		}
		s.txSettings, s.txChanged = nil, false
		s.settingsChanged()
	}
	s.saved = nil
	s.txLocal = nil
	s.reading = false
	// PostgreSQL drops every portal with its transaction (a server's went with it).
	clear(s.portals)
	if s.txDDL {
		// Plans made on the transaction's view of the schema: forget them, whether it
		// committed or not.
		s.txDDL = false
		s.r.schemaChanged()
	}
	s.conns.mu.Lock()
	clear(s.conns.state)
	s.conns.mu.Unlock()
	s.dirty = false
	s.failed = false
}

// transaction runs BEGIN, COMMIT, ROLLBACK and the savepoint statements, answering as
// PostgreSQL does (with its warnings for a BEGIN inside a transaction and a COMMIT
// outside one).
func (s *Session) transaction(ctx context.Context, plan *sqlplan.Plan) error {
	tag := transactionTag(plan)
	switch plan.Tx {
	case sqlplan.TxBegin:
		switch {
		case s.explicit:
			// PostgreSQL warns, and still applies the statement's options.
			s.notice("25001", "there is already a transaction in progress")
			if hasOptions(plan.SQL) {
				// On top of the first BEGIN's, as SET TRANSACTION would.
				if err := s.setCharacteristics(ctx, plan.SQL); err != nil {
					return err
				}
			}
		case s.implicit:
			// BEGIN among statements sent together turns their implicit transaction
			// into the client's own, as in PostgreSQL, with its options.
			if hasOptions(plan.SQL) && !s.tx.Rebegin(plan.SQL) {
				if err := s.setCharacteristics(ctx, plan.SQL); err != nil {
					return err
				}
			}
			s.implicit, s.explicit = false, true
		default:
			s.tx.Begin(plan.SQL)
			s.explicit = true
		}
	case sqlplan.TxCommit, sqlplan.TxRollback:
		if plan.Chain && !s.explicit {
			// An implicit transaction is no transaction block either.
			return pgError("25P01", "%s can only be used in transaction blocks", chainStatement[plan.Tx])
		}
		if !s.explicit {
			// In the implicit transaction of statements sent together, PostgreSQL
			// warns too, and ends it.
			s.notice("25P01", "there is no transaction in progress")
			if !s.implicit {
				break
			}
		}
		var chain *chained
		if plan.Chain {
			var err error
			if chain, err = s.chain(ctx); err != nil {
				return err
			}
		}
		s.explicit, s.implicit = false, false
		if plan.Tx == sqlplan.TxRollback || s.isFailed() {
			// COMMIT of a failed transaction rolls back, and says so in its tag.
			if plan.Tx == sqlplan.TxCommit {
				tag = "ROLLBACK"
			}
			changed := s.txChanged
			err := s.tx.Rollback(ctx)
			s.endTx(false)
			if err != nil {
				return err
			}
			if changed {
				// The settings went back, on the servers too: tell the client of
				// the reported ones, as PostgreSQL does at ROLLBACK.
				s.onDataSource(ctx, s.r.rules.DefaultDataSource(), func(c *backend.Conn) error {
					s.reportAfterReset(ctx, c)
					return nil
				})
			}
		} else {
			err := s.tx.Commit(ctx)
			s.endTx(err == nil)
			if err != nil {
				// As PostgreSQL: a failed commit starts no chained transaction.
				return err
			}
		}
		if chain != nil {
			s.tx.BeginChained(chain.begin)
			s.explicit = true
		}
	case sqlplan.TxPrepare:
		return s.prepareTransaction(ctx, plan)
	case sqlplan.TxSavepoint, sqlplan.TxRelease, sqlplan.TxRollbackTo:
		if !s.explicit {
			return pgError("25P01", "%s can only be used in transaction blocks", savepointStatement[plan.Tx])
		}
		name := plan.Savepoint
		var err error
		switch plan.Tx {
		case sqlplan.TxSavepoint:
			if err = s.tx.Savepoint(ctx, name); err == nil {
				s.savepointSettings(name)
			}
		case sqlplan.TxRelease:
			if err = s.tx.ReleaseSavepoint(ctx, name); err == nil {
				s.rollbackSettings(name, true)
			}
		case sqlplan.TxRollbackTo:
			if err = s.tx.RollbackTo(ctx, name); err == nil {
				s.failed = false
				changed := s.rollbackSettings(name, false)
				s.dropPortalsFrom(s.currentSub()) // the savepoint's, which stays
				if changed {
					err = s.restoreSettings(ctx)
				}
			}
		}
		if err != nil {
			return err
		}
	default:
		return sqlplan.Unsupported("this transaction statement is not supported")
	}
	s.client.Send(&pgproto3.CommandComplete{CommandTag: []byte(tag)})
	return nil
}

// setCharacteristics gives the open transaction, which data sources have joined
// already, the characteristics of a BEGIN statement's options, as SET TRANSACTION
// does: on those data sources now (each answers as PostgreSQL would, refusing an
// isolation level after a query), and on those that join later.
func (s *Session) setCharacteristics(ctx context.Context, begin string) error {
	sql, err := setTransactionOf(begin)
	if err != nil {
		return err
	}
	for _, ds := range s.tx.Touched() {
		if err := s.onDataSource(ctx, ds, func(c *backend.Conn) error {
			_, err := c.Results(ctx, sql)
			return err
		}); err != nil {
			return err
		}
	}
	s.addLocal(sql)
	return nil
}

// hasOptions reports whether a BEGIN or START TRANSACTION statement sets transaction
// characteristics.
func hasOptions(begin string) bool {
	tree, err := pg.Parse(begin)
	return err != nil || len(tree.Stmts) != 1 || len(tree.Stmts[0].Stmt.GetTransactionStmt().GetOptions()) > 0
}

// chainStatement names COMMIT AND CHAIN and ROLLBACK AND CHAIN as PostgreSQL's
// messages do.
var chainStatement = map[sqlplan.TxKind]string{sqlplan.TxCommit: "COMMIT AND CHAIN", sqlplan.TxRollback: "ROLLBACK AND CHAIN"}

// chained is how the transaction that COMMIT AND CHAIN or ROLLBACK AND CHAIN starts
// begins: its BEGIN statement.
type chained struct {
	begin string
}

// chain reads the open transaction's characteristics (isolation level, read only,
// deferrable) for the transaction chained to it (see sqlexec.Session.ChainBegin). When
// the transaction has touched no data source but set something, the default data
// source joins to answer.
func (s *Session) chain(ctx context.Context) (*chained, error) {
	idle := -1
	if len(s.txLocal) > 0 || s.txChanged {
		idle = s.r.rules.DefaultDataSource()
	}
	begin, err := s.tx.ChainBegin(ctx, &s.conns, idle, s.isFailed())
	if err != nil {
		return nil, err
	}
	return &chained{begin: begin}, nil
}

// setTransactionOf returns the SET TRANSACTION statement that sets the
// characteristics a BEGIN or START TRANSACTION statement's options give.
func setTransactionOf(begin string) (string, error) {
	tree, err := pg.Parse(begin)
	if err != nil || len(tree.Stmts) != 1 || tree.Stmts[0].Stmt.GetTransactionStmt() == nil {
		return "", fmt.Errorf("router: cannot read %q", begin)
	}
	var modes []string
	for _, o := range tree.Stmts[0].Stmt.GetTransactionStmt().Options {
		de := o.GetDefElem()
		a := de.GetArg().GetAConst()
		if a == nil {
			return "", fmt.Errorf("router: cannot read the options of %q", begin)
		}
		on := a.GetIval() != nil && a.GetIval().Ival != 0 || a.GetBoolval() != nil && a.GetBoolval().Boolval
		switch de.Defname {
		case "transaction_isolation":
			if a.GetSval() == nil {
				return "", fmt.Errorf("router: cannot read the isolation level of %q", begin)
			}
			modes = append(modes, "ISOLATION LEVEL "+strings.ToUpper(a.GetSval().Sval))
		case "transaction_read_only":
			modes = append(modes, map[bool]string{true: "READ ONLY", false: "READ WRITE"}[on])
		case "transaction_deferrable":
			modes = append(modes, map[bool]string{true: "DEFERRABLE", false: "NOT DEFERRABLE"}[on])
		}
	}
	return "SET TRANSACTION " + strings.Join(modes, ", "), nil
}

// savepointStatement names the savepoint statements as PostgreSQL's messages do.
var savepointStatement = map[sqlplan.TxKind]string{
	sqlplan.TxSavepoint: "SAVEPOINT", sqlplan.TxRelease: "RELEASE SAVEPOINT", sqlplan.TxRollbackTo: "ROLLBACK TO SAVEPOINT",
}

// prepareTransaction runs the client's PREPARE TRANSACTION (rules of one shard) on
// the one data source, in the client's transaction, which it ends there whether it
// succeeds or not: the session then holds no transaction. Outside a transaction block
// the server answers as it does (a warning; nothing is prepared).
func (s *Session) prepareTransaction(ctx context.Context, plan *sqlplan.Plan) error {
	ds := s.r.rules.DefaultDataSource()
	if !s.explicit && !s.implicit {
		return s.onDataSource(ctx, ds, func(c *backend.Conn) error { return c.Query(ctx, plan.SQL, s.client) })
	}
	if s.isFailed() {
		// As PostgreSQL: PREPARE TRANSACTION of a failed transaction rolls it back.
		err := s.tx.Rollback(ctx)
		s.explicit, s.implicit = false, false
		s.endTx(false)
		if err != nil {
			return err
		}
		s.client.Send(&pgproto3.CommandComplete{CommandTag: []byte("ROLLBACK")})
		return nil
	}
	err := s.onDataSourceJoining(ctx, ds, func(c *backend.Conn, join []string) (bool, error) {
		return c.QueryAfter(ctx, join, plan.SQL, s.client)
	})
	s.tx.Ended()
	s.explicit, s.implicit = false, false
	s.endTx(err == nil)
	return err
}

// notice sends a WARNING, as PostgreSQL does for harmless transaction mistakes.
func (s *Session) notice(code, msg string) {
	s.client.Send(&pgproto3.NoticeResponse{Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: code, Message: msg})
}

// transactionTag is the command tag PostgreSQL gives a transaction statement.
func transactionTag(plan *sqlplan.Plan) string {
	w := strings.ToUpper(firstWord(plan.SQL))
	switch plan.Tx {
	case sqlplan.TxBegin:
		if w == "START" {
			return "START TRANSACTION"
		}
		return "BEGIN"
	case sqlplan.TxCommit:
		return "COMMIT"
	case sqlplan.TxRollback, sqlplan.TxRollbackTo:
		return "ROLLBACK"
	case sqlplan.TxSavepoint:
		return "SAVEPOINT"
	case sqlplan.TxRelease:
		return "RELEASE"
	}
	return w
}

// firstWord returns the first keyword of a statement, past comments and blanks.
func firstWord(sql string) string {
	for {
		sql = strings.TrimLeft(sql, " \t\r\n\f")
		switch {
		case strings.HasPrefix(sql, "--"):
			i := strings.IndexByte(sql, '\n')
			if i < 0 {
				return ""
			}
			sql = sql[i+1:]
			continue
		case strings.HasPrefix(sql, "/*"):
			i := strings.Index(sql, "*/")
			if i < 0 {
				return ""
			}
			sql = sql[i+2:]
			continue
		}
		break
	}
	end := strings.IndexFunc(sql, func(r rune) bool {
		return !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	})
	if end < 0 {
		return sql
	}
	return sql[:end]
}
