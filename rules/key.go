package rules

import (
	"encoding/hex"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/shardlab/shardlab/routing"
)

// Key is one sharding-key value, read as its column's type.
type Key struct {
	Null bool
	Int  int64    // for integer columns
	Text string   // for text columns
	UUID [16]byte // for uuid columns
	typ  KeyType
}

// IntKey, TextKey, UUIDKey and NullKey make keys of each type.
func IntKey(v int64) Key     { return Key{Int: v, typ: TypeInt8} }
func TextKey(s string) Key   { return Key{Text: s, typ: TypeText} }
func UUIDKey(u [16]byte) Key { return Key{UUID: u, typ: TypeUUID} }
func NullKey() Key           { return Key{Null: true} }

// String is the key's text form, as PostgreSQL prints it.
func (k Key) String() string {
	switch {
	case k.Null:
		return "NULL"
	case k.typ == TypeText:
		return k.Text
	case k.typ == TypeUUID:
		return formatUUID(k.UUID)
	default:
		return strconv.FormatInt(k.Int, 10)
	}
}

// ParseKey reads a key from its text form as PostgreSQL's input function for typ would:
// integers may have surrounding spaces and a sign and must fit the type; a uuid may be
// upper- or lower-case, with or without hyphens or braces. It fails, wrapping
// ErrKeyType, where PostgreSQL would fail too.
func ParseKey(typ KeyType, s string) (Key, error) {
	switch typ {
	case TypeInt2, TypeInt4, TypeInt8:
		v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil || !fits(typ, v) {
			return Key{}, fmt.Errorf("%w: %q is not a valid %s", ErrKeyType, s, typ)
		}
		return Key{Int: v, typ: typ}, nil
	case TypeText:
		return TextKey(s), nil
	case TypeUUID:
		u, err := parseUUID(s)
		if err != nil {
			return Key{}, err
		}
		return UUIDKey(u), nil
	}
	return Key{}, fmt.Errorf("%w: unknown column type %q", ErrKeyType, typ)
}

// fits reports whether v is in range for an integer type.
func fits(typ KeyType, v int64) bool {
	switch typ {
	case TypeInt2:
		return v >= math.MinInt16 && v <= math.MaxInt16
	case TypeInt4:
		return v >= math.MinInt32 && v <= math.MaxInt32
	}
	return true
}

func parseUUID(s string) ([16]byte, error) {
	var u [16]byte
	t := strings.TrimSpace(s)
	if strings.HasPrefix(t, "{") && strings.HasSuffix(t, "}") {
		t = t[1 : len(t)-1]
	}
	t = strings.ReplaceAll(t, "-", "")
	if len(t) != 32 {
		return u, fmt.Errorf("%w: %q is not a valid uuid", ErrKeyType, s)
	}
	if _, err := hex.Decode(u[:], []byte(t)); err != nil {
		return u, fmt.Errorf("%w: %q is not a valid uuid", ErrKeyType, s)
	}
	return u, nil
}

func formatUUID(u [16]byte) string {
	h := hex.EncodeToString(u[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// convert reads k as typ: an integer key for an integer column must fit it, a text
// key for an integer or uuid column is parsed, an integer key for a text column is
// refused (PostgreSQL would not compare them without a cast).
func convert(k Key, typ KeyType) (Key, error) {
	if k.Null {
		return k, nil
	}
	switch {
	case typ.IsInteger() && k.typ.IsInteger():
		if !fits(typ, k.Int) {
			return Key{}, fmt.Errorf("%w: %d is out of range for %s", ErrKeyType, k.Int, typ)
		}
		return Key{Int: k.Int, typ: typ}, nil
	case k.typ == typ:
		return k, nil
	case k.typ == TypeText:
		return ParseKey(typ, k.Text)
	}
	return Key{}, fmt.Errorf("%w: a %s value for a %s column", ErrKeyType, k.typ, typ)
}

// shardOf applies strategy s to key k of column type typ over n shards.
func shardOf(s *Strategy, typ KeyType, k Key, n int) (int, error) {
	if typ == TypeUnknown {
		return 0, fmt.Errorf("rules: the type of sharding column %q is not known", s.Column)
	}
	k, err := convert(k, typ)
	if err != nil {
		return 0, err
	}
	if k.Null {
		if s.Algorithm == AlgorithmPGHash {
			return routing.PGPartition(routing.PGHashNull, n), nil // as PostgreSQL places NULL keys
		}
		return 0, fmt.Errorf("%w: NULL sharding key for column %q (algorithm %s)", ErrKeyType, s.Column, s.Algorithm)
	}
	switch s.Algorithm {
	case AlgorithmPGHash, "":
		var h uint64
		switch typ {
		case TypeInt2, TypeInt4:
			h = routing.PGHashInt4(int32(k.Int))
		case TypeInt8:
			h = routing.PGHashInt8(k.Int)
		case TypeText:
			h = routing.PGHashText(k.Text)
		case TypeUUID:
			h = routing.PGHashUUID(k.UUID)
		}
		return routing.PGPartition(h, n), nil
	case AlgorithmCRC32:
		return routing.CRC32Shard(k.String(), n), nil
	case AlgorithmJump:
		return routing.JumpShard(k.String(), n), nil
	case AlgorithmMod:
		if !typ.IsInteger() {
			return 0, fmt.Errorf("%w: algorithm mod needs an integer column, %q is %s", ErrKeyType, s.Column, typ)
		}
		m := k.Int % int64(n)
		if m < 0 {
			m += int64(n)
		}
		return int(m), nil
	case AlgorithmRange:
		if !typ.IsInteger() {
			return 0, fmt.Errorf("%w: algorithm range needs an integer column, %q is %s", ErrKeyType, s.Column, typ)
		}
		return sort.Search(len(s.Bounds), func(i int) bool { return k.Int < s.Bounds[i] }), nil
	}
	return 0, fmt.Errorf("rules: unknown algorithm %q", s.Algorithm)
}

// RangeShards returns the shards of a range-sharded column whose keys can fall in
// [lo, hi] (either end may be open), or nil, false when the column's algorithm does not
// order keys (a hash), in which case a range condition cannot narrow a statement.
func (r *TableRule) RangeShards(column string, lo, hi *int64) ([]int, bool) {
	if r.spec == nil || r.spec.single == nil || r.spec.single.Column != column || r.spec.single.Algorithm != AlgorithmRange {
		return nil, false
	}
	b := r.spec.single.Bounds
	first, last := 0, len(b)
	if lo != nil {
		first = sort.Search(len(b), func(i int) bool { return *lo < b[i] })
	}
	if hi != nil {
		last = sort.Search(len(b), func(i int) bool { return *hi < b[i] })
	}
	var out []int
	for i := first; i <= last; i++ {
		out = append(out, i)
	}
	return out, true
}

// Negate returns -k, for a key written with a unary minus: an integer key negated, a key
// still in text form with its sign flipped. NULL stays NULL.
func (k Key) Negate() Key {
	switch {
	case k.Null:
		return k
	case k.typ == TypeText:
		if strings.HasPrefix(k.Text, "-") {
			return TextKey(k.Text[1:])
		}
		return TextKey("-" + k.Text)
	case k.typ.IsInteger():
		return Key{Int: -k.Int, typ: k.typ}
	}
	return k
}
