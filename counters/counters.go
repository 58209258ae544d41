// Package counters keeps exact counters for "hot" keys: keys that many
// clients increment at the same time, such as the number of requests seen
// from one IP address.
//
// The naive schema, one row per key updated in place, serialises every
// writer of a hot key on that row's lock. This package offers three
// strategies behind one small [Counter] interface so that they can be
// compared side by side (see cmd/counterbench and docs/counters.md):
//
//   - [StrategyRow]: one row per key, INSERT ... ON CONFLICT DO UPDATE.
//     Simple, and a single row lock that every writer queues on.
//   - [StrategyAppend]: insert-only, one row per unit of count. Writers never
//     wait for each other, but reading is count(*) whose cost grows with the
//     number of increments.
//   - [StrategyBucket]: the key's count is split over N rows ("buckets"),
//     unique on (key, bucket); a write upserts one bucket, a read sums them.
//     The bucket is chosen by [BucketRandom], [BucketTime] or [BucketWorker].
//
// Every strategy is exact: after any run, the count read back equals the sum
// of the increments whose Incr returned nil, on PostgreSQL ([NewPostgres],
// [OpenPostgres]) and on SQLite ([OpenSQLite]).
package counters

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"
)

// Counter is an exact counter of increments per key.
//
// Implementations are safe for concurrent use. Cancelling the context of a
// call aborts it; as with any database write, an Incr that returns an error
// (including a cancelled context) may or may not have been applied, while an
// Incr that returns nil has been committed exactly once.
type Counter interface {
	// Incr adds by to the count of key and sets its last-seen time to now.
	// key must pass [ValidateKey] and by must pass [ValidateBy], otherwise
	// Incr returns an error wrapping [ErrInvalidKey] or [ErrInvalidBy]
	// without touching the database.
	Incr(ctx context.Context, key string, by int64) error
	// Get returns the current count and last-seen time of key, or an error
	// wrapping [ErrNotFound] if key was never incremented.
	Get(ctx context.Context, key string) (Value, error)
	// Close releases the counter's resources. It is idempotent; calls after
	// Close return [ErrClosed].
	Close() error
}

// Value is what [Counter.Get] returns for one key.
type Value struct {
	// Key is the key that was read.
	Key string `json:"key"`
	// Count is the sum of all acknowledged increments of Key.
	Count int64 `json:"count"`
	// LastSeen is the latest time Key was incremented, in UTC with
	// microsecond precision (the precision both backends store).
	LastSeen time.Time `json:"last_seen"`
}

// Limits enforced by [ValidateKey] and [ValidateBy].
const (
	// MaxKeyLen is the longest accepted key, in bytes.
	MaxKeyLen = 256
	// MaxBy is the largest accepted increment. The append strategy writes
	// one row per unit, so a larger batch must be split by the caller.
	MaxBy = 10_000
	// MaxBuckets is the largest accepted [Options.Buckets]. Reads sum one row
	// per bucket, so far more buckets than writers only slows reads down.
	MaxBuckets = 100_000
)

// Sentinel errors. Callers test them with errors.Is; the returned errors wrap
// them with details. An HTTP layer maps ErrInvalidKey and ErrInvalidBy to
// 400 Bad Request and ErrNotFound to 404 Not Found.
var (
	// ErrNotFound means the key was never incremented.
	ErrNotFound = errors.New("counters: key not found")
	// ErrInvalidKey means the key is empty, too long, not UTF-8 or holds a
	// NUL byte (PostgreSQL text cannot store NUL).
	ErrInvalidKey = errors.New("counters: invalid key")
	// ErrInvalidBy means the increment is outside 1..MaxBy.
	ErrInvalidBy = errors.New("counters: invalid increment")
	// ErrInvalidOptions means [Options.Validate] rejected the options.
	ErrInvalidOptions = errors.New("counters: invalid options")
	// ErrClosed means the counter was used after Close.
	ErrClosed = errors.New("counters: counter is closed")
)

// ValidateKey reports whether key is acceptable to every [Counter]. The error
// wraps [ErrInvalidKey].
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, the maximum is %d", ErrInvalidKey, len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
	case strings.IndexByte(key, 0) >= 0:
		return fmt.Errorf("%w: contains a NUL byte", ErrInvalidKey)
	}
	return nil
}

// ValidateBy reports whether by is an acceptable increment: 1 <= by <=
// [MaxBy]. The error wraps [ErrInvalidBy].
func ValidateBy(by int64) error {
	if by < 1 || by > MaxBy {
		return fmt.Errorf("%w: %d is outside 1..%d", ErrInvalidBy, by, MaxBy)
	}
	return nil
}

// Strategy names how a counter lays out its rows.
type Strategy string

// The strategies; see the package documentation.
const (
	// StrategyRow keeps one row per key, updated in place.
	StrategyRow Strategy = "row"
	// StrategyAppend inserts one row per unit of count and reads count(*).
	StrategyAppend Strategy = "append"
	// StrategyBucket spreads a key over Options.Buckets rows and reads sum().
	StrategyBucket Strategy = "bucket"
)

