package rules

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// A rules file is TOML (github.com/pelletier/go-toml/v2: strict decoding that rejects
// misspelt fields, and a parser that keeps the position of every key, so that each
// error can name its line):
//
//	default_data_source = "ds_0"          # optional: holds every table no rule names
//	broadcast = ["t_config"]              # tables copied to every data source
//
//	[[data_source]]
//	name = "ds_0"
//	dsn  = "postgres://app@db1:5432/orders?sslmode=disable"
//
//	[[data_source]]
//	name = "ds_1"
//	dsn  = "postgres://app@db2:5432/orders?sslmode=disable"
//
//	[[sharded_table]]
//	name = "t_order"
//	column = "order_id"
//	type = "bigint"                       # optional: else read from a shard's catalog
//	algorithm = "pghash"                  # pghash (default), crc32, jump, mod, range
//	data_sources = ["ds_0", "ds_1"]       # optional: default every data source
//	tables_per_data_source = 2            # optional: t_order_0, t_order_1 on each
//
//	[[sharded_table]]
//	name = "t_order_item"
//	column = "order_id"
//	type = "bigint"
//	tables_per_data_source = 2
//
//	[[binding]]
//	tables = ["t_order", "t_order_item"]
//
// Separate database and table strategies replace column/type/algorithm/bounds:
//
//	[sharded_table.database_strategy]
//	column = "user_id"
//	algorithm = "mod"
//	[sharded_table.table_strategy]
//	column = "order_id"
//	algorithm = "mod"
type file struct {
	DefaultDataSource string           `toml:"default_data_source"`
	Broadcast         []string         `toml:"broadcast"`
	DataSource        []fileDataSource `toml:"data_source"`
	ShardedTable      []fileTable      `toml:"sharded_table"`
	Binding           []fileBinding    `toml:"binding"`
}

type fileDataSource struct {
	Name string `toml:"name"`
	DSN  string `toml:"dsn"`
}

type fileStrategy struct {
	Column    string  `toml:"column"`
	Type      string  `toml:"type"`
	Algorithm string  `toml:"algorithm"`
	Bounds    []int64 `toml:"bounds"`
}

type fileTable struct {
	Name                string        `toml:"name"`
	Column              string        `toml:"column"`
	Type                string        `toml:"type"`
	Algorithm           string        `toml:"algorithm"`
	Bounds              []int64       `toml:"bounds"`
	DataSources         []string      `toml:"data_sources"`
	TablesPerDataSource int           `toml:"tables_per_data_source"`
	DatabaseStrategy    *fileStrategy `toml:"database_strategy"`
	TableStrategy       *fileStrategy `toml:"table_strategy"`
}

type fileBinding struct {
	Tables []string `toml:"tables"`
}

// FileError is an error in a rules file, at a line.
type FileError struct {
	File  string // the file name given to Load, or "rules" for Parse
	Line  int    // 1-based; 0 when the error concerns no one line
	Field string // e.g. "sharded_table[1].column"
	Msg   string
}

func (e *FileError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap makes every FileError match ErrInvalid.
func (e *FileError) Unwrap() error { return ErrInvalid }

// Load reads and compiles a rules file. Every error names the file, the line and the
// field; several problems are reported together.
func Load(path string) (*Compiled, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	return parse(path, data)
}

// Parse compiles rules from TOML text; errors name the line and field.
func Parse(data []byte) (*Compiled, error) { return parse("rules", data) }

func parse(name string, data []byte) (*Compiled, error) {
	var f file
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, decodeError(name, err)
	}
	r, convErrs := f.toRules()
	c, err := Compile(r)
	if err == nil && len(convErrs) == 0 {
		return c, nil
	}
	lines := keyLines(data)
	var out []error
	collect := func(e error) {
		var fe *fieldError
		if errors.As(e, &fe) {
			out = append(out, &FileError{File: name, Line: lineOf(lines, fe.path), Field: pathString(fe.path), Msg: fe.msg})
			return
		}
		out = append(out, &FileError{File: name, Msg: e.Error()})
	}
	for _, e := range convErrs {
		collect(e)
	}
	var inv *invalidError
	if errors.As(err, &inv) {
		for _, e := range inv.errs {
			collect(e)
		}
	} else if err != nil {
		collect(err)
	}
	return nil, errors.Join(out...)
}

