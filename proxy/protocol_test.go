package proxy_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/proxy"
	"github.com/shardlab/shardlab/proxy/backend"
	"github.com/shardlab/shardlab/proxy/router"
	"github.com/shardlab/shardlab/rules"
)

// TestCrossShardQueries: DDL, writes and reads through the proxy land on the right
// shards and come back merged, in the simple and the extended protocol, text and binary.
func TestCrossShardQueries(t *testing.T) {
	e := startProxy(t, 3, []string{"orders=id"}, []string{"regions"})
	c := e.connect(t)
	exec1(t, c, "CREATE TABLE orders (id bigint PRIMARY KEY, region int, amount numeric(10,2), note text)")
	exec1(t, c, "CREATE TABLE regions (id int PRIMARY KEY, name text)")
	exec1(t, c, "INSERT INTO regions VALUES (1, 'north'), (2, 'south')")
	for i := 1; i <= 60; i++ {
		exec1(t, c, "INSERT INTO orders VALUES ($1, $2, $3, $4)", i, i%2+1, fmt.Sprintf("%d.25", i), fmt.Sprintf("n%02d", i))
	}
	// Every shard holds some rows, and they add up.
	var total int64
	for i := range e.dsns {
		n := queryInt(t, e.shard(t, i), "SELECT count(*) FROM orders")
		if n == 0 {
			t.Errorf("shard %d holds no orders", i)
		}
		total += n
		if r := queryInt(t, e.shard(t, i), "SELECT count(*) FROM regions"); r != 2 {
			t.Errorf("shard %d holds %d regions, want the 2 broadcast rows", i, r)
		}
	}
	if total != 60 {
		t.Errorf("shards hold %d orders in all, want 60", total)
	}
	ctx := context.Background()
	// Extended protocol (pgx), binary results.
	var count, sum int64
	var avg float64
	if err := c.QueryRow(ctx, "SELECT count(*), sum(id), avg(amount) FROM orders").Scan(&count, &sum, &avg); err != nil {
		t.Fatal(err)
	}
	if count != 60 || sum != 1830 || avg != 30.75 {
		t.Errorf("count %d sum %d avg %v", count, sum, avg)
	}
	rows, err := c.Query(ctx, "SELECT id, note FROM orders WHERE id > $1 ORDER BY id DESC LIMIT 3", 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		var note string
		if err := rows.Scan(&id, &note); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if rows.Err() != nil || !slices.Equal(ids, []int64{60, 59, 58}) {
		t.Errorf("ORDER BY ... LIMIT 3: %v %v", ids, rows.Err())
	}
	// Simple protocol, text.
	pc := e.pgconnect(t)
	res, err := pc.Exec(ctx, "SELECT region, count(*) FROM orders GROUP BY region ORDER BY region; SELECT name FROM regions WHERE id = 2").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || len(res[0].Rows) != 2 || string(res[0].Rows[0][1]) != "30" || string(res[1].Rows[0][0]) != "south" {
		t.Errorf("multi-statement query: %+v", res)
	}
	// A shape the merge cannot answer exactly is refused with 0A000.
	_, err = c.Exec(ctx, "SELECT id, row_number() OVER (ORDER BY id) FROM orders")
	if sqlState(err) != "0A000" {
		t.Errorf("window function across shards: %v, want 0A000", err)
	}
	// The refusal did not break the connection.
	if n := queryInt(t, c, "SELECT count(*) FROM orders WHERE id = $1", 7); n != 1 {
		t.Errorf("point read after a refusal: %d", n)
	}
	// Binary parameters with declared types route too.
	rr := pc.ExecParams(ctx, "SELECT note FROM orders WHERE id = $1", [][]byte{binary.BigEndian.AppendUint64(nil, 42)}, []uint32{20}, []int16{1}, nil)
	r := rr.Read()
	if r.Err != nil || len(r.Rows) != 1 || string(r.Rows[0][0]) != "n42" {
		t.Errorf("binary key: %v %v", r.Rows, r.Err)
	}
}

// TestDescribeBeforeBind: a driver describes a statement before it has values; the
// proxy answers with the parameter types and columns a shard gives.
func TestDescribeBeforeBind(t *testing.T) {
	e := startProxy(t, 2, []string{"items=id"}, nil)
	c := e.connect(t)
	exec1(t, c, "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric)")
	pc := e.pgconnect(t)
	sd, err := pc.Prepare(context.Background(), "by_id", "SELECT name, price FROM items WHERE id = $1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sd.ParamOIDs, []uint32{23}) || len(sd.Fields) != 2 || sd.Fields[0].Name != "name" || sd.Fields[1].DataTypeOID != 1700 {
		t.Errorf("description: params %v fields %+v", sd.ParamOIDs, sd.Fields)
	}
	// The named statement then runs on whichever shard each value names, in binary.
	exec1(t, c, "INSERT INTO items VALUES (1, 'a', 1.5), (2, 'b', 2.5), (3, 'c', 3.5)")
	for id, want := range map[string]string{"1": "a", "2": "b", "3": "c"} {
		r := pc.ExecPrepared(context.Background(), "by_id", [][]byte{[]byte(id)}, nil, []int16{1}).Read()
		if r.Err != nil || len(r.Rows) != 1 || string(r.Rows[0][0]) != want {
			t.Errorf("id %s: %v %v", id, r.Rows, r.Err)
		}
	}
	if _, err := pc.Prepare(context.Background(), "by_id", "SELECT 1", nil); sqlState(err) != "42P05" {
		t.Errorf("preparing a name twice: %v, want 42P05", err)
	}
	if err := pc.Deallocate(context.Background(), "by_id"); err != nil {
		t.Fatal(err)
	}
	r := pc.ExecPrepared(context.Background(), "by_id", [][]byte{[]byte("1")}, nil, nil).Read()
	if sqlState(r.Err) != "26000" {
		t.Errorf("a closed statement: %v, want 26000", r.Err)
	}
}

// TestDeclaredParameters: a statement may declare more parameter types at Parse than its
// text references. PostgreSQL then takes that many values at Bind, reads every one by
// its type, and describes them all; the proxy answers as one database does. Up to this
// change it counted only the referenced ones: 08P01 for the right number of values, and
// the wrong number accepted.
func TestDeclaredParameters(t *testing.T) {
	e := startProxy(t, 2, []string{"items=id"}, nil)
	c := e.connect(t)
	const schema = "CREATE TABLE items (id int PRIMARY KEY, name text)"
	const data = "INSERT INTO items VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')"
	exec1(t, c, schema)
	exec1(t, c, data)
	ctx := context.Background()
	one, err := pgconn.Connect(ctx, pgtest.NewDatabase(t, "declared_one"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { one.Close(context.Background()) })
	for _, sql := range []string{schema, data} {
		if _, err := one.Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatal(err)
		}
	}
	int4 := func(v int32) []byte { return binary.BigEndian.AppendUint32(nil, uint32(v)) }
	cases := []struct {
		sql     string
		oids    []uint32
		values  [][]byte
		formats []int16
	}{
		{"SELECT $1::int", []uint32{23, 23}, [][]byte{[]byte("1"), []byte("2")}, nil},
		{"SELECT $1::int", []uint32{23, 23}, [][]byte{[]byte("1")}, nil},
		{"SELECT $1::int", []uint32{23, 23}, [][]byte{[]byte("1"), []byte("x")}, nil},
		{"SELECT $1::int", []uint32{23, 23}, [][]byte{[]byte("x"), []byte("y")}, nil},
		{"SELECT 1", []uint32{23}, [][]byte{[]byte("1")}, nil},
		{"SELECT 1", []uint32{23}, nil, nil},
		{"SELECT 1", []uint32{23}, [][]byte{[]byte("x")}, nil},
		{"SELECT count(*) FROM items WHERE id = $1", []uint32{23, 25}, [][]byte{[]byte("1"), []byte("a")}, nil},
		{"SELECT count(*) FROM items WHERE id > $1", []uint32{0, 25}, [][]byte{[]byte("1"), nil}, nil},
		{"SELECT count(*) FROM items WHERE id > $1", []uint32{23, 23}, [][]byte{[]byte("1"), []byte("a")}, nil},
		{"SELECT id FROM items WHERE id > $1 ORDER BY id", []uint32{23, 23, 23}, [][]byte{int4(1), int4(7), int4(8)}, []int16{1}},
		{"SELECT id FROM items WHERE id > $1 ORDER BY id", []uint32{23, 23}, [][]byte{int4(1), []byte("12")}, []int16{1, 1}},
		{"SELECT id FROM items WHERE id > $1 ORDER BY id", []uint32{0, 23}, [][]byte{[]byte("2"), int4(5)}, []int16{0, 1}},
		{"UPDATE items SET name = name WHERE id < $1", []uint32{23, 1700}, [][]byte{[]byte("3"), []byte("1.5")}, nil},
		{"UPDATE items SET name = name WHERE id < $1", []uint32{23, 1700}, [][]byte{[]byte("3"), []byte("1.5.")}, nil},
		{"BEGIN", []uint32{23}, [][]byte{[]byte("x")}, nil},
		{"", []uint32{23}, [][]byte{[]byte("x")}, nil},
		{"", []uint32{23}, nil, nil},
		{"", nil, [][]byte{[]byte("1")}, nil},
		{"", []uint32{0}, [][]byte{[]byte("1")}, nil},
		{"", []uint32{0}, [][]byte{nil}, nil},
		{"", []uint32{23, 0}, [][]byte{[]byte("x"), []byte("1")}, nil},
		{"", []uint32{23, 0}, [][]byte{[]byte("1"), []byte("1")}, nil},
		{"", []uint32{23, 0, 23}, [][]byte{int4(1), []byte("1"), int4(2)}, []int16{1, 0, 1}},
		{"", []uint32{0}, nil, nil},
		{"SELECT 1", []uint32{0}, [][]byte{[]byte("1")}, nil},
		{"BEGIN", []uint32{0}, [][]byte{[]byte("1")}, nil},
	}
	answer := func(pc *pgconn.PgConn, i int) string {
		name := fmt.Sprintf("declared_%d", i)
		k := cases[i]
		sd, err := pc.Prepare(ctx, name, k.sql, k.oids)
		if err != nil {
			return "prepare: " + err.Error()
		}
		r := pc.ExecPrepared(ctx, name, k.values, k.formats, nil).Read()
		if err := pc.Deallocate(ctx, name); err != nil {
			t.Fatal(err)
		}
		if _, err := pc.Exec(ctx, "ROLLBACK").ReadAll(); err != nil {
			t.Fatal(err)
		}
		msg := ""
		var pe *pgconn.PgError
		if errors.As(r.Err, &pe) {
			// The statement's name is the only thing that may differ.
			msg = pe.Code + " " + pe.Message
		} else if r.Err != nil {
			msg = r.Err.Error()
		}
		return fmt.Sprintf("params %v, tag %q, rows %q, error %s", sd.ParamOIDs, r.CommandTag, r.Rows, msg)
	}
	pc := e.pgconnect(t)
	for i, k := range cases {
		want, got := answer(one, i), answer(pc, i)
		if got != want {
			t.Errorf("%s declaring %v, values %q:\n got  %s\n want %s", k.sql, k.oids, k.values, got, want)
		}
	}
	// In a failed transaction an empty statement is parsed and described, but not
	// bound (25P02): it is no statement that ends the transaction.
	failed := func(pc *pgconn.PgConn) string {
		var out []string
		for _, sql := range []string{"BEGIN", "SELECT 1/0"} {
			_, err := pc.Exec(ctx, sql).ReadAll()
			out = append(out, sqlState(err))
		}
		_, err := pc.Prepare(ctx, "empty_in_failed", "", nil)
		out = append(out, sqlState(err))
		r := pc.ExecPrepared(ctx, "empty_in_failed", nil, nil, nil).Read()
		out = append(out, sqlState(r.Err))
		_, err = pc.Exec(ctx, "ROLLBACK").ReadAll()
		return strings.Join(append(out, sqlState(err)), " ")
	}
	if want, got := failed(one), failed(pc); got != want {
		t.Errorf("an empty statement in a failed transaction: %s, want %s", got, want)
	}
}

// TestExtendedErrorRecovery: after an error the proxy skips to Sync, the batch's
// implicit transaction rolls back, and the connection goes on.
func TestExtendedErrorRecovery(t *testing.T) {
	e := startProxy(t, 2, []string{"kv=k"}, nil)
	c := e.connect(t)
	exec1(t, c, "CREATE TABLE kv (k int PRIMARY KEY, v int)")
	ctx := context.Background()
	// One batch: two inserts on different shards, then a failing one. PostgreSQL runs a
	// batch in one implicit transaction: nothing of it stays.
	b := &pgx.Batch{}
	b.Queue("INSERT INTO kv VALUES ($1, 1)", 1)
	b.Queue("INSERT INTO kv VALUES ($1, 1)", 2)
	b.Queue("INSERT INTO kv VALUES ($1, 1)", 1) // duplicate key
	b.Queue("INSERT INTO kv VALUES ($1, 1)", 3) // skipped after the error
	err := c.SendBatch(ctx, b).Close()
	if sqlState(err) != "23505" {
		t.Fatalf("batch: %v, want 23505", err)
	}
	if n := queryInt(t, c, "SELECT count(*) FROM kv"); n != 0 {
		t.Errorf("%d rows after a failed batch, want 0 (its implicit transaction rolls back)", n)
	}
	// A batch that succeeds commits on every shard it touched.
	b = &pgx.Batch{}
	for k := 1; k <= 6; k++ {
		b.Queue("INSERT INTO kv VALUES ($1, $2)", k, k*10)
	}
	if err := c.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, c, "SELECT sum(v) FROM kv"); n != 210 {
		t.Errorf("sum %d, want 210", n)
	}
	// A multi-statement simple query is one implicit transaction too.
	pc := e.pgconnect(t)
	_, err = pc.Exec(ctx, "UPDATE kv SET v = 0 WHERE k = 1; UPDATE kv SET v = 0 WHERE k = 2; SELECT 1/0").ReadAll()
	if sqlState(err) != "22012" {
		t.Fatalf("multi-statement query: %v, want 22012", err)
	}
	if n := queryInt(t, c, "SELECT sum(v) FROM kv"); n != 210 {
		t.Errorf("sum %d after a failed multi-statement query, want 210", n)
	}
	// Raw protocol: an error in the middle of a pipeline, then the next Sync works.
	fe := pc.Frontend()
	fe.SendParse(&pgproto3.Parse{Query: "SELECT nonexistent_column FROM kv"})
	fe.SendBind(&pgproto3.Bind{})
	fe.SendExecute(&pgproto3.Execute{})
	fe.SendParse(&pgproto3.Parse{Query: "SELECT 1"})
	fe.SendBind(&pgproto3.Bind{})
	fe.SendExecute(&pgproto3.Execute{})
	fe.SendSync(&pgproto3.Sync{})
	fe.SendQuery(&pgproto3.Query{String: "SELECT 2"})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) == 0 || got[len(got)-1] != "Z" || strings.Count(strings.Join(got, ""), "Z") < 2 {
		msg, err := pc.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			got = append(got, "E"+m.Code)
		case *pgproto3.DataRow:
			got = append(got, "D"+string(m.Values[0]))
		case *pgproto3.ReadyForQuery:
			got = append(got, "Z")
		case *pgproto3.CommandComplete:
			got = append(got, "C")
		}
	}
	if want := []string{"E42703", "Z", "D2", "C", "Z"}; !slices.Equal(got, want) {
		t.Errorf("messages %v, want %v", got, want)
	}
}

