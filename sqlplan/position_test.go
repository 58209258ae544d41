package sqlplan_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/shardlab/shardlab/sqlplan"
)

// charPos is the 1-based character position of the n-th (0-based) occurrence of word
// in s, as PostgreSQL reports an error's position.
func charPos(t testing.TB, s, word string, n int) int {
	t.Helper()
	at := -1
	for from := 0; n >= 0; n-- {
		i := strings.Index(s[from:], word)
		if i < 0 {
			t.Fatalf("%q has no occurrence %d of %q", s, n, word)
		}
		at = from + i
		from = at + len(word)
	}
	return utf8.RuneCountInString(s[:at]) + 1
}

// TestClientPosition: a server's error position in a statement the plan rewrote is
// turned into the same token's position in the client's text, or into none (0) where
// the rewrite leaves it unclear; never under another word.
func TestClientPosition(t *testing.T) {
	for _, tc := range []struct {
		name, sent, client, word string
		n                        int    // which occurrence of word in sent the server points at
		want                     string // the word the client's position must point at ("": no position)
		wantN                    int    // which occurrence of want in client
	}{
		{name: "deparsed, renamed", sent: "SELECT name, nosuch FROM t_order_1 t_order WHERE order_id = 1",
			client: "select   name,    nosuch   from   t_order  where order_id = 1;", word: "nosuch", want: "nosuch"},
		{name: "same text", sent: "select  x from t", client: "select  x from t", word: "x", want: "x"},
		{name: "quoted in the client", sent: `SELECT nosuch FROM t_1 t`, client: `select "nosuch" from t`, word: "nosuch", want: `"nosuch"`},
		{name: "case", sent: `SELECT NoSuch FROM t_1 t`, client: `select NOSUCH from t`, word: "NoSuch", want: "NOSUCH"},
		{name: "multibyte before", sent: "SELECT 'é', nosuch FROM t_1 t", client: "select 'é',\n  nosuch from t", word: "nosuch", want: "nosuch"},
		{name: "inside a literal", sent: "SELECT 1 + 'xyz'::int FROM t_1 t", client: "select 1 +  'xyz'::int from t", word: "yz", want: "yz"},
		{name: "second of two", sent: "SELECT a FROM t_1 t WHERE a = 1 AND b = 1", client: "select a from t where a=1 and b=1", word: "b", want: "b"},
		{name: "a column the merge added", sent: "SELECT a, x FROM t_1 t ORDER BY x", client: "select a from t order by x", word: "x", want: ""},
		{name: "reordered repeats", sent: "SELECT a FROM t_1 t LIMIT 1 OFFSET 1", client: "select a from t offset 1 limit 1", word: "1", want: ""},
		// One neighbour alike is not enough: the end of the text follows both.
		{name: "reordered repeats, one neighbour alike", sent: "SELECT v FROM items_0 items WHERE id = 1 LIMIT 'x' OFFSET 'x'",
			client: "select v from items where id = 1 offset 'x' limit 'x'", word: "'x'", n: 1, want: ""},
		{name: "the same operator spelled otherwise", sent: "SELECT v FROM t_1 t WHERE w <> 1", client: "select v from t where w != 1", word: "<>", want: "!="},
		{name: "a renamed table", sent: "SELECT a FROM t_order_1 t_order", client: "select a from t_order", word: "t_order_1", want: ""},
		{name: "end of input", sent: "SELECT a FROM t_1 t WHERE", client: "select a from t where  ", word: "", want: "\x00end"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pos int
			if tc.word == "" {
				pos = utf8.RuneCountInString(tc.sent) + 1
			} else {
				pos = charPos(t, tc.sent, tc.word, tc.n)
			}
			got := sqlplan.ClientPosition(tc.sent, tc.client, pos)
			want := 0
			if tc.want == "\x00end" {
				want = utf8.RuneCountInString(tc.client) + 1
			} else if tc.want != "" {
				want = charPos(t, tc.client, tc.want, tc.wantN)
			}
			if got != want {
				t.Errorf("position %d in %q: got %d in %q, want %d", pos, tc.sent, got, tc.client, want)
			}
		})
	}
	if got := sqlplan.ClientPosition("SELECT a", "select a", 99); got != 0 {
		t.Errorf("a position past the text: got %d, want 0", got)
	}
}

