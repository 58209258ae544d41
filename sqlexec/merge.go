package sqlexec

import (
	"container/heap"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/sqlplan"
)

// merge combines the rows of several targets as b.Merge says.
func (e *Engine) merge(ctx context.Context, b *sqlplan.Bound, results []targetResult, client []int16, opts CombineOptions) (*Result, error) {
	m := b.Merge
	fields := results[0].fields
	for i, r := range results[1:] {
		if err := sameShape(fields, r.fields); err != nil {
			return nil, e.shardErr(b.Targets[i+1].DataSource, err)
		}
	}
	var (
		cols    []colType // the merged rows' column types
		outF    []pgconn.FieldDescription
		streams [][][][]byte // per target, rows (already sorted when not aggregating)
		ranks   map[int]map[string]int64
		err     error
	)
	if tc := textColumns(m, fields); len(tc) > 0 && !opts.TextByteOrder {
		if ranks, err = e.rankText(ctx, b, results, tc); err != nil {
			return nil, err
		}
	}
	if m.Aggregate {
		var rows [][][]byte
		rows, cols, outF, err = aggregate(m, results, client, opts.FloatAvg, ranks)
		if err != nil {
			return nil, err
		}
		streams = [][][][]byte{rows}
	} else {
		for _, f := range fields {
			cols = append(cols, colType{oid: f.DataTypeOID, format: f.Format})
		}
		outF = fields[:len(fields)-m.Hidden]
		for _, r := range results {
			streams = append(streams, r.rows)
		}
	}
	keys := make([]sortCol, len(m.OrderBy))
	for i, k := range m.OrderBy {
		nullsFirst := k.NullsFirst
		if opts.NullsSmallest && k.NullsDefault {
			nullsFirst = !k.Desc
		}
		keys[i] = sortCol{col: m.SortColumn(k, len(cols)), desc: k.Desc, nullsFirst: nullsFirst}
		shardCol := keys[i].col
		if m.Aggregate {
			shardCol = m.Columns[keys[i].col].Shard
		}
		keys[i].rank = ranks[shardCol]
		if !comparable(cols[keys[i].col].oid) {
			return nil, errNoOrder(cols[keys[i].col].oid)
		}
	}
	outputs := len(outF)

	var rows [][][]byte
	switch {
	case len(keys) > 0 && !m.Aggregate && !m.Distinct:
		rows, err = mergeSorted(streams, keys, cols, b.Offset, b.Limit)
	default:
		for _, s := range streams {
			rows = append(rows, s...)
		}
		if m.Distinct {
			if rows, err = distinct(rows, cols[:outputs]); err != nil {
				return nil, err
			}
		}
		if len(keys) > 0 {
			if rows, err = sortRows(rows, keys, cols); err != nil {
				return nil, err
			}
		}
		rows = offsetLimit(rows, b.Offset, b.Limit)
	}
	if err != nil {
		return nil, err
	}
	for i, r := range rows {
		rows[i] = r[:outputs]
	}
	return &Result{Fields: outF, Rows: rows, Tag: pgconn.NewCommandTag("SELECT " + strconv.Itoa(len(rows)))}, nil
}

func sameShape(a, b []pgconn.FieldDescription) error {
	if len(a) != len(b) {
		return fmt.Errorf("sqlexec: shards returned %d and %d columns; are their schemas the same?", len(a), len(b))
	}
	for i := range a {
		if a[i].DataTypeOID != b[i].DataTypeOID {
			return fmt.Errorf("sqlexec: column %s has type %d on one shard and %d on another; are their schemas the same?", a[i].Name, a[i].DataTypeOID, b[i].DataTypeOID)
		}
	}
	return nil
}

type colType struct {
	oid    uint32
	format int16
}

type sortCol struct {
	col              int
	desc, nullsFirst bool
	rank             map[string]int64 // text ranks, when text does not compare by bytes
}

