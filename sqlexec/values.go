package sqlexec

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// Type OIDs the merge knows how to compare and combine.
const (
	oidBool        = 16
	oidRecord      = 2249 // an anonymous record, ROW(...)
	oidBytea       = 17
	oidName        = 19
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidText        = 25
	oidOID         = 26
	oidFloat4      = 700
	oidFloat8      = 701
	oidMoney       = 790
	oidBpchar      = 1042
	oidVarchar     = 1043
	oidDate        = 1082
	oidTime        = 1083
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidInterval    = 1186
	oidNumeric     = 1700
	oidUUID        = 2950
)

// isTextual reports whether a type compares under a collation.
func isTextual(oid uint32) bool {
	return oid == oidText || oid == oidVarchar || oid == oidBpchar || oid == oidName
}

// value is a decoded column value in a form that compares as PostgreSQL compares it.
type value struct {
	null bool
	kind valueKind
	i    int64   // integers, booleans (0/1), dates (days), times and timestamps (µs)
	f    float64 // floats
	n    numeric
	b    []byte // text (byte order), bytea, uuid
}

type valueKind uint8

const (
	kInt valueKind = iota
	kFloat
	kNumeric
	kBytes
)

// typeMap decodes date and time values in either format.
var typeMap = pgtype.NewMap()

// decode reads a raw column value of type oid in format (0 text, 1 binary).
func decode(oid uint32, format int16, raw []byte) (value, error) {
	if raw == nil {
		return value{null: true}, nil
	}
	bin := format == 1
	switch oid {
	case oidInt2, oidInt4, oidInt8, oidOID:
		if bin {
			switch len(raw) {
			case 2:
				return value{i: int64(int16(binary.BigEndian.Uint16(raw)))}, nil
			case 4:
				if oid == oidOID {
					return value{i: int64(binary.BigEndian.Uint32(raw))}, nil
				}
				return value{i: int64(int32(binary.BigEndian.Uint32(raw)))}, nil
			case 8:
				return value{i: int64(binary.BigEndian.Uint64(raw))}, nil
			}
			return value{}, fmt.Errorf("sqlexec: integer of %d bytes", len(raw))
		}
		v, err := strconv.ParseInt(string(raw), 10, 64)
		return value{i: v}, err
	case oidFloat4, oidFloat8:
		var f float64
		if bin {
			switch len(raw) {
			case 4:
				f = float64(math.Float32frombits(binary.BigEndian.Uint32(raw)))
			case 8:
				f = math.Float64frombits(binary.BigEndian.Uint64(raw))
			default:
				return value{}, fmt.Errorf("sqlexec: float of %d bytes", len(raw))
			}
		} else {
			var err error
			if f, err = strconv.ParseFloat(string(raw), 64); err != nil {
				return value{}, err
			}
		}
		return value{kind: kFloat, f: f}, nil
	case oidNumeric:
		var n numeric
		var err error
		if bin {
			n, err = parseNumericBinary(raw)
		} else {
			n, err = parseNumericText(string(raw))
		}
		return value{kind: kNumeric, n: n}, err
	case oidBool:
		if (bin && len(raw) == 1 && raw[0] == 1) || (!bin && string(raw) == "t") {
			return value{i: 1}, nil
		}
		return value{i: 0}, nil
	case oidText, oidVarchar, oidName, oidBytea:
		if oid == oidBytea && !bin {
			var b []byte
			if err := typeMap.Scan(oidBytea, 0, raw, &b); err != nil {
				return value{}, err
			}
			return value{kind: kBytes, b: b}, nil
		}
		return value{kind: kBytes, b: raw}, nil
	case oidBpchar:
		// char(n) compares without its trailing blanks.
		return value{kind: kBytes, b: bytes.TrimRight(raw, " ")}, nil
	case oidUUID:
		if bin {
			return value{kind: kBytes, b: raw}, nil
		}
		var u pgtype.UUID
		if err := typeMap.Scan(oidUUID, 0, raw, &u); err != nil {
			return value{}, err
		}
		return value{kind: kBytes, b: u.Bytes[:]}, nil
	case oidDate:
		var d pgtype.Date
		if err := typeMap.Scan(oidDate, format, raw, &d); err != nil {
			return value{}, err
		}
		switch d.InfinityModifier {
		case pgtype.Infinity:
			return value{i: math.MaxInt64}, nil
		case pgtype.NegativeInfinity:
			return value{i: math.MinInt64}, nil
		}
		return value{i: d.Time.Unix() / 86400}, nil
	case oidTimestamp, oidTimestamptz:
		var t time.Time
		var inf pgtype.InfinityModifier
		if oid == oidTimestamp {
			var ts pgtype.Timestamp
			if err := typeMap.Scan(oid, format, raw, &ts); err != nil {
				return value{}, err
			}
			t, inf = ts.Time, ts.InfinityModifier
		} else {
			var ts pgtype.Timestamptz
			if err := typeMap.Scan(oid, format, raw, &ts); err != nil {
				return value{}, err
			}
			t, inf = ts.Time, ts.InfinityModifier
		}
		switch inf {
		case pgtype.Infinity:
			return value{i: math.MaxInt64}, nil
		case pgtype.NegativeInfinity:
			return value{i: math.MinInt64}, nil
		}
		// Microseconds from 2000, as PostgreSQL counts them: from 1970, the latest
		// timestamps (past the year 294246) would not fit in an int64.
		return value{i: (t.Unix()-946684800)*1e6 + int64(t.Nanosecond()/1e3)}, nil
	case oidTime:
		var tm pgtype.Time
		if err := typeMap.Scan(oid, format, raw, &tm); err != nil {
			return value{}, err
		}
		return value{i: tm.Microseconds}, nil
	}
	return value{}, errNoOrder(oid)
}

