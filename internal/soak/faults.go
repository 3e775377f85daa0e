package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/onceflow/onceflow/internal/failpoint"
	"github.com/onceflow/onceflow/internal/wallclock"
)

// Fault kinds.
const (
	KindRelayKill       = "relay-kill"
	KindRelayPause      = "relay-pause"
	KindConsumerKill    = "consumer-kill"
	KindConsumerPause   = "consumer-pause"
	KindBrokerKill      = "broker-kill"
	KindPGRestart       = "pg-restart"
	KindProxyCutKafka   = "proxy-cut-kafka"
	KindProxyCutPG      = "proxy-cut-pg"
	KindProxyStallKafka = "proxy-stall-kafka"
	KindProxyStallPG    = "proxy-stall-pg"
	KindProxySlowKafka  = "proxy-slow-kafka"
	// KindRelayCrashSlowCkpt restarts the leading relay armed to crash
	// right after one of its next Kafka commits, before PostgreSQL marks
	// the batch (the failpoint relay-after-kafka-commit), and slows the
	// checkpoint partition's leader while the relay recovers: the one
	// moment the checkpoint matters, read from a slow broker.
	KindRelayCrashSlowCkpt = "relay-crash-slow-checkpoint"
	// KindBrokerPartition cuts one broker off from its peers: nothing
	// reaches its replication (inter-broker) and controller listeners, so
	// its followers cannot fetch from it, its controller loses the quorum
	// and its own broker loses the controller, while clients still reach
	// it. The cut is one-way: its own connections to the others stay.
	KindBrokerPartition = "broker-partition"
	// KindBrokerDiskFull fills the data disk of one broker (a tmpfs shrunk
	// to its usage): its writes fail with "no space left on device" and it
	// stops; the disk gets its size back and the broker is started again.
	KindBrokerDiskFull = "broker-disk-full"
	// KindBrokerCtrlPartition cuts one broker off from the controller
	// quorum alone, both ways: its controller loses the other voters, its
	// broker loses the active controller (heartbeats, metadata), while
	// replication and clients pass.
	KindBrokerCtrlPartition = "broker-controller-partition"
	// KindClockSkew restarts one relay and one consumer with their wall
	// clocks skewed (ONCEFLOW_CLOCK_SKEW, ±2 minutes), then restarts them
	// on the host's clock.
	KindClockSkew = "clock-skew"
	// KindPGSwitchover switches the producing databases' server over to its
	// streaming standby: the primary stopped (fast), the standby promoted
	// once it has the primary's last WAL, the proxy repointed; the former
	// primary is then rebuilt as the new standby.
	KindPGSwitchover = "pg-switchover"
)

// AllKinds are the fault kinds in report order.
var AllKinds = []string{KindRelayKill, KindRelayPause, KindConsumerKill, KindConsumerPause, KindBrokerKill,
	KindPGRestart, KindProxyCutKafka, KindProxyCutPG, KindProxyStallKafka, KindProxyStallPG, KindProxySlowKafka, KindRelayCrashSlowCkpt,
	KindBrokerPartition, KindBrokerDiskFull, KindBrokerCtrlPartition, KindClockSkew, KindPGSwitchover}

// weights per kind (out of 100): broker kills, disks filled and PostgreSQL
// restarts are about a quarter of all faults.
var weights = map[string]int{
	KindRelayKill: 10, KindRelayPause: 6, KindConsumerKill: 10, KindConsumerPause: 6, KindBrokerKill: 15,
	KindPGRestart: 8, KindProxyCutKafka: 7, KindProxyCutPG: 7, KindProxyStallKafka: 5, KindProxyStallPG: 5,
	KindProxySlowKafka: 4, KindRelayCrashSlowCkpt: 5, KindBrokerPartition: 8, KindBrokerDiskFull: 4,
	KindBrokerCtrlPartition: 5, KindClockSkew: 4, KindPGSwitchover: 4,
}

// essential kinds open the schedule, so that even a short run has at
// least one of each: a process kill, a broker kill, a database restart, a
// proxy cut, a partition between brokers, a full disk.
var essential = []string{KindRelayKill, KindBrokerKill, KindPGRestart, KindProxyCutPG, KindBrokerPartition, KindBrokerDiskFull}

