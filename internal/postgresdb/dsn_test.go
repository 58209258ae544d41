package postgresdb_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/postgresdb"
)

func TestRedactDSN(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://u:secret@h:5432/db?sslmode=disable", "postgres://u:xxxxx@h:5432/db?sslmode=disable"},
		{"postgresql://u@h/db", "postgresql://u@h/db"},
		{"postgres://u@h/db?password=secret", "postgres://u@h/db?password=xxxxx"},
		{"postgres://u:secret@h1:5432,h2:5433/db", "postgres://u:xxxxx@h1:5432,h2:5433/db"},
		{"host=h password=secret dbname=db", "host=h password=xxxxx dbname=db"},
		{"host=h password = 'sec ret\\' x' dbname='my db'", "host=h password=xxxxx dbname='my db'"},
		{"host=h password='unterminated", "host=h password=xxxxx"},
		{"password=secret host=h sslpassword=other", "password=xxxxx host=h sslpassword=xxxxx"},
		{"postgres://u:sec%ZZret@h/db", "postgres://(unparsable DSN, redacted)"},
	} {
		if got := postgresdb.RedactDSN(c.in); got != c.want {
			t.Errorf("RedactDSN(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestWithDatabase(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://u:pw@h:5432/postgres?sslmode=disable", "postgres://u:pw@h:5432/shardlab_shard_3?sslmode=disable"},
		{"postgres://u@h", "postgres://u@h/shardlab_shard_3"},
		{"postgres://u@h/postgres?dbname=other&sslmode=disable", "postgres://u@h/shardlab_shard_3?sslmode=disable"},
		{"host=h dbname=postgres", "host='h' dbname='shardlab_shard_3'"},
		{"host=h database=postgres password='a \\'b' x=", "host='h' password='a \\'b' x='' dbname='shardlab_shard_3'"},
	} {
		got, err := postgresdb.WithDatabase(c.in, "shardlab_shard_3")
		if err != nil || got != c.want {
			t.Errorf("WithDatabase(%q) = %q, %v; want %q", c.in, got, err, c.want)
			continue
		}
		// What pgx makes of it is what matters.
		cfg, err := pgx.ParseConfig(got)
		if err != nil || cfg.Database != "shardlab_shard_3" {
			t.Errorf("pgx reads %q as database %q (%v)", got, cfg.Database, err)
		}
	}
	if _, err := postgresdb.WithDatabase("postgres://u@h/db", ""); !errors.Is(err, postgresdb.ErrBadDSN) {
		t.Errorf("WithDatabase(empty name) error = %v, want ErrBadDSN", err)
	}
}
