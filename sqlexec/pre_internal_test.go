package sqlexec

import (
	"errors"
	"testing"

	"github.com/shardlab/shardlab/sqlplan"
)

// TestColumnValuesRefuseOrderedAnswers: the first step of a correlated subquery is
// refused when the statement would add its column in an order-dependent way (float,
// money and interval sums overflow or round midway) or pick one of equal values that
// differ (max of numerics 1.0 and 1.00); otherwise each column becomes an array.
func TestColumnValuesRefuseOrderedAnswers(t *testing.T) {
	const int4, numeric, float8, money, interval, text = 23, 1700, 701, 790, 1186, 25
	rows := [][][]byte{{{0, 0, 0, 1}, []byte("a")}, {{0, 0, 0, 2}, nil}}
	for _, c := range []struct {
		summed, picked []int
		cols           []uint32
		refused        bool
	}{
		{summed: []int{0}, cols: []uint32{int4, text}},
		{summed: []int{0}, cols: []uint32{numeric, text}},
		{picked: []int{1}, cols: []uint32{int4, text}},
		{summed: []int{0}, cols: []uint32{float8, text}, refused: true},
		{summed: []int{0}, cols: []uint32{money, text}, refused: true},
		{summed: []int{0}, cols: []uint32{interval, text}, refused: true},
		{picked: []int{0}, cols: []uint32{numeric, text}, refused: true},
		{picked: []int{0}, cols: []uint32{float8, text}, refused: true},
		{cols: []uint32{16385, text}, refused: true}, // a type the database defines
	} {
		sub := sqlplan.Subquery{Kind: sqlplan.SubqueryColumns, Params: 2, Summed: c.summed, Picked: c.picked}
		values, oids, err := columnValues(sub, c.cols, rows)
		if c.refused {
			if !errors.Is(err, sqlplan.ErrUnsupported) {
				t.Errorf("%+v: %v, want a refusal", c, err)
			}
			continue
		}
		if err != nil || len(values) != 2 || len(oids) != 2 || oids[1] != 1009 {
			t.Errorf("%+v: %v %v %v", c, values, oids, err)
		}
	}
}
