package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/lab/shardset/sqlite"
)

// otherProcessEnv names the file that the test binary reads when it runs as the other
// process of TestWALFileBelongsToOneProcess.
const otherProcessEnv = "SHARDLAB_SQLITE_OTHER_PROCESS_DB"

// TestMain runs the other process of TestWALFileBelongsToOneProcess when the environment
// asks for it, and the tests otherwise.
func TestMain(m *testing.M) {
	if path := os.Getenv(otherProcessEnv); path != "" {
		readAsOtherProcess(path)
		return
	}
	os.Exit(m.Run())
}

// readAsOtherProcess reads the file at path with the driver's defaults, as the sqlite3
// shell would, and prints the count of records or the error.
func readAsOtherProcess(path string) {
	db, err := sql.Open(sqlite.DriverName, "file:"+(&url.URL{Path: path}).EscapedPath()+"?_busy_timeout=200")
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM records`).Scan(&n); err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Println("count:", n)
}

// readFromOtherProcess runs readAsOtherProcess on path in a new process.
func readFromOtherProcess(t *testing.T, path string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), otherProcessEnv+"="+path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("other process: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "count:") || strings.HasPrefix(line, "error:") {
			return line
		}
	}
	t.Fatalf("other process printed no result:\n%s", out)
	return ""
}

// TestWALFileBelongsToOneProcess: a WAL store's file (unix-excl VFS) is shared by every
// connection of the process that opened it, a second Store on the same path included,
// and refused to other processes until the last connection closes; the naive variants
// keep the default VFS, which lets another process read.
func TestWALFileBelongsToOneProcess(t *testing.T) {
	ctx := context.Background()
	for _, v := range []struct {
		name      string
		opts      sqlite.Options
		exclusive bool
	}{
		{"wal", sqlite.Options{}, true},
		{"wal, one connection", sqlite.Options{OneConn: true}, false},
		{"rollback journal", sqlite.Options{Journal: sqlite.JournalDelete}, false},
	} {
		t.Run(v.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "shard.db")
			st, err := sqlite.Open(ctx, path, v.opts)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Put(ctx, "k", []byte("v")); err != nil {
				t.Fatal(err)
			}
			same, err := sqlite.Open(ctx, path, v.opts)
			if err != nil {
				t.Fatalf("a second Store on the file in the same process: %v", err)
			}
			if err := same.Put(ctx, "k2", []byte("v2")); err != nil {
				t.Fatal(err)
			}
			if got, err := st.Get(ctx, "k2"); err != nil || string(got) != "v2" {
				t.Errorf("Get of the other Store's write = %q, %v", got, err)
			}
			got := readFromOtherProcess(t, path)
			if v.exclusive && !strings.Contains(got, "locked") {
				t.Errorf("another process read the open file: %q, want database is locked", got)
			}
			if !v.exclusive && got != "count: 2" {
				t.Errorf("another process read %q, want count: 2", got)
			}
			for _, s := range []*sqlite.Store{same, st} {
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if got := readFromOtherProcess(t, path); got != "count: 2" {
				t.Errorf("after Close another process read %q, want count: 2", got)
			}
		})
	}
}
