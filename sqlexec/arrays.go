package sqlexec

import (
	"encoding/binary"

	"github.com/jackc/pgx/v5/pgtype"
)

var builtinTypes = pgtype.NewMap()

// BinaryArray writes values (each in binary, of the built-in type elem; nil is NULL) as
// a one-dimensional array in PostgreSQL's binary format, and returns the array type's
// OID; ok is false for an element type whose array type is not known.
func BinaryArray(elem uint32, values [][]byte) (array []byte, oid uint32, ok bool) {
	t, ok := builtinTypes.TypeForOID(elem)
	if !ok {
		return nil, 0, false
	}
	at, ok := builtinTypes.TypeForName("_" + t.Name)
	if !ok {
		return nil, 0, false
	}
	size := 20
	hasNull := uint32(0)
	for _, v := range values {
		size += 4 + len(v)
		if v == nil {
			hasNull = 1
		}
	}
	b := make([]byte, 0, size)
	if len(values) == 0 {
		// No dimension: the empty array.
		b = binary.BigEndian.AppendUint32(b, 0)
		b = binary.BigEndian.AppendUint32(b, 0)
		return binary.BigEndian.AppendUint32(b, elem), at.OID, true
	}
	b = binary.BigEndian.AppendUint32(b, 1)
	b = binary.BigEndian.AppendUint32(b, hasNull)
	b = binary.BigEndian.AppendUint32(b, elem)
	b = binary.BigEndian.AppendUint32(b, uint32(len(values)))
	b = binary.BigEndian.AppendUint32(b, 1) // lower bound
	for _, v := range values {
		if v == nil {
			b = binary.BigEndian.AppendUint32(b, 0xFFFFFFFF)
			continue
		}
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	return b, at.OID, true
}
