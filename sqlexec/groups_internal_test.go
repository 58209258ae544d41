package sqlexec

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/sqlplan"
)

// groupCase is a generated grouping merge: raw rows (k, n) on each shard, which the
// shards aggregate by k (or not at all, or de-duplicate) and sort by the group as the
// planner asks them to.
type groupCase struct {
	raw              [][][2]*int64 // per target, rows of (k, n); nil is NULL
	mode             groupMode
	desc, nullsFirst bool // the group order on k
	order            int  // 0: no ORDER BY; 1: ORDER BY k as the groups; 2: ORDER BY count DESC, k
	offset, limit    int64
	batch            int
}

type groupMode int

const (
	groupByKey    groupMode = iota // SELECT k, count(*), sum(n), max(n) ... GROUP BY k
	groupPlain                     // SELECT count(*), sum(n), max(n)
	groupDistinct                  // SELECT DISTINCT k, n
)

func genGroupCase(r *rand.Rand) groupCase {
	c := groupCase{mode: groupMode(r.IntN(3)), desc: r.IntN(2) == 0, nullsFirst: r.IntN(2) == 0,
		order: r.IntN(3), offset: -1, limit: -1, batch: 1 + r.IntN(4)}
	if c.mode == groupPlain || c.mode == groupDistinct && c.order == 2 {
		c.order = min(c.order, 1)
	}
	val := func(lo, n int) *int64 {
		if r.IntN(6) == 0 {
			return nil
		}
		v := int64(lo + r.IntN(n))
		return &v
	}
	for range 1 + r.IntN(4) {
		var rows [][2]*int64
		for range r.IntN(15) {
			rows = append(rows, [2]*int64{val(-2, 7), val(-5, 26)})
		}
		c.raw = append(c.raw, rows)
	}
	if r.IntN(2) == 0 {
		c.offset = int64(r.IntN(5))
	}
	if r.IntN(2) == 0 {
		c.limit = int64(r.IntN(6))
	}
	return c
}

func text(v *int64) []byte {
	if v == nil {
		return nil
	}
	return strconv.AppendInt(nil, *v, 10)
}

// partials groups rows by k (every row one group when !byK): count, sum of n (NULL
// when no n), max of n, each group's rows in the order met.
func partials(rows [][2]*int64, byK bool) (keys []*int64, out [][][]byte) {
	type acc struct {
		k        *int64
		cnt      int64
		sum, max *int64
	}
	var accs []*acc
	index := map[string]*acc{}
	if !byK {
		a := &acc{}
		accs, index[""] = []*acc{a}, a
	}
	for _, row := range rows {
		key := ""
		if byK {
			key = string(text(row[0])) + "/" + strconv.FormatBool(row[0] == nil)
		}
		a := index[key]
		if a == nil {
			a = &acc{k: row[0]}
			index[key] = a
			accs = append(accs, a)
		}
		a.cnt++
		if n := row[1]; n != nil {
			if a.sum == nil {
				a.sum, a.max = new(int64), new(int64)
				*a.max = *n
			}
			*a.sum += *n
			*a.max = max(*a.max, *n)
		}
	}
	for _, a := range accs {
		keys = append(keys, a.k)
		out = append(out, [][]byte{strconv.AppendInt(nil, a.cnt, 10), text(a.sum), text(a.max)})
	}
	return keys, out
}

func distinctRows(rows [][2]*int64) [][][]byte {
	seen := map[string]bool{}
	var out [][][]byte
	for _, row := range rows {
		key := string(text(row[0])) + "/" + strconv.FormatBool(row[0] == nil) + "/" + string(text(row[1])) + "/" + strconv.FormatBool(row[1] == nil)
		if !seen[key] {
			seen[key] = true
			out = append(out, [][]byte{text(row[0]), text(row[1])})
		}
	}
	return out
}

var groupCols = map[groupMode][]colType{
	groupByKey:    {{oid: oidInt8}, {oid: oidInt8}, {oid: oidNumeric}, {oid: oidInt8}, {oid: oidInt8}},
	groupPlain:    {{oid: oidInt8}, {oid: oidNumeric}, {oid: oidInt8}},
	groupDistinct: {{oid: oidInt8}, {oid: oidInt8}},
}