// toRules converts the file's strings into a Rules value. Type and algorithm names are
// checked here, so that their errors carry the field path.
func (f *file) toRules() (Rules, []error) {
	var errs []error
	r := Rules{DefaultDataSource: f.DefaultDataSource, Broadcast: f.Broadcast}
	for _, ds := range f.DataSource {
		r.DataSources = append(r.DataSources, DataSource(ds))
	}
	strategy := func(fs fileStrategy, path ...any) Strategy {
		s := Strategy{Column: fs.Column, Bounds: fs.Bounds}
		if fs.Type != "" {
			t, err := ParseKeyType(fs.Type)
			if err != nil {
				errs = append(errs, fieldErr(err.Error(), append(path, "type")...))
			}
			s.Type = t
		}
		if fs.Algorithm != "" {
			var a Algorithm
			if err := a.UnmarshalText([]byte(fs.Algorithm)); err != nil {
				errs = append(errs, fieldErr(err.Error(), append(path, "algorithm")...))
				a = AlgorithmPGHash
			}
			s.Algorithm = a
		}
		return s
	}
	for i, ft := range f.ShardedTable {
		t := Table{Name: ft.Name, DataSources: ft.DataSources, TablesPerDataSource: ft.TablesPerDataSource}
		t.Strategy = strategy(fileStrategy{ft.Column, ft.Type, ft.Algorithm, ft.Bounds}, "sharded_table", i)
		if ft.DatabaseStrategy != nil {
			s := strategy(*ft.DatabaseStrategy, "sharded_table", i, "database_strategy")
			t.DatabaseStrategy = &s
		}
		if ft.TableStrategy != nil {
			s := strategy(*ft.TableStrategy, "sharded_table", i, "table_strategy")
			t.TableStrategy = &s
		}
		r.Tables = append(r.Tables, t)
	}
	for _, b := range f.Binding {
		r.Bindings = append(r.Bindings, b.Tables)
	}
	return r, errs
}

// decodeError turns go-toml's syntax, type and unknown-field errors into FileErrors.
func decodeError(name string, err error) error {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) {
		var out []error
		for _, e := range strict.Errors {
			line, _ := e.Position()
			out = append(out, &FileError{File: name, Line: line, Field: strings.Join(e.Key(), "."), Msg: "unknown field"})
		}
		return errors.Join(out...)
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		line, _ := de.Position()
		return &FileError{File: name, Line: line, Field: strings.Join(de.Key(), "."), Msg: strings.TrimPrefix(de.Error(), "toml: ")}
	}
	return &FileError{File: name, Msg: err.Error()}
}

// keyLines maps the path of every key in a TOML document (as pathString writes it, with
// array-of-tables indexes) to the line it is on.
func keyLines(data []byte) map[string]int {
	lines := map[string]int{}
	var p unstable.Parser
	p.Reset(data)
	counts := map[string]int{} // array table path -> elements seen
	var current []any
	keyOf := func(it unstable.Iterator) []any {
		var k []any
		for it.Next() {
			k = append(k, string(it.Node().Data))
		}
		return k
	}
	// resolve rewrites a header path so that array tables seen so far carry the index of
	// their latest element: [sharded_table.database_strategy] -> sharded_table[2]...
	resolve := func(key []any) []any {
		var out []any
		for _, part := range key {
			out = append(out, part)
			if n, ok := counts[pathString(out)]; ok {
				out = append(out, n-1)
			}
		}
		return out
	}
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.ArrayTable:
			key := keyOf(e.Key())
			parent := resolve(key[:len(key)-1])
			base := append(parent, key[len(key)-1])
			counts[pathString(base)]++
			current = append(base, counts[pathString(base)]-1)
			lines[pathString(current)] = p.Shape(e.Child().Raw).Start.Line
		case unstable.Table:
			current = resolve(keyOf(e.Key()))
			lines[pathString(current)] = p.Shape(e.Child().Raw).Start.Line
		case unstable.KeyValue:
			it := e.Key()
			var k []any
			line := 0
			for it.Next() {
				k = append(k, string(it.Node().Data))
				if line == 0 {
					line = p.Shape(it.Node().Raw).Start.Line
				}
			}
			lines[pathString(append(append([]any{}, current...), k...))] = line
		}
	}
	return lines
}

// lineOf finds the line of the longest prefix of path that the document has.
func lineOf(lines map[string]int, path []any) int {
	for n := len(path); n > 0; n-- {
		if l, ok := lines[pathString(path[:n])]; ok {
			return l
		}
	}
	return 0
}