// TestTransactions: BEGIN/COMMIT/ROLLBACK across shards, savepoints, a failed
// transaction, and PostgreSQL's warnings.
func TestTransactions(t *testing.T) {
	e := startProxy(t, 2, []string{"acct=id"}, nil)
	c := e.connect(t)
	ctx := context.Background()
	exec1(t, c, "CREATE TABLE acct (id int PRIMARY KEY, bal int NOT NULL)")
	exec1(t, c, "INSERT INTO acct VALUES (1, 100), (2, 100), (3, 100), (4, 100)")

	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, c, "UPDATE acct SET bal = bal - 10 WHERE id = 1")
	exec1(t, c, "UPDATE acct SET bal = bal + 10 WHERE id = 2")
	exec1(t, c, "SAVEPOINT s1")
	exec1(t, c, "UPDATE acct SET bal = 0 WHERE id IN (3, 4)")
	exec1(t, c, "ROLLBACK TO SAVEPOINT s1")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, c, "SELECT sum(bal) FROM acct"); n != 400 {
		t.Errorf("sum %d, want 400", n)
	}
	if n := queryInt(t, c, "SELECT bal FROM acct WHERE id = 3"); n != 100 {
		t.Errorf("balance of 3 is %d after ROLLBACK TO SAVEPOINT, want 100", n)
	}
	// A rolled-back transaction leaves nothing on any shard.
	tx, _ = c.Begin(ctx)
	exec1(t, c, "UPDATE acct SET bal = 0")
	tx.Rollback(ctx)
	if n := queryInt(t, c, "SELECT sum(bal) FROM acct"); n != 400 {
		t.Errorf("sum %d after rollback, want 400", n)
	}
	// A failed statement aborts the transaction; COMMIT then rolls back.
	pc := e.pgconnect(t)
	res, err := pc.Exec(ctx, "BEGIN").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	_ = res
	pc.Exec(ctx, "UPDATE acct SET bal = 1 WHERE id = 1").ReadAll()
	if _, err := pc.Exec(ctx, "SELECT 1/0").ReadAll(); sqlState(err) != "22012" {
		t.Fatalf("division by zero: %v", err)
	}
	if pc.TxStatus() != 'E' {
		t.Errorf("transaction status %c after an error, want E", pc.TxStatus())
	}
	if _, err := pc.Exec(ctx, "SELECT 1").ReadAll(); sqlState(err) != "25P02" {
		t.Errorf("statement in a failed transaction: %v, want 25P02", err)
	}
	res, err = pc.Exec(ctx, "COMMIT").ReadAll()
	if err != nil || res[0].CommandTag.String() != "ROLLBACK" {
		t.Errorf("COMMIT of a failed transaction: tag %v err %v, want ROLLBACK", res, err)
	}
	if n := queryInt(t, c, "SELECT bal FROM acct WHERE id = 1"); n != 90 {
		t.Errorf("balance %d, want 90", n)
	}
	// BEGIN opening a multi-statement query keeps its options.
	res, err = pc.Exec(ctx, "BEGIN ISOLATION LEVEL SERIALIZABLE; SHOW transaction_isolation; COMMIT").ReadAll()
	if err != nil || len(res) != 3 || string(res[1].Rows[0][0]) != "serializable" {
		t.Errorf("BEGIN ISOLATION LEVEL SERIALIZABLE; SHOW ...: %v %v", res, err)
	}
	// COMMIT outside a transaction warns, as PostgreSQL does.
	var notices []string
	cfg, _ := pgconn.ParseConfig(e.url(""))
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Code) }
	warn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer warn.Close(ctx)
	warn.Exec(ctx, "COMMIT").ReadAll()
	warn.Exec(ctx, "BEGIN; BEGIN; COMMIT").ReadAll()
	if !slices.Equal(notices, []string{"25P01", "25001"}) {
		t.Errorf("warnings %v, want 25P01 then 25001", notices)
	}
}

