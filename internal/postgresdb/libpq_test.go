package postgresdb_test

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/internal/postgresdb"
)

// TestLibpqDSN: a DSN written for pgx becomes one libpq reads, with pgx's session
// settings in libpq's options, and nothing else changed; pgx reads the result as the
// same connection.
func TestLibpqDSN(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://u@h:5/db?sslmode=disable", "postgres://u@h:5/db?sslmode=disable"},
		{"postgres://u@h:5/db?sslmode=disable&search_path=s0", "postgres://u@h:5/db?sslmode=disable&options=-c%20search_path%3Ds0"},
		{"postgres://u@h/db?options=-c%20work_mem%3D8MB&search_path=s1&statement_cache_capacity=0",
			"postgres://u@h/db?options=-c%20work_mem%3D8MB%20-c%20search_path%3Ds1"},
		// Several hosts, a + in a password, a ; in a value: as written.
		{"postgres://u@h1:5432,h2/db?password=a+b&application_name=a;b&search_path=s0",
			"postgres://u@h1:5432,h2/db?password=a+b&application_name=a;b&options=-c%20search_path%3Ds0"},
		// A ? in the password, ssl=true as libpq reads it in a URL.
		{"postgres://u:pa?ss@h:5/db?ssl=true&search_path=s0", "postgres://u:pa?ss@h:5/db?ssl=true&options=-c%20search_path%3Ds0"},
		{"postgres://u:pa?ss@h:5/db", "postgres://u:pa?ss@h:5/db"},
		{"postgres://h/db", "postgres://h/db"},
		{"postgres://u@h/db?DateStyle=ISO,%20MDY", "postgres://u@h/db?options=-c%20DateStyle%3DISO%2C%5C%20MDY"},
		{"host=h port=5 dbname=db search_path=s0", "host='h' port='5' dbname='db' options='-c search_path=s0'"},
		{"host=h password='a b\\'c' DateStyle='ISO, MDY'", `host='h' password='a b\'c' options='-c DateStyle=ISO,\\ MDY'`},
		{"host=h options='-c x=1' default_query_exec_mode=simple_protocol database=db", "host='h' dbname='db' options='-c x=1'"},
		{"host=h x='a\nb'", "host='h' options='-c x=a\\\\\nb'"}, // a newline, escaped
	} {
		got, err := postgresdb.LibpqDSN(c.in)
		if err != nil || got != c.want {
			t.Errorf("postgresdb.LibpqDSN(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"host", "host=h port", "host='h", "host=h servicefile=/p service=s", "postgres://h/db?search_path=%zz"} {
		if got, err := postgresdb.LibpqDSN(bad); err == nil {
			t.Errorf("postgresdb.LibpqDSN(%q) = %q, want an error", bad, got)
		}
	}
}

// TestLibpqDSNWithPsql: psql connects with what LibpqDSN makes of a schema
// shard's DSN, and its session has the settings the DSN names (a value with a space
// included) (pg_dump and a
// subscription's CONNECTION take the same string).
func TestLibpqDSNWithPsql(t *testing.T) {
	dsn := pgtest.DSN(t)
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range []string{dsn + "&search_path=s0&DateStyle=ISO,%20MDY", "host=" + cfg.Host + " user=" + cfg.User + " dbname=" + cfg.Database +
		" port=" + strconv.Itoa(int(cfg.Port)) + " search_path=s0 DateStyle='ISO, MDY' sslmode=disable"} {
		info, err := postgresdb.LibpqDSN(in)
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.CommandContext(context.Background(), "psql", "-X", "-At", "-c", "SELECT current_setting('search_path') || '|' || current_setting('DateStyle')", info).CombinedOutput()
		if err != nil {
			t.Fatalf("psql %q: %v: %s", info, err, out)
		}
		if got := strings.TrimSpace(string(out)); got != "s0|ISO, MDY" {
			t.Errorf("psql %q: search_path and DateStyle %q, want s0|ISO, MDY", info, got)
		}
	}
}
