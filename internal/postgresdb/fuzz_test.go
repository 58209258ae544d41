package postgresdb_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/postgresdb"
)

var dsnSeeds = []string{
	"postgres://u:secret@h:5432/db?sslmode=disable",
	"postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write",
	"postgres://u@h/db?password=secret&dbname=other",
	"host=h port=5432 user=u password=secret dbname=db",
	"host=h password='it''s \\' secret' dbname='my db'",
	"user=u password=secret",
}

// FuzzWithDatabase checks that WithDatabase changes the database and nothing else, as
// pgx reads the result.
func FuzzWithDatabase(f *testing.F) {
	for _, s := range dsnSeeds {
		f.Add(s, "shardlab_shard_0")
	}
	f.Fuzz(func(t *testing.T, dsn, name string) {
		before, err := pgx.ParseConfig(dsn)
		if err != nil || name == "" || strings.ContainsRune(name, 0) {
			return
		}
		out, err := postgresdb.WithDatabase(dsn, name)
		if err != nil {
			return // a DSN pgx reads but net/url does not: refused, not mangled
		}
		after, err := pgx.ParseConfig(out)
		if err != nil {
			t.Fatalf("WithDatabase(%q, %q) = %q, which pgx cannot parse: %v", dsn, name, out, err)
		}
		if after.Database != name {
			t.Fatalf("WithDatabase(%q, %q) = %q names database %q", dsn, name, out, after.Database)
		}
		if after.Host != before.Host || after.Port != before.Port || after.User != before.User || after.Password != before.Password {
			t.Fatalf("WithDatabase(%q, %q) = %q changed the server or credentials", dsn, name, out)
		}
	})
}

// FuzzRedactDSN checks that a password pgx would send never survives redaction.
func FuzzRedactDSN(f *testing.F) {
	for _, s := range dsnSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dsn string) {
		out := postgresdb.RedactDSN(dsn)
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil || len(cfg.Password) < 4 || strings.Count(dsn, cfg.Password) != 1 {
			return // no password, or one too short or too common to look for
		}
		if strings.Contains(out, cfg.Password) {
			t.Fatalf("RedactDSN(%q) = %q still shows the password %q", dsn, out, cfg.Password)
		}
	})
}