// TestFirstStatementCarriesBegin: a data source's BEGIN goes to the server in the same
// round trip as the transaction's first statement there, with the simple and with the
// extended protocol. The client sees that statement's own answer (its tag, not
// BEGIN's); the statement runs inside the transaction, with its options; an error in
// it points into the client's text and fails the transaction; and a rollback undoes
// it.
func TestFirstStatementCarriesBegin(t *testing.T) {
	e := startProxy(t, 1, nil, nil)
	ctx := context.Background()
	exec1(t, e.connect(t), "CREATE TABLE t (id int PRIMARY KEY)")
	direct := e.shard(t, 0)
	pc := e.pgconnect(t)
	for _, mode := range []string{"simple", "extended"} {
		t.Run(mode, func(t *testing.T) {
			run := func(sql string) (*pgconn.Result, error) {
				if mode == "simple" {
					res, err := pc.Exec(ctx, sql).ReadAll()
					if len(res) == 0 {
						return &pgconn.Result{}, err
					}
					return res[0], err
				}
				res := pc.ExecParams(ctx, sql, nil, nil, nil, nil).Read()
				return res, res.Err
			}
			if _, err := run("BEGIN ISOLATION LEVEL REPEATABLE READ"); err != nil {
				t.Fatal(err)
			}
			res, err := run("INSERT INTO t VALUES (1)")
			if err != nil || res.CommandTag.String() != "INSERT 0 1" {
				t.Fatalf("first statement of the transaction: tag %q, %v; want INSERT 0 1", res.CommandTag, err)
			}
			res, err = run("SELECT current_setting('transaction_isolation')")
			if err != nil || len(res.Rows) != 1 || string(res.Rows[0][0]) != "repeatable read" {
				t.Fatalf("isolation inside the transaction: %v, %v", res.Rows, err)
			}
			if n := queryInt(t, direct, "SELECT count(*) FROM t"); n != 0 {
				t.Errorf("%d rows visible outside the open transaction", n)
			}
			if _, err := run("ROLLBACK"); err != nil {
				t.Fatal(err)
			}
			if n := queryInt(t, direct, "SELECT count(*) FROM t"); n != 0 {
				t.Errorf("%d rows after ROLLBACK", n)
			}

			// The client's BEGIN, as typed, may end in a comment: the statement after
			// it must still run.
			if _, err := run("BEGIN -- to the end of the line"); err != nil {
				t.Fatal(err)
			}
			res, err = run("INSERT INTO t VALUES (2)")
			if err != nil || res.CommandTag.String() != "INSERT 0 1" {
				t.Fatalf("first statement after a commented BEGIN: tag %q, %v; want INSERT 0 1", res.CommandTag, err)
			}
			if _, err := run("COMMIT"); err != nil {
				t.Fatal(err)
			}
			if n := queryInt(t, direct, "SELECT count(*) FROM t WHERE id = 2"); n != 1 {
				t.Errorf("%d rows committed after a commented BEGIN, want 1", n)
			}
			exec1(t, direct, "DELETE FROM t")

			if _, err := run("BEGIN ISOLATION LEVEL SERIALIZABLE"); err != nil {
				t.Fatal(err)
			}
			_, err = run("SELECT nosuch FROM t")
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "42703" || pe.Position != 8 {
				t.Fatalf("unknown column in the first statement: %#v, want 42703 at position 8", err)
			}
			if pc.TxStatus() != 'E' {
				t.Errorf("transaction status %c after the error, want E", pc.TxStatus())
			}
			if _, err := run("ROLLBACK"); err != nil {
				t.Fatal(err)
			}
			if res, err := run("SELECT 1"); err != nil || pc.TxStatus() != 'I' || len(res.Rows) != 1 {
				t.Errorf("after ROLLBACK: %v, %v, status %c", res.Rows, err, pc.TxStatus())
			}
		})
	}
}

