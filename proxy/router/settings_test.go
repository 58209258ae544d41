package router

import (
	"strings"
	"testing"
)

// TestApplySet: the settings list follows PostgreSQL's rules for SET, RESET, RESET ALL,
// the role and the session authorization.
func TestApplySet(t *testing.T) {
	steps := []struct {
		sql  string
		want string // the names in the list after the statement, in replay order
	}{
		{"SET work_mem = '8MB'", "work_mem"},
		{"SET ROLE r", "work_mem role"},
		{"SET work_mem = '9MB'", "role work_mem"},
		{"RESET ALL", "role"},
		{"SET search_path = a", "role search_path"},
		{"SET SESSION AUTHORIZATION u", "search_path session_authorization"},
		{"SET ROLE r", "search_path session_authorization role"},
		{"RESET SESSION AUTHORIZATION", "search_path"},
		{"SET ROLE r", "search_path role"},
		{"RESET ROLE", "search_path"},
		{"SET search_path TO DEFAULT", ""},
		{"SET LOCAL work_mem = '1MB'", ""},
		{"SET TIME ZONE 'UTC'", "timezone"},
		{"SET SESSION AUTHORIZATION DEFAULT", "timezone"},
	}
	var list []setting
	for _, st := range steps {
		kind, name, err := classifySet(st.sql)
		if err != nil {
			t.Fatalf("%s: %v", st.sql, err)
		}
		before := len(list)
		next := applySet(list, kind, name, st.sql)
		if len(list) != before {
			t.Fatalf("%s: the list given was modified", st.sql)
		}
		list = next
		var names []string
		for _, x := range list {
			names = append(names, x.name)
		}
		if got := strings.Join(names, " "); got != st.want {
			t.Errorf("after %s: %q, want %q", st.sql, got, st.want)
		}
	}
}

// TestSetConfigCalls: the settings a statement's set_config calls name are read from
// constants and parameters; anything else is refused.
func TestSetConfigCalls(t *testing.T) {
	calls, err := setConfigCalls("SELECT set_config('app.a', 'x', false), pg_catalog.set_config($1, 'y', $2::bool), set_config('b', 'z', NULL), set_config($3, 'w', $4::text::bool)",
		[][]byte{[]byte("work_mem"), {1}, []byte("c"), []byte("true")}, []int16{0, 1, 0, 1}, []uint32{25, 16, 25, 25})
	if err != nil {
		t.Fatal(err)
	}
	// A NULL is_local is false; a binary parameter of type text is text, not a boolean.
	if len(calls) != 4 || calls[0] != (setConfigCall{"app.a", false}) || calls[1] != (setConfigCall{"work_mem", true}) ||
		calls[2] != (setConfigCall{"b", false}) || calls[3] != (setConfigCall{"c", true}) {
		t.Errorf("calls %+v", calls)
	}
	if _, err := setConfigCalls("SELECT set_config(name, 'x', false) FROM t", nil, nil, nil); err == nil || !strings.Contains(err.Error(), "0A000") {
		t.Errorf("a name from a column: %v", err)
	}
	if calls, err := setConfigCalls("SELECT set_config(NULL, 'x', false)", nil, nil, nil); err != nil || len(calls) != 0 {
		t.Errorf("a NULL name: %+v %v", calls, err)
	}
	for in, want := range map[string]bool{"t": true, "TRUE": true, "on": true, "1": true, "y": true, "f": false, "off": false, "no": false, "0": false} {
		if got, ok := parseBool(in); !ok || got != want {
			t.Errorf("parseBool(%q) = %v, %v", in, got, ok)
		}
	}
	if _, ok := parseBool("o"); ok {
		t.Error("parseBool(o) is ambiguous in PostgreSQL")
	}
}

// TestSameEncoding: encoding names are one encoding regardless of case, dashes and
// underscores, as PostgreSQL reads them, and no other.
func TestSameEncoding(t *testing.T) {
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"UTF8", "UTF8", true}, {"utf-8", "UTF8", true}, {"Utf_8", "utf8", true}, {"LATIN1", "latin-1", true},
		{"UTF8", "LATIN1", false}, {"UTF8", "UTF", false}, {"", "", true}, {"-", "", true}, {"UTF8", "", false},
		{"WIN1252", "WIN1250", false}, {"euc_jp", "EUCJP", true}, {"SQL_ASCII", "sqlascii", true},
	} {
		if got := sameEncoding(c.a, c.b); got != c.same {
			t.Errorf("sameEncoding(%q, %q) = %v, want %v", c.a, c.b, got, c.same)
		}
		if got := sameEncoding(c.b, c.a); got != c.same {
			t.Errorf("sameEncoding(%q, %q) = %v, want %v", c.b, c.a, got, c.same)
		}
	}
}
