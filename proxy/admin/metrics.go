package admin

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

var (
	labels          = []string{"data_source", "user"}
	descInUse       = prometheus.NewDesc("shardlab_proxy_server_connections_in_use", "Server connections lent to clients.", labels, nil)
	descIdle        = prometheus.NewDesc("shardlab_proxy_server_connections_idle", "Server connections open and free.", labels, nil)
	descWaiting     = prometheus.NewDesc("shardlab_proxy_checkouts_waiting", "Statements waiting for a free server connection.", labels, nil)
	descTurnWaiting = prometheus.NewDesc("shardlab_proxy_turns_waiting", "Clients waiting for a turn (--max-transactions) to take one of the data source's server connections.", labels, nil)
	descPoolSize    = prometheus.NewDesc("shardlab_proxy_pool_size", "The bound on a pool's server connections.", labels, nil)
	descOpened      = prometheus.NewDesc("shardlab_proxy_server_connections_opened_total", "Server connections opened.", labels, nil)
	descClosed      = prometheus.NewDesc("shardlab_proxy_server_connections_closed_total", "Server connections closed.", labels, nil)
	descTimeouts    = prometheus.NewDesc("shardlab_proxy_checkout_timeouts_total", "Statements that gave up waiting for a server connection (53300).", labels, nil)
	descWaitSeconds = prometheus.NewDesc("shardlab_proxy_checkout_wait_seconds_total", "Time statements spent waiting for a server connection.", labels, nil)
	descPinned      = prometheus.NewDesc("shardlab_proxy_clients_pinned", "Clients that keep one of the data source's server connections between transactions, because their session holds state that lives there (a temporary table, a session advisory lock).", labels, nil)
	descResets      = prometheus.NewDesc("shardlab_proxy_settings_resets_total", "Server connections reset for a client whose settings differ from those the connection carried.", labels, nil)
	descStateChecks = prometheus.NewDesc("shardlab_proxy_session_state_checks_total", "Questions to a server whether a released connection holds state that lives on it alone.", labels, nil)
	descClients     = prometheus.NewDesc("shardlab_proxy_clients", "Client sessions.", nil, nil)

	// Two-phase commit (--two-phase): the settler's counters (sqlexec.SettleStats).
	descInDoubt       = prometheus.NewDesc("shardlab_proxy_twophase_in_doubt", "Two-phase transactions prepared and not yet finished, as of the settler's last pass, and those commits left since.", nil, nil)
	descOldestInDoubt = prometheus.NewDesc("shardlab_proxy_twophase_oldest_in_doubt_seconds", "Age of the oldest two-phase transaction in doubt, from its first PREPARE (0 when none).", nil, nil)
	descSettled       = prometheus.NewDesc("shardlab_proxy_twophase_settled_total", "Prepared parts the settler finished, by outcome (commit, rollback).", []string{"outcome"}, nil)
	descRetried       = prometheus.NewDesc("shardlab_proxy_twophase_retried_total", "Prepared parts a commit finished on a fresh connection after the transaction's own failed.", nil, nil)
	descPasses        = prometheus.NewDesc("shardlab_proxy_twophase_settle_passes_total", "Passes of the settler.", nil, nil)
	descFailedPasses  = prometheus.NewDesc("shardlab_proxy_twophase_settle_failed_passes_total", "Passes of the settler that could not reach a data source or finish a part.", nil, nil)
	descUnreachable   = prometheus.NewDesc("shardlab_proxy_twophase_unreachable_data_sources", "Data sources the settler's last pass could not reach.", nil, nil)
)

// Describe implements prometheus.Collector.
func (a *Admin) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInUse, descIdle, descWaiting, descTurnWaiting, descPoolSize, descOpened, descClosed, descTimeouts, descWaitSeconds, descPinned, descResets, descStateChecks, descClients,
		descInDoubt, descOldestInDoubt, descSettled, descRetried, descPasses, descFailedPasses, descUnreachable} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: a snapshot of every pool.
func (a *Admin) Collect(ch chan<- prometheus.Metric) {
	for _, st := range a.allStats() {
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, st.DataSource, st.User)
		}
		counter := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, st.DataSource, st.User)
		}
		gauge(descInUse, float64(st.InUse))
		gauge(descIdle, float64(st.Idle))
		gauge(descWaiting, float64(st.Waiting))
		gauge(descTurnWaiting, float64(st.TurnWaiting))
		gauge(descPoolSize, float64(st.Size))
		counter(descOpened, float64(st.Opened))
		counter(descClosed, float64(st.Closed))
		counter(descTimeouts, float64(st.Timeouts))
		counter(descWaitSeconds, st.WaitTime.Seconds())
		gauge(descPinned, float64(st.Pinned))
		counter(descResets, float64(st.Resets))
		counter(descStateChecks, float64(st.StateChecks))
	}
	ch <- prometheus.MustNewConstMetric(descClients, prometheus.GaugeValue, float64(a.clients()))
	if s := a.router.Current().Settler(); s != nil {
		st := s.Stats()
		ch <- prometheus.MustNewConstMetric(descInDoubt, prometheus.GaugeValue, float64(st.InDoubt))
		ch <- prometheus.MustNewConstMetric(descOldestInDoubt, prometheus.GaugeValue, st.OldestInDoubt.Seconds())
		ch <- prometheus.MustNewConstMetric(descSettled, prometheus.CounterValue, float64(st.Committed), "commit")
		ch <- prometheus.MustNewConstMetric(descSettled, prometheus.CounterValue, float64(st.RolledBack), "rollback")
		ch <- prometheus.MustNewConstMetric(descRetried, prometheus.CounterValue, float64(st.Retried))
		ch <- prometheus.MustNewConstMetric(descPasses, prometheus.CounterValue, float64(st.Passes))
		ch <- prometheus.MustNewConstMetric(descFailedPasses, prometheus.CounterValue, float64(st.FailedPasses))
		ch <- prometheus.MustNewConstMetric(descUnreachable, prometheus.GaugeValue, float64(st.Unreachable))
	}
}

var _ prometheus.Collector = (*Admin)(nil)

// MetricsHandler serves the proxy's metrics in Prometheus's text format, with the Go
// runtime's.
func (a *Admin) MetricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(a, collectors.NewGoCollector())
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
