package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/internal/pgtest"
)

// TestSuspendedPortalsAsOnOneServer drives the extended protocol with row limits
// (Execute with MaxRows, as JDBC's fetch size and psql's FETCH_COUNT-like clients do)
// on one PostgreSQL database and through the proxy over two shards, and compares every
// message the client gets: rows in order, PortalSuspended after each full batch, the
// command tags, errors. Covered: a cross-shard ORDER BY read in batches; another
// statement run while a portal is suspended, then the portal read on; a portal closed
// early, with the transaction going on; a portal outside a transaction block, which
// ends at Sync; an aggregate the engine answers whole; and one shard's portal, which
// the server keeps suspended, across savepoints, Close, COMMIT and an error met in a
// later part.
func TestSuspendedPortalsAsOnOneServer(t *testing.T) {
	const n = 2500
	setup := []string{"CREATE TABLE pt (id int PRIMARY KEY, v text)"}
	var values []string
	for i := 1; i <= n; i++ {
		values = append(values, fmt.Sprintf("(%d, 'v%d')", i, i))
	}
	setup = append(setup, "INSERT INTO pt VALUES "+strings.Join(values, ", "))
	// pk's rows with one key live on one shard: a portal over them is the server's.
	setup = append(setup, "CREATE TABLE pk (k int, id int, v text)")
	values = values[:0]
	for i := 1; i <= n; i++ {
		values = append(values, fmt.Sprintf("(%d, %d, 'v%d')", 1+i%2, i, i))
	}
	setup = append(setup, "INSERT INTO pk VALUES "+strings.Join(values, ", "))
	type step struct {
		msgs []pgproto3.FrontendMessage
	}
	parse := func(name, sql string) pgproto3.FrontendMessage {
		return &pgproto3.Parse{Name: name, Query: sql}
	}
	bind := func(portal, stmt string) pgproto3.FrontendMessage {
		return &pgproto3.Bind{DestinationPortal: portal, PreparedStatement: stmt}
	}
	exec := func(portal string, max uint32) pgproto3.FrontendMessage {
		return &pgproto3.Execute{Portal: portal, MaxRows: max}
	}
	sync := &pgproto3.Sync{}
	query := func(sql string) pgproto3.FrontendMessage { return &pgproto3.Query{String: sql} }
	steps := []step{
		{[]pgproto3.FrontendMessage{query("BEGIN")}},
		{[]pgproto3.FrontendMessage{parse("ordered", "SELECT id, v FROM pt ORDER BY id DESC"), bind("a", "ordered"), exec("a", 700), sync}},
		{[]pgproto3.FrontendMessage{exec("a", 700), sync}},
		// Another statement while a is suspended, in the same transaction.
		{[]pgproto3.FrontendMessage{query("INSERT INTO pt VALUES (100001, 'new'); SELECT count(*) FROM pt")}},
		{[]pgproto3.FrontendMessage{exec("a", 700), sync}},
		{[]pgproto3.FrontendMessage{exec("a", 700), sync}},
		{[]pgproto3.FrontendMessage{exec("a", 700), sync}},
		// A portal closed early; the transaction goes on.
		{[]pgproto3.FrontendMessage{bind("b", "ordered"), exec("b", 10), &pgproto3.Close{ObjectType: 'P', Name: "b"}, sync}},
		{[]pgproto3.FrontendMessage{parse("agg", "SELECT count(*), max(id) FROM pt"), bind("c", "agg"), exec("c", 1), exec("c", 1), sync}},
		{[]pgproto3.FrontendMessage{query("COMMIT")}},
		// Outside a transaction block the portal ends at Sync.
		{[]pgproto3.FrontendMessage{bind("d", "ordered"), exec("d", 3), sync}},
		{[]pgproto3.FrontendMessage{exec("d", 3), sync}},
		// Two portals read in turns within one batch, and one described while it
		// streams.
		{[]pgproto3.FrontendMessage{query("BEGIN")}},
		{[]pgproto3.FrontendMessage{bind("e", "ordered"), exec("e", 4), bind("f", "ordered"), exec("f", 3), &pgproto3.Describe{ObjectType: 'P', Name: "e"}, exec("e", 4), exec("f", 0), exec("e", 0), sync}},
		{[]pgproto3.FrontendMessage{query("COMMIT")}},
		// A write and a portal suspended in one batch outside a transaction block:
		// the portal ends at Sync, and the write commits.
		{[]pgproto3.FrontendMessage{parse("ins", "INSERT INTO pt VALUES (100002, 'batch')"), bind("", "ins"), exec("", 0), bind("g", "ordered"), exec("g", 2), sync}},
		{[]pgproto3.FrontendMessage{query("SELECT count(*) FROM pt WHERE id = 100002")}},
		// Many single-row statements (Npgsql's SingleRow, JDBC's setMaxRows): each
		// portal ends at its Sync.
		{[]pgproto3.FrontendMessage{bind("", "ordered"), exec("", 1), sync}},
		{[]pgproto3.FrontendMessage{bind("", "ordered"), exec("", 1), sync}},
		{[]pgproto3.FrontendMessage{bind("", "ordered"), exec("", 1), sync}},
		// The unnamed portal, replaced while suspended.
		{[]pgproto3.FrontendMessage{query("BEGIN")}},
		{[]pgproto3.FrontendMessage{bind("", "ordered"), exec("", 5), sync}},
		{[]pgproto3.FrontendMessage{bind("", "ordered"), exec("", 2), exec("", 0), sync}},
		{[]pgproto3.FrontendMessage{query("ROLLBACK")}},
		// One shard's rows: the server keeps the suspended portal. Read on across
		// batches and beside another portal; a savepoint rolled back drops the
		// portals made after it, and the next Execute of one fails the transaction.
		{[]pgproto3.FrontendMessage{query("BEGIN")}},
		{[]pgproto3.FrontendMessage{parse("one", "SELECT id, v FROM pk WHERE k = 1 ORDER BY id"), bind("h", "one"), exec("h", 100), sync}},
		{[]pgproto3.FrontendMessage{exec("h", 100), &pgproto3.Describe{ObjectType: 'P', Name: "h"}, sync}},
		{[]pgproto3.FrontendMessage{query("SAVEPOINT s1")}},
		{[]pgproto3.FrontendMessage{bind("i", "one"), exec("i", 5), bind("i2", "ordered"), exec("i2", 5), exec("h", 50), sync}},
		{[]pgproto3.FrontendMessage{query("ROLLBACK TO SAVEPOINT s1")}},
		{[]pgproto3.FrontendMessage{exec("h", 50), sync}},
		{[]pgproto3.FrontendMessage{exec("i", 5), sync}},
		{[]pgproto3.FrontendMessage{query("ROLLBACK")}},
		// Closed while suspended, then executed: gone. A portal left suspended at
		// COMMIT ends with it.
		{[]pgproto3.FrontendMessage{query("BEGIN")}},
		{[]pgproto3.FrontendMessage{bind("j", "one"), exec("j", 3), &pgproto3.Close{ObjectType: 'P', Name: "j"}, bind("j", "one"), exec("j", 2), sync}},
		{[]pgproto3.FrontendMessage{bind("m", "one"), exec("m", 3), sync}},
		{[]pgproto3.FrontendMessage{query("COMMIT")}},
		{[]pgproto3.FrontendMessage{exec("m", 3), sync}},
		// An error met in a later part fails the transaction, as on the server.
		{[]pgproto3.FrontendMessage{query("BEGIN")}},
		{[]pgproto3.FrontendMessage{parse("bad", "SELECT id, 1 / (id - 1501) FROM pk WHERE k = 2"), bind("o", "bad"), exec("o", 100), sync}},
		{[]pgproto3.FrontendMessage{exec("o", 1000), sync}},
		{[]pgproto3.FrontendMessage{exec("o", 1), sync}},
		{[]pgproto3.FrontendMessage{query("ROLLBACK")}},
		// Outside a transaction block: alone in its batch (the portal ends at Sync),
		// and read on within one batch (an implicit transaction).
		{[]pgproto3.FrontendMessage{bind("", "one"), exec("", 3), sync}},
		{[]pgproto3.FrontendMessage{bind("q", "one"), exec("q", 3), exec("q", 4), exec("q", 0), sync}},
		{[]pgproto3.FrontendMessage{exec("q", 3), sync}},
		// A portal bound before a savepoint and first run after it outlives a
		// ROLLBACK TO it; those bound after it do not, and their names are free.
		{[]pgproto3.FrontendMessage{query("BEGIN")}},
		{[]pgproto3.FrontendMessage{bind("r", "one"), bind("r2", "ordered"), sync}},
		{[]pgproto3.FrontendMessage{query("SAVEPOINT s2")}},
		{[]pgproto3.FrontendMessage{exec("r", 3), exec("r2", 3), bind("c", "one"), exec("c", 3), bind("c2", "ordered"), exec("c2", 3), sync}},
		{[]pgproto3.FrontendMessage{query("ROLLBACK TO SAVEPOINT s2")}},
		{[]pgproto3.FrontendMessage{exec("r", 3), exec("r2", 3), bind("c", "one"), exec("c", 2), bind("c2", "ordered"), exec("c2", 2), sync}},
		{[]pgproto3.FrontendMessage{query("RELEASE SAVEPOINT s2")}},
		{[]pgproto3.FrontendMessage{exec("r", 2), &pgproto3.Describe{ObjectType: 'P', Name: "c"}, sync}},
		{[]pgproto3.FrontendMessage{query("ROLLBACK")}},
		// A portal that failed in a later part runs no more after a ROLLBACK TO.
		{[]pgproto3.FrontendMessage{query("BEGIN")}},
		{[]pgproto3.FrontendMessage{bind("d", "bad"), exec("d", 10), sync}},
		{[]pgproto3.FrontendMessage{query("SAVEPOINT s4")}},
		{[]pgproto3.FrontendMessage{exec("d", 1000), sync}},
		{[]pgproto3.FrontendMessage{query("ROLLBACK TO SAVEPOINT s4")}},
		{[]pgproto3.FrontendMessage{exec("d", 1), sync}},
		{[]pgproto3.FrontendMessage{query("ROLLBACK")}},
		// A finished portal executed again: the command with no rows. A portal does
		// not outlive COMMIT AND CHAIN.
		{[]pgproto3.FrontendMessage{query("BEGIN")}},
		{[]pgproto3.FrontendMessage{bind("a2", "one"), exec("a2", 1000), exec("a2", 1000), exec("a2", 1000), sync}},
		{[]pgproto3.FrontendMessage{bind("a3", "ordered"), exec("a3", 2000), exec("a3", 2000), exec("a3", 2000), sync}},
		{[]pgproto3.FrontendMessage{bind("a4", "one"), exec("a4", 5), sync}},
		{[]pgproto3.FrontendMessage{query("COMMIT AND CHAIN")}},
		{[]pgproto3.FrontendMessage{exec("a4", 5), sync}},
		{[]pgproto3.FrontendMessage{query("ROLLBACK")}},
		// A row-limited portal over several shards alone in its batch leaves the
		// session's connections as they were (a temporary table pins them).
		{[]pgproto3.FrontendMessage{query("CREATE TEMP TABLE tt (x int)")}},
		{[]pgproto3.FrontendMessage{bind("", "ordered"), exec("", 1), sync}},
		{[]pgproto3.FrontendMessage{bind("", "ordered"), exec("", 3000), sync}},
		{[]pgproto3.FrontendMessage{query("SELECT count(*) FROM tt")}},
		// A portal that answers no rows runs once: executed again it fails, and so
		// does its batch. One that answers rows answers none.
		{[]pgproto3.FrontendMessage{parse("ins2", "INSERT INTO pk VALUES (9, 99999, 'twice')"), bind("", "ins2"), exec("", 0), exec("", 0), sync}},
		{[]pgproto3.FrontendMessage{query("SELECT count(*) FROM pk WHERE id = 99999")}},
		{[]pgproto3.FrontendMessage{parse("sh", "SHOW DateStyle"), bind("s1", "sh"), exec("s1", 0), exec("s1", 0), sync}},
		{[]pgproto3.FrontendMessage{query("BEGIN")}},
		{[]pgproto3.FrontendMessage{parse("sp", "SAVEPOINT z"), bind("z1", "sp"), exec("z1", 0), exec("z1", 0), sync}},
		{[]pgproto3.FrontendMessage{query("ROLLBACK")}},
		// A write's RETURNING rows over several shards, in parts: suspended after a
		// full part, and the last tag counts its own rows.
		{[]pgproto3.FrontendMessage{query("BEGIN")}},
		{[]pgproto3.FrontendMessage{parse("ret", "INSERT INTO pt VALUES (200001, 'a'), (200002, 'b'), (200003, 'c') RETURNING id"), bind("w", "ret"), exec("w", 3), exec("w", 1), sync}},
		{[]pgproto3.FrontendMessage{bind("w2", "ret"), sync}},
		{[]pgproto3.FrontendMessage{query("ROLLBACK")}},
		{[]pgproto3.FrontendMessage{query("BEGIN")}},
		{[]pgproto3.FrontendMessage{bind("w3", "ret"), exec("w3", 2), exec("w3", 2), exec("w3", 2), sync}},
		{[]pgproto3.FrontendMessage{query("ROLLBACK")}},
		// The shards compute no row far past what the client asks for, as one server
		// would not: row 40 fails, and the first rows do not reach it.
		{[]pgproto3.FrontendMessage{parse("div", "SELECT id, 1 / (id - 40) FROM pt ORDER BY id"), bind("", "div"), exec("", 1), sync}},
		{[]pgproto3.FrontendMessage{query("BEGIN")}},
		{[]pgproto3.FrontendMessage{bind("dv", "div"), exec("dv", 3), exec("dv", 5), exec("dv", 1), sync}},
		{[]pgproto3.FrontendMessage{query("COMMIT")}},
		// LISTEN runs once.
		{[]pgproto3.FrontendMessage{parse("ls", "LISTEN portal_channel"), bind("l1", "ls"), exec("l1", 0), exec("l1", 0), sync}},
	}
	transcript := func(t *testing.T, dsn string) []string {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := pgconn.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		for _, q := range setup {
			if _, err := c.Exec(ctx, q).ReadAll(); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		fe := c.Frontend()
		var out []string
		for i, st := range steps {
			for _, m := range st.msgs {
				fe.Send(m)
			}
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			rows := 0
			flush := func() {
				if rows > 0 {
					fmt.Fprintf(&b, " %d rows;", rows)
					rows = 0
				}
			}
			for {
				msg, err := fe.Receive()
				if err != nil {
					t.Fatalf("step %d: %v", i+1, err)
				}
				switch m := msg.(type) {
				case *pgproto3.DataRow:
					if rows == 0 {
						fmt.Fprintf(&b, " first %s", m.Values[0])
					}
					rows++
					continue
				case *pgproto3.ReadyForQuery:
					flush()
					fmt.Fprintf(&b, " ready %c", m.TxStatus)
				case *pgproto3.CommandComplete:
					flush()
					fmt.Fprintf(&b, " %s;", m.CommandTag)
				case *pgproto3.ErrorResponse:
					flush()
					fmt.Fprintf(&b, " error %s;", m.Code)
					if m.Code == "34000" || m.Code == "55000" {
						fmt.Fprintf(&b, " (%s)", m.Message) // names the client's portal
					}
				case *pgproto3.PortalSuspended:
					flush()
					b.WriteString(" suspended;")
				case *pgproto3.ParseComplete, *pgproto3.BindComplete, *pgproto3.CloseComplete,
					*pgproto3.RowDescription, *pgproto3.NoticeResponse, *pgproto3.ParameterStatus:
					continue
				default:
					fmt.Fprintf(&b, " %T;", m)
				}
				if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
					break
				}
			}
			out = append(out, fmt.Sprintf("step %d:%s", i+1, b.String()))
		}
		return out
	}
	direct := transcript(t, pgtest.NewDatabase(t, "portal_direct"))
	e := startProxy(t, 2, []string{"pt=id", "pk=k"}, nil)
	proxied := transcript(t, e.url(""))
	t.Logf("PostgreSQL's transcript:\n%s", strings.Join(direct, "\n"))
	for i := range direct {
		if proxied[i] != direct[i] {
			t.Errorf("proxy  %s\n     direct %s", proxied[i], direct[i])
		}
	}
	for i := range 2 {
		if k := queryInt(t, e.shard(t, i), "SELECT count(*) FROM pt"); k == 0 || k == n+1 {
			t.Fatalf("shard %d holds %d rows: the table is not spread", i, k)
		}
	}
}