// integer reads a count: an integer, or an integral numeric (SQLite's numbers travel as
// numerics).
func (v value) integer() int64 {
	if v.kind == kNumeric && v.n.special == 0 && v.n.scale == 0 && v.n.int.IsInt64() {
		return v.n.int.Int64()
	}
	return v.i
}

// errNoOrder is the refusal for a type the merge cannot compare.
func errNoOrder(oid uint32) error {
	return unsupported("comparing values of type %s across shards", typeName(oid))
}

// comparable reports whether decode handles oid.
func comparable(oid uint32) bool {
	switch oid {
	case oidInt2, oidInt4, oidInt8, oidOID, oidFloat4, oidFloat8, oidNumeric, oidBool, oidText, oidVarchar,
		oidName, oidBytea, oidBpchar, oidUUID, oidDate, oidTimestamp, oidTimestamptz, oidTime:
		return true
	}
	return false
}

// compare orders two non-NULL values of one type as PostgreSQL's default operator
// class does (text by bytes: callers check the collation allows it).
func compare(a, b value) int {
	switch a.kind {
	case kInt:
		switch {
		case a.i < b.i:
			return -1
		case a.i > b.i:
			return 1
		}
		return 0
	case kFloat:
		// PostgreSQL: NaN equals NaN and sorts above every other value; -0 = 0.
		an, bn := math.IsNaN(a.f), math.IsNaN(b.f)
		switch {
		case an && bn:
			return 0
		case an:
			return 1
		case bn:
			return -1
		case a.f < b.f:
			return -1
		case a.f > b.f:
			return 1
		}
		return 0
	case kNumeric:
		return cmpNumeric(a.n, b.n)
	default:
		return bytes.Compare(a.b, b.b)
	}
}

// groupKey appends a key equal for values PostgreSQL's equality calls equal.
func (v value) groupKey(dst []byte) []byte {
	if v.null {
		return append(dst, 0)
	}
	dst = append(dst, 1)
	switch v.kind {
	case kInt:
		return binary.BigEndian.AppendUint64(dst, uint64(v.i))
	case kFloat:
		f := v.f
		switch {
		case math.IsNaN(f):
			return append(dst, "NaN"...)
		case f == 0:
			f = 0 // -0 = 0
		}
		return binary.BigEndian.AppendUint64(dst, math.Float64bits(f))
	case kNumeric:
		s := v.n.canonical()
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(s)))
		return append(dst, s...)
	default:
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(v.b)))
		return append(dst, v.b...)
	}
}

var typeNames = map[uint32]string{
	oidBool: "boolean", oidBytea: "bytea", oidName: "name", oidInt8: "bigint", oidInt2: "smallint",
	oidInt4: "integer", oidText: "text", oidOID: "oid", oidFloat4: "real", oidFloat8: "double precision",
	oidMoney: "money", oidBpchar: "character", oidVarchar: "character varying", oidDate: "date",
	oidTime: "time", oidTimestamp: "timestamp", oidTimestamptz: "timestamptz", oidInterval: "interval",
	oidNumeric: "numeric", oidUUID: "uuid", 114: "json", 3802: "jsonb", 1266: "timetz", 869: "inet",
}

func typeName(oid uint32) string {
	if n, ok := typeNames[oid]; ok {
		return n
	}
	return fmt.Sprintf("with OID %d", oid)
}