// TestSessionStateDoesNotLeak: in transaction pooling a client's SET follows it to
// whichever server connection serves it, and no other client sees it; a client that
// leaves in the middle of a transaction leaves no transaction and no lock behind.
func TestSessionStateDoesNotLeak(t *testing.T) {
	e := startProxy(t, 2, []string{"t=id"}, nil, withPool(1, 5*time.Second))
	a, b := e.connect(t), e.connect(t)
	ctx := context.Background()
	exec1(t, a, "CREATE TABLE t (id int PRIMARY KEY, v int)")
	exec1(t, a, "INSERT INTO t VALUES (1, 0), (2, 0)")
	exec1(t, a, "SET application_name = 'client_a'")
	exec1(t, a, "SET statement_timeout = '123s'")
	show := func(c *pgx.Conn, name string) string {
		var v string
		if err := c.QueryRow(ctx, "SHOW "+name).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for range 3 {
		if got := show(b, "application_name"); got == "client_a" {
			t.Fatal("client b sees client a's application_name")
		}
		if got := show(b, "statement_timeout"); got != "0" {
			t.Fatalf("client b sees statement_timeout %s", got)
		}
		if got := show(a, "statement_timeout"); got != "123s" {
			t.Fatalf("client a lost its statement_timeout: %s", got)
		}
	}
	// A SET in a transaction that rolls back does not stay.
	tx, _ := a.Begin(ctx)
	exec1(t, a, "SET statement_timeout = '5s'")
	tx.Rollback(ctx)
	if got := show(a, "statement_timeout"); got != "123s" {
		t.Errorf("after a rolled-back SET: statement_timeout %s, want 123s", got)
	}
	// RESET ALL goes back to the defaults.
	exec1(t, a, "RESET ALL")
	if got := show(a, "statement_timeout"); got != "0" {
		t.Errorf("after RESET ALL: statement_timeout %s", got)
	}

	// A client that disconnects in the middle of a transaction.
	leaver, err := pgx.Connect(ctx, e.url(""))
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, leaver, "BEGIN")
	exec1(t, leaver, "UPDATE t SET v = 99 WHERE id = 1")
	exec1(t, leaver, "UPDATE t SET v = 99 WHERE id = 2")
	leaver.Close(ctx) // Terminate, mid-transaction
	// With one connection per pool, b gets the very connections leaver held: they must
	// be idle, with the locks gone and the updates rolled back.
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := b.Exec(tctx, "UPDATE t SET v = 1 WHERE id IN (1, 2)"); err != nil {
		t.Fatalf("update after a client left mid-transaction: %v", err)
	}
	if n := queryInt(t, b, "SELECT sum(v) FROM t"); n != 2 {
		t.Errorf("sum %d, want 2 (the leaver's updates rolled back)", n)
	}
	for i := range e.dsns {
		if n := queryInt(t, e.shard(t, i), "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'"); n != 0 {
			t.Errorf("shard %d: %d sessions idle in transaction", i, n)
		}
	}
}

