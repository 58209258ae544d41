package faultload_test

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/lab/faultload"
)

var t0 = time.Unix(1_800_000_000, 0)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// ev is a statement from ms to ms+lat on key (keys: even on shard 0, odd on shard 1).
func ev(ms, lat int, op faultload.Op, key int64, code, err string) faultload.Event {
	return faultload.Event{Start: at(ms), End: at(ms + lat), Op: op, Key: key, Code: code, Err: err}
}

func TestAnalyze(t *testing.T) {
	shardOf := func(k int64) int { return int(k % 2) }
	name := func(i int) string { return []string{"ds_0", "ds_1"}[i] }
	down := "shardlab: data source ds_1 is unavailable: timeout"
	events := []faultload.Event{
		// Before the fault: both shards at 2 ms.
		ev(0, 2, faultload.Read, 2, "", ""), ev(10, 2, faultload.Read, 3, "", ""), ev(20, 2, faultload.Write, 4, "", ""),
		// The fault on shard 1 from 100 to 1100 ms: shard 0 goes on at 3 ms, shard 1 fails
		// after 500 ms (the first ends at 600), then at once.
		ev(100, 500, faultload.Read, 5, "08006", down), ev(150, 3, faultload.Read, 6, "", ""),
		ev(700, 1, faultload.Write, 7, "08006", down), ev(800, 3, faultload.Write, 8, "", ""),
		ev(900, 1, faultload.Read, 9, "XX000", "something else"),
		// Sent to shard 1 just before the fault, caught by it: the fault's.
		ev(90, 700, faultload.Write, 21, "08006", down),
		// A pair touching shard 1 counts as the faulty shard's.
		{Start: at(950), End: at(951), Op: faultload.Pair, Key: 2, Key2: 11, Code: "08006", Err: down},
		// Healed at 1100: the first statement fails, the next succeeds at 1300 + 2.
		ev(1150, 5, faultload.Read, 13, "08006", down), ev(1300, 2, faultload.Read, 15, "", ""),
		ev(1400, 2, faultload.Read, 17, "", ""), ev(1500, 2, faultload.Read, 19, "", ""),
	}
	r := faultload.Analyze(events, []faultload.Window{{Kind: "partition", Shard: 1, Begin: at(100), Healed: at(1100)}}, shardOf, name)
	if len(r) != 1 {
		t.Fatalf("%d results, want 1", len(r))
	}
	got := r[0]
	if got.Baseline.N != 2 || got.Baseline.P50 != 2*time.Millisecond {
		t.Errorf("baseline %+v: want shard 0's two statements at 2 ms", got.Baseline)
	}
	if got.Others.N != 2 || got.Others.Errors != 0 || got.Others.P99 != 3*time.Millisecond {
		t.Errorf("others %+v: want two at 3 ms", got.Others)
	}
	if got.Faulty.N != 5 || got.Faulty.Errors != 5 {
		t.Errorf("faulty %+v: want 5 statements, 5 errors (one sent before the fault)", got.Faulty)
	}
	if got.Detect != 500*time.Millisecond || got.FailMax != 700*time.Millisecond {
		t.Errorf("detect %v, fail max %v: want 500ms and 700ms", got.Detect, got.FailMax)
	}
	if got.Recover != 202*time.Millisecond {
		t.Errorf("recover %v, want 202ms (from the healing to the end of the first success)", got.Recover)
	}
	if got.AfterRecovery.N != 2 || got.AfterRecovery.Errors != 0 {
		t.Errorf("after recovery %+v, want 2 statements, no error", got.AfterRecovery)
	}
	if got.Named != 4 {
		t.Errorf("named %d, want 4 (the XX000 does not name ds_1)", got.Named)
	}
	if len(got.Errors) != 2 || got.Errors[0].N != 4 || got.Errors[0].Code != "08006" || got.Errors[1].Code != "XX000" {
		t.Errorf("errors %+v", got.Errors)
	}
}

