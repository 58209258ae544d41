package routing_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/internal/pgtest"
	"github.com/shardlab/shardlab/routing"
)

// The golden file holds, for keys of every supported type, the partition PostgreSQL itself
// put each key in, in tables declared PARTITION BY HASH with moduli 2, 3, 4, 7 and 16.
// It is written only by PostgreSQL: `go test ./routing -run TestPGHashMatchesPostgres
// -update-pghash` (with SHARDLAB_PG_DSN set) rebuilds it from the server.
var updatePGHash = flag.Bool("update-pghash", false, "rewrite testdata/pghash_golden.tsv from PostgreSQL")

const pgHashGolden = "testdata/pghash_golden.tsv"

var pgHashModuli = []int{2, 3, 4, 7, 16}

// pgHashKeys are the keys the golden file covers, as PostgreSQL literals of each type.
func pgHashKeys() map[string][]string {
	ints := []string{"0", "1", "-1", "2", "42", "1000", "65535", "-65536", "2147483647", "-2147483648"}
	for i := 3; i < 60; i += 7 {
		ints = append(ints, strconv.Itoa(i*i*i))
	}
	bigs := append([]string{}, ints...)
	bigs = append(bigs, "2147483648", "-2147483649", "4294967296", "9223372036854775807",
		"-9223372036854775808", "1234567890123", "-987654321098765")
	texts := []string{"", "a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg", "abcdefgh", "abcdefghi",
		"abcdefghij", "abcdefghijk", "abcdefghijkl", "abcdefghijklm", "user1", "user42", "alice", "Bob",
		"Zürich", "日本語のキー", "emoji 🙂", "a much longer key that spans several twelve-byte blocks of lookup3"}
	uuids := []string{"00000000-0000-0000-0000-000000000000", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
		"123e4567-e89b-12d3-a456-426614174000", "ffffffff-ffff-ffff-ffff-ffffffffffff",
		"6ba7b810-9dad-11d1-80b4-00c04fd430c8"}
	return map[string][]string{"int4": ints, "int8": bigs, "text": texts, "uuid": uuids}
}

type pgHashRow struct {
	typ     string
	key     string
	modulus int
	part    int
}

// ourPartition is what package routing computes for a key given as a PostgreSQL literal.
func ourPartition(t *testing.T, typ, key string, modulus int) int {
	t.Helper()
	var h uint64
	switch typ {
	case "int4":
		v, err := strconv.ParseInt(key, 10, 32)
		if err != nil {
			t.Fatal(err)
		}
		h = routing.PGHashInt4(int32(v))
	case "int8":
		v, err := strconv.ParseInt(key, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		h = routing.PGHashInt8(v)
	case "text":
		h = routing.PGHashText(key)
	case "uuid":
		b, err := hex.DecodeString(strings.ReplaceAll(key, "-", ""))
		if err != nil || len(b) != 16 {
			t.Fatalf("bad uuid %q", key)
		}
		h = routing.PGHashUUID([16]byte(b))
	default:
		t.Fatalf("unknown type %q", typ)
	}
	return routing.PGPartition(h, modulus)
}

func readGolden(t *testing.T) []pgHashRow {
	t.Helper()
	f, err := os.Open(pgHashGolden)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []pgHashRow
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, "\t")
		if len(fields) != 4 {
			t.Fatalf("bad golden line %q", line)
		}
		key, err := strconv.Unquote(fields[1])
		if err != nil {
			t.Fatalf("bad key in %q: %v", line, err)
		}
		m, err1 := strconv.Atoi(fields[2])
		p, err2 := strconv.Atoi(fields[3])
		if err1 != nil || err2 != nil {
			t.Fatalf("bad numbers in %q", line)
		}
		rows = append(rows, pgHashRow{fields[0], key, m, p})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) < 100 {
		t.Fatalf("golden file has only %d rows", len(rows))
	}
	return rows
}

// TestPGHashGolden checks package routing against partitions PostgreSQL chose (the
// golden file); it needs no server.
func TestPGHashGolden(t *testing.T) {
	for _, r := range readGolden(t) {
		if got := ourPartition(t, r.typ, r.key, r.modulus); got != r.part {
			t.Errorf("%s %q modulus %d: routing says partition %d, PostgreSQL said %d", r.typ, r.key, r.modulus, got, r.part)
		}
	}
}

// TestPGHashMatchesPostgres asks a live PostgreSQL where it puts every key, in real
// hash-partitioned tables, and compares with package routing and with the golden file.
func TestPGHashMatchesPostgres(t *testing.T) {
	dsn := pgtest.NewDatabase(t, "pghash")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	keys := pgHashKeys()
	var live []pgHashRow
	for _, typ := range []string{"int4", "int8", "text", "uuid"} {
		for _, m := range pgHashModuli {
			parent := fmt.Sprintf("p_%s_%d", typ, m)
			if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (k %s) PARTITION BY HASH (k)", parent, typ)); err != nil {
				t.Fatal(err)
			}
			for r := range m {
				if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE TABLE %s_%d PARTITION OF %s FOR VALUES WITH (MODULUS %d, REMAINDER %d)",
					parent, r, parent, m, r)); err != nil {
					t.Fatal(err)
				}
			}
			for _, k := range keys[typ] {
				if _, err := conn.Exec(ctx, fmt.Sprintf("INSERT INTO %s VALUES ($1::text::%s)", parent, typ), k); err != nil {
					t.Fatalf("insert %s %q: %v", typ, k, err)
				}
			}
			rows, err := conn.Query(ctx, fmt.Sprintf("SELECT k::text, tableoid::regclass::text FROM %s", parent))
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var k, part string
				if err := rows.Scan(&k, &part); err != nil {
					t.Fatal(err)
				}
				p, err := strconv.Atoi(part[strings.LastIndexByte(part, '_')+1:])
				if err != nil {
					t.Fatalf("partition name %q: %v", part, err)
				}
				live = append(live, pgHashRow{typ, k, m, p})
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, r := range live {
		if got := ourPartition(t, r.typ, r.key, r.modulus); got != r.part {
			t.Errorf("%s %q modulus %d: routing says partition %d, PostgreSQL put it in %d", r.typ, r.key, r.modulus, got, r.part)
		}
	}
	if *updatePGHash {
		var b strings.Builder
		b.WriteString("# type\tkey (Go-quoted)\tmodulus\tpartition PostgreSQL chose (PARTITION BY HASH)\n")
		b.WriteString("# written by: go test ./routing -run TestPGHashMatchesPostgres -update-pghash\n")
		for _, r := range live {
			fmt.Fprintf(&b, "%s\t%s\t%d\t%d\n", r.typ, strconv.Quote(r.key), r.modulus, r.part)
		}
		if err := os.MkdirAll(filepath.Dir(pgHashGolden), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(pgHashGolden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	golden := map[pgHashRow]bool{}
	for _, r := range readGolden(t) {
		golden[r] = true
	}
	for _, r := range live {
		if !golden[r] {
			t.Errorf("PostgreSQL put %s %q (modulus %d) in partition %d, which the golden file does not say", r.typ, r.key, r.modulus, r.part)
		}
	}
}

func TestPGHashNullIsPartitionZero(t *testing.T) {
	for _, m := range pgHashModuli {
		if p := routing.PGPartition(routing.PGHashNull, m); p != 0 {
			t.Errorf("NULL key, modulus %d: partition %d, want 0", m, p)
		}
	}
}