// spec is the merge the planner makes for the case, and the shards' columns.
func (c groupCase) spec() (*sqlplan.MergeSpec, []pgconn.FieldDescription) {
	m := &sqlplan.MergeSpec{HasLimit: c.limit >= 0, HasOffset: c.offset >= 0, GroupOrdered: c.order != 2}
	kOrder := sqlplan.SortKey{Desc: c.desc, NullsFirst: c.nullsFirst}
	switch c.mode {
	case groupByKey:
		m.Aggregate, m.Outputs = true, 4
		m.Columns = []sqlplan.MergedColumn{{Kind: sqlplan.AggAny, Shard: 0}, {Kind: sqlplan.AggCount, Shard: 1},
			{Kind: sqlplan.AggSum, Shard: 2}, {Kind: sqlplan.AggMax, Shard: 3}, {Kind: sqlplan.AggGroupKey, Shard: 4}}
		g := kOrder
		g.Column = 4
		m.GroupOrder = []sqlplan.SortKey{g}
	case groupPlain:
		m.Aggregate, m.Outputs = true, 3
		m.Columns = []sqlplan.MergedColumn{{Kind: sqlplan.AggCount, Shard: 0}, {Kind: sqlplan.AggSum, Shard: 1}, {Kind: sqlplan.AggMax, Shard: 2}}
	case groupDistinct:
		m.Distinct = true
		m.GroupOrder = []sqlplan.SortKey{kOrder, {Column: 1}}
	}
	switch c.order {
	case 1:
		m.OrderBy = []sqlplan.SortKey{kOrder}
	case 2:
		m.OrderBy = []sqlplan.SortKey{{Column: 1, Desc: true, NullsFirst: true}, kOrder}
	}
	var fields []pgconn.FieldDescription
	for i, ct := range groupCols[c.mode] {
		fields = append(fields, pgconn.FieldDescription{Name: "c" + strconv.Itoa(i), DataTypeOID: ct.oid})
	}
	return m, fields
}

// sortInts sorts rows of integer text (or NULL) by keys, stably, as PostgreSQL orders
// bigint and numeric integers: written apart from the merge's own comparison, which it
// checks.
func sortInts(rows [][][]byte, keys []sqlplan.SortKey) {
	slices.SortStableFunc(rows, func(a, b [][]byte) int {
		for _, k := range keys {
			x, y := a[k.Column], b[k.Column]
			switch {
			case x == nil && y == nil:
				continue
			case x == nil || y == nil:
				if (x == nil) == k.NullsFirst {
					return -1
				}
				return 1
			}
			i, _ := strconv.ParseInt(string(x), 10, 64)
			j, _ := strconv.ParseInt(string(y), 10, 64)
			if i != j {
				if (i < j) != k.Desc {
					return -1
				}
				return 1
			}
		}
		return 0
	})
}

// shardRows is what each shard answers: its partial rows, sorted by the group order.
func (c groupCase) shardRows(m *sqlplan.MergeSpec) [][][][]byte {
	var out [][][][]byte
	for _, raw := range c.raw {
		var rows [][][]byte
		switch c.mode {
		case groupByKey:
			keys, parts := partials(raw, true)
			for i, p := range parts {
				rows = append(rows, append([][]byte{text(keys[i])}, append(p, text(keys[i]))...))
			}
		case groupPlain:
			_, rows = partials(raw, false)
		case groupDistinct:
			rows = distinctRows(raw)
		}
		sortInts(rows, m.GroupOrder)
		out = append(out, rows)
	}
	return out
}

// oracle evaluates the statement over every shard's raw rows concatenated, as one
// database would, in the order the merge promises (the client's, else the groups').
func (c groupCase) oracle(m *sqlplan.MergeSpec) [][][]byte {
	var all [][2]*int64
	for _, raw := range c.raw {
		all = append(all, raw...)
	}
	var rows [][][]byte
	switch c.mode {
	case groupByKey:
		keys, parts := partials(all, true)
		for i, p := range parts {
			rows = append(rows, append([][]byte{text(keys[i])}, p...))
		}
	case groupPlain:
		_, rows = partials(all, false)
	case groupDistinct:
		rows = distinctRows(all)
	}
	order := m.OrderBy
	if m.GroupOrdered {
		order = m.GroupOrder
		if c.mode == groupByKey {
			order = []sqlplan.SortKey{{Column: 0, Desc: c.desc, NullsFirst: c.nullsFirst}}
		}
	}
	sortInts(rows, order)
	return offsetLimit(rows, c.offset, c.limit)
}

// FuzzGroupStreamMatchesOracle: GROUP BY, plain aggregates and DISTINCT merged from the
// shards' sorted streams (one group held at a time, the groups sorted afterwards where
// the client's order is not theirs) hand out the rows of "concatenate every shard's
// rows, then evaluate", in the same order.
func FuzzGroupStreamMatchesOracle(f *testing.F) {
	for seed := range uint64(300) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, seed uint64) {
		c := genGroupCase(rand.New(rand.NewPCG(seed, 11)))
		m, fields := c.spec()
		got := feedStream(t, m, fields, c.shardRows(m), c.offset, c.limit, c.batch)
		if want := c.oracle(m); !sameRows(got, want) {
			t.Fatalf("case %+v\nmerge %s\nstreamed %q\nwant     %q", c, m, got, want)
		}
	})
}

