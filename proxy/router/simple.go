package router

import (
	"context"
	"errors"
	"slices"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/sqlexec"
	"github.com/shardlab/shardlab/sqlplan"
)

// Query handles a simple-protocol Query message, which may hold several statements.
// It sends every statement's answer and stops at the first error, which it returns
// (the caller sends it, then ReadyForQuery). Statements sent together outside a
// transaction block run in one implicit transaction, as in PostgreSQL.
func (s *Session) Query(ctx context.Context, sql string) error {
	stmts := sqlplan.SplitStatementsAt(sql)
	if len(stmts) == 0 {
		s.client.Send(&pgproto3.EmptyQueryResponse{})
		return nil
	}
	multi := len(stmts) > 1
	for _, stmt := range stmts {
		if err := s.simpleStatement(ctx, stmt.SQL, multi); err != nil {
			// PostgreSQL counts an error's position from the start of the string.
			err = sqlexec.ShiftPosition(s.fail(err), stmt.Offset)
			s.batchFailed = false
			s.endImplicit(ctx, false)
			s.endQuery()
			return err
		}
	}
	err := s.endImplicit(ctx, true)
	s.endQuery()
	return err
}

// endQuery drops the unnamed portal a simple query destroys, and every portal outside
// a transaction block.
func (s *Session) endQuery() {
	if !s.explicit {
		clear(s.portals)
	} else {
		s.dropPortal("")
	}
}

// simpleStatement runs one statement of a Query message; multi says whether the
// message holds several, which then share an implicit transaction (a BEGIN among them
// opens the client's own, with its options).
func (s *Session) simpleStatement(ctx context.Context, stmt string, multi bool) error {
	plan, lits, err := s.r.planner.PlanSimple(s.planContext(ctx), stmt)
	if err != nil {
		return err
	}
	if moved, err := s.pass(ctx, plan, true); err != nil {
		return err
	} else if moved {
		if plan, lits, err = s.r.planner.PlanSimple(s.planContext(ctx), stmt); err != nil {
			return err
		}
	}
	if s.isFailed() && !exitStatement(plan) {
		return failedTx()
	}
	if multi && plan.Kind != sqlplan.KindTransaction {
		s.beginImplicit()
	}
	switch plan.Kind {
	case sqlplan.KindEmpty:
		s.client.Send(&pgproto3.EmptyQueryResponse{})
		return nil
	case sqlplan.KindTransaction:
		return s.transaction(ctx, plan)
	case sqlplan.KindSet:
		return s.set(ctx, stmt)
	case sqlplan.KindDiscard:
		return s.discardStatement(ctx, stmt)
	case sqlplan.KindCopy:
		// Its statements name the physical tables; COPY (query) places its own errors.
		sent := plan.Copy.SQL
		if plan.Copy.Stage != "" {
			sent = append(slices.Clip(sent), plan.Copy.Stage)
		}
		return sqlexec.AtClient(s.copy(ctx, plan), stmt, sent)
	}
	args := sqlplan.Args{ForeignText: s.foreignText()}
	if plan.Feed != nil {
		err := s.runSeveralSteps(ctx, plan, func() (*sqlexec.Result, error) { return s.insertSelect(ctx, plan, args, nil, nil) })
		return sqlexec.AtClient(err, stmt, nil) // its steps are statements of their own
	}
	if plan.Keys != nil {
		if args.Keys, err = s.drawKeys(ctx, plan.Keys); err != nil {
			return err
		}
	}
	b, err := plan.BindSimpleArgs(stmt, lits, args)
	if err != nil && plan.Pre != nil && errors.Is(err, sqlplan.ErrUnsupported) {
		err := s.runSeveralSteps(ctx, plan, func() (*sqlexec.Result, error) { return s.runPre(ctx, plan, stmt, err, args, nil, nil) })
		return sqlexec.AtClient(err, stmt, nil)
	}
	if err != nil {
		return err
	}
	if err = s.runSimple(ctx, b); err != nil {
		return sqlexec.AtClient(err, stmt, sqlexec.SentTexts(b, err))
	}
	return nil
}

// FunctionCall handles the protocol's function call message, which libpq's
// large-object functions use: it runs on the default data source, where a client's
// large objects live, inside the client's transaction if it has one (a large object is
// opened for a transaction). It returns the error for the client; the caller then
// sends ReadyForQuery.
func (s *Session) FunctionCall(ctx context.Context, call *pgproto3.FunctionCall) error {
	if s.isFailed() {
		return s.fail(failedTx())
	}
	ds := s.r.rules.DefaultDataSource()
	s.running = true
	defer func() { s.running = false }()
	err := s.onDataSourceJoining(ctx, ds, func(c *backend.Conn, join []string) (bool, error) {
		for _, q := range join {
			if err := c.Query(ctx, q, discard{}); err != nil {
				return false, err
			}
		}
		return true, c.FunctionCall(ctx, call, s.client)
	})
	err = s.fail(err)
	s.batchFailed = false // the call is its own batch, as a simple query is
	return err
}