// Strategies lists every strategy, in the order the benchmark reports them.
func Strategies() []Strategy { return []Strategy{StrategyRow, StrategyAppend, StrategyBucket} }

// ParseStrategy parses a flag value ("row", "append" or "bucket").
func ParseStrategy(s string) (Strategy, error) {
	for _, st := range Strategies() {
		if s == string(st) {
			return st, nil
		}
	}
	return "", fmt.Errorf("%w: unknown strategy %q (want row, append or bucket)", ErrInvalidOptions, s)
}

// BucketBy names how [StrategyBucket] picks the bucket of each increment.
type BucketBy string

// The bucket choosers.
const (
	// BucketRandom picks a uniformly random bucket for each increment. Two
	// concurrent writers collide with probability about 1/N.
	BucketRandom BucketBy = "random"
	// BucketTime picks the current microsecond of the second modulo N, as
	// in the seed article. Writers that start in the same microsecond
	// collide, and so do writers whose clocks differ by a multiple of N µs.
	BucketTime BucketBy = "time"
	// BucketWorker guarantees that two concurrent increments in one process
	// never write the same bucket: the counter holds a pool of free bucket
	// ids, each Incr takes one for the duration of its statement and gives
	// it back afterwards. With at least as many buckets as concurrent
	// writers (database connections) nobody ever waits; with fewer, an Incr
	// waits in memory for a free bucket instead of on a row lock in the
	// database. Several processes sharing the tables each have their own
	// pool, so across processes buckets can still collide; that costs
	// throughput, never exactness.
	BucketWorker BucketBy = "worker"
)

// BucketChoosers lists every [BucketBy] value.
func BucketChoosers() []BucketBy { return []BucketBy{BucketRandom, BucketTime, BucketWorker} }

// ParseBucketBy parses a flag value ("random", "time" or "worker").
func ParseBucketBy(s string) (BucketBy, error) {
	for _, b := range BucketChoosers() {
		if s == string(b) {
			return b, nil
		}
	}
	return "", fmt.Errorf("%w: unknown bucket chooser %q (want random, time or worker)", ErrInvalidOptions, s)
}

// DefaultTablePrefix is the table-name prefix used when Options.TablePrefix
// is empty.
const DefaultTablePrefix = "shardlab_"

// Options selects a strategy. The zero value is invalid: set Strategy.
type Options struct {
	// Strategy is the row layout; required.
	Strategy Strategy
	// Buckets is the number of buckets per key for StrategyBucket, in
	// 1..MaxBuckets. Ignored by the other strategies. Changing it between
	// runs is safe: reads sum whatever buckets exist.
	Buckets int
	// BucketBy picks the bucket of each increment for StrategyBucket;
	// required for it, ignored by the other strategies.
	BucketBy BucketBy
	// TablePrefix is prepended to the table names (counter_row,
	// counter_append, counter_bucket) so that tests and benchmarks sharing
	// a database do not collide. Lower-case letters, digits and
	// underscores, starting with a letter, at most 32 bytes. Empty means
	// DefaultTablePrefix.
	TablePrefix string
}

var prefixRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

// Validate reports the first problem with o; the error wraps
// [ErrInvalidOptions].
func (o Options) Validate() error {
	if _, err := ParseStrategy(string(o.Strategy)); err != nil {
		return err
	}
	if o.TablePrefix != "" && !prefixRE.MatchString(o.TablePrefix) {
		return fmt.Errorf("%w: table prefix %q must match %s", ErrInvalidOptions, o.TablePrefix, prefixRE)
	}
	if o.Strategy != StrategyBucket {
		return nil
	}
	if o.Buckets < 1 || o.Buckets > MaxBuckets {
		return fmt.Errorf("%w: buckets %d is outside 1..%d", ErrInvalidOptions, o.Buckets, MaxBuckets)
	}
	if _, err := ParseBucketBy(string(o.BucketBy)); err != nil {
		return err
	}
	return nil
}

// String describes o the way the benchmark labels it: "row", "append",
// "bucket/100/random".
func (o Options) String() string {
	if o.Strategy != StrategyBucket {
		return string(o.Strategy)
	}
	return fmt.Sprintf("%s/%d/%s", o.Strategy, o.Buckets, o.BucketBy)
}

func (o Options) prefix() string {
	if o.TablePrefix == "" {
		return DefaultTablePrefix
	}
	return o.TablePrefix
}

// tables names the tables of one prefix.
type tables struct{ row, append, bucket string }

func (o Options) tables() tables {
	p := o.prefix()
	return tables{row: p + "counter_row", append: p + "counter_append", bucket: p + "counter_bucket"}
}

// now is the last-seen timestamp of an increment, truncated to the
// microsecond precision that both backends store.
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// checkIncr validates the arguments of Incr.
func checkIncr(key string, by int64) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	return ValidateBy(by)
}
