package reshard

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteText writes the plan for a person: per table the rows that stay and those that
// move, from where to where; the broadcast copies; the replication streams; the
// servers with what they have and what the move needs; and the problems, if any.
func (p *Plan) WriteText(w io.Writer) error {
	var b strings.Builder
	var all, moving, allBytes, movingBytes int64
	for _, t := range p.Tables {
		rows, mv := t.Rows()
		size, mvSize := t.Bytes()
		all, moving, allBytes, movingBytes = all+rows, moving+mv, allBytes+size, movingBytes+mvSize
		keys := make([]string, len(t.Keys))
		for i, k := range t.Keys {
			keys[i] = k + " " + string(t.KeyTypes[i])
		}
		fmt.Fprintf(&b, "table %s (key %s; target algorithm %s): %d of %d rows move (%s), %s of %s\n",
			t.Name, strings.Join(keys, ", "), t.Algorithm, mv, rows, percent(mv, rows), megabytes(mvSize), megabytes(size))
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "  from\tto\trows\tMB\t\t")
		for _, m := range t.Moves {
			what := "moves"
			if m.Stays() {
				what = "stays"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t\n", m.From, m.To, m.Rows, megabytesNum(m.Bytes), what)
		}
		tw.Flush()
		if t.Misplaced > 0 {
			fmt.Fprintf(&b, "  %d rows are not where the current layout places them (stranded by an earlier change of the rules); the move places them by the target layout\n", t.Misplaced)
		}
	}
	for _, bc := range p.Broadcast {
		// Grouped by the data source each copy comes from (a schema shard's copy comes
		// from the old data source of its schema).
		var froms []Place
		to := map[Place][]string{}
		for i, ds := range bc.To {
			src := bc.From
			if i < len(bc.Sources) {
				src = bc.Sources[i]
			}
			if to[src] == nil {
				froms = append(froms, src)
			}
			to[src] = append(to[src], ds)
		}
		var copies []string
		for _, src := range froms {
			copies = append(copies, fmt.Sprintf("from %s to %s", src, strings.Join(to[src], ", ")))
		}
		fmt.Fprintf(&b, "broadcast table %s: %d rows (%s) copied %s\n", bc.Name, bc.Rows, megabytes(bc.Bytes), strings.Join(copies, "; "))
	}
	fmt.Fprintf(&b, "in all: %d of %d rows of sharded tables move (%s), %s of %s\n", moving, all, percent(moving, all), megabytes(movingBytes), megabytes(allBytes))
	if len(p.Streams) == 0 {
		fmt.Fprintln(&b, "replication: none needed, nothing moves")
	} else {
		fmt.Fprintf(&b, "replication: %d streams (a publication and a subscription each)\n", len(p.Streams))
		for _, s := range p.Streams {
			fmt.Fprintf(&b, "  %s -> %s: %s\n", s.From, s.To, strings.Join(s.Tables, ", "))
		}
	}
	fmt.Fprintln(&b, "servers:")
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  server\tdata sources\twal_level\tslots needed/free\tWAL senders needed/free\tlogical workers needed/free\torigins needed/free")
	for _, s := range p.Servers {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d/%d\t%d/%d\t%d/%d\t%d/%d\n", s.Addr, strings.Join(s.DataSources, ","), s.WALLevel,
			s.SlotsNeeded, s.SlotsFree, s.SendersNeeded, s.SendersFree, s.WorkersNeeded, s.WorkersFree, s.OriginsNeeded, s.OriginsFree)
	}
	tw.Flush()
	if p.Runnable() {
		fmt.Fprintln(&b, "nothing stands in the move's way")
	} else {
		fmt.Fprintln(&b, "the move cannot start until these are fixed:")
		for _, pr := range p.Problems {
			fmt.Fprintf(&b, "  - %s\n", pr)
		}
	}
	fmt.Fprintf(&b, "measured in %s; a plan changes nothing\n", p.Took.Round(time.Millisecond))
	_, err := io.WriteString(w, b.String())
	return err
}

func percent(part, all int64) string {
	if all == 0 {
		return "0%"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(part)/float64(all))
}

func megabytes(n int64) string { return megabytesNum(n) + " MB" }

func megabytesNum(n int64) string { return fmt.Sprintf("%.2f", float64(n)/1e6) }
