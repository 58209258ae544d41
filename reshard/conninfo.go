package reshard

import (
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/rules"
)

// searchSchema is the first schema data source ds's DSN names in its search_path (a
// schema shard's), or "" when it names none.
func searchSchema(l *rules.Compiled, ds string) string {
	cfg, err := pgconn.ParseConfig(fromDSN(l, ds))
	if err != nil {
		return ""
	}
	first, _, _ := strings.Cut(cfg.RuntimeParams["search_path"], ",")
	first = strings.TrimSpace(first)
	if len(first) >= 2 && first[0] == '"' && first[len(first)-1] == '"' {
		return strings.ReplaceAll(first[1:len(first)-1], `""`, `"`)
	}
	return strings.ToLower(first)
}

// broadcastSource is where broadcast table name is copied from to data source dst of
// layout to: a data source of from whose DSN names the schema dst's does (logical
// replication carries a table into the one of the same schema and name), else the
// first that has the table.
func broadcastSource(from, to *rules.Compiled, name, dst string) Place {
	nodes := from.Lookup(name).Nodes
	want := searchSchema(to, dst)
	for _, n := range nodes {
		if at := place(from, n); searchSchema(from, at.DataSource) == want {
			return at
		}
	}
	return place(from, nodes[0])
}