// TestAnalyzeOneWindowEach: a statement caught by one fault that ends during the next
// is the first fault's only.
func TestAnalyzeOneWindowEach(t *testing.T) {
	hang := faultload.Event{Start: at(1000), End: at(61000), Key: 1, Code: faultload.HangCode, Err: "no answer"}
	r := faultload.Analyze([]faultload.Event{hang}, []faultload.Window{
		{Kind: "a", Shard: 1, Begin: at(0), Healed: at(40000)},
		{Kind: "b", Shard: 1, Begin: at(55000), Healed: at(95000)},
	}, func(int64) int { return 1 }, func(int) string { return "ds_1" })
	if r[0].Hangs != 1 || r[0].Faulty.N != 1 {
		t.Errorf("first fault: %+v, want the hang", r[0])
	}
	if r[1].Hangs != 0 || r[1].Faulty.N != 0 || r[1].Detect != 0 {
		t.Errorf("second fault: %+v, want nothing of the first's", r[1])
	}
}

func TestNamesSource(t *testing.T) {
	for _, tt := range []struct {
		msg  string
		want bool
	}{
		{"data source ds_1 is unavailable", true},
		{"ds_1", true},
		{"data source ds_10 is unavailable", false},
		{"xds_1: down", false},
		{"ds_10 and then ds_1: both", true},
	} {
		ev := faultload.Event{Start: at(100), End: at(200), Key: 1, Code: "08006", Err: tt.msg}
		r := faultload.Analyze([]faultload.Event{ev}, []faultload.Window{{Shard: 1, Begin: at(50), Healed: at(300)}},
			func(int64) int { return 1 }, func(int) string { return "ds_1" })
		if got := r[0].Named == 1; got != tt.want {
			t.Errorf("%q names ds_1: %v, want %v", tt.msg, got, tt.want)
		}
	}
}

func TestCheck(t *testing.T) {
	events := []faultload.Event{
		{Op: faultload.Write, Key: 1, Worker: 0, Seq: 1},
		{Op: faultload.Write, Key: 2, Worker: 0, Seq: 2, Code: "08006", Err: "down"}, // not acknowledged: may be anywhere
		{Op: faultload.Pair, Key: 3, Key2: 4, Worker: 1, Seq: 1},
		{Op: faultload.Pair, Key: 5, Key2: 6, Worker: 1, Seq: 2, Code: "08006", Err: "down"},
		{Op: faultload.Pair, Key: 7, Key2: 8, Worker: 1, Seq: 3, Code: "08006", Err: "down"},
	}
	found := map[faultload.Ack]bool{
		{1, 0, 1}: true, {3, 1, 1}: true, // the pair (3, 4) lost its second row
		{5, 1, 2}: true, {6, 1, 2}: true, // an unknown pair, whole
		{7, 1, 3}: true, // an unknown pair, torn
	}
	lost, torn := faultload.Check(events, found)
	if !slices.Equal(lost, []faultload.Ack{{4, 1, 1}}) {
		t.Errorf("lost %v, want the pair's second row", lost)
	}
	if len(torn) != 1 || torn[0][0] != (faultload.Ack{7, 1, 3}) {
		t.Errorf("torn %v, want the pair (7, 8)", torn)
	}
}

func TestLogRoundTrip(t *testing.T) {
	e := faultload.Event{Start: at(1), End: at(3), Worker: 2, Op: faultload.Pair, Key: 4, Key2: 5, Seq: 6, Code: "08006", Err: `a "quoted", message`}
	var b bytes.Buffer
	l, err := faultload.NewLog(&b)
	if err != nil {
		t.Fatal(err)
	}
	l.Write(e)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	got, err := faultload.ReadLog(&b)
	if err != nil || len(got) != 1 || got[0] != e {
		t.Errorf("ReadLog = %+v, %v; want %+v", got, err, e)
	}
	if _, err := faultload.ReadLog(strings.NewReader("a,b\n")); err == nil {
		t.Errorf("ReadLog took a file without the header")
	}
}

