package sqlplan

import (
	"fmt"
	"strings"
)

// MergeSpec tells an executor how to combine the rows that several targets return for
// one SELECT into the answer one database would give. It is a small pipeline, each
// stage optional, in this order:
//
//	gather -> Aggregate (group and combine) -> Distinct -> Sort -> Offset/Limit -> project
//
// Without aggregation, the targets' rows are already sorted by OrderBy (each target ran
// the ORDER BY), so Sort is a merge of sorted streams.
type MergeSpec struct {
	// Aggregate is set when rows combine by group: Columns says how each merged column
	// comes from the shard columns, and the group is the set of GroupKey columns.
	Aggregate bool
	Columns   []MergedColumn
	// Outputs is the number of leading merged columns the client sees; the rest are
	// hidden (group keys and sort keys the client did not select). Without aggregation,
	// it is the shard's column count minus Hidden.
	Outputs int
	// Hidden is the number of trailing shard columns added for the merge (without
	// aggregation; with aggregation Columns says everything).
	Hidden int
	// Distinct removes duplicate output rows.
	Distinct bool
	// OrderBy is the sort order, over merged columns.
	OrderBy []SortKey
	// GroupOrder is, for a merge that groups rows (GROUP BY, or SELECT DISTINCT
	// without aggregates), the order the shards sort their rows in, over shard columns:
	// every group key (every column, for DISTINCT), NULLs where PostgreSQL puts them. Rows of
	// one group then arrive one after another, and the merge holds one group at a time.
	// Empty for a plain aggregate (one group) and where the shard's columns are not
	// known (SELECT DISTINCT *).
	GroupOrder []SortKey
	// GroupOrdered is set when the groups, merged in GroupOrder, are in the order the
	// client's ORDER BY asks (or it has none); otherwise the merge sorts them.
	GroupOrdered bool
	// HasLimit and HasOffset are set when the statement has LIMIT or OFFSET; Bound
	// carries their values.
	HasLimit, HasOffset bool
	// Tables are the logical tables the statement reads: their collations decide whether
	// text may be compared byte by byte.
	Tables []string
	// Collation is the collation named by a COLLATE clause in a sort key or aggregate
	// argument ("" when none).
	Collation string

	limit, offset *valueRef
	pushLimit     bool // targets run LIMIT offset+limit (a computed slot)
}

// ComparesValues reports whether the merge compares the shards' values (under a
// collation, for text): it sorts, meets groups in order, or keeps a least or greatest
// value.
func (m *MergeSpec) ComparesValues() bool {
	if len(m.OrderBy) > 0 || len(m.GroupOrder) > 0 {
		return true
	}
	for _, c := range m.Columns {
		if c.Kind == AggMin || c.Kind == AggMax {
			return true
		}
	}
	return false
}

// SortColumn returns the shard column a sort key reads, in rows of ncols columns.
// Without aggregation a select list with * has more columns than items: hidden sort
// columns are counted from the end, the client's from the front.
func (m *MergeSpec) SortColumn(k SortKey, ncols int) int {
	if k.hidden {
		return ncols - m.Hidden + k.Column
	}
	return k.Column
}

// AggKind is how a merged column combines the shards' values.
type AggKind int

// Aggregate kinds.
const (
	AggNone     AggKind = iota // not aggregating: the shard column as it is
	AggGroupKey                // part of the group key
	AggAny                     // the same in every row of a group (a group key the client selected, a constant)
	AggCount                   // sum of the shards' count, bigint
	AggSum                     // sum of the shards' sums (NULL when every shard's is NULL)
	AggMin                     // least of the shards' values
	AggMax                     // greatest
	AggAvg                     // sum of sums / sum of counts, as PostgreSQL's numeric division
)

var aggNames = [...]string{"column", "group key", "any", "count", "sum", "min", "max", "avg"}

func (k AggKind) String() string { return aggNames[k] }

// MergedColumn is one column of the merged rows.
type MergedColumn struct {
	Kind AggKind
	// Shard is the shard column it comes from (for AggAvg, the sum).
	Shard int
	// Count is, for AggAvg, the shard column holding the count.
	Count int
	// Name is the column name the client sees for AggAvg (the shards return sum and
	// count in its place); other kinds keep the shard's column description.
	Name string
}

// SortKey is one ORDER BY item over merged columns.
type SortKey struct {
	Column     int // merged column index (or shard column index when not aggregating)
	Desc       bool
	NullsFirst bool
	// NullsDefault is set when the statement did not say NULLS FIRST or LAST: NullsFirst
	// then holds PostgreSQL's default (NULLs sort as the largest value), which a
	// database with another default (SQLite: NULLs are the smallest) overrides.
	NullsDefault bool
	hidden       bool // Column counts the hidden columns (see SortColumn)
}

func (m *MergeSpec) String() string {
	var parts []string
	if m.Aggregate {
		var cols []string
		for _, c := range m.Columns {
			cols = append(cols, c.Kind.String())
		}
		parts = append(parts, "aggregate("+strings.Join(cols, ", ")+")")
	}
	if m.Distinct {
		parts = append(parts, "distinct")
	}
	keyList := func(keys []SortKey) string {
		var out []string
		for _, k := range keys {
			s := fmt.Sprintf("#%d", k.Column+1)
			if k.Desc {
				s += " desc"
			}
			if k.NullsFirst {
				s += " nulls first"
			}
			out = append(out, s)
		}
		return strings.Join(out, ", ")
	}
	if len(m.GroupOrder) > 0 {
		parts = append(parts, "groups merged in order("+keyList(m.GroupOrder)+")")
	}
	if len(m.OrderBy) > 0 {
		how := "merge-sort"
		if (m.Aggregate || m.Distinct) && !m.GroupOrdered {
			how = "sort"
		} else if m.Aggregate || m.Distinct {
			how = "in group order"
		}
		parts = append(parts, how+"("+keyList(m.OrderBy)+")")
	}
	if m.HasLimit || m.HasOffset {
		s := "limit"
		if m.pushLimit {
			s += " (offset+limit pushed to each shard)"
		}
		parts = append(parts, s)
	}
	if m.Hidden > 0 {
		parts = append(parts, fmt.Sprintf("%d hidden column(s)", m.Hidden))
	}
	if len(parts) == 0 {
		return "concatenate"
	}
	return strings.Join(parts, " -> ")
}

// ShardFormats returns the result formats to ask each shard for, given the client's
// (none: all text; one: for all columns; else one per column). Hidden columns and the
// sums and counts behind avg come as text: the merge reads them and the client never
// sees them.
func (m *MergeSpec) ShardFormats(client []int16) []int16 {
	if !m.Aggregate {
		if len(client) <= 1 {
			return client
		}
		return append(append([]int16(nil), client...), make([]int16, m.Hidden)...)
	}
	n := 0
	for _, c := range m.Columns {
		n = max(n, c.Shard+1, c.Count+1)
	}
	out := make([]int16, n)
	for j, c := range m.Columns {
		if j >= m.Outputs || c.Kind == AggAvg {
			continue
		}
		out[c.Shard] = ClientFormat(client, j)
	}
	return out
}

// ClientFormat returns the format the client asked for column i.
func ClientFormat(client []int16, i int) int16 {
	switch len(client) {
	case 0:
		return 0
	case 1:
		return client[0]
	}
	if i < len(client) {
		return client[i]
	}
	return 0
}
