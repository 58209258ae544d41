package coordinator

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestCarriedOptions: of a data source's options, the coordinator's sessions take the
// settings that shape how values are written (a time zone, a date style), leave out
// the search_path (the layout's), and name any other setting as one they cannot take.
func TestCarriedOptions(t *testing.T) {
	for _, c := range []struct{ in, kept, other string }{
		{"", "", ""},
		{"-c TimeZone=Asia/Kathmandu", "-c TimeZone=Asia/Kathmandu", ""},
		{"-cDateStyle=SQL,DMY --extra-float-digits=0", "-c DateStyle=SQL,DMY -c extra-float-digits=0", ""},
		{"-c search_path=s1 -c timezone=UTC", "-c timezone=UTC", ""},
		{"-c role=reader -c timezone=UTC", "-c timezone=UTC", "role"},
		{"-c default_transaction_read_only=on", "", "default_transaction_read_only"},
		{`-c DateStyle=ISO,\ DMY -c TimeZone=UTC`, `-c DateStyle=ISO,\ DMY -c TimeZone=UTC`, ""},
	} {
		kept, other := carriedOptions(c.in)
		if kept != c.kept || other != c.other {
			t.Errorf("carriedOptions(%q) = %q, %q; want %q, %q", c.in, kept, other, c.kept, c.other)
		}
	}
}

// TestWithDatabaseKeepsCarriedOptions: the coordinator database's connection string
// names it, drops the data source's search_path, and sends the carried options, in
// both forms of a connection string.
func TestWithDatabaseKeepsCarriedOptions(t *testing.T) {
	t.Setenv("PGOPTIONS", "-c search_path=s9 -c role=nobody")
	for _, c := range []struct{ dsn, database, options string }{
		{"postgres://u@h:5433/app?sslmode=disable&search_path=s1&options=-c%20TimeZone%3DUTC%20-c%20search_path%3Ds1", "app_coordinator", "-c TimeZone=UTC"},
		{"host=h port=5433 user=u dbname=app sslmode=disable search_path=s1 options='-c TimeZone=UTC -c search_path=s1'", "app_coordinator", "-c TimeZone=UTC"},
		// No query at all, and nothing carried: PGOPTIONS must not reach it either.
		{"postgres://u@h:5433/app", "app_coordinator", ""},
		// libpq's quoting: backslashes and quotes escaped by a backslash.
		{"host=h port=5433 user=u dbname=app", `app\x_o'coord`, `-c DateStyle=ISO,\ DMY`},
	} {
		out, err := withDatabase(c.dsn, c.database, c.options)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := pgconn.ParseConfig(out)
		if err != nil {
			t.Fatalf("%s: %v", out, err)
		}
		if cfg.Database != c.database || cfg.RuntimeParams["options"] != c.options || cfg.RuntimeParams["search_path"] != "public" {
			t.Errorf("withDatabase(%s) = %s: database %q, params %v; want %q, options %q", c.dsn, out, cfg.Database, cfg.RuntimeParams, c.database, c.options)
		}
	}
}
