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
// ends at Sync; an aggregate the engine answers whole.
func TestSuspendedPortalsAsOnOneServer(t *testing.T) {
	const n = 2500
	setup := []string{"CREATE TABLE pt (id int PRIMARY KEY, v text)"}
	var values []string
	for i := 1; i <= n; i++ {
		values = append(values, fmt.Sprintf("(%d, 'v%d')", i, i))
	}
	setup = append(setup, "INSERT INTO pt VALUES "+strings.Join(values, ", "))
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
	e := startProxy(t, 2, []string{"pt=id"}, nil)
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
