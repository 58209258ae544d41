package routing

import (
	"encoding/binary"
	"math/bits"
	"unsafe"
)

// PostgreSQL's hash partitioning, reproduced so that a row lands on shard i exactly when
// a table declared `PARTITION BY HASH (col)` with `MODULUS n REMAINDER i` partitions
// would put it in partition i. Shards laid out this way can be turned into native
// partitions, and native partitions into shards, without moving a row.
//
// PostgreSQL hashes each partition key column with the type's extended hash function
// (hashint4extended, hashint8extended, texthashextended, uuid_hash_extended) under a
// fixed seed, combines the column hashes, and takes the result modulo the modulus. The
// extended hashes are Bob Jenkins' lookup3 as in PostgreSQL's common/hashfn.c, on a
// little-endian machine (PostgreSQL's result differs on big-endian servers; the golden
// vectors in the tests were computed by a little-endian PostgreSQL).

// pgPartitionSeed is HASH_PARTITION_SEED in PostgreSQL's partitioning code.
const pgPartitionSeed uint64 = 0x7A5B22367996DCFD

// PGHashInt4 is the partition hash of an int4 (integer) key, and of an int2 key.
func PGHashInt4(v int32) uint64 {
	return pgCombine(hashUint32Extended(uint32(v), pgPartitionSeed))
}

// PGHashInt8 is the partition hash of an int8 (bigint) key. A value that fits in 32 bits
// hashes as the int4 of the same value, as in PostgreSQL, so that int4 and int8 keys of
// equal value agree.
func PGHashInt8(v int64) uint64 {
	lo := uint32(v)
	hi := uint32(v >> 32)
	if v >= 0 {
		lo ^= hi
	} else {
		lo ^= ^hi
	}
	return pgCombine(hashUint32Extended(lo, pgPartitionSeed))
}

// PGHashText is the partition hash of a text or varchar key under a deterministic
// collation (the default and every libc collation): the hash of the string's bytes.
// Nondeterministic ICU collations hash a sort key instead and are not supported.
func PGHashText(s string) uint64 {
	return pgCombine(hashBytesExtended(unsafe.Slice(unsafe.StringData(s), len(s)), pgPartitionSeed))
}

// PGHashUUID is the partition hash of a uuid key given as its 16 bytes.
func PGHashUUID(u [16]byte) uint64 {
	return pgCombine(hashBytesExtended(u[:], pgPartitionSeed))
}

// PGPartition returns the partition (shard) of a partition hash among modulus
// partitions of equal modulus: `hash % modulus`, as PostgreSQL computes it.
func PGPartition(hash uint64, modulus int) int {
	return int(hash % uint64(modulus))
}

// PGHashNull is the partition hash of a NULL key: PostgreSQL skips NULL columns, so the
// row hash stays zero and a NULL key lands in partition (shard) 0.
const PGHashNull uint64 = 0

// pgCombine folds one column's hash h into the row hash, which starts at zero:
// hash_combine64(0, h) = 0 ^ (h + 0x49a0f4dd15e5a8e3 + (0 << 54) + (0 >> 7)).
// Only single-column keys are supported, so this is the whole row hash.
func pgCombine(h uint64) uint64 {
	return h + 0x49a0f4dd15e5a8e3
}

// lookup3's mixing steps, as in PostgreSQL's hashfn.c.
func mix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

func final(a, b, c uint32) (uint32, uint32, uint32) {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return a, b, c
}

// hashUint32Extended is hash_uint32_extended(k, seed).
func hashUint32Extended(k uint32, seed uint64) uint64 {
	a := uint32(0x9e3779b9 + 4 + 3923095)
	b, c := a, a
	if seed != 0 {
		a += uint32(seed >> 32)
		b += uint32(seed)
		a, b, c = mix(a, b, c)
	}
	a += k
	_, b, c = final(a, b, c)
	return uint64(b)<<32 | uint64(c)
}

// hashBytesExtended is hash_any_extended(k, len(k), seed) on a little-endian machine.
func hashBytesExtended(k []byte, seed uint64) uint64 {
	a := uint32(0x9e3779b9) + uint32(len(k)) + 3923095
	b, c := a, a
	if seed != 0 {
		a += uint32(seed >> 32)
		b += uint32(seed)
		a, b, c = mix(a, b, c)
	}
	for len(k) >= 12 {
		a += binary.LittleEndian.Uint32(k)
		b += binary.LittleEndian.Uint32(k[4:])
		c += binary.LittleEndian.Uint32(k[8:])
		a, b, c = mix(a, b, c)
		k = k[12:]
	}
	// The last 11 bytes or fewer; the lowest byte of c is reserved for the length.
	switch len(k) {
	case 11:
		c += uint32(k[10]) << 24
		fallthrough
	case 10:
		c += uint32(k[9]) << 16
		fallthrough
	case 9:
		c += uint32(k[8]) << 8
		fallthrough
	case 8:
		b += uint32(k[7]) << 24
		fallthrough
	case 7:
		b += uint32(k[6]) << 16
		fallthrough
	case 6:
		b += uint32(k[5]) << 8
		fallthrough
	case 5:
		b += uint32(k[4])
		fallthrough
	case 4:
		a += uint32(k[3]) << 24
		fallthrough
	case 3:
		a += uint32(k[2]) << 16
		fallthrough
	case 2:
		a += uint32(k[1]) << 8
		fallthrough
	case 1:
		a += uint32(k[0])
	}
	_, b, c = final(a, b, c)
	return uint64(b)<<32 | uint64(c)
}
