package router

import (
	"context"
	"maps"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/sqlplan"
)

// Warm readies r, made to take old's place (Supersede) and serving no client yet, for
// old's clients, while old serves on: the statement texts old holds plans for are
// planned on r (its plan cache filled, and its catalog from the data sources), and
// old's statement descriptions become r's. A description depends on the statement's
// tables and their columns, which a change of layout keeps (a resharding move refuses
// DDL on the tables it moves): any data source describes a statement alike (see
// Session.Describe), but for the table OIDs and column numbers in its columns, which
// name the relations of the data source that described it first, as they did before
// the switch. Should DDL run through old between Warm and Supersede, Supersede
// forgets what Warm made. A switch to a cold router makes every client's first
// statements after it plan, describe and read the catalog again, all at once, while
// they wait. Warm stops early when ctx ends.
func (r *Router) Warm(ctx context.Context, old *Router) (plans, descriptions int) {
	r.warmedAt.Store(old.generation.Load())
	plans = r.planner.Warm(ctx, old.planner)
	old.describes.mu.Lock()
	entries := maps.Clone(old.describes.entries)
	old.describes.mu.Unlock()
	for k, d := range entries {
		if r.describes.get(k) == nil {
			r.describes.put(k, d)
			descriptions++
		}
	}
	return plans, descriptions
}

// warmTableWait bounds WarmConn's read of one table: one that waits for a lock is
// left to the clients.
const warmTableWait = 500 * time.Millisecond

// WarmConn reads, on c (a connection of r's pool for data source ds), nothing from
// each table r's rules place on ds, so that the server's caches of those tables (their
// columns, indexes, a view's rule) are filled before clients come: a new server
// connection fills them at its first statement on each table, which the first clients
// of a new layout would otherwise wait for, all at once. Each table is read in a
// statement of its own (its lock held for that statement only), within warmTableWait;
// a table that cannot be read is left to the clients' own statements, and WarmConn
// returns the first such error.
func (r *Router) WarmConn(ctx context.Context, ds int, c *backend.Conn) error {
	var names []string
	for _, t := range r.rules.Rules().Tables {
		names = append(names, t.Name)
	}
	names = append(names, r.rules.Rules().Broadcast...)
	var first error
	seen := map[string]bool{}
	for _, name := range names {
		if strings.HasSuffix(name, "*") {
			continue // a pattern names no table
		}
		t := r.rules.Lookup(name)
		if t == nil {
			continue
		}
		for _, n := range t.Nodes {
			id := pgx.Identifier{n.Table}
			if n.Schema != "" {
				id = pgx.Identifier{n.Schema, n.Table}
			}
			q := id.Sanitize()
			if n.DataSource != ds || seen[q] {
				continue
			}
			seen[q] = true
			tctx, cancel := context.WithTimeout(ctx, warmTableWait)
			_, err := c.Results(tctx, "SELECT FROM "+q+" LIMIT 0")
			cancel()
			if err != nil && first == nil {
				first = err
			}
			if c.PgConn().IsClosed() || ctx.Err() != nil {
				return first // a cancelled read closes the connection
			}
		}
	}
	return first
}

// PlanCacheStats returns the counters of the router's plan cache.
func (r *Router) PlanCacheStats() sqlplan.CacheStats { return r.planner.CacheStats() }
