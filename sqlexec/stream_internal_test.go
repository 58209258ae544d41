package sqlexec

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/rules"
	"github.com/shardlab/shardlab/sqlplan"
)

// streamCase is a generated answer of several targets: rows of an int8 key and a text
// value, each target's sorted when sorted is set.
type streamCase struct {
	targets       [][][][]byte
	sorted, desc  bool
	offset, limit int64
	batch         int // rows per batch sent
}

func genStreamCase(r *rand.Rand) streamCase {
	c := streamCase{sorted: r.IntN(2) == 0, desc: r.IntN(2) == 0, offset: -1, limit: -1, batch: 1 + r.IntN(5)}
	for range 1 + r.IntN(4) {
		var rows [][][]byte
		for range r.IntN(12) {
			var key []byte
			if r.IntN(8) > 0 {
				key = []byte(strconv.Itoa(r.IntN(10) - 3))
			}
			rows = append(rows, [][]byte{key, []byte(fmt.Sprintf("v%d", r.IntN(1000)))})
		}
		c.targets = append(c.targets, rows)
	}
	if r.IntN(2) == 0 {
		c.offset = int64(r.IntN(6))
	}
	if r.IntN(2) == 0 {
		c.limit = int64(r.IntN(8))
	}
	if c.sorted {
		keys := []sortCol{{col: 0, desc: c.desc, nullsFirst: c.desc}}
		for i := range c.targets {
			sorted, err := sortRows(c.targets[i], keys, streamCols)
			if err != nil {
				panic(err)
			}
			c.targets[i] = sorted
		}
	}
	return c
}

var streamCols = []colType{{oid: 20}, {oid: 25}}

// run streams the case through the consumer side of a stream, each target fed by a
// goroutine in batches, and returns the rows handed out.
func (c streamCase) run(t *testing.T) [][][]byte {
	m := &sqlplan.MergeSpec{HasLimit: c.limit >= 0, HasOffset: c.offset >= 0}
	if c.sorted {
		m.OrderBy = []sqlplan.SortKey{{Column: 0, Desc: c.desc, NullsFirst: c.desc}}
	}
	fields := []pgconn.FieldDescription{{Name: "k", DataTypeOID: 20}, {Name: "v", DataTypeOID: 25}}
	return feedStream(t, m, fields, c.targets, c.offset, c.limit, c.batch)
}