func validKind(k string) bool { return slices.Contains(AllKinds, k) }

// plan is one fault of the schedule, drawn from the seed: what, which
// target (by role, resolved when the fault is injected), how long the
// outage lasts and how long to wait after recovery before the next.
type plan struct {
	kind   string
	role   string // relay: leader|standby; consumer: consumer-a|consumer-b; broker and kafka proxy: a broker role or "all"
	pick   int    // which partition or transactional id, for broker roles
	outage time.Duration
	// latency added to every chunk by a slow proxy
	latency time.Duration
	// skews of the relay's and the consumer's clocks (clock-skew)
	skews [2]time.Duration
	gap   time.Duration
	// evicting marks the consumer pause drawn past the group's session
	// timeout: an outage scale of evictScaleFloor or more shortens only
	// what it lasts beyond that timeout.
	evicting bool
}

// scheduler draws the fault plans of a seed: first every enabled kind once
// (the essential ones first, each group in seeded order), then by weight.
type scheduler struct {
	rng      *rand.Rand
	kinds    []string
	interval time.Duration
	opening  []string
	// outageScale multiplies every outage (0: 1).
	outageScale float64
}

func newScheduler(seed uint64, kinds []string, interval time.Duration) *scheduler {
	s := &scheduler{rng: rand.New(rand.NewPCG(seed, 0xfa17)), kinds: kinds, interval: interval}
	var first, rest []string
	for _, k := range kinds {
		if slices.Contains(essential, k) {
			first = append(first, k)
		} else {
			rest = append(rest, k)
		}
	}
	s.rng.Shuffle(len(first), func(i, j int) { first[i], first[j] = first[j], first[i] })
	s.rng.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
	s.opening = append(first, rest...)
	return s
}

func (s *scheduler) next() plan {
	var kind string
	if len(s.opening) > 0 {
		kind, s.opening = s.opening[0], s.opening[1:]
	} else {
		total := 0
		for _, k := range s.kinds {
			total += weights[k]
		}
		n := s.rng.IntN(total)
		for _, k := range s.kinds {
			if n < weights[k] {
				kind = k
				break
			}
			n -= weights[k]
		}
	}
	ms := func(lo, hi int) time.Duration { return time.Duration(lo+s.rng.IntN(hi-lo+1)) * time.Millisecond }
	p := plan{kind: kind, pick: s.rng.IntN(1 << 16)}
	switch kind {
	case KindRelayKill, KindRelayPause:
		p.role = "leader"
		switch n := s.rng.IntN(10); {
		case n < 2:
			p.role = "standby"
		case n < 4:
			p.role = "database-b" // the relay of the second producing database
		}
		if kind == KindRelayKill {
			p.outage = ms(0, 3000)
		} else {
			p.outage = ms(1000, 10000) // past the 3s lease now and then: a zombie
		}
	case KindConsumerKill, KindConsumerPause:
		p.role = consumers[s.rng.IntN(len(consumers))]
		switch {
		case kind == KindConsumerKill:
			p.outage = ms(0, 3000)
		case s.rng.IntN(4) == 0:
			// Past the group's 45 s session timeout: the member is
			// evicted, its partitions move to the other consumer, and it
			// wakes up with fetches polled under the old assignment.
			p.outage = ms(46000, 60000)
			p.evicting = true
		default:
			p.outage = ms(1000, 15000)
		}
	case KindBrokerKill:
		p.role = brokerRoles[s.rng.IntN(len(brokerRoles))]
		p.outage = ms(1000, 10000)
	case KindBrokerPartition:
		p.role = brokerRoles[s.rng.IntN(len(brokerRoles))]
		p.outage = ms(2000, 15000)
	case KindBrokerDiskFull:
		p.outage = ms(2000, 8000)
	case KindBrokerCtrlPartition:
		p.role = brokerRoles[s.rng.IntN(len(brokerRoles))]
		p.outage = ms(2000, 15000)
	case KindClockSkew:
		p.role = "leader"
		switch n := s.rng.IntN(10); {
		case n < 2:
			p.role = "standby"
		case n < 4:
			p.role = "database-b"
		}
		for i := range p.skews {
			p.skews[i] = ms(60000, 120000)
			if s.rng.IntN(2) == 0 {
				p.skews[i] = -p.skews[i]
			}
		}
		p.outage = ms(15000, 45000)
	case KindPGSwitchover:
		// The outage is the switchover's own: stop, promote, repoint.
	case KindPGRestart:
		p.outage = ms(500, 5000)
	case KindProxyCutKafka, KindProxyStallKafka:
		p.role = "all"
		if s.rng.IntN(2) == 0 {
			p.role = brokerRoles[s.rng.IntN(len(brokerRoles))]
		}
		p.outage = ms(500, 5000)
		if kind == KindProxyStallKafka {
			p.outage = ms(1000, 8000)
		}
	case KindProxySlowKafka:
		p.role = "all"
		if s.rng.IntN(2) == 0 {
			p.role = brokerRoles[s.rng.IntN(len(brokerRoles))]
		}
		p.outage = ms(3000, 10000)
		p.latency = ms(200, 2500)
	case KindRelayCrashSlowCkpt:
		p.role = "leader"
		p.outage = ms(15000, 25000)
		p.latency = ms(1000, 3000)
	case KindProxyCutPG:
		p.outage = ms(500, 5000)
	case KindProxyStallPG:
		p.outage = ms(1000, 8000)
	}
	p.gap = time.Duration(float64(s.interval) * (0.5 + s.rng.Float64()))
	switch {
	case s.outageScale <= 0:
	case p.evicting && s.outageScale >= evictScaleFloor:
		p.outage = consumerSessionTimeout + time.Duration(float64(p.outage-consumerSessionTimeout)*s.outageScale)
	default:
		p.outage = time.Duration(float64(p.outage) * s.outageScale)
	}
	return p
}

