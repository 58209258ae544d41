package sqlexec

import (
	"container/list"
	"context"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
)

// Statements that run again and again (the extended protocol's, and a driver's) are
// prepared once per backend connection and then only bound and executed, as pgx and
// libpq do with their statement caches: PostgreSQL then skips parsing and planning.
// The cache lives in the connection's CustomData, so it goes when the connection goes.

const (
	stmtCacheKey  = "shardlab.sqlexec.statements"
	stmtCacheSize = 256
)

type stmtCache struct {
	lru *list.List // of *cachedStmt, most recent first
	// bySQL finds a statement by its text, then by its declared parameter types: the
	// same text prepared with other types is another statement (a binary value is
	// read as the type the statement was prepared with).
	bySQL map[string]map[string]*list.Element
	seq   int
}

type cachedStmt struct {
	sql, oids string
	desc      *pgconn.StatementDescription
}

// appendOIDs writes parameter types as the bytes of a key.
func appendOIDs(b []byte, oids []uint32) []byte {
	for _, o := range oids {
		b = append(b, byte(o>>24), byte(o>>16), byte(o>>8), byte(o))
	}
	return b
}

func statementsOf(conn *pgconn.PgConn) *stmtCache {
	m := conn.CustomData()
	if c, ok := m[stmtCacheKey].(*stmtCache); ok {
		return c
	}
	c := &stmtCache{lru: list.New(), bySQL: map[string]map[string]*list.Element{}}
	m[stmtCacheKey] = c
	return c
}

// ForgetStatements drops the record of statements prepared on conn. Call it after
// anything that deallocates them behind the cache's back (DISCARD ALL, DEALLOCATE ALL).
func ForgetStatements(conn *pgconn.PgConn) { delete(conn.CustomData(), stmtCacheKey) }

// prepared returns the description of sql prepared on conn, preparing it (and
// deallocating the least recently used statement past the cache's size) if needed.
// Executing by description skips the Describe each execution would otherwise send.
func prepared(ctx context.Context, conn *pgconn.PgConn, sql string, oids []uint32) (*pgconn.StatementDescription, error) {
	c := statementsOf(conn)
	var buf [64]byte
	key := appendOIDs(buf[:0], oids)
	byType := c.bySQL[sql]
	if e, ok := byType[string(key)]; ok {
		c.lru.MoveToFront(e)
		return e.Value.(*cachedStmt).desc, nil
	}
	c.seq++
	desc, err := conn.Prepare(ctx, "shardlab_"+strconv.Itoa(c.seq), sql, oids)
	if err != nil {
		return nil, err
	}
	if byType == nil {
		byType = map[string]*list.Element{}
		c.bySQL[sql] = byType
	}
	byType[string(key)] = c.lru.PushFront(&cachedStmt{sql: sql, oids: string(key), desc: desc})
	if c.lru.Len() > stmtCacheSize {
		old := c.lru.Back()
		st := old.Value.(*cachedStmt)
		c.lru.Remove(old)
		c.drop(st.sql, st.oids)
		if err := conn.Deallocate(ctx, st.desc.Name); err != nil {
			return nil, err
		}
	}
	return desc, nil
}

// drop removes a statement from the cache's index.
func (c *stmtCache) drop(sql, oids string) {
	byType := c.bySQL[sql]
	delete(byType, oids)
	if len(byType) == 0 {
		delete(c.bySQL, sql)
	}
}

// forget drops one statement from conn's cache (it turned out stale).
func forget(conn *pgconn.PgConn, sql string, oids []uint32) {
	c := statementsOf(conn)
	var buf [64]byte
	key := appendOIDs(buf[:0], oids)
	if e, ok := c.bySQL[sql][string(key)]; ok {
		c.lru.Remove(e)
		c.drop(sql, string(key))
	}
}

// StalePlan reports whether a prepared statement failed because the server no longer
// has it (26000), or because DDL changed the result of the plan under it: preparing
// it again fixes both. The second is recognised by the server function that raises it,
// which does not depend on the server's language, or else by its English message.
// The driver and the proxy both ask it.
func StalePlan(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	return pe.Code == "26000" || pe.Code == "0A000" &&
		(pe.Routine == "RevalidateCachedQuery" || pe.Message == "cached plan must not change result type")
}

func stale(err error) bool { return StalePlan(err) }