// TestGroupStreamHoldsOneGroup: a GROUP BY merge of 3 shards with 30,000 groups holds
// one group at a time: the engine's bound on held rows (1 KiB here) is never reached,
// while gathering the groups for an ORDER BY over an aggregate is refused past it.
func TestGroupStreamHoldsOneGroup(t *testing.T) {
	c := groupCase{mode: groupByKey, offset: -1, limit: -1, batch: 64}
	for s := range 3 {
		var rows [][2]*int64
		for k := range int64(30000) {
			k, n := k, int64(s)
			rows = append(rows, [2]*int64{&k, &n})
		}
		c.raw = append(c.raw, rows)
	}
	m, fields := c.spec()
	got, err := streamRows(m, fields, c.shardRows(m), -1, -1, 64, 1<<10)
	if len(got) != 30000 || err != nil {
		t.Fatalf("streamed %d groups, %v; want 30000", len(got), err)
	}
	if !sameRows(got, c.oracle(m)) {
		t.Fatal("the streamed groups differ from the oracle's")
	}
	c.order = 2
	m, fields = c.spec()
	var pe *pgconn.PgError
	if got, err := streamRows(m, fields, c.shardRows(m), -1, -1, 64, 1<<10); !errors.As(err, &pe) || pe.Code != "54000" {
		t.Fatalf("groups gathered for ORDER BY count: %d rows, %v; want SQLSTATE 54000", len(got), err)
	}
}

// TestGroupStreamRefuses: a shard whose rows are not in the order the merge compares
// (sorted under a collation the merge could not tell) and a plain aggregate whose
// shard answers two rows are refused with 0A000, not merged into a wrong answer.
func TestGroupStreamRefuses(t *testing.T) {
	c := groupCase{mode: groupByKey, offset: -1, limit: -1, batch: 2}
	one, two := int64(1), int64(2)
	c.raw = [][][2]*int64{{{&one, &one}, {&two, &two}}, {{&one, &two}}}
	m, fields := c.spec()
	shards := c.shardRows(m)
	slices.Reverse(shards[0]) // 2 before 1: not the ascending order the merge expects
	var pe *pgconn.PgError
	if got, err := streamRows(m, fields, shards, -1, -1, 1, DefaultMaxHeld); !errors.As(err, &pe) || pe.Code != "0A000" {
		t.Errorf("a shard out of the merge's order: %q, %v; want SQLSTATE 0A000", got, err)
	}
	c = groupCase{mode: groupPlain, offset: -1, limit: -1, batch: 1, raw: [][][2]*int64{{{&one, &one}}, {{&two, &two}}}}
	m, fields = c.spec()
	shards = c.shardRows(m)
	shards[1] = append(shards[1], shards[1][0])
	if got, err := streamRows(m, fields, shards, -1, -1, 1, DefaultMaxHeld); !errors.As(err, &pe) || pe.Code != "0A000" {
		t.Errorf("a plain aggregate with two rows from a shard: %q, %v; want SQLSTATE 0A000", got, err)
	}
	if _, _, _, err := aggregate(m, []targetResult{{fields: fields, rows: shards[0]}, {fields: fields, rows: shards[1]}}, nil, false, nil); !errors.As(err, &pe) || pe.Code != "0A000" {
		t.Errorf("the same, merged whole: %v; want SQLSTATE 0A000", err)
	}
	// GROUP BY beside a set-returning function: a shard answers two rows for a group.
	c = groupCase{mode: groupByKey, offset: -1, limit: -1, batch: 1, raw: [][][2]*int64{{{&one, &one}}, {{&two, &two}}}}
	m, fields = c.spec()
	shards = c.shardRows(m)
	shards[0] = append(shards[0], shards[0][0])
	if got, err := streamRows(m, fields, shards, -1, -1, 1, DefaultMaxHeld); !errors.As(err, &pe) || pe.Code != "0A000" {
		t.Errorf("GROUP BY with two rows for a group from a shard: %q, %v; want SQLSTATE 0A000", got, err)
	}
	if _, _, _, err := aggregate(m, []targetResult{{fields: fields, rows: shards[0]}, {fields: fields, rows: shards[1]}}, nil, false, nil); !errors.As(err, &pe) || pe.Code != "0A000" {
		t.Errorf("the same, merged whole: %v; want SQLSTATE 0A000", err)
	}
}

// TestLateTimestampsOrder: timestamps up to PostgreSQL's last year (294276) compare in
// order; counted from 1970 in microseconds, those past 294246 wrapped around.
func TestLateTimestampsOrder(t *testing.T) {
	a, err := decode(oidTimestamptz, 0, []byte("2024-01-01 00:00:00+00"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := decode(oidTimestamptz, 0, []byte("294250-01-01 00:00:00+00"))
	if err != nil {
		t.Fatal(err)
	}
	if compare(a, b) >= 0 {
		t.Errorf("2024 compares %d to the year 294250, want -1", compare(a, b))
	}
}

func TestHeldErrorNamesTheBound(t *testing.T) {
	for limit, want := range map[int64]string{64 << 20: "64 MB", 1 << 20: "1 MB", 300 << 10: "300 kB", 1000: "1000 bytes"} {
		if msg := heldError(limit).Error(); !strings.Contains(msg, "more than "+want+" of rows") {
			t.Errorf("bound %d: %q, want it to name %s", limit, msg, want)
		}
	}
}
