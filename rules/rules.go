// Package rules describes how logical tables are spread over databases: the sharding
// rules that the SQL core, the database/sql driver and the wire proxy share.
//
// A Rules value names
//   - data sources: one DSN each; shards on several hosts are DSNs on several hosts;
//   - sharded tables: the sharding column and its type, the algorithm, and the layout as
//     data sources x tables per data source (seed 004's t_order over ds_0..1 x
//     t_order_0..1), with one strategy over every physical table or separate database and
//     table strategies;
//   - binding groups: sharded tables with the same key and the same placement, so that a
//     join on equal keys runs inside each shard;
//   - broadcast tables: a full copy on every data source;
//   - everything else lives on the default data source.
//
// Build a Rules value in Go or load one from a TOML file with Load or Parse, then Compile
// it. Compile checks everything and returns the immutable *Compiled that routers use.
package rules

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// ErrInvalid is wrapped by every error about a bad rules value or file.
var ErrInvalid = errors.New("rules: invalid")

// MaxPhysicalTables bounds data sources x tables per data source for one logical table.
const MaxPhysicalTables = 4096

// Rules is the user's description of a sharded database. The zero value is not useful:
// at least one data source is needed.
type Rules struct {
	DataSources []DataSource
	// DefaultDataSource names the data source that holds every table no rule mentions;
	// empty means the first one.
	DefaultDataSource string
	Tables            []Table
	// Bindings lists groups of sharded tables that share their key and placement.
	Bindings [][]string
	// Broadcast lists tables copied in full to every data source.
	Broadcast []string
}

// DataSource is one database that holds shards.
type DataSource struct {
	Name string // how rules refer to it, e.g. "ds_0"
	DSN  string // e.g. postgres://app@db1:5432/orders?sslmode=disable
}

// Table is the rule of one sharded logical table.
//
// The physical tables are, for each data source d in DataSources and each t in
// [0, TablesPerDataSource): the logical name when TablesPerDataSource is 1, else
// Name_t. They are numbered d*TablesPerDataSource + t, and that number is the shard.
//
// With only Strategy set, its algorithm spreads keys over all physical tables: shard =
// algorithm(key) mod (data sources x tables). With DatabaseStrategy and TableStrategy
// set instead, the first picks the data source and the second the table within it,
// each by its own column if wanted (seed 004 shards databases by one column and tables
// by another).
type Table struct {
	// Name is the logical table name. A trailing * makes it a prefix pattern:
	// "sbtest*" matches sbtest1, sbtest2 ...; an exact rule wins over a pattern.
	Name                string
	Strategy            Strategy
	DatabaseStrategy    *Strategy
	TableStrategy       *Strategy
	DataSources         []string // default: every data source, in order
	TablesPerDataSource int      // default 1
}

// Strategy says how one column's value picks a shard.
type Strategy struct {
	Column string
	// Type is the sharding column's type; empty means "read it from a shard's catalog".
	Type KeyType
	// Algorithm defaults to AlgorithmPGHash.
	Algorithm Algorithm
	// Bounds are the range algorithm's split points, ascending: shard 0 holds keys below
	// Bounds[0], shard i keys in [Bounds[i-1], Bounds[i]), the last shard the rest. There
	// is one bound fewer than shards.
	Bounds []int64
}

// Algorithm names a sharding function.
type Algorithm string

// Algorithms.
const (
	// AlgorithmPGHash is PostgreSQL's PARTITION BY HASH function: a key goes to shard i
	// exactly when a native hash partition of modulus N, remainder i would hold it.
	AlgorithmPGHash Algorithm = "pghash"
	// AlgorithmCRC32 is crc32.ChecksumIEEE of the key's text form, mod N (the lab's router).
	AlgorithmCRC32 Algorithm = "crc32"
	// AlgorithmJump is jump consistent hashing of the key's text form.
	AlgorithmJump Algorithm = "jump"
	// AlgorithmMod is the integer key mod N (never negative).
	AlgorithmMod Algorithm = "mod"
	// AlgorithmRange maps integer keys to shards by explicit bounds.
	AlgorithmRange Algorithm = "range"
)

// Algorithms returns every algorithm name, the default first.
func Algorithms() []Algorithm {
	return []Algorithm{AlgorithmPGHash, AlgorithmCRC32, AlgorithmJump, AlgorithmMod, AlgorithmRange}
}

// UnmarshalText accepts an algorithm name; a rules file gets an error naming its line.
func (a *Algorithm) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*a = "" // the default, as when the field is left out
		return nil
	}
	v := Algorithm(strings.ToLower(string(b)))
	if !slices.Contains(Algorithms(), v) {
		return fmt.Errorf("unknown algorithm %q (want one of %s)", b, joinNames(Algorithms()))
	}
	*a = v
	return nil
}

// KeyType is the type of a sharding column, by its canonical PostgreSQL name.
type KeyType string

// Key types. Hashing depends on the type: int2 and int4 hash alike, int8 differs for
// values past 32 bits, and text and uuid hash their bytes.
const (
	TypeUnknown KeyType = ""
	TypeInt2    KeyType = "int2"
	TypeInt4    KeyType = "int4"
	TypeInt8    KeyType = "int8"
	TypeText    KeyType = "text"
	TypeUUID    KeyType = "uuid"
)

// typeNames maps every accepted spelling to its canonical type.
var typeNames = map[string]KeyType{
	"smallint": TypeInt2, "int2": TypeInt2,
	"int": TypeInt4, "integer": TypeInt4, "int4": TypeInt4,
	"bigint": TypeInt8, "int8": TypeInt8,
	"text": TypeText, "varchar": TypeText, "character varying": TypeText,
	"uuid": TypeUUID,
}

// ParseKeyType returns the canonical type for a name such as "bigint", "integer",
// "varchar" or "uuid" (PostgreSQL's spellings, case-insensitive).
func ParseKeyType(name string) (KeyType, error) {
	if t, ok := typeNames[strings.ToLower(strings.TrimSpace(name))]; ok {
		return t, nil
	}
	return TypeUnknown, fmt.Errorf("unsupported sharding column type %q (want smallint, int, bigint, text, varchar or uuid)", name)
}

// UnmarshalText accepts a type name; a rules file gets an error naming its line.
func (t *KeyType) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*t = TypeUnknown // the catalog's, as when the field is left out
		return nil
	}
	v, err := ParseKeyType(string(b))
	if err != nil {
		return err
	}
	*t = v
	return nil
}

// IsInteger reports whether t is one of the integer types.
func (t KeyType) IsInteger() bool { return t == TypeInt2 || t == TypeInt4 || t == TypeInt8 }

func joinNames[T ~string](v []T) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = string(x)
	}
	return strings.Join(s, ", ")
}

// identifier is what rules accept as a table, column or data source name: an unquoted
// PostgreSQL identifier. Quoted mixed-case names are not supported.
var identifier = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)

// fieldError is a validation error tied to the field that caused it, so that Load can
// name the line of a rules file.
type fieldError struct {
	path []any // e.g. {"sharded_table", 2, "column"}
	msg  string
}

func (e *fieldError) Error() string { return pathString(e.path) + ": " + e.msg }

func pathString(path []any) string {
	var b strings.Builder
	for _, p := range path {
		switch p := p.(type) {
		case int:
			fmt.Fprintf(&b, "[%d]", p)
		default:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			fmt.Fprint(&b, p)
		}
	}
	return b.String()
}

func fieldErr(msg string, path ...any) error { return &fieldError{path: path, msg: msg} }
