package autoshard

import "encoding/binary"

// ShardFor returns the shard of level that holds blocks with this hash: the
// leading level bits of the hash read as a big-endian number. Hashes shorter
// than 8 bytes are padded with zero bytes. Level 0 always answers 0.
//
// The mapping is part of the on-disk format: changing it would hide blocks
// already written.
func ShardFor(hash []byte, level int) int {
	if level <= 0 {
		return 0
	}
	var prefix [8]byte
	copy(prefix[:], hash)
	return int(binary.BigEndian.Uint64(prefix[:]) >> (64 - uint(level)))
}
