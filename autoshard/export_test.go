package autoshard

// SetHook makes WriteBatch call f at its named points ("planned",
// "shard-committed", "before-done"), so crash tests can stop a writer there.
func SetHook(o *Options, f func(point string)) { o.hook = f }

// FileLimitNeeded is the open-file limit Open requires for a MaxLevel.
func FileLimitNeeded(maxLevel int) uint64 { return fileLimitNeeded(maxLevel) }
