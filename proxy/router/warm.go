package router

import (
	"context"
	"maps"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/sqlplan"
)

// Warm readies r, made to take old's place (Supersede), for old's clients, while old
// serves on: the statement texts old holds plans for are planned on r (its plan cache
// filled, and its catalog from the data sources), and old's statement descriptions
// become r's. A description depends on the statement's tables and their columns,
// which a change of layout keeps (a resharding move refuses DDL on the tables it
// moves): any data source describes a statement alike (see Session.Describe). A
// switch to a cold router makes every client's first statements after it plan,
// describe and read the catalog again, all at once, while they wait.
func (r *Router) Warm(ctx context.Context, old *Router) (plans, descriptions int) {
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

// WarmConn reads, on c (a connection of r's pool for data source ds), nothing from
// every table r's rules place on ds, so that the server's caches of those tables
// (their columns, indexes, a view's rule) are filled before clients come: a new server
// connection fills them at its first statement on each table, which the first clients
// of a new layout would otherwise wait for, all at once.
func (r *Router) WarmConn(ctx context.Context, ds int, c *backend.Conn) error {
	var names []string
	for _, t := range r.rules.Rules().Tables {
		names = append(names, t.Name)
	}
	names = append(names, r.rules.Rules().Broadcast...)
	var sql string
	seen := map[string]bool{}
	for _, name := range names {
		t := r.rules.Lookup(name)
		if t == nil || strings.HasSuffix(name, "*") { // a pattern names no table
			continue
		}
		for _, n := range t.Nodes {
			if n.DataSource != ds {
				continue
			}
			id := pgx.Identifier{n.Table}
			if n.Schema != "" {
				id = pgx.Identifier{n.Schema, n.Table}
			}
			q := id.Sanitize()
			if !seen[q] {
				seen[q] = true
				sql += "SELECT FROM " + q + " LIMIT 0;"
			}
		}
	}
	if sql == "" {
		return nil
	}
	_, err := c.PgConn().Exec(ctx, sql).ReadAll()
	return err
}

// PlanCacheStats returns the counters of the router's plan cache.
func (r *Router) PlanCacheStats() sqlplan.CacheStats { return r.planner.CacheStats() }