// TestPreparedStatementsUnderTransactionPooling: named statements prepared once by a
// client run on whichever server connection serves each transaction.
func TestPreparedStatementsUnderTransactionPooling(t *testing.T) {
	e := startProxy(t, 2, []string{"p=id"}, nil, withPool(2, 10*time.Second))
	setup := e.connect(t)
	exec1(t, setup, "CREATE TABLE p (id int PRIMARY KEY, n int NOT NULL)")
	var values []string
	for id := 1; id <= 20; id++ {
		values = append(values, fmt.Sprintf("(%d, 0)", id))
	}
	exec1(t, setup, "INSERT INTO p VALUES "+strings.Join(values, ", "))
	const clients, rounds = 6, 40
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for w := range clients {
		wg.Go(func() {
			ctx := context.Background()
			c, err := pgconn.Connect(ctx, e.url(""))
			if err != nil {
				errs <- err
				return
			}
			defer c.Close(ctx)
			if _, err := c.Prepare(ctx, "bump", "UPDATE p SET n = n + 1 WHERE id = $1", nil); err != nil {
				errs <- err
				return
			}
			if _, err := c.Prepare(ctx, "get", "SELECT n FROM p WHERE id = $1", []uint32{23}); err != nil {
				errs <- err
				return
			}
			for i := range rounds {
				id := []byte(fmt.Sprint((w*rounds+i)%20 + 1))
				if err := c.ExecPrepared(ctx, "bump", [][]byte{id}, nil, nil).Read().Err; err != nil {
					errs <- err
					return
				}
				if err := c.ExecPrepared(ctx, "get", [][]byte{id}, nil, []int16{1}).Read().Err; err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := queryInt(t, setup, "SELECT sum(n) FROM p"); n != clients*rounds {
		t.Errorf("sum %d, want %d", n, clients*rounds)
	}
}

// TestCheckoutTimeout: when every server connection is taken, a statement waits at
// most the checkout timeout, then fails with 53300; the client can go on.
func TestCheckoutTimeout(t *testing.T) {
	e := startProxy(t, 1, nil, nil, withPool(1, 300*time.Millisecond))
	holder, waiter := e.connect(t), e.connect(t)
	ctx := context.Background()
	exec1(t, holder, "BEGIN")
	exec1(t, holder, "SELECT 1") // holds the only connection until COMMIT
	start := time.Now()
	_, err := waiter.Exec(ctx, "SELECT 1")
	if sqlState(err) != "53300" || !strings.Contains(err.Error(), "ds_0") {
		t.Fatalf("statement with the pool exhausted: %v, want 53300 naming ds_0", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("waited %v with a checkout timeout of 300ms", d)
	}
	// A client may still connect (its settings are checked at its first statement).
	late, err := pgx.Connect(ctx, e.url("")+"&application_name=late")
	if err != nil {
		t.Fatalf("connecting with every server connection busy: %v", err)
	}
	defer late.Close(ctx)
	exec1(t, holder, "COMMIT")
	var app string
	if err := late.QueryRow(ctx, "SHOW application_name").Scan(&app); err != nil || app != "late" {
		t.Errorf("the late client's application_name: %q %v", app, err)
	}
	exec1(t, waiter, "SELECT 1")
}

// TestPoolDeadlock: two transactions that each hold one data source's only server
// connection and wait for the other's would wait on each other with no server seeing it;
// the checkout timeout ends them as deadlock victims (40P01, which clients retry), and
// their rollback frees both pools.
func TestPoolDeadlock(t *testing.T) {
	e := startProxy(t, 2, []string{"kv=id"}, nil, withPool(1, 300*time.Millisecond))
	ctx := context.Background()
	setup := e.connect(t)
	exec1(t, setup, "CREATE TABLE kv (id int PRIMARY KEY)")
	setup.Close(ctx)
	onShard := kvKeysPerShard(t, e, 2)
	a, b := e.connect(t), e.connect(t)
	exec1(t, a, "BEGIN")
	exec1(t, a, "INSERT INTO kv VALUES ($1)", onShard[0][0])
	exec1(t, b, "BEGIN")
	exec1(t, b, "INSERT INTO kv VALUES ($1)", onShard[1][0])
	errs := make(chan error, 2)
	go func() { _, err := a.Exec(ctx, "INSERT INTO kv VALUES ($1)", onShard[1][1]); errs <- err }()
	go func() { _, err := b.Exec(ctx, "INSERT INTO kv VALUES ($1)", onShard[0][1]); errs <- err }()
	victims := 0
	for range 2 {
		select {
		case err := <-errs:
			if sqlState(err) == "40P01" {
				victims++
			} else if err != nil {
				t.Errorf("waiting for the other pool: %v, want 40P01 or success", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the transactions still wait for each other's pools")
		}
	}
	if victims == 0 {
		t.Error("no transaction was ended as a deadlock victim")
	}
	exec1(t, a, "ROLLBACK")
	exec1(t, b, "ROLLBACK")
	if n := queryInt(t, a, "SELECT count(*) FROM kv"); n != 0 {
		t.Errorf("%d rows after both rolled back", n)
	}
}

// TestCrossPoolWait: with a long checkout timeout, transactions that hold each other's
// pools are still ended as deadlock victims after the cross-pool wait; a client that
// holds no connection waits past that bound for the pool, as pgbouncer's clients do.
func TestCrossPoolWait(t *testing.T) {
	e := startProxy(t, 2, []string{"kv=id"}, nil, withPool(1, time.Minute),
		func(c *proxy.Config) { c.CrossPoolWait = 300 * time.Millisecond })
	ctx := context.Background()
	setup := e.connect(t)
	exec1(t, setup, "CREATE TABLE kv (id int PRIMARY KEY)")
	setup.Close(ctx)
	onShard := kvKeysPerShard(t, e, 3)
	a, b := e.connect(t), e.connect(t)
	exec1(t, a, "BEGIN")
	exec1(t, a, "INSERT INTO kv VALUES ($1)", onShard[0][0])
	exec1(t, b, "BEGIN")
	exec1(t, b, "INSERT INTO kv VALUES ($1)", onShard[1][0])
	start := time.Now()
	errs := make(chan error, 2)
	go func() { _, err := a.Exec(ctx, "INSERT INTO kv VALUES ($1)", onShard[1][1]); errs <- err }()
	go func() { _, err := b.Exec(ctx, "INSERT INTO kv VALUES ($1)", onShard[0][1]); errs <- err }()
	victims := 0
	for range 2 {
		select {
		case err := <-errs:
			if sqlState(err) == "40P01" {
				victims++
			} else if err != nil {
				t.Errorf("waiting for the other pool: %v, want 40P01 or success", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the transactions still wait for each other's pools")
		}
	}
	if victims == 0 {
		t.Error("no transaction was ended as a deadlock victim")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the deadlock lasted %v with a cross-pool wait of 300ms", d)
	}
	exec1(t, a, "ROLLBACK")
	exec1(t, b, "ROLLBACK")

	// A client holding nothing waits longer than the cross-pool bound, and gets the
	// connection when the holder commits.
	exec1(t, a, "BEGIN")
	exec1(t, a, "INSERT INTO kv VALUES ($1)", onShard[0][2])
	done := make(chan error, 1)
	go func() { _, err := b.Exec(ctx, "INSERT INTO kv VALUES ($1)", onShard[0][1]); done <- err }()
	waitsUntil(t, done, time.Second, func() { exec1(t, a, "COMMIT") })
	if n := queryInt(t, a, "SELECT count(*) FROM kv"); n != 2 {
		t.Errorf("%d rows, want 2", n)
	}
}

// TestCrossPoolWaitInStatements: reads over both shards, outside transactions, take
// their connections concurrently, so two of them can each hold one pool of one and wait
// for the other's. The cross-pool wait ends such a wait as a deadlock victim (40P01,
// which the client retries) instead of leaving it to the long checkout timeout.
func TestCrossPoolWaitInStatements(t *testing.T) {
	e := startProxy(t, 2, []string{"kv=id"}, nil, withPool(1, time.Minute),
		func(c *proxy.Config) { c.CrossPoolWait = 200 * time.Millisecond })
	ctx := context.Background()
	setup := e.connect(t)
	exec1(t, setup, "CREATE TABLE kv (id int PRIMARY KEY)")
	exec1(t, setup, "INSERT INTO kv VALUES (1),(2),(3),(4),(5),(6),(7),(8),(9),(10),(11),(12),(13),(14),(15),(16),(17),(18),(19),(20)")
	setup.Close(ctx)
	start := time.Now()
	var wg sync.WaitGroup
	var victims atomic.Int64
	for range 4 {
		c := e.connect(t)
		wg.Go(func() {
			for done := 0; done < 8; {
				var n int
				err := c.QueryRow(ctx, "SELECT count(*) FROM kv").Scan(&n)
				switch {
				case sqlState(err) == "40P01":
					victims.Add(1) // retried, as clients do
				case err != nil:
					t.Errorf("read over both shards: %v", err)
					return
				case n != 20:
					t.Errorf("count %d, want 20", n)
					return
				default:
					done++
				}
			}
		})
	}
	wg.Wait()
	t.Logf("32 reads in %v, %d deadlock victims retried", time.Since(start).Round(time.Millisecond), victims.Load())
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("32 reads took %v (%d deadlock victims): waits ran into the one-minute checkout timeout", d, victims.Load())
	}
}

// TestLoginWithBusyPool: with every server connection taken and a long checkout
// timeout, a client still logs in at once (its settings wait for its first statement),
// with or without a bound on turns.
func TestLoginWithBusyPool(t *testing.T) {
	for _, turns := range []int{0, 1} {
		e := startProxy(t, 1, nil, nil, withPool(2, time.Minute), func(c *proxy.Config) {
			c.CrossPoolWait = 300 * time.Millisecond
			c.MaxTransactions = turns
		})
		ctx := context.Background()
		h1, h2 := e.connect(t), e.connect(t)
		exec1(t, h1, "BEGIN")
		exec1(t, h1, "SELECT 1")
		if turns == 0 {
			exec1(t, h2, "BEGIN")
			exec1(t, h2, "SELECT 1") // both connections taken
		}
		start := time.Now()
		late, err := pgx.Connect(ctx, e.url(""))
		if err != nil {
			t.Fatalf("turns %d: logging in with the pool busy: %v", turns, err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("turns %d: the login took %v", turns, d)
		}
		exec1(t, h1, "COMMIT")
		if turns == 0 {
			exec1(t, h2, "COMMIT")
		}
		exec1(t, late, "SELECT 1")
		late.Close(ctx)
	}
}

// TestMaxTransactions: with one turn, the transactions of TestPoolDeadlock cannot hold
// each other's pools: the second waits for its turn at its first statement, the first
// goes on to the second pool and commits, and then the second runs. Neither is ended as
// a deadlock victim. (The pools have two connections: one always stays for the router's
// own statements, so a bound of one turn per pool of one is refused.)
func TestMaxTransactions(t *testing.T) {
	e := startProxy(t, 2, []string{"kv=id"}, nil, withPool(2, 20*time.Second),
		func(c *proxy.Config) { c.MaxTransactions = 1 })
	ctx := context.Background()
	setup := e.connect(t)
	exec1(t, setup, "CREATE TABLE kv (id int PRIMARY KEY)")
	setup.Close(ctx)
	onShard := kvKeysPerShard(t, e, 2)
	a, b := e.connect(t), e.connect(t)
	exec1(t, a, "BEGIN")
	exec1(t, a, "INSERT INTO kv VALUES ($1)", onShard[0][0])
	exec1(t, b, "BEGIN")
	bDone := make(chan error, 1)
	go func() {
		_, err := b.Exec(ctx, "INSERT INTO kv VALUES ($1)", onShard[1][0])
		if err == nil {
			_, err = b.Exec(ctx, "INSERT INTO kv VALUES ($1)", onShard[0][1])
		}
		if err == nil {
			_, err = b.Exec(ctx, "COMMIT")
		}
		bDone <- err
	}()
	waitsUntil(t, bDone, 500*time.Millisecond, func() {
		exec1(t, a, "INSERT INTO kv VALUES ($1)", onShard[1][1]) // the second pool is free
		exec1(t, a, "COMMIT")
	})
	if n := queryInt(t, a, "SELECT count(*) FROM kv"); n != 4 {
		t.Errorf("%d rows, want 4", n)
	}
}

// TestSessionPooling: in session pooling a client keeps its server connection, so
// server-side session state (a temporary table) lasts; the next client gets the
// connection reset.
func TestSessionPooling(t *testing.T) {
	e := startProxy(t, 1, nil, nil, withSessionPooling(), withPool(1, 5*time.Second))
	ctx := context.Background()
	a, err := pgx.Connect(ctx, e.url(""))
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, a, "CREATE TEMPORARY TABLE scratch (x int)")
	exec1(t, a, "INSERT INTO scratch VALUES (1)")
	if n := queryInt(t, a, "SELECT count(*) FROM scratch"); n != 1 {
		t.Errorf("temporary table: %d rows", n)
	}
	a.Close(ctx)
	b := e.connect(t)
	if _, err := b.Exec(ctx, "SELECT * FROM scratch"); sqlState(err) != "42P01" {
		t.Errorf("next client sees the temporary table: %v", err)
	}
}

// TestCancelRequest: a cancel request reaches the server running the client's query.
func TestCancelRequest(t *testing.T) {
	e := startProxy(t, 2, []string{"t=id"}, nil)
	pc := e.pgconnect(t)
	ctx := context.Background()
	go func() {
		time.Sleep(300 * time.Millisecond)
		cancelConn(t, e, pc)
	}()
	start := time.Now()
	_, err := pc.Exec(ctx, "SELECT pg_sleep(20)").ReadAll()
	if sqlState(err) != "57014" {
		t.Fatalf("cancelled query: %v, want 57014", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the cancel took %v", d)
	}
	if _, err := pc.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Errorf("after a cancel: %v", err)
	}
}

// cancelConn sends a CancelRequest for pc, as libpq does: a new connection to the
// proxy with the key pc was given.
func cancelConn(t testing.TB, e *env, pc *pgconn.PgConn) {
	nc, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Error(err)
		return
	}
	defer nc.Close()
	buf, _ := (&pgproto3.CancelRequest{ProcessID: pc.PID(), SecretKey: pc.SecretKey()}).Encode(nil)
	nc.Write(buf)
	io.ReadAll(nc) // the proxy closes the connection when done
}

// TestBadClients: malformed, oversized and unknown messages, a wrong protocol
// version, an unknown database, too many clients: each gets an error and its
// connection closes, while other clients go on.
func TestBadClients(t *testing.T) {
	e := startProxy(t, 1, nil, nil, func(c *proxy.Config) { c.MaxClients = 3; c.MaxMessage = 4096 })
	good := e.pgconnect(t)
	ctx := context.Background()
	check := func(name string) {
		t.Helper()
		if _, err := good.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
			t.Fatalf("after %s the good client failed: %v", name, err)
		}
	}
	// raw sends bytes on a new connection and returns the error the proxy answered.
	raw := func(startup bool, data []byte) *pgproto3.ErrorResponse {
		t.Helper()
		nc, err := net.DialTimeout("tcp", e.addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(10 * time.Second))
		fe := pgproto3.NewFrontend(nc, nc)
		if startup {
			fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
				Parameters: map[string]string{"user": "postgres", "database": testDatabase}})
			fe.Flush()
			for {
				msg, err := fe.Receive()
				if err != nil {
					t.Fatalf("startup: %v", err)
				}
				if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
					break
				}
			}
		}
		nc.Write(data)
		for {
			msg, err := fe.Receive()
			if err != nil {
				return nil
			}
			if er, ok := msg.(*pgproto3.ErrorResponse); ok {
				// The connection must close after a FATAL error.
				if er.Severity == "FATAL" {
					if _, err := fe.Receive(); err == nil {
						t.Errorf("connection still open after FATAL %s", er.Code)
					}
				}
				return er
			}
		}
	}
	msg := func(typ byte, body []byte) []byte {
		b := []byte{typ, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], uint32(len(body)+4))
		return append(b, body...)
	}
	for _, tt := range []struct {
		name    string
		startup bool
		data    []byte
		code    string
	}{
		{"wrong protocol version", false, []byte{0, 0, 0, 8, 0, 2, 0, 0}, "0A000"},
		{"startup packet too long", false, []byte{0, 1, 0, 0, 0, 3, 0, 0}, "08P01"},
		{"oversized message", true, msg('Q', make([]byte, 5000)), "08P01"},
		{"unknown message type", true, msg('!', nil), "08P01"},
		{"malformed bind", true, msg('B', []byte{0, 0, 0xff}), "08P01"},
		{"bad message length", true, []byte{'Q', 0, 0, 0, 1}, "08P01"},
	} {
		er := raw(tt.startup, tt.data)
		if er == nil || er.Code != tt.code || er.Severity != "FATAL" {
			t.Errorf("%s: got %+v, want FATAL %s", tt.name, er, tt.code)
		}
		check(tt.name)
	}
	// Unknown database.
	_, err := pgconn.Connect(ctx, e.url("nope"))
	if sqlState(err) != "3D000" {
		t.Errorf("unknown database: %v, want 3D000", err)
	}
	check("unknown database")
	// The cap on clients (3): good, plus two more; the fourth is refused.
	e.pgconnect(t)
	e.pgconnect(t)
	_, err = pgconn.Connect(ctx, e.url(""))
	if sqlState(err) != "53300" {
		t.Errorf("client over --max-clients: %v, want 53300", err)
	}
	check("too many clients")
}

// TestUnsupportedProtocolFeatures answer errors, not crashes. (Over one shard these
// statements pass through: TestOneShardPassesThrough.)
func TestUnsupportedProtocolFeatures(t *testing.T) {
	e := startProxy(t, 2, []string{"t=id"}, nil)
	pc := e.pgconnect(t)
	ctx := context.Background()
	for _, q := range []string{"PREPARE p AS SELECT 1", "DECLARE c CURSOR FOR SELECT 1"} {
		if _, err := pc.Exec(ctx, q).ReadAll(); sqlState(err) != "0A000" {
			t.Errorf("%s: %v, want 0A000", q, err)
		}
	}
	if _, err := pc.Exec(ctx, "SELEC 1").ReadAll(); sqlState(err) != "42601" {
		t.Errorf("syntax error: %v, want 42601", err)
	}
	// An empty query gets EmptyQueryResponse, as from PostgreSQL itself.
	res, err := pc.Exec(ctx, " ;").ReadAll()
	direct, err2 := pgconn.Connect(ctx, e.dsns[0])
	if err2 != nil {
		t.Fatal(err2)
	}
	defer direct.Close(ctx)
	want, _ := direct.Exec(ctx, " ;").ReadAll()
	if err != nil || len(res) != len(want) {
		t.Errorf("empty query: %d results (%v), PostgreSQL gives %d", len(res), err, len(want))
	}
}

// TestProtocolNegotiation: a client asking for protocol 3.2 gets
// NegotiateProtocolVersion and is served in 3.0.
func TestProtocolNegotiation(t *testing.T) {
	e := startProxy(t, 1, nil, nil)
	nc, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	fe := pgproto3.NewFrontend(nc, nc)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion32,
		Parameters: map[string]string{"user": "postgres", "database": testDatabase, "_pq_.x": "1"}})
	fe.Flush()
	var seen []string
	for {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch m := msg.(type) {
		case *pgproto3.NegotiateProtocolVersion:
			if m.NewestMinorProtocol != 0 || !slices.Equal(m.UnrecognizedOptions, []string{"_pq_.x"}) {
				t.Errorf("negotiation %+v", m)
			}
			seen = append(seen, "v")
		case *pgproto3.BackendKeyData:
			seen = append(seen, "K")
		case *pgproto3.ParameterStatus:
			if m.Name == "server_version" {
				seen = append(seen, "S")
			}
		case *pgproto3.ErrorResponse:
			t.Fatalf("error %s: %s", m.Code, m.Message)
		}
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
	if !slices.Equal(seen, []string{"v", "S", "K"}) {
		t.Errorf("startup messages %v", seen)
	}
}

// kvKeysPerShard returns n ids of table kv (sharded by its int id over 2 shards) that
// land on each shard.
func kvKeysPerShard(t *testing.T, e *env, n int) [2][]int {
	t.Helper()
	rule := e.rules.Lookup("kv")
	var onShard [2][]int
	for id := 1; len(onShard[0]) < n || len(onShard[1]) < n; id++ {
		s, err := rule.ShardsFor(map[string]rules.Key{"id": rules.IntKey(int64(id))}, map[string]rules.KeyType{"id": rules.TypeInt4})
		if err != nil || len(s) != 1 {
			t.Fatal(s, err)
		}
		onShard[s[0]] = append(onShard[s[0]], id)
	}
	return onShard
}

// waitsUntil checks that the client whose result comes on done is still waiting after
// hold, then runs release (which should free what it waits for) and checks that it
// then finishes without error.
func waitsUntil(t *testing.T, done <-chan error, hold time.Duration, release func()) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("the waiting client finished before what it waits for was released: %v", err)
	case <-time.After(hold):
	}
	release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the waiting client, after the release: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting client never finished after the release")
	}
}

