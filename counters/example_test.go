package counters_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/shardlab/shardlab/counters"
)

// An HTTP handler for POST /counter/incr and GET /counter needs little more
// than this: parse the flags into Options, open a Counter, and map the
// sentinel errors to status codes.
func ExampleOpenSQLite() {
	dir, err := os.MkdirTemp("", "counters-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	strategy, err := counters.ParseStrategy("bucket") // --counter
	if err != nil {
		log.Fatal(err)
	}
	by, err := counters.ParseBucketBy("worker") // --bucket-by
	if err != nil {
		log.Fatal(err)
	}
	opts := counters.Options{Strategy: strategy, Buckets: 100, BucketBy: by} // --buckets
	ctx := context.Background()
	c, err := counters.OpenSQLite(ctx, filepath.Join(dir, "counters.db"), opts, counters.SQLiteOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	for range 3 {
		if err := c.Incr(ctx, "192.168.0.1", 2); err != nil {
			log.Fatal(err)
		}
	}
	v, err := c.Get(ctx, "192.168.0.1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(v.Key, v.Count)

	// Client mistakes are 400, unknown keys 404.
	err = c.Incr(ctx, "", 1)
	fmt.Println(errors.Is(err, counters.ErrInvalidKey))
	err = c.Incr(ctx, "192.168.0.1", 0)
	fmt.Println(errors.Is(err, counters.ErrInvalidBy))
	_, err = c.Get(ctx, "10.0.0.1")
	fmt.Println(errors.Is(err, counters.ErrNotFound))
	// Output:
	// 192.168.0.1 6
	// true
	// true
	// true
}
