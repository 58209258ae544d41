package reshard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
)

// groupBy groups streams by the data source key names for each.
func groupBy(streams []stream, key func(stream) string) map[string][]stream {
	out := map[string][]stream{}
	for _, s := range streams {
		out[key(s)] = append(out[key(s)], s)
	}
	return out
}

func bySource(s stream) string      { return s.from }
func byDestination(s stream) string { return s.to }

// eachGroup runs fn for every group at once and joins their errors. A group is one
// data source's streams, and fn uses that data source's connection only: a
// connection is never shared between two goroutines. The hold's steps cost a round
// trip or a commit per stream; with many streams (4 to 3 has twelve) they add up
// while every client waits, unless the data sources do theirs side by side.
func eachGroup(ctx context.Context, groups map[string][]stream, fn func(ctx context.Context, ds string, ss []stream) error) error {
	return eachDataSource(ctx, slices.Sorted(maps.Keys(groups)), func(ctx context.Context, ds string) error { return fn(ctx, ds, groups[ds]) })
}

// eachDataSource runs fn for every data source of names at once, each on its own
// connection, and joins their errors. The first error cancels the context the others
// run under: a hold that fails gives up at once (a cancelled statement closes its
// connection; what undoes the hold opens its own).
func eachDataSource(ctx context.Context, names []string, fn func(ctx context.Context, ds string) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, 0, len(names))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, ds := range names {
		wg.Go(func() {
			if err := fn(ctx, ds); err != nil {
				mu.Lock()
				if len(errs) == 0 {
					cancel()
				}
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 1 {
		// The first error is the cause; the others are mostly the cancellation.
		return fmt.Errorf("%w (and %d more data sources failed or were stopped)", errs[0], len(errs)-1)
	}
	return errors.Join(errs...)
}