// textColumns returns the shard columns whose text a merge compares: sort keys, and the
// inputs of min and max. The name type always compares by bytes and is left out.
func textColumns(m *sqlplan.MergeSpec, fields []pgconn.FieldDescription) []int {
	var out []int
	add := func(c int) {
		if oid := fields[c].DataTypeOID; isTextual(oid) && oid != oidName && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	if !m.Aggregate {
		for _, k := range m.OrderBy {
			add(m.SortColumn(k, len(fields)))
		}
		return out
	}
	for _, c := range m.Columns {
		if c.Kind == sqlplan.AggMin || c.Kind == sqlplan.AggMax {
			add(c.Shard)
		}
	}
	for _, k := range m.OrderBy {
		if c := m.Columns[k.Column]; c.Kind != sqlplan.AggCount && c.Kind != sqlplan.AggSum && c.Kind != sqlplan.AggAvg {
			add(c.Shard)
		}
	}
	return out
}

// rankText prepares the comparison of text that does not compare by its bytes: the
// server that would have compared it ranks every distinct value (dense_rank under the
// collation), and the merge compares ranks. It returns nil where bytes compare as the
// server does (C, POSIX, C.UTF-8), and refuses where the collation of a key cannot be
// told (a column with a collation of its own beside a default that is not byte order).
func (e *Engine) rankText(ctx context.Context, b *sqlplan.Bound, results []targetResult, cols []int) (map[int]map[string]int64, error) {
	coll, err := e.textCollation(ctx, b)
	if err != nil || coll == "" {
		return nil, err
	}
	ranks := map[int]map[string]int64{}
	ds := b.Targets[0].DataSource
	for _, c := range cols {
		seen := map[string]bool{}
		var vals []string
		for _, r := range results {
			for _, row := range r.rows {
				if v := row[c]; v != nil && !seen[string(v)] {
					seen[string(v)] = true
					vals = append(vals, string(v))
				}
			}
		}
		expr := "v"
		if results[0].fields[c].DataTypeOID == oidBpchar {
			expr = "rtrim(v, ' ')" // character(n) compares without its padding
		}
		q := "SELECT v, dense_rank() OVER (ORDER BY " + expr + " COLLATE " + pgx.Identifier{coll}.Sanitize() +
			") FROM unnest($1::text[]) AS u(v)"
		rank := make(map[string]int64, len(vals))
		err := withConn(ctx, e.catalog.pool, ds, func(conn *pgconn.PgConn) error {
			rr := conn.ExecParams(ctx, q, [][]byte{[]byte("{" + strings.Join(quoteArray(vals), ",") + "}")}, nil, nil, nil)
			for rr.NextRow() {
				n, err := strconv.ParseInt(string(rr.Values()[1]), 10, 64)
				if err != nil {
					return err
				}
				rank[string(rr.Values()[0])] = n
			}
			_, err := rr.Close()
			return err
		})
		if err != nil {
			return nil, e.shardErr(ds, err)
		}
		ranks[c] = rank
	}
	return ranks, nil
}

// textCollation returns the collation under which the text a merge compares must be
// ranked: "" where bytes compare as the server does. It refuses where the collation of
// a key cannot be told (see rankText).
func (e *Engine) textCollation(ctx context.Context, b *sqlplan.Bound) (string, error) {
	m := b.Merge
	switch {
	case m.Collation != "":
		if byteOrderCollation(m.Collation) {
			return "", nil
		}
		return m.Collation, nil
	case e.catalog == nil:
		return "", unsupported("comparing text across shards without a catalog to tell its collation")
	}
	dss := map[int]bool{}
	for _, t := range b.Targets {
		dss[t.DataSource] = true
	}
	allBytes := true
	for ds := range dss {
		byteOrder, uniform, name, err := e.catalog.TextOrder(ctx, ds, m.Tables)
		if err != nil {
			return "", e.shardErr(ds, err)
		}
		if !uniform {
			return "", unsupported("comparing text under collation %s across shards: columns with collations of their own are compared exactly only under byte-order collations (C, POSIX, C.UTF-8); add COLLATE to the sort key or pin one shard", name)
		}
		allBytes = allBytes && byteOrder
	}
	if allBytes {
		return "", nil
	}
	return "default", nil
}

// ranked replaces a text value by its rank, when the column is ranked.
func ranked(v value, raw []byte, rank map[string]int64) value {
	if rank == nil || v.null {
		return v
	}
	return value{kind: kInt, i: rank[string(raw)]}
}

// decodeCols decodes the given columns of a row (text by its rank where ranked).
func decodeCols(row [][]byte, keys []sortCol, cols []colType) ([]value, error) {
	out := make([]value, len(keys))
	for i, k := range keys {
		c := cols[k.col]
		v, err := decode(c.oid, c.format, row[k.col])
		if err != nil {
			return nil, err
		}
		out[i] = ranked(v, row[k.col], k.rank)
	}
	return out, nil
}

// less orders two rows' decoded keys.
func cmpKeys(a, b []value, keys []sortCol) int {
	for i, k := range keys {
		x, y := a[i], b[i]
		var c int
		switch {
		case x.null && y.null:
			c = 0
		case x.null:
			c = 1
			if k.nullsFirst {
				c = -1
			}
		case y.null:
			c = -1
			if k.nullsFirst {
				c = 1
			}
		default:
			c = compare(x, y)
			if k.desc {
				c = -c
			}
		}
		if c != 0 {
			return c
		}
	}
	return 0
}

type keyedRow struct {
	row    [][]byte
	key    []value
	stream int
	next   int
}

type rowHeap struct {
	items []*keyedRow
	keys  []sortCol
}

func (h *rowHeap) Len() int { return len(h.items) }
func (h *rowHeap) Less(i, j int) bool {
	c := cmpKeys(h.items[i].key, h.items[j].key, h.keys)
	if c != 0 {
		return c < 0
	}
	return h.items[i].stream < h.items[j].stream
}
func (h *rowHeap) Swap(i, j int) { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *rowHeap) Push(x any)    { h.items = append(h.items, x.(*keyedRow)) }
func (h *rowHeap) Pop() any {
	old := h.items
	x := old[len(old)-1]
	h.items = old[:len(old)-1]
	return x
}

// mergeSorted merges streams each already sorted by keys, skipping offset rows and
// stopping after limit (-1: none).
func mergeSorted(streams [][][][]byte, keys []sortCol, cols []colType, offset, limit int64) ([][][]byte, error) {
	h := &rowHeap{keys: keys}
	push := func(s, i int) error {
		if i >= len(streams[s]) {
			return nil
		}
		k, err := decodeCols(streams[s][i], keys, cols)
		if err != nil {
			return err
		}
		heap.Push(h, &keyedRow{row: streams[s][i], key: k, stream: s, next: i + 1})
		return nil
	}
	for s := range streams {
		if err := push(s, 0); err != nil {
			return nil, err
		}
	}
	var out [][][]byte
	skip := max(offset, 0)
	for h.Len() > 0 {
		if limit >= 0 && int64(len(out)) >= limit {
			break
		}
		top := heap.Pop(h).(*keyedRow)
		if skip > 0 {
			skip--
		} else {
			out = append(out, top.row)
		}
		if err := push(top.stream, top.next); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func sortRows(rows [][][]byte, keys []sortCol, cols []colType) ([][][]byte, error) {
	keyed := make([]keyedRow, len(rows))
	for i, r := range rows {
		k, err := decodeCols(r, keys, cols)
		if err != nil {
			return nil, err
		}
		keyed[i] = keyedRow{row: r, key: k}
	}
	sort.SliceStable(keyed, func(i, j int) bool { return cmpKeys(keyed[i].key, keyed[j].key, keys) < 0 })
	for i := range keyed {
		rows[i] = keyed[i].row
	}
	return rows, nil
}

func offsetLimit(rows [][][]byte, offset, limit int64) [][][]byte {
	if offset > 0 {
		if offset >= int64(len(rows)) {
			return nil
		}
		rows = rows[offset:]
	}
	if limit >= 0 && limit < int64(len(rows)) {
		rows = rows[:limit]
	}
	return rows
}

// rowKey appends the equality key of the first len(cols) columns of row.
func rowKey(dst []byte, row [][]byte, cols []colType, idx []int) ([]byte, error) {
	for _, i := range idx {
		c := cols[i]
		v, err := decode(c.oid, c.format, row[i])
		if err != nil {
			if !comparable(c.oid) {
				// A type the merge cannot read compares by its bytes, which is exact for
				// the output format of every deterministic type.
				if row[i] == nil {
					dst = append(dst, 0)
					continue
				}
				dst = append(dst, 2)
				dst = binary.BigEndian.AppendUint32(dst, uint32(len(row[i])))
				dst = append(dst, row[i]...)
				continue
			}
			return nil, err
		}
		dst = v.groupKey(dst)
	}
	return dst, nil
}

// distinct keeps the first row of each set of equal rows.
func distinct(rows [][][]byte, cols []colType) ([][][]byte, error) {
	idx := make([]int, len(cols))
	for i := range idx {
		idx[i] = i
	}
	seen := map[string]bool{}
	out := rows[:0]
	var buf []byte
	for _, r := range rows {
		var err error
		buf, err = rowKey(buf[:0], r, cols, idx)
		if err != nil {
			return nil, err
		}
		if seen[string(buf)] {
			continue
		}
		seen[string(buf)] = true
		out = append(out, r)
	}
	return out, nil
}

// aggregate groups the shards' partial rows and combines each group's columns. It
// returns the merged rows (one value per MergedColumn, outputs encoded in the client's
// formats), their column types, and the client's field descriptions.
func aggregate(m *sqlplan.MergeSpec, results []targetResult, client []int16, floatAvg bool, ranks map[int]map[string]int64) ([][][]byte, []colType, []pgconn.FieldDescription, error) {
	ag, err := newAggregator(m, results[0].fields, client, floatAvg, ranks)
	if err != nil {
		return nil, nil, nil, err
	}
	var groups []*group
	index := map[string]*group{}
	var buf []byte
	for i, r := range results {
		if len(ag.groupIdx) == 0 && len(r.rows) != 1 {
			return nil, nil, nil, errPlainRows
		}
		for _, row := range r.rows {
			buf, err = rowKey(buf[:0], row, ag.shardCols, ag.groupIdx)
			if err != nil {
				return nil, nil, nil, err
			}
			g := index[string(buf)]
			switch {
			case g == nil:
				g = ag.start(row)
				index[string(buf)] = g
				groups = append(groups, g)
			case g.from == i && len(ag.groupIdx) > 0:
				return nil, nil, nil, errGroupRows
			}
			g.from = i
			if err := ag.add(g, row); err != nil {
				return nil, nil, nil, err
			}
		}
	}
	rows := make([][][]byte, 0, len(groups))
	for _, g := range groups {
		rows = append(rows, ag.finish(g))
	}
	return rows, ag.cols, ag.out, nil
}

// aggregator combines the shards' partial rows of one group at a time (see aggregate).
type aggregator struct {
	m         *sqlplan.MergeSpec
	fields    []pgconn.FieldDescription // the shards' columns
	shardCols []colType
	cols      []colType                 // the merged columns
	out       []pgconn.FieldDescription // the client's columns
	groupIdx  []int                     // the group keys' shard columns
	floatAvg  bool
	ranks     map[int]map[string]int64
}

// group is what an aggregator holds of one group.
type group struct {
	vals   [][]byte  // per merged column: the winner (min/max) or first (any, group)
	cnt    []int64   // count sums; avg counts
	sums   []numeric // numeric sums (sum, avg)
	isum   []int64   // bigint sums
	hasSum []bool
	from   int // the last target that added a row (aggregate: one row per group from each)
}

// newAggregator checks that the shards' columns (fields) combine as m says, and
// prepares their combination.
func newAggregator(m *sqlplan.MergeSpec, fields []pgconn.FieldDescription, client []int16, floatAvg bool, ranks map[int]map[string]int64) (*aggregator, error) {
	ag := &aggregator{m: m, fields: fields, cols: make([]colType, len(m.Columns)), floatAvg: floatAvg, ranks: ranks}
	for j, c := range m.Columns {
		f := fields[c.Shard]
		ct := colType{oid: f.DataTypeOID, format: f.Format}
		if c.Kind == sqlplan.AggAvg {
			ct = colType{oid: oidNumeric, format: 0}
			if floatAvg {
				ct.oid = oidFloat8
			}
			if j < m.Outputs {
				ct.format = sqlplan.ClientFormat(client, j)
			}
		}
		ag.cols[j] = ct
		if c.Kind == sqlplan.AggGroupKey {
			ag.groupIdx = append(ag.groupIdx, c.Shard)
		}
		if j < m.Outputs {
			fd := f
			if c.Kind == sqlplan.AggAvg {
				fd = pgconn.FieldDescription{Name: c.Name, DataTypeOID: ct.oid, DataTypeSize: -1, TypeModifier: -1, Format: ct.format}
			}
			ag.out = append(ag.out, fd)
		}
		switch c.Kind {
		case sqlplan.AggSum, sqlplan.AggAvg:
			switch f.DataTypeOID {
			case oidInt8, oidNumeric, oidInt4, oidInt2:
			default:
				return nil, unsupported("%s() of type %s across shards: only integer and numeric sums add up exactly", c.Kind, typeName(f.DataTypeOID))
			}
		case sqlplan.AggMin, sqlplan.AggMax:
			if !comparable(f.DataTypeOID) {
				return nil, errNoOrder(f.DataTypeOID)
			}
		}
	}
	ag.shardCols = make([]colType, len(fields))
	for i, f := range fields {
		ag.shardCols[i] = colType{oid: f.DataTypeOID, format: f.Format}
	}
	return ag, nil
}

// start begins a group with its first row (which add must then be given too).
func (ag *aggregator) start(row [][]byte) *group {
	n := len(ag.m.Columns)
	g := &group{vals: make([][]byte, n), cnt: make([]int64, n), sums: make([]numeric, n), isum: make([]int64, n), hasSum: make([]bool, n)}
	for j, c := range ag.m.Columns {
		g.vals[j] = row[c.Shard]
	}
	return g
}

// add combines one shard's partial row into g.
func (ag *aggregator) add(g *group, row [][]byte) error {
	for j, c := range ag.m.Columns {
		f := ag.fields[c.Shard]
		raw := row[c.Shard]
		switch c.Kind {
		case sqlplan.AggCount:
			v, err := decode(f.DataTypeOID, f.Format, raw)
			if err != nil {
				return err
			}
			if g.cnt[j], err = addInt64(g.cnt[j], v.integer()); err != nil {
				return err
			}
		case sqlplan.AggSum, sqlplan.AggAvg:
			if raw == nil {
				break
			}
			v, err := decode(f.DataTypeOID, f.Format, raw)
			if err != nil {
				return err
			}
			if v.kind == kNumeric {
				if !g.hasSum[j] {
					g.sums[j] = v.n
				} else {
					g.sums[j] = addNumeric(g.sums[j], v.n)
				}
			} else if g.isum[j], err = addInt64(g.isum[j], v.i); err != nil {
				return err
			}
			g.hasSum[j] = true
			if c.Kind == sqlplan.AggAvg {
				cf := ag.fields[c.Count]
				cv, err := decode(cf.DataTypeOID, cf.Format, row[c.Count])
				if err != nil {
					return err
				}
				g.cnt[j] += cv.integer()
			}
		case sqlplan.AggMin, sqlplan.AggMax:
			if raw == nil {
				break
			}
			if g.vals[j] == nil {
				g.vals[j] = raw
				break
			}
			a, err := decode(f.DataTypeOID, f.Format, g.vals[j])
			if err != nil {
				return err
			}
			b, err := decode(f.DataTypeOID, f.Format, raw)
			if err != nil {
				return err
			}
			a, b = ranked(a, g.vals[j], ag.ranks[c.Shard]), ranked(b, raw, ag.ranks[c.Shard])
			if cmp := compare(b, a); (cmp < 0 && c.Kind == sqlplan.AggMin) || (cmp > 0 && c.Kind == sqlplan.AggMax) {
				g.vals[j] = raw
			}
		}
	}
	return nil
}

// finish is g's merged row: one value per merged column.
func (ag *aggregator) finish(g *group) [][]byte {
	row := make([][]byte, len(ag.m.Columns))
	for j, c := range ag.m.Columns {
		f := ag.fields[c.Shard]
		switch c.Kind {
		case sqlplan.AggCount:
			row[j] = encodeInt8(g.cnt[j], f.Format)
		case sqlplan.AggSum:
			switch {
			case !g.hasSum[j]:
				row[j] = nil
			case f.DataTypeOID == oidNumeric:
				row[j] = encodeNumeric(g.sums[j], f.Format)
			default:
				row[j] = encodeInt(g.isum[j], f.DataTypeOID, f.Format)
			}
		case sqlplan.AggAvg:
			if !g.hasSum[j] || g.cnt[j] == 0 {
				row[j] = nil
				break
			}
			if ag.floatAvg {
				var total float64
				if f.DataTypeOID == oidNumeric {
					r, _ := new(big.Rat).SetFrac(g.sums[j].int, pow10(g.sums[j].scale)).Float64()
					total = r
				} else {
					total = float64(g.isum[j])
				}
				row[j] = strconv.AppendFloat(nil, total/float64(g.cnt[j]), 'g', -1, 64)
				break
			}
			sum := g.sums[j]
			if f.DataTypeOID != oidNumeric {
				sum = numeric{int: big.NewInt(g.isum[j])}
			}
			row[j] = encodeNumeric(divNumeric(sum, numeric{int: big.NewInt(g.cnt[j])}), ag.cols[j].format)
		default:
			row[j] = g.vals[j]
		}
	}
	return row
}

func addInt64(a, b int64) (int64, error) {
	s := a + b
	if (b > 0 && s < a) || (b < 0 && s > a) {
		return 0, pgErr("22003", "bigint out of range")
	}
	return s, nil
}

func encodeInt8(v int64, format int16) []byte {
	if format == 1 {
		return binary.BigEndian.AppendUint64(nil, uint64(v))
	}
	return strconv.AppendInt(nil, v, 10)
}

func encodeInt(v int64, oid uint32, format int16) []byte {
	if format == 1 {
		switch oid {
		case oidInt2:
			if v < math.MinInt16 || v > math.MaxInt16 {
				break
			}
			return binary.BigEndian.AppendUint16(nil, uint16(v))
		case oidInt4:
			return binary.BigEndian.AppendUint32(nil, uint32(v))
		}
		return binary.BigEndian.AppendUint64(nil, uint64(v))
	}
	return strconv.AppendInt(nil, v, 10)
}

func encodeNumeric(n numeric, format int16) []byte {
	if format == 1 {
		return n.binary()
	}
	return []byte(n.text())
}
