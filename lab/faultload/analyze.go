package faultload

import (
	"slices"
	"sort"
	"strings"
	"time"
)

// Window is one fault as the run applied it: its kind, the shard it hit (by index),
// when it began and when it was healed.
type Window struct {
	Kind          string
	Shard         int
	Begin, Healed time.Time
}

// Stats summarizes statements: how many, how many failed, and the latency of those
// that succeeded.
type Stats struct {
	N, Errors int
	P50, P99  time.Duration
}

// Result is what one fault did to the traffic.
type Result struct {
	Window
	// Others are the statements that need no faulty shard and ran while the fault was
	// in force (begun before it or not), beside Baseline, the same that ended before the
	// first fault.
	Baseline, Others Stats
	// Faulty are the statements that need the faulty shard and ran while the fault
	// was in force, including those sent before it began that it caught.
	Faulty Stats
	// Detect runs from the fault's beginning to the end of the first statement on the
	// faulty shard that failed (0 when none failed).
	Detect time.Duration
	// FailMax is the longest a failing statement on the faulty shard took: how long a
	// client waits to learn.
	FailMax time.Duration
	// Recover runs from the healing to the end of the first statement on the faulty
	// shard that began after it and succeeded (0 when none did).
	Recover time.Duration
	// AfterRecovery are the statements on the faulty shard that began after that first
	// success and ended before the next fault: a poisoned pool would fail them.
	AfterRecovery Stats
	// Hangs are statements (any shard) the client gave up on, that ran during the
	// fault or began after its healing and ended before the next fault.
	Hangs int
	// Errors counts the errors on the faulty shard during the fault by SQLSTATE and
	// message (the message cut to its first 100 bytes), most frequent first.
	Errors []ErrorCount
	// Named counts the errors of the faulty shard's statements whose message names its
	// data source.
	Named int
}

// ErrorCount is one kind of error and how often it came.
type ErrorCount struct {
	Code, Message string
	N             int
}

// Analyze reads events against windows (in the order they were applied). shardOf maps a
// key to its shard's index; name maps a shard's index to its data source's name, as the
// proxy's errors call it.
func Analyze(events []Event, windows []Window, shardOf func(int64) int, name func(int) string) []Result {
	touches := func(e Event, shard int) bool {
		return shardOf(e.Key) == shard || (e.Op == Pair && shardOf(e.Key2) == shard)
	}
	var first time.Time
	if len(windows) > 0 {
		first = windows[0].Begin
	}
	var baseline []Event
	for _, e := range events {
		if e.End.Before(first) {
			baseline = append(baseline, e)
		}
	}
	var out []Result
	for i, w := range windows {
		next := time.Unix(1<<40, 0)
		if i+1 < len(windows) {
			next = windows[i+1].Begin
		}
		// A statement belongs to one window at most: one begun during an earlier
		// fault, or before that one healed, is that fault's.
		var prevHealed time.Time
		if i > 0 {
			prevHealed = windows[i-1].Healed
		}
		r := Result{Window: w}
		var others, faulty, after []Event
		var base []Event
		for _, e := range baseline {
			if !touches(e, w.Shard) {
				base = append(base, e)
			}
		}
		r.Baseline = summarize(base)
		counts := map[[2]string]int{}
		for _, e := range events {
			// During the fault: a statement that ran while it was in force, begun
			// before it or not. After it: begun after the healing, ended before the
			// next fault.
			during := !e.Start.Before(prevHealed) && e.Start.Before(w.Healed) && e.End.After(w.Begin)
			afterHeal := !e.Start.Before(w.Healed) && e.End.Before(next)
			if !during && !afterHeal {
				continue
			}
			if e.Code == HangCode {
				r.Hangs++
			}
			switch {
			case during && touches(e, w.Shard):
				faulty = append(faulty, e)
				if !e.OK() {
					if r.Detect == 0 || e.End.Sub(w.Begin) < r.Detect {
						r.Detect = max(e.End.Sub(w.Begin), time.Microsecond)
					}
					r.FailMax = max(r.FailMax, e.Latency())
					msg := e.Err
					if len(msg) > 100 {
						msg = msg[:100]
					}
					counts[[2]string{e.Code, msg}]++
					if namesSource(e.Err, name(w.Shard)) {
						r.Named++
					}
				}
			case during:
				others = append(others, e)
			case touches(e, w.Shard):
				after = append(after, e)
			}
		}
		r.Others, r.Faulty = summarize(others), summarize(faulty)
		sort.Slice(after, func(a, b int) bool { return after[a].Start.Before(after[b].Start) })
		for j, e := range after {
			if e.OK() {
				r.Recover = max(e.End.Sub(w.Healed), time.Microsecond)
				r.AfterRecovery = summarize(after[j+1:])
				break
			}
		}
		for k, n := range counts {
			r.Errors = append(r.Errors, ErrorCount{Code: k[0], Message: k[1], N: n})
		}
		slices.SortFunc(r.Errors, func(a, b ErrorCount) int {
			if a.N != b.N {
				return b.N - a.N
			}
			return strings.Compare(a.Code+a.Message, b.Code+b.Message)
		})
		out = append(out, r)
	}
	return out
}

// namesSource reports whether msg names the data source name as a word of its own
// (ds_1, not ds_10).
func namesSource(msg, name string) bool {
	if name == "" {
		return false
	}
	for i := 0; ; {
		j := strings.Index(msg[i:], name)
		if j < 0 {
			return false
		}
		end := i + j + len(name)
		if end == len(msg) || !isNameByte(msg[end]) {
			if i+j == 0 || !isNameByte(msg[i+j-1]) {
				return true
			}
		}
		i = i + j + 1
	}
}

func isNameByte(b byte) bool {
	return b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}

func summarize(events []Event) Stats {
	var s Stats
	var lat []time.Duration
	for _, e := range events {
		s.N++
		if !e.OK() {
			s.Errors++
			continue
		}
		lat = append(lat, e.Latency())
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		s.P50 = quantile(lat, 0.5)
		s.P99 = quantile(lat, 0.99)
	}
	return s
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Ack is an acknowledged insert: the row (id, worker, seq) of fault_acks.
type Ack struct {
	ID     int64
	Worker int
	Seq    int64
}

// Acknowledged returns the rows the log says were acknowledged (writes and pairs that
// succeeded), and the pairs whose outcome the client never learned (their two rows must
// be both there or both missing under two-phase commit).
func Acknowledged(events []Event) (acked []Ack, unknownPairs [][2]Ack) {
	for _, e := range events {
		switch {
		case e.Op == Write && e.OK():
			acked = append(acked, Ack{e.Key, e.Worker, e.Seq})
		case e.Op == Pair && e.OK():
			acked = append(acked, Ack{e.Key, e.Worker, e.Seq}, Ack{e.Key2, e.Worker, e.Seq})
		case e.Op == Pair:
			unknownPairs = append(unknownPairs, [2]Ack{{e.Key, e.Worker, e.Seq}, {e.Key2, e.Worker, e.Seq}})
		}
	}
	return acked, unknownPairs
}

// Check compares the log's writes with the rows found: every acknowledged row must be
// there, and every pair must be whole (both rows) or absent. It returns the lost rows
// and the torn pairs.
func Check(events []Event, found map[Ack]bool) (lost []Ack, torn [][2]Ack) {
	acked, unknown := Acknowledged(events)
	for _, a := range acked {
		if !found[a] {
			lost = append(lost, a)
		}
	}
	for _, p := range unknown {
		if found[p[0]] != found[p[1]] {
			torn = append(torn, p)
		}
	}
	return lost, torn
}
