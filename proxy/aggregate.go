package proxy

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardlab/shardlab/rules"
)

// AggregateSchemas merges the data sources that are schemas of one database (DSNs that
// differ only in search_path, each naming one schema) into one data source, so that
// one pool serves them all and a transaction over several of them uses one server
// connection (see rules.Compiled.MergeSchemas). The merged data source keeps the DSN
// of the default data source when it is one of them, else of the first, so that
// default and broadcast tables are found on that schema. Data sources that share their
// database with no other are left alone. groups lists the merged data sources' names.
func AggregateSchemas(rs *rules.Compiled) (merged *rules.Compiled, groups [][]string, err error) {
	dss := rs.DataSources()
	type member struct {
		ds     int
		schema string
	}
	byDB := map[string][]member{}
	var keys []string
	for i, ds := range dss {
		cfg, err := pgconn.ParseConfig(ds.DSN)
		if err != nil {
			return nil, nil, fmt.Errorf("data source %s: %w", ds.Name, err)
		}
		schema := cfg.RuntimeParams["search_path"]
		if !plainSchema(schema) {
			continue
		}
		params := maps.Clone(cfg.RuntimeParams)
		delete(params, "search_path")
		var b strings.Builder
		fmt.Fprintf(&b, "%s\x00%d\x00%s\x00%s\x00%s\x00%t", cfg.Host, cfg.Port, cfg.Database, cfg.User, cfg.Password, cfg.TLSConfig != nil)
		for _, k := range slices.Sorted(maps.Keys(params)) {
			fmt.Fprintf(&b, "\x00%s=%s", k, params[k])
		}
		key := b.String()
		if _, ok := byDB[key]; !ok {
			keys = append(keys, key)
		}
		byDB[key] = append(byDB[key], member{i, schema})
	}
	merge := make([]rules.SchemaMerge, len(dss))
	for i := range merge {
		merge[i].Into = i
	}
	def := rs.DefaultDataSource()
	for _, key := range keys {
		ms := byDB[key]
		if len(ms) < 2 {
			continue
		}
		into := ms[0].ds
		for _, m := range ms {
			if m.ds == def {
				into = def
			}
		}
		var names []string
		for _, m := range ms {
			merge[m.ds] = rules.SchemaMerge{Into: into, Schema: m.schema}
			names = append(names, dss[m.ds].Name)
		}
		groups = append(groups, names)
	}
	if len(groups) == 0 {
		return rs, nil, nil
	}
	merged, err = rs.MergeSchemas(merge)
	if err != nil {
		return nil, nil, err
	}
	return merged, groups, nil
}

// plainSchema reports whether a search_path names exactly one schema, written as a
// plain identifier (a list or a quoted name is not a shard's schema to qualify with).
func plainSchema(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		if !(c == '_' || c >= 'a' && c <= 'z' || i > 0 && (c >= '0' && c <= '9' || c == '$')) {
			return false
		}
	}
	return true
}
