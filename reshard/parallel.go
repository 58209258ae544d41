package reshard

import (
	"errors"
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
func eachGroup(groups map[string][]stream, fn func(ds string, ss []stream) error) error {
	errs := make([]error, 0, len(groups))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for ds, ss := range groups {
		wg.Go(func() {
			if err := fn(ds, ss); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
