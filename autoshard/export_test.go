package autoshard

import "context"

// SetHook makes WriteBatch call f at its named points ("planned",
// "shard-committed", "before-done"), so crash tests can stop a writer there.
func SetHook(o *Options, f func(point string)) { o.hook = f }

// FileLimitNeeded is the open-file limit Open requires for a MaxLevel.
func FileLimitNeeded(maxLevel int) uint64 { return fileLimitNeeded(maxLevel) }

// Synchronous returns the synchronous mode in effect on the writer of the
// manifest and of every shard database, in that order.
func Synchronous(ctx context.Context, s *Store) ([]string, error) {
	var out []string
	m, err := s.manifest.Synchronous(ctx)
	if err != nil {
		return nil, err
	}
	out = append(out, m)
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, shards := range s.mu.levels {
		for _, sh := range shards {
			v, err := sh.db.Synchronous(ctx)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
	}
	return out, nil
}
