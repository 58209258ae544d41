package reshard

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/shardlab/shardlab/rules"
)

// serverState is what one server has for logical replication.
type serverState struct {
	walLevel                            string
	maxSlots, usedSlots                 int
	maxSenders, usedSenders             int
	maxWorkers, usedWorkers, syncPerSub int
}

func readServer(ctx context.Context, c *pgx.Conn) (serverState, error) {
	var s serverState
	err := c.QueryRow(ctx, `SELECT current_setting('wal_level'),
		current_setting('max_replication_slots')::int, (SELECT count(*) FROM pg_replication_slots)::int,
		current_setting('max_wal_senders')::int, (SELECT count(*) FROM pg_stat_replication)::int,
		current_setting('max_logical_replication_workers')::int,
		(SELECT count(*) FROM pg_stat_subscription WHERE pid IS NOT NULL)::int,
		current_setting('max_sync_workers_per_subscription')::int`).Scan(&s.walLevel,
		&s.maxSlots, &s.usedSlots, &s.maxSenders, &s.usedSenders, &s.maxWorkers, &s.usedWorkers, &s.syncPerSub)
	return s, err
}

// checkServers reads each server's replication settings and what is in use, sets what
// the streams need of it, and notes every shortfall as a problem.
func checkServers(ctx context.Context, p *Plan, from, to *rules.Compiled, conns map[string]*pgx.Conn) error {
	addrOf := map[string]string{} // data source -> server
	var order []string
	byAddr := map[string]*Server{}
	state := map[string]serverState{}
	for _, l := range []*rules.Compiled{from, to} {
		for _, d := range l.DataSources() {
			if _, ok := addrOf[d.Name]; ok {
				continue
			}
			addr, err := serverAddr(d.DSN)
			if err != nil {
				return fmt.Errorf("data source %s: %w", d.Name, err)
			}
			addrOf[d.Name] = addr
			if byAddr[addr] == nil {
				st, err := readServer(ctx, conns[d.Name])
				if err != nil {
					return fmt.Errorf("data source %s: reading the server's replication settings: %w", d.Name, err)
				}
				state[addr] = st
				byAddr[addr] = &Server{Addr: addr, WALLevel: st.walLevel, SlotsFree: st.maxSlots - st.usedSlots,
					SendersFree: st.maxSenders - st.usedSenders, WorkersFree: st.maxWorkers - st.usedWorkers}
				order = append(order, addr)
			}
			byAddr[addr].DataSources = append(byAddr[addr].DataSources, d.Name)
		}
	}
	publishes := map[string]bool{}
	for _, st := range p.Streams {
		pub, sub := byAddr[addrOf[st.From]], byAddr[addrOf[st.To]]
		// Each table of a new subscription is copied by a worker of its own, up to
		// max_sync_workers_per_subscription at a time, each with a slot and a sender of
		// its own on the publisher while it copies.
		copying := min(len(st.Tables), state[sub.Addr].syncPerSub)
		pub.SlotsNeeded += 1 + copying
		pub.SendersNeeded += 1 + copying
		sub.WorkersNeeded += 1 + copying
		publishes[pub.Addr] = true
	}
	for _, addr := range order {
		s := byAddr[addr]
		st := state[addr]
		p.Servers = append(p.Servers, *s)
		if publishes[addr] && s.WALLevel != "logical" {
			p.Problems = append(p.Problems, fmt.Sprintf("server %s (%s) has wal_level = %s, and rows move from it: set wal_level = logical and restart it",
				addr, joinNames(s.DataSources), s.WALLevel))
		}
		if s.SlotsNeeded > s.SlotsFree {
			p.Problems = append(p.Problems, fmt.Sprintf("server %s (%s): the move needs %d replication slots, %d are free (max_replication_slots = %d, %d in use): raise max_replication_slots and restart it",
				addr, joinNames(s.DataSources), s.SlotsNeeded, s.SlotsFree, st.maxSlots, st.usedSlots))
		}
		if s.SendersNeeded > s.SendersFree {
			p.Problems = append(p.Problems, fmt.Sprintf("server %s (%s): the move needs %d WAL senders, %d are free (max_wal_senders = %d, %d in use): raise max_wal_senders and restart it",
				addr, joinNames(s.DataSources), s.SendersNeeded, s.SendersFree, st.maxSenders, st.usedSenders))
		}
		if s.WorkersNeeded > s.WorkersFree {
			p.Problems = append(p.Problems, fmt.Sprintf("server %s (%s): the move needs %d logical replication workers, %d are free (max_logical_replication_workers = %d, %d running); PostgreSQL would leave the rest unstarted without an error: raise max_logical_replication_workers (and max_worker_processes) and restart it",
				addr, joinNames(s.DataSources), s.WorkersNeeded, s.WorkersFree, st.maxWorkers, st.usedWorkers))
		}
	}
	return nil
}

func joinNames(names []string) string { return strings.Join(names, ", ") }