// consumerSessionTimeout is the group session timeout the soak's consumers
// run with (the consumer's default).
const consumerSessionTimeout = 45 * time.Second

// evictScaleFloor is the smallest outage scale that keeps the evicting
// consumer pause past the session timeout. A long run that scales its
// outages down to fit more faults in an hour still evicts a member now and
// then; the test's short run (0.2) scales everything, as a 46 s pause does
// not fit its budget.
const evictScaleFloor = 0.5

// Fault is one injected fault as the report shows it.
type Fault struct {
	N      int     `json:"n"`
	Kind   string  `json:"kind"`
	Target string  `json:"target"`
	AtS    float64 `json:"at_s"`
	// OutageS is how long the fault lasted: until the process or server
	// was running again (a broker: answering), the proxy open again.
	OutageS float64 `json:"outage_s"`
	// RecoveryS is the time from the fault to progress again: the first
	// probe transaction begun after the fault applied on every partition.
	// Negative when that did not happen within the recovery timeout.
	RecoveryS float64 `json:"recovery_s"`
	Error     string  `json:"error,omitempty"`
}

// injectFaults runs the schedule until ctx ends, and closes essentialsDone
// once every enabled essential kind has been injected. A fault in progress
// is always healed, even when ctx ends meanwhile.
func (r *run) injectFaults(ctx context.Context, essentialsDone chan<- struct{}) {
	pending := map[string]bool{}
	for _, k := range r.cfg.Kinds {
		if _, no := r.unavailable[k]; !no && slices.Contains(essential, k) {
			pending[k] = true
		}
	}
	closed := false
	markDone := func(kind string) {
		delete(pending, kind)
		if len(pending) == 0 && !closed {
			close(essentialsDone)
			closed = true
		}
	}
	defer func() {
		if !closed {
			close(essentialsDone)
		}
	}()
	markDone("")
	var kinds []string
	for _, k := range r.cfg.Kinds {
		if _, no := r.unavailable[k]; !no {
			kinds = append(kinds, k)
		}
	}
	if len(kinds) == 0 {
		return
	}
	s := newScheduler(r.cfg.Seed, kinds, r.cfg.FaultInterval)
	s.outageScale = r.cfg.OutageScale
	// Let the pipeline warm up: the first probe applied.
	if _, ok := r.probes.progressAfter(ctx, r.start); !ok {
		return
	}
	for n := 1; ctx.Err() == nil; n++ {
		p := s.next()
		f := r.inject(ctx, n, p)
		markDone(p.kind)
		r.current.Store(nil)
		// Measure the recovery even past the end of the producing phase,
		// but not past the drain's own patience.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.RecoveryTimeout)
		t0 := r.start.Add(time.Duration(f.AtS * float64(time.Second)))
		if at, ok := r.probes.progressAfter(rctx, t0); ok {
			f.RecoveryS = at.Sub(t0).Seconds()
		} else {
			f.RecoveryS = -1
		}
		cancel()
		r.faultsMu.Lock()
		r.faults = append(r.faults, f)
		r.faultsMu.Unlock()
		rec := fmt.Sprintf("%.1fs", f.RecoveryS)
		if f.RecoveryS < 0 {
			rec = fmt.Sprintf("NOT within %s", r.cfg.RecoveryTimeout)
		}
		errNote := ""
		if f.Error != "" {
			errNote = " (" + f.Error + ")"
		}
		r.printf("  [%5.0fs] fault %d %s %s: outage %.1fs, progress again after %s%s\n",
			f.AtS, n, f.Kind, f.Target, f.OutageS, rec, errNote)
		select {
		case <-ctx.Done():
		case <-time.After(p.gap):
		}
	}
}

