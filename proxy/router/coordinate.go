package router

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// The coordinator database (Config.Coordinator) answers, as the client wrote them, the
// SELECTs the merge cannot answer exactly over several shards. It reads the shards'
// committed rows through postgres_fdw, in sessions of its own: it answers only
// outside a transaction block, where no write of the client's is still unseen and no
// snapshot is shared, and only for the data sources' own user, whose user mapping it
// holds.

// coordinatorIndex is the coordinator's data source index in a session's pools.
func (s *Session) coordinatorIndex() int { return sqlplan.CoordinatorSource(s.r.rules) }

// readyCoordinator checks that the coordinator may answer a bound statement for this
// client now, and builds its database if a schema change made through the proxy (or
// the proxy's start) left it unbuilt. partial is set for an answer fetched in parts
// (Execute with a row limit).
func (s *Session) readyCoordinator(ctx context.Context, refused error, partial bool) error {
	why := strings.TrimPrefix(refusalMessage(refused), "shardlab: ")
	switch {
	case s.explicit || s.implicit:
		return sqlplan.UnsupportedHint("Run it outside a transaction block (or on one shard).",
			"%s; the coordinator database that answers such statements over several shards reads only outside a transaction block, where the client has no write it could not see", why)
	case partial:
		return sqlplan.Unsupported("%s; an answer of the coordinator database is not fetched in parts (Execute with a row limit)", why)
	case len(s.pools) <= s.coordinatorIndex():
		return sqlplan.Unsupported("%s; the coordinator database answers only the clients that run as the data sources' own user, whose user mapping it holds", why)
	}
	if err := s.r.coord.Ready(ctx, s.r.generation.Load()); err != nil {
		return sqlplan.Unsupported("%s; the coordinator database that would answer it is not available: %v", why, err)
	}
	return nil
}

func refusalMessage(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Message
	}
	if err == nil {
		return "shardlab: a construct exact on one shard only, over several shards"
	}
	return err.Error()
}

// runCoordinated runs a statement on the coordinator database with fn, relaying its
// answer, and checks an error the coordinator gives against one database (see
// coordinatorError).
func (s *Session) runCoordinated(ctx context.Context, b *sqlplan.Bound, partial bool, fn func(*backend.Conn) error) error {
	if err := s.readyCoordinator(ctx, b.Refused, partial); err != nil {
		return err
	}
	err := s.onDataSource(ctx, s.coordinatorIndex(), fn)
	if err != nil {
		return s.coordinatorError(ctx, b, err)
	}
	return nil
}

// coordinatorError decides what a client sees of the coordinator's error. An error of
// the statement's analysis (SQLSTATE class 42: an unknown column, a grouping error) may
// be the coordinator's own: its tables have no keys, so a GROUP BY a primary key is
// not one there, and its database has none of the shards' functions and types. The
// statement is then analysed on the default data source, where every table it names
// has its logical name: that database's error is the client's answer, and when it
// accepts the statement the coordinator's failure is a refusal (0A000), never an error
// one database would not raise. Other errors (a division by zero, a cancel, an
// unreachable shard) are the statement's.
func (s *Session) coordinatorError(ctx context.Context, b *sqlplan.Bound, err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || !strings.HasPrefix(pe.Code, "42") {
		return err
	}
	why := strings.TrimPrefix(refusalMessage(b.Refused), "shardlab: ")
	ds := s.r.rules.DefaultDataSource()
	if !s.namesLogical(b.Plan.Tables, ds) {
		return sqlplan.Unsupported("%s; the coordinator database could not answer it as one database would (%s: %s)", why, pe.Code, pe.Message)
	}
	oneDB := s.onDataSource(ctx, ds, func(c *backend.Conn) error {
		_, _, err := c.Describe(ctx, b.Targets[0].SQL, nil)
		return err
	})
	if oneDB != nil {
		return oneDB
	}
	return sqlplan.Unsupported("%s; the coordinator database could not answer it as one database would (%s: %s)", why, pe.Code, pe.Message)
}

// namesLogical reports whether data source ds holds every table of names under its
// logical name, so that a statement naming them means there what it means to the
// client.
func (s *Session) namesLogical(names []string, ds int) bool {
	for _, name := range names {
		r := s.r.rules.Lookup(name)
		if r == nil || r.Kind != rules.KindSharded && r.Kind != rules.KindBroadcast {
			continue
		}
		found := false
		for _, n := range r.Nodes {
			if n.DataSource == ds && n.Table == name && n.Schema == "" {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}
