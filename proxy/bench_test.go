package proxy_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
)

// The benchmarks below measure the proxy's own cost per statement on the passthrough
// path (one shard, no rules), as pgbench -S sees it: the client is a raw socket that
// writes prepared message bytes and skips the answer up to ReadyForQuery, so nearly
// every allocation reported is the proxy's (its client and server sides). The time per
// operation includes PostgreSQL's; compare allocations, and times only side by side.
//
//	go test ./proxy -run '^$' -bench Passthrough -benchmem

// rawClient is a client connection that speaks the protocol from prepared bytes.
type rawClient struct {
	conn net.Conn
	r    *bufio.Reader
}

// dialRaw logs in through pgconn, then takes the socket over.
func dialRaw(b *testing.B, e *env) *rawClient {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pg, err := pgconn.Connect(ctx, e.url(""))
	if err != nil {
		b.Fatal(err)
	}
	h, err := pg.Hijack()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Conn.Close() })
	return &rawClient{conn: h.Conn, r: bufio.NewReaderSize(h.Conn, 8192)}
}

// roundTrip sends msg and reads the answer up to ReadyForQuery, failing on an
// ErrorResponse.
func (c *rawClient) roundTrip(b *testing.B, msg []byte) {
	if _, err := c.conn.Write(msg); err != nil {
		b.Fatal(err)
	}
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
			b.Fatal(err)
		}
		n := int(binary.BigEndian.Uint32(hdr[1:])) - 4
		if hdr[0] == 'E' {
			body := make([]byte, n)
			io.ReadFull(c.r, body)
			b.Fatalf("server error: %q", body)
		}
		if _, err := c.r.Discard(n); err != nil {
			b.Fatal(err)
		}
		if hdr[0] == 'Z' {
			return
		}
	}
}

// message appends one protocol message: type byte, length, body.
func message(buf []byte, typ byte, body ...[]byte) []byte {
	n := 4
	for _, p := range body {
		n += len(p)
	}
	buf = append(buf, typ)
	buf = binary.BigEndian.AppendUint32(buf, uint32(n))
	for _, p := range body {
		buf = append(buf, p...)
	}
	return buf
}

func cstring(s string) []byte { return append([]byte(s), 0) }

// benchPassthrough starts a one-shard proxy with no rules over a table of 1000 rows.
func benchPassthrough(b *testing.B) *rawClient {
	e := startProxy(b, 1, nil, nil)
	c := e.connect(b)
	exec1(b, c, "CREATE TABLE bench (id int PRIMARY KEY, v int)")
	exec1(b, c, "INSERT INTO bench SELECT g, g * 10 FROM generate_series(1, 1000) g")
	return dialRaw(b, e)
}

// pointSelects returns simple-protocol point selects of every row of the bench table.
func pointSelects() [][]byte {
	msgs := make([][]byte, 1000)
	for i := range msgs {
		msgs[i] = message(nil, 'Q', cstring(fmt.Sprintf("SELECT v FROM bench WHERE id = %d", i+1)))
	}
	return msgs
}

func BenchmarkPassthroughSimple(b *testing.B) {
	c := benchPassthrough(b)
	msgs := pointSelects()
	c.roundTrip(b, msgs[0])
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.roundTrip(b, msgs[i%len(msgs)])
	}
}

func BenchmarkPassthroughExtended(b *testing.B) {
	c := benchPassthrough(b)
	parse := message(nil, 'P', cstring(""), cstring("SELECT v FROM bench WHERE id = $1"), []byte{0, 0})
	msgs := make([][]byte, 1000)
	for i := range msgs {
		arg := []byte(fmt.Sprint(i + 1))
		bind := message(nil, 'B', cstring(""), cstring(""), []byte{0, 0, 0, 1},
			binary.BigEndian.AppendUint32(nil, uint32(len(arg))), arg, []byte{0, 0})
		m := append(append([]byte{}, parse...), bind...)
		m = message(m, 'D', []byte{'P'}, cstring(""))
		m = message(m, 'E', cstring(""), []byte{0, 0, 0, 0})
		msgs[i] = message(m, 'S')
	}
	c.roundTrip(b, msgs[0])
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.roundTrip(b, msgs[i%len(msgs)])
	}
}

// BenchmarkPassthroughTransaction: BEGIN, a point select and COMMIT, each its own
// simple query, as pgbench's TPC-B script sends its statements.
func BenchmarkPassthroughTransaction(b *testing.B) {
	c := benchPassthrough(b)
	begin, commit := message(nil, 'Q', cstring("BEGIN")), message(nil, 'Q', cstring("COMMIT"))
	msgs := pointSelects()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.roundTrip(b, begin)
		c.roundTrip(b, msgs[i%len(msgs)])
		c.roundTrip(b, commit)
	}
}

