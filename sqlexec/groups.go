package sqlexec

import (
	"container/heap"
	"slices"
	"unsafe"

	"github.com/shardlab/shardlab/sqlplan"
)

// Grouping merges, streamed. A merge that groups rows (aggregates with GROUP BY,
// SELECT DISTINCT) asks every shard to sort its rows by the group
// (sqlplan.MergeSpec.GroupOrder), and merges the shards' sorted streams: the rows of one
// group then arrive one after another, and the merge holds one group at a time beside a
// row per shard. A plain aggregate (no GROUP BY) is one group, its rows concatenated.
// Where the client's ORDER BY is not the groups' order, the merged groups are gathered
// (one row per group, under the engine's bound on what a statement holds) and sorted.
// Text is compared byte by byte, so a merge whose text sorts under a collation that
// does not compare bytes, or whose group key the merge cannot order, is merged from
// the shards' whole answers instead.

// hasGroupKeys reports whether an aggregating merge has GROUP BY keys.
func hasGroupKeys(m *sqlplan.MergeSpec) bool {
	for _, c := range m.Columns {
		if c.Kind == sqlplan.AggGroupKey {
			return true
		}
	}
	return false
}

// primeGroups prepares a grouping merge once the shards' columns (st.first) are known;
// whole reports that the answer must be merged from the shards' whole answers instead.
// coll and collErr are as for prime.
func (st *stream) primeGroups(coll string, collErr error) (whole bool, err error) {
	m := st.b.Merge
	for _, f := range st.first {
		st.cols = append(st.cols, colType{oid: f.DataTypeOID, format: f.Format})
	}
	text := textColumns(m, st.first)
	for _, k := range m.GroupOrder {
		if oid := st.cols[k.Column].oid; isTextual(oid) && oid != oidName {
			text = append(text, k.Column)
		}
	}
	if len(text) > 0 && (collErr != nil || coll != "") {
		return true, nil // the whole answers' merge ranks the text, or refuses
	}
	for _, k := range m.GroupOrder {
		if !comparable(st.cols[k.Column].oid) {
			return true, nil // equal by their bytes, in the whole answers' merge
		}
		st.keys = append(st.keys, sortCol{col: k.Column, desc: k.Desc, nullsFirst: k.NullsFirst})
	}
	st.mcols = st.cols
	if m.Aggregate {
		if st.agg, err = newAggregator(m, st.first, st.client, false, nil); err != nil {
			return false, err
		}
		st.fields, st.outputs, st.mcols = st.agg.out, len(st.agg.out), st.agg.cols
	}
	if len(m.OrderBy) > 0 && !m.GroupOrdered {
		for _, k := range m.OrderBy {
			c := m.SortColumn(k, len(st.mcols))
			if !comparable(st.mcols[c].oid) {
				return false, errNoOrder(st.mcols[c].oid)
			}
			st.final = append(st.final, sortCol{col: c, desc: k.Desc, nullsFirst: k.NullsFirst})
		}
	}
	return false, nil
}

// nextGroup returns the next merged row: a group's combination, or for DISTINCT the
// first of a set of equal rows. Where the client's order is not the groups', every
// group is gathered and sorted first.
func (st *stream) nextGroup() ([][]byte, bool, error) {
	if st.final == nil {
		return st.group()
	}
	if !st.sorting {
		st.sorting = true
		if err := st.gather(); err != nil {
			return nil, false, err
		}
	}
	if len(st.gathered) == 0 {
		return nil, false, nil
	}
	row := st.gathered[0]
	st.gathered[0], st.gathered = nil, st.gathered[1:]
	return row, true, nil
}

// group reads the rows of the next group, and returns its merged row.
func (st *stream) group() ([][]byte, bool, error) {
	first, key := st.pending, st.pendingKey
	st.pending, st.pendingKey = nil, nil
	if first == nil {
		if st.ended {
			return nil, false, nil
		}
		row, k, ok, err := st.source()
		if err != nil || !ok {
			st.ended = err == nil
			return nil, false, err
		}
		first, key = row, k
	}
	var g *group
	if st.agg != nil {
		g = st.agg.start(first)
		if err := st.agg.add(g, first); err != nil {
			return nil, false, err
		}
	}
	for {
		row, k, ok, err := st.source()
		if err != nil {
			return nil, false, err
		}
		if !ok {
			st.ended = true
			break
		}
		if cmpKeys(key, k, st.keys) != 0 {
			st.pending, st.pendingKey = row, k
			break
		}
		if st.agg != nil {
			if err := st.agg.add(g, row); err != nil {
				return nil, false, err
			}
		}
	}
	if st.agg == nil {
		return first, true, nil
	}
	if len(st.keys) == 0 {
		// A plain aggregate: one row from every target. More (a set-returning
		// function in its select list) would be groups the merge cannot tell apart.
		for _, c := range st.curs {
			if c.n != 1 {
				return nil, false, errPlainRows
			}
		}
	}
	return st.agg.finish(g), true, nil
}

