// Package autoshard is a block store that starts as one SQLite database and
// doubles its number of shard databases each time the newest level fills up.
//
// # Levels
//
// Level 0 is one database, level 1 is two, level L is 2^L. Writes always go to
// the newest ("top") level. Threshold is a size per database, as in the
// design this package follows ("when they reach the same size threshold"):
// level L is full once it holds Threshold x 2^L rows, that is Threshold rows
// per shard on average (hashes spread the rows evenly, so every shard is
// close to it). The batch that would overfill a level is split, in the
// order given, so that the level ends with exactly its capacity and the rest
// goes to the next level, which is created on the spot. A level that is
// exactly full does not create the next one until a row no longer fits.
// Older levels are never written again but stay readable, so a lookup asks
// one shard in every level. The top level is unbounded once it is MaxLevel,
// and a Threshold of 0 never splits.
//
// Row counts are kept per shard in the shard itself (updated in the same
// transaction as the inserts and read once on Open), never by count(*).
//
// # Shard choice
//
// Inside level L a block goes to the shard named by the leading L bits of its
// hash (see ShardFor). Block hashes are cryptographic digests, so their
// leading bits are uniform and the shards of a level fill evenly; a lookup by
// hash therefore needs exactly one shard per level, not every shard. Shard i
// of level L covers the same hash range as shards 2i and 2i+1 of level L+1.
//
// # Files
//
// A data directory holds manifest.db (the batch journal) and one folder per
// level, level-LL/shard-SSSS.db. Open discovers the levels from the folders,
// so a restarted process continues at the level where the last one stopped.
//
// # Crash safety
//
// A batch may touch many shard files, and SQLite cannot commit several files
// atomically. WriteBatch therefore first journals the batch (its id, a digest
// of its blocks and its plan: which blocks go to which level) in manifest.db.
// Each shard then commits its part of the batch in one transaction that also
// records the batch id and the number of rows it inserted; a shard that
// already recorded the batch skips it. Finally the journal marks the batch
// done. After a crash, retrying the same batch id with the same blocks reuses
// the journaled plan, so every block goes to the same shard as in the first
// attempt, shards that already committed do nothing, and row counters (kept
// per shard in the same transaction) never count a row twice.
package autoshard