// inject performs one fault and heals it.
func (r *run) inject(ctx context.Context, n int, p plan) Fault {
	f := Fault{N: n, Kind: p.kind}
	hard := context.WithoutCancel(ctx) // a begun fault is always healed
	switch p.kind {
	case KindBrokerKill, KindProxyCutKafka, KindProxyStallKafka, KindBrokerPartition, KindBrokerDiskFull, KindBrokerCtrlPartition:
		// One failure at a time: the cluster fully replicated first.
		if why, err := waitHealthy(ctx, r.adm, 90*time.Second); why != "" || err != nil {
			f.Error = fmt.Sprintf("cluster not fully in sync before the fault: %s %v", why, err)
		}
	}
	var t0, outageEnd time.Time
	began := func(target string) {
		t0 = time.Now()
		f.Target = target
		f.AtS = t0.Sub(r.start).Seconds()
		cur := p.kind + " " + target
		r.current.Store(&cur)
	}
	sleep := func(d time.Duration) { time.Sleep(d) } // the outage itself, not synchronisation
	switch p.kind {
	case KindRelayKill, KindRelayPause, KindConsumerKill, KindConsumerPause:
		name := p.role
		if p.kind == KindRelayKill || p.kind == KindRelayPause {
			name = r.relayByRole(ctx, p.role)
		}
		r.held.Store(name, struct{}{})
		if p.kind == KindRelayKill || p.kind == KindConsumerKill {
			began(name)
			r.procs.Kill(name)
			sleep(p.outage)
			if _, err := r.procs.Restart(name); err != nil {
				f.Error = err.Error()
			}
		} else {
			began(name)
			r.procs.Pause(name)
			sleep(p.outage)
			r.procs.Resume(name)
		}
		r.held.Delete(name)
	case KindBrokerKill:
		id, what, err := roleHolder(ctx, r.adm, p.role, p.pick, eventTopic, ckptTopic, group)
		if err != nil {
			id = int32(1 + p.pick%clusterSize)
			what = "random broker (" + err.Error() + ")"
		}
		held := fmt.Sprintf("broker-%d", id)
		r.held.Store(held, struct{}{})
		began(fmt.Sprintf("broker %d (%s)", id, what))
		r.kc.kill(id)
		sleep(p.outage)
		if err := r.kc.restart(hard, id); err != nil {
			f.Error = err.Error()
		}
		r.held.Delete(held)
	case KindBrokerPartition:
		id, what, err := roleHolder(ctx, r.adm, p.role, p.pick, eventTopic, ckptTopic, group)
		if err != nil {
			id = int32(1 + p.pick%clusterSize)
			what = "random broker (" + err.Error() + ")"
		}
		b := r.kc.broker(id)
		if b.repl == nil {
			f.Error = "the brokers reach each other without proxies"
			break
		}
		began(fmt.Sprintf("broker %d (%s) cut off from its peers", id, what))
		b.cutFromPeers(p.outage)
		sleep(p.outage)
		b.healPeers()
	case KindBrokerCtrlPartition:
		id, what, err := roleHolder(ctx, r.adm, p.role, p.pick, eventTopic, ckptTopic, group)
		if err != nil {
			id = int32(1 + p.pick%clusterSize)
			what = "random broker (" + err.Error() + ")"
		}
		b := r.kc.broker(id)
		if b.repl == nil {
			f.Error = "the brokers reach each other without proxies"
			break
		}
		if active, err := activeController(ctx, r.admCl); err == nil && active == id {
			what += ", the active controller"
		}
		began(fmt.Sprintf("broker %d (%s) cut off from the controller quorum", id, what))
		r.kc.cutController(b, p.outage)
		sleep(p.outage)
		r.kc.healController(b)
	case KindClockSkew:
		relay := r.relayByRole(ctx, p.role)
		cons := consumers[p.pick%len(consumers)]
		names := []string{relay, cons}
		for _, name := range names {
			r.held.Store(name, struct{}{})
		}
		began(fmt.Sprintf("%s clock %+v, %s clock %+v", relay, p.skews[0], cons, p.skews[1]))
		for i, name := range names {
			r.procs.Kill(name)
			spec := r.childSpec(name)
			spec.Env = append(spec.Env, fmt.Sprintf("%s=%+v", wallclock.EnvVar, p.skews[i]))
			if _, err := r.procs.Start(name, spec); err != nil {
				f.Error = err.Error()
			}
		}
		sleep(p.outage)
		for _, name := range names {
			r.procs.Kill(name)
			if _, err := r.procs.Start(name, r.childSpec(name)); err != nil {
				f.Error = err.Error()
			}
			r.held.Delete(name)
		}
	case KindPGSwitchover:
		if r.standby == nil {
			f.Error = "no standby"
			break
		}
		old, next := r.pg, r.standby
		began(fmt.Sprintf("postgres switchover :%d -> :%d", old.Port, next.Port))
		var how string
		how, outageEnd, f.Error = r.switchover(hard, old, next)
		f.Target += ", " + how
	case KindBrokerDiskFull:
		b := r.kc.diskBroker()
		if b == nil {
			f.Error = "no broker has a disk of its own"
			break
		}
		held := fmt.Sprintf("broker-%d", b.id)
		r.held.Store(held, struct{}{})
		began(fmt.Sprintf("broker %d: data disk full", b.id))
		if used, err := fillTmpfs(hard, b.disk, 0); err != nil {
			f.Error = err.Error()
		} else {
			f.Target += fmt.Sprintf(" at %d KiB", used>>10)
		}
		// The disk stays full until the broker's writes fail and it stops
		// (within a second or two under load), then for the outage.
		for deadline := time.Now().Add(diskFullLimit); b.node.Running() && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond) // polling the process table
		}
		sleep(p.outage)
		if err := resizeTmpfs(hard, b.disk, brokerDiskSize); err != nil {
			f.Error = err.Error()
		}
		if !b.node.Running() {
			f.Target += ", it stopped and was started again"
			if err := r.kc.restart(hard, b.id); err != nil {
				f.Error = err.Error()
			}
		} else {
			f.Target += ", it kept running"
		}
		r.held.Delete(held)
	case KindRelayCrashSlowCkpt:
		id, what, err := roleHolder(ctx, r.adm, roleCheckpointLeader, 0, eventTopic, ckptTopic, group)
		if err != nil {
			f.Error = err.Error()
			break
		}
		name := r.relayByRole(ctx, p.role)
		b := r.kc.broker(id)
		r.held.Store(name, struct{}{})
		r.procs.Kill(name)
		armed := r.childSpec(name)
		armed.Env = append(armed.Env, fmt.Sprintf("%s=%s=%d", failpoint.EnvVar, failpoint.RelayAfterKafkaCommit, 1+p.pick%20))
		if _, err := r.procs.Start(name, armed); err != nil {
			f.Error = err.Error()
		}
		crashed := r.waitExit(name, 60*time.Second)
		// The fault proper: the crash after a commit, then the slow
		// checkpoint leader.
		began(fmt.Sprintf("%s after its Kafka commit %d, then broker %d (%s) slow by %s", name, 1+p.pick%20, id, what, p.latency))
		b.proxy.Slow(p.latency, p.outage)
		if _, err := r.procs.Start(name, r.childSpec(name)); err != nil {
			f.Error = err.Error()
		}
		r.held.Delete(name)
		if !crashed {
			f.Error = "the armed relay did not reach its failpoint within 60s (killed instead)"
		}
		sleep(p.outage)
		b.proxy.Heal()
	case KindProxySlowKafka:
		targets := r.kc.brokers
		what := "all brokers"
		if p.role != "all" {
			id, role, err := roleHolder(ctx, r.adm, p.role, p.pick, eventTopic, ckptTopic, group)
			if err != nil {
				id, role = int32(1+p.pick%clusterSize), "random ("+err.Error()+")"
			}
			targets = []*broker{r.kc.broker(id)}
			what = fmt.Sprintf("broker %d (%s)", id, role)
		}
		began(fmt.Sprintf("%s by %s", what, p.latency))
		for _, b := range targets {
			b.proxy.Slow(p.latency, p.outage)
		}
		sleep(p.outage)
		for _, b := range targets {
			b.proxy.Heal()
		}
	case KindPGRestart:
		began("postgres (pg_ctl stop -m immediate)")
		if err := r.pg.StopServer(hard, "immediate"); err != nil {
			f.Error = err.Error()
		}
		sleep(p.outage)
		if err := r.pg.StartServer(hard); err != nil {
			f.Error = err.Error()
		}
	case KindProxyCutKafka, KindProxyStallKafka:
		targets := r.kc.brokers
		what := "all brokers"
		if p.role != "all" {
			id, role, err := roleHolder(ctx, r.adm, p.role, p.pick, eventTopic, ckptTopic, group)
			if err != nil {
				id, role = int32(1+p.pick%clusterSize), "random ("+err.Error()+")"
			}
			targets = []*broker{r.kc.broker(id)}
			what = fmt.Sprintf("broker %d (%s)", id, role)
		}
		began(what)
		for _, b := range targets {
			if p.kind == KindProxyCutKafka {
				b.proxy.Cut(p.outage)
			} else {
				b.proxy.Stall(p.outage)
			}
		}
		sleep(p.outage)
		for _, b := range targets {
			b.proxy.Heal()
		}
	case KindProxyCutPG, KindProxyStallPG:
		began("postgres")
		if p.kind == KindProxyCutPG {
			r.pgProxy.Cut(p.outage)
		} else {
			r.pgProxy.Stall(p.outage)
		}
		sleep(p.outage)
		r.pgProxy.Heal()
	}
	if outageEnd.IsZero() {
		outageEnd = time.Now()
	}
	f.OutageS = outageEnd.Sub(t0).Seconds()
	return f
}

// diskFullLimit bounds the wait for a broker whose disk is full to stop.
const diskFullLimit = 20 * time.Second

// relayByRole names the relay of database a holding the lease ("leader")
// or the other one ("standby"), or database b's relay ("database-b").
func (r *run) relayByRole(ctx context.Context, role string) string {
	if role == "database-b" {
		for _, n := range relays {
			if relayDB[n] == dbB {
				return n
			}
		}
	}
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var holder string
	err := r.pool.QueryRow(qctx, `SELECT holder FROM onceflow.relay_lease WHERE expires_at > now() ORDER BY expires_at DESC LIMIT 1`).Scan(&holder)
	if err != nil || relayDB[holder] != dbA {
		return relays[0]
	}
	if role == "leader" {
		return holder
	}
	for _, n := range relays {
		if n != holder && relayDB[n] == dbA {
			return n
		}
	}
	return holder
}

// waitExit waits up to limit for name to exit by itself; past it, name is
// killed. It reports whether it exited by itself.
func (r *run) waitExit(name string, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for r.procs.Running(name) {
		if time.Now().After(deadline) {
			r.procs.Kill(name)
			return false
		}
		time.Sleep(50 * time.Millisecond) // polling the process table
	}
	return true
}
