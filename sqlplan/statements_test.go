package sqlplan

import (
	"os"
	"strings"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// TestEveryStatementTypeIsDecided: every statement type of the grammar pg_query parses
// has a name in SQL words, and docs/sql-sharding.md says what becomes of it over several
// shards; a pg_query upgrade that adds one fails here until it is decided.
func TestEveryStatementTypeIsDecided(t *testing.T) {
	doc, err := os.ReadFile("../docs/sql-sharding.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "### Every statement type")
	if !ok {
		t.Fatal(`docs/sql-sharding.md has no section "### Every statement type"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	section = strings.Join(strings.Fields(section), " ") // names may wrap across lines
	oneof := (&pg.Node{}).ProtoReflect().Descriptor().Oneofs().Get(0)
	n := 0
	for i := range oneof.Fields().Len() {
		f := oneof.Fields().Get(i)
		if f.Message() == nil || !strings.HasSuffix(string(f.Message().Name()), "Stmt") {
			continue
		}
		n++
		typ := strings.TrimSuffix(string(f.Message().Name()), "Stmt")
		name, ok := statementSQL[typ]
		if !ok {
			t.Errorf("statement type %sStmt has no SQL name in statementSQL", typ)
			continue
		}
		if !strings.Contains(section, "`"+name+"`") {
			t.Errorf("docs/sql-sharding.md does not say what becomes of `%s` (%sStmt)", name, typ)
		}
	}
	if n < 100 {
		t.Fatalf("found %d statement types; the grammar has over 100", n)
	}
}
