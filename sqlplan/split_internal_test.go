package sqlplan

import (
	"reflect"
	"testing"
)

// FuzzOneStatement: where the shortcut of one statement answers, it answers as the
// lexer (and the parser) would, offsets included.
func FuzzOneStatement(f *testing.F) {
	for _, s := range []string{
		"", " ", ";", " ; ", "select 1", "select 1;", " select 1 ;\n", "select ';'", "select 1 -- ;",
		"-- ;", "/* ; */", "/* x */ ;", "select 'a;", "select $$;", "/* ;", "select 1;;", "; select 1",
		"select 1 ; -- c", "select 1; select 2", "\tSELECT abalance FROM pgbench_accounts WHERE aid = 7;",
		"select E'\\';'", "select \"a;\"", "select 1 /* ; */",
		// White space the lexer does not skip but TrimSpace does, beside comments only.
		"/* x */\u00a0;", "\u00a0/* x */", "-- x\n\u2028", "\u3000-- x\n;",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		got, ok := oneStatement(sql)
		if !ok {
			return
		}
		want := lexedStatementsAt(sql)
		if len(got) == 0 && len(want) == 0 {
			return
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: the shortcut gives %+v, the lexer %+v", sql, got, want)
		}
	})
}

// TestOneStatementTakesTheCommonCase: a query of one statement, with or without its
// semicolon, does not go to the lexer; one of several does.
func TestOneStatementTakesTheCommonCase(t *testing.T) {
	for sql, want := range map[string]bool{
		"SELECT abalance FROM pgbench_accounts WHERE aid = 7;": true,
		"select 1":           true,
		"select 1; select 2": false,
		"select ';' ":        false,
		"select 1;;":         false,
	} {
		if _, ok := oneStatement(sql); ok != want {
			t.Errorf("%q: shortcut %v, want %v", sql, ok, want)
		}
	}
}