// TestCancelEndsPoolWait: a client waiting for a server connection, or for a turn to
// take one (--max-transactions), shows in SHOW POOLS as cl_waiting, and its cancel
// request ends the wait with 57014 at once; the client then goes on.
func TestCancelEndsPoolWait(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  option
	}{
		{"connection", withPool(1, 20*time.Second)},
		{"turn", func(c *proxy.Config) {
			c.Pool = backend.Options{Size: 2, CheckoutTimeout: 20 * time.Second}
			c.MaxTransactions = 1
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startProxy(t, 1, nil, nil, tc.opt, func(c *proxy.Config) { c.AdminDatabase = "shardlab" })
			ctx := context.Background()
			adm, err := pgconn.Connect(ctx, strings.Replace(e.url(""), "/"+testDatabase+"?", "/shardlab?", 1))
			if err != nil {
				t.Fatal(err)
			}
			defer adm.Close(ctx)
			a, b := e.connect(t), e.pgconnect(t)
			exec1(t, a, "BEGIN")
			exec1(t, a, "SELECT 1") // a holds the connection, and the turn
			done := make(chan error, 1)
			go func() {
				_, err := b.Exec(ctx, "SELECT 1").ReadAll()
				done <- err
			}()
			deadline := time.Now().Add(10 * time.Second)
			for clWaiting(t, adm) != 1 {
				if time.Now().After(deadline) {
					t.Fatal("SHOW POOLS never showed the waiting client")
				}
				time.Sleep(20 * time.Millisecond)
			}
			start := time.Now()
			cancelConn(t, e, b)
			select {
			case err := <-done:
				if sqlState(err) != "57014" {
					t.Fatalf("the cancelled wait ended with %v, want 57014", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the client still waits after its cancel request")
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the cancel took %v", d)
			}
			if n := clWaiting(t, adm); n != 0 {
				t.Errorf("SHOW POOLS: cl_waiting %d after the cancel, want 0", n)
			}
			exec1(t, a, "COMMIT")
			if _, err := b.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
				t.Errorf("after the cancel: %v", err)
			}
		})
	}
}

