package router

import (
	"testing"

	"github.com/shardlab/shardlab/proxy/copyin"
)

// FuzzAppendCopyText: a row written in COPY's text format reads back, with PostgreSQL's
// text format rules (package copyin), as the same values, NULL included, however
// many backslashes, tabs and line breaks they hold.
func FuzzAppendCopyText(f *testing.F) {
	f.Add("plain", "a\tb\\c\nd\re", false)
	f.Add(`\N`, "", true)
	f.Add(`\.`, `\\`, false)
	f.Fuzz(func(t *testing.T, a, b string, bNull bool) {
		row := [][]byte{[]byte(a), []byte(b)}
		if bNull {
			row[1] = nil
		}
		data := appendCopyText(nil, row)
		split := copyin.NewSplitter(copyin.Format{Delimiter: '\t', Null: `\N`}, []int{0, 1})
		var got []copyin.Field
		emit := func(r copyin.Row) error { got = append(got, r.Fields...); return nil }
		if err := split.Write(data, emit); err != nil {
			t.Fatalf("%q: %v", data, err)
		}
		if err := split.Close(emit); err != nil {
			t.Fatalf("%q: %v", data, err)
		}
		if len(got) != 2 || got[0].Null || got[0].Value != a || got[1].Null != bNull || (!bNull && got[1].Value != b) {
			t.Fatalf("%q %q (null %v) written as %q read back as %+v", a, b, bNull, data, got)
		}
	})
}
