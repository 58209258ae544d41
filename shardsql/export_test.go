package shardsql

// SetPhaseHook makes the connector's committer call hook at each stage of a two-phase
// commit (sqlexec.StagePrepared, sqlexec.StageCommitted), for tests that crash a
// process between the phases. Only test builds have it: it is no part of the API.
func (c *Connector) SetPhaseHook(hook func(stage string)) { c.committer.SetPhaseHook(hook) }