// clWaiting returns SHOW POOLS's cl_waiting for the first data source.
func clWaiting(t *testing.T, adm *pgconn.PgConn) int {
	t.Helper()
	res, err := adm.Exec(context.Background(), "SHOW POOLS").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range res[0].FieldDescriptions {
		if f.Name == "cl_waiting" {
			n, err := strconv.Atoi(string(res[0].Rows[0][i]))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("SHOW POOLS has no cl_waiting")
	return 0
}

// TestAutoMaxTransactions: by default (router.AutoMaxTransactions) a proxy with several
// pools in transaction pooling bounds the clients holding connections at one less than
// the pool size; with one pool, or in session pooling, it sets no bound.
func TestAutoMaxTransactions(t *testing.T) {
	auto := func(c *proxy.Config) { c.MaxTransactions = router.AutoMaxTransactions }
	for _, tc := range []struct {
		name   string
		shards int
		opts   []option
		want   int
	}{
		{"two pools", 2, []option{auto, withPool(5, time.Second)}, 4},
		{"one pool", 1, []option{auto, withPool(5, time.Second)}, 0},
		{"session pooling", 2, []option{auto, withPool(5, time.Second), withSessionPooling()}, 0},
		{"explicit", 2, []option{withPool(5, time.Second), func(c *proxy.Config) { c.MaxTransactions = 2 }}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startProxy(t, tc.shards, nil, nil, tc.opts...)
			if got := e.srv.Router().MaxTransactions(); got != tc.want {
				t.Errorf("MaxTransactions() = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestParseAnalysis: PostgreSQL analyses a statement at Parse, so a Parse alone (as
// libpq's PQprepare sends it, with Sync) of a statement naming a missing column or
// function, or a parameter whose type it cannot infer, fails there. Through the proxy,
// outside a transaction block, each answer is one database's, message by message,
// a table that does not exist included. (Not a Parse inside a transaction block, nor
// one that names tables no one data source holds: their errors come at Describe or
// Execute, see Session.analyse.)
func TestParseAnalysis(t *testing.T) {
	t.Run("table per data source", func(t *testing.T) {
		parseAnalysis(t, startProxy(t, 2, []string{"items=id"}, []string{"colours"}), true)
	})
	t.Run("tables split", func(t *testing.T) {
		r := shardedRules([]string{pgtest.NewDatabase(t, "parse_s0"), pgtest.NewDatabase(t, "parse_s1")}, nil, []string{"colours"})
		r.Tables = []rules.Table{{Name: "items", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2}}
		// The statements the servers analyse name the physical tables (items_0), whose
		// errors' positions differ: messages only.
		parseAnalysis(t, startProxyOn(t, r), false)
	})
	t.Run("tables split, coordinator", func(t *testing.T) {
		// An error where the data source that describes the statement holds every
		// table is one database's: the coordinator is not asked (up to this change
		// it was, and its error became 0A000).
		r := shardedRules([]string{pgtest.NewDatabase(t, "parsec_s0"), pgtest.NewDatabase(t, "parsec_s1")}, nil, []string{"colours"})
		r.Tables = []rules.Table{{Name: "items", Strategy: rules.Strategy{Column: "id"}, TablesPerDataSource: 2}}
		parseAnalysis(t, startProxyOn(t, r, withCoordinator()), false)
	})
}

func parseAnalysis(t *testing.T, e *env, positions bool) {
	c := e.connect(t)
	schema := []string{
		"CREATE TABLE items (id int PRIMARY KEY, name text)",
		"CREATE TABLE colours (id int PRIMARY KEY, name text)",
	}
	for _, sql := range schema {
		exec1(t, c, sql)
	}
	ctx := context.Background()
	one, err := pgconn.Connect(ctx, pgtest.NewDatabase(t, "parse_one"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { one.Close(context.Background()) })
	for _, sql := range schema {
		if _, err := one.Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		sql  string
		oids []uint32
	}{
		{"SELECT $1 IS NULL", nil},
		{"SELECT $1 IS NULL", []uint32{23}},
		{"SELECT nosuch FROM items", nil},
		{"SELECT name FROM items WHERE id = $1", nil},
		{"SELECT count(*) FROM items WHERE id = $1 AND $2 IS NULL", nil},
		{"SELECT i.name, c.name FROM items i JOIN colours c ON c.nosuch = i.id", nil},
		{"SELECT 'abc'::int FROM items", nil},
		{"SELECT id FROM items GROUP BY name", nil},
		{"INSERT INTO items VALUES ($1, $2)", nil},
		{"INSERT INTO items (id, nosuch) VALUES ($1, $2)", nil},
		{"UPDATE items SET nosuch = 1 WHERE id = $1", nil},
		{"DELETE FROM items WHERE nosuch = $1", nil},
		{"UPDATE colours SET name = $1 WHERE $2 IS NULL", nil},
		{"SELECT nosuch()", nil},
		{"SELECT * FROM nosuch", nil},
		{"SELECT i.name FROM items i JOIN nosuch n ON n.id = i.id WHERE i.id = $1", nil},
		{"INSERT INTO nosuch VALUES ($1)", nil},
		{"UPDATE items SET name = n.name FROM nosuch n WHERE items.id = n.id AND items.id = 1", nil},
		{"CREATE TABLE later (a nosuchtype)", nil},
		{"CREATE TABLE later (a int)", []uint32{0}},
		{"SET work_mem = '8MB'", []uint32{0}},
		{"SET work_mem = '8MB'", []uint32{25, 0}},
		{"SET work_mem = '8MB'", []uint32{23}},
		{"SELECT 1", []uint32{23, 0}},
		{"COMMIT", []uint32{0}},
		{"", []uint32{0}},
	}
	transcript := func(pc *pgconn.PgConn) []string {
		var out []string
		fe := pc.Frontend()
		for i, st := range steps {
			fe.SendParse(&pgproto3.Parse{Name: fmt.Sprintf("p%d", i), Query: st.sql, ParameterOIDs: st.oids})
			fe.SendSync(&pgproto3.Sync{})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			got := st.sql + ":"
			for {
				msg, err := pc.ReceiveMessage(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if m, ok := msg.(*pgproto3.ErrorResponse); ok {
					got += " E" + m.Code + " " + m.Message
					if positions {
						got += fmt.Sprintf(" (at %d)", m.Position)
					}
				} else if _, ok := msg.(*pgproto3.ParseComplete); ok {
					got += " parsed"
				} else if m, ok := msg.(*pgproto3.ReadyForQuery); ok {
					got += " ready " + string(m.TxStatus)
					break
				}
			}
			out = append(out, got)
		}
		return out
	}
	want, got := transcript(one), transcript(e.pgconnect(t))
	for i := range want {
		if i >= len(got) || got[i] != want[i] {
			t.Errorf("step %d:\n got  %q\n want %q", i+1, got[i], want[i])
		}
	}
}

// TestParseInTransaction: a Parse inside a transaction block leaves the transaction as
// PostgreSQL does. Here the statement names a table of the default data source beside
// a table sharded over the others, which no one data source can describe: up to d2e53e9
// the proxy described it at Parse, the failed description (42P01, let pass) aborted
// the transaction on the default data source unseen, and COMMIT lost the transaction's
// insert. With the coordinator, a Describe is made there (up to this change it failed
// the transaction on a shard first, and answered 25P02).
func TestParseInTransaction(t *testing.T) {
	for _, k := range []struct{ coordinate, describe bool }{{false, false}, {true, false}, {true, true}} {
		coordinate := k.coordinate
		t.Run(fmt.Sprintf("coordinator %v describe %v", coordinate, k.describe), func(t *testing.T) {
			var dsns []string
			for i := range 3 {
				dsns = append(dsns, pgtest.NewDatabase(t, fmt.Sprintf("parsetx_s%d", i)))
			}
			r := shardedRules(dsns, nil, nil)
			r.Tables = []rules.Table{{Name: "items", Strategy: rules.Strategy{Column: "id"}, DataSources: []string{"ds_1", "ds_2"}}}
			var opts []option
			if coordinate {
				opts = append(opts, withCoordinator())
			}
			e := startProxyOn(t, r, opts...)
			ctx := context.Background()
			one, err := pgconn.Connect(ctx, pgtest.NewDatabase(t, "parsetx_one"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { one.Close(context.Background()) })
			pc := e.pgconnect(t)
			schema := []string{"CREATE TABLE items (id int PRIMARY KEY, name text)", "CREATE TABLE colours (id int PRIMARY KEY, name text)"}
			for _, c := range []*pgconn.PgConn{one, pc} {
				for _, sql := range schema {
					if _, err := c.Exec(ctx, sql).ReadAll(); err != nil {
						t.Fatal(err)
					}
				}
			}
			transcript := func(pc *pgconn.PgConn) string {
				var out []string
				for _, sql := range []string{"BEGIN", "SELECT count(*) FROM colours"} {
					_, err := pc.Exec(ctx, sql).ReadAll()
					out = append(out, sql+": "+sqlState(err))
				}
				fe := pc.Frontend()
				fe.SendParse(&pgproto3.Parse{Name: "joined", Query: "SELECT i.name, c.name FROM items i JOIN colours c ON c.id = i.id WHERE i.id = 1"})
				if k.describe {
					fe.SendDescribe(&pgproto3.Describe{ObjectType: 'S', Name: "joined"})
				}
				fe.SendSync(&pgproto3.Sync{})
				if err := fe.Flush(); err != nil {
					t.Fatal(err)
				}
				for {
					msg, err := pc.ReceiveMessage(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if m, ok := msg.(*pgproto3.ErrorResponse); ok {
						out = append(out, "parse: "+m.Code)
					} else if _, ok := msg.(*pgproto3.ParseComplete); ok {
						out = append(out, "parsed")
					} else if m, ok := msg.(*pgproto3.ReadyForQuery); ok {
						out = append(out, "ready "+string(m.TxStatus))
						break
					} else if _, ok := msg.(*pgproto3.RowDescription); ok {
						out = append(out, "described")
					}
				}
				_, err := pc.Exec(ctx, "INSERT INTO colours VALUES (7, 'red')").ReadAll()
				out = append(out, "insert: "+sqlState(err))
				res, err := pc.Exec(ctx, "COMMIT").ReadAll()
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, "COMMIT: "+res[0].CommandTag.String())
				res, err = pc.Exec(ctx, "SELECT count(*) FROM colours").ReadAll()
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, "colours: "+string(res[0].Rows[0][0]))
				if err := pc.Deallocate(ctx, "joined"); err != nil {
					t.Fatal(err)
				}
				return strings.Join(out, "; ")
			}
			if want, got := transcript(one), transcript(pc); got != want {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		})
	}
}

// TestParseOverTablesNoOneSourceHolds: a Parse of a statement that names a missing
// table is one database's 42P01 (TestParseAnalysis), but only where the table is
// missing everywhere. Here items is sharded over ds_1 and ds_2 and colours lives on
// ds_0: a shard reports colours missing, which is no error of the statement. Its Parse
// succeeds; without the coordinator the Describe refuses with 0A000 (up to this change
// the shard's 42P01, which one database would not raise), with it the statement is
// described and answered. A table that exists nowhere fails the Parse, and a failed
// unnamed Parse leaves no unnamed statement (26000 at Describe), as in PostgreSQL.
func TestParseOverTablesNoOneSourceHolds(t *testing.T) {
	for _, coordinate := range []bool{false, true} {
		t.Run(fmt.Sprintf("coordinator %v", coordinate), func(t *testing.T) {
			var dsns []string
			for i := range 3 {
				dsns = append(dsns, pgtest.NewDatabase(t, fmt.Sprintf("parseheld_s%d", i)))
			}
			r := shardedRules(dsns, nil, nil)
			r.Tables = []rules.Table{{Name: "items", Strategy: rules.Strategy{Column: "id"}, DataSources: []string{"ds_1", "ds_2"}}}
			var opts []option
			if coordinate {
				opts = append(opts, withCoordinator())
			}
			e := startProxyOn(t, r, opts...)
			ctx := context.Background()
			pc := e.pgconnect(t)
			for _, sql := range []string{
				"CREATE TABLE items (id int PRIMARY KEY, name text)", "CREATE TABLE colours (id int PRIMARY KEY, name text)",
				"INSERT INTO items VALUES (1, 'a'), (2, 'b')", "INSERT INTO colours VALUES (1, 'red')",
			} {
				if _, err := pc.Exec(ctx, sql).ReadAll(); err != nil {
					t.Fatal(err)
				}
			}
			// Parse and Sync, then Describe and Sync, of the unnamed statement.
			steps := func(sql string) string {
				var out []string
				fe := pc.Frontend()
				for _, describe := range []bool{false, true} {
					if describe {
						fe.SendDescribe(&pgproto3.Describe{ObjectType: 'S'})
					} else {
						fe.SendParse(&pgproto3.Parse{Query: sql})
					}
					fe.SendSync(&pgproto3.Sync{})
					if err := fe.Flush(); err != nil {
						t.Fatal(err)
					}
					for {
						msg, err := pc.ReceiveMessage(ctx)
						if err != nil {
							t.Fatal(err)
						}
						switch m := msg.(type) {
						case *pgproto3.ErrorResponse:
							out = append(out, m.Code)
						case *pgproto3.ParseComplete:
							out = append(out, "parsed")
						case *pgproto3.RowDescription:
							out = append(out, "described")
						}
						if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
							break
						}
					}
				}
				return strings.Join(out, " ")
			}
			refusedOrDescribed := "parsed 0A000"
			if coordinate {
				refusedOrDescribed = "parsed described"
			}
			for _, c := range []struct{ sql, want string }{
				{"SELECT i.name, c.name FROM items i JOIN colours c ON c.id = i.id", refusedOrDescribed},
				{"SELECT i.name, c.name FROM items i JOIN colours c ON c.id = i.id WHERE i.id = $1", refusedOrDescribed},
				// Runs on a shard, which has no colours: refused, coordinator or not.
				{"SELECT 'colours'::regclass, name FROM items WHERE id = $1", "parsed 0A000"},
				{"SELECT i.name FROM items i JOIN nosuch n ON n.id = i.id WHERE i.id = $1", "42P01 26000"},
				{"SELECT name FROM items WHERE id = $1", "parsed described"},
				{"SELECT i.name FROM items i JOIN nosuch n ON n.id = i.id", "42P01 26000"},
			} {
				if got := steps(c.sql); got != c.want {
					t.Errorf("%s: got %q, want %q", c.sql, got, c.want)
				}
			}
			res := pc.ExecParams(ctx, "SELECT i.name, c.name FROM items i JOIN colours c ON c.id = i.id", nil, nil, nil, nil).Read()
			if coordinate && (res.Err != nil || len(res.Rows) != 1 || string(res.Rows[0][1]) != "red") {
				t.Fatalf("with the coordinator: %v %q", res.Err, res.Rows)
			}
		})
	}
}
