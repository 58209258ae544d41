package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/proxy"
)

// TestMaxHeldMemory: an answer read whole before its merge (DISTINCT across shards, a
// portal with a row limit) that would hold more than the bound fails with 54000 and a
// hint, and leaves the client's connection and its server connections usable; a
// streamed answer of the same size passes, and so does a DISTINCT under the bound.
func TestMaxHeldMemory(t *testing.T) {
	e := startProxy(t, 2, []string{"held=id", "heldk=k"}, nil, func(c *proxy.Config) { c.MaxHeld = 1 << 20 })
	c := e.connect(t)
	exec1(t, c, "CREATE TABLE held (id int PRIMARY KEY, v text)")
	pad := strings.Repeat("x", 100)
	for start := 0; start < 20000; start += 1000 {
		var rows []string
		for i := start; i < start+1000; i++ {
			rows = append(rows, fmt.Sprintf("(%d, '%d%s')", i, i, pad))
		}
		exec1(t, c, "INSERT INTO held VALUES "+strings.Join(rows, ", "))
	}
	ctx := context.Background()
	pc := e.pgconnect(t)
	check := func(sql string, wantCode string) {
		t.Helper()
		_, err := pc.Exec(ctx, sql).ReadAll()
		var pe *pgconn.PgError
		switch {
		case wantCode == "" && err != nil:
			t.Errorf("%s: %v", sql, err)
		case wantCode != "" && sqlState(err) != wantCode:
			t.Errorf("%s: %v, want SQLSTATE %s", sql, err, wantCode)
		case wantCode == "54000" && (!errors.As(err, &pe) || !strings.Contains(pe.Hint, "max-held-memory")):
			t.Errorf("%s: %v, want a hint naming the bound", sql, err)
		}
	}
	gathered := "SELECT v, count(*) FROM held GROUP BY v ORDER BY count(*) DESC, v" // groups sorted whole
	const sorted = "SELECT id, v FROM held ORDER BY id"
	check(gathered, "54000")
	check("BEGIN", "")
	check(gathered, "54000")
	check("SELECT 1", "25P02") // the transaction failed, as on PostgreSQL
	check("ROLLBACK", "")
	check("SELECT id, v FROM held", "")                     // streamed: about 2 MB through a 1 MB bound
	check("SELECT DISTINCT v FROM held WHERE id < 100", "") // under the bound
	check("SELECT DISTINCT v FROM held", "")                // each set of equal rows met in order: streamed
	check("SELECT v, max(id) FROM held GROUP BY v", "")     // each group met in order: streamed
	if n := queryInt(t, c, "SELECT count(*) FROM held"); n != 20000 {
		t.Errorf("count %d after the refusals, want 20000", n)
	}
	// A portal with a row limit over several shards, in a transaction, fetches its
	// shards' rows in parts: bounded by nothing but a batch per shard. Alone in its
	// batch outside a transaction, it ends at the Sync that follows: its first rows
	// stream, and the shards stop. One that must gather its answer is bounded.
	fe := pc.Frontend()
	limited := func(inTx bool, sql string) (code string, rows, suspended int) {
		t.Helper()
		if inTx {
			fe.Send(&pgproto3.Query{String: "BEGIN"})
		}
		fe.Send(&pgproto3.Parse{Query: sql})
		fe.Send(&pgproto3.Bind{})
		fe.Send(&pgproto3.Execute{MaxRows: 10})
		fe.Send(&pgproto3.Sync{})
		if inTx {
			fe.Send(&pgproto3.Query{String: "ROLLBACK"})
		}
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		for ready := 0; ready < 1+2*btoi(inTx); {
			msg, err := fe.Receive()
			if err != nil {
				t.Fatal(err)
			}
			switch m := msg.(type) {
			case *pgproto3.ErrorResponse:
				code = m.Code
			case *pgproto3.DataRow:
				if want := fmt.Sprint(rows); sql == sorted && string(m.Values[0]) != want {
					t.Errorf("row %d: id %s", rows, m.Values[0])
				}
				rows++
			case *pgproto3.PortalSuspended:
				suspended++
			case *pgproto3.ReadyForQuery:
				ready++
			}
		}
		return code, rows, suspended
	}
	if code, _, _ := limited(true, gathered); code != "54000" {
		t.Errorf("a row-limited portal over the bound, in a transaction: error %q, want 54000", code)
	}
	for range 3 { // the connections of the shards stopped are not reused
		for _, inTx := range []bool{true, false} {
			if code, rows, suspended := limited(inTx, sorted); code != "" || rows != 10 || suspended != 1 {
				t.Errorf("a row-limited portal (in a transaction: %v): error %q, %d rows, %d suspended; want none, 10, 1", inTx, code, rows, suspended)
			}
		}
	}
	// On one shard, the server's own portal keeps the rest: the same answer, fetched
	// in parts, holds nothing in the proxy.
	exec1(t, c, "CREATE TABLE heldk (k int, id int, v text)")
	for start := 0; start < 20000; start += 1000 {
		var rows []string
		for i := start; i < start+1000; i++ {
			rows = append(rows, fmt.Sprintf("(7, %d, '%d%s')", i, i, pad))
		}
		exec1(t, c, "INSERT INTO heldk VALUES "+strings.Join(rows, ", "))
	}
	fe.Send(&pgproto3.Query{String: "BEGIN"})
	fe.Send(&pgproto3.Parse{Query: "SELECT id, v FROM heldk WHERE k = 7 ORDER BY id"})
	fe.Send(&pgproto3.Bind{DestinationPortal: "parts"})
	for range 3 {
		fe.Send(&pgproto3.Execute{Portal: "parts", MaxRows: 10})
	}
	fe.Send(&pgproto3.Execute{Portal: "parts"}) // the rest, relayed
	fe.Send(&pgproto3.Sync{})
	fe.Send(&pgproto3.Query{String: "COMMIT"})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var got, suspended, ready int
	for ready < 3 {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			t.Errorf("one shard's answer fetched in parts: %s %s", m.Code, m.Message)
		case *pgproto3.DataRow:
			if want := fmt.Sprint(got); string(m.Values[0]) != want {
				t.Fatalf("row %d: id %s", got, m.Values[0])
			}
			got++
		case *pgproto3.PortalSuspended:
			suspended++
		case *pgproto3.ReadyForQuery:
			ready++
		}
	}
	if got != 20000 || suspended != 3 {
		t.Errorf("one shard's answer fetched in parts: %d rows, %d suspensions; want 20000, 3", got, suspended)
	}
	check("SELECT count(*) FROM held", "")
	// A write's RETURNING rows are not bounded: the write ran (alone on one shard,
	// it committed), and its answer says so.
	fe.Send(&pgproto3.Parse{Query: "UPDATE held SET v = 'changed' WHERE id = 5 RETURNING repeat('x', 2000000)"})
	fe.Send(&pgproto3.Bind{})
	fe.Send(&pgproto3.Execute{MaxRows: 1})
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if m, ok := msg.(*pgproto3.ErrorResponse); ok {
			t.Errorf("UPDATE ... RETURNING with a row limit: %s %s", m.Code, m.Message)
		}
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
	var v string
	if err := c.QueryRow(ctx, "SELECT v FROM held WHERE id = 5").Scan(&v); err != nil || v != "changed" {
		t.Errorf("after the UPDATE ... RETURNING: %q %v", v, err)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