// TestRun drives real traffic at one PostgreSQL database: every statement is logged,
// the writes land, and a statement slower than the bound is logged as a hang.
func TestRun(t *testing.T) {
	dsn := pgtest.NewDatabase(t, "faultload")
	ctx := context.Background()
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, faultload.CreateItems+"; "+faultload.CreateAcks+"; INSERT INTO fault_items (id) SELECT generate_series(1, 100)").ReadAll(); err != nil {
		t.Fatal(err)
	}
	var events []faultload.Event
	rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	err = faultload.Run(rctx, faultload.Traffic{DSN: dsn, Workers: 3, Keys: 100, Pairs: true, Bound: 5 * time.Second, Pace: time.Millisecond}, func(e faultload.Event) {
		events = append(events, e)
	})
	if err != nil {
		t.Fatal(err)
	}
	ops := map[faultload.Op]int{}
	for _, e := range events {
		ops[e.Op]++
		if !e.OK() {
			t.Errorf("event failed: %+v", e)
		}
	}
	if ops[faultload.Read] == 0 || ops[faultload.Write] == 0 || ops[faultload.Pair] == 0 {
		t.Fatalf("ops %v: want reads, writes and pairs", ops)
	}
	rows, err := conn.Exec(ctx, "SELECT id, worker, seq FROM fault_acks").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	found := map[faultload.Ack]bool{}
	for _, r := range rows[0].Rows {
		id, _ := strconv.ParseInt(string(r[0]), 10, 64)
		w, _ := strconv.Atoi(string(r[1]))
		seq, _ := strconv.ParseInt(string(r[2]), 10, 64)
		found[faultload.Ack{ID: id, Worker: w, Seq: seq}] = true
	}
	if lost, torn := faultload.Check(events, found); len(lost)+len(torn) > 0 || len(found) == 0 {
		t.Errorf("lost %v, torn %v of %d rows", lost, torn, len(found))
	}

	// Workers on one shard's keys each: worker 0 on 1-50, worker 1 on 51-100; a pair's
	// second key on the next shard.
	var low, high []int64
	for k := int64(1); k <= 100; k++ {
		if k <= 50 {
			low = append(low, k)
		} else {
			high = append(high, k)
		}
	}
	events = nil
	rctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	faultload.Run(rctx, faultload.Traffic{DSN: dsn, Workers: 2, Keys: 100, ByShard: [][]int64{low, high}, Pairs: true, Bound: 5 * time.Second, Pace: time.Millisecond},
		func(e faultload.Event) { events = append(events, e) })
	for _, e := range events {
		own, next := e.Key <= 50, e.Key2 <= 50
		if (e.Worker == 0) != own || (e.Op == faultload.Pair && next == own) {
			t.Errorf("worker %d sent %s on keys %d, %d", e.Worker, e.Op, e.Key, e.Key2)
		}
	}
	if len(events) < 4 {
		t.Errorf("%d events", len(events))
	}

	// A server that does not answer within the bound: a hang, and the worker goes on
	// with a new connection.
	if _, err := conn.Exec(ctx, "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(1); RETURN NEW; END $$;"+
		"CREATE TRIGGER slow BEFORE INSERT ON fault_acks FOR EACH ROW EXECUTE FUNCTION slow()").ReadAll(); err != nil {
		t.Fatal(err)
	}
	events = nil
	rctx, cancel = context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	faultload.Run(rctx, faultload.Traffic{DSN: dsn, Workers: 1, Keys: 100, Bound: 200 * time.Millisecond}, func(e faultload.Event) { events = append(events, e) })
	hangs, reads := 0, 0
	for _, e := range events {
		if e.Code == faultload.HangCode {
			hangs++
		}
		if e.Op == faultload.Read && e.OK() {
			reads++
		}
	}
	if hangs == 0 || reads < 2 {
		t.Errorf("%d hangs, %d reads after them: want both (events %+v)", hangs, reads, events)
	}
}
