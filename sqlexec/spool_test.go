package sqlexec_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/shardlab/shardlab/sqlexec"
)

// TestSpool: rows come back as appended (NULL apart from the empty value), from memory
// and past its share from a file, which Close removes; past the limit Append fails.
func TestSpool(t *testing.T) {
	files := func() int {
		m, _ := filepath.Glob(filepath.Join(os.TempDir(), "shardlab-spool-*"))
		return len(m)
	}
	before := files()
	s := sqlexec.NewSpool(64 << 20)
	big := bytes.Repeat([]byte("x"), 10<<10)
	var want [][][]byte
	for i := range 1000 { // 10 MB: past what stays in memory
		row := [][]byte{[]byte(fmt.Sprint(i)), nil, {}, big}
		want = append(want, row)
		if err := s.Append(row); err != nil {
			t.Fatal(err)
		}
	}
	if files() != before+1 {
		t.Errorf("%d spool files, want one more than %d", files(), before)
	}
	if s.Rows() != 1000 || s.Size() < 1000*(10<<10) {
		t.Errorf("%d rows, %d bytes", s.Rows(), s.Size())
	}
	var got [][][]byte
	for {
		rows, err := s.Next(300)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 {
			break
		}
		got = append(got, rows...)
	}
	if len(got) != len(want) {
		t.Fatalf("%d rows back, want %d", len(got), len(want))
	}
	for i := range want {
		if string(got[i][0]) != string(want[i][0]) || got[i][1] != nil || got[i][2] == nil || len(got[i][2]) != 0 || !bytes.Equal(got[i][3], big) {
			t.Fatalf("row %d: %q", i, got[i][:3])
		}
	}
	s.Close()
	if files() != before {
		t.Errorf("Close left %d spool files", files()-before)
	}

	small := sqlexec.NewSpool(100)
	defer small.Close()
	if err := small.Append([][]byte{make([]byte, 50)}); err != nil {
		t.Fatal(err)
	}
	if err := small.Append([][]byte{make([]byte, 50)}); !errors.Is(err, sqlexec.ErrSpoolFull) {
		t.Errorf("past the limit: %v", err)
	}
	if rows, err := small.Next(10); err != nil || len(rows) != 1 {
		t.Errorf("%d rows, %v", len(rows), err)
	}
}