// errPlainRows refuses an aggregate without GROUP BY whose shards answer other than
// one row each.
var errPlainRows = unsupported("an aggregate without GROUP BY whose shards answer several rows each (a set-returning function beside aggregates) across shards")

// errGroupRows refuses an aggregate whose shard answers two rows for one group.
var errGroupRows = unsupported("a set-returning function beside aggregates with GROUP BY across shards (a shard answered two rows for one group)")

// gather reads every group and sorts the merged rows by the client's order. Under a
// LIMIT it keeps only the rows of that order up to OFFSET + LIMIT, in a heap whose top
// is the last of them: a "top 10 by count" holds 10 rows whatever the groups' number.
// Rows kept are copied out of the batches they arrived in, so what the budget counts
// is what they hold.
func (st *stream) gather() error {
	held := st.e.budget()
	keep := int64(-1)
	if st.left >= 0 {
		keep = st.skip + st.left
	}
	h := &lastFirst{keys: st.final}
	for seq := 0; ; seq++ {
		row, ok, err := st.group()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if keep == 0 {
			continue
		}
		// The copy first: the key's text points into the row it is read from.
		row = cloneRow(row)
		key, err := decodeCols(row, st.final, st.mcols)
		if err != nil {
			return err
		}
		item := &keyedRow{row: row, key: key, stream: seq}
		if keep > 0 && int64(h.Len()) >= keep {
			if !h.before(item, h.items[0]) {
				continue
			}
			held.give(keptSize(h.items[0]))
			if !held.take(keptSize(item)) {
				return heldError(held.limit)
			}
			h.items[0] = item
			heap.Fix(h, 0)
			continue
		}
		if !held.take(keptSize(item)) {
			return heldError(held.limit)
		}
		heap.Push(h, item)
	}
	slices.SortFunc(h.items, func(a, b *keyedRow) int {
		if h.before(a, b) {
			return -1
		}
		return 1
	})
	st.gathered = make([][][]byte, len(h.items))
	for i, it := range h.items {
		st.gathered[i] = it.row
	}
	return nil
}

// keptSize is what a gathered row holds: its values, and beside them its sort key and
// its place in the heap (small rows hold more beside their values than in them).
func keptSize(it *keyedRow) int {
	return rowsSize([][][]byte{it.row}) + int(unsafe.Sizeof(*it)) + len(it.key)*int(unsafe.Sizeof(value{})) + 8
}

// lastFirst is a heap of merged rows whose top is the last in the client's order (ties
// broken by arrival, as a stable sort would).
type lastFirst struct {
	items []*keyedRow
	keys  []sortCol
}

// before reports whether a comes before b in the client's order.
func (h *lastFirst) before(a, b *keyedRow) bool {
	if c := cmpKeys(a.key, b.key, h.keys); c != 0 {
		return c < 0
	}
	return a.stream < b.stream
}

func (h *lastFirst) Len() int           { return len(h.items) }
func (h *lastFirst) Less(i, j int) bool { return h.before(h.items[j], h.items[i]) }
func (h *lastFirst) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *lastFirst) Push(x any)         { h.items = append(h.items, x.(*keyedRow)) }
func (h *lastFirst) Pop() any {
	x := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return x
}

// cloneRow copies a row's values into one allocation of its own.
func cloneRow(row [][]byte) [][]byte {
	n := 0
	for _, v := range row {
		n += len(v)
	}
	buf := make([]byte, 0, n)
	out := make([][]byte, len(row))
	for i, v := range row {
		if v != nil {
			start := len(buf)
			buf = append(buf, v...)
			out[i] = buf[start:len(buf):len(buf)]
		}
	}
	return out
}