// BenchmarkInsertKeys measures what drawing keys from the sequence costs (docs/
// sql-sharding.md, "Keys the application does not send"): one-row and ten-row INSERTs
// through a proxy over two databases, with the key given by the client and drawn.
func BenchmarkInsertKeys(b *testing.B) {
	e := startProxy(b, 2, []string{"kb_given=id", "kb_drawn=id"}, nil)
	c := e.connect(b)
	defer c.Close(context.Background())
	exec1(b, c, "CREATE TABLE kb_given (id bigint PRIMARY KEY, name text)")
	exec1(b, c, "CREATE TABLE kb_drawn (id bigserial PRIMARY KEY, name text)")
	next := int64(0)
	for _, rows := range []int{1, 10} {
		var given, drawn strings.Builder
		given.WriteString("INSERT INTO kb_given (id, name) VALUES ")
		drawn.WriteString("INSERT INTO kb_drawn (name) VALUES ")
		for r := range rows {
			if r > 0 {
				given.WriteString(", ")
				drawn.WriteString(", ")
			}
			fmt.Fprintf(&given, "($%d, 'x')", r+1)
			drawn.WriteString("('x')")
		}
		b.Run(fmt.Sprintf("given/rows=%d", rows), func(b *testing.B) {
			args := make([]any, rows)
			for i := 0; i < b.N; i++ {
				for r := range args {
					next++
					args[r] = next
				}
				if _, err := c.Exec(context.Background(), given.String(), args...); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("drawn/rows=%d", rows), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := c.Exec(context.Background(), drawn.String()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkInsertSelect copies 10,000 rows with one INSERT ... SELECT: through the proxy
// over 2 shards (the query's rows read into the proxy, then inserted in batches on the
// shards their keys name, in one transaction) against the same statement on one
// database. Each operation empties the target first (TRUNCATE, timed alike on both).
func BenchmarkInsertSelect(b *testing.B) {
	e := startProxy(b, 2, []string{"is_src=id", "is_dst=id"}, nil)
	ctx := context.Background()
	px := e.connect(b)
	one, err := pgx.Connect(ctx, pgtest.NewDatabase(b, "insel_one"))
	if err != nil {
		b.Fatal(err)
	}
	defer one.Close(ctx)
	for _, c := range []*pgx.Conn{px, one} {
		exec1(b, c, "CREATE TABLE is_src (id bigint PRIMARY KEY, grp int, name text)")
		exec1(b, c, "CREATE TABLE is_dst (id bigint PRIMARY KEY, grp int, name text)")
		exec1(b, c, "INSERT INTO is_src SELECT g, g % 10, 'name ' || g FROM generate_series(1, 10000) g")
	}
	for _, side := range []struct {
		name string
		c    *pgx.Conn
	}{{"proxy-2shards", px}, {"one-database", one}} {
		b.Run(side.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				exec1(b, side.c, "TRUNCATE is_dst")
				exec1(b, side.c, "INSERT INTO is_dst SELECT id, grp, name FROM is_src")
			}
			b.ReportMetric(float64(10000*b.N)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

// BenchmarkCoordinatedInTransaction: a statement only the coordinator answers, alone
// and inside a READ COMMITTED transaction block (BEGIN, the statement, COMMIT), where
// each data source in the transaction first says whether the coordinator may read
// (sqlexec.Session.CommittedReads): the difference is that check, the BEGIN it sends
// and the COMMIT of a transaction that holds a connection.
//
//	go test ./proxy -run '^$' -bench CoordinatedInTransaction -count 6
func BenchmarkCoordinatedInTransaction(b *testing.B) {
	e := startProxy(b, 2, []string{"co_t=id"}, nil, withCoordinator())
	c := e.connect(b)
	exec1(b, c, "CREATE TABLE co_t (id int PRIMARY KEY, grp int, note text)")
	exec1(b, c, "INSERT INTO co_t SELECT g, g % 10, 'n' || (g % 100) FROM generate_series(1, 2000) g")
	raw := dialRaw(b, e)
	coordinated := message(nil, 'Q', cstring("SELECT count(*) FROM co_t a JOIN co_t b ON b.note = a.note WHERE a.id <= 20"))
	begin, commit := message(nil, 'Q', cstring("BEGIN")), message(nil, 'Q', cstring("COMMIT"))
	raw.roundTrip(b, coordinated) // the coordinator database is built
	b.Run("alone", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			raw.roundTrip(b, coordinated)
		}
	})
	b.Run("in-transaction", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			raw.roundTrip(b, begin)
			raw.roundTrip(b, coordinated)
			raw.roundTrip(b, commit)
		}
	})
}
