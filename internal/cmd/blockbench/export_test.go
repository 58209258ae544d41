package blockbench

// FirstHash returns the first block hash a run with this seed writes.
func FirstHash(seed uint64) []byte {
	return append([]byte(nil), newBatchMaker(seed, 1, 1).next()[0].Hash...)
}
