package copyin_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/proxy/copyin"
)

type got struct {
	rows   []string // row bytes
	keys   []string // decoded field 0 of each data row ("<null>" for NULL)
	header []string
}

func split(t testing.TB, f copyin.Format, chunks []string, field int) (got, error) {
	t.Helper()
	var g got
	s := copyin.NewSplitter(f, []int{field})
	emit := func(r copyin.Row) error {
		if r.Header {
			g.header = append(g.header, string(r.Data))
			return nil
		}
		g.rows = append(g.rows, string(r.Data))
		k := r.Fields[0].Value
		if r.Fields[0].Null {
			k = "<null>"
		}
		g.keys = append(g.keys, k)
		return nil
	}
	for _, c := range chunks {
		if err := s.Write([]byte(c), emit); err != nil {
			return g, err
		}
	}
	return g, s.Close(emit)
}

func mustFormat(t *testing.T, opts ...copyin.Option) copyin.Format {
	t.Helper()
	f, err := copyin.ParseFormat(opts)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestSplitText(t *testing.T) {
	text := mustFormat(t)
	csv := mustFormat(t, copyin.Option{Name: "format", Value: "csv"})
	csvHeader := mustFormat(t, copyin.Option{Name: "format", Value: "csv"}, copyin.Option{Name: "header", Value: "true"})
	backslashEscape := mustFormat(t, copyin.Option{Name: "format", Value: "csv"}, copyin.Option{Name: "escape", Value: `\`})
	pipe := mustFormat(t, copyin.Option{Name: "delimiter", Value: "|"}, copyin.Option{Name: "null", Value: "nil"})
	for _, tt := range []struct {
		name   string
		f      copyin.Format
		data   string
		field  int
		keys   []string
		rows   int
		header int
	}{
		{"text", text, "1\ta\n2\tb\n", 0, []string{"1", "2"}, 2, 0},
		{"text second field", text, "1\ta\n2\tb\n", 1, []string{"a", "b"}, 2, 0},
		{"text null", text, "\\N\tx\n", 0, []string{"<null>"}, 1, 0},
		{"text escapes", text, "a\\tb\\\\c\\nd\\101\\x41\t1\n", 0, []string{"a\tb\\c\ndAA"}, 1, 0},
		{"text escaped delimiter", text, "a\\\tb\t1\n", 0, []string{"a\tb"}, 1, 0},
		{"text escaped newline stays in the row", text, "a\\\nb\t1\n", 0, []string{"a\nb"}, 1, 0},
		{"text crlf", text, "1\tx\r\n2\ty\r\n", 1, []string{"x", "y"}, 2, 0},
		{"text no final newline", text, "1\ta\n2\tb", 0, []string{"1", "2"}, 2, 0},
		{"text end marker", text, "1\ta\n\\.\n9\tz\n", 0, []string{"1"}, 1, 0},
		{"text custom delimiter and null", pipe, "nil|a\n3|b\n", 0, []string{"<null>", "3"}, 2, 0},
		{"csv", csv, "1,a\n2,b\n", 0, []string{"1", "2"}, 2, 0},
		{"csv quoted", csv, "\"1,0\",a\n\"x\"\"y\",b\n", 0, []string{"1,0", `x"y`}, 2, 0},
		{"csv newline in quotes", csv, "\"a\nb\",1\nc,2\n", 1, []string{"1", "2"}, 2, 0},
		{"csv null and empty quoted", csv, ",1\n\"\",2\n", 0, []string{"<null>", ""}, 2, 0},
		{"csv header", csvHeader, "id,name\n1,a\n", 0, []string{"1"}, 1, 1},
		{"csv backslash escape", backslashEscape, "\"a\\\"b\",1\n", 0, []string{`a"b`}, 1, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// Whole, and cut at every byte: the answer must not depend on the chunking.
			cuts := [][]string{{tt.data}}
			for i := 1; i < len(tt.data); i++ {
				cuts = append(cuts, []string{tt.data[:i], tt.data[i:]})
			}
			bytewise := []string{}
			for i := range len(tt.data) {
				bytewise = append(bytewise, tt.data[i:i+1])
			}
			cuts = append(cuts, bytewise)
			for _, chunks := range cuts {
				g, err := split(t, tt.f, chunks, tt.field)
				if err != nil {
					t.Fatalf("chunks %q: %v", chunks, err)
				}
				if fmt.Sprint(g.keys) != fmt.Sprint(tt.keys) || len(g.rows) != tt.rows || len(g.header) != tt.header {
					t.Fatalf("chunks %q: keys %q rows %d header %d, want %q %d %d", chunks, g.keys, len(g.rows), len(g.header), tt.keys, tt.rows, tt.header)
				}
				// Every byte before the end marker goes somewhere, unchanged.
				all := strings.Join(g.header, "") + strings.Join(g.rows, "")
				want := tt.data
				if i := strings.Index(want, "\\.\n"); i >= 0 {
					want = want[:i]
				}
				if all != want {
					t.Fatalf("chunks %q: rows rejoin to %q, want %q", chunks, all, want)
				}
			}
		})
	}
}

func TestSplitErrors(t *testing.T) {
	text := mustFormat(t)
	if _, err := split(t, text, []string{"1\n"}, 1); err == nil || !strings.Contains(err.Error(), "missing data") {
		t.Errorf("a row without the key column: err %v", err)
	}
	csv := mustFormat(t, copyin.Option{Name: "format", Value: "csv"})
	if _, err := split(t, csv, []string{"\"open,1"}, 0); err == nil {
		t.Error("an unterminated quote was accepted")
	}
	if _, err := copyin.ParseFormat([]copyin.Option{{Name: "format", Value: "binary"}}); !errors.Is(err, copyin.ErrFormat) {
		t.Errorf("binary: err %v, want ErrFormat", err)
	}
	if _, err := copyin.ParseFormat([]copyin.Option{{Name: "delimiter", Value: "ab"}}); !errors.Is(err, copyin.ErrFormat) {
		t.Errorf("two-byte delimiter: err %v, want ErrFormat", err)
	}
	// An error from emit stops the split.
	s := copyin.NewSplitter(text, []int{0})
	stop := errors.New("stop")
	n := 0
	err := s.Write([]byte("1\n2\n3\n"), func(copyin.Row) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 {
		t.Errorf("emit error: err %v after %d rows", err, n)
	}
}

// FuzzSplit checks that the splitter never panics and that its rows, whatever the
// chunking, rejoin to the data it was given.
func FuzzSplit(f *testing.F) {
	f.Add("1\ta\n2\tb\n", 3, false)
	f.Add("\"a\nb\",1\n\"x\"\"y\",2", 2, true)
	f.Add("a\\\tb\t1\n\\.\n", 1, false)
	f.Fuzz(func(t *testing.T, data string, cut int, csv bool) {
		var opts []copyin.Option
		if csv {
			opts = append(opts, copyin.Option{Name: "format", Value: "csv"})
		}
		format, err := copyin.ParseFormat(opts)
		if err != nil {
			t.Fatal(err)
		}
		var whole, parts []string
		collect := func(dst *[]string) func(copyin.Row) error {
			return func(r copyin.Row) error { *dst = append(*dst, string(r.Data)); return nil }
		}
		s := copyin.NewSplitter(format, []int{0, 1})
		errWhole := s.Write([]byte(data), collect(&whole))
		if errWhole == nil {
			errWhole = s.Close(collect(&whole))
		}
		if cut < 0 {
			cut = -cut
		}
		if len(data) > 0 {
			cut %= len(data) + 1
		} else {
			cut = 0
		}
		s = copyin.NewSplitter(format, []int{0, 1})
		errParts := s.Write([]byte(data[:cut]), collect(&parts))
		if errParts == nil {
			errParts = s.Write([]byte(data[cut:]), collect(&parts))
		}
		if errParts == nil {
			errParts = s.Close(collect(&parts))
		}
		if (errWhole == nil) != (errParts == nil) {
			t.Fatalf("whole: %v, in two parts: %v", errWhole, errParts)
		}
		if errWhole == nil && strings.Join(whole, "|") != strings.Join(parts, "|") {
			t.Fatalf("rows differ by chunking: %q vs %q", whole, parts)
		}
	})
}
