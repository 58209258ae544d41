package autoshard

// SetHook makes WriteBatch call f at its named points ("planned",
// "shard-committed", "before-done"), so crash tests can stop a writer there.
func SetHook(o *Options, f func(point string)) { o.hook = f }
