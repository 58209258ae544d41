package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/shardlab/shardlab/internal/pgtest"
)

// TestTextKeysUnderAnotherClientEncoding: a client whose client_encoding is not the
// server's sends text keys in bytes the server converts and the proxy does not. A key
// outside ASCII then never places a row (INSERT and COPY are refused with 0A000, where
// they once put rows on the shard the client's bytes named, unreachable to everyone
// else), and reads and changes by such a key go to every shard, so they find the row.
// ASCII keys route as always.
func TestTextKeysUnderAnotherClientEncoding(t *testing.T) {
	e := startProxy(t, 2, []string{"city=name"}, nil)
	ctx := context.Background()
	utf8 := e.pgconnect(t)
	names := []string{"日本橋", "東京", "大阪", "京都", "名古屋", "札幌", "仙台", "福岡"}
	var values []string
	for _, n := range names {
		values = append(values, fmt.Sprintf("('%s', 0)", n))
	}
	for _, q := range []string{"CREATE TABLE city (name text PRIMARY KEY, visits int)", "INSERT INTO city VALUES " + strings.Join(values, ", ")} {
		if _, err := utf8.Exec(ctx, q).ReadAll(); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Shift JIS bytes of each name.
	sjis := map[string]string{"日本橋": "\x93\xfa\x96{\x8b\xb4", "東京": "\x93\x8c\x8b\x9e", "大阪": "\x91\xe5\x8d\xe3",
		"京都": "\x8b\x9e\x93s", "名古屋": "\x96\xbc\x8c\xc3\x89\xae", "札幌": "\x8eD\x96y", "仙台": "\x90\xe5\x91\xe4", "福岡": "\x95\x9f\x89\xaa"}
	c := e.pgconnect(t)
	if _, err := c.Exec(ctx, "SET client_encoding = 'SJIS'").ReadAll(); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		// Simple protocol: read and change by the key, in Shift JIS.
		res, err := c.Exec(ctx, "UPDATE city SET visits = visits + 1 WHERE name = '"+sjis[n]+"'").ReadAll()
		if err != nil || res[0].CommandTag.RowsAffected() != 1 {
			t.Errorf("UPDATE by %s in Shift JIS: %v %v, want 1 row", n, res, err)
		}
		// Extended protocol: the key as a text parameter.
		rr := c.ExecParams(ctx, "SELECT visits FROM city WHERE name = $1", [][]byte{[]byte(sjis[n])}, nil, nil, nil).Read()
		if rr.Err != nil || len(rr.Rows) != 1 || string(rr.Rows[0][0]) != "1" {
			t.Errorf("SELECT by %s as a Shift JIS parameter: %v %v, want one row with 1 visit", n, rr.Rows, rr.Err)
		}
	}
	// Placing a row by such a key is refused, in every form.
	for _, q := range []string{"INSERT INTO city VALUES ('" + sjis["東京"] + "x', 0)"} {
		if _, err := c.Exec(ctx, q).ReadAll(); sqlState(err) != "0A000" {
			t.Errorf("INSERT with a Shift JIS key: %v, want 0A000", err)
		}
	}
	rr := c.ExecParams(ctx, "INSERT INTO city VALUES ($1, 0)", [][]byte{[]byte(sjis["大阪"] + "x")}, nil, nil, nil).Read()
	if sqlState(rr.Err) != "0A000" {
		t.Errorf("INSERT with a Shift JIS key parameter: %v, want 0A000", rr.Err)
	}
	// COPY data in Shift JIS cannot be split by bytes (a character's second byte may
	// read as a backslash or a tab), whatever the key.
	if _, err := c.CopyFrom(ctx, strings.NewReader("Tokyo\t0\n"), "COPY city FROM STDIN"); sqlState(err) != "0A000" {
		t.Errorf("COPY under Shift JIS: %v, want 0A000", err)
	}
	// The proxy does not follow every way an encoding comes back (a savepoint rolled
	// back to): a session that chose another encoding keeps being taken at its word.
	back := e.pgconnect(t)
	for _, q := range []string{"SET client_encoding = 'SJIS'", "BEGIN", "SAVEPOINT s", "SET client_encoding = 'UTF8'", "ROLLBACK TO s"} {
		if _, err := back.Exec(ctx, q).ReadAll(); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if _, err := back.Exec(ctx, "INSERT INTO city VALUES ('"+sjis["仙台"]+"y', 0)").ReadAll(); sqlState(err) != "0A000" {
		t.Errorf("INSERT with a Shift JIS key after ROLLBACK TO brought Shift JIS back: %v, want 0A000", err)
	}
	back.Exec(ctx, "ROLLBACK").ReadAll()
	// ASCII keys route as always, whatever the encoding.
	if _, err := c.Exec(ctx, "INSERT INTO city VALUES ('Osaka', 5), ('Kyoto', 6)").ReadAll(); err != nil {
		t.Fatal(err)
	}
	for _, n := range append([]string{"Osaka", "Kyoto"}, names...) {
		rr := utf8.ExecParams(ctx, "SELECT count(*) FROM city WHERE name = $1", [][]byte{[]byte(n)}, nil, nil, nil).Read()
		if rr.Err != nil || string(rr.Rows[0][0]) != "1" {
			t.Errorf("%s read in UTF8: %v %v, want it found where its key routes", n, rr.Rows, rr.Err)
		}
	}
	var total int64
	for i := range 2 {
		total += queryInt(t, e.shard(t, i), "SELECT count(*) FROM city")
	}
	if total != int64(len(names)+2) {
		t.Errorf("%d rows on the shards, want %d", total, len(names)+2)
	}
}

// TestTextKeysOnLatin1Shards: on shards whose databases are LATIN1, a client whose
// client_encoding is LATIN1 too sends the server's own bytes, and its non-ASCII text
// keys route and place rows as any key does; a UTF-8 client's do not (the server
// converts them), and are refused for INSERT.
func TestTextKeysOnLatin1Shards(t *testing.T) {
	const opts = "ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
	dsns := []string{pgtest.NewDatabaseWithOptions(t, "latin_s0", opts), pgtest.NewDatabaseWithOptions(t, "latin_s1", opts)}
	e := startProxyOn(t, shardedRules(dsns, []string{"word=w"}, nil))
	ctx := context.Background()
	c := e.pgconnect(t)
	for _, q := range []string{"SET client_encoding = 'LATIN1'", "CREATE TABLE word (w text PRIMARY KEY)",
		"INSERT INTO word VALUES ('caf\xe9'), ('\xe9t\xe9'), ('na\xefve'), ('\xfcber'), ('gar\xe7on'), ('cr\xe8me')"} {
		if _, err := c.Exec(ctx, q).ReadAll(); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, w := range []string{"caf\xe9", "\xe9t\xe9", "na\xefve", "\xfcber", "gar\xe7on", "cr\xe8me"} {
		rr := c.ExecParams(ctx, "SELECT count(*) FROM word WHERE w = $1", [][]byte{[]byte(w)}, nil, nil, nil).Read()
		if rr.Err != nil || string(rr.Rows[0][0]) != "1" {
			t.Errorf("%q: %v %v, want it found", w, rr.Rows, rr.Err)
		}
	}
	u := e.pgconnect(t)
	if _, err := u.Exec(ctx, "SET client_encoding = 'UTF8'").ReadAll(); err != nil {
		t.Fatal(err)
	}
	if _, err := u.Exec(ctx, "INSERT INTO word VALUES ('déjà')").ReadAll(); sqlState(err) != "0A000" {
		t.Errorf("a UTF-8 client's non-ASCII key on LATIN1 shards: %v, want 0A000", err)
	}
}