// feedStream runs a merge over targets' rows (of the given columns) through the
// consumer side of a stream, each target fed by a goroutine in batches of batchSize
// rows, and returns the rows handed out.
func feedStream(t *testing.T, m *sqlplan.MergeSpec, fields []pgconn.FieldDescription, targets [][][][]byte, offset, limit int64, batchSize int) [][][]byte {
	t.Helper()
	rows, err := streamRows(m, fields, targets, offset, limit, batchSize, DefaultMaxHeld)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// streamRows is feedStream under an engine that holds at most maxHeld bytes of rows,
// returning the error that ended the answer.
func streamRows(m *sqlplan.MergeSpec, fields []pgconn.FieldDescription, targets [][][][]byte, offset, limit int64, batchSize int, maxHeld int64) ([][][]byte, error) {
	var dss []rules.DataSource
	for i := range targets {
		dss = append(dss, rules.DataSource{Name: fmt.Sprintf("ds_%d", i), DSN: "postgres://localhost/x"})
	}
	r, err := rules.Compile(rules.Rules{DataSources: dss})
	if err != nil {
		return nil, err
	}
	b := &sqlplan.Bound{Merge: m, Limit: limit, Offset: offset}
	for i := range targets {
		b.Targets = append(b.Targets, sqlplan.Target{DataSource: i})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := &stream{e: &Engine{rules: r, maxHeld: maxHeld}, b: b, cancel: cancel, errs: make([]error, len(targets)), left: limit, skip: max(offset, 0)}
	for i, rows := range targets {
		ch := make(chan batch, streamBatches)
		st.curs = append(st.curs, &cursor{target: i, ch: ch})
		go func() {
			defer close(ch)
			bt := batch{fields: fields}
			for _, row := range rows {
				bt.rows = append(bt.rows, row)
				if len(bt.rows) == batchSize {
					select {
					case ch <- bt:
					case <-ctx.Done():
						return
					}
					bt = batch{}
				}
			}
			bt.end = true
			select {
			case ch <- bt:
			case <-ctx.Done():
			}
		}()
	}
	whole, err := st.prime("", nil)
	if err != nil {
		return nil, err
	}
	if whole {
		return nil, errors.New("the merge asked for the whole answers")
	}
	var out [][][]byte
	for {
		row, ok, err := st.next()
		if err != nil {
			return out, err
		}
		if !ok {
			return out, nil
		}
		out = append(out, slices.Clone(row))
	}
}

// oracle concatenates every target's rows, then sorts (stably) and applies the offset
// and limit, as one database would.
func (c streamCase) oracle() [][][]byte {
	var all [][][]byte
	for _, rows := range c.targets {
		all = append(all, rows...)
	}
	if c.sorted {
		var err error
		if all, err = sortRows(all, []sortCol{{col: 0, desc: c.desc, nullsFirst: c.desc}}, streamCols); err != nil {
			panic(err)
		}
	}
	return offsetLimit(all, c.offset, c.limit)
}

func sameRows(a, b [][][]byte) bool {
	return slices.EqualFunc(a, b, func(x, y [][]byte) bool {
		return slices.EqualFunc(x, y, func(p, q []byte) bool { return (p == nil) == (q == nil) && string(p) == string(q) })
	})
}

// FuzzStreamMatchesOracle: the streamed concatenation and sort merge hand out the rows
// of "concatenate every target's rows, then evaluate", in the same order.
func FuzzStreamMatchesOracle(f *testing.F) {
	for seed := range uint64(200) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, seed uint64) {
		c := genStreamCase(rand.New(rand.NewPCG(seed, 7)))
		if got, want := c.run(t), c.oracle(); !sameRows(got, want) {
			t.Fatalf("case %+v:\nstreamed %q\nwant     %q", c, got, want)
		}
	})
}

// TestStreamReportsTheCause: the targets of a statement in a transaction run at once,
// and one that starts after another failed meets ErrTxAborted; the stream reports the
// failure that aborted the transaction, whichever target it reads first.
func TestStreamReportsTheCause(t *testing.T) {
	r, err := rules.Compile(rules.Rules{DataSources: []rules.DataSource{{Name: "ds_0", DSN: "postgres://localhost/x"}, {Name: "ds_1", DSN: "postgres://localhost/x"}}})
	if err != nil {
		t.Fatal(err)
	}
	b := &sqlplan.Bound{Targets: []sqlplan.Target{{DataSource: 0}, {DataSource: 1}}}
	_, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := &stream{e: &Engine{rules: r}, b: b, conns: inTransaction{}, cancel: cancel, errs: make([]error, 2), order: []int{0, 1}}
	cause := &pgconn.PgError{Severity: "ERROR", Code: "42P01", Message: `missing FROM-clause entry for table "o"`}
	errs := []error{ErrTxAborted, cause}
	for i := range 2 {
		ch := make(chan batch, streamBatches)
		st.curs = append(st.curs, &cursor{target: i, ch: ch})
		st.wg.Add(1)
		go func() {
			defer st.wg.Done()
			if i == 1 {
				time.Sleep(20 * time.Millisecond) // the cause comes after the first target ended
			}
			st.errs[i] = errs[i]
			close(ch)
		}()
	}
	_, err = st.prime("", nil)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42P01" {
		t.Errorf("the stream's error: %v, want the cause (42P01)", err)
	}
	st.wg.Wait()
}

// inTransaction stands for the connections of a caller inside a transaction (the only
// place ErrTxAborted comes from); the stream asks them nothing else here.
type inTransaction struct{ Conns }

func (inTransaction) InTransaction() bool { return true }