// TestClientPositionOfPlans: the statements the planner sends for a client's statement
// (deparsed, tables renamed) give back the client's position of an unknown column.
func TestClientPositionOfPlans(t *testing.T) {
	p := sqlplan.New(testRules(t), nil, sqlplan.Options{})
	for _, client := range []string{
		"select   order_id,    nosuch   from   t_order  where order_id = 17",
		"select  count(*)  from   t_order  where   nosuch  > 1",
		"select  o.order_id  from t_order o join t_order_item i using (order_id) where  order_id = 3 and   i.nosuch = 2",
	} {
		pl, lits, err := p.PlanSimple(context.Background(), client)
		if err != nil {
			t.Fatal(err)
		}
		b, err := pl.BindSimple(client, lits)
		if err != nil {
			t.Fatal(err)
		}
		for _, tg := range b.Targets {
			if tg.SQL == client {
				t.Fatalf("%q: sent unchanged; the test needs a rewritten statement", client)
			}
			word := "nosuch"
			if strings.Contains(client, "i.nosuch") {
				word = "i.nosuch"
			}
			got := sqlplan.ClientPosition(tg.SQL, client, charPos(t, tg.SQL, word, 0))
			if want := charPos(t, client, word, 0); got != want {
				t.Errorf("%q sent as %q: position %d, want %d", client, tg.SQL, got, want)
			}
		}
	}
}

// FuzzClientPosition: any texts and position give 0 or a position in the client's
// text, at the start of a token that says what the server's token says.
func FuzzClientPosition(f *testing.F) {
	f.Add("SELECT name, nosuch FROM t_order_1 t_order", "select name,  nosuch from t_order", 14)
	f.Add("SELECT 'é', x", "select 'é',x", 13)
	f.Add(`SELECT "a""b" FROM t`, `select "a""b" from t`, 8)
	f.Fuzz(func(t *testing.T, sent, client string, pos int) {
		got := sqlplan.ClientPosition(sent, client, pos)
		if got == 0 {
			return
		}
		if sent == client {
			if got != pos {
				t.Fatalf("same text: %d became %d", pos, got)
			}
			return
		}
		if got < 1 || got > utf8.RuneCountInString(client)+1 {
			t.Fatalf("position %d outside %q", got, client)
		}
	})
}

// TestSplitStatementsAt: each statement's offset is where it starts in the client's
// string, in characters, as PostgreSQL counts an error's position.
func TestSplitStatementsAt(t *testing.T) {
	for _, sql := range []string{
		"  select 1",
		"select 1;  select nosuch from t;",
		"select 'é';\n\tselect 2 ; select 3",
		"select 1; /* select 2 */; select 2",
		"BEGIN; SELECT 'a;b' ; -- c;\n SELECT $$x;y$$;; /* ; */ COMMIT",
	} {
		got := sqlplan.SplitStatementsAt(sql)
		want := sqlplan.SplitStatements(sql)
		if len(got) != len(want) {
			t.Fatalf("%q: %d statements, SplitStatements has %d", sql, len(got), len(want))
		}
		runes := []rune(sql)
		for i, st := range got {
			if st.SQL != want[i] {
				t.Errorf("%q: statement %d is %q, want %q", sql, i, st.SQL, want[i])
			}
			n := utf8.RuneCountInString(st.SQL)
			if st.Offset+n > len(runes) || string(runes[st.Offset:st.Offset+n]) != st.SQL {
				t.Errorf("%q: statement %q is not at offset %d", sql, st.SQL, st.Offset)
			}
		}
	}
	if got := sqlplan.SplitStatementsAt("select 1; /* select 2 */; select 2"); len(got) != 2 || got[1].Offset != 26 {
		t.Errorf("a statement repeated in a comment before it: %+v, want the second at 26", got)
	}
}
